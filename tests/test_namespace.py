"""`import hpcfsdp as torch` reaches what `import torch` reaches: submodules as attributes, loaded on first use."""
import os
import subprocess
import sys

import pytest

import hpcfsdp


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_does_not_load_mpi_and_distributed_loads_on_first_use():
    r = _run("import sys, hpcfsdp as torch\n"
             "assert 'mpi4py' not in sys.modules and 'hpcfsdp.distributed' not in sys.modules\n"
             "print(torch.distributed.get_default_backend_for_device('cpu'))\n"
             "assert 'hpcfsdp.distributed' in sys.modules\n"
             "print(torch.distributed.is_initialized())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["gloo", "False"]


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        hpcfsdp.no_such_name  # noqa: B018
    assert not hasattr(hpcfsdp, "no_such_name")


@pytest.mark.parametrize("name", hpcfsdp._LAZY_SUBMODULES)
def test_every_lazy_submodule_exists(name):
    mod = getattr(hpcfsdp, name)
    assert mod.__name__ == f"hpcfsdp.{name}"


def test_autocast_at_the_top_level_is_amps():
    import hpcfsdp.amp
    assert hpcfsdp.autocast is hpcfsdp.amp.autocast
    with hpcfsdp.autocast("cpu", enabled=False):
        pass
    with hpcfsdp.autocast("cpu", dtype=hpcfsdp.bfloat16):
        assert hpcfsdp.is_autocast_enabled("cpu") and not hpcfsdp.is_autocast_enabled()
    assert not hpcfsdp.is_autocast_enabled("cpu")


def test_import_under_an_mpi_launcher_exports_torchrun_variables_without_mpi():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID",
                        "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")}
    env.update(PMI_RANK="3", PMI_SIZE="4", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2")  # what Hydra sets
    code = ("import os, sys, hpcfsdp\n"
            "print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE')),"
            " 'mpi4py.MPI' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "4", "1", "2", "False"]


def test_relu_at_the_top_level():
    """torch.relu(x), as PyTorch's (the ported FSDP1 tests found it missing); it is differentiable."""
    import hpcfsdp as hp

    x = hp.tensor([-1.5, 0.0, 2.0], requires_grad=True)
    y = hp.relu(x)
    assert y.tolist() == [0.0, 0.0, 2.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0]
