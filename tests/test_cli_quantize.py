"""`hpcfsdp train --quantize-weights/--quantize-grads` on two simulated hosts: the losses follow the unquantized
run's closely (they are not equal: the collectives really round), and bad settings are named."""
import pytest

from test_cli_train import TINY, job, losses, ok


@pytest.mark.timeout(300)
def test_quantized_training_follows_the_unquantized_run(tmp_path):
    curves = {}
    for name, extra in (("plain", []), ("int8", ["--quantize-weights", "int8", "--quantize-grads", "int8"]),
                        ("int4", ["--quantize-weights", "fp8", "--quantize-grads", "int4", "--quantize-block", "64"])):
        d = tmp_path / name
        ok(job(tmp_path, 2, TINY + ["--out-dir", str(d), *extra], rpn=1))  # one rank per host: every hop crosses
        curves[name] = [loss for _, loss, _ in losses(d / "metrics.jsonl")]
    plain = curves["plain"]
    assert len(plain) == 12 and plain[-1] < plain[0]
    for name in ("int8", "int4"):
        got = curves[name]
        assert got != plain, name
        assert all(abs(a - b) <= 0.02 * b for a, b in zip(got, plain)), (name, got, plain)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra,words", [
    (["--quantize-grads", "int2"], "invalid choice: 'int2'"),
    (["--quantize-block", "3"], "quantize_block=3: expected an even integer >= 2"),
    (["--quantize-weights", "int8", "--tp", "2"], "quantized collectives are for data parallelism"),
])
def test_bad_quantization_settings_are_named(tmp_path, extra, words):
    res = job(tmp_path, 2, TINY + ["--out-dir", str(tmp_path / "o"), *extra])
    assert res.returncode == 2 and words in res.stderr + res.stdout, res.stderr[-2000:]


@pytest.mark.timeout(400)
def test_quantized_run_resumes_bit_for_bit_and_at_another_world_size(tmp_path):
    """The error-feedback residual travels in the checkpoint: a killed int4 run resumed at the same size repeats
    the uninterrupted run's losses exactly; the checkpoint's residual entries have the parameters' shapes; and
    4 ranks on 2 hosts resume it (the residual resharded)."""
    import os
    import shutil

    from hpcfsdp.cli import train as train_cli
    from hpcfsdp.distributed.checkpoint import read_metadata
    from test_cli_train import records

    quant = ["--quantize-grads", "int4", "--quantize-block", "64", "--checkpoint-interval", "4"]
    ref = tmp_path / "ref"
    ok(job(tmp_path, 2, TINY + ["--out-dir", str(ref), "--checkpoint-dir", str(ref / "ckpt"), *quant], rpn=1))
    d = tmp_path / "run"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), *quant]
    crashed = job(tmp_path, 2, args, rpn=1, env={train_cli.CRASH_ENV: "6"})
    assert crashed.returncode != 0 and "exiting hard after step 6" in crashed.stdout
    md = read_metadata(str(d / "ckpt" / "latest"))
    res = {name: e for name, e in md.entries.items() if name.startswith("residual.")}
    model = {name[len("model."):]: e for name, e in md.entries.items() if name.startswith("model.")}
    assert res and {name[len("residual."):] for name in res} <= set(model)
    assert all(tuple(e.shape) == tuple(model[name[len("residual."):]].shape) for name, e in res.items())
    ok(job(tmp_path, 2, args + ["--resume"], rpn=1))
    assert losses(d / "metrics.jsonl") == losses(ref / "metrics.jsonl")

    wide = tmp_path / "wide"
    shutil.copytree(os.path.realpath(ref / "ckpt" / "latest"), wide / "ckpt" / "latest")
    out = ok(job(tmp_path, 4, TINY + ["--out-dir", str(wide), "--checkpoint-dir", str(wide / "ckpt"), "--steps",
                                      "14", "--resume", *quant], rpn=2))
    assert "at step 12" in out.stdout
    recs = [r for r in records(wide / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == [13, 14] and recs[0]["loss"] < losses(ref / "metrics.jsonl")[0][1] - 0.3
