"""DistributedDataParallel: the module replicated on every rank, gradients averaged over the group in buckets."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._backend import array_module, device_of_array
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd import engine as _engine
from hpcfsdp.autograd.function import AccumulateGrad
from hpcfsdp.autograd.grad_mode import is_grad_enabled
from hpcfsdp.nn.modules.module import Module

__all__ = ["DistributedDataParallel"]

_MB = 1024 * 1024
_DEFAULT_BUCKET_CAP_MB = 25
_DEFAULT_FIRST_BUCKET_BYTES = 1 * _MB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES

# [Note: DDP gradient reduction]
# Buckets. The parameters that need a gradient are split at construction into buckets, in reverse
# `parameters()` order (backward produces the last layers' gradients first), one open bucket per (dtype,
# device), closed once it holds `bucket_cap_mb` (default 25 MiB; with the default the first bucket closes at
# 1 MiB, as PyTorch's first bucket, so communication starts early). A bucket may pass its cap by one
# parameter. Each bucket owns a flat buffer. PyTorch starts with one bucket and rebuilds the buckets after
# its first iteration from the order gradients arrived in; here they are fixed.
#
# One iteration. A forward with gradients enabled and `require_backward_grad_sync` (not inside `no_sync()`)
# arms the reducer. A post-accumulate-grad hook on every parameter marks it ready once backward has
# accumulated its `.grad`; the first one queues `_finalize` to run when backward ends. A bucket whose
# parameters are all ready is launched: each `.grad` is divided by the group size while it is copied into
# the bucket (PyTorch's pre-division), then one asynchronous SUM all-reduce runs on the communication thread
# while backward goes on. Buckets launch in index order on every rank (a ready bucket waits for the ones
# before it), so all ranks issue the same collectives in the same order. `_finalize` launches whatever is
# left, waits for every bucket and writes the averages back into `.grad` (in place, or with
# `gradient_as_bucket_view` by making `.grad` a view of the bucket, which the next backward accumulates
# into directly): gradients are final when `backward()` returns, as in PyTorch.
#
# Parameters without a gradient. With `find_unused_parameters=True` the forward walks the output's graph;
# parameters it does not reach are marked ready with the first hook (their slot is their current `.grad`,
# or zeros). With `static_graph=True` they are found at `_finalize`. In both cases one more all-reduce of a
# per-parameter "has a gradient" count follows the buckets: a parameter without a gradient on any rank
# keeps its `.grad` (None stays None, as in PyTorch); otherwise every rank receives the average, counting
# missing gradients as zero. With `find_unused_parameters=False` (the default) a parameter that got no
# gradient leaves its bucket unlaunched until `_finalize`, which still launches it (zeros in its slot), so no
# rank waits on a collective the others skipped; its `.grad` is left as it was and the next forward raises
# PyTorch's "Expected to have finished reduction in the prior iteration ..." RuntimeError naming it.
#
# `no_sync()`: its forwards do not arm the reducer, so their backwards only accumulate `.grad` locally; the
# first armed backward after it reduces the accumulated sums. As in PyTorch, what counts is where the
# forward ran, not the backward.


class _Bucket:
    """Parameters whose gradients travel in one all-reduce: a flat buffer and each parameter's slot in it."""

    __slots__ = ("indices", "slots", "buffer", "work")

    def __init__(self, indices: list[int], params: list):
        self.indices = indices  # positions in DistributedDataParallel._params
        self.slots = []  # (offset, numel) per parameter
        total = 0
        for i in indices:
            n = int(params[i]._data.size)
            self.slots.append((total, n))
            total += n
        a = params[indices[0]]._data
        xp = array_module(a)
        ctx = a.device if xp is not np else contextlib.nullcontext()  # a CuPy array's device is a context
        with ctx:
            self.buffer = xp.zeros(total, dtype=a.dtype)
        self.work = None


def _assign_buckets(params: list, first_cap: int, cap: int) -> list[list[int]]:
    """Indices of ``params`` per bucket; see [Note: DDP gradient reduction]."""
    open_: dict[Any, list] = {}
    closed_count: dict[Any, int] = {}
    done: list[list[int]] = []
    for i in reversed(range(len(params))):
        a = params[i]._data
        key = (a.dtype.str, device_of_array(a))
        b = open_.setdefault(key, [0, []])
        b[0] += int(a.nbytes)
        b[1].append(i)
        if b[0] >= (first_cap if closed_count.get(key, 0) == 0 else cap):
            done.append(b[1])
            closed_count[key] = closed_count.get(key, 0) + 1
            del open_[key]
    done.extend(b[1] for b in open_.values())
    done.sort(key=lambda idx: -idx[0])
    return done


def _broadcast_coalesced(group, tensors) -> None:
    """Overwrite every tensor with group rank 0's: one broadcast per (dtype, device) of their concatenation."""
    by_key: dict[Any, list] = {}
    for t in tensors:
        by_key.setdefault((t._data.dtype.str, device_of_array(t._data)), []).append(t)
    for ts in by_key.values():
        xp = array_module(ts[0]._data)
        flat = xp.concatenate([xp.ascontiguousarray(t._data).reshape(-1) for t in ts])
        group.broadcast_(flat, 0)
        if group.rank() != 0:
            o = 0
            for t in ts:
                n = int(t._data.size)
                t._data[...] = flat[o:o + n].reshape(t._data.shape)
                o += n


def _tensors_in(obj, out: list) -> list:
    """The Tensors in a forward's output (nested tuples, lists, dicts, dataclasses)."""
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    elif hasattr(obj, "__dataclass_fields__"):
        for f in obj.__dataclass_fields__:
            _tensors_in(getattr(obj, f, None), out)
    return out


def _to_device(obj, dev):
    if isinstance(obj, Tensor):
        return obj.to(dev)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_to_device(x, dev) for x in obj)
    if isinstance(obj, list):
        return [_to_device(x, dev) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, dev) for k, v in obj.items()}
    return obj


def _ready_hook(ddp_ref, index: int):
    def hook(param):
        ddp = ddp_ref()
        if ddp is not None:
            ddp._on_grad_ready(index)
    return hook


_UNFINISHED_MSG = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
    "that your module has parameters that were not used in producing loss. You can enable unused parameter "
    "detection by passing the keyword argument `find_unused_parameters=True` to "
    "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs participate "
    "in calculating loss. \nIf you already have done the above, then the distributed data parallel module wasn't "
    "able to locate the output tensors in the return value of your module's `forward` function. Please include "
    "the loss function and the structure of the return value of `forward` of your module when reporting this "
    "issue (e.g. list, dict, iterable).\nParameter indices which did not receive grad for rank {rank}: {indices}\n"
    "Parameters which did not receive grad for rank {rank}: {names}")


class DistributedDataParallel(Module):
    """Data parallelism: the whole ``module`` on every rank of ``process_group``, gradients averaged in backward.

    At construction (``init_sync``) every parameter and buffer is broadcast from group rank 0. The forward
    calls ``self.module`` (with ``broadcast_buffers``, after broadcasting the buffers from rank 0); the
    backward averages each gradient over the group (sum / size) in buckets of about ``bucket_cap_mb`` MiB,
    all-reduced asynchronously as their gradients become ready and all complete when ``backward()`` returns.
    ``no_sync()`` accumulates gradients locally. State-dict keys carry the ``module.`` prefix, as PyTorch's.
    See [Note: DDP gradient reduction].

    Args:
        module: the module to replicate (its parameters already on their device).
        device_ids: None, or for a single-device CUDA module ``[device]``: inputs are moved there.
        output_device: accepted as PyTorch does (outputs stay where the module puts them).
        dim: accepted for PyTorch compatibility (single-device modules never scatter inputs).
        broadcast_buffers: broadcast buffers from rank 0 before each forward that follows a synchronised one.
        init_sync: broadcast parameters and buffers from rank 0 at construction.
        process_group: the group to average over (default: the default group); not with ``device_mesh``.
        bucket_cap_mb: bucket size in MiB (default 25).
        find_unused_parameters: find parameters the forward's output does not depend on and reduce them too.
        check_reduction: deprecated in PyTorch; ignored.
        gradient_as_bucket_view: ``.grad`` becomes a view into the bucket buffer after the first reduction.
        static_graph: allow parameters without a gradient (found when backward ends, not in forward).
        device_mesh: a 1-D DeviceMesh whose group to average over.
        delay_all_reduce_named_params, param_to_hook_all_reduce, mixed_precision: not supported (None only).
    """

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"module must be an hpcfsdp nn.Module, got {type(module).__name__}")
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("mixed_precision", mixed_precision)):
            if value is not None:
                raise NotImplementedError(f"DistributedDataParallel({name}=...) is not supported by hpcfsdp; "
                                          f"expected None (for mixed precision use hpcfsdp.autocast or FSDP's "
                                          f"MixedPrecisionPolicy)")
        from hpcfsdp.distributed._c10d_groups import resolve_group
        from hpcfsdp.distributed.tensor._dtensor import DTensor

        if process_group is not None and device_mesh is not None:
            raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
        if device_mesh is not None:
            if device_mesh.ndim != 1:
                raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
            group = device_mesh.get_group()
        else:
            group = resolve_group(process_group)
        if bucket_cap_mb is not None and not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r}: expected a positive number of MiB or None")
        ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        named = [(n, p) for n, p in module.named_parameters() if n not in ignore]
        if any(isinstance(p, DTensor) for _, p in named):
            raise ValueError("DistributedDataParallel: the module has DTensor (sharded) parameters; "
                             "expected a plain module (do not combine it with fully_shard or FSDP)")
        params = [(n, p) for n, p in named if p.requires_grad]
        if not params:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient.")
        devices = {p.device for _, p in named}
        if device_ids is not None or output_device is not None:
            if len(devices) != 1 or next(iter(devices)).type != "cuda":
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work with "
                    "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                    f"{device_ids}, output_device {output_device}, and module parameters {devices}.")
            if device_ids is not None and len(device_ids) != 1:
                raise ValueError(f"device_ids={device_ids!r}: expected None or one device for a single-device "
                                 f"module (a process drives one device)")
        self.module = module
        self.process_group = group
        self.device_ids = None if device_ids is None else [
            d if isinstance(d, int) else _backend.device(d).index for d in device_ids]
        self.output_device = output_device if output_device is not None else (
            None if self.device_ids is None else self.device_ids[0])
        self.dim = dim
        self.device_type = next(iter(devices)).type if len(devices) == 1 else "cpu"
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.require_forward_param_sync = True  # whether the next forward broadcasts buffers
        self.parameters_to_ignore = ignore
        cap = _DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.bucket_bytes_cap = int(cap * _MB)
        first_cap = _DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else self.bucket_bytes_cap

        self._param_names = [n for n, _ in params]
        self._params = [p for _, p in params]
        self._buffers_to_sync = [b for n, b in module.named_buffers() if n not in ignore and b is not None]
        if group.size() > 1:
            self._verify_same_model(group, named)
            if init_sync:
                _broadcast_coalesced(group, [p for _, p in named] + self._buffers_to_sync)
        self._buckets = [_Bucket(idx, self._params) for idx in
                         _assign_buckets(self._params, first_cap, self.bucket_bytes_cap)]
        self._bucket_of = [0] * len(self._params)
        for b, bucket in enumerate(self._buckets):
            for i in bucket.indices:
                self._bucket_of[i] = b
        self._views: list = [None] * len(self._params)  # gradient_as_bucket_view: the .grad we assigned
        self._reset_iteration()
        self._armed = False
        self._unfinished: list[int] | None = None
        ref = weakref.ref(self)
        self._hook_handles = [p.register_post_accumulate_grad_hook(_ready_hook(ref, i))
                              for i, p in enumerate(self._params)]

    # -- construction helpers ----------------------------------------------------------------------
    @staticmethod
    def _verify_same_model(group, named) -> None:
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        every = group.all_gather_object(mine)
        for r, theirs in enumerate(every):
            if theirs != every[0]:
                diff = next((f"{a} vs {b}" for a, b in zip(every[0], theirs) if a != b),
                            f"{len(every[0])} parameters vs {len(theirs)}")
                raise RuntimeError(f"DDP expects same model across all ranks, but rank {r} of the group differs "
                                   f"from rank 0: {diff}")

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module: Module, params_and_buffers_to_ignore) -> None:
        """Names of parameters and buffers a DistributedDataParallel built on ``module`` neither syncs nor
        reduces (PyTorch's private helper, used by libraries)."""
        module._ddp_params_and_buffers_to_ignore = list(params_and_buffers_to_ignore)

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        """Run ``self.module``: broadcast buffers first (``broadcast_buffers``), arm the gradient reduction after."""
        if self._unfinished is not None or (self._armed and self._next_bucket > 0):
            self._raise_unfinished()
        group = self.process_group
        if (self.require_forward_param_sync and self.broadcast_buffers and self._buffers_to_sync
                and group.size() > 1):
            _broadcast_coalesced(group, self._buffers_to_sync)
        if self.device_ids:
            dev = f"cuda:{self.device_ids[0]}"
            inputs, kwargs = _to_device(inputs, dev), _to_device(kwargs, dev)
        out = self.module(*inputs, **kwargs)
        if is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self._arm(out)
        else:
            self.require_forward_param_sync = False
            self._armed = False
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context gradients accumulate locally: backwards of forwards run here are not reduced.
        The first backward of a forward after it reduces the accumulated gradients."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: object, hook) -> None:
        """Not supported: hpcfsdp has no torch.futures; gradients are always averaged with one all-reduce per
        bucket (PyTorch's default, ``allreduce_hook``)."""
        raise NotImplementedError("DistributedDataParallel.register_comm_hook is not supported by hpcfsdp: "
                                  "buckets are always averaged with an all-reduce (PyTorch's default hook)")

    # -- one iteration; see [Note: DDP gradient reduction] ---------------------------------------------
    def _reset_iteration(self) -> None:
        self._ready = [False] * len(self._params)  # counted in its bucket
        self._got_grad = [False] * len(self._params)  # its hook ran: backward gave it a gradient
        self._pending = [len(b.indices) for b in self._buckets]
        self._next_bucket = 0
        self._callback_queued = False
        self._unused_at_forward: list[int] = []
        for b in self._buckets:
            b.work = None

    def _arm(self, out) -> None:
        self._reset_iteration()
        self._armed = True
        if self.find_unused_parameters:
            self._unused_at_forward = self._unreached(out)

    def _unreached(self, out) -> list[int]:
        """Indices of the parameters the graph of ``out`` does not reach."""
        index = {id(p): i for i, p in enumerate(self._params)}
        reached = set()
        seen = set()
        stack = [t.grad_fn for t in _tensors_in(out, []) if t.grad_fn is not None]
        stack += [t._accumulate_node() for t in _tensors_in(out, []) if t.grad_fn is None and id(t) in index]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if type(node) is AccumulateGrad:
                i = index.get(id(node.variable))
                if i is not None:
                    reached.add(i)
                continue
            stack.extend(e[0] for e in node.next_functions if e is not None)
        return [i for i in range(len(self._params)) if i not in reached]

    def _on_grad_ready(self, i: int) -> None:
        if not self._armed:
            return
        if not self._callback_queued:
            self._callback_queued = True
            _engine.queue_callback(self._finalize)
            for j in self._unused_at_forward:
                if not self._ready[j]:
                    self._mark_ready(j)
        if self._ready[i]:
            raise RuntimeError(f"Expected to mark a variable ready only once: parameter {self._param_names[i]!r} "
                               f"(index {i}) got a gradient twice in one backward after one forward")
        self._got_grad[i] = True
        self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        self._ready[i] = True
        b = self._bucket_of[i]
        self._pending[b] -= 1
        while self._next_bucket < len(self._buckets) and self._pending[self._next_bucket] == 0:
            self._launch(self._next_bucket)

    def _launch(self, b: int) -> None:
        """Copy the bucket's gradients (divided by the group size) into its buffer; all-reduce it asynchronously."""
        from hpcfsdp.distributed.process_group import ReduceOp

        assert b == self._next_bucket, (b, self._next_bucket)
        bucket = self._buckets[b]
        n = self.process_group.size()
        buf = bucket.buffer
        xp = array_module(buf)
        for i, (o, k) in zip(bucket.indices, bucket.slots):
            slot = buf[o:o + k]
            g = self._params[i].grad
            if g is None:
                slot[...] = 0
            elif g is self._views[i]:  # gradient_as_bucket_view: backward accumulated into the slot
                if n > 1:
                    slot /= n
            elif n > 1:
                xp.divide(g._data.reshape(-1), n, out=slot)
            else:
                slot[...] = g._data.reshape(-1)
        bucket.work = self.process_group.all_reduce_(buf, ReduceOp.SUM, async_op=True)
        self._next_bucket = b + 1

    def _finalize(self) -> None:
        """End of backward: launch what is left, wait for every bucket, write the averages into ``.grad``."""
        from hpcfsdp.distributed.process_group import ReduceOp

        if not self._armed:
            return
        try:
            unready = [i for i, r in enumerate(self._got_grad) if not r]
            while self._next_bucket < len(self._buckets):
                self._launch(self._next_bucket)
            allow_unused = self.find_unused_parameters or self.static_graph
            count = None
            if allow_unused:
                count = np.array([1 if (r or p.grad is not None) else 0
                                  for r, p in zip(self._got_grad, self._params)], dtype=np.int32)
                count_work = self.process_group.all_reduce_(count, ReduceOp.SUM, async_op=True)
            for bucket in self._buckets:
                bucket.work.wait()
            if count is not None:
                count_work.wait()
            unready_set = set(unready)
            for bucket in self._buckets:
                for i, (o, k) in zip(bucket.indices, bucket.slots):
                    if i in unready_set and (count is None or count[i] == 0):
                        continue  # no gradient anywhere (or, without find_unused_parameters, an error next)
                    self._write_back(i, bucket.buffer[o:o + k])
        finally:
            self._armed = False
            for b in self._buckets:
                b.work = None
        if unready and not (self.find_unused_parameters or self.static_graph):
            self._unfinished = unready

    def _write_back(self, i: int, slot) -> None:
        p = self._params[i]
        shape = p._data.shape
        if self.gradient_as_bucket_view:
            if p.grad is not self._views[i]:
                p.grad = Tensor._wrap(slot.reshape(shape))
                self._views[i] = p.grad
            return
        g = p.grad
        if g is not None and getattr(g._data.flags, "writeable", True) and g._data.flags.c_contiguous:
            g._data[...] = slot.reshape(shape)
        else:
            p.grad = Tensor._wrap(slot.reshape(shape).copy())

    def _raise_unfinished(self):
        unready = self._unfinished if self._unfinished is not None else \
            [i for i, r in enumerate(self._got_grad) if not r]
        raise RuntimeError(_UNFINISHED_MSG.format(rank=self.process_group.rank(),
                                                  indices=" ".join(map(str, unready)),
                                                  names=", ".join(self._param_names[i] for i in unready)))
