"""Helpers of the DataLoader, at PyTorch's private path (``torch.utils.data._utils.collate``)."""
