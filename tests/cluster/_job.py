"""MPI programs for the multi-host tests: `python _job.py MODE [ARGS]`, run across simulated hosts.

groups H             node detection (no override) and HSDP groups; bytes on this host's link while the
                     shard groups all-gather (must stay inside the host) and the replicate groups all-reduce
parity STRATEGY H    FSDP training with STRATEGY against the unsharded reference on the global batch
p2p NBYTES           world rank 0 sends NBYTES to the last rank (another host); the seconds it took
hang DIR             write DIR/rank<r>.pid, then all-reduce forever (a test kills one rank)
Rank 0 prints one line `RESULT <json>` when a mode succeeds.
"""
import json
import os
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: _fsdp_util

import hpcfsdp as hp  # noqa: E402
import hpcfsdp.distributed as dist  # noqa: E402
from hpcfsdp.distributed import _mpi  # noqa: E402
from hpcfsdp.distributed.fsdp import FSDP, ShardingStrategy  # noqa: E402
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from hpcfsdp.models.gpt import Block  # noqa: E402

from _fsdp_util import full, global_mean, gpt_batches, local, tiny_gpt  # noqa: E402

SHARD_PAYLOAD = 4 << 20  # bytes each shard-group all-gather produces
SHARD_ITERS = 8
REPLICATE_PAYLOAD = 1 << 20  # bytes each rank all-reduces over its replicate group
REPLICATE_ITERS = 2


def link_tx() -> int:
    """Bytes this host's link (eth0 of its network namespace) has sent."""
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def host_tx_window(fn, layout):
    """Run ``fn`` between two world barriers; the bytes each host sent meanwhile (list indexed by node). The
    barrier after the first reading keeps every rank's sends after its host leader's reading."""
    dist.barrier()
    t0 = link_tx()
    dist.barrier()
    fn()
    dist.barrier()
    sent = link_tx() - t0 if layout["local_rank"] == 0 else -1
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, (layout["node_index"], sent))
    out = [0] * layout["num_nodes"]
    for node, b in per_rank:
        if b >= 0:
            out[node] = b
    return out


def check_layout(expect_hosts):
    layout = _mpi.node_layout()
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    assert layout["num_nodes"] == expect_hosts, (layout, names)
    # a node is exactly a host: same hostname <=> same node
    for i in range(len(names)):
        for j in range(len(names)):
            assert (names[i] == names[j]) == (layout["node_of_rank"][i] == layout["node_of_rank"][j]), (layout, names)
    assert layout["node_major"], layout
    return layout, names


def groups(expect_hosts):
    layout, names = check_layout(expect_hosts)
    model = tiny_gpt(n_layer=1)
    FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=ModuleWrapPolicy({Block}))
    info = model._get_fsdp_state().mesh_info
    spg, rpg = info.shard_process_group, info.replicate_process_group
    shard_ranks, rep_ranks = list(spg.world_ranks), list(rpg.world_ranks)
    assert len({names[r] for r in shard_ranks}) == 1, (shard_ranks, names)  # one host
    assert len({names[r] for r in rep_ranks}) == len(rep_ranks) == expect_hosts, (rep_ranks, names)  # one per host
    k = spg.size()
    src = hp.ones(SHARD_PAYLOAD // 4 // k, dtype=hp.float32) * (dist.get_rank() + 1)
    out = hp.empty(SHARD_PAYLOAD // 4, dtype=hp.float32)

    def shard_traffic():
        for _ in range(SHARD_ITERS):
            dist.all_gather_into_tensor(out, src, group=spg)

    red = hp.ones(REPLICATE_PAYLOAD // 4, dtype=hp.float32)

    def replicate_traffic():
        for _ in range(REPLICATE_ITERS):
            dist.all_reduce(red, group=rpg)

    shard_sent = host_tx_window(shard_traffic, layout)
    expect = np.repeat(np.arange(1, dist.get_world_size() + 1, dtype=np.float32)[shard_ranks], SHARD_PAYLOAD // 4 // k)
    assert np.array_equal(out.numpy(), expect), "shard-group all-gather gave wrong values"
    rep_sent = host_tx_window(replicate_traffic, layout)
    assert np.all(red.numpy() == float(expect_hosts) ** REPLICATE_ITERS)
    return {"num_nodes": layout["num_nodes"], "hostnames": names, "shard_ranks": shard_ranks, "replicate_ranks": rep_ranks,
            "shard_size": k, "shard_sent": shard_sent, "replicate_sent": rep_sent,
            "shard_payload": SHARD_PAYLOAD * SHARD_ITERS, "replicate_payload": REPLICATE_PAYLOAD * REPLICATE_ITERS}


def parity(strategy_name, expect_hosts, steps=4):
    layout, _ = check_layout(expect_hosts)
    w = dist.get_world_size()
    strategy = ShardingStrategy[strategy_name]
    ref = tiny_gpt()
    fsdp = FSDP(tiny_gpt(), sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in gpt_batches(steps, 4 * w + 1):
        _, loss = fsdp(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        got = global_mean(loss.item())
        np.testing.assert_allclose(got, rl.item(), rtol=1e-5, atol=1e-6)
        losses.append(got)
    refp = dict(ref.named_parameters())
    nparam = 0
    for name, p in fsdp.named_parameters():
        np.testing.assert_allclose(full(p), refp[name].detach().numpy(), atol=2e-5, rtol=2e-4, err_msg=name)
        nparam += int(np.prod(refp[name].shape))
    return {"strategy": strategy_name, "losses": losses, "num_nodes": layout["num_nodes"], "param_bytes": 4 * nparam}


def p2p(nbytes):
    from hpcfsdp.distributed._mpi import get_mpi

    comm = get_mpi().COMM_WORLD
    last = comm.Get_size() - 1
    buf = np.ones(nbytes, dtype=np.uint8)
    comm.Barrier()
    t0 = time.perf_counter()
    if comm.Get_rank() == 0:
        comm.Send(buf, dest=last, tag=7)
        comm.Recv(buf[:1], source=last, tag=8)
    elif comm.Get_rank() == last:
        comm.Recv(buf, source=0, tag=7)
        comm.Send(buf[:1], dest=0, tag=8)
    return {"seconds": time.perf_counter() - t0, "nbytes": nbytes}


def hang(d):
    r = dist.get_rank()
    with open(os.path.join(d, f"rank{r}.pid.tmp"), "w") as f:
        f.write(f"{os.getpid()} {socket.gethostname()}")
    os.replace(os.path.join(d, f"rank{r}.pid.tmp"), os.path.join(d, f"rank{r}.pid"))
    t = hp.ones(4)
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)


def main():
    mode = sys.argv[1]
    dist.init_process_group()
    if mode == "groups":
        res = groups(int(sys.argv[2]))
    elif mode == "parity":
        res = parity(sys.argv[2], int(sys.argv[3]))
    elif mode == "p2p":
        res = p2p(int(sys.argv[2]))
    elif mode == "hang":
        hang(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
