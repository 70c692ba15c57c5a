"""The cupy names the GPU phases of the system tier used exist in the installed CuPy (the `cuda` extra's).

run_all.py --system runs the GPU tests on the simulated device with HPCFSDP_CUDA_SIM_RECORD, then this test
over what they recorded (HPCFSDP_TEST_CUPY_NAMES). Run alone, it records a small GPU workload of its own."""
import os
import subprocess
import sys

import pytest

from hpcfsdp.testing import cupy_names

pytestmark = pytest.mark.system

_WORKLOAD = """
import numpy as np, hpcfsdp as hp
from hpcfsdp import nn
m = nn.Linear(4, 3).to("cuda")
x = hp.randn(2, 4, device="cuda", requires_grad=True)
m(x).sum().backward()
assert x.grad.shape == (2, 4)
"""


def _names_dir(tmp_path) -> str:
    d = os.environ.get("HPCFSDP_TEST_CUPY_NAMES")
    if d:
        return d
    env = dict(os.environ, HPCFSDP_CUDA_SIM="1", HPCFSDP_CUDA_SIM_RECORD=str(tmp_path))
    subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, check=True, timeout=120)
    return str(tmp_path)


def test_cupy_names_used_by_the_gpu_phases_exist_in_the_installed_cupy(tmp_path):
    names = cupy_names.read_names(_names_dir(tmp_path))
    assert len(names) > 20, sorted(names)  # the phases really ran on the simulation and recorded
    assert {"cupy.cuda.Device", "cupy.asarray"} <= names, sorted(names)
    assert cupy_names.missing(names) == []
