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
