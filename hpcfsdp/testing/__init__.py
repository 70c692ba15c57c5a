"""Test support shipped with the package: a simulated CUDA device (cuda_sim)."""
