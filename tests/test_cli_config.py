"""Tests for hpcfsdp.cli.config: TrainConfig flags, files, precedence, validation and round trips."""

import argparse
import dataclasses
import json
import math
import os
import tomllib

import pytest

from hpcfsdp.cli.config import (
    ConfigError,
    TrainConfig,
    add_config_arguments,
    config_from_args,
    exit_with_config_error,
    load_config_file,
    node_local_rank,
    parse_mesh,
)


def _parser():
    p = argparse.ArgumentParser(prog="hpcfsdp train")
    add_config_arguments(p)
    return p


def _cfg(argv):
    return config_from_args(_parser().parse_args(argv))


def _bad(cfg, world_size, *fragments):
    with pytest.raises(ConfigError) as info:
        cfg.validate(world_size)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


# ------------------------------------------------------------------ defaults and flags


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 16])
def test_defaults_validate(world_size):
    cfg = TrainConfig()
    cfg.validate(world_size)  # raises ConfigError if the defaults are invalid at this world size
    assert cfg == TrainConfig()  # and validating changes nothing


def test_every_field_has_a_flag_with_help():
    p = _parser()
    help_text = p.format_help()
    flags = {opt for a in p._actions for opt in a.option_strings}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in flags, flag
        assert flag in help_text
    for a in p._actions:
        if a.option_strings and a.dest != "help":
            assert a.help and len(a.help) > 10, a.option_strings
    assert "--config" in flags


def test_flags_parse_into_config():
    cfg = _cfg(["--n-layer", "6", "--n-head", "2", "--n-embd", "64", "--lr", "3e-4", "--betas", "0.8", "0.99",
                "--strategy", "HYBRID_SHARD", "--mesh", "2x2", "--mixed-precision", "bf16", "--cpu-offload",
                "--no-bias", "--device", "cuda", "--checkpoint-dir", "ck", "--checkpoint-interval", "5",
                "--resume", "--data", "none", "--soak", "--no-reshard-after-forward"])
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (6, 2, 64)
    assert cfg.lr == 3e-4 and cfg.betas == (0.8, 0.99)
    assert cfg.strategy == "HYBRID_SHARD" and cfg.mesh == (2, 2)
    assert cfg.mixed_precision == "bf16" and cfg.cpu_offload is True and cfg.bias is False
    assert cfg.device == "cuda" and cfg.checkpoint_dir == "ck" and cfg.checkpoint_interval == 5
    assert cfg.resume is True and cfg.data is None and cfg.soak is True
    assert cfg.reshard_after_forward is False and cfg.effective_reshard_after_forward() is False
    cfg.validate(4)
    # untouched fields keep their defaults
    assert cfg.block_size == TrainConfig().block_size and cfg.seed == TrainConfig().seed


@pytest.mark.parametrize("argv,fragment", [
    (["--strategy", "ZERO3"], "argument --strategy: invalid choice: 'ZERO3'"),
    (["--mixed-precision", "fp8"], "argument --mixed-precision: invalid choice"),
    (["--device", "tpu"], "argument --device: invalid choice"),
    (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    (["--lr", "fast"], "argument --lr: invalid float value"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_flag_exits_2_with_message(argv, fragment, capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "hpcfsdp train: error:" in err and fragment in err


def test_exit_with_config_error(capsys):
    rc = exit_with_config_error(ConfigError("steps=0: expected a positive integer"))
    assert rc == 2
    assert capsys.readouterr().err == "hpcfsdp train: error: steps=0: expected a positive integer\n"


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("name", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd", "batch_size",
                                  "grad_accum", "steps", "log_interval", "eval_iters"])
@pytest.mark.parametrize("value", [0, -3])
def test_positive_ints(name, value):
    cfg = dataclasses.replace(TrainConfig(), **{name: value})
    assert _bad(cfg, 1, f"{name}={value}", "positive integer")


@pytest.mark.parametrize("name", ["warmup_steps", "checkpoint_interval", "eval_interval", "seed"])
def test_nonnegative_ints(name):
    assert _bad(dataclasses.replace(TrainConfig(), **{name: -1}), 1, f"{name}=-1", ">= 0")


def test_head_divides_embedding():
    assert _bad(TrainConfig(n_embd=100, n_head=3), 1, "n_embd=100", "n_head=3")
    TrainConfig(n_embd=96, n_head=3).validate(1)


@pytest.mark.parametrize("lr", [-1e-3, math.nan, math.inf])
def test_lr(lr):
    assert _bad(TrainConfig(lr=lr, min_lr=0.0), 1, "lr=", "expected a finite number >= 0")


def test_lr_zero_ok_and_min_lr_bound():
    TrainConfig(lr=0.0, min_lr=0.0).validate(1)
    assert _bad(TrainConfig(lr=1e-3, min_lr=1e-2), 1, "min_lr=0.01", "lr=0.001")


@pytest.mark.parametrize("field,value,fragment", [
    ("strategy", "full_shard", "strategy='full_shard': expected one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"),
    ("mixed_precision", "bfloat16", "mixed_precision='bfloat16': expected one of bf16, fp16, none"),
    ("device", "cuda:1", "device='cuda:1': expected one of cpu, cuda"),
    ("schedule", "cosin", "did you mean 'cosine'?"),
    ("optimizer", "lion", "optimizer='lion'"),
    ("data_dtype", "int8", "data_dtype='int8'"),
    ("dropout", 1.0, "dropout=1.0"),
    ("betas", (0.9, 1.5), "betas=[0.9, 1.5]"),
    ("eps", 0.0, "eps=0.0"),
    ("vocab_size", 100, "vocab_size=100: the shipped byte-level corpus needs vocab_size >= 256"),
])
def test_enumerations_and_ranges(field, value, fragment):
    assert _bad(dataclasses.replace(TrainConfig(), **{field: value}), 1, fragment)


def test_small_vocab_ok_with_own_data():
    TrainConfig(vocab_size=100, data="tokens.bin", data_dtype="uint16").validate(1)  # no error: the ids are its own
    with pytest.raises(ConfigError, match="vocab_size=100: the shipped byte-level corpus needs vocab_size >= 256"):
        TrainConfig(vocab_size=100).validate(1)  # the bundled bytes would not fit


def test_mesh_rules():
    assert _bad(TrainConfig(mesh=(2, 2)), 8, "mesh='2x2'", "size 4", "world size 8")
    assert _bad(TrainConfig(mesh=(3,)), 4, "mesh='3'", "world size 4")
    assert _bad(TrainConfig(strategy="HYBRID_SHARD"), 4, "mesh=None", "HYBRID_SHARD needs a 2-D mesh")
    assert _bad(TrainConfig(strategy="HYBRID_SHARD", mesh=(4,)), 4, "mesh='4'", "HYBRID_SHARD needs a 2-D mesh")
    assert _bad(TrainConfig(strategy="FULL_SHARD", mesh=(2, 2)), 4, "mesh='2x2'", "FULL_SHARD takes a 1-D mesh")
    TrainConfig(strategy="HYBRID_SHARD", mesh=(2, 2)).validate(4)
    TrainConfig(strategy="HYBRID_SHARD", mesh=(16, 4)).validate(64)
    TrainConfig(strategy="SHARD_GRAD_OP", mesh=(4,)).validate(4)
    TrainConfig(strategy="NO_SHARD").validate(3)


@pytest.mark.parametrize("text,expected", [("2x4", (2, 4)), ("4", (4,)), ("2X2", (2, 2)), ("none", None),
                                           ("", None), (None, None), ([1, 8], (1, 8))])
def test_parse_mesh(text, expected):
    assert parse_mesh(text) == expected


@pytest.mark.parametrize("text", ["2y2", "0x4", "2x2x2", "x", "-1"])
def test_parse_mesh_bad(text):
    with pytest.raises(ConfigError, match="mesh="):
        parse_mesh(text)


def test_bad_mesh_flag_is_config_error():
    with pytest.raises(ConfigError, match=r"mesh='2by2'"):
        _cfg(["--mesh", "2by2"])


def test_checkpoint_and_resume_need_dir():
    assert _bad(TrainConfig(checkpoint_interval=10), 1, "checkpoint_interval=10", "checkpoint_dir")
    assert _bad(TrainConfig(resume=True), 1, "resume=True", "checkpoint_dir")
    TrainConfig(checkpoint_interval=10, resume=True, checkpoint_dir="ck").validate(1)


def test_world_size_checked():
    assert _bad(TrainConfig(), 0, "world_size=0")


def test_hand_built_wrong_type():
    assert _bad(TrainConfig(steps="100"), 1, "steps='100'", "expected an integer")
    assert _bad(TrainConfig(cpu_offload=1), 1, "cpu_offload=1", "expected true or false")


# ------------------------------------------------------------------ files and precedence


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_toml_then_flags(tmp_path):
    path = _write(tmp_path, "run.toml", 'n_layer = 6\nlr = 0.002\nstrategy = "HYBRID_SHARD"\nmesh = "2x2"\n'
                                        'betas = [0.9, 0.99]\nbias = false\nwarmup_steps = 3\n')
    cfg = _cfg(["--config", path, "--lr", "0.005"])
    assert cfg.n_layer == 6 and cfg.lr == 0.005 and cfg.strategy == "HYBRID_SHARD"
    assert cfg.mesh == (2, 2) and cfg.betas == (0.9, 0.99) and cfg.bias is False and cfg.warmup_steps == 3
    assert cfg.n_head == TrainConfig().n_head
    cfg.validate(4)


def test_json_file_with_null_and_int_for_float(tmp_path):
    path = _write(tmp_path, "run.json", json.dumps({"lr": 1, "checkpoint_dir": None, "mesh": [4], "steps": 7}))
    cfg = _cfg(["--config", path])
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.mesh == (4,) and cfg.steps == 7
    cfg.validate(4)


def test_unknown_keys_named(tmp_path):
    path = _write(tmp_path, "run.toml", "n_layers = 3\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError) as info:
        _cfg(["--config", path])
    msg = str(info.value)
    assert "unknown keys" in msg and "'n_layers'" in msg and "did you mean 'n_layer'" in msg
    assert "'learning_rate'" in msg and "run.toml" in msg


@pytest.mark.parametrize("text,fragment", [
    ('steps = "100"', "steps='100': expected an integer"),
    ("steps = 1.5", "steps=1.5: expected an integer"),
    ("steps = true", "steps=True: expected an integer"),
    ('lr = "fast"', "lr='fast': expected a number"),
    ("cpu_offload = 1", "cpu_offload=1: expected true or false"),
    ("strategy = 3", "strategy=3: expected a string"),
    ("betas = [0.9]", "expected a list of two numbers"),
    ("mesh = 4", "mesh=4: expected a string like '2x4'"),
    ("[model]\nn_layer = 2", "nested tables are not supported"),
])
def test_file_type_errors(tmp_path, text, fragment):
    path = _write(tmp_path, "run.toml", text + "\n")
    with pytest.raises(ConfigError, match=None) as info:
        _cfg(["--config", path])
    assert fragment in str(info.value), str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"expected a \.toml or \.json file"):
        load_config_file(_write(tmp_path, "run.yaml", "a: 1"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_file(_write(tmp_path, "bad.toml", "steps = = 3"))
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config_file(_write(tmp_path, "bad.json", "{steps: 3}"))
    with pytest.raises(ConfigError, match="table of settings"):
        load_config_file(_write(tmp_path, "list.json", "[1, 2]"))


def test_file_values_are_validated(tmp_path):
    path = _write(tmp_path, "run.toml", "n_embd = 100\nn_head = 3\n")
    with pytest.raises(ConfigError, match="n_embd=100"):
        _cfg(["--config", path]).validate(1)


# ------------------------------------------------------------------ round trips


def _sample():
    return TrainConfig(n_layer=3, lr=2.5e-4, min_lr=1e-5, betas=(0.85, 0.97), strategy="HYBRID_SHARD", mesh=(2, 4),
                       mixed_precision="fp16", cpu_offload=True, checkpoint_dir="ck/run 1", checkpoint_interval=20,
                       resume=True, out_dir='o"d', data="x.bin", data_dtype="uint16", reshard_after_forward=True)


def test_dict_json_round_trip():
    cfg = _sample()
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["mesh"] == "2x4" and d["betas"] == [0.85, 0.97]
    assert TrainConfig.from_dict(d) == cfg
    assert TrainConfig.from_dict(TrainConfig().to_dict()) == TrainConfig()


def test_toml_round_trip(tmp_path):
    for cfg in (_sample(), TrainConfig()):
        text = cfg.to_toml()
        assert TrainConfig.from_dict(tomllib.loads(text)) == cfg
        path = _write(tmp_path, "out.toml", text)
        assert _cfg(["--config", path]) == cfg


def test_args_round_trip():
    for cfg in (_sample(), TrainConfig(), TrainConfig(bias=False, tie_weights=False, metrics_path="m.jsonl")):
        assert _cfg(cfg.to_args()) == cfg


# ------------------------------------------------------------------ derived values


def test_lr_schedule_matches_closed_forms():
    base = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, steps=110)
    cos = TrainConfig(schedule="cosine", **base)
    lin = TrainConfig(schedule="linear", **base)
    const = TrainConfig(schedule="constant", **base)
    for c in (cos, lin, const):  # nanoGPT warmup: lr * (it + 1) / (warmup + 1)
        assert c.lr_at(0) == pytest.approx(1e-3 / 11)
        assert c.lr_at(9) == pytest.approx(1e-3 * 10 / 11)
    assert cos.lr_at(10) == pytest.approx(1e-3) and lin.lr_at(10) == pytest.approx(1e-3)
    assert cos.lr_at(60) == pytest.approx(5.5e-4) and lin.lr_at(60) == pytest.approx(5.5e-4)  # halfway
    assert cos.lr_at(35) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi / 4)) * 9e-4)
    assert lin.lr_at(35) == pytest.approx(1e-4 + 0.75 * 9e-4)
    assert cos.lr_at(110) == pytest.approx(1e-4) and lin.lr_at(500) == pytest.approx(1e-4)
    assert const.lr_at(60) == 1e-3 and const.lr_at(500) == 1e-3


def test_derived_values():
    cfg = TrainConfig(batch_size=4, grad_accum=3, block_size=32, out_dir="r")
    assert cfg.tokens_per_step(8) == 4 * 3 * 32 * 8
    assert cfg.metrics_file().replace("\\", "/") == "r/metrics.jsonl"
    assert TrainConfig(metrics_path="m.jsonl").metrics_file() == "m.jsonl"
    assert TrainConfig(strategy="FULL_SHARD").effective_reshard_after_forward() is True
    assert TrainConfig(strategy="SHARD_GRAD_OP").effective_reshard_after_forward() is False


def test_node_local_rank():
    assert node_local_rank({"SLURM_LOCALID": "3", "MPI_LOCALRANKID": "1"}) == 3
    assert node_local_rank({"MPI_LOCALRANKID": "1"}) == 1
    assert node_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    assert node_local_rank({}) is None


def test_keep_last_and_async_checkpoint_are_accepted_together():
    cfg = _cfg(["--checkpoint-dir", "ck", "--keep-last", "2", "--async-checkpoint"])
    cfg.validate(2)  # see tests/test_cli_keep_async.py for what they do together
    assert cfg.keep_last == 2 and cfg.async_checkpoint
    assert _bad(_cfg(["--keep-last", "2", "--async-checkpoint"]), 2, "keep_last=2: needs checkpoint_dir")
    _cfg(["--checkpoint-dir", "ck", "--async-checkpoint"]).validate(2)


@pytest.mark.parametrize("argv,usage,hint", [
    (["train", "--learning_rate", "0.1"], "usage: hpcfsdp train", "--learning_rate (did you mean --lr?)"),
    (["train", "--stepz", "3"], "usage: hpcfsdp train", "--stepz (did you mean --steps?)"),
    (["train", "--max-steps=5"], "usage: hpcfsdp train", "--max-steps (did you mean --steps?)"),
    (["info", "--bogus"], "usage: hpcfsdp info", None),
])
def test_unknown_flags_get_the_commands_usage_and_a_hint(argv, usage, hint, capsys):
    from hpcfsdp.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage), err[:200]
    assert "unrecognized arguments" in err
    assert (hint in err) if hint else "did you mean" not in err


def test_config_keys_from_other_trainers_get_a_hint():
    from hpcfsdp.cli.config import closest_field

    assert closest_field("learning_rate") == "lr" and closest_field("gradient_accumulation_steps") == "grad_accum"
    assert closest_field("n_layers") == "n_layer" and closest_field("warmup-steps") == "warmup_steps"
    assert closest_field("zzz_unrelated") is None


def test_resume_options_are_exclusive_and_need_a_directory():
    from hpcfsdp.cli.config import resume_target

    assert _bad(TrainConfig(resume_if_exists=True), 1, "resume_if_exists=True", "checkpoint_dir")
    assert _bad(TrainConfig(resume=True, resume_if_exists=True, checkpoint_dir="ck"), 1, "give one of them")
    assert _bad(TrainConfig(resume_from="step-4"), 1, "a step needs checkpoint_dir")
    assert resume_target(TrainConfig(resume_from="step-4", checkpoint_dir="ck")) == os.path.join("ck", "step-00000004")
    assert resume_target(TrainConfig(resume_from="12", checkpoint_dir="ck")) == os.path.join("ck", "step-00000012")
    assert resume_target(TrainConfig(resume_from="/runs/a/latest")) == "/runs/a/latest"
    assert resume_target(TrainConfig(resume=True, checkpoint_dir="ck")) == os.path.join("ck", "latest")
    assert resume_target(TrainConfig(checkpoint_dir="ck")) is None
