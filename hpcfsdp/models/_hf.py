"""Hugging Face layout in and out: config.json + safetensors (single or sharded), read slice by slice."""
import json
import os

import numpy as np

from hpcfsdp._files import honour_umask

__all__ = ["HFCheckpoint", "read_config", "load_weights", "save_weights", "from_pretrained"]

_CKPT_PREFIX = "_checkpoint_wrapped_module."

# [Note: Loading straight into shards]
# A sharded model's parameter is a DTensor whose local piece covers, per tensor dimension, the
# torch.chunk piece of each mesh dimension that shards it (nested in mesh order; FSDP shards dim 0).
# `load_weights` computes those bounds from the DTensor's public placements and mesh coordinate and
# asks safetensors for exactly that slice (one per box when the piece is several ranges, as a fused q/k/v
# weight split by heads) (`safe_open(...).get_slice(name)[a:b, c:d]`), which reads
# only those bytes from the memory-mapped file. So `from_pretrained(path, shard_fn=...)` builds the
# model on the meta device, lets `shard_fn` apply fully_shard, allocates only the local shards
# (`to_empty`) and fills them: no rank ever holds the whole model. A tensor stored transposed in the
# file (GPT-2's Conv1D weights are (in, out) where Linear keeps (out, in)) is read with the bounds
# swapped and transposed locally.


class HFCheckpoint:
    """The safetensors file(s) of a Hugging Face directory: ``model.safetensors`` or an index of shards."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: expected a 'weight_map' object mapping tensor names to files")
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
            weight_map = None
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json (only safetensors "
                                    f"weights are read; pickled .bin files are refused)")
        self._handles = {fn: safe_open(os.path.join(path, fn), framework="np") for fn in files}
        if weight_map is None:
            weight_map = {k: "model.safetensors" for k in self._handles["model.safetensors"].keys()}
        self.weight_map = weight_map

    def keys(self):
        return list(self.weight_map)

    def __contains__(self, name):
        return name in self.weight_map

    def shape(self, name):
        return tuple(self._handles[self.weight_map[name]].get_slice(name).get_shape())

    def read(self, name, bounds=None):
        """The tensor ``name``, or its [a, b) piece per dimension, as a NumPy array (only those bytes are read)."""
        sl = self._handles[self.weight_map[name]].get_slice(name)
        dt = sl.get_dtype()
        if dt == "BF16":  # NumPy has no bfloat16: map the file's bytes as ml_dtypes.bfloat16
            return self._read_bf16(name, bounds)
        if dt not in ("F64", "F32", "F16"):
            raise TypeError(f"{self.path}: tensor {name} has dtype {dt}; hpcfsdp reads F64, F32, F16 and BF16 "
                            f"safetensors")
        if bounds is None:
            bounds = [(0, s) for s in sl.get_shape()]
        if not bounds:
            return np.asarray(sl[...])
        return np.asarray(sl[tuple(slice(a, b) for a, b in bounds)])


    def _read_bf16(self, name, bounds):
        """A bfloat16 tensor (or piece) through a memory map of its bytes: the safetensors header (8-byte
        length, then JSON with each tensor's dtype, shape and byte offsets) locates it."""
        import ml_dtypes

        fn = os.path.join(self.path, self.weight_map[name])
        with open(fn, "rb") as f:
            (length,) = np.frombuffer(f.read(8), "<u8")
            entry = json.loads(f.read(int(length)))[name]
        start, stop = entry["data_offsets"]
        shape = tuple(entry["shape"])
        whole = np.memmap(fn, dtype=ml_dtypes.bfloat16, mode="r", offset=8 + int(length) + start, shape=shape)
        assert whole.nbytes == stop - start, (name, whole.nbytes, stop - start)
        if bounds is None or not shape:
            return np.array(whole)
        return np.array(whole[tuple(slice(a, b) for a, b in bounds)])


def read_config(path) -> dict:
    fn = os.path.join(path, "config.json")
    if not os.path.exists(fn):
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory)")
    with open(fn) as f:
        return json.load(f)


def _local_boxes(p):
    """[(global offsets, lengths, local offsets)] of the boxes of this rank's piece of parameter ``p`` (one box,
    the whole tensor, for a plain tensor; several for a fused q/k/v weight split by heads)."""
    from hpcfsdp.distributed.tensor import DTensor
    from hpcfsdp.distributed.tensor._dtensor import _local_boxes as boxes
    from hpcfsdp.distributed.tensor._dtensor import _local_ranges

    if not isinstance(p, DTensor):
        return [((0,) * p.ndim, tuple(int(s) for s in p.shape), (0,) * p.ndim)]
    mesh = p.device_mesh
    return boxes(_local_ranges(p.shape, mesh, p.placements, mesh.get_coordinate()))


def _local_array(p):
    from hpcfsdp.distributed.tensor import DTensor

    return p.to_local()._data if isinstance(p, DTensor) else p._data


def load_weights(model, path, name_map, transposed=lambda key: False):
    """Fill every parameter of ``model`` (sharded or not) from the safetensors under ``path``.

    ``name_map(our_name) -> list of candidate file names`` (the first present is read); parameters for
    which ``transposed(our_name)`` is true are stored (in, out) in the file. Buffers are not read.
    A missing tensor or a shape mismatch is an error. Returns (names read, the HFCheckpoint).
    """
    from hpcfsdp import _backend

    ckpt = HFCheckpoint(path)
    used = set()
    for ours, p in model.named_parameters():
        key = ours.replace(_CKPT_PREFIX, "")
        cands = name_map(key)
        name = next((c for c in cands if c in ckpt), None)
        if name is None:
            raise KeyError(f"{path}: no tensor for parameter {key!r} (looked for {cands})")
        used.add(name)
        fshape = ckpt.shape(name)
        t = bool(transposed(key))
        want = tuple(int(s) for s in p.shape)
        if (fshape[::-1] if t else fshape) != want:
            raise ValueError(f"{path}: tensor {name} has shape {fshape}{' (stored transposed)' if t else ''}, "
                             f"parameter {key} expects {want}")
        dst = _local_array(p)
        if _backend.is_meta_array(dst):
            raise RuntimeError(f"parameter {key} is on the meta device; call to_empty() before loading")
        xp = _backend.array_module(dst)
        for goff, lens, loff in _local_boxes(p):
            b = [(o, o + n) for o, n in zip(goff, lens)]
            piece = ckpt.read(name, b[::-1] if t else b)
            if t:
                piece = piece.T
            dst[tuple(slice(o, o + n) for o, n in zip(loff, lens))] = xp.asarray(piece.astype(dst.dtype, copy=False))
    return used, ckpt


def _full_array(p):
    from hpcfsdp.distributed.tensor import DTensor

    t = p.full_tensor() if isinstance(p, DTensor) else p  # collective for DTensors: every rank calls it
    return np.ascontiguousarray(np.asarray(t.detach()._data.get() if hasattr(t._data, "get") else t._data))


def save_weights(model, path, name_map, transposed=lambda key: False, config=None, metadata=None):
    """Write the parameters under their Hugging Face names (``name_map(our_name)``) to ``path/model.safetensors``
    plus ``config.json``. Collective on sharded models (every rank must call it); rank 0 writes."""
    from safetensors.numpy import save_file

    import hpcfsdp.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    tensors = {}
    for ours, p in model.named_parameters():
        key = ours.replace(_CKPT_PREFIX, "")
        arr = _full_array(p)
        tensors[name_map(key)[0]] = np.ascontiguousarray(arr.T) if transposed(key) else arr
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt", **(metadata or {})})
        honour_umask(os.path.join(path, "model.safetensors"))
        if config is not None:
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(config, f, indent=2, sort_keys=True)
                f.write("\n")
    return tensors


def from_pretrained(cls, config, path, name_map, transposed=lambda key: False, *, device=None, dtype=None,
                    shard_fn=None):
    """Build ``cls(config)`` on the meta device, shard it with ``shard_fn`` (if any), allocate and fill it."""
    import hpcfsdp as hp

    with hp.device("meta"):
        model = cls(config, dtype=dtype)
    if shard_fn is not None:
        shard_fn(model)
    model.to_empty(device=device or "cpu")
    used, ckpt = load_weights(model, path, name_map, transposed)
    return model, used, ckpt


# ---------------------------------------------------------------------------------------------------- GPT-2
_GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}
_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2_config(hf: dict, **overrides) -> dict:
    """GPTConfig's arguments for a GPT-2 config.json; features hpcfsdp's GPT cannot represent are refused."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"GPT.from_pretrained expects a GPT-2 model (model_type 'gpt2'), got {hf.get('model_type')!r}")
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_GELU:
        raise ValueError(f"GPT-2 activation_function {act!r} is not supported; expected one of {sorted(_GPT2_GELU)}")
    n_embd = hf.get("n_embd", 768)
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise ValueError(f"GPT-2 n_inner={hf['n_inner']}: hpcfsdp's GPT has an MLP of width 4 * n_embd = {4 * n_embd}")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise ValueError(f"GPT-2 {key}={hf[key]} is not supported (only {ok})")
    kw = dict(vocab_size=hf.get("vocab_size", 50257), block_size=hf.get("n_positions", 1024),
              n_layer=hf.get("n_layer", 12), n_head=hf.get("n_head", 12), n_embd=n_embd, dropout=0.0, bias=True,
              tie_weights=hf.get("tie_word_embeddings", True), gelu_approximate=_GPT2_GELU[act],
              layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5))
    kw.update(overrides)
    return kw


def gpt2_hf_config(c) -> dict:
    if not c.bias:
        raise ValueError("save_pretrained: GPT-2 has biases in every Linear and LayerNorm; this GPT has bias=False")
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c.vocab_size,
            "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head,
            "n_inner": None, "activation_function": "gelu_new" if c.gelu_approximate == "tanh" else "gelu",
            "layer_norm_epsilon": c.layer_norm_eps, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
            "attn_pdrop": c.dropout, "tie_word_embeddings": c.tie_weights, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "add_cross_attention": False,
            "initializer_range": 0.02, "use_cache": True, "dtype": "float32"}


def gpt2_names(key):
    """hpcfsdp GPT names are GPT-2's (``transformer.h.0.attn.c_attn.weight``); some files drop ``transformer.``."""
    if key == "lm_head.weight":
        return ["lm_head.weight"]
    return [key, key[len("transformer."):]] if key.startswith("transformer.") else [key]


def gpt2_transposed(key):
    """GPT-2 keeps these Linear weights as Conv1D (in, out) matrices."""
    return key.endswith(_GPT2_CONV1D)


GPT2_IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older files carry


# ---------------------------------------------------------------------------------------------------- Llama
def llama_config(hf: dict, **overrides) -> dict:
    """LlamaConfig's arguments for a Llama config.json; features hpcfsdp's Llama cannot represent are refused."""
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(f"Llama.from_pretrained expects model_type 'llama', got {hf.get('model_type')!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Llama hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    rope_type = rope.get("rope_type", (scaling or {}).get("rope_type", "default"))
    if rope_type != "default" or scaling not in (None, {}) and scaling.get("rope_type", "default") != "default":
        raise ValueError(f"Llama rope type {rope_type!r} / rope_scaling {scaling!r}: only the default rotary "
                         f"embedding is supported")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    attn_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    if attn_bias != mlp_bias:
        raise ValueError(f"Llama attention_bias={attn_bias} with mlp_bias={mlp_bias}: hpcfsdp's Llama has one bias flag")
    if hf.get("pretraining_tp", 1) != 1:
        raise ValueError("Llama pretraining_tp != 1 is not supported")
    kw = dict(vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 2048),
              n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
              n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"], n_embd=hf["hidden_size"],
              intermediate_size=hf["intermediate_size"], head_dim=hf.get("head_dim"),
              rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
              dropout=float(hf.get("attention_dropout", 0.0)), bias=attn_bias,
              tie_weights=hf.get("tie_word_embeddings", False), init_std=hf.get("initializer_range", 0.02))
    kw.update(overrides)
    return kw


def llama_hf_config(c) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
            "max_position_embeddings": c.block_size, "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "hidden_size": c.n_embd,
            "intermediate_size": c.intermediate_size, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta}, "rope_theta": c.rope_theta,
            "attention_bias": c.bias, "mlp_bias": c.bias, "attention_dropout": c.dropout, "hidden_act": "silu",
            "tie_word_embeddings": c.tie_weights, "initializer_range": c.init_std, "pretraining_tp": 1,
            "use_cache": True, "dtype": "float32"}


def llama_names(key):
    return [key]


def check_unused(ckpt, used, model_kind, tied_to=None, ignored=()):
    """Tensors in the file that no parameter read are an error (a silent partial load is worse)."""
    extra = [k for k in ckpt.keys() if k not in used and not k.endswith(ignored)]
    if tied_to is not None:
        extra = [k for k in extra if k != "lm_head.weight"]  # a tied head may be stored as well
    if extra:
        raise ValueError(f"{ckpt.path}: tensors not used by the {model_kind}: {extra[:8]}"
                         f"{' ...' if len(extra) > 8 else ''}")
