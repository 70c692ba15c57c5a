"""No copied code in hpcfsdp/: pylint's duplicate-code check (R0801) finds no pair of files sharing 10 or more
similar lines (comments, docstrings, imports and signatures ignored: pylint's defaults), but the pairs of
tests/data/duplicate_code_allowlist.txt, each with the reason it stays.

    python tests/test_duplicate_code.py     # print the pairs found now, in the allowlist's format

The check runs pylint's similarity engine (pylint.checkers.symilar.Symilar, what R0801 reports from) in this
process: about 5 s for hpcfsdp/ on a 2-core machine, half what `pylint --enable=duplicate-code` takes to
start and parse. A new duplicate is removed, not allowlisted, unless it must stay; an allowlisted pair that
is no longer alike is dropped from the list (the test names both).
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWLIST = os.path.join(ROOT, "tests", "data", "duplicate_code_allowlist.txt")
MIN_LINES = 10  # pylint's min-similarity-lines for this check
TODO = "TODO: why this pair stays (or remove the duplicate)"
HEADER = f"""\
# Pairs of files under hpcfsdp/ that pylint's duplicate-code check (R0801: {MIN_LINES} or more similar lines,
# comments, docstrings, imports and signatures ignored) finds alike, and why each pair stays. One pair a line,
# paths sorted: `FILE | FILE | reason`. Checked by tests/test_duplicate_code.py; `python tests/test_duplicate_code.py`
# prints the pairs found now in this format (reasons kept from here, a TODO for a new pair).
"""


def _symilar():
    from pylint.checkers.symilar import Symilar  # the 'test' extra installs pylint
    return Symilar(min_lines=MIN_LINES, ignore_comments=True, ignore_docstrings=True, ignore_imports=True,
                   ignore_signatures=True)


def python_files(top):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(top) for f in files if f.endswith(".py"))


def similar_pairs(top=os.path.join(ROOT, "hpcfsdp"), base=ROOT):
    """{(file, file): [(similar lines, (first, last) in the first file, (first, last) in the second)]}, paths
    relative to ``base``, sorted within each pair."""
    sim = _symilar()
    for path in python_files(top):
        with open(path, encoding="utf-8") as f:
            sim.append_stream(os.path.relpath(path, base), f)
    pairs = {}
    for lines, chunks in sim._compute_sims():  # what SimilaritiesChecker.close() reports as R0801
        chunks = sorted((c[0].name, int(c[1]), int(c[2])) for c in chunks)
        for i, (a, a0, a1) in enumerate(chunks):
            for b, b0, b1 in chunks[i + 1:]:
                if a != b:
                    pairs.setdefault((a, b), []).append((lines, (a0 + 1, a1), (b0 + 1, b1)))
    return pairs


def read_allowlist(path=ALLOWLIST, strict: bool = True) -> dict:
    """{(file, file): reason} of the allowlist; ValueError for a line that is not `FILE | FILE | reason` (with
    ``strict``, also for a pair whose reason is still the TODO)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 3 or not all(parts) or parts[0] >= parts[1] or (strict and parts[2] == TODO):
                raise ValueError(f"{path}:{n}: expected `FILE | FILE | reason` (files sorted, a reason given), "
                                 f"got {line!r}")
            out[(parts[0], parts[1])] = parts[2]
    return out


def format_allowlist(pairs, reasons) -> str:
    lines = [f"{a} | {b} | {reasons.get((a, b), TODO)}" for a, b in sorted(pairs)]
    return HEADER + "".join(line + "\n" for line in lines)


def _describe(pairs) -> str:
    return "\n".join(f"  {a} [{sa[0]}:{sa[1]}] and {b} [{sb[0]}:{sb[1]}]: {n} similar lines"
                     for (a, b), hits in sorted(pairs.items()) for n, sa, sb in hits)


def test_no_duplicate_code_but_the_allowlisted_pairs():
    found = similar_pairs()
    allowed = read_allowlist()
    new = {k: v for k, v in found.items() if k not in allowed}
    stale = sorted(k for k in allowed if k not in found)
    assert not new, ("code copied between files (remove it, or allowlist the pair with its reason in "
                     "tests/data/duplicate_code_allowlist.txt; `python tests/test_duplicate_code.py` prints the "
                     "list):\n" + _describe(new))
    assert not stale, "allowlisted pairs no longer alike (drop them): " + ", ".join(" | ".join(k) for k in stale)


def test_the_check_finds_a_planted_copy(tmp_path):
    body = "".join(f"    total = total * {i} + len(items) - {i}\n" for i in range(12))
    pkg = tmp_path / "hpcfsdp"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f(items):\n    total = 0\n" + body + "    return total\n")
    (pkg / "b.py").write_text("def g(things):\n    count = 1\n" + body + "    return -count\n")
    (pkg / "c.py").write_text("def h(items):\n    value = 2\n" + body[: body.index("9 + len")].rsplit("\n", 1)[0] +
                              "\n    return value\n")
    found = similar_pairs(str(pkg), str(tmp_path))
    assert list(found) == [("hpcfsdp/a.py", "hpcfsdp/b.py")], found  # c.py shares 9 lines: below the bar
    (n, first, second), = found[("hpcfsdp/a.py", "hpcfsdp/b.py")]
    assert n >= 12 and first[0] <= 3 and second[0] <= 3


def test_allowlist_format(tmp_path):
    listed = tmp_path / "allow.txt"
    listed.write_text(format_allowlist({("hpcfsdp/a.py", "hpcfsdp/b.py"): [], ("hpcfsdp/c.py", "hpcfsdp/d.py"): []},
                                       {("hpcfsdp/a.py", "hpcfsdp/b.py"): "two APIs, one spelling each"}))
    with pytest.raises(ValueError, match="a reason given"):
        read_allowlist(listed)  # a new pair gets a TODO, which the check refuses until someone explains it
    listed.write_text(HEADER + "hpcfsdp/a.py | hpcfsdp/b.py | two APIs, one spelling each\n")
    assert read_allowlist(listed) == {("hpcfsdp/a.py", "hpcfsdp/b.py"): "two APIs, one spelling each"}
    for path, reason in read_allowlist().items():  # the committed list: files that exist
        assert all(os.path.isfile(os.path.join(ROOT, p)) for p in path), (path, reason)


if __name__ == "__main__":
    sys.stdout.write(format_allowlist(similar_pairs(), read_allowlist(strict=False)))
