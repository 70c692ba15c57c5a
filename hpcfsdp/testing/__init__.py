"""Test support shipped with the package: a simulated CUDA device (cuda_sim) and assert_close."""

__all__ = ["assert_close"]


def __getattr__(name):
    # assert_close needs Tensor, which this package must not import: _backend imports cuda_sim while hpcfsdp is
    # still loading (HPCFSDP_CUDA_SIM=1). It loads on first use, as hpcfsdp's lazy submodules do.
    if name == "assert_close":
        import importlib

        return importlib.import_module(f"{__name__}._comparison").assert_close
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
