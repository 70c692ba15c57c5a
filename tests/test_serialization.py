"""hpcfsdp.save / hpcfsdp.load: state dicts round-trip through one safetensors file, types preserved, no pickle."""
import io
import json
import math
import struct
from collections import OrderedDict

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn


def _model():
    hp.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))


def test_model_state_dict_round_trip(tmp_path):
    m = _model()
    sd = m.state_dict()
    hp.save(sd, tmp_path / "m.pt")
    got = hp.load(tmp_path / "m.pt")
    assert type(got) is OrderedDict and list(got) == list(sd)
    for k, v in sd.items():
        assert isinstance(got[k], hp.Tensor) and got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k].numpy(), v.numpy())
    m2 = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    m2.load_state_dict(got)
    x = hp.randn(5, 4)
    np.testing.assert_array_equal(m2(x).detach().numpy(), m(x).detach().numpy())
    # the state dict's _metadata (module versions) survives as torch.save keeps it
    assert got._metadata == sd._metadata


def test_optimizer_state_dict_round_trip_keeps_int_keys_tuples_and_floats(tmp_path):
    m = _model()
    opt = hp.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    m(hp.randn(3, 4)).sum().backward()
    opt.step()
    osd = opt.state_dict()
    hp.save(osd, tmp_path / "o.pt")
    got = hp.load(tmp_path / "o.pt")
    assert set(got["state"]) == set(osd["state"]) and all(type(k) is int for k in got["state"])
    assert got["param_groups"] == osd["param_groups"]
    assert got["param_groups"][0]["betas"] == (0.9, 0.95) and type(got["param_groups"][0]["betas"]) is tuple
    for i, entry in osd["state"].items():
        for k, v in entry.items():
            g = got["state"][i][k]
            if isinstance(v, hp.Tensor):
                np.testing.assert_array_equal(g.numpy(), v.numpy())
            else:
                assert g == v and type(g) is type(v)
    opt2 = hp.optim.AdamW(m.parameters(), lr=5.0)
    opt2.load_state_dict(got)
    assert opt2.param_groups[0]["lr"] == 1e-3


def test_plain_values_survive_exactly():
    obj = {1: None, "a": (1, 2.5, "x", True), (1, "k"): [float("inf"), -float("inf"), 0.1, -0.0],
           None: {"nested": [[], {}, ()]}, "big": 2 ** 70, "f32": np.float32(0.1), "i64": np.int64(-3),
           "dt": hp.bfloat16, "arr": np.arange(6, dtype=np.int16).reshape(2, 3), False: "no"}
    buf = io.BytesIO()
    hp.save(obj, buf)
    buf.seek(0)
    got = hp.load(buf)
    assert list(got) == list(obj)
    for k in obj:
        if k == "arr":
            assert isinstance(got[k], np.ndarray) and got[k].dtype == np.int16
            np.testing.assert_array_equal(got[k], obj[k])
        else:
            assert got[k] == obj[k] and type(got[k]) is type(obj[k]), k
    assert math.copysign(1.0, got[(1, "k")][3]) == -1.0
    nan = io.BytesIO()
    hp.save({"n": float("nan")}, nan)
    nan.seek(0)
    assert math.isnan(hp.load(nan)["n"])


def test_dtypes_parameters_and_shared_storage(tmp_path):
    w = nn.Parameter(hp.randn(3, 2))
    frozen = nn.Parameter(hp.randn(2), requires_grad=False)
    bf = hp.tensor(np.arange(4, dtype=np.float32)).to(hp.bfloat16)
    t = hp.randn(4)
    obj = {"w": w, "frozen": frozen, "bf": bf, "t": t, "t_again": t, "b": hp.tensor(np.array([True, False])),
           "scalar": hp.tensor(np.float64(2.5))}
    hp.save(obj, tmp_path / "x.pt")
    got = hp.load(tmp_path / "x.pt")
    assert isinstance(got["w"], nn.Parameter) and got["w"].requires_grad
    assert isinstance(got["frozen"], nn.Parameter) and not got["frozen"].requires_grad
    assert not isinstance(got["t"], nn.Parameter) and not got["t"].requires_grad
    assert got["bf"].dtype == hp.bfloat16 and got["bf"]._data.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got["bf"].float().numpy(), [0, 1, 2, 3])
    assert got["scalar"].ndim == 0 and float(got["scalar"]) == 2.5
    assert got["t"]._data is got["t_again"]._data  # one array, as saved
    np.testing.assert_array_equal(got["b"].numpy(), [True, False])
    # every tensor is aligned to its element size, and the file is a standard safetensors file
    from safetensors.numpy import load_file
    hp.save({"a": hp.randn(3), "i": hp.tensor(np.arange(3))}, tmp_path / "y.pt")
    raw = load_file(str(tmp_path / "y.pt"))
    assert sorted(a.dtype.name for a in raw.values()) == ["float32", "int64"]


def test_mmap_and_map_location(tmp_path):
    sd = {"a": hp.randn(64, 3), "b": hp.tensor(np.arange(5))}
    hp.save(sd, tmp_path / "z.pt")
    got = hp.load(tmp_path / "z.pt", mmap=True, map_location="cpu", weights_only=True)
    assert isinstance(got["a"]._data.base, np.memmap) or isinstance(got["a"]._data.base.base, np.memmap)
    np.testing.assert_array_equal(got["a"].numpy(), sd["a"].numpy())
    got["a"]._data[0, 0] = 123.0  # copy-on-write: the file is unchanged
    np.testing.assert_array_equal(hp.load(tmp_path / "z.pt")["a"].numpy(), sd["a"].numpy())
    assert hp.load(tmp_path / "z.pt", map_location={"cuda:0": "cpu"})["b"].device == "cpu"
    hp.save({"flags": hp.tensor(np.array([True, False, True])), "x": hp.randn(3).double()}, tmp_path / "al.pt")
    got = hp.load(tmp_path / "al.pt", mmap=True)
    assert all(v._data.flags.aligned for v in got.values())
    with pytest.raises(TypeError, match="file path"):
        hp.load(io.BytesIO(b""), mmap=True)
    with pytest.raises(TypeError, match="weights_only"):
        hp.load(tmp_path / "z.pt", weights_only="yes")


def test_what_cannot_be_saved_is_refused(tmp_path):
    from hpcfsdp.distributed.tensor import DTensor

    class Thing:
        pass

    with pytest.raises(TypeError, match="Thing at <root>\\['x'\\]"):
        hp.save({"x": Thing()}, tmp_path / "bad.pt")
    with pytest.raises(TypeError, match="meta tensor"):
        hp.save({"m": hp.empty(3, device="meta")}, tmp_path / "bad.pt")
    fake = DTensor.__new__(DTensor)  # the check is by type, before any data is touched
    with pytest.raises(TypeError, match="DTensor.*full_tensor"):
        hp.save({"d": fake}, tmp_path / "bad.pt")


def test_bad_files_raise_clear_errors(tmp_path):
    p = tmp_path / "junk.pt"
    p.write_bytes(b"PK\x03\x04 this is a zip, not safetensors")
    with pytest.raises(ValueError, match="not a safetensors file"):
        hp.load(p)
    p.write_bytes(b"123")
    with pytest.raises(ValueError, match="not a safetensors file"):
        hp.load(p)
    hdr = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8)
    with pytest.raises(ValueError, match="without an hpcfsdp skeleton"):
        hp.load(p)
    hp.save({"a": hp.randn(100)}, p)
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        hp.load(p)
