"""`hpcfsdp train` configuration: the TrainConfig dataclass, its flags, file loading and validation.

[Note: Config precedence]
A run's configuration is built in three layers: the dataclass defaults below, then the keys of the
`--config FILE` (TOML or JSON, one flat table whose keys are the field names), then the flags given
explicitly on the command line. Every flag is registered with `default=argparse.SUPPRESS`, so the
parsed namespace holds only what the user typed and a flag never overwrites a file value with its
default. With `init_from`, the model keys set by neither come from that directory's config.json,
and those set must agree with it (See [Note: Model keys] in hpcfsdp/cli/_model.py). `hpcfsdp slurm
render` reads the same flags and writes the resolved configuration back as flags
(`TrainConfig.to_args`) so that a job script is self-contained.

[Note: Config validation is rank-local and deterministic]
`TrainConfig.validate(world_size)` looks only at the configuration and the world size, never at
the file system or the devices, so every rank reaches the same verdict from the same input and a
bad configuration fails on all ranks before any collective (exit code 2, argparse style, through
`exit_with_config_error`). Checks that depend on the machine (a data file that exists, a GPU per
rank) belong to the trainer, which must agree on their outcome across ranks before acting on it.
"""

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys
import tomllib
import typing
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "TrainConfig",
    "ConfigError",
    "add_config_arguments",
    "config_from_args",
    "load_config_file",
    "parse_mesh",
    "format_mesh",
    "exit_with_config_error",
    "check_quantize",
    "node_local_rank",
    "STRATEGIES",
    "MIXED_PRECISIONS",
    "FSDP_UNITS",
    "DEVICES",
    "SCHEDULES",
    "OPTIMIZERS",
    "DATA_DTYPES",
    "METRICS_FIELDS",
]

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
MIXED_PRECISIONS = ("bf16", "fp16", "none")
FSDP_UNITS = ("block", "sublayer")
QUANTIZE_WEIGHTS = ("none", "int8", "fp8")
QUANTIZE_GRADS = ("none", "int8", "int4")
DEVICES = ("cpu", "cuda")
SCHEDULES = ("cosine", "linear", "constant")
OPTIMIZERS = ("adamw", "adam", "sgd")
DATA_DTYPES = ("auto", "uint8", "uint16", "uint32")
_MODELS = ("gpt", "llama")  # hpcfsdp/cli/_model.py's MODELS, for argparse without importing the models

# Keys of one record of the JSONL metrics log the trainer writes on rank 0 (`hpcfsdp plot` reads
# `step`, `loss`, `tokens_per_s`; `val_loss` where an eval ran). `peak_mem_bytes` is a list, one
# entry per rank; `time` is when the record was written (Unix seconds), as in every record of the log.
METRICS_FIELDS = (
    "step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "comm_time_s", "peak_mem_bytes", "time",
)


class ConfigError(ValueError):
    """A bad training configuration; the message names the field, its value and what is expected."""


@dataclass
class TrainConfig:
    # model: GPTConfig's or LlamaConfig's keys; See [Note: Model keys] in hpcfsdp/cli/_model.py
    model: str = "gpt"  # gpt (hpcfsdp.models.GPT) | llama (hpcfsdp.models.Llama)
    init_from: Optional[str] = None  # Hugging Face directory (config.json + safetensors) to start from
    vocab_size: int = 256  # 256 = the byte-level tokenizer of the shipped corpus
    block_size: int = 64  # context length in tokens
    n_layer: int = 4  # transformer blocks (the fully_shard units)
    n_head: int = 4  # attention heads; must divide n_embd
    n_embd: int = 128  # embedding width
    dropout: float = 0.0  # 0 for pretraining, 0.1+ for finetuning
    bias: Optional[bool] = None  # bias in Linear and norm layers; None = the model's (gpt: True, llama: False)
    tie_weights: Optional[bool] = None  # share the token embedding with the head; None = the model's (gpt: True, llama: False)
    gelu_approximate: Optional[str] = None  # gpt: MLP GELU, none | tanh (GPT-2's gelu_new); None = none
    layer_norm_eps: Optional[float] = None  # gpt: LayerNorm epsilon; None = 1e-5
    n_kv_head: Optional[int] = None  # llama: key/value heads (grouped-query attention); None = n_head
    intermediate_size: Optional[int] = None  # llama: SwiGLU width; None = Llama's rule from 8/3 * n_embd
    head_dim: Optional[int] = None  # llama: width of one head; None = n_embd / n_head
    rms_norm_eps: Optional[float] = None  # llama: RMSNorm epsilon; None = 1e-5
    rope_theta: Optional[float] = None  # llama: rotary embedding base; None = 10000
    init_std: Optional[float] = None  # llama: std of the initial weights; None = 0.02
    # data
    data: Optional[str] = None  # path of a flat token file; None = the shipped text corpus (bytes)
    data_dtype: str = "auto"  # element type of the token file: auto (from its .json sidecar) | uint8 | uint16 | uint32
    # batch
    batch_size: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    steps: int = 200  # optimizer steps in total (a resumed run continues up to this)
    # optimizer and learning-rate schedule
    optimizer: str = "adamw"  # adamw | adam | sgd
    lr: float = 1e-3  # peak learning rate
    min_lr: float = 1e-4  # floor of the cosine / linear decay, ~= lr/10 (Chinchilla)
    warmup_steps: int = 10  # linear warmup from 0 to lr over this many steps
    schedule: str = "cosine"  # cosine | linear | constant (after warmup)
    weight_decay: float = 0.1  # decoupled for adamw, L2 for adam and sgd
    betas: tuple = (0.9, 0.95)  # Adam(W) betas
    eps: float = 1e-8  # Adam(W) epsilon
    momentum: float = 0.9  # SGD momentum
    grad_clip: float = 1.0  # clip the global grad norm to this; 0 = no clipping
    # parallelism
    strategy: str = "FULL_SHARD"  # FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD
    mesh: Optional[tuple] = None  # None = all ranks in one dim; "RxS" = (replicate, shard), HYBRID_SHARD
    tp: int = 1  # tensor-parallel ranks per data-parallel rank (each block's attention heads and MLP split); mesh is then per tp slice
    sequence_parallel: bool = False  # with tp > 1: norms and the residual stream run on a shard of the sequence
    mixed_precision: str = "none"  # bf16 | fp16 | none (parameters for compute; reductions in fp32)
    cpu_offload: bool = False  # keep sharded parameters and optimizer state in host memory
    device: str = "cpu"  # cpu | cuda (each rank uses the GPU numbered by its node-local rank)
    reshard_after_forward: Optional[bool] = None  # None = by strategy (FULL_SHARD/HYBRID yes, SHARD_GRAD_OP no)
    activation_checkpointing: bool = False  # recompute each block's forward in backward instead of keeping it
    fsdp_units: str = "block"  # block: one FSDP unit per block; sublayer: each block's MLP also a unit (earlier first reduction)
    quantize_weights: str = "none"  # none | int8 | fp8: all-gather block-quantized weights (QuantizedAllGather)
    quantize_grads: str = "none"  # none | int8 | int4: the reduction's cross-host hop quantized (QuantizedReduceScatter)
    quantize_block: int = 256  # elements per quantization scale
    quantize_error_feedback: bool = True  # the quantized reduction keeps its rounding residual for the next step
    # checkpoints
    checkpoint_dir: Optional[str] = None  # where sharded checkpoints go; None = no checkpoints
    checkpoint_interval: int = 0  # save every N steps (and at the end); 0 = only at the end if a dir is set
    resume: bool = False  # continue from the latest checkpoint in checkpoint_dir (an error if there is none)
    resume_if_exists: bool = False  # continue from it if there is one, else start at step 0 (Slurm's requeued jobs)
    resume_from: Optional[str] = None  # continue from this checkpoint: step-N (in checkpoint_dir), N, or a path
    async_checkpoint: bool = False  # periodic checkpoints written in the background (dcp.async_save)
    keep_last: int = 0  # >0: save to CHECKPOINT_DIR/step-NNNNNNNN, keep the last K, `latest` links to the newest
    requeue: bool = False  # after a stop signal under Slurm: `scontrol requeue $SLURM_JOB_ID` once checkpointed
    # surviving lost ranks (in-job, over ULFM): See [Note: Elastic training] in _elastic.py
    elastic: bool = False  # a lost rank or host: the survivors shrink the world, reshard and go on
    memory_checkpoint_interval: int = 1  # FULL_SHARD/SHARD_GRAD_OP with elastic: copy state to a partner every N steps
    min_ranks: int = 1  # with elastic: stop (exit 1, the disk checkpoint remains) when fewer ranks survive
    # logging and evaluation
    seed: int = 1337  # same on every rank; data order and init derive from it
    log_interval: int = 10  # print and log metrics every N steps
    out_dir: str = "runs/hpcfsdp"  # run directory: metrics log, config copy, plots
    metrics_path: Optional[str] = None  # JSONL metrics log; None = <out_dir>/metrics.jsonl
    metrics: str = "jsonl"  # where metrics go, comma-separated: jsonl, tensorboard (<out_dir>/tensorboard), wandb
    eval_interval: int = 0  # evaluate held-out loss every N steps; 0 = never
    eval_iters: int = 10  # batches per evaluation
    soak: bool = False  # soak mode: run long, check memory and loss stay bounded
    trace: Optional[str] = None  # directory for per-rank Chrome traces (as HPCFSDP_TRACE); None = off

    def __post_init__(self):
        # Accept the file / flag spellings of the composite fields.
        if isinstance(self.mesh, (str, list)):
            self.mesh = parse_mesh(self.mesh)
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)

    # ---------------------------------------------------------------- derived values

    def metrics_file(self) -> str:
        """Path of the JSONL metrics log."""
        return self.metrics_path if self.metrics_path else os.path.join(self.out_dir, "metrics.jsonl")

    def tokens_per_step(self, world_size: int) -> int:
        """Tokens consumed by one optimizer step over all ranks (every rank reads its own batches)."""
        return self.batch_size * self.grad_accum * self.block_size * world_size

    def effective_reshard_after_forward(self) -> bool:
        """`reshard_after_forward` with None resolved by strategy, as FSDP1 maps strategies onto FSDP2."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.strategy in ("FULL_SHARD", "HYBRID_SHARD")

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based): linear warmup, then the schedule to min_lr."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        if self.schedule == "constant":
            return self.lr
        decay_steps = max(1, self.steps - self.warmup_steps)
        ratio = min(1.0, (step - self.warmup_steps) / decay_steps)
        if self.schedule == "cosine":
            coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
        else:  # linear
            coeff = 1.0 - ratio
        return self.min_lr + coeff * (self.lr - self.min_lr)

    # ---------------------------------------------------------------- validation

    def validate(self, world_size: int) -> None:
        """Raise ConfigError naming the first bad field; see [Note: Config validation is rank-local and deterministic]."""
        _check_types(self)
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size={world_size!r}: expected a positive integer")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "batch_size",
                     "grad_accum", "steps", "log_interval", "eval_iters"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name}={value}: expected a positive integer")
        for name in ("warmup_steps", "checkpoint_interval", "eval_interval", "seed", "keep_last"):
            value = getattr(self, name)
            if value < 0:
                raise ConfigError(f"{name}={value}: expected an integer >= 0")
        if self.data is None and self.vocab_size < 256:
            raise ConfigError(
                f"vocab_size={self.vocab_size}: the shipped byte-level corpus needs vocab_size >= 256"
            )
        _choice("data_dtype", self.data_dtype, DATA_DTYPES)
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "momentum"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name}={value}: expected a finite number >= 0")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr={self.min_lr}: expected <= lr={self.lr}")
        if not (0.0 <= self.dropout < 1.0):
            raise ConfigError(f"dropout={self.dropout}: expected 0 <= dropout < 1")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError(f"eps={self.eps}: expected a finite number > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas={list(self.betas)}: expected two numbers in [0, 1)")
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        _choice("fsdp_units", self.fsdp_units, FSDP_UNITS)
        check_quantize(self.quantize_weights, self.quantize_grads, self.quantize_block)
        _choice("device", self.device, DEVICES)
        self._validate_model()
        self._validate_tp(world_size)
        self._validate_mesh(world_size // self.tp if self.tp >= 1 and world_size % self.tp == 0 else world_size)
        if self.checkpoint_interval > 0 and not self.checkpoint_dir:
            raise ConfigError(
                f"checkpoint_interval={self.checkpoint_interval}: needs checkpoint_dir (--checkpoint-dir DIR)"
            )
        if self.keep_last > 0 and not self.checkpoint_dir:
            raise ConfigError(f"keep_last={self.keep_last}: needs checkpoint_dir (--checkpoint-dir DIR)")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume=True: needs checkpoint_dir (--checkpoint-dir DIR) to resume from")
        if self.resume_if_exists and not self.checkpoint_dir:
            raise ConfigError("resume_if_exists=True: needs checkpoint_dir (--checkpoint-dir DIR) to resume from")
        if sum(map(bool, (self.resume, self.resume_if_exists, self.resume_from))) > 1:
            raise ConfigError("resume, resume_if_exists and resume_from: give one of them (resume_from names the "
                              "checkpoint, resume takes the latest, resume_if_exists also starts afresh)")
        if self.resume_from is not None:
            if not str(self.resume_from).strip():
                raise ConfigError(f"resume_from={self.resume_from!r}: expected step-N, N or a checkpoint path")
            if _step_spec(self.resume_from) is not None and not self.checkpoint_dir:
                raise ConfigError(f"resume_from={self.resume_from!r}: a step needs checkpoint_dir (--checkpoint-dir "
                                  "DIR) to find it in")
        self._validate_elastic(world_size)
        if not self.out_dir:
            raise ConfigError(f"out_dir={self.out_dir!r}: expected a directory path")
        from ._metrics import check_metrics

        try:
            check_metrics(self.metrics)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _validate_model(self) -> None:
        """The model's keys (See [Note: Model keys] in hpcfsdp/cli/_model.py)."""
        from ._model import MODEL_KEYS, MODELS, model_config

        _choice("model", self.model, MODELS)
        other = [k for name, keys in MODEL_KEYS.items() if name != self.model for k in keys
                 if k not in MODEL_KEYS[self.model] and getattr(self, k) is not None]
        if other:
            owner = next(n for n, keys in MODEL_KEYS.items() if other[0] in keys)
            raise ConfigError(f"{other[0]}={getattr(self, other[0])!r}: a setting of model {owner!r}, but "
                              f"model={self.model!r} (--model {owner} to train one, or drop {other[0]})")
        if self.init_from is not None and not str(self.init_from).strip():
            raise ConfigError(f"init_from={self.init_from!r}: expected a Hugging Face model directory")
        if self.n_embd % self.n_head != 0 and self.head_dim is None:
            raise ConfigError(
                f"n_embd={self.n_embd}: expected a multiple of n_head={self.n_head} "
                f"(head size n_embd/n_head must be an integer)"
            )
        for name in ("layer_norm_eps", "rms_norm_eps", "rope_theta", "init_std"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}={value}: expected a finite number > 0")
        if self.gelu_approximate is not None:
            _choice("gelu_approximate", self.gelu_approximate, ("none", "tanh"))
        try:
            model_config(self)
        except ValueError as e:
            raise ConfigError(f"model={self.model!r}: {e}") from None

    def _mlp_width(self) -> int:
        from ._model import model_config

        return model_config(self).intermediate_size if self.model == "llama" else 4 * self.n_embd

    def _validate_elastic(self, world_size: int) -> None:
        if self.min_ranks < 1 or self.memory_checkpoint_interval < 0:
            bad = "min_ranks" if self.min_ranks < 1 else "memory_checkpoint_interval"
            raise ConfigError(f"{bad}={getattr(self, bad)}: expected {'>= 1' if bad == 'min_ranks' else '>= 0'}")
        if not self.elastic:
            return
        if self.min_ranks > world_size:
            raise ConfigError(f"min_ranks={self.min_ranks}: larger than the world ({world_size} ranks)")
        refused = [("tp", self.tp > 1, "tensor parallelism"), ("quantize_grads", self.quantize_grads != "none",
                   "quantized gradients (their residual state)"), ("device", self.device != "cpu",
                   "CUDA devices (NCCL communicators cannot be revoked)"),
                   ("async_checkpoint", self.async_checkpoint, "background checkpoints"),
                   ("soak", self.soak, "soak runs")]
        for name, bad, what in refused:
            if bad:
                raise ConfigError(f"elastic=True does not support {what} yet ({name}={getattr(self, name)!r})")

    def _validate_tp(self, world_size: int) -> None:
        tp = self.tp
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tp={tp!r}: expected a positive integer")
        if self.sequence_parallel and tp == 1:
            raise ConfigError("sequence_parallel=True: needs tensor parallelism (--tp K with K > 1)")
        if tp == 1:
            return
        if self.quantize_weights != "none" or self.quantize_grads != "none":
            raise ConfigError(f"quantize_weights/quantize_grads with tp={tp}: quantized collectives are for data "
                              "parallelism without tensor parallelism (not yet combined)")
        if self.sequence_parallel and self.block_size % tp:
            raise ConfigError(f"sequence_parallel=True with tp={tp}: tp must divide block_size={self.block_size}")
        if world_size % tp:
            raise ConfigError(f"tp={tp}: must divide the world size {world_size}")
        if self._mlp_width() % tp:
            what = "intermediate_size" if self.model == "llama" else "4*n_embd"
            raise ConfigError(f"tp={tp}: must divide the MLP width {what}={self._mlp_width()}")
        if self.n_head % tp:
            raise ConfigError(f"tp={tp}: must divide n_head={self.n_head} (attention is split by heads)")
        if self.model == "llama" and (self.n_kv_head or self.n_head) % tp:
            raise ConfigError(f"tp={tp}: must divide n_kv_head={self.n_kv_head} (key/value heads are split too)")
        if self.strategy == "NO_SHARD":
            raise ConfigError(f"tp={tp}: strategy NO_SHARD is not supported with tensor parallelism")

    def _validate_mesh(self, world_size: int) -> None:
        mesh = self.mesh
        if mesh is None:
            if self.strategy == "HYBRID_SHARD":
                raise ConfigError(
                    "mesh=None: strategy HYBRID_SHARD needs a 2-D mesh 'RxS' (replicate x shard, "
                    "e.g. --mesh 2x4 for 2 nodes of 4 ranks)"
                )
            return
        text = format_mesh(mesh)
        if not 1 <= len(mesh) <= 2 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in mesh):
            raise ConfigError(f"mesh={text!r}: expected 'N' or 'RxS' with positive integers")
        if math.prod(mesh) != world_size:
            raise ConfigError(
                f"mesh={text!r}: its size {math.prod(mesh)} must equal the world size {world_size}"
            )
        if self.strategy == "HYBRID_SHARD" and len(mesh) != 2:
            raise ConfigError(
                f"mesh={text!r}: strategy HYBRID_SHARD needs a 2-D mesh 'RxS' (replicate x shard)"
            )
        if self.strategy != "HYBRID_SHARD" and len(mesh) != 1:
            raise ConfigError(
                f"mesh={text!r}: strategy {self.strategy} takes a 1-D mesh (or none); "
                f"a 2-D (replicate x shard) mesh is for HYBRID_SHARD"
            )

    # ---------------------------------------------------------------- serialisation

    def to_dict(self) -> dict:
        """JSON-compatible dict (mesh as 'RxS' or None, betas as a list); `from_dict` inverts it."""
        d = dataclasses.asdict(self)
        d["mesh"] = None if self.mesh is None else format_mesh(self.mesh)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config") -> "TrainConfig":
        """Build from a flat dict (a config file's table); unknown keys and wrong types raise ConfigError."""
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a table of settings, got {type(d).__name__}")
        _check_keys(d, source)
        kwargs = {}
        for name, value in d.items():
            kwargs[name] = _coerce(name, value, source)
        return cls(**kwargs)

    def to_toml(self) -> str:
        """Flat TOML text of the fields that are not None (None is every such field's default)."""
        lines = []
        for name, value in self.to_dict().items():
            if value is None:
                continue
            lines.append(f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    def to_args(self, *, only_changed: bool = True, always=("strategy", "mesh", "device")) -> list:
        """Command-line flags that rebuild this config with `config_from_args` (for job scripts)."""
        default = TrainConfig()
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if only_changed and value == getattr(default, f.name) and f.name not in always:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.name == "mesh":
                out += [flag, "none" if value is None else format_mesh(value)]
            elif f.name == "betas":
                out += [flag] + [repr(float(b)) for b in value]
            elif _field_kind(f.name) == "bool":
                if value is None:  # reshard_after_forward: None is the default, nothing to say
                    continue
                out.append(flag if value else "--no-" + f.name.replace("_", "-"))
            elif value is None:
                out += [flag, "none"]
            else:
                out += [flag, str(value)]
        return out


# -------------------------------------------------------------------- field kinds and checks

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_NULLABLE = {"data", "mesh", "reshard_after_forward", "checkpoint_dir", "metrics_path", "trace", "resume_from",
             "init_from", "bias", "tie_weights", "gelu_approximate", "layer_norm_eps", "n_kv_head", "intermediate_size",
             "head_dim", "rms_norm_eps", "rope_theta", "init_std"}


def _step_spec(value) -> int | None:
    """The step of a ``resume_from`` that names one (``step-120``, ``step-00000120`` or ``120``), else None."""
    text = str(value).strip()
    text = text[len("step-"):] if text.startswith("step-") else text
    return int(text) if text.isdigit() else None


def resume_target(cfg) -> str | None:
    """The checkpoint a run resumes from: resume_from resolved (a step in checkpoint_dir, or the path given),
    else checkpoint_dir/latest for resume or resume_if_exists, else None."""
    if cfg.resume_from is not None:
        step = _step_spec(cfg.resume_from)
        if step is not None:
            return os.path.join(cfg.checkpoint_dir, f"step-{step:08d}")
        return str(cfg.resume_from)
    if cfg.resume or cfg.resume_if_exists:
        return os.path.join(cfg.checkpoint_dir, "latest")
    return None


def _field_kind(name: str) -> str:
    """'bool' | 'int' | 'float' | 'str' | 'tuple': the field's type with Optional[...] removed."""
    t = _FIELDS[name].type
    args = [a for a in typing.get_args(t) if a is not type(None)]
    t = args[0] if args else t
    assert t in (bool, int, float, str, tuple), (name, t)
    return t.__name__


def check_quantize(weights, grads, block) -> None:
    """The quantized collectives' settings (``train``'s and ``plan``'s check): ConfigError naming the bad one."""
    _choice("quantize_weights", weights, QUANTIZE_WEIGHTS)
    _choice("quantize_grads", grads, QUANTIZE_GRADS)
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block % 2:
        raise ConfigError(f"quantize_block={block!r}: expected an even integer >= 2")


def _choice(name, value, allowed):
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(allowed)}{hint}")


# Other trainers' names for the fields (Hugging Face TrainingArguments, torchtitan, nanoGPT), for "did you mean".
SYNONYMS = {
    "learning_rate": "lr", "max_lr": "lr", "min_learning_rate": "min_lr", "max_steps": "steps",
    "num_steps": "steps", "training_steps": "steps", "train_steps": "steps", "max_iters": "steps",
    "per_device_train_batch_size": "batch_size", "micro_batch_size": "batch_size", "local_batch_size": "batch_size",
    "gradient_accumulation_steps": "grad_accum", "gradient_accumulation": "grad_accum",
    "max_grad_norm": "grad_clip", "clip_grad_norm": "grad_clip", "max_norm": "grad_clip",
    "lr_warmup_steps": "warmup_steps", "warmup_iters": "warmup_steps", "lr_scheduler_type": "schedule",
    "lr_scheduler": "schedule", "output_dir": "out_dir", "logging_steps": "log_interval", "log_freq": "log_interval",
    "save_steps": "checkpoint_interval", "checkpoint_steps": "checkpoint_interval", "seq_len": "block_size",
    "max_seq_len": "block_size", "context_length": "block_size", "n_layers": "n_layer", "num_layers": "n_layer",
    "n_heads": "n_head", "num_heads": "n_head", "dim": "n_embd", "hidden_size": "n_embd", "d_model": "n_embd",
    "adam_beta1": "betas", "adam_beta2": "betas", "adam_epsilon": "eps", "fsdp": "strategy",
    # the model's keys under Hugging Face's and torchtitan's names
    "model_name": "model", "model_type": "model", "name": "model", "initial_load_path": "init_from",
    "pretrained": "init_from", "pretrained_model_name_or_path": "init_from", "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head", "num_key_value_heads": "n_kv_head", "n_kv_heads": "n_kv_head",
    "max_position_embeddings": "block_size", "n_positions": "block_size", "ffn_dim": "intermediate_size",
    "ffn_hidden_size": "intermediate_size", "norm_eps": "rms_norm_eps", "layer_norm_epsilon": "layer_norm_eps",
    "tie_word_embeddings": "tie_weights", "initializer_range": "init_std", "attention_bias": "bias",
}


def closest_field(name: str, fields=None) -> str | None:
    """The field a mistyped or foreign setting name most likely means: a known synonym (``learning_rate`` ->
    ``lr``), the name with dashes as underscores, else the closest spelling; None if nothing is close."""
    fields = list(_FIELDS) if fields is None else list(fields)
    key = str(name).lstrip("-").replace("-", "_")
    if key in fields:
        return key
    if SYNONYMS.get(key) in fields:
        return SYNONYMS[key]
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
    return close[0] if close else None


def _check_keys(d, source):
    tables = [k for k, v in d.items() if isinstance(v, dict)]
    if tables:
        raise ConfigError(
            f"{source}: {tables[0]!r} is a table; nested tables are not supported, write the settings "
            f"as flat top-level keys named as the fields (e.g. n_layer = 4)"
        )
    unknown = [k for k in d if k not in _FIELDS]
    if unknown:
        parts = []
        for k in unknown:
            close = closest_field(k)
            parts.append(f"{k!r}" + (f" (did you mean {close!r}?)" if close else ""))
        raise ConfigError(f"{source}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(parts)}")


def _coerce(name, value, source):
    """Check one file value's type and convert it to the field's Python form."""
    where = f"{source}: {name}={value!r}"
    if value is None:
        if name in _NULLABLE:
            return None
        raise ConfigError(f"{where}: expected a value, not null")
    if isinstance(value, dict):
        raise ConfigError(f"{where}: expected a single value; nested tables are not supported, write keys at top level")
    kind = _field_kind(name)
    if name == "mesh":
        if isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)):
            return parse_mesh(value)
        raise ConfigError(f"{where}: expected a string like '2x4' or a list of integers")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number")
        return float(value)
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string")
        return value
    # betas
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"{where}: expected a list of two numbers, e.g. [0.9, 0.95]")
    return tuple(float(v) for v in value)


def _check_types(cfg):
    """Type-check a config built in Python (fields set by hand) the same way as a file's values."""
    for name in _FIELDS:
        value = getattr(cfg, name)
        if name == "mesh" and isinstance(value, tuple):
            continue
        _coerce(name, list(value) if isinstance(value, tuple) else value, "config")


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are a subset of TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} value {value!r} as TOML")


# -------------------------------------------------------------------- mesh strings


def parse_mesh(text):
    """'4' -> (4,), '2x4' -> (2, 4), 'none' / '' / None -> None; a list of ints -> tuple."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        return tuple(text)
    s = str(text).strip().lower()
    if s in ("", "none"):
        return None
    parts = s.replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"mesh={text!r}: expected 'N' or 'RxS' with positive integers, e.g. '2x4'") from None
    if not 1 <= len(dims) <= 2 or any(d < 1 for d in dims):
        raise ConfigError(f"mesh={text!r}: expected 'N' or 'RxS' with positive integers, e.g. '2x4'")
    return dims


def format_mesh(mesh) -> str:
    return "x".join(str(d) for d in mesh)


# -------------------------------------------------------------------- files and flags


def load_config_file(path: str) -> dict:
    """Read a flat TOML (.toml) or JSON (.json) config file into a dict; errors are ConfigError."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".toml", ".json"):
        raise ConfigError(f"config={path!r}: expected a .toml or .json file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"config={path!r}: cannot read it ({e.strerror or e})") from None
    try:
        if ext == ".toml":
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config={path!r}: not valid {ext[1:].upper()}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config={path!r}: expected a table of settings at top level, got {type(data).__name__}")
    return data


def _help(name, text):
    default = getattr(TrainConfig(), name)
    if isinstance(default, tuple) and name == "betas":
        shown = " ".join(str(b) for b in default)
    else:
        shown = default
    return f"{text} (default: {shown})".replace("%", "%%")


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `--config` and one flag per TrainConfig field; see [Note: Config precedence]."""
    S = argparse.SUPPRESS
    parser.add_argument("--config", metavar="FILE", default=S,
                        help="TOML or JSON file of settings (flat keys named as the fields); flags override it")
    g = parser.add_argument_group("model", "GPTConfig's or LlamaConfig's keys; unset ones take the model's default")
    g.add_argument("--model", choices=_MODELS, default=S, help=_help("model", "model class: hpcfsdp.models.GPT or Llama"))
    g.add_argument("--init-from", metavar="DIR", default=S,
                   help=_help("init_from", "start from the weights of this Hugging Face directory (config.json + "
                              "safetensors, GPT-2 or Llama; streamed into the shards); the model keys come from "
                              "its config.json"))
    g.add_argument("--vocab-size", type=int, default=S, help=_help("vocab_size", "vocabulary size; 256 for the byte tokenizer"))
    g.add_argument("--block-size", type=int, default=S, help=_help("block_size", "sequence length in tokens"))
    g.add_argument("--n-layer", type=int, default=S, help=_help("n_layer", "transformer blocks"))
    g.add_argument("--n-head", type=int, default=S, help=_help("n_head", "attention heads (must divide --n-embd)"))
    g.add_argument("--n-embd", type=int, default=S, help=_help("n_embd", "embedding width"))
    g.add_argument("--dropout", type=float, default=S, help=_help("dropout", "dropout probability"))
    g.add_argument("--bias", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("bias", "bias in Linear and norm layers; unset = the model's (gpt: yes, llama: no)"))
    g.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("tie_weights", "share token embedding and output head; unset = the model's"))
    g.add_argument("--gelu-approximate", choices=("none", "tanh"), default=S,
                   help=_help("gelu_approximate", "gpt: MLP GELU (tanh = GPT-2's gelu_new)"))
    g.add_argument("--layer-norm-eps", type=_or_none(float), default=S, help=_help("layer_norm_eps", "gpt: LayerNorm epsilon"))
    g.add_argument("--n-kv-head", type=_or_none(int), default=S,
                   help=_help("n_kv_head", "llama: key/value heads (grouped-query attention; must divide --n-head)"))
    g.add_argument("--intermediate-size", type=_or_none(int), default=S, help=_help("intermediate_size", "llama: SwiGLU width"))
    g.add_argument("--head-dim", type=_or_none(int), default=S, help=_help("head_dim", "llama: width of one attention head"))
    g.add_argument("--rms-norm-eps", type=_or_none(float), default=S, help=_help("rms_norm_eps", "llama: RMSNorm epsilon"))
    g.add_argument("--rope-theta", type=_or_none(float), default=S, help=_help("rope_theta", "llama: rotary embedding base"))
    g.add_argument("--init-std", type=_or_none(float), default=S, help=_help("init_std", "llama: std of the initial weights"))
    g = parser.add_argument_group("data and batch")
    g.add_argument("--data", metavar="PATH", default=S, help=_help("data", "token file or directory of shards (hpcfsdp data prepare); 'none' = the shipped corpus"))
    g.add_argument("--data-dtype", choices=DATA_DTYPES, default=S, help=_help("data_dtype", "element type of the token file; auto = from its .json sidecar"))
    g.add_argument("--batch-size", type=int, default=S, help=_help("batch_size", "sequences per rank per micro-step"))
    g.add_argument("--grad-accum", type=int, default=S, help=_help("grad_accum", "gradient-accumulation micro-steps per optimizer step"))
    g.add_argument("--steps", type=int, default=S, help=_help("steps", "optimizer steps in total"))
    g = parser.add_argument_group("optimizer and schedule")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=S, help=_help("optimizer", "optimizer"))
    g.add_argument("--lr", type=float, default=S, help=_help("lr", "peak learning rate"))
    g.add_argument("--min-lr", type=float, default=S, help=_help("min_lr", "final learning rate of the decay"))
    g.add_argument("--warmup-steps", type=int, default=S, help=_help("warmup_steps", "linear warmup steps"))
    g.add_argument("--schedule", choices=SCHEDULES, default=S, help=_help("schedule", "learning-rate schedule after warmup"))
    g.add_argument("--weight-decay", type=float, default=S, help=_help("weight_decay", "weight decay"))
    g.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), default=S, help=_help("betas", "Adam(W) betas"))
    g.add_argument("--eps", type=float, default=S, help=_help("eps", "Adam(W) epsilon"))
    g.add_argument("--momentum", type=float, default=S, help=_help("momentum", "SGD momentum"))
    g.add_argument("--grad-clip", type=float, default=S, help=_help("grad_clip", "max global grad norm; 0 = no clipping"))
    g = parser.add_argument_group("parallelism")
    g.add_argument("--strategy", choices=STRATEGIES, default=S, help=_help("strategy", "FSDP sharding strategy"))
    g.add_argument("--mesh", metavar="RxS", default=S,
                   help=_help("mesh", "device mesh: 'N' (1-D) or 'RxS' (replicate x shard, HYBRID_SHARD); product = world size; 'none' = all ranks"))
    g.add_argument("--tp", type=int, default=S, help=_help("tp", "tensor-parallel ranks (each block's attention heads and MLP split over them); data parallelism over world/tp"))
    g.add_argument("--mixed-precision", choices=MIXED_PRECISIONS, default=S, help=_help("mixed_precision", "parameter dtype for compute"))
    g.add_argument("--cpu-offload", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("cpu_offload", "keep sharded parameters and optimizer state in host memory"))
    g.add_argument("--device", choices=DEVICES, default=S, help=_help("device", "array backend; cuda uses the GPU of the node-local rank"))
    g.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("reshard_after_forward", "free gathered parameters after forward; unset = by strategy, the root and the "
                                  "last block keeping theirs"))
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("activation_checkpointing", "recompute each block's forward in backward (less memory, more time)"))
    g.add_argument("--fsdp-units", choices=FSDP_UNITS, default=S,
                   help=_help("fsdp_units", "FSDP unit per block, or also per block's MLP (sublayer: gradients start "
                              "reducing after half a block's backward; more, smaller collectives)"))
    g.add_argument("--quantize-weights", choices=QUANTIZE_WEIGHTS, default=S,
                   help=_help("quantize_weights", "all-gather block-quantized weights (the sharded copy stays full "
                              "precision)"))
    g.add_argument("--quantize-grads", choices=QUANTIZE_GRADS, default=S,
                   help=_help("quantize_grads", "quantize the gradient reduction across hosts"))
    g.add_argument("--quantize-block", type=int, default=S, help=_help("quantize_block", "elements per quantization scale"))
    g.add_argument("--quantize-error-feedback", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("quantize_error_feedback", "carry what the gradient quantization rounded away into the "
                              "next step"))
    g = parser.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", metavar="DIR", default=S, help=_help("checkpoint_dir", "directory of sharded checkpoints"))
    g.add_argument("--checkpoint-interval", type=int, default=S, help=_help("checkpoint_interval", "save every N steps; 0 = at the end only"))
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("resume", "resume from the latest checkpoint in --checkpoint-dir (an error if none)"))
    g.add_argument("--resume-if-exists", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("resume_if_exists", "resume from the latest checkpoint if there is one, else start "
                              "at step 0 (what a requeued Slurm job needs)"))
    g.add_argument("--resume-from", metavar="CKPT", default=S,
                   help=_help("resume_from", "resume from this checkpoint: step-N (kept by --keep-last in "
                              "--checkpoint-dir), N, or a checkpoint directory"))
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("sequence_parallel", "with --tp: norms and the residual stream on a shard of the sequence"))
    g.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("async_checkpoint", "write periodic checkpoints in the background while training"))
    g.add_argument("--keep-last", type=int, metavar="K", default=S,
                   help=_help("keep_last", "keep the last K checkpoints (CHECKPOINT_DIR/step-N, `latest` links to the "
                              "newest); 0 = only `latest`"))
    g.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("requeue", "after SIGTERM/SIGUSR1 and the final checkpoint, requeue this Slurm job "
                              "(scontrol requeue $SLURM_JOB_ID)"))
    g = parser.add_argument_group("surviving lost ranks")
    g.add_argument("--elastic", action=argparse.BooleanOptionalAction, default=S,
                   help=_help("elastic", "survive a lost rank or host inside the job: the survivors shrink the world "
                              "and go on (needs Open MPI with ULFM under `mpirun --with-ft ulfm`)"))
    g.add_argument("--memory-checkpoint-interval", type=int, metavar="N", default=S,
                   help=_help("memory_checkpoint_interval", "with --elastic and FULL_SHARD: copy each rank's state "
                              "to a partner on another host every N steps (a loss rolls back at most N steps); "
                              "HYBRID_SHARD copies nothing"))
    g.add_argument("--min-ranks", type=int, metavar="M", default=S,
                   help=_help("min_ranks", "fewer ranks left than M: --elastic stops (exit 1, the disk "
                              "checkpoint stays); a job from `hpcfsdp slurm render` requeues itself (scontrol requeue) "
                              "instead of rerunning"))
    g = parser.add_argument_group("logging and evaluation")
    g.add_argument("--seed", type=int, default=S, help=_help("seed", "random seed (same on every rank)"))
    g.add_argument("--log-interval", type=int, default=S, help=_help("log_interval", "log metrics every N steps"))
    g.add_argument("--out-dir", metavar="DIR", default=S, help=_help("out_dir", "run directory"))
    g.add_argument("--metrics-path", metavar="FILE", default=S, help=_help("metrics_path", "JSONL metrics log; unset = OUT_DIR/metrics.jsonl"))
    g.add_argument("--metrics", metavar="SINKS", default=S,
                   help=_help("metrics", "where metrics go, comma-separated: jsonl, tensorboard (OUT_DIR/tensorboard), "
                              "wandb (needs `pip install wandb`; WANDB_MODE=offline works)"))
    g.add_argument("--eval-interval", type=int, default=S, help=_help("eval_interval", "evaluate every N steps; 0 = never"))
    g.add_argument("--eval-iters", type=int, default=S, help=_help("eval_iters", "batches per evaluation"))
    g.add_argument("--soak", action=argparse.BooleanOptionalAction, default=S, help=_help("soak", "soak-test mode"))
    g.add_argument("--log-level", choices=_LOG_LEVELS, action=_LogLevel, default=S,
                   help="level of the hpcfsdp logger (rank-prefixed lines on stderr); overrides HPCFSDP_LOG_LEVEL "
                        "(default: warning)")
    g.add_argument("--trace", metavar="DIR", default=S,
                   help=_help("trace", "write a Chrome trace per rank to DIR (see `hpcfsdp trace`)"))
    return parser


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _or_none(kind):
    """argparse type of a nullable number flag: 'none' is None (the model's default), as `to_args` writes it."""
    def parse(text):
        return None if text.strip().lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error: "invalid int value: 'x'"
    return parse


class _LogLevel(argparse.Action):
    """--log-level: set the hpcfsdp logger's level as soon as the flag is parsed (not a TrainConfig field)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from hpcfsdp import _logging

        _logging.set_level(values)
        setattr(namespace, self.dest, values)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then `--config FILE`, then the flags given explicitly; raises ConfigError."""
    from ._model import apply_init_from

    values, explicit = {}, set()
    path = getattr(args, "config", None)
    if path:
        table = load_config_file(path)
        values.update(TrainConfig.from_dict(table, source=f"config {path!r}").__dict__)
        explicit.update(table)
    given = vars(args)
    for name in _FIELDS:
        if name not in given:
            continue
        explicit.add(name)
        value = given[name]
        if name in _NULLABLE and isinstance(value, str) and value.strip().lower() == "none":
            value = None
        elif name == "mesh":
            value = parse_mesh(value)
        elif name == "betas":
            value = tuple(value)
        values[name] = value
    if values.get("init_from"):  # See [Note: Model keys] in hpcfsdp/cli/_model.py
        values = apply_init_from({**TrainConfig().__dict__, **values}, explicit, TrainConfig.block_size, ConfigError)
    return TrainConfig(**values)


def exit_with_config_error(err: Exception, prog: str = "hpcfsdp train") -> int:
    """Print `<prog>: error: <message>` to stderr (argparse style) and return exit code 2."""
    sys.stderr.write(f"{prog}: error: {err}\n")  # one write: lines of different ranks do not interleave
    sys.stderr.flush()
    return 2


_LOCAL_RANK_VARS = ("SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "PALS_LOCAL_RANKID")


def node_local_rank(env=None) -> Optional[int]:
    """This rank's index on its node from the launcher's environment (srun, Hydra, Open MPI, PALS), or None.

    The trainer uses it to pick `cuda:<local rank>` when every GPU of the node is visible to every
    task (`--gpus-per-node`); without these variables, MPI's `Split_type(COMM_TYPE_SHARED)` gives it.
    """
    env = os.environ if env is None else env
    for var in _LOCAL_RANK_VARS:
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None
