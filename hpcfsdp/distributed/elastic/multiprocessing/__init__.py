"""torch.distributed.elastic.multiprocessing: only the ``errors`` submodule (jobs start under mpiexec/srun)."""
