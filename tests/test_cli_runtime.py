"""The CLI's shared run helpers: public names in cli/runtime.py, no cycle between train and soak, no FSDP internals."""
import ast
import os

import hpcfsdp.cli.runtime as runtime

CLI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hpcfsdp", "cli")


def _imports(name):
    """Modules imported by hpcfsdp/cli/<name>.py (relative imports resolved), and its attribute chains."""
    tree = ast.parse(open(os.path.join(CLI, name + ".py")).read())
    mods, attrs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = "hpcfsdp.cli" if node.level == 1 else "hpcfsdp" if node.level == 2 else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            mods.add(mod)
            mods.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.Attribute):
            attrs.add(ast.unparse(node))
    return mods, attrs


def test_runtime_exports_the_shared_helpers():
    for name in ("Context", "Session", "Output", "guarded", "agree", "exit_together", "say_error", "Agreed",
                 "gather_peaks", "trim_metrics", "train_val_datasets", "Batches", "launch_rank"):
        assert name in runtime.__all__ and not name.startswith("_"), name
        assert getattr(runtime, name).__doc__, f"runtime.{name} has no docstring"


def test_soak_and_train_do_not_import_each_other_at_module_level():
    soak_mods, _ = _imports("_soak")
    assert "hpcfsdp.cli.train" not in soak_mods
    assert not any(m.startswith("hpcfsdp.cli.train.") for m in soak_mods)
    runtime_mods, _ = _imports("runtime")
    assert not {"hpcfsdp.cli.train", "hpcfsdp.cli._soak"} & runtime_mods


def test_cli_reads_no_private_fsdp_or_c10d_names():
    for f in sorted(os.listdir(CLI)):
        if not f.endswith(".py"):
            continue
        mods, attrs = _imports(f[:-3])
        # No private name of FSDP and no module inside fully_shard's internals (a public helper of the
        # package-level fsdp._strategy, shared with FSDP1, is fine).
        bad = [m for m in mods if m.startswith("hpcfsdp.distributed.fsdp.") and
               (m.rsplit(".", 1)[1].startswith("_") and m.count("._") > 1
                or sum(part.startswith("_") for part in m.split(".")[3:]) > 1)]
        bad += [a for a in attrs if ".distributed_c10d._" in a]
        bad += [m for m in mods if m.startswith("hpcfsdp.distributed._c10d_")]  # the parts of distributed_c10d
        assert not bad, (f, bad)
