"""torch.distributed.elastic names that training scripts use: ``multiprocessing.errors.record``."""
