#!/usr/bin/env python3
"""One-process PyTorch training step of the same GPT: the peer of hpcfsdp's unsharded step (`--mode single`)."""
import sys

from torch_fsdp2_bench import main

if __name__ == "__main__":
    main(["--mode", "single", *sys.argv[1:]] if "--mode" not in sys.argv else None)
