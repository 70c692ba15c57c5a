"""Training data: byte-level tokenizer, memory-mapped token windows, resumable distributed sampling."""
from .dataset import TokenDataset, default_corpus
from .sampler import DistributedSampler, batches
from .tokenizer import VOCAB_SIZE, ByteTokenizer, build_token_file, decode, encode

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
]
