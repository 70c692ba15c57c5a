"""Catalogue of misuse across the API and the CLI (serial, world size 1): every case raises the documented
exception type with a message naming the bad value and what was expected; none hangs or kills the process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp import nn
from hpcfsdp.cli.main import main as hpcfsdp_main
from hpcfsdp.data import ByteTokenizer, DistributedSampler, TokenDataset
from hpcfsdp.distributed.checkpoint import _format
from hpcfsdp.distributed.fsdp import (
    FSDP,
    BackwardPrefetch,
    DataParallelMeshDims,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp
from hpcfsdp.models import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Ctx:
    """What a case may use: a temporary directory and pytest's monkeypatch."""

    def __init__(self, tmp_path, monkeypatch):
        self.d, self.mp = tmp_path, monkeypatch

    def path(self, *parts):
        return os.path.join(self.d, *parts)


def _cupy_as(c, importable: bool):
    """Probe CuPy afresh as if it were not installed, or (importable) installed on a machine without a GPU."""
    from hpcfsdp import _backend

    c.mp.setattr(_backend, "_cupy_checked", False)
    c.mp.setattr(_backend, "_cupy", None)
    c.mp.setattr(_backend, "_cupy_missing", "")
    if importable:
        c.mp.setattr(_backend, "_cupy_sees_gpu", lambda cupy: False)
    else:
        c.mp.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError


def _two_linear():
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))


def _sharded():
    m = _two_linear()
    fully_shard(m)
    return m


def _mesh(shape, names=None):
    return dist.init_device_mesh("cpu", shape, mesh_dim_names=names)


def _self_group():
    from mpi4py import MPI

    return ProcessGroup(MPI.COMM_SELF)


def _readonly():
    a = np.ones(4)
    a.flags.writeable = False
    return a


def _write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
    return path


def _saved_linear(c):
    d = c.path("ck")
    dcp.save({"model": nn.Linear(2, 3).state_dict(), "step": 3}, checkpoint_id=d)
    return d


def _future_version(c):
    d = c.path("fut")
    dcp.save({"x": hp.ones(2)}, checkpoint_id=d)
    meta = os.path.join(os.path.realpath(d), "metadata.json")
    with open(meta) as f:
        md = json.load(f)
    md["version"] = 99
    with open(meta, "w") as f:
        json.dump(md, f)
    return _format.read_metadata(d)


def _not_a_checkpoint(c):
    os.makedirs(c.path("notckpt"))
    _write(c.path("notckpt", "notes.txt"), b"hello")
    return c.path("notckpt")


def _env(c, name, value, fn):
    c.mp.setenv(name, value)
    return fn()


# (id, callable(ctx), exception type, message fragment)
CASES = [
    # validations added after the first catalogue run
    ("arange-zero-step", lambda c: hp.arange(0, 10, 0), ValueError, "step must be nonzero"),
    ("randint-empty-range", lambda c: hp.randint(5, 2, (3,)), ValueError, "expected low < high, got low=5 and high=2"),
    ("masked-fill-shape", lambda c: hp.ones(2, 3).masked_fill(hp.ones(4, dtype=hp.bool), 0.0), RuntimeError,
     "does not broadcast to the tensor's shape (2, 3)"),
    ("adam-lr-type", lambda c: hp.optim.Adam([hp.nn.Parameter(hp.ones(2))], lr="x"), TypeError,
     "lr must be a number, got 'x'"),
    ("lambda-lr-not-callable", lambda c: hp.optim.lr_scheduler.LambdaLR(
        hp.optim.SGD([hp.nn.Parameter(hp.ones(2))], lr=0.1), lr_lambda=3), TypeError, "lr_lambda must be a callable"),
    ("clip-norm-type", lambda c: hp.nn.utils.clip_grad_norm_([hp.nn.Parameter(hp.ones(2))], 1.0, norm_type="fro"),
     ValueError, "norm_type must be a number"),
    # -- tensors
    ("add-shape-mismatch", lambda c: hp.ones(2, 3) + hp.ones(4, 5), RuntimeError,
     "shapes of the operands (2, 3) and (4, 5) do not broadcast"),
    ("matmul-shape-mismatch", lambda c: hp.ones(2, 3) @ hp.ones(4, 5), RuntimeError,
     "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
    ("reshape-size", lambda c: hp.ones(2, 3).reshape(4, 2), RuntimeError,
     "shape '[4, 2]' is invalid for input of size 6"),
    ("unknown-dtype", lambda c: hp.zeros(2, dtype="float128x"), TypeError, "unknown dtype 'float128x'; expected one of"),
    ("unsupported-dtype", lambda c: hp.tensor([1.0], dtype=object), TypeError, "unsupported dtype object"),
    ("unknown-device", lambda c: hp.zeros(2, device="tpu"), ValueError,
     "unknown device 'tpu'; expected 'cpu', 'cuda', 'cuda:N' or 'meta'"),
    ("bad-device-index", lambda c: hp.device("cuda:x"), ValueError, "bad device index in 'cuda:x'"),
    ("cuda-without-cupy", lambda c: (_cupy_as(c, False), hp.zeros(2, device="cuda")), RuntimeError,
     "device 'cuda' needs CuPy, which is not importable"),
    ("cuda-without-gpu", lambda c: (_cupy_as(c, True), hp.zeros(2, device="cuda")), RuntimeError,
     "device 'cuda' needs a CUDA GPU: CuPy 14"),
    ("negative-dimension", lambda c: hp.randn(-1), RuntimeError, "negative dimension -1"),
    ("dim-out-of-range", lambda c: hp.ones(2, 3).transpose(0, 5), IndexError,
     "expected to be in range of [-2, 1], but got 5"),
    ("cat-empty", lambda c: hp.cat([]), RuntimeError, "cat(): expected a non-empty list of Tensors"),
    ("stack-mismatch", lambda c: hp.stack([hp.ones(2), hp.ones(3)]), RuntimeError,
     "stack expects each tensor to be equal size, but got (2,) and (3,)"),
    ("item-of-many", lambda c: hp.ones(3).item(), RuntimeError, "a Tensor with 3 elements cannot be converted to Scalar"),
    ("int-requires-grad", lambda c: hp.ones(2, dtype=hp.int64, requires_grad=True), RuntimeError,
     "only Tensors of floating point dtype can require gradients, got int64"),
    ("numpy-of-grad-tensor", lambda c: hp.ones(2, requires_grad=True).numpy(), RuntimeError,
     "Use tensor.detach().numpy() instead"),
    # -- autograd
    ("backward-non-scalar", lambda c: (hp.ones(2, 3, requires_grad=True) * 2).backward(), RuntimeError,
     "grad can be implicitly created only for scalar outputs"),
    ("backward-without-grad", lambda c: hp.ones(2).sum().backward(), RuntimeError,
     "does not require grad and does not have a grad_fn"),
    ("backward-gradient-shape", lambda c: (hp.ones(2, requires_grad=True) * 2).backward(hp.ones(3)), RuntimeError,
     "grad_output[0] has shape (3,) and output[0] has shape (2,)"),
    ("hook-on-no-grad-tensor", lambda c: hp.ones(2).register_hook(lambda g: g), RuntimeError,
     "cannot register a hook on a tensor that doesn't require gradient"),
    ("inplace-on-leaf", lambda c: hp.ones(2, requires_grad=True).add_(1), RuntimeError,
     "a leaf Variable that requires grad is being used in an in-place operation"),
    ("queue-callback-outside-backward", lambda c: hp.autograd.engine.queue_callback(lambda: None), RuntimeError,
     "queue_callback can only be called during the backward pass"),
    # -- nn
    ("load-state-dict-missing", lambda c: nn.Linear(2, 3).load_state_dict({"weight": hp.ones(3, 2)}), RuntimeError,
     'Missing key(s) in state_dict: "bias"'),
    ("load-state-dict-unexpected", lambda c: nn.Linear(2, 3).load_state_dict(
        {"weight": hp.ones(3, 2), "bias": hp.ones(3), "foo": hp.ones(1)}), RuntimeError,
     'Unexpected key(s) in state_dict: "foo"'),
    ("load-state-dict-shape", lambda c: nn.Linear(2, 3).load_state_dict({"weight": hp.ones(2, 2), "bias": hp.ones(3)}),
     RuntimeError, "size mismatch for weight: copying a param with shape (2, 2) from checkpoint, the shape in "
     "current model is (3, 2)"),
    ("linear-input-width", lambda c: nn.Linear(3, 4)(hp.ones(2, 5)), RuntimeError, "(2x5 and 3x4)"),
    ("embedding-index", lambda c: nn.Embedding(5, 3)(hp.tensor([7])), IndexError, "index 7 out of range for 5 rows"),
    ("dropout-p", lambda c: nn.Dropout(1.5), ValueError, "dropout probability has to be between 0 and 1, but got 1.5"),
    ("cross-entropy-reduction", lambda c: nn.functional.cross_entropy(hp.ones(2, 3), hp.tensor([0, 1]),
                                                                      reduction="avg"), ValueError,
     "reduction must be one of ('mean', 'sum', 'none'), got 'avg'"),
    ("cross-entropy-target-shape", lambda c: nn.functional.cross_entropy(hp.ones(2, 3), hp.tensor([0, 1, 2])),
     ValueError, "expected target of shape (2,) for input of shape (2, 3), got (3,)"),
    ("layer-norm-shape", lambda c: nn.LayerNorm(4)(hp.ones(2, 3)), RuntimeError,
     "given normalized_shape=[4], expected input with shape [*, 4], but got input of size [2, 3]"),
    ("parameter-assignment", lambda c: setattr(nn.Linear(2, 2), "weight", hp.ones(2, 2)), TypeError,
     "cannot assign 'Tensor' as parameter 'weight'"),
    ("buffer-type", lambda c: nn.Module().register_buffer("x", 3), TypeError, "cannot assign 'int' object to buffer 'x'"),
    ("gpt-config-heads", lambda c: GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=3, n_embd=16), ValueError,
     "n_embd (16) must be divisible by n_head (3)"),
    ("gpt-too-long", lambda c: GPT(GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=2, n_embd=8))(
        hp.zeros(1, 9, dtype=hp.int64)), ValueError, "Cannot forward sequence of length 9, block size is only 4"),
    # -- optim
    ("sgd-lr", lambda c: hp.optim.SGD(nn.Linear(2, 2).parameters(), lr=-1), ValueError, "Invalid learning rate: -1"),
    ("sgd-nesterov", lambda c: hp.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, nesterov=True), ValueError,
     "Nesterov momentum requires a momentum and zero dampening"),
    ("adam-betas", lambda c: hp.optim.Adam(nn.Linear(2, 2).parameters(), betas=(1.5, 0.9)), ValueError,
     "Invalid beta parameter at index 0: 1.5"),
    ("adam-eps", lambda c: hp.optim.Adam(nn.Linear(2, 2).parameters(), eps=-1), ValueError, "Invalid epsilon value: -1"),
    ("adamw-weight-decay", lambda c: hp.optim.AdamW(nn.Linear(2, 2).parameters(), weight_decay=-1), ValueError,
     "Invalid weight_decay value: -1"),
    ("optimizer-empty", lambda c: hp.optim.Adam([]), ValueError, "optimizer got an empty parameter list"),
    ("optimizer-state-groups", lambda c: hp.optim.Adam(nn.Linear(2, 2).parameters()).load_state_dict(
        {"state": {}, "param_groups": []}), ValueError, "different number of parameter groups"),
    ("cosine-t-max", lambda c: hp.optim.lr_scheduler.CosineAnnealingLR(
        hp.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), T_max=0), ValueError,
     "T_max must be a positive number of steps, got 0"),
    # -- data
    ("data-short-file", lambda c: TokenDataset(_write(c.path("short.bin"), b"\x01\x00\x02\x00"), block_size=8),
     ValueError, "holds 2 tokens; block_size=8 needs at least 9"),
    ("data-odd-file", lambda c: TokenDataset(_write(c.path("odd.bin"), b"\x01\x00\x02"), block_size=1), ValueError,
     "has 3 bytes, not a multiple of 2: not a uint16 token file (wrong dtype?)"),
    ("data-bad-dtype", lambda c: TokenDataset(np.arange(100), block_size=8, dtype=np.float32), TypeError,
     "token dtype must be numpy.uint16 or numpy.uint32, got float32"),
    ("data-block-size", lambda c: TokenDataset(np.arange(100), block_size=0), ValueError,
     "block_size must be a positive int, got 0"),
    ("data-2d-tokens", lambda c: TokenDataset(np.zeros((3, 3), np.int64), block_size=1), TypeError,
     "tokens must be a 1-D integer array, got 2-D int64"),
    ("sampler-rank", lambda c: DistributedSampler(10, num_replicas=2, rank=3), ValueError,
     "Invalid rank 3, rank should be in the interval [0, 1]"),
    ("decode-token-id", lambda c: ByteTokenizer().decode([300]), ValueError, "token ids in [0, 256), got 300"),
    # -- checkpoint
    ("checkpoint-not-a-dir", lambda c: _format.read_metadata(_not_a_checkpoint(c)), ValueError,
     "is not a checkpoint directory (no metadata.json)"),
    ("checkpoint-missing", lambda c: dcp.load({"x": hp.ones(2)}, checkpoint_id=c.path("nope")), ValueError,
     "nope' does not exist"),
    ("checkpoint-future-version", _future_version, ValueError,
     "checkpoint format version 99 is newer than this hpcfsdp supports (1); upgrade hpcfsdp"),
    ("checkpoint-shape-mismatch", lambda c: dcp.load({"model": {"weight": hp.ones(4, 2), "bias": hp.ones(3)}},
                                                     checkpoint_id=_saved_linear(c)), ValueError,
     "entry 'model.weight': requested global shape (4, 2) dtype float32, but the checkpoint has shape (3, 2)"),
    ("checkpoint-dtype-mismatch", lambda c: dcp.load(
        {"model": {"weight": hp.ones(3, 2, dtype=hp.float64), "bias": hp.ones(3)}}, checkpoint_id=_saved_linear(c)),
     ValueError, "dtype float64, but the checkpoint has shape (3, 2) dtype float32"),
    ("checkpoint-missing-entry", lambda c: dcp.load({"model": {"extra": hp.ones(1)}}, checkpoint_id=_saved_linear(c)),
     ValueError, "entries missing from checkpoint"),
    ("checkpoint-save-not-dict", lambda c: dcp.save([1], checkpoint_id=c.path("a")), TypeError,
     "save expects a dict state_dict, got list"),
    ("checkpoint-save-object", lambda c: dcp.save({"x": object()}, checkpoint_id=c.path("b")), TypeError,
     "cannot save object at 'x': checkpoints hold tensors and JSON values"),
    ("checkpoint-refuses-clobber", lambda c: dcp.save({"x": hp.ones(1)}, checkpoint_id=_not_a_checkpoint(c)),
     ValueError, "exists and is not a checkpoint directory; refusing to replace it"),
    ("state-dict-options-type", lambda c: dcp.get_model_state_dict(_sharded(), options={"full_state_dict": True}),
     TypeError, "options must be a StateDictOptions, got dict"),
    # -- FSDP2 (fully_shard)
    ("fully-shard-empty-list", lambda c: fully_shard([]), ValueError, "fully_shard expects at least one module"),
    ("fully-shard-module-twice", lambda c: (lambda m: fully_shard([m, m]))(nn.Linear(2, 2)), ValueError,
     "fully_shard cannot receive the same module twice"),
    ("fully-shard-already-applied", lambda c: fully_shard(_sharded()), AssertionError,
     "can only be applied to a module once. fully_shard has already been applied to the following module"),
    ("fully-shard-not-module", lambda c: fully_shard(3), ValueError, "fully_shard expects an nn.Module, got int"),
    ("fully-shard-reshard-after-forward", lambda c: fully_shard(nn.Linear(2, 2), reshard_after_forward="yes"),
     ValueError, "reshard_after_forward should be a bool or an int representing the group size to reshard to, "
     "not 'yes'"),
    ("fully-shard-reshard-factor", lambda c: fully_shard(nn.Linear(2, 2), reshard_after_forward=3), ValueError,
     "it should be a factor of 1, not 3"),
    ("fully-shard-mp-policy-type", lambda c: fully_shard(nn.Linear(2, 2), mp_policy="bf16"), TypeError,
     "mp_policy must be a MixedPrecisionPolicy, got str"),
    ("fully-shard-offload-type", lambda c: fully_shard(nn.Linear(2, 2), offload_policy=True), TypeError,
     "offload_policy must be an OffloadPolicy, got bool"),
    ("fully-shard-mesh-type", lambda c: fully_shard(nn.Linear(2, 2), mesh="shard"), ValueError,
     "fully_shard expects a DeviceMesh for mesh=, got str"),
    ("fully-shard-3d-mesh", lambda c: fully_shard(nn.Linear(2, 2), mesh=_mesh((1, 1, 1))), ValueError,
     "fully_shard expects a 1D mesh (shard) or a 2D mesh (replicate, shard), got a 3D mesh"),
    ("max-input-buffers-value", lambda c: _sharded().set_reduce_scatter_max_input_buffers(0), ValueError,
     "max_input_buffers must be a positive int, got 0"),
    ("max-input-buffers-type", lambda c: _sharded().set_reduce_scatter_max_input_buffers(1.5), TypeError,
     "max_input_buffers must be an int, got float"),
    ("forward-prefetch-target", lambda c: _sharded().set_modules_to_forward_prefetch([nn.Linear(2, 2)]), TypeError,
     "prefetch targets must be modules managed by fully_shard, got Linear"),
    ("backward-prefetch-target", lambda c: _sharded().set_modules_to_backward_prefetch([nn.Linear(2, 2)]), TypeError,
     "prefetch targets must be modules managed by fully_shard, got Linear"),
    ("gradient-divide-factor", lambda c: _sharded().set_gradient_divide_factor(0), ValueError,
     "gradient divide factor must be a positive number, got 0"),
    ("custom-all-gather-type", lambda c: _sharded().set_custom_all_gather(3), TypeError,
     "custom all-gather must be an AllGather, got int"),
    ("dp-mesh-dims-empty", lambda c: DataParallelMeshDims(), ValueError,
     "at least one data-parallel mesh dimension is required"),
    ("dp-mesh-dims-unknown-dim", lambda c: fully_shard(nn.Linear(2, 2), mesh=_mesh((1,), ("dp",)),
                                                       dp_mesh_dims=DataParallelMeshDims(shard="foo")), ValueError,
     "dp_mesh_dims names mesh dim 'foo', but the mesh has dims ('dp',)"),
    ("dp-mesh-dims-overlap", lambda c: fully_shard(nn.Linear(2, 2), mesh=_mesh((1,), ("dp",)),
                                                   dp_mesh_dims=DataParallelMeshDims(shard="dp", replicate="dp")),
     ValueError, "mesh dims ['dp'] are named as both shard and replicate dims"),
    ("dp-mesh-dims-type", lambda c: fully_shard(nn.Linear(2, 2), mesh=_mesh((1,), ("dp",)),
                                                dp_mesh_dims={"shard": "dp"}), TypeError,
     "dp_mesh_dims must be a DataParallelMeshDims, got dict"),
    # -- FSDP1
    ("fsdp1-strategy-type", lambda c: FSDP(_two_linear(), sharding_strategy="FULL_SHARD"), TypeError,
     "sharding_strategy must be a ShardingStrategy, got 'FULL_SHARD'"),
    ("fsdp1-mixed-precision-type", lambda c: FSDP(_two_linear(), mixed_precision=MixedPrecisionPolicy()), TypeError,
     "mixed_precision must be a MixedPrecision, got MixedPrecisionPolicy"),
    ("fsdp1-cpu-offload-type", lambda c: FSDP(_two_linear(), cpu_offload=True), TypeError,
     "cpu_offload must be a CPUOffload, got bool"),
    ("fsdp1-backward-prefetch-type", lambda c: FSDP(_two_linear(), backward_prefetch="pre"), TypeError,
     "backward_prefetch must be a BackwardPrefetch or None, got 'pre'"),
    ("fsdp1-strategy-vs-2d-mesh", lambda c: FSDP(_two_linear(), sharding_strategy=ShardingStrategy.FULL_SHARD,
                                                 device_mesh=_mesh((1, 1), ("r", "s"))), ValueError,
     "FULL_SHARD needs a 1-D device_mesh, got a 2-D mesh of shape (1, 1); use HYBRID_SHARD"),
    ("fsdp1-hybrid-vs-1d-mesh", lambda c: FSDP(_two_linear(), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                                               device_mesh=_mesh((1,))), ValueError,
     "HYBRID_SHARD needs a 2-D (replicate, shard) device_mesh, got a 1-D mesh of shape (1,)"),
    ("fsdp1-already-managed", lambda c: FSDP(_sharded()), RuntimeError,
     "module is already managed by fully_shard / FullyShardedDataParallel"),
    ("fsdp1-state-dict-type", lambda c: FSDP.set_state_dict_type(FSDP(_two_linear()), "full"), TypeError,
     "state_dict_type must be a StateDictType, got 'full'"),
    ("fsdp1-mixed-precision-ok-type-only", lambda c: FSDP(_two_linear(), mixed_precision=MixedPrecision,
                                                          backward_prefetch=BackwardPrefetch.BACKWARD_PRE), TypeError,
     "mixed_precision must be a MixedPrecision, got type"),
    # -- device mesh
    ("mesh-shape-vs-world", lambda c: _mesh((2, 3)), ValueError,
     "mesh_shape=(2, 3) has 6 ranks but the world size is 1"),
    ("mesh-shape-nonpositive", lambda c: _mesh((0,)), ValueError, "mesh_shape=(0,): expected positive integers"),
    ("mesh-device-type", lambda c: dist.init_device_mesh("tpu", (1,)), ValueError,
     "device_type='tpu': expected 'cpu' or 'cuda'"),
    ("mesh-names-count", lambda c: _mesh((1,), ("a", "b")), ValueError,
     "mesh_dim_names=('a', 'b') has 2 names for a 1-d mesh"),
    ("mesh-names-duplicate", lambda c: _mesh((1, 1), ("a", "a")), ValueError, "duplicate names ['a']"),
    ("mesh-unknown-dim-name", lambda c: _mesh((1,), ("a",))["b"], KeyError,
     "mesh dimension 'b' not found; this mesh's dimensions are ('a',)"),
    ("mesh-dim-index", lambda c: _mesh((1,), ("a",)).get_group(3), IndexError, "mesh_dim=3 out of range for a 1-d mesh"),
    ("mesh-cuda-without-cupy", lambda c: (_cupy_as(c, False), dist.init_device_mesh("cuda", (1,))), RuntimeError,
     "init_device_mesh('cuda', ...): device 'cuda' needs CuPy"),
    ("mesh-cuda-without-gpu", lambda c: (_cupy_as(c, True), dist.init_device_mesh("cuda", (1,))), RuntimeError,
     "init_device_mesh('cuda', ...): device 'cuda' needs a CUDA GPU"),
    # -- distributed
    ("reduce-op", lambda c: dist.all_reduce(hp.ones(2), op="XOR"), ValueError,
     "op='XOR': expected a ReduceOp (SUM, AVG, MAX, MIN, PRODUCT)"),
    ("avg-of-bools", lambda c: _self_group().all_reduce_(np.ones(2, bool), ReduceOp.AVG), TypeError,
     "op=ReduceOp.AVG is not defined for bool arrays"),
    ("new-group-rank-outside", lambda c: dist.new_group([0, 5]), ValueError,
     "new_group: rank 5 is outside the world of 1 ranks (0..0)"),
    ("broadcast-src-outside", lambda c: dist.broadcast(hp.ones(2), src=3), ValueError,
     "broadcast: src=3 is not a rank of"),
    ("all-gather-list-length", lambda c: dist.all_gather([hp.ones(2), hp.ones(2)], hp.ones(2)), ValueError,
     "all_gather: tensor_list has 2 entries, expected the group size 1"),
    ("all-gather-into-size", lambda c: dist.all_gather_into_tensor(hp.ones(3), hp.ones(2)), ValueError,
     "output has 3 elements, expected input size 2 x group size 1 = 2"),
    ("reduce-scatter-size", lambda c: dist.reduce_scatter_tensor(hp.ones(3), hp.ones(2)), ValueError,
     "input has 2 elements, expected output size 3 x group size 1 = 3"),
    ("collective-on-ndarray", lambda c: dist.all_reduce(np.ones(2)), TypeError,
     "all_reduce: tensor: expected a hpcfsdp Tensor, got numpy.ndarray"),
    ("collective-on-meta", lambda c: dist.all_reduce(hp.ones(2, device="meta")), RuntimeError,
     "a meta tensor has no data to communicate"),
    ("group-type", lambda c: dist.all_reduce(hp.ones(2), group="world"), TypeError,
     "group='world': expected a ProcessGroup or None"),
    ("object-without-pickle", lambda c: dist.all_gather_object([None], object()), TypeError,
     "cannot send an object of type builtins.object"),
    ("raw-readonly-output", lambda c: _self_group().all_reduce_(_readonly()), ValueError,
     "expected a writable array, got a read-only float64[4] (cpu)"),
    ("raw-dtype-mismatch", lambda c: _self_group().all_gather_into(np.ones(4), np.ones(4, np.float32)), TypeError,
     "output dtype float64 != input dtype float32"),
    ("env-debug", lambda c: _env(c, "HPCFSDP_DEBUG", "maybe", _self_group), ValueError,
     "HPCFSDP_DEBUG='maybe': expected 1/true/yes/on or 0/false/no/off"),
    ("env-timeout", lambda c: _env(c, "HPCFSDP_COMM_TIMEOUT", "soon", _self_group), ValueError,
     "HPCFSDP_COMM_TIMEOUT='soon': expected a number of seconds"),
    ("env-progress", lambda c: _env(c, "HPCFSDP_COMM_PROGRESS", "sometimes", _self_group), ValueError,
     "HPCFSDP_COMM_PROGRESS='sometimes': expected one of"),
]


@pytest.mark.parametrize("fn,exc,fragment", [pytest.param(f, e, m, id=i) for i, f, e, m in CASES])
def test_misuse_raises_clear_error(fn, exc, fragment, tmp_path, monkeypatch):
    with pytest.raises(exc) as info:
        fn(Ctx(tmp_path, monkeypatch))
    assert type(info.value) is exc, type(info.value)
    assert fragment in str(info.value), str(info.value)


def test_catalogue_is_large_and_ids_unique():
    ids = [c[0] for c in CASES] + [c[0] for c in CLI_CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


# (id, argv, exit code, fragment of stderr); argparse errors exit 2, a failed verification 1
CLI_CASES = [
    ("train-steps", ["train", "--steps", "0"], 2, "steps=0: expected a positive integer"),
    ("train-lr", ["train", "--lr", "-1"], 2, "lr=-1.0: expected a finite number >= 0"),
    ("train-batch-size-type", ["train", "--batch-size", "x"], 2, "argument --batch-size: invalid int value: 'x'"),
    ("train-heads", ["train", "--n-head", "3", "--n-embd", "16"], 2, "n_embd=16: expected a multiple of n_head=3"),
    ("train-mesh", ["train", "--mesh", "2x"], 2, "mesh='2x': expected 'N' or 'RxS' with positive integers"),
    ("train-strategy", ["train", "--strategy", "FOO"], 2, "argument --strategy: invalid choice: 'FOO'"),
    ("train-dropout", ["train", "--dropout", "2"], 2, "dropout=2.0: expected 0 <= dropout < 1"),
    ("train-grad-accum", ["train", "--grad-accum", "0"], 2, "grad_accum=0: expected a positive integer"),
    ("train-config-missing", ["train", "--config", "/nonexistent/hpcfsdp.toml"], 2, "cannot read it"),
    ("train-data-missing", ["train", "--data", "/nonexistent/tokens.bin", "--steps", "1"], 2,
     "data='/nonexistent/tokens.bin': no such file"),
    ("launch-zero-ranks", ["launch", "-n", "0", "--", "python", "-c", "1"], 2,
     "-n must be a positive number of ranks, got 0"),
    ("launch-no-command", ["launch", "-n", "2"], 2, "no command given"),
    ("launch-ranks-per-node", ["launch", "-n", "4", "--ranks-per-node", "3", "--", "python", "-c", "1"], 2,
     "--ranks-per-node 3 must divide -n 4"),
    ("checkpoint-verify-not-checkpoint", ["checkpoint", "verify", "{tmp}"], 1,
     "is not a checkpoint directory (no metadata.json)"),
    ("checkpoint-verify-missing", ["checkpoint", "verify", "{tmp}/nope"], 1, "nope' does not exist"),
    ("bench-bytes", ["bench", "comm", "--min-bytes", "1x"], 2, "'1x': expected a byte count like 1024"),
    ("unknown-command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize("argv,code,fragment", [pytest.param(a, c, m, id=i) for i, a, c, m in CLI_CASES])
def test_cli_misuse_exits_with_message(argv, code, fragment, tmp_path, capsys, monkeypatch):
    from mpi4py import MPI

    # `hpcfsdp train` leaves MPI cleanly (MPI_Finalize) after a bad configuration; in this process the other
    # cases still need MPI, so that one call is skipped here (the message and exit code are what we check).
    monkeypatch.setattr(MPI, "Finalize", lambda: None)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train" and "--data" in argv:  # gets as far as init_process_group: needs a fresh process
        p = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", *argv], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        rc, err = p.returncode, p.stderr
    else:
        try:
            rc = hpcfsdp_main(argv)
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err
    assert rc == code, (rc, err)
    assert fragment in err, err
