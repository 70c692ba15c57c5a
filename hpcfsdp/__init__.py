"""hpcfsdp: fully sharded data parallel training on MPI, NumPy and CuPy."""
