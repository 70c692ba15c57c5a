"""Sharded checkpoint storage: save/load of N-D pieces, resharding, atomic commit, corruption, fuzzing."""
import glob
import json
import os
import shutil
import tempfile

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from hpcfsdp.distributed.checkpoint import _format as F
from hpcfsdp.distributed.checkpoint import _storage

SELF = MPI.COMM_SELF


def chunk(n, world, r):
    """FSDP2 / torch.chunk semantics: ceil(n/world) rows per rank, last ranks short or empty."""
    c = -(-n // world)
    return min(r * c, n), min((r + 1) * c, n)


def reference(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((10, 7)).astype(np.float32),
        "cube": rng.integers(-1000, 1000, (5, 4, 6), dtype=np.int64),
        "bf": rng.standard_normal((9, 3)).astype(ml_dtypes.bfloat16),
        "f8": rng.standard_normal(11).astype(ml_dtypes.float8_e4m3fn),
        "mask": rng.random((3, 3)) > 0.5,
        "step": np.array(17, np.int64),
        "bias": rng.standard_normal(7).astype(np.float64),
    }


def split_pieces(ref, parts, dim=0):
    """All entries as pieces split along `dim` (chunk semantics, empty pieces included); scalars whole."""
    out = {}
    for name, a in ref.items():
        if a.ndim == 0:
            out[name] = F.Piece((), a.dtype, (), a)
            continue
        d = min(dim, a.ndim - 1)
        lst = []
        for r in range(parts):
            lo, hi = chunk(a.shape[d], parts, r)
            offs = tuple(lo if k == d else 0 for k in range(a.ndim))
            lst.append(F.Piece(a.shape, a.dtype, offs, np.take(a, np.arange(lo, hi), axis=d)))
        out[name] = lst
    return out


def load_full(path, names_like, comm=None, **kw):
    outs = {n: np.zeros_like(a) for n, a in names_like.items()}
    res = F.load_pieces(path, {n: (a.shape, a.dtype, (0,) * a.ndim, outs[n]) for n, a in names_like.items()},
                        comm=comm, **kw)
    return outs, res


def as_bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # bit-exact, NaN-safe comparison


def assert_same(got, ref):
    assert set(got) == set(ref)
    for n in ref:
        assert got[n].dtype == ref[n].dtype and got[n].shape == ref[n].shape, n
        np.testing.assert_array_equal(as_bytes(got[n]), as_bytes(ref[n]), err_msg=n)


@pytest.fixture
def ckdir(tmp_path):
    return str(tmp_path / "ck")


# ------------------------------------------------------------------------------------------- round trips


def test_roundtrip_all_dtypes_and_independent_safetensors_reader(ckdir):

    ref = reference()
    F.save_pieces(ckdir, split_pieces(ref, 3), comm=SELF, extras={"step": 17, "rng": [1, 2]}, mesh_info={"dp": 1})
    got, res = load_full(ckdir, ref)
    assert_same(got, ref)
    assert res.missing_keys == [] and res.unexpected_keys == []
    md = F.read_metadata(ckdir)
    assert md.extras == {"step": 17, "rng": [1, 2]} and md.mesh == {"dp": 1} and md.world_size == 1
    assert md.total_bytes == sum(a.nbytes for a in ref.values())
    assert md.entries["bf"].dtype == np.dtype(ml_dtypes.bfloat16) and md.entries["cube"].shape == (5, 4, 6)


def test_shard_files_are_valid_safetensors(ckdir):
    from safetensors.numpy import load_file

    ref = reference()
    del ref["f8"]  # the safetensors library has no float8 for NumPy
    F.save_pieces(ckdir, split_pieces(ref, 3), comm=SELF)
    md = F.read_metadata(ckdir)
    tensors = load_file(os.path.join(md.path, "rank_00000.safetensors"))
    assert len(tensors) == sum(len(e.pieces) for e in md.entries.values())
    for name, e in md.entries.items():
        for p in e.pieces:
            box = tuple(slice(o, o + n) for o, n in zip(p.offsets, p.lengths))
            np.testing.assert_array_equal(as_bytes(tensors[p.tensor]), as_bytes(ref[name][box]))
            assert p.tensor == f"{name}|{','.join(map(str, p.offsets))}"


@pytest.mark.parametrize("block_size,read_chunk", [(1 << 20, 32 << 20), (8, 24), (24, 7)])
def test_arbitrary_boxes_reshard_across_pieces(ckdir, monkeypatch, block_size, read_chunk):
    monkeypatch.setattr(_storage, "READ_CHUNK", read_chunk)  # exercise the chunked, unaligned read path
    ref = reference(1)
    F.save_pieces(ckdir, split_pieces(ref, 4, dim=0), comm=SELF, block_size=block_size)
    rng = np.random.default_rng(5)
    for _ in range(60):
        name = rng.choice([n for n in ref if ref[n].ndim])
        a = ref[name]
        lo = [int(rng.integers(0, s)) for s in a.shape]
        ln = [int(rng.integers(1, s - o + 1)) for s, o in zip(a.shape, lo)]
        out = np.zeros(ln, a.dtype)
        F.load_pieces(ckdir, {name: (a.shape, a.dtype, lo, out)})
        box = tuple(slice(o, o + n) for o, n in zip(lo, ln))
        np.testing.assert_array_equal(as_bytes(out), as_bytes(a[box]), err_msg=f"{name} {lo} {ln}")


def test_load_into_noncontiguous_output_and_several_boxes(ckdir):
    ref = reference(2)
    F.save_pieces(ckdir, split_pieces(ref, 3, dim=1), comm=SELF, block_size=16)
    big = np.zeros((7, 20), np.float32)
    dest = big[:, ::2]  # (7, 10) strided view, transposed target of w
    w_t = np.zeros((10, 7), np.float32)
    halves = [np.zeros((5, 7), np.float32), np.zeros((5, 7), np.float32)]
    F.load_pieces(ckdir, {"w": [((10, 7), np.float32, (0, 0), halves[0]), ((10, 7), np.float32, (5, 0), halves[1]),
                                ((10, 7), np.float32, (0, 0), w_t)]}, strict=False)
    dest[...] = w_t.T
    np.testing.assert_array_equal(np.concatenate(halves), ref["w"])
    np.testing.assert_array_equal(big[:, ::2], ref["w"].T)


def test_identical_boxes_are_written_once(ckdir):
    b = np.arange(6.0)
    F.save_pieces(ckdir, {"b": [F.Piece((6,), np.float64, (0,), b), F.Piece((6,), np.float64, (0,), b.copy())],
                          "e": [F.Piece((4,), np.float64, (0,), np.ones(4)),
                                F.Piece((4,), np.float64, (4,), np.ones(0))]},
                  comm=SELF)
    md = F.read_metadata(ckdir)
    assert len(md.entries["b"].pieces) == 1 and len(md.entries["e"].pieces) == 1
    from safetensors import safe_open

    with safe_open(os.path.join(md.path, "rank_00000.safetensors"), framework="np") as f:
        assert sorted(f.keys()) == ["b|0", "e|0"]


def test_empty_entries_and_extras_only(ckdir):
    F.save_pieces(ckdir, {"z": F.Piece((0, 3), np.float32, (0, 0), np.zeros((0, 3), np.float32))}, comm=SELF,
                  extras={"sampler": {"epoch": 2, "position": 5}})
    md = F.read_metadata(ckdir)
    assert md.entries["z"].pieces == () and md.files == {} and md.extras["sampler"]["position"] == 5
    out = np.zeros((0, 3), np.float32)
    F.load_pieces(ckdir, {"z": ((0, 3), np.float32, (0, 0), out)})
    F.verify_checkpoint(ckdir)


def test_benchmark_io_returns_rates(tmp_path):
    r = F.benchmark_io(str(tmp_path / "bench"), 1 << 16, SELF)
    assert r["roundtrip_ok"] and r["bytes"] == 1 << 16 and r["world_size"] == 1
    for k in ("save_GBps", "load_GBps", "raw_write_GBps", "raw_read_GBps"):
        assert r[k] > 0
    assert os.listdir(tmp_path / "bench") == []


# ------------------------------------------------------------------------------------------------- errors


def test_save_rejects_bad_pieces(ckdir):
    a = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        F.save_pieces(ckdir, {"w": [(a.shape, np.float32, (0, 0), a[:3]), (a.shape, np.float32, (2, 0), a[:2])]},
                      comm=SELF)
    with pytest.raises(ValueError, match=r"cover 6 of its 8 elements"):
        F.save_pieces(ckdir, {"w": [(a.shape, np.float32, (0, 0), a[:3])]}, comm=SELF)
    with pytest.raises(ValueError, match=r"exceeds global shape"):
        F.save_pieces(ckdir, {"w": [(a.shape, np.float32, (3, 0), a[:3])]}, comm=SELF)
    with pytest.raises(TypeError, match="dtype float64 != declared dtype float32"):
        F.save_pieces(ckdir, {"w": (a.shape, np.float32, (0, 0), a.astype(np.float64))}, comm=SELF)
    with pytest.raises(TypeError, match="cannot be stored"):
        F.save_pieces(ckdir, {"o": ((1,), object, (0,), np.zeros(1, object))}, comm=SELF)
    with pytest.raises(ValueError, match="__metadata__"):
        F.save_pieces(ckdir, {"__metadata__": (a.shape, np.float32, (0, 0), a)}, comm=SELF)
    with pytest.raises(ValueError, match="JSON"):
        F.save_pieces(ckdir, {"w": (a.shape, np.float32, (0, 0), a)}, comm=SELF, extras={"loss": float("nan")})
    assert not os.path.lexists(ckdir) and os.listdir(os.path.dirname(ckdir)) == []


def test_save_refuses_to_clobber_other_things(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me")
    a = np.zeros(2)
    for target in ("notes", "file"):
        with pytest.raises(ValueError, match="not a checkpoint directory; refusing"):
            F.save_pieces(str(tmp_path / target), {"a": ((2,), a.dtype, (0,), a)}, comm=SELF)
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me" and (tmp_path / "file").read_text() == "keep me"


def test_load_errors_name_entry_and_shapes(ckdir):
    a = np.arange(12.0).reshape(3, 4)
    F.save_pieces(ckdir, {"w": (a.shape, a.dtype, (0, 0), a)}, comm=SELF)
    with pytest.raises(ValueError, match=r"'w'.*shape \(4, 3\).*shape \(3, 4\)"):
        F.load_pieces(ckdir, {"w": ((4, 3), a.dtype, (0, 0), np.zeros((4, 3)))})
    with pytest.raises(ValueError, match=r"dtype float32.*dtype float64"):
        F.load_pieces(ckdir, {"w": ((3, 4), np.float32, (0, 0), np.zeros((3, 4), np.float32))})
    with pytest.raises(ValueError, match=r"missing from checkpoint.*\['nope', 'zzz'\]"):
        F.load_pieces(ckdir, {"nope": ((1,), a.dtype, (0,), np.zeros(1)), "zzz": ((1,), a.dtype, (0,), np.zeros(1))})
    res = F.load_pieces(ckdir, {"nope": ((1,), a.dtype, (0,), np.zeros(1))}, strict=False)
    assert res.missing_keys == ["nope"] and res.unexpected_keys == ["w"]
    with pytest.raises(ValueError, match="exceeds global shape"):
        F.load_pieces(ckdir, {"w": ((3, 4), a.dtype, (2, 0), np.zeros((2, 4)))})


def test_not_a_checkpoint_and_future_version(tmp_path, ckdir):
    with pytest.raises(ValueError, match="does not exist"):
        F.read_metadata(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        F.read_metadata(tmp_path / "empty")
    F.save_pieces(ckdir, {"s": ((), np.int64, (), np.array(3))}, comm=SELF)
    mpath = os.path.join(ckdir, "metadata.json")
    meta = json.load(open(mpath))
    meta["version"] = 99
    os.chmod(mpath, 0o644)
    json.dump(meta, open(mpath, "w"))
    with pytest.raises(ValueError, match="version 99 is newer"):
        F.load_pieces(ckdir, {"s": ((), np.int64, (), np.zeros((), np.int64))})
    json.dump({"format": "something-else"}, open(mpath, "w"))
    with pytest.raises(ValueError, match="not an hpcfsdp checkpoint"):
        F.read_metadata(ckdir)


def test_flipped_byte_names_file_and_tensor_and_cli_verify_fails(ckdir):
    from hpcfsdp.cli.checkpoint import main

    a = np.arange(64, dtype=np.float32)
    F.save_pieces(ckdir, {"w": [((64,), a.dtype, (0,), a[:40]), ((64,), a.dtype, (40,), a[40:])]}, comm=SELF,
                  block_size=32)
    md = F.read_metadata(ckdir)
    p = md.entries["w"].pieces[1]
    fpath = os.path.join(md.path, p.file)
    with open(fpath, "r+b") as f:
        f.seek(p.byte_offset + 50)
        b = f.read(1)
        f.seek(p.byte_offset + 50)
        f.write(bytes([b[0] ^ 0x10]))
    out = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match=r"checksum mismatch in .*rank_00000\.safetensors tensor 'w\|40'"):
        F.load_pieces(ckdir, {"w": ((64,), a.dtype, (0,), out)})
    F.load_pieces(ckdir, {"w": ((64,), a.dtype, (0,), out[:40])})  # only the intact piece: fine
    np.testing.assert_array_equal(out[:40], a[:40])
    assert main(["checkpoint", "verify", ckdir]) == 1
    with pytest.raises(ValueError, match="checksum mismatch"):
        F.verify_checkpoint(ckdir)


# ------------------------------------------------------------------------------------------ atomic commit


@pytest.mark.parametrize("stage", ["write", "metadata", "rename", "swap"])
def test_crash_at_any_stage_leaves_a_loadable_checkpoint(ckdir, monkeypatch, stage):
    old, new = reference(3), reference(4)
    F.save_pieces(ckdir, split_pieces(old, 2), comm=SELF, extras={"v": "old"})

    def crash(s):
        if s == stage:
            raise F._SimulatedCrash(s)

    monkeypatch.setattr(F, "_fault_hook", crash)
    with pytest.raises(F._SimulatedCrash):
        F.save_pieces(ckdir, split_pieces(new, 2), comm=SELF, extras={"v": "new"})
    monkeypatch.setattr(F, "_fault_hook", None)
    got, res = load_full(ckdir, old)
    want = new if stage == "swap" else old
    assert_same(got, want)
    assert res.metadata.extras == {"v": "new" if stage == "swap" else "old"}
    tmps = glob.glob(ckdir + ".tmp-*")
    assert len(tmps) == (1 if stage in ("write", "metadata") else 0)
    for t in tmps:
        with pytest.raises(F.IncompleteCheckpointError, match="incomplete checkpoint"):
            F.read_metadata(t)
        with pytest.raises(ValueError, match="incomplete checkpoint"):
            load_full(t, old)
    # the next save succeeds and removes the checkpoint it replaces and the copy the crash left behind
    F.save_pieces(ckdir, split_pieces(new, 2), comm=SELF)
    assert_same(load_full(ckdir, new)[0], new)
    assert glob.glob(ckdir + ".ckpt-*") == [os.path.realpath(ckdir)]


def test_rank_error_during_write_fails_cleanly(ckdir, monkeypatch):
    ref = reference(5)
    F.save_pieces(ckdir, split_pieces(ref, 2), comm=SELF)

    def fail(stage):
        if stage == "write":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(F, "_fault_hook", fail)
    with pytest.raises(RuntimeError, match="nothing was committed.*No space left"):
        F.save_pieces(ckdir, split_pieces(reference(6), 2), comm=SELF)
    assert glob.glob(ckdir + ".tmp-*") == []
    assert_same(load_full(ckdir, ref)[0], ref)


def test_directory_without_metadata_is_incomplete(tmp_path):
    d = tmp_path / "half"
    d.mkdir()
    (d / "rank_00000.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(F.IncompleteCheckpointError, match="incomplete checkpoint.*no metadata.json"):
        F.load_pieces(d, {})


def test_missing_shard_file_is_reported(ckdir):
    a = np.ones(4)
    F.save_pieces(ckdir, {"a": ((4,), a.dtype, (0,), a)}, comm=SELF)
    os.remove(os.path.join(ckdir, "rank_00000.safetensors"))
    with pytest.raises(ValueError, match="rank_00000.safetensors is missing"):
        F.load_pieces(ckdir, {"a": ((4,), a.dtype, (0,), np.zeros(4))})


def test_shard_file_replaced_by_a_directory_is_called_a_directory(ckdir):
    a = np.ones(4)
    F.save_pieces(ckdir, {"a": ((4,), a.dtype, (0,), a)}, comm=SELF)
    shard = os.path.join(ckdir, "rank_00000.safetensors")
    os.remove(shard)
    os.mkdir(shard)
    for fn in (lambda: F.load_pieces(ckdir, {"a": ((4,), a.dtype, (0,), np.zeros(4))}),
               lambda: F.verify_checkpoint(ckdir),
               lambda: F.consolidate(ckdir, os.path.join(os.path.dirname(ckdir), "out.safetensors"))):
        with pytest.raises(ValueError, match="rank_00000.safetensors is a directory, not a shard file") as info:
            fn()
        assert "truncated" not in str(info.value)


def test_copies_left_by_racing_saves_are_removed_at_the_next_commit(ckdir):
    """A racing save's committed copy that no link points to (and a link half made) are removed by the next
    successful commit; a temporary directory, possibly a save still writing, is left alone."""
    ref = reference(9)
    F.save_pieces(ckdir, split_pieces(ref, 2), comm=SELF)
    orphan = ckdir + ".ckpt-" + "ab" * 16
    shutil.copytree(os.path.realpath(ckdir), orphan)
    os.symlink(os.path.basename(orphan), ckdir + ".link-" + "cd" * 16)
    writing = ckdir + ".tmp-" + "ef" * 16
    os.mkdir(writing)
    other = ckdir + "2.ckpt-" + "01" * 16  # another checkpoint's name: not ours to remove
    os.mkdir(other)
    F.save_pieces(ckdir, split_pieces(ref, 3), comm=SELF)
    assert glob.glob(ckdir + ".ckpt-*") == [os.path.realpath(ckdir)]
    assert glob.glob(ckdir + ".link-*") == []
    assert os.path.isdir(writing) and os.path.isdir(other)
    assert_same(load_full(ckdir, ref)[0], ref)


RACER = """
import sys
import numpy as np
from mpi4py import MPI
from hpcfsdp.distributed.checkpoint import _format as F
path, seed = sys.argv[1], int(sys.argv[2])
for i in range(15):
    a = np.full(1000, seed * 100 + i, np.float64)
    F.save_pieces(path, {"a": ((1000,), a.dtype, (0,), a)}, comm=MPI.COMM_SELF, fsync=False)
"""


def test_two_jobs_racing_on_one_path_leave_one_loadable_copy(ckdir):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", RACER, ckdir, str(k)], env=env) for k in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert glob.glob(ckdir + ".ckpt-*") == [os.path.realpath(ckdir)]
    assert glob.glob(ckdir + ".tmp-*") == [] and glob.glob(ckdir + ".link-*") == []
    out = np.zeros(1000)
    F.load_pieces(ckdir, {"a": ((1000,), out.dtype, (0,), out)})
    assert out[0] in (114, 214) and (out == out[0]).all()


def test_plain_directory_checkpoint_is_replaced(tmp_path):
    ref = reference(7)
    F.save_pieces(str(tmp_path / "ck"), split_pieces(ref, 2), comm=SELF)
    shutil.copytree(os.path.realpath(tmp_path / "ck"), tmp_path / "copy")  # a real directory, not a link
    assert_same(load_full(str(tmp_path / "copy"), ref)[0], ref)
    new = reference(8)
    F.save_pieces(str(tmp_path / "copy"), split_pieces(new, 3), comm=SELF)
    assert os.path.islink(tmp_path / "copy")
    assert_same(load_full(str(tmp_path / "copy"), new)[0], new)


# --------------------------------------------------------------------------------------------------- fuzz


@pytest.fixture(scope="module")
def fuzz_source(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fuzz") / "ck")
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    F.save_pieces(d, {"w": [((6, 4), a.dtype, (0, 0), a[:4]), ((6, 4), a.dtype, (4, 0), a[4:])],
                      "s": ((), np.int64, (), np.array(9))}, comm=SELF, extras={"k": [1, 2]}, block_size=16)
    return os.path.realpath(d), {"w": a, "s": np.array(9)}


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(["metadata.json", "rank_00000.safetensors"]),
       op=st.sampled_from(["flip", "cut", "multi"]),
       pos=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255), seed=st.integers(0, 2**32 - 1))
def test_fuzzed_files_raise_value_error_or_load_exactly(fuzz_source, target, op, pos, mask, seed):
    src, ref = fuzz_source
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "ck")
        shutil.copytree(src, d)
        f = os.path.join(d, target)
        data = bytearray(open(f, "rb").read())
        i = int(pos * len(data))
        if op == "flip":
            data[i] ^= mask
        elif op == "cut":
            del data[i:]
        else:
            rng = np.random.default_rng(seed)
            for j in rng.integers(0, len(data), 4):
                data[j] = int(rng.integers(0, 256))
        open(f, "wb").write(bytes(data))
        try:
            F.read_metadata(d)
            got, _ = load_full(d, ref)
            F.verify_checkpoint(d)
        except ValueError:
            return
        assert_same(got, ref)


# ---------------------------------------------------------------------------------------------------- MPI


@pytest.fixture
def shared_dir():
    comm = MPI.COMM_WORLD
    d = tempfile.mkdtemp(prefix="hpcfsdp-ck-") if comm.rank == 0 else None
    d = comm.bcast(d)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def rank_pieces(ref, world, rank, dim=0):
    """What an FSDP2 rank holds: chunked entries (empty on the last ranks), 'bias' and 'step' replicated."""
    out = {}
    for name, a in ref.items():
        if a.ndim == 0 or name == "bias":
            out[name] = F.Piece(a.shape, a.dtype, (0,) * a.ndim, a)
            continue
        d = min(dim, a.ndim - 1)
        lo, hi = chunk(a.shape[d], world, rank)
        offs = tuple(lo if k == d else 0 for k in range(a.ndim))
        out[name] = F.Piece(a.shape, a.dtype, offs, np.take(a, np.arange(lo, hi), axis=d))
    return out


def load_rank(path, ref, world, rank, comm, dim=0):
    outs, reqs = {}, {}
    for name, p in rank_pieces(ref, world, rank, dim).items():
        outs[name] = np.zeros_like(p.array)
        reqs[name] = (p.global_shape, p.dtype, p.offsets, outs[name])
    F.load_pieces(path, reqs, comm=comm)
    return outs


@pytest.mark.mpi(min_size=2)
def test_mpi_save_then_load_at_other_world_sizes_and_dims(shared_dir):
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    ref = reference(11)
    ref["long"] = np.arange(4 * world + 3, dtype=np.float32)  # uneven: the last rank is short
    path = os.path.join(shared_dir, "ck")
    F.save_pieces(path, rank_pieces(ref, world, rank), comm=comm, extras={"step": 3}, mesh_info={"shape": [world]})
    md = F.read_metadata(path)
    assert md.world_size == world and md.extras == {"step": 3}
    assert [p.rank for p in md.entries["bias"].pieces] == [0]  # replicated: written once, by the lowest rank
    assert [p.rank for p in md.entries["step"].pieces] == [0]
    assert sorted(p.rank for p in md.entries["w"].pieces) == [r for r in range(world) if chunk(10, world, r)[1] >
                                                               chunk(10, world, r)[0]]
    # same world size, same split
    assert_same(load_rank(path, ref, world, rank, comm), rank_pieces_arrays(ref, world, rank))
    # half the world size, on a sub-communicator
    sub = comm.Split(rank % 2, rank)
    assert_same(load_rank(path, ref, sub.size, sub.rank, sub), rank_pieces_arrays(ref, sub.size, sub.rank))
    sub.Free()
    # a different split dim
    assert_same(load_rank(path, ref, world, rank, comm, dim=1), rank_pieces_arrays(ref, world, rank, dim=1))
    # one rank alone loads everything
    if rank == 0:
        got, _ = load_full(path, ref, comm=SELF)
        assert_same(got, ref)
    comm.Barrier()


def rank_pieces_arrays(ref, world, rank, dim=0):
    return {n: p.array for n, p in rank_pieces(ref, world, rank, dim).items()}


@pytest.mark.mpi(min_size=4)
def test_mpi_save_at_4_load_at_2_and_1(shared_dir):
    comm = MPI.COMM_WORLD
    rank = comm.rank
    ref = {"w": np.arange(30, dtype=np.float32).reshape(10, 3), "e": np.arange(5, dtype=np.int32),
           "bf": np.linspace(-1, 1, 14).astype(ml_dtypes.bfloat16).reshape(7, 2), "bias": np.ones(3)}
    sub4 = comm.Split(0 if rank < 4 else 1, rank)
    path = os.path.join(shared_dir, "ck4")
    if rank < 4:
        F.save_pieces(path, rank_pieces(ref, 4, rank), comm=sub4)  # 'e' (5 rows): rank 3 holds nothing
        md = F.read_metadata(path)
        assert [(p.rank, p.offsets, p.lengths) for p in md.entries["e"].pieces] == [
            (0, (0,), (2,)), (1, (2,), (2,)), (2, (4,), (1,))]
    comm.Barrier()
    sub2 = comm.Split(0 if rank < 2 else 1, rank)
    if rank < 2:
        assert_same(load_rank(path, ref, 2, rank, sub2), rank_pieces_arrays(ref, 2, rank))
    elif rank == 2:
        assert_same(load_full(path, ref, comm=SELF)[0], ref)
    sub2.Free()
    sub4.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_mpi_crash_and_rank_failure_keep_previous_checkpoint(shared_dir, monkeypatch):
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    old, new = reference(12), reference(13)
    path = os.path.join(shared_dir, "ck")
    F.save_pieces(path, rank_pieces(old, world, rank), comm=comm)

    def crash(stage):  # the whole job dies after the shard files are written, before the commit
        if stage == "write":
            raise F._SimulatedCrash(stage)

    monkeypatch.setattr(F, "_fault_hook", crash)
    with pytest.raises(F._SimulatedCrash):
        F.save_pieces(path, rank_pieces(new, world, rank), comm=comm)
    comm.Barrier()
    assert_same(load_rank(path, old, world, rank, comm), rank_pieces_arrays(old, world, rank))
    tmps = glob.glob(path + ".tmp-*")
    assert len(tmps) == 1
    with pytest.raises(ValueError, match="incomplete checkpoint"):
        load_rank(tmps[0], old, world, rank, comm)

    def fail_on_1(stage):  # rank 1 fails to write; nobody hangs, everybody raises
        if stage == "write" and comm.rank == 1:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(F, "_fault_hook", fail_on_1)
    with pytest.raises(RuntimeError, match="rank 1: OSError.*Input/output error"):
        F.save_pieces(path, rank_pieces(new, world, rank), comm=comm)
    monkeypatch.setattr(F, "_fault_hook", None)
    assert len(glob.glob(path + ".tmp-*")) == 1  # only the crashed one; the failed save cleaned up
    assert_same(load_rank(path, old, world, rank, comm), rank_pieces_arrays(old, world, rank))
    # a rank with a bad piece makes every rank raise before anything is written
    pieces = rank_pieces(new, world, rank)
    if rank == world - 1:
        pieces["w"] = F.Piece((10, 7), np.float32, (0, 0), np.zeros((10, 7), np.float32))
    with pytest.raises(ValueError, match="overlap|disagree"):
        F.save_pieces(path, pieces, comm=comm)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_mpi_flipped_byte_fails_on_every_rank(shared_dir):
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    ref = {"x": np.arange(8 * world, dtype=np.float64)}
    path = os.path.join(shared_dir, "ck")
    F.save_pieces(path, rank_pieces(ref, world, rank), comm=comm)
    if rank == 0:
        md = F.read_metadata(path)
        p = [p for p in md.entries["x"].pieces if p.rank == 1][0]
        with open(os.path.join(md.path, p.file), "r+b") as f:
            f.seek(p.byte_offset + 3)
            b = f.read(1)
            f.seek(p.byte_offset + 3)
            f.write(bytes([b[0] ^ 1]))
    comm.Barrier()
    with pytest.raises(ValueError) as info:
        load_rank(path, ref, world, rank, comm)
    if rank == 1:
        assert "checksum mismatch" in str(info.value) and "rank_00001.safetensors tensor 'x|8'" in str(info.value)
    else:
        assert "rank 1: checksum mismatch" in str(info.value)


@pytest.mark.mpi(min_size=2)
def test_mpi_benchmark_io(shared_dir):
    r = F.benchmark_io(os.path.join(shared_dir, "bench"), 1 << 18, MPI.COMM_WORLD, fsync=False)
    assert r["roundtrip_ok"] and r["world_size"] == MPI.COMM_WORLD.size and r["save_s"] > 0
