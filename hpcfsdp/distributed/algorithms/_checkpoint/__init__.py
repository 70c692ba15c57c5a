"""Activation-checkpoint wrappers (PyTorch's torch.distributed.algorithms._checkpoint)."""
