"""The settings table: one boolean rule, errors that name the variable, values read at use time, README in sync."""
import ast
import json
import os
import re
import subprocess
import sys

import pytest

from hpcfsdp import _settings as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "True", "yes", "on", " on ", "Yes"])
def test_parse_bool_true(raw):
    assert S.parse_bool(raw) is True


@pytest.mark.parametrize("raw", ["0", "false", "FALSE", "no", "off", "", "  ", "Off"])
def test_parse_bool_false(raw):
    assert S.parse_bool(raw) is False


@pytest.mark.parametrize("raw", ["2", "maybe", "y", "n", "enable", "-1", "1.0"])
def test_parse_bool_rejects_anything_else(raw):
    with pytest.raises(ValueError, match="expected 1/true/yes/on or 0/false/no/off"):
        S.parse_bool(raw)


def test_check_finite_false_means_off(monkeypatch):
    monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "false")
    assert S.get("HPCFSDP_CHECK_FINITE") is False
    for raw, want in (("true", True), ("1", True), ("0", False), ("", False), ("no", False), ("on", True)):
        monkeypatch.setenv("HPCFSDP_CHECK_FINITE", raw)
        assert S.get("HPCFSDP_CHECK_FINITE") is want, raw
    monkeypatch.delenv("HPCFSDP_CHECK_FINITE")
    assert S.get("HPCFSDP_CHECK_FINITE") is False


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_check_finite_is_read_at_use_time(monkeypatch):
    # The FSDP gradient check follows the environment of the moment, not the one at import.
    import numpy as np

    import hpcfsdp as hp
    import hpcfsdp.distributed as dist
    from hpcfsdp import nn
    from hpcfsdp.distributed.fsdp import fully_shard

    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group()
    try:
        model = nn.Linear(3, 2)
        fully_shard(model)
        x = hp.tensor(np.array([[np.inf, 1.0, 2.0]], dtype=np.float32))
        monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "false")
        model(x).sum().backward()  # off: the non-finite gradient passes
        assert not np.isfinite(model.weight.grad.full_tensor().numpy()).all()
        model.zero_grad()
        monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "on")
        with pytest.raises(FloatingPointError, match="HPCFSDP_CHECK_FINITE: gradient of weight has 2 non-finite"):
            model(x).sum().backward()
    finally:
        if ours:
            dist.destroy_process_group()


def test_errors_name_the_variable_and_the_value(monkeypatch):
    cases = {
        "HPCFSDP_DEBUG": ("maybe", "expected 1/true/yes/on or 0/false/no/off"),
        "HPCFSDP_COMM_TIMEOUT": ("soon", "expected a number of seconds"),
        "HPCFSDP_RANKS_PER_NODE": ("0", "expected a positive integer"),
        "HPCFSDP_RANK_ENV_PID": ("me", "expected a process id (a positive integer)"),
        "HPCFSDP_CUDA_AWARE": ("2", "expected 1/true/yes/on, 0/false/no/off or auto"),
        "HPCFSDP_MALLOC_TUNE": ("fast", "expected one of ('speed', 'memory', 'off')"),
        "HPCFSDP_COMM_PROGRESS": ("sometimes", "expected one of ('blocking', 'test')"),
        "HPCFSDP_TRAIN_CRASH_AFTER_STEP": ("-3", "expected a positive integer"),
    }
    for name, (raw, expected) in cases.items():
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError) as info:
            S.get(name)
        assert str(info.value) == f"{name}={raw!r}: {expected}"


def test_values_defaults_and_is_set(monkeypatch):
    for name in S.SETTINGS:
        monkeypatch.delenv(name, raising=False)
        assert S.get(name) == S.SETTINGS[name].default and not S.is_set(name)
    monkeypatch.setenv("HPCFSDP_COMM_TIMEOUT", " 2.5 ")
    monkeypatch.setenv("HPCFSDP_MALLOC_TUNE", "0")
    monkeypatch.setenv("HPCFSDP_COMM_PROGRESS", "TEST")
    monkeypatch.setenv("HPCFSDP_CUDA_AWARE", "auto")
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "")  # empty = the default for non-switches
    monkeypatch.setenv("HPCFSDP_COMM_INLINE", "")  # ... but off for a switch
    assert S.get("HPCFSDP_COMM_TIMEOUT") == 2.5 and S.is_set("HPCFSDP_COMM_TIMEOUT")
    assert S.get("HPCFSDP_MALLOC_TUNE") == "off"
    assert S.get("HPCFSDP_COMM_PROGRESS") == "test"
    assert S.get("HPCFSDP_CUDA_AWARE") is None
    assert S.get("HPCFSDP_RANKS_PER_NODE") is None and not S.is_set("HPCFSDP_RANKS_PER_NODE")
    assert S.get("HPCFSDP_COMM_INLINE") is False and S.is_set("HPCFSDP_COMM_INLINE")
    with pytest.raises(KeyError, match="'HPCFSDP_NOPE' is not an hpcfsdp setting"):
        S.get("HPCFSDP_NOPE")


def test_effective_reports_bad_values_instead_of_raising(monkeypatch):
    monkeypatch.setenv("HPCFSDP_DEBUG", "perhaps")
    monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "yes")
    eff = S.effective()
    assert set(eff) == set(S.SETTINGS)
    assert eff["HPCFSDP_DEBUG"]["error"] == "HPCFSDP_DEBUG='perhaps': expected 1/true/yes/on or 0/false/no/off"
    assert eff["HPCFSDP_CHECK_FINITE"] == {"set": True, "value": True}
    assert eff["HPCFSDP_TRAIN_CRASH_AFTER_STEP"]["internal"] is True


def test_info_prints_the_effective_settings():
    env = dict(os.environ, HPCFSDP_CHECK_FINITE="false", HPCFSDP_COMM_TIMEOUT="42", PYTHONPATH=ROOT)
    env.pop("HPCFSDP_DEBUG", None)
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "info", "--json"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    settings = json.loads(out.stdout)["settings"]
    assert settings["HPCFSDP_CHECK_FINITE"] == {"set": True, "value": False}
    assert settings["HPCFSDP_COMM_TIMEOUT"] == {"set": True, "value": 42.0}
    assert settings["HPCFSDP_DEBUG"] == {"set": False, "value": False}
    text = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "info"], capture_output=True,
                          text=True, timeout=60, env=env).stdout
    assert "  HPCFSDP_COMM_TIMEOUT: 42.0 (set)\n" in text and "  HPCFSDP_DEBUG: False (default)\n" in text


def test_info_names_a_bad_setting_instead_of_a_traceback():
    env = dict(os.environ, HPCFSDP_RANKS_PER_NODE="two", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "info"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr == "hpcfsdp info: error: HPCFSDP_RANKS_PER_NODE='two': expected a positive integer\n"
    assert "  HPCFSDP_RANKS_PER_NODE: INVALID (HPCFSDP_RANKS_PER_NODE='two': expected a positive integer)" in out.stdout


def test_readme_documents_exactly_the_settings():
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = re.findall(r"^\| `(HPCFSDP_\w+)` \|", readme, re.M)
    assert sorted(table) == sorted(S.public_names()), "README's table of environment variables != SETTINGS"
    assert len(set(table)) == len(table)
    mentioned = set(re.findall(r"HPCFSDP_[A-Z0-9_]*[A-Z0-9]", readme))
    assert mentioned == set(S.SETTINGS), f"README names {sorted(mentioned ^ set(S.SETTINGS))} differently"
    internal = [n for n, s in S.SETTINGS.items() if s.internal]
    for name in internal:
        assert re.search(rf"Testing aid \(internal[^\n]*\n?[^\n]*`{name}", readme), name


def test_no_module_reads_hpcfsdp_variables_directly():
    # Every HPCFSDP_* read goes through the table: no os.environ / os.getenv call with such a literal.
    offenders = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "hpcfsdp")):
        for f in files:
            if not f.endswith(".py") or f == "_settings.py":
                continue
            path = os.path.join(dirpath, f)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and ast.unparse(node.func.value) in ("os", "os.environ", "environ") \
                        and node.func.attr in ("get", "getenv", "pop") and node.args \
                        and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("HPCFSDP_"):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
                if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ") \
                        and isinstance(node.slice, ast.Constant) \
                        and str(node.slice.value).startswith("HPCFSDP_") and isinstance(node.ctx, ast.Load):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_settings_is_a_leaf_module():
    tree = ast.parse(open(os.path.join(ROOT, "hpcfsdp", "_settings.py")).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("hpcfsdp"), node.module
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("hpcfsdp") for a in node.names)
