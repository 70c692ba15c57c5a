"""Tests for hpcfsdp.cli.plot: metrics-log validation, the two-panel plot, and the missing-matplotlib error."""

import argparse
import importlib.util
import json
import math
import sys

import pytest

from hpcfsdp.cli import plot
from hpcfsdp.cli.plot import MetricsError, PlotDependencyError, load_metrics, plot_metrics

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records():
    recs = [{"config": {"n_layer": 2}}]  # a header record, skipped
    for step in range(0, 50, 10):
        recs.append({"step": step, "loss": 5.0 / (1 + step), "lr": 1e-3, "grad_norm": 1.5,
                     "tokens_per_s": 1000.0 + step, "step_time_s": 0.1, "comm_time_s": 0.02,
                     "peak_mem_bytes": [1 << 20, 1 << 20]})
    recs.append({"step": 40, "val_loss": 0.2})
    return recs


def _write(tmp_path, recs_or_text, name="metrics.jsonl"):
    p = tmp_path / name
    if isinstance(recs_or_text, str):
        p.write_text(recs_or_text)
    else:
        p.write_text("\n".join(json.dumps(r) for r in recs_or_text) + "\n\n")
    return str(p)


def _cli(argv):
    p = argparse.ArgumentParser(prog="hpcfsdp")
    plot.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(argv)
    return args.func(args)


def test_load_metrics_columns(tmp_path):
    cols = load_metrics(_write(tmp_path, _records()))
    assert cols["step"] == [0, 10, 20, 30, 40]
    assert cols["loss"] == [5.0 / (1 + s) for s in (0, 10, 20, 30, 40)]
    assert cols["tokens_per_s"] == [1000.0 + s for s in (0, 10, 20, 30, 40)]
    assert cols["val_step"] == [40] and cols["val_loss"] == [0.2]


def test_missing_throughput_is_nan(tmp_path):
    cols = load_metrics(_write(tmp_path, [{"step": 1, "loss": 2.0}]))
    assert cols["loss"] == [2.0] and math.isnan(cols["tokens_per_s"][0])


@pytest.mark.parametrize("text,fragment", [
    ('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n', ":2: not valid JSON"),
    ('[1, 2]\n', ":1: expected a JSON object, got list"),
    ('{"loss": 2.0}\n', ":1: step=None: expected an integer >= 0"),
    ('{"step": 1.5, "loss": 2.0}\n', ":1: step=1.5"),
    ('{"step": 1, "loss": "low"}\n', ":1: loss='low': expected a number"),
    ('{"step": 1, "loss": 1.0, "tokens_per_s": null}\n', ":1: tokens_per_s=None"),
    ('{"step": 1, "val_loss": true}\n', ":1: val_loss=True"),
    ('{"config": {}}\n\n', "no training records"),
    ('', "no training records"),
])
def test_bad_logs(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(MetricsError) as info:
        load_metrics(path)
    assert path in str(info.value) and fragment in str(info.value), str(info.value)


def test_missing_log(tmp_path, capsys):
    assert _cli(["plot", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hpcfsdp plot: error: ") and "nope.jsonl: cannot read" in err


def test_without_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    # A None entry in sys.modules makes `import` raise ImportError, as if matplotlib were absent.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    path = _write(tmp_path, _records())
    with pytest.raises(PlotDependencyError, match=r"pip install 'hpcfsdp\[plot\]'"):
        plot_metrics(load_metrics(path), str(tmp_path / "loss.png"))
    out = tmp_path / "loss.png"
    assert _cli(["plot", path, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "hpcfsdp plot: error: matplotlib is not installed" in err and "hpcfsdp[plot]" in err
    assert not out.exists()


def test_plot_or_clear_error(tmp_path, capsys):
    """With matplotlib: a real two-panel PNG holding the logged data. Without: the clear error."""
    path = _write(tmp_path, _records())
    out = tmp_path / "loss.png"
    if not HAVE_MPL:
        with pytest.raises(PlotDependencyError, match="hpcfsdp\\[plot\\]"):
            plot_metrics(load_metrics(path), str(out))
        assert _cli(["plot", path, "-o", str(out)]) == 1
        assert "matplotlib is not installed" in capsys.readouterr().err
        return
    fig = plot_metrics(load_metrics(path), str(out), title="run")
    assert out.read_bytes()[:8] == PNG_MAGIC
    ax_loss, ax_tps = fig.axes
    train_line, val_line = ax_loss.get_lines()
    assert list(train_line.get_xdata()) == [0, 10, 20, 30, 40]
    assert list(train_line.get_ydata()) == pytest.approx([5.0 / (1 + s) for s in (0, 10, 20, 30, 40)])
    assert list(val_line.get_xdata()) == [40] and list(val_line.get_ydata()) == [0.2]
    (tps_line,) = ax_tps.get_lines()
    assert list(tps_line.get_ydata()) == pytest.approx([1000.0 + s for s in (0, 10, 20, 30, 40)])
    assert ax_loss.get_xlabel() == "step" and ax_tps.get_xlabel() == "step"
    out2 = tmp_path / "curves.png"
    assert _cli(["plot", path, "-o", str(out2)]) == 0
    assert "wrote" in capsys.readouterr().out and out2.read_bytes()[:8] == PNG_MAGIC
    # unknown image suffix: a clear error, not a traceback
    assert _cli(["plot", path, "-o", str(tmp_path / "x.notaformat")]) == 1
    assert "hpcfsdp plot: error: cannot write" in capsys.readouterr().err
