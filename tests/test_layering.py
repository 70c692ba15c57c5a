"""Imports only point down the layers of DESIGN.md; a lower layer importing a higher one fails here."""
import ast
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hpcfsdp")

# Longest matching prefix wins. A module may import modules of its own level or lower.
LEVELS = {
    "hpcfsdp._backend": 0,
    "hpcfsdp._settings": 0,  # the HPCFSDP_* environment variables (a leaf: imports nothing of hpcfsdp)
    "hpcfsdp._launcher_env": 0,  # the launcher's rank and variables from the environment: _settings only
    "hpcfsdp._version": 0,
    "hpcfsdp._logging": 0,  # the hpcfsdp logger: logging and _settings only
    "hpcfsdp._trace": 0,  # the timeline recorder: _settings only; the comm layer and FSDP call it
    "hpcfsdp._array": 0,  # array and dtype helpers of the tensor core: NumPy and _backend only
    "hpcfsdp.testing": 0,  # the simulated CUDA device: NumPy only
    "hpcfsdp.testing._comparison": 1,  # assert_close: compares Tensors (hpcfsdp.testing loads it lazily)
    "hpcfsdp.data": 0,
    "hpcfsdp": 1,  # `import hpcfsdp as hp`: the core Tensor API
    "hpcfsdp._tensor": 1,
    "hpcfsdp._creation": 1,
    "hpcfsdp.autograd": 1,
    "hpcfsdp.nn.functional": 1,
    "hpcfsdp.nn._functional": 1,  # the implementation modules nn.functional re-exports (conv, pooling, losses)
    "hpcfsdp.distributed": 2,  # the comm layer: raw arrays and Tensors, never nn
    "hpcfsdp.distributed.elastic": 2,  # torchelastic's error files (@record): the standard library only
    "hpcfsdp.multiprocessing": 2,  # torch.multiprocessing.spawn under MPI: the MPI world size (_mpi) on use
    "hpcfsdp.distributed.tensor": 3,  # the package re-exports distribute_module (nn modules); DTensor itself is 2:
    "hpcfsdp.distributed.tensor._dtensor": 2,
    "hpcfsdp.distributed.tensor.placement_types": 2,
    "hpcfsdp.nn": 3,
    "hpcfsdp.utils": 3,  # activation checkpointing: autograd and Tensors, used by nn-level code
    "hpcfsdp.utils.hooks": 0,  # RemovableHandle: a leaf every layer uses
    "hpcfsdp.utils.data": 3,  # torch.utils.data: Tensors and collation; hpcfsdp.data and .distributed on use
    "hpcfsdp.amp": 1,  # GradScaler (duck-typed optimizers: param_groups, step) and autocast; hpcfsdp.cuda.amp
    "hpcfsdp.optim": 4,
    "hpcfsdp.models": 4,
    "hpcfsdp.serialization": 4,  # save/load: Tensors and nn.Parameter, refuses DTensors
    "hpcfsdp.distributed.tensor.parallel": 4,  # tensor-parallel styles: shard nn modules' parameters
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


# [Note: Import cycles]
# A cycle is a set of modules that import one another at load time. Load-time imports are the import
# statements Python runs when the module is first imported: at module level, in class bodies and in
# if/try blocks, but not inside functions. `from pkg import name` counts as an import of the submodule
# pkg.name when that is a module, else of pkg; the implicit import of parent packages is not counted
# (every module would otherwise sit in a cycle with the package __init__ that re-exports it).
#
# One cycle is allowed, as in PyTorch and tinygrad: Tensor <-> Function, the imports between
# `hpcfsdp._tensor` and `hpcfsdp.autograd.function` (Tensor's methods build graphs of Functions,
# Function.apply wraps its outputs in Tensors). Removing those imports (in both directions) must leave
# the import graph acyclic, so every cycle passes through that pair and no other module pair imports
# each other. See [Note: Tensor and Function] in hpcfsdp/_tensor.py.
#
# Imports inside functions (lazy imports) do not make load-time cycles, but a lazy import used to dodge
# a cycle is still a tangle: the tensor core (hpcfsdp._* and hpcfsdp.autograd.*) has none that point
# into hpcfsdp (test_core_has_no_lazy_internal_imports). Elsewhere they are allowed (the CLI imports
# its commands on use, for start-up time).
ALLOWED_CYCLE = frozenset({"hpcfsdp._tensor", "hpcfsdp.autograd.function"})
CORE_PREFIXES = ("hpcfsdp._", "hpcfsdp.autograd")

def _type_checking_only(node):
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): a block Python never runs, for annotations."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_statements(tree, lazy):
    """(node, inside_function) for every import statement; with lazy=False only load-time ones (imports
    under ``if TYPE_CHECKING:`` never run, so they are not counted)."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if lazy or not inner:
                    yield child, inner
            elif lazy or not inner:
                stack.append((child, inner))


def _targets(node, name, is_pkg, pkg):
    """The hpcfsdp modules one import statement loads (see [Note: Import cycles])."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "hpcfsdp" and _is_module(a.name, pkg)]
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    if node.level:
        mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != "hpcfsdp":
        return []
    out = []
    for a in node.names:
        sub = f"{mod}.{a.name}"
        if _is_module(sub, pkg):
            out.append(sub)
        elif _is_module(mod, pkg):
            out.append(mod)
    return out


def import_graph(pkg=PKG):
    """module -> set of hpcfsdp modules it imports at load time."""
    graph = {}
    for name, path, is_pkg in modules(pkg):
        tree = ast.parse(open(path).read())
        graph[name] = {t for node, _ in _import_statements(tree, lazy=False) for t in _targets(node, name, is_pkg, pkg)}
    return graph


def _strongly_connected(graph):
    """Tarjan's algorithm, iterative: the strongly connected components with more than one module or a self-import."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1 or v in graph[v]:
                        found.append(frozenset(component))
    return found


def cycles(pkg=PKG):
    """Import cycles left once the allowed Tensor <-> Function imports are removed, each as a line of text."""
    graph = import_graph(pkg)
    for a in ALLOWED_CYCLE:
        if a in graph:
            graph[a] = graph[a] - ALLOWED_CYCLE
    out = {}
    for component in _strongly_connected(graph):
        edges = sorted(f"{m} -> {t}" for m in component for t in graph[m] if t in component)
        out[component] = "cycle among " + ", ".join(sorted(component)) + ": " + "; ".join(edges)
    return out


def lazy_core_imports(pkg=PKG):
    """Imports inside functions of tensor-core modules that load another hpcfsdp module."""
    bad = []
    for name, path, is_pkg in modules(pkg):
        if not name.startswith(CORE_PREFIXES):
            continue
        tree = ast.parse(open(path).read())
        for node, inside_function in _import_statements(tree, lazy=True):
            if inside_function:
                bad += [f"{name} line {node.lineno} imports {t} inside a function"
                        for t in _targets(node, name, is_pkg, pkg)]
    return bad


def test_no_import_cycles_but_tensor_and_function():
    found = cycles()
    assert not found, "import cycles (only Tensor <-> Function is allowed):\n" + "\n".join(found.values())


def test_tensor_and_function_import_each_other():
    graph = import_graph()
    assert "hpcfsdp.autograd.function" in graph["hpcfsdp._tensor"]
    assert "hpcfsdp._tensor" in graph["hpcfsdp.autograd.function"]


def test_core_has_no_lazy_internal_imports():
    bad = lazy_core_imports()
    assert not bad, "lazy imports inside the tensor core (See [Note: Import cycles]):\n" + "\n".join(bad)


def _package(tmp_path, files):
    pkg = tmp_path / "hpcfsdp"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(pkg)


def test_checker_catches_a_planted_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from . import _tensor\n",
        "_tensor.py": "from .autograd import ops\nfrom .autograd.function import Function\n",
        "autograd/__init__.py": "",
        "autograd/function.py": "from .. import _tensor\n",  # the allowed pair
        "autograd/ops.py": "from .function import Function\n",  # closes a cycle through the allowed pair
        "nn/__init__.py": "from . import a\n",
        "nn/a.py": "from . import b\n\n\ndef f():\n    from .. import _tensor\n",
        "nn/b.py": "class C:\n    from .a import f\n",  # a class body runs at load time
        "nn/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n",
        "nn/d.py": "from .c import TYPE_CHECKING\n",  # c -> d only for annotations: never runs, no cycle
    })
    found = cycles(pkg)
    assert list(found) == [frozenset({"hpcfsdp.nn.a", "hpcfsdp.nn.b"})], found
    text = found[frozenset({"hpcfsdp.nn.a", "hpcfsdp.nn.b"})]
    assert "hpcfsdp.nn.a -> hpcfsdp.nn.b" in text and "hpcfsdp.nn.b -> hpcfsdp.nn.a" in text


def test_checker_allows_only_the_tensor_function_pair(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "_tensor.py": "from .autograd import engine, function\n",
        "autograd/__init__.py": "",
        "autograd/function.py": "from .._tensor import Tensor\n",
        "autograd/engine.py": "import hpcfsdp._tensor\n",  # engine <-> _tensor is a second cycle
    })
    assert list(cycles(pkg)) == [frozenset({"hpcfsdp._tensor", "hpcfsdp.autograd.engine"})]


def test_checker_catches_a_lazy_core_import(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "_tensor.py": "import numpy\n\n\ndef backward():\n    from .autograd import engine\n    import numpy.linalg\n",
        "autograd/__init__.py": "",
        "autograd/engine.py": "",
        "nn/__init__.py": "def f():\n    from .. import _tensor\n",  # outside the core: allowed
    })
    assert lazy_core_imports(pkg) == ["hpcfsdp._tensor line 5 imports hpcfsdp.autograd.engine inside a function"]
