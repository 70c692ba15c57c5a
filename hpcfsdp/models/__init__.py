"""Reference models."""
from hpcfsdp.models.gpt import GPT, Block, GPTConfig

__all__ = ["GPT", "GPTConfig", "Block"]
