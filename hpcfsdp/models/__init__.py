"""Reference models: a GPT (GPT-2 layout) and a Llama-style decoder."""
from hpcfsdp.models.gpt import GPT, Block, GPTConfig
from hpcfsdp.models.llama import Llama, LlamaBlock, LlamaConfig

__all__ = ["GPT", "GPTConfig", "Block", "Llama", "LlamaConfig", "LlamaBlock"]
