"""A real one-node Slurm for the system tier (harness and pytest fixture)."""
