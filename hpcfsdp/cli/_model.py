"""Which model `hpcfsdp train` builds: GPT or Llama from the config's keys, or from Hugging Face weights (--init-from).

[Note: Model keys]
TrainConfig holds the union of GPTConfig's and LlamaConfig's fields under their own names. `model` says
which class is built; the keys of the other model must stay unset (None), and a key left None takes the
model's own default (bias: GPT True, Llama False). With `init_from` the architecture comes from the
directory's config.json: `config_from_args` fills the model keys from it (a key given explicitly must
agree), so the saved configuration, config.toml and every checkpoint name the real architecture;
`block_size` stays the training window, at most the model's positions. Every checkpoint also holds the
built model's full config ("model_config": {"model": name, **config}), so generate, export and resume
rebuild it without the original directory.
"""
import dataclasses

__all__ = ["MODELS", "MODEL_KEYS", "model_config", "model_config_of", "build_model", "saved_model_config",
           "model_from_saved", "apply_init_from", "hf_kind"]

MODELS = ("gpt", "llama")
MODEL_KEYS = {
    "gpt": ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights",
            "gelu_approximate", "layer_norm_eps"),
    "llama": ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size",
              "head_dim", "rms_norm_eps", "rope_theta", "dropout", "bias", "tie_weights", "init_std"),
}
_HF_TYPES = {"gpt2": "gpt", "llama": "llama"}


def _classes(name):
    from hpcfsdp.models import GPT, GPTConfig, Llama, LlamaConfig

    return {"gpt": (GPT, GPTConfig), "llama": (Llama, LlamaConfig)}[name]


def model_config_of(values: dict):
    """The GPTConfig or LlamaConfig of a TrainConfig's dict (``to_dict()`` or a checkpoint's saved config):
    its model's keys that are set; ValueError from the config class for bad values."""
    name = values.get("model") or "gpt"
    _, cfg_cls = _classes(name)
    return cfg_cls(**{k: values[k] for k in MODEL_KEYS[name] if values.get(k) is not None})


def model_config(cfg):
    """The model config of TrainConfig ``cfg`` (see [Note: Model keys])."""
    return model_config_of(dataclasses.asdict(cfg))


def saved_model_config(model) -> dict:
    """{"model": name, **the model's config}: what a checkpoint keeps to rebuild the model."""
    from hpcfsdp.models import Llama

    return {"model": "llama" if isinstance(model, Llama) else "gpt", **dataclasses.asdict(model.config)}


def model_from_saved(skeleton: dict):
    """An unsharded model of the architecture a training checkpoint's skeleton names (weights not loaded)."""
    saved = skeleton.get("model_config")
    if isinstance(saved, dict):
        name = saved.get("model", "gpt")
        cls, cfg_cls = _classes(name)
        fields = {f.name for f in dataclasses.fields(cfg_cls)}
        return cls(cfg_cls(**{k: v for k, v in saved.items() if k in fields and k != "dropout"}))
    config = skeleton.get("config")  # written before checkpoints kept model_config: a GPT from the train keys
    if not isinstance(config, dict):
        raise ValueError("holds no training configuration: not written by hpcfsdp train")
    cls, _ = _classes(config.get("model") or "gpt")
    return cls(model_config_of({**config, "dropout": None}))


def hf_kind(path) -> tuple:
    """(train's model name, the config.json dict) of Hugging Face directory ``path``; ValueError naming it."""
    from hpcfsdp.models import _hf

    try:
        hf = _hf.read_config(path)
    except (OSError, ValueError) as e:
        raise ValueError(str(e)) from None
    kind = _HF_TYPES.get(hf.get("model_type"))
    if kind is None:
        raise ValueError(f"{path}/config.json: model_type {hf.get('model_type')!r} is not supported (gpt2 or llama)")
    return kind, hf


def apply_init_from(values: dict, given: set, default_block_size: int, error=ValueError) -> dict:
    """Fill the model keys of ``values`` (TrainConfig fields) from ``values["init_from"]``'s config.json; keys in
    ``given`` (set explicitly) must agree. Raises ``error`` naming the key, both values and the directory."""
    from hpcfsdp.models import _hf

    path = values.get("init_from")
    if not path:
        return values
    try:
        kind, hf = hf_kind(path)
        kw = (_hf.gpt2_config if kind == "gpt" else _hf.llama_config)(hf)
    except (ValueError, KeyError) as e:
        raise error(f"init_from={path!r}: {e}") from None
    if "model" in given and values.get("model") != kind:
        raise error(f"model={values.get('model')!r}, but init_from={path!r} holds a {hf.get('model_type')} model: "
                    f"use --model {kind} (or leave --model out)")
    values["model"] = kind
    positions = kw.pop("block_size")
    kw.pop("dropout", None)  # a training setting, not the architecture
    for key, value in kw.items():
        if key not in MODEL_KEYS[kind]:
            continue
        if key in given and values.get(key) is not None and values[key] != value:
            raise error(f"{key}={values[key]!r}, but init_from={path!r} has {key}={value!r} (its config.json): "
                        f"the weights fix the architecture; drop {key}")
        values[key] = value
    if "block_size" in given:
        if values["block_size"] > positions:
            raise error(f"block_size={values['block_size']}: longer than the {positions} positions of the model "
                        f"in init_from={path!r}; use --block-size {positions} or less")
    else:
        values["block_size"] = min(default_block_size, positions)
    return values


def build_model(cfg, device, shard_fn):
    """The model TrainConfig ``cfg`` names, sharded by ``shard_fn(model)``: initialised from ``cfg.seed``, or with
    ``cfg.init_from`` streamed from its safetensors straight into the shards (``from_pretrained(shard_fn=)``)."""
    import hpcfsdp as hp

    config = model_config(cfg)
    cls, _ = _classes(cfg.model)
    if not cfg.init_from:
        hp.manual_seed(cfg.seed)
        model = cls(config)
        model = model.to(device) if device != "cpu" else model
        shard_fn(model)
        return model
    model = cls.from_pretrained(cfg.init_from, device=device, shard_fn=shard_fn, dropout=cfg.dropout)
    mine = dataclasses.asdict(config)
    for key, value in dataclasses.asdict(model.config).items():
        if key == "block_size" and value >= cfg.block_size or key == "dropout":
            continue
        if mine.get(key) != value:
            raise ValueError(f"init_from={cfg.init_from!r}: its config.json has {key}={value!r}, the training "
                             f"configuration {key}={mine.get(key)!r}")
    return model
