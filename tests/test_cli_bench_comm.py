"""`hpcfsdp bench comm`: size sweep, nccl-tests bandwidth definitions, hpcfsdp vs raw mpi4py rows."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from hpcfsdp.cli import bench_comm as bc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    bc.add_parser(sub)
    return p


def test_sizes_bus_factor_and_parser():
    assert bc.sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert bc.sizes(1 << 10, 256 << 20)[-1] == 256 << 20
    with pytest.raises(ValueError, match="expected 0 < min <= max"):
        bc.sizes(4096, 1024)
    # nccl-tests: allgather/reducescatter (n-1)/n, allreduce 2(n-1)/n
    assert bc.bus_factor("all_gather", 4) == 0.75 and bc.bus_factor("reduce_scatter", 2) == 0.5
    assert bc.bus_factor("all_reduce", 4) == 1.5 and bc.bus_factor("all_reduce", 1) == 1.0
    a = _parser().parse_args(["comm", "--min-bytes", "1K", "--max-bytes", "16M", "--ops", "all_reduce"])
    assert a.min_bytes == 1024 and a.max_bytes == 16 << 20 and a.iters == 20 and a.warmup == 3
    with pytest.raises(SystemExit):
        _parser().parse_args(["comm", "--min-bytes", "lots"])
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        bc.bench_comm(ops="alltoall")


def _check_rows(rows, n, ops, nsizes):
    assert [r["op"] for r in rows] == [o for o in ops for _ in range(nsizes)]
    for r in rows:
        assert r["ranks"] == n and r["count"] % n == 0 and r["bytes"] == r["count"] * 4
        for impl in ("hpcfsdp", "mpi4py"):
            m = r[impl]
            assert 0 < m["time_us_min"] <= m["time_us_avg"] <= m["time_us_max"]
            assert m["algbw_GBps"] == pytest.approx(r["bytes"] / (m["time_us_max"] * 1e-6) / 1e9)
            assert m["busbw_GBps"] == pytest.approx(m["algbw_GBps"] * bc.bus_factor(r["op"], n))
        assert r["ratio"] == pytest.approx(r["hpcfsdp"]["busbw_GBps"] / r["mpi4py"]["busbw_GBps"])


@pytest.mark.mpi(min_size=2)
def test_bench_comm_rows_under_mpi():
    from mpi4py import MPI

    n = MPI.COMM_WORLD.Get_size()
    ops = ["all_gather", "reduce_scatter", "all_reduce"]
    rows = bc.bench_comm(min_bytes=1024, max_bytes=8192, iters=2, warmup=1, ops=",".join(ops))
    _check_rows(rows, n, ops, 4)
    assert MPI.COMM_WORLD.allgather(json.dumps(rows, sort_keys=True))[0] == json.dumps(rows, sort_keys=True)
    table = bc.format_table(rows)
    assert "all_reduce" in table and "ratio" in table
    # a dtype raw MPI cannot reduce: hpcfsdp still runs (float32 fallback), no raw column
    bf = bc.bench_comm(min_bytes=1024, max_bytes=1024, iters=1, warmup=0, dtype="bfloat16", ops="all_reduce")
    assert "mpi4py" not in bf[0] and bf[0]["hpcfsdp"]["busbw_GBps"] > 0 and bf[0]["dtype"] == "bfloat16"


def test_bench_comm_command_writes_json_lines(tmp_path):
    out = tmp_path / "comm.jsonl"
    script = ("import argparse, sys\nfrom hpcfsdp.cli import bench_comm\np = argparse.ArgumentParser()\n"
              "bench_comm.add_parser(p.add_subparsers())\na = p.parse_args(sys.argv[1:])\nsys.exit(a.func(a))\n")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    p = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", script, "comm", "--min-bytes", "1K",
                        "--max-bytes", "4K", "--iters", "2", "--warmup", "1", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    _check_rows(rows, 2, ["all_gather", "reduce_scatter", "all_reduce"], 3)
    assert p.stdout.count("# ranks=2") == 1  # rank 0 prints the table once
