"""examples/: each PyTorch FSDP script and its hpcfsdp port differ only in their import lines, and the
ports train, checkpoint and reload with exact parity on 2 MPI ranks (mixed precision and prefetch on/off)."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
NAMES = ["fsdp2", "fsdp1"]


def _without_imports(path):
    """The script's lines with its top-level import statements (all their lines) removed."""
    text = open(path).read()
    lines = text.splitlines()
    drop = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return [line for i, line in enumerate(lines) if i not in drop]


def _imports(path):
    tree = ast.parse(open(path).read())
    return [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


@pytest.mark.parametrize("name", NAMES)
def test_port_differs_from_pytorch_only_in_imports(name):
    original = os.path.join(EXAMPLES, name, "train_torch.py")
    port = os.path.join(EXAMPLES, name, "train.py")
    assert _without_imports(original) == _without_imports(port)
    torch_imports, hp_imports = _imports(original), _imports(port)
    assert len(torch_imports) == len(hp_imports)
    for a, b in zip(torch_imports, hp_imports):
        assert "torch" not in b.replace(" as torch", ""), b
        assert b.replace("hpcfsdp as torch", "torch").replace("hpcfsdp", "torch") == a, (a, b)


def test_import_check_sees_a_changed_line(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import torch\nfrom torch.nn import (\n    Linear,\n)\nx = torch.zeros(2)\n")
    b.write_text("import hpcfsdp as torch\nfrom hpcfsdp.nn import (\n    Linear,\n)\nx = torch.ones(2)\n")
    assert _without_imports(a) == ["x = torch.zeros(2)"] and _without_imports(a) != _without_imports(b)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("flags", [[], ["--mixed-precision"], ["--prefetch"], ["--mixed-precision", "--prefetch"]],
                         ids=["fp32", "bf16", "prefetch", "bf16-prefetch"])
def test_port_trains_and_reloads_exactly_at_2_ranks(name, flags, tmp_path):
    script = os.path.join(EXAMPLES, name, "train.py")
    argv = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "2", "--timeout", "240", "--",
            sys.executable, script, "--ckpt-dir", str(tmp_path), *flags]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert f"{name} example OK" in res.stdout


def _doc_rows():
    for line in open(os.path.join(ROOT, "docs", "coming-from-pytorch.md")):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`torch."):
            yield cells[0].strip("`"), cells[1]


def _resolve(dotted):
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_coming_from_pytorch_table_names_exist():
    rows = list(_doc_rows())
    assert len(rows) > 60 and {status for _, status in rows} <= {"supported", "differs", "no-op", "missing"}
    absent = []
    for name, status in rows:
        if status != "missing":
            try:
                _resolve("hpcfsdp" + name[len("torch"):])
            except (ImportError, AttributeError) as e:
                absent.append(f"{name}: {e!r}")
    assert not absent, "documented as available but absent:\n" + "\n".join(absent)
