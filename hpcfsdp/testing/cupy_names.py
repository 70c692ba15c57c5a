"""Check the cupy names simulated processes used (HPCFSDP_CUDA_SIM_RECORD) against the installed CuPy.

``python -m hpcfsdp.testing.cupy_names <dir>``: reads every ``cupy_names.*.txt`` in ``<dir>`` (one per process, a
name per line: ``cupy.cuda.Stream``, ``ndarray.astype``, ``ndarray.flags.c_contiguous``), prints the names the
installed CuPy lacks and exits 1 if there are any, else prints how many names were checked and exits 0.
"""
from __future__ import annotations

import glob
import os
import sys

from ._cupy_surface import surface

__all__ = ["read_names", "missing", "main"]


def read_names(dirname: str) -> set:
    """The union of the names recorded in ``dirname``; FileNotFoundError when no process wrote one there."""
    files = glob.glob(os.path.join(dirname, "cupy_names.*.txt"))
    if not files:
        raise FileNotFoundError(f"no cupy_names.*.txt in {dirname!r}: was the workload run with "
                                f"HPCFSDP_CUDA_SIM=1 HPCFSDP_CUDA_SIM_RECORD={dirname}?")
    names = set()
    for f in files:
        with open(f) as fh:
            names.update(line.strip() for line in fh if line.strip())
    return names


def _has(s, name: str) -> bool:
    if name.startswith("ndarray.flags."):
        return name[len("ndarray.flags."):] in s.flags
    if name.startswith("ndarray."):
        return name[len("ndarray."):] in s.ndarray
    mod, _, attr = name.rpartition(".")
    return attr in s.modules.get(mod, ())


def missing(names) -> list:
    """The names (sorted) the installed CuPy does not have."""
    s = surface()
    return sorted(n for n in names if not _has(s, n))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpcfsdp.testing.cupy_names <dir>", file=sys.stderr)
        return 2
    names = read_names(argv[0])
    bad = missing(names)
    ver = surface().version
    if bad:
        print(f"{len(bad)} of {len(names)} cupy names used are not in the installed CuPy {ver}:")
        for n in bad:
            print("  " + n)
        return 1
    print(f"all {len(names)} cupy names used exist in the installed CuPy {ver}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
