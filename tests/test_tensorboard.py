"""hpcfsdp.utils.tensorboard.SummaryWriter: event files read back with tensorboard's own EventAccumulator."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.utils.tensorboard import SummaryWriter

pytestmark = pytest.mark.timeout(120)


def _accumulate(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_read_back_with_their_steps_and_values(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(7).astype(np.float32)
    with SummaryWriter(tmp_path) as w:
        for step, v in enumerate(values):
            w.add_scalar("train/loss", float(v), step)
        w.add_scalar("train/lr", hp.tensor(0.25), 3)  # a one-element Tensor, as in PyTorch
        w.add_scalar("x", np.float64(2.5), 0, new_style=True, double_precision=True)
    acc = _accumulate(tmp_path)
    got = acc.Scalars("train/loss")
    assert [e.step for e in got] == list(range(7))
    np.testing.assert_array_equal(np.array([e.value for e in got], np.float32), values)
    assert [(e.step, e.value) for e in acc.Scalars("train/lr")] == [(3, 0.25)]
    from tensorboard.util import tensor_util

    (ev,) = acc.Tensors("x")
    arr = tensor_util.make_ndarray(ev.tensor_proto)
    assert arr.dtype == np.float64 and float(arr) == 2.5
    assert acc.SummaryMetadata("x").plugin_data.plugin_name == "scalars"


def test_default_log_dir_is_runs_date_host(tmp_path, monkeypatch):
    import socket

    monkeypatch.chdir(tmp_path)
    w = SummaryWriter(comment="_lr0.1")
    w.close()
    parent, name = os.path.split(w.get_logdir())
    assert parent == "runs" and name.endswith(f"_{socket.gethostname()}_lr0.1")
    from datetime import datetime

    datetime.strptime(name[:14], "%b%d_%H-%M-%S")  # PyTorch's stamp: Mon DD_HH-MM-SS
    assert any(f.startswith("events.out.tfevents.") for f in os.listdir(w.get_logdir()))


def test_add_scalars_writes_one_run_per_key(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(3):
            w.add_scalars("loss", {"train": step * 1.0, "val": step * 2.0}, step)
    for key, scale in (("train", 1.0), ("val", 2.0)):
        acc = _accumulate(tmp_path / f"loss_{key}")
        assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s, s * scale) for s in range(3)]


def test_histogram_counts_and_moments(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000)
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("w", hp.tensor(x), 5)
        w.add_histogram("u", x, 6, bins=10)
    acc = _accumulate(tmp_path)
    (h,) = acc.Histograms("w")
    v = h.histogram_value
    assert h.step == 5 and v.num == 1000 and v.min == x.min() and v.max == x.max()
    assert v.sum == pytest.approx(x.sum()) and v.sum_squares == pytest.approx((x * x).sum())
    assert sum(v.bucket) == 1000
    (u,) = acc.Histograms("u")
    counts, edges = np.histogram(x, bins=10)
    assert list(u.histogram_value.bucket) == list(counts.astype(float))
    np.testing.assert_allclose(u.histogram_value.bucket_limit, edges[1:])


def test_text_and_hparams(tmp_path):
    from tensorboard.plugins.hparams import metadata as hp_metadata
    from tensorboard.util import tensor_util

    with SummaryWriter(tmp_path) as w:
        w.add_text("notes", "**lr** 3e-4", 2)
        w.add_hparams({"lr": 3e-4, "layers": 4, "opt": "adamw", "bf16": True}, {"hparam/loss": 1.5},
                      run_name="trial0")
    acc = _accumulate(tmp_path)
    (ev,) = acc.Tensors("notes/text_summary")
    assert ev.step == 2 and tensor_util.make_ndarray(ev.tensor_proto).tolist() == [b"**lr** 3e-4"]
    assert acc.SummaryMetadata("notes/text_summary").plugin_data.plugin_name == "text"
    run = _accumulate(tmp_path / "trial0")
    content = run.PluginTagToContent(hp_metadata.PLUGIN_NAME)
    start = hp_metadata.parse_session_start_info_plugin_data(content[hp_metadata.SESSION_START_INFO_TAG])
    assert start.hparams["lr"].number_value == 3e-4 and start.hparams["layers"].number_value == 4
    assert start.hparams["opt"].string_value == "adamw" and start.hparams["bf16"].bool_value is True
    exp = hp_metadata.parse_experiment_plugin_data(content[hp_metadata.EXPERIMENT_TAG])
    assert [m.name.tag for m in exp.metric_infos] == ["hparam/loss"]
    assert [e.value for e in run.Scalars("hparam/loss")] == [1.5]


def test_purge_step_drops_the_steps_a_resumed_run_rewrites(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for s in range(1, 9):
            w.add_scalar("loss", float(s), s)
    with SummaryWriter(tmp_path, purge_step=5) as w:  # resumed from a checkpoint at step 4
        for s in range(5, 9):
            w.add_scalar("loss", 10.0 * s, s)
    got = [(e.step, e.value) for e in _accumulate(tmp_path).Scalars("loss")]
    assert got == [(s, float(s)) for s in range(1, 5)] + [(s, 10.0 * s) for s in range(5, 9)]


def test_flush_makes_events_readable_before_close(tmp_path):
    w = SummaryWriter(tmp_path, flush_secs=3600)
    w.add_scalar("a", 1.0, 0)
    w.flush()
    assert [e.value for e in _accumulate(tmp_path).Scalars("a")] == [1.0]
    w.close()


def test_bad_input(tmp_path):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(TypeError, match="expected a real number"):
            w.add_scalar("a", "1.0", 0)
        with pytest.raises(TypeError, match="global_step=1.5"):
            w.add_scalar("a", 1.0, 1.5)
        with pytest.raises(TypeError, match="tag=3"):
            w.add_scalar(3, 1.0)
        with pytest.raises(ValueError, match="NaN"):
            w.add_histogram("h", [1.0, float("nan")])
        with pytest.raises(ValueError, match="hparam 'f'"):
            w.add_hparams({"f": [1, 2]}, {"m": 1.0})


def test_without_tensorboard_the_error_names_pip_install(tmp_path):
    code = ("import sys; sys.modules['tensorboard'] = None\n"
            "from hpcfsdp.utils.tensorboard import SummaryWriter\n"
            f"SummaryWriter({str(tmp_path)!r})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert r.returncode == 1
    assert "ImportError: hpcfsdp.utils.tensorboard.SummaryWriter needs the tensorboard package: pip install " \
           "tensorboard" in r.stderr
    assert not os.listdir(tmp_path)
