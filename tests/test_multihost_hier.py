"""Across simulated hosts (system tier): node-aware all-gather/reduce-scatter put (H-1)/H of the buffer on a link.

Run as a script (`python test_multihost_hier.py H`) it is the MPI job: the world group (node-aware by
default) and a flat one (HPCFSDP_COMM_HIERARCHY=flat) all-gather and reduce-scatter the same buffers; the
results must agree, and each host's link bytes are counted between two barriers. With `allreduce` after H
it all-reduces instead, as reduce-scatter + all-gather (HPCFSDP_COMM_ALLREDUCE=auto) and with the MPI
library's algorithm. Rank 0 prints `RESULT <json>`.
"""
import json
import os
import sys

import numpy as np
import pytest

PAYLOAD = 4 << 20  # bytes of the full (all-gather output / reduce-scatter input) buffer
ITERS = 4


def _tx():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def _window(world, layout, fn):
    """Bytes each host's link sent while ``fn`` ran ITERS times, between two barriers, by host. The barrier
    after the first reading keeps every rank's sends after it (a rank leaving the first barrier early had
    put part of its first all-gather before its host leader's reading: 1.3% below the minimum, once)."""
    world.Barrier()
    t0 = _tx()
    world.Barrier()
    for _ in range(ITERS):
        fn()
    world.Barrier()
    sent = _tx() - t0 if layout["local_rank"] == 0 else -1
    per = world.allgather((layout["node_index"], sent))
    return [b for _, b in sorted(p for p in per if p[1] >= 0)]


def _allreduce_job(world, layout) -> dict:
    from hpcfsdp.distributed._mpi import get_mpi
    from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

    rsag = ProcessGroup(world, name="rsag")
    os.environ["HPCFSDP_COMM_ALLREDUCE"] = "library"
    lib = ProcessGroup(world, name="library")
    r = world.Get_rank()
    a = np.arange(PAYLOAD // 4, dtype=np.float32) % 89 + r  # integral sums: exact in float32
    b = a.copy()
    out = {"payload": PAYLOAD * ITERS, "hosts": layout["num_nodes"]}
    out["rsag"] = _window(world, layout, lambda: rsag.all_reduce_(a, ReduceOp.AVG))
    out["library"] = _window(world, layout, lambda: lib.all_reduce_(b, ReduceOp.AVG))
    out["equal"] = bool(world.allreduce(int(np.array_equal(a, b)), op=get_mpi().MIN))
    rsag.destroy()
    lib.destroy()
    return out


def _job(expect_hosts: int, what: str) -> dict:
    from hpcfsdp.distributed._mpi import get_mpi, node_layout
    from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

    MPI = get_mpi()
    world = MPI.COMM_WORLD
    layout = node_layout(world)
    assert layout["num_nodes"] == expect_hosts, layout
    if what == "allreduce":
        return _allreduce_job(world, layout)
    hier = ProcessGroup(world, name="hier")
    os.environ["HPCFSDP_COMM_HIERARCHY"] = "flat"
    flat = ProcessGroup(world, name="flat")
    n, r = world.Get_size(), world.Get_rank()
    k = PAYLOAD // 4 // n
    part = (np.arange(k, dtype=np.float32) + 1000 * r)
    full = np.empty(k * n, np.float32)
    ref = np.empty(k * n, np.float32)
    red_in = np.arange(k * n, dtype=np.float32) % 97 + r
    red, red_ref = np.empty(k, np.float32), np.empty(k, np.float32)

    def window(fn):
        return _window(world, layout, fn)

    out = {"hierarchical": hier.hierarchical, "flat_is_flat": not flat.hierarchical, "payload": PAYLOAD * ITERS,
           "hosts": layout["num_nodes"], "ppn": layout["local_size"]}
    out["ag_hier"] = window(lambda: hier.all_gather_into(full, part))
    out["ag_flat"] = window(lambda: flat.all_gather_into(ref, part))
    out["rs_hier"] = window(lambda: hier.reduce_scatter_into(red, red_in, ReduceOp.SUM))
    out["rs_flat"] = window(lambda: flat.reduce_scatter_into(red_ref, red_in, ReduceOp.SUM))
    out["ag_equal"] = bool(np.array_equal(full, ref))
    out["rs_equal"] = bool(world.allreduce(int(np.array_equal(red, red_ref)), MPI.MIN))  # integral sums: exact
    hier.destroy()
    flat.destroy()
    return out


if __name__ == "__main__":
    res = _job(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "gather")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print("RESULT " + json.dumps(res), flush=True)
    sys.exit(0)


pytestmark = pytest.mark.system
PY = sys.executable


@pytest.mark.timeout(240)
def test_node_aware_collectives_cross_each_link_once(cluster):
    hosts, ppn = 2, 2
    out, _ = cluster.launch(hosts, ppn, [PY, os.path.abspath(__file__), str(hosts)], timeout=200)
    assert out.returncode == 0, f"job failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    assert res["hierarchical"] and res["flat_is_flat"], res
    assert res["ag_equal"] and res["rs_equal"], res
    least = (hosts - 1) / hosts * res["payload"]  # the node-aware minimum per host
    for key in ("ag_hier", "rs_hier"):
        for b in res[key]:
            assert least <= b <= 1.10 * least, f"{key}: a host sent {b} B, node-aware minimum {least:.0f} B: {res}"
    # the flat ring crosses each host boundary with (n-1)/n of the buffer: more than the node-aware path
    for key in ("ag_flat", "rs_flat"):
        assert max(res[key]) > 1.2 * least, f"{key}: {res}"


@pytest.mark.timeout(240)
def test_all_reduce_over_three_hosts_sends_the_ring_minimum(cluster):
    """3 hosts (not a power of two): reduce-scatter + all-gather puts 2(H-1)/H of the buffer on each link;
    MPICH's all-reduce folds the third host into a pair and sends the whole buffer there and back."""
    hosts = 3
    out, _ = cluster.launch(hosts, 1, [PY, os.path.abspath(__file__), str(hosts), "allreduce"], timeout=200)
    assert out.returncode == 0, f"job failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    assert res["equal"], res
    least = 2 * (hosts - 1) / hosts * res["payload"]
    assert all(least <= b <= 1.10 * least for b in res["rsag"]), (least, res)
    assert max(res["library"]) > 1.3 * least, (least, res)  # why auto does not leave it to the library
    print(f"3 hosts, all-reduce of {res['payload']} B: bytes per host {res['rsag']} (reduce-scatter + all-gather), "
          f"{res['library']} (library); minimum {least:.0f}")
