"""Training algorithms on top of fully_shard (PyTorch's torch.distributed.algorithms): activation checkpointing."""
