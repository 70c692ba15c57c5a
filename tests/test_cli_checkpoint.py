"""`hpcfsdp checkpoint inspect | verify | consolidate` on sharded checkpoint directories."""
import argparse
import json
import os
import stat
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from hpcfsdp.cli import checkpoint as cli
from hpcfsdp.distributed.checkpoint import _format as F


def run(argv):
    parser = argparse.ArgumentParser(prog="hpcfsdp")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint as 3 ranks would write it (pieces of rows), saved from one process."""
    rng = np.random.default_rng(0)
    ref = {"layer.weight": rng.standard_normal((7, 5)).astype(np.float32),
           "layer.bias": rng.standard_normal(5).astype(ml_dtypes.bfloat16),
           "step": np.array(42, np.int64)}
    w = ref["layer.weight"]
    pieces = {"layer.weight": [F.Piece(w.shape, w.dtype, (lo, 0), w[lo:lo + 3]) for lo in (0, 3, 6)],
              "layer.bias": F.Piece((5,), ref["layer.bias"].dtype, (0,), ref["layer.bias"]),
              "step": F.Piece((), np.int64, (), ref["step"])}
    path = str(tmp_path / "ck")
    F.save_pieces(path, pieces, comm=MPI.COMM_SELF, extras={"step": 42, "sampler": {"epoch": 1}},
                  mesh_info={"shape": [3], "dims": ["dp"]})
    return path, ref


def test_inspect_lists_entries_shapes_dtypes_bytes_and_extras(ckpt, capsys):
    path, ref = ckpt
    assert run(["checkpoint", "inspect", "--entries", path]) == 0
    out = capsys.readouterr().out
    total = sum(a.nbytes for a in ref.values())
    assert f", {total} bytes (" in out and "world size: 1 rank(s)" in out and "step: 42" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ")}
    assert "float32" in lines["layer.weight"] and "[7, 5]" in lines["layer.weight"]
    assert "3 piece(s)" in lines["layer.weight"] and "ranks [0]" in lines["layer.weight"]
    assert "bfloat16" in lines["layer.bias"] and "int64" in lines["step"] and "[]" in lines["step"]
    assert 'extras: {"sampler": {"epoch": 1}, "step": 42}' in out and '"dims": ["dp"]' in out
    assert run(["checkpoint", "inspect", "--json", path]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["entries"]["layer.weight"]["shape"] == [7, 5] and meta["extras"]["step"] == 42


def test_consolidate_writes_full_entries(ckpt, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path, ref = ckpt
    out = str(tmp_path / "full.safetensors")
    assert run(["checkpoint", "consolidate", path, out]) == 0
    got = load_file(out)
    assert set(got) == set(ref)
    for name, a in ref.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        np.testing.assert_array_equal(got[name].astype(np.float64), a.astype(np.float64))
    with safe_open(out, framework="np") as f:
        assert json.loads(f.metadata()["hpcfsdp.extras"]) == {"step": 42, "sampler": {"epoch": 1}}


def test_verify_ok_then_corrupted(ckpt, capsys):
    path, _ = ckpt
    assert run(["checkpoint", "verify", path]) == 0
    assert "OK: 3 entries, 5 pieces in 1 file(s)" in capsys.readouterr().out
    md = F.read_metadata(path)
    p = md.entries["layer.bias"].pieces[0]
    with open(os.path.join(md.path, p.file), "r+b") as f:
        f.seek(p.byte_offset + p.byte_length - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x80]))
    assert run(["checkpoint", "verify", path]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "rank_00000.safetensors tensor 'layer.bias|0'" in err


def test_errors_exit_1_with_reason(tmp_path, capsys):
    assert run(["checkpoint", "inspect", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err
    half = tmp_path / "half"
    half.mkdir()
    (half / "rank_00000.safetensors").write_bytes(b"x" * 8)
    assert run(["checkpoint", "verify", str(half)]) == 1
    assert "incomplete checkpoint" in capsys.readouterr().err
    assert run(["checkpoint", "consolidate", str(half), str(tmp_path / "o.safetensors")]) == 1
    assert not (tmp_path / "o.safetensors").exists()


def test_command_line_entry_point(ckpt):
    path, _ = ckpt
    r = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.checkpoint", "checkpoint", "verify", path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("OK:"), r.stderr

def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        run(["checkpoint", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(c in out for c in ("inspect", "verify", "consolidate"))


def test_consolidate_splits_a_training_checkpoint_into_model_and_optimizer_files(tmp_path, capsys):
    from safetensors.numpy import load_file

    rng = np.random.default_rng(1)
    ref = {"model.w": rng.standard_normal((4, 3)).astype(np.float32),
           "optim.state.w.exp_avg": rng.standard_normal((4, 3)).astype(np.float32),
           "optim.state.w.step": np.array(7.0, np.float32)}
    pieces = {k: F.Piece(a.shape, a.dtype, (0,) * a.ndim, a) for k, a in ref.items()}
    path = str(tmp_path / "ck")
    F.save_pieces(path, pieces, comm=MPI.COMM_SELF)
    out, opt = str(tmp_path / "model.safetensors"), str(tmp_path / "opt.safetensors")
    assert run(["checkpoint", "consolidate", path, out]) == 0
    assert load_file(out).keys() == {"w"}
    np.testing.assert_array_equal(load_file(out)["w"], ref["model.w"])
    default_optim = load_file(str(tmp_path / "model.optim.safetensors"))
    assert default_optim.keys() == {"optim.state.w.exp_avg", "optim.state.w.step"}
    np.testing.assert_array_equal(default_optim["optim.state.w.exp_avg"], ref["optim.state.w.exp_avg"])
    assert run(["checkpoint", "consolidate", path, out, "--optim-out", opt]) == 0
    assert f"wrote {out}, {opt}" in capsys.readouterr().out and load_file(opt).keys() == default_optim.keys()


def test_consolidated_files_follow_the_umask(ckpt, tmp_path):
    """safetensors writes 0o600 whatever the umask; a consolidated model is a file the user's group may read."""
    path, _ = ckpt
    old = os.umask(0o022)
    try:
        out = str(tmp_path / "full.safetensors")
        assert run(["checkpoint", "consolidate", path, out]) == 0
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
        os.umask(0o077)
        out2 = str(tmp_path / "private.safetensors")
        assert run(["checkpoint", "consolidate", path, out2]) == 0
        assert stat.S_IMODE(os.stat(out2).st_mode) == 0o600
    finally:
        os.umask(old)
