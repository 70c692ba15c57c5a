"""Training data: byte-level tokenizer, memory-mapped token windows, resumable distributed sampling."""
from .dataset import TokenDataset, default_corpus
from .sampler import DistributedSampler, batches
from .tokenizer import VOCAB_SIZE, ByteTokenizer, decode, encode
from .tokenfile import ShardedTokenDataset, TokenFileWriter, build_token_file, open_token_data, read_sidecar

__all__ = [
    "VOCAB_SIZE",
    "ByteTokenizer",
    "encode",
    "decode",
    "build_token_file",
    "TokenDataset",
    "default_corpus",
    "DistributedSampler",
    "batches",
    "open_token_data",
    "read_sidecar",
    "TokenFileWriter",
    "ShardedTokenDataset",
]
