"""`hpcfsdp info --all-ranks`: what is the same on every rank once, what differs grouped by rank ranges."""

import json
import os
import subprocess
import sys

import pytest

from hpcfsdp.cli._rank_groups import grouped_lines, node_layout, rank_ranges

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]


def test_rank_ranges():
    assert rank_ranges([3, 0, 1, 2, 8]) == "0-3,8"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([1, 2, 3, 7, 8]) == "1-3,7-8"
    assert rank_ranges([0, 2]) == "0,2"
    assert rank_ranges(range(0, 512, 4)) == "0,4,...,508"
    assert rank_ranges(range(512)) == "0-511"


def test_node_layout():
    assert node_layout([0, 0, 1, 1]) == "2 node(s) of 2 rank(s), in blocks (node i: ranks 2i..2i+1)"
    assert node_layout([0, 1, 0, 1]).startswith("2 node(s), ranks round-robin")
    assert node_layout([0, 0, 0, 1]) == "node 0: ranks 0-2; node 1: rank 3"


def _report(r, per_node=4, odd_host=None):
    host = f"n{r // per_node:03d}"
    return {"vendor": "MPICH", "world_size": 512, "world_rank": r, "processor_name": host,
            "cuda_aware": r // per_node != odd_host, "node_index": r // per_node, "local_rank": r % per_node,
            "settings": {"HPCFSDP_COMM_TIMEOUT": "600.0 (default)", "HPCFSDP_RANK_ENV_PID": str(1000 + r)}}


def test_512_ranks_print_one_line_per_node_not_per_rank():
    reports = [_report(r, odd_host=5) for r in range(512)]
    lines = grouped_lines(reports)
    assert len(lines) < 200, len(lines)  # 128 nodes; the rank-by-rank print was 512 x 8 lines here
    assert lines[0] == "512 rank(s); the same on every rank:"
    assert "vendor: MPICH" in lines and "world_rank: each rank's own number" in lines
    assert "  HPCFSDP_COMM_TIMEOUT: 600.0 (default)" in lines
    at = lines.index("differs between ranks:")
    blocks = lines[at + 1:]
    # host and node index split the ranks the same way: one block, one line per node
    host = blocks.index("  processor_name, node_index:")
    assert blocks[host + 1:host + 3] == ["    ranks 0-3: n000, 0", "    ranks 4-7: n001, 1"]
    assert blocks[host + 128] == "    ranks 508-511: n127, 127"
    # the one node whose MPI disagrees stands out
    assert blocks[blocks.index("  cuda_aware:") + 1:][:2] == ["    ranks 0-19,24-511: True", "    ranks 20-23: False"]
    local = blocks.index("  local_rank:")
    assert blocks[local + 1] == "    ranks 0,4,...,508: 0" and blocks[local + 4] == "    ranks 3,7,...,511: 3"
    pid = blocks.index("  settings.HPCFSDP_RANK_ENV_PID:")
    assert blocks[pid + 1:pid + 6] == ["    rank 0: 1000", "    rank 1: 1001", "    rank 2: 1002",
                                       "    ... (a different value on each of the 512 ranks; --json lists them)",
                                       "    rank 511: 1511"]
    assert len(blocks) == pid + 6


def test_nothing_differs():
    same = [{"vendor": "MPICH", "world_rank": r} for r in range(3)]
    assert grouped_lines(same)[-1] == "nothing differs between ranks"


@pytest.mark.timeout(240)
def test_all_ranks_under_mpi_prints_each_common_item_once_and_groups_the_rest():
    """4 ranks as 2 simulated nodes of 2: the text against the same job's --json reports."""
    stale = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID")
    env = dict({k: v for k, v in os.environ.items() if k not in stale},
               PYTHONPATH=os.pathsep.join(sys.path), HPCFSDP_RANKS_PER_NODE="2")
    runs = {}
    for flags in (["--json"], []):
        res = subprocess.run(HP + ["launch", "-n", "4", "--", sys.executable, "-m", "hpcfsdp.cli.main", "info",
                                   "--all-ranks", *flags], capture_output=True, text=True, timeout=200, env=env)
        assert res.returncode == 0, res.stderr
        runs[bool(flags)] = res.stdout
    reports = json.loads(runs[True])
    lines = runs[False].splitlines()
    assert len(reports) == 4 and lines[0] == "4 rank(s); the same on every rank:"
    assert len(lines) < 46 * 2, runs[False]  # was 46 lines per rank
    at = lines.index("differs between ranks:")
    for key in reports[0]:
        values = [json.dumps(r[key], sort_keys=True) for r in reports]
        if key in ("settings", "world_rank", "node_of_rank"):
            continue
        if len(set(values)) == 1:  # printed once, before the differing items
            assert lines.index(f"{key}: {reports[0][key]}") < at and lines.count(f"{key}: {reports[0][key]}") == 1
        else:
            assert f"  {key}:" in lines[at:] or any(key in ln.split(", ") for ln in lines[at:]), key
    assert "world_rank: each rank's own number" in lines
    assert "node_of_rank: 2 node(s) of 2 rank(s), in blocks (node i: ranks 2i..2i+1)" in lines
    body = lines[at:]
    ni = body.index("  node_index:")
    assert body[ni + 1:ni + 3] == ["    ranks 0-1: 0", "    ranks 2-3: 1"]
    lr = body.index("  local_rank:")
    assert body[lr + 1:lr + 3] == ["    ranks 0,2: 0", "    ranks 1,3: 1"]
    for name, row in reports[0]["settings"].items():
        if all(r["settings"][name] == row for r in reports):
            assert sum(ln.startswith(f"  {name}: ") for ln in lines) == 1, name
