"""The simulated multi-host cluster of the system tier (harness, jobs, pytest fixture)."""
