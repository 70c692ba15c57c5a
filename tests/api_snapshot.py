"""Every public name of hpcfsdp with its kind and signature, one line each; the committed copy is
tests/data/public_api.txt, and tests/test_public_api.py checks that the tree still matches it.

    python tests/api_snapshot.py            # print the differences from the committed snapshot
    python tests/api_snapshot.py --write    # rewrite the snapshot (only for a deliberate API change)

A public name is one a user reaches without an underscore: in a package (hpcfsdp, hpcfsdp.nn, ...)
every attribute, in any other module its ``__all__``; for each class defined in hpcfsdp, every public
attribute one of its hpcfsdp classes defines (Tensor's methods included). The internal ops modules
(``hpcfsdp.autograd.ops``, below it and its ``ops_*`` siblings) and the CLI's modules are left out: their
content is reached through the packages above, which are recorded.
"""
import importlib
import inspect
import os
import pkgutil
import re
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "data", "public_api.txt")

# Implementation modules, not a user-facing path: what they hold is recorded where users reach it.
EXCLUDED = ("hpcfsdp.cli", "hpcfsdp.autograd.ops")


def _excluded(name):
    return any(name == p or name.startswith(p + ".") or name.startswith(p + "_") for p in EXCLUDED)


def public_modules():
    import hpcfsdp
    out = ["hpcfsdp"]
    for info in pkgutil.walk_packages(hpcfsdp.__path__, "hpcfsdp."):
        if any(p.startswith("_") for p in info.name.split(".")) or _excluded(info.name):
            continue
        out.append(info.name)
    return sorted(out)


def _signature(obj):
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(?)"
    text = re.sub(r"<module '([\w.]+)' from '[^']*'>", r"<module '\1'>", text)  # no install path
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _describe(obj):
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, type):
        return f"class{_signature(obj)}"
    if callable(obj):
        return f"function{_signature(obj)}"
    return f"value {type(obj).__name__}"


def _names(mod):
    if hasattr(mod, "__path__") or not hasattr(mod, "__all__"):
        names = [n for n in dir(mod) if not n.startswith("_")]
        keep = []
        for n in names:
            v = getattr(mod, n)
            if isinstance(v, types.ModuleType):
                if not v.__name__.startswith("hpcfsdp.") or _excluded(v.__name__) or \
                        any(p.startswith("_") for p in v.__name__.split(".")):
                    continue
            elif getattr(v, "__module__", "") in ("typing", "__future__"):
                continue
            keep.append(n)
        return keep
    return list(mod.__all__)


def _class_lines(qual, cls):
    lines = []
    own = [c for c in cls.__mro__ if c.__module__.startswith("hpcfsdp")]
    for n in sorted(dir(cls)):
        if n.startswith("_") and n not in ("__init__", "__call__"):
            continue
        owner = next((c for c in cls.__mro__ if n in c.__dict__), None)
        if owner not in own:
            continue
        raw = owner.__dict__[n]
        if isinstance(raw, property):
            desc = "property"
        elif isinstance(raw, (staticmethod, classmethod)):
            desc = f"{type(raw).__name__}{_signature(raw.__func__)}"
        elif callable(raw):
            desc = f"method{_signature(raw)}"
        else:
            desc = f"attribute {type(raw).__name__}"
        lines.append(f"{qual}.{n}: {desc}")
    return lines


def snapshot():
    lines, seen = [], set()
    modules = public_modules()
    for modname in modules:  # all first: a package's attributes include the submodules loaded so far
        importlib.import_module(modname)
    for modname in modules:
        mod = sys.modules[modname]
        for n in sorted(set(_names(mod))):
            v = getattr(mod, n)
            lines.append(f"{modname}.{n}: {_describe(v)}")
            if isinstance(v, type) and v.__module__.startswith("hpcfsdp") and id(v) not in seen:
                seen.add(id(v))
                lines += _class_lines(f"{modname}.{n}", v)
    return lines


def diff(current, committed):
    cur, old = set(current), set(committed)
    return sorted("- " + x for x in old - cur) + sorted("+ " + x for x in cur - old)


def read_committed():
    with open(SNAPSHOT) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def main(argv):
    current = snapshot()
    if "--write" in argv:
        os.makedirs(os.path.dirname(SNAPSHOT), exist_ok=True)
        with open(SNAPSHOT, "w") as f:
            f.write("\n".join(current) + "\n")
        print(f"wrote {len(current)} names to {SNAPSHOT}")
        return 0
    d = diff(current, read_committed())
    print("\n".join(d) if d else f"the tree matches the snapshot ({len(current)} names)")
    return 1 if d else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
