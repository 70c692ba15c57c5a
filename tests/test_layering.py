"""Imports only point down the layers of DESIGN.md; a lower layer importing a higher one fails here."""
import ast
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hpcfsdp")

# Longest matching prefix wins. A module may import modules of its own level or lower.
LEVELS = {
    "hpcfsdp._backend": 0,
    "hpcfsdp.data": 0,
    "hpcfsdp": 1,  # `import hpcfsdp as hp`: the core Tensor API
    "hpcfsdp._tensor": 1,
    "hpcfsdp._creation": 1,
    "hpcfsdp.autograd": 1,
    "hpcfsdp.nn.functional": 1,
    # Pure interface definitions (seed 001): dataclasses and ABCs the comm layer implements.
    "hpcfsdp.distributed.fsdp._fully_shard._fsdp_api": 1,
    "hpcfsdp.distributed": 2,  # the comm layer: raw arrays and Tensors, never nn
    "hpcfsdp.nn": 3,
    "hpcfsdp.utils": 3,  # activation checkpointing: autograd and Tensors, used by nn-level code
    "hpcfsdp.optim": 4,
    "hpcfsdp.models": 4,
    "hpcfsdp.distributed.fsdp": 5,
    "hpcfsdp.distributed.sharding_plan": 5,
    "hpcfsdp.distributed.algorithms": 5,  # checkpoint wrappers applied next to fully_shard
    "hpcfsdp.distributed.checkpoint": 6,
    "hpcfsdp.cli": 7,
}
EXEMPT = {"hpcfsdp"}  # the package __init__ re-exports every layer


def level(mod: str) -> int:
    best = max((p for p in LEVELS if mod == p or mod.startswith(p + ".")), key=len)
    return LEVELS[best]


def modules(pkg=PKG):
    for dirpath, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(pkg))[:-3].replace(os.sep, ".")
                name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
                yield name, path, f == "__init__.py"


def imports(name, path, is_pkg):
    tree = ast.parse(open(path).read())
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base[: len(base) - node.level + 1]
                mod = ".".join(pkg + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, node.lineno
            for a in node.names:  # `from . import nn` imports a submodule
                yield f"{mod}.{a.name}", node.lineno


def _is_module(mod, pkg=PKG):
    rel = mod.split(".")[1:]
    p = os.path.join(pkg, *rel)
    return os.path.isdir(p) or os.path.exists(p + ".py")


def test_levels_cover_every_module():
    names = [n for n, _, _ in modules()]
    assert "hpcfsdp.cli.main" in names
    assert level("hpcfsdp.distributed.fsdp._fully_shard._fsdp_param") == 5
    assert level("hpcfsdp.distributed.process_group") == 2


def violations(pkg=PKG):
    bad = []
    for name, path, is_pkg in modules(pkg):
        if name in EXEMPT:
            continue
        mine = level(name)
        for mod, line in imports(name, path, is_pkg):
            if mod.split(".")[0] != "hpcfsdp" or not _is_module(mod, pkg):
                continue
            if level(mod) > mine:
                bad.append(f"{name} (level {mine}) imports {mod} (level {level(mod)}) at line {line}")
    return bad


def test_imports_point_down():
    bad = violations()
    assert not bad, "imports that point up:\n" + "\n".join(bad)


def test_checker_catches_an_upward_import(tmp_path):
    pkg = tmp_path / "hpcfsdp"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "nn").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nn" / "__init__.py").write_text("")
    (pkg / "distributed" / "__init__.py").write_text("")
    (pkg / "distributed" / "process_group.py").write_text("from ..nn import Module\n")
    bad = violations(str(pkg))
    assert len(bad) >= 1 and "hpcfsdp.distributed.process_group" in bad[0] and "hpcfsdp.nn" in bad[0]
