"""Memory images, partner copies and their restore onto another world (hpcfsdp.distributed.elastic), and the
global batch of `hpcfsdp train --elastic`. The restore is checked without ULFM: the survivors are a
sub-communicator of the ranks, the lost rank simply takes no part (tests/test_elastic_train.py kills ranks)."""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.cli._elastic import GlobalSampler
from hpcfsdp.distributed import checkpoint as dcp
from hpcfsdp.distributed import elastic
from hpcfsdp.distributed.device_mesh import DeviceMesh
from hpcfsdp.distributed.elastic._memory import _partner_of
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.distributed.tensor import DTensor

from _fsdp_util import world

# ------------------------------------------------------------------------------------------- the global batch


@pytest.mark.parametrize("n,g", [(50, 12), (37, 10)])
def test_every_window_once_per_epoch_whatever_the_world(n, g):
    s = GlobalSampler(n, g, seed=3)
    worlds = [6, 5, 5, 3, 6, 2, 4, 1]
    counts = np.zeros(n, np.int64)
    for step in range(n):  # n steps of g windows: g epochs
        w = worlds[step % len(worlds)]
        parts = [s.indices(step, w, r) for r in range(w)]
        assert sum(len(p) for p in parts) == g and max(map(len, parts)) - min(map(len, parts)) <= 1
        np.add.at(counts, np.concatenate(parts), 1)
        # the step's windows do not depend on the world
        assert sorted(np.concatenate(parts).tolist()) == sorted(np.concatenate(
            [s.indices(step, 7, r) for r in range(7)]).tolist())
    assert (counts == g).all()
    first_epoch = np.concatenate([s.indices(k // g, 1, 0)[k % g:k % g + 1] for k in range(n)])
    assert sorted(first_epoch.tolist()) == list(range(n))  # positions 0..n-1: every window once


def test_micro_batches_cover_the_largest_share():
    s = GlobalSampler(100, 24, seed=0)
    assert s.micro_batches(6, 4) == 1 and s.micro_batches(5, 4) == 2 and s.micro_batches(3, 4) == 2
    assert s.micro_batches(2, 4) == 3 and s.micro_batches(1, 4) == 6


def test_a_checkpoint_without_elastic_is_refused():
    s = GlobalSampler(100, 24, seed=0)
    with pytest.raises(ValueError, match="without --elastic"):
        s.load_state_dict({"epoch": 0, "seed": 0})
    with pytest.raises(ValueError, match="same data and seed"):
        s.load_state_dict({"kind": "global", "n": 99, "global_batch": 24, "seed": 0})


# ------------------------------------------------------------------------------------------------ partners


def test_partner_is_the_same_local_rank_on_the_next_host():
    nodes = [0, 0, 1, 1, 2, 2]
    assert [_partner_of(nodes, r) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert [_partner_of([0, 0, 0], r) for r in range(3)] == [1, 2, 0]  # one host: the next rank
    assert _partner_of([0], 0) is None
    uneven = [0, 0, 1, 2, 2]  # host 1 has one rank left: both of host 0's go there
    assert [_partner_of(uneven, r) for r in range(5)] == [2, 2, 3, 0, 1]
    for nodes in ([0, 0, 1, 1, 2, 2], uneven, [0, 1, 1, 1]):
        for r in range(len(nodes)):
            assert nodes[_partner_of(nodes, r)] != nodes[r]


# ------------------------------------------------------------------------------------------------ images


class _Comm:
    """A one-rank communicator (the restore's allgather/alltoall), without MPI."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def allgather(self, x):
        return [x]

    def alltoall(self, x):
        return list(x)


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"model": {"w": hp.tensor(rng.standard_normal((5, 3)).astype(np.float32)),
                      "b": hp.tensor(rng.standard_normal(4).astype(ml_dtypes.bfloat16))},
            "optim": {"step": hp.tensor(np.float32(seed)), "lr": 0.1 * seed}, "step": seed, "name": f"s{seed}"}


def test_an_image_restores_every_value():
    a, b = _state(1), _state(2)
    img = elastic.take_image(a, rank=0, step=7)
    a["model"]["w"]._data[...] = 0  # the image is a copy
    assert elastic.restore(b, [img], _Comm()) == 7
    want = _state(1)
    for k in ("w", "b"):
        np.testing.assert_array_equal(b["model"][k]._data, want["model"][k]._data)
        assert b["model"][k]._data.dtype == want["model"][k]._data.dtype
    assert b["optim"]["step"]._data.shape == () and float(b["optim"]["step"]._data) == 1.0
    assert b["optim"]["lr"] == 0.1 and b["step"] == 1 and b["name"] == "s1"


def test_the_newest_complete_step_wins_and_an_incomplete_one_is_refused():
    old, new = elastic.take_image(_state(1), rank=0, step=3), elastic.take_image(_state(2), rank=0, step=5)
    got = _state(9)
    assert elastic.restore(got, [old, new], _Comm()) == 5 and got["step"] == 2
    part = elastic.take_image({"model": {"w": _state(1)["model"]["w"]}}, rank=0, step=6)
    got = _state(9)
    assert elastic.restore(got, [part, old], _Comm()) == 3  # step 6 lacks model.b and optim.step
    with pytest.raises(elastic.StateLost, match="not complete|model.b"):
        elastic.restore(_state(9), [part], _Comm())
    assert elastic.restore(_state(9), [], _Comm()) is None  # nobody holds anything: nothing filled


# ------------------------------------------------------------------------- restore onto the survivors (MPI)


def _world_comm():
    import hpcfsdp.distributed as dist

    return dist.group.WORLD.comm


def _model(mesh=None):
    hp.manual_seed(0)
    m = hp.nn.Sequential(hp.nn.Linear(6, 10), hp.nn.GELU(), hp.nn.Linear(10, 7))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, hp.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)


def _full(sd):
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v)._data.copy() for k, v in sd.items()
            if hasattr(v, "_data")}


def _flat_optim(osd):
    return {f"{k}.{n}": v for k, st in osd["state"].items() for n, v in st.items()}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_partner_copies_restore_a_lost_rank_onto_the_survivors():
    w, r = world()
    comm = _world_comm()
    m, opt = _model()
    rng = np.random.default_rng(5)
    for _ in range(2):
        m(hp.tensor(rng.standard_normal((4, 6)).astype(np.float32))).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    state = {"model": dcp.get_model_state_dict(m), "optim": _flat_optim(dcp.get_optimizer_state_dict(m, opt)),
             "step": 2}
    want_model, want_optim = _full(state["model"]), _full(state["optim"])
    copies = elastic.PartnerCopies(1)
    copies.setup()
    copies.save(state, 2)
    copies.save(state, 2)  # the second save completes the first's copy (as the next step's would)
    lost = w - 1
    sub = comm.Split(0 if r != lost else 1, r)
    survivors = DeviceMesh("cpu", list(range(w - 1)))  # collective over every rank; the lost rank leaves now
    if r == lost:
        sub.Free()
        return
    nm, _ = _model(mesh=survivors)
    # (the optimizer's state dict agrees on names over the default group, which holds the lost rank here: the
    # optimizer state's restore is checked by the trainer's tests, where the survivors are the default group)
    fresh = {"model": dcp.get_model_state_dict(nm), "optim": {k: hp.zeros(v.shape) for k, v in want_optim.items()},
             "step": 0}
    assert elastic.restore(fresh, copies.images(), sub) == 2
    dcp.set_model_state_dict(nm, fresh["model"])
    got_model = _full(dcp.get_model_state_dict(nm))
    assert fresh["step"] == 2 and set(got_model) == set(want_model)
    for k in want_model:
        np.testing.assert_array_equal(got_model[k], want_model[k], err_msg=k)
    for k in want_optim:  # the optimizer's state, whole on every survivor (a replicated tensor)
        np.testing.assert_array_equal(fresh["optim"][k]._data, want_optim[k], err_msg=k)
    assert copies.memory_bytes() >= 2 * copies.own[-1].nbytes  # its own two, and what its sender copied to it
    sub.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_without_copies_a_lost_shard_is_reported_not_guessed():
    w, r = world()
    comm = _world_comm()
    m, opt = _model()
    state = {"model": dcp.get_model_state_dict(m), "step": 1}
    own = elastic.PartnerCopies(1, send=False)
    own.setup()
    own.save(state, 1)
    lost = w - 1
    sub = comm.Split(0 if r != lost else 1, r)
    survivors = DeviceMesh("cpu", list(range(w - 1)))
    if r == lost:
        sub.Free()
        return
    nm, _ = _model(mesh=survivors)
    with pytest.raises(elastic.StateLost, match=r"no step.s state is complete.*model.0.weight at .* elements held"):
        elastic.restore({"model": dcp.get_model_state_dict(nm), "step": 0}, own.images(), sub)
    sub.Free()
