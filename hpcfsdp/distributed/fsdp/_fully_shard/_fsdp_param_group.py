"""FSDPParamGroup: the parameters of one fully_shard call and their communication (one flat buffer each way).

[Note: Group lifecycle]
A group is SHARDED between passes: module attributes are the sharded DTensor parameters, views into
one flat buffer (this rank's padded shards back to back; see [Note: Flat layout]). ``unshard`` issues
one all-gather of that buffer on the communication thread (cast to param_dtype first when mixed
precision asks) and returns at once (UNSHARDING); ``wait_for_unshard`` waits, copies every parameter
out of the gathered buffer into a full array and swaps the module attributes to the unsharded
parameters (UNSHARDED). The unsharded Parameter objects live as long as the group, so autograd can
keep referring to them while their data comes and goes. ``reshard`` swaps back and drops the full
arrays; with an int ``reshard_after_forward`` it first keeps this rank's rows over the smaller
post-forward group (SHARDED_POST_FORWARD), so the backward all-gather stays inside that group.

After backward, ``post_backward`` hands the unsharded gradients to ``foreach_reduce`` (see [Note: One group's
collectives]), which issues their reduction on the communication thread and returns. The sharded
gradients are written when the reduction is waited for: when more than ``reduce_scatter_max_input_buffers``
reductions are in flight (in the queue the root's states share), or at the end of backward (``finalize``).
This bounds memory to a few unsharded groups while reductions overlap compute.
"""

import contextlib
import copy

from .... import _backend, _trace
from ...._tensor import Tensor
from ._fsdp_api import CPUOffloadPolicy
from ._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
    exposed_comm_seconds,
    finish_reduce,
    foreach_all_gather,
    foreach_all_gather_copy_out,
    foreach_reduce,
    wait_reduce_input,
)
from ._fsdp_common import ShardedState, TrainingState, check_transition
from ._fsdp_param import FSDPParam

__all__ = ["FSDPParamGroup", "exposed_comm_seconds"]

MAX_REDUCTIONS_IN_FLIGHT = 4  # reductions (HSDP: all-reduces) outstanding before the oldest is finished


class FSDPParamGroup:
    def __init__(self, params: list[FSDPParam], mesh_info, post_forward_mesh_info, device, offload_policy):
        self.fsdp_params = params
        self.mesh_info = mesh_info
        self.post_forward_mesh_info = post_forward_mesh_info
        self.device = _backend.to_device(device)
        self.offload = isinstance(offload_policy, CPUOffloadPolicy)
        self.pin_memory = self.offload and bool(offload_policy.pin_memory)  # page-locked shards: async copies
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            names = ", ".join(f"{p.name}: {p.dtype}" for p in params)
            raise ValueError(f"fully_shard needs one dtype per parameter group, got {names}")
        self.dtype = params[0].dtype
        self.param_dtype = params[0].param_dtype
        self.reduce_dtype = params[0].reduce_dtype
        self.total = self._assign_offsets([p.layout for p in params])
        self._reduce_plans = {}  # which parameters require grad -> (params, layouts, total); see _reduce_plan
        self.post_forward_total = (self._assign_offsets([p.post_forward_layout for p in params])
                                   if params[0].post_forward_layout else 0)
        self.sharded_state = ShardedState.SHARDED
        self.training_state = TrainingState.IDLE
        # policy knobs (FSDPModule setters)
        self.reduce_grads = True
        self.all_reduce_grads = True
        self.reshard_after_backward = True
        self.unshard_in_backward = True
        self.gradient_divide_factor = None
        self.force_sum_reduction_for_comms = False
        self.reduce_scatter_unused_params = False
        self.keep_low_precision_grads = False  # FSDP1 MixedPrecision: sharded grads stay in param_dtype
        self.reduce_scatter_max_input_buffers = 1
        self.unshard_async_op = False
        self.all_gather_comm = DefaultAllGather()
        self.reduce_scatter_comm = DefaultReduceScatter()
        self.all_reduce_hook = None
        self.replicas_reduced_by_comm = False  # FSDP1 NO_SHARD comm hook: reduce_scatter_comm all-reduces itself
        self.post_optim_event = None  # set_post_optim_event: the next all-gather waits on it
        self.reduce_scatter_group = None  # set_separate_reduce_scatter_group: a duplicate of the shard group
        # per-pass state
        self._all_gather_result = None  # AllGatherResult while UNSHARDING
        self._post_forward_buffer = None  # this rank's rows over the post-forward group (SHARDED_POST_FORWARD)
        self._partial_reduce = None  # HSDP without all-reduce: locally accumulated reduce-scatter output
        self.uses_left = 0  # forward calls whose post-backward has not run yet
        self.pending_recomputes = 0  # checkpointed module calls not yet recomputed; see [Note: Recompute under FSDP]
        self.backward_steps = 0  # completed backward passes (for error messages)
        self.reduce_steps = 0  # gradient reductions issued (HPCFSDP_CHECK_FINITE's step, from 1)
        self.finite_error = None  # agreed HPCFSDP_CHECK_FINITE failure, raised at the end of backward
        self.needs_post_backward = False
        self._init_sharded_storage()

    def _reduce_plan(self):
        """(params, layouts, total) of the gradient reduction: the parameters that require grad now.

        [Note: Frozen parameters]
        ``requires_grad_`` after fully_shard is set on the sharded parameter; every unshard copies it to the
        unsharded one (FSDPParam.to_unsharded), so a frozen parameter gets no gradient, and the reduction
        leaves it out (PyTorch reduce-scatters the parameters that have a gradient; here those that require
        one, so the buffer is the same on every rank even where a rank's forward did not use a parameter).
        While unsharded, the module attribute is the unsharded parameter: unfreezing that one counts too,
        until the next unshard copies the sharded parameter's flag over it again (as in PyTorch).
        Each set of trainable parameters has layouts of its own, so a reduction still in flight keeps the
        offsets it was packed with when the set changes."""
        params = [p for p in self.fsdp_params if p.reduces_grad()]
        key = tuple(id(p) for p in params)
        plan = self._reduce_plans.get(key)
        if plan is None:
            layouts = [copy.copy(p.layout) for p in params]
            plan = self._reduce_plans[key] = (params, layouts, self._assign_offsets(layouts))
        return plan

    @staticmethod
    def _assign_offsets(layouts) -> int:
        offset = 0
        for layout in layouts:
            layout.offset = offset
            offset += layout.numel
        return offset

    # -- storage ------------------------------------------------------------------------------------
    def _storage_device(self):
        return _backend.device("cpu") if self.offload else self.device

    def _init_sharded_storage(self):
        """Allocate the flat sharded buffer and bind every parameter's local view to it."""
        originals = [p.module_infos[0][0]._parameters[p.module_infos[0][1]] for p in self.fsdp_params]
        is_meta = any(_backend.is_meta_array(orig._data) for orig in originals)
        device = self._storage_device()
        with _on_device(device):  # the mesh's GPU, whatever GPU the parameters were built on (as PyTorch)
            if is_meta:
                self.flat = _backend.meta_array((self.total,), self.dtype)
            elif self.offload:
                self.flat = self._host_zeros()
            else:
                self.flat = _backend.array_module(device).zeros((self.total,), dtype=self.dtype)
            for p, orig in zip(self.fsdp_params, originals):
                p.bind_flat(self.flat, None if is_meta else _to_storage(orig._data, device))
        self.is_meta = is_meta

    def _host_zeros(self):
        """CPU offload's flat shard buffer: host memory, page-locked when the policy asks (CuPy only)."""
        flat = _backend.host_empty((self.total,), self.dtype, pin_memory=self.pin_memory)
        flat[...] = 0
        return flat

    def reallocate(self, fn):
        """Re-create the sharded storage after ``Module._apply(fn)`` (to_empty, to(device/dtype))."""
        new_locals = {}
        for p in self.fsdp_params:
            out = fn(Tensor._wrap(p._local))
            new_locals[id(p)] = out._data if isinstance(out, Tensor) else out
        sample = next(iter(new_locals.values()))
        self.device = _backend.device_of_array(sample) if not self.offload else self.device
        self.dtype = sample.dtype
        for p in self.fsdp_params:
            p.set_dtype(sample.dtype)
        self.param_dtype = self.fsdp_params[0].param_dtype
        self.reduce_dtype = self.fsdp_params[0].reduce_dtype
        self.is_meta = _backend.is_meta_array(sample)
        if self.offload and not self.is_meta:
            self.flat = self._host_zeros()
        else:
            self.flat = _backend.array_module(sample).zeros((self.total,), dtype=self.dtype)
        for p in self.fsdp_params:
            p.sharded_param._data = p._local  # bind_flat replaces it
            segment = p.layout.segment(self.flat)[:p.local_rows()]
            if not self.is_meta:
                segment[...] = p.to_front(new_locals[id(p)])
            p.bind_flat(self.flat)
            grad = p.sharded_param.grad
            if grad is not None:  # converted like the parameter (Module._apply does so), as PyTorch's
                out = fn(Tensor._wrap(grad._data))
                p.sharded_param.grad = None
                if not _backend.is_meta_array(out._data if isinstance(out, Tensor) else out):
                    p.sharded_param.grad = p.sharded_grad(out._data if isinstance(out, Tensor) else out)

    def _check_not_meta(self, what):
        if self.is_meta:  # PyTorch's words, with the parameters' names under the root
            names = [p.fqn or p.name for p in self.fsdp_params]
            raise RuntimeError(
                "FSDP parameters should be materialized from meta device before training, but the following were "
                f"still on meta device: {names}\nFor example, call module.to_empty(device) to materialize to "
                f"device and call module.reset_parameters() on each module to initialize values. (hpcfsdp: FSDP "
                f"cannot {what} parameters on the meta device)")

    # -- unshard ------------------------------------------------------------------------------------
    def lazy_init(self):
        for p in self.fsdp_params:
            p.init_unsharded()

    def _all_gather_input(self):
        event, self.post_optim_event = self.post_optim_event, None
        if event is not None:  # the optimizer step that wrote the shards must be done (a CuPy event)
            getattr(event, "synchronize", getattr(event, "wait", lambda: None))()
        for p in self.fsdp_params:
            if not p.views_intact():
                p.repack(self.flat)
        flat = self.flat
        if self.offload:
            flat = _backend.array_module(self.device).asarray(flat)
        return flat  # cast to param_dtype by foreach_all_gather, in its copy into the output

    def unshard(self, async_op: bool = False):
        if self.sharded_state in (ShardedState.UNSHARDED, ShardedState.UNSHARDING):
            return
        self.lazy_init()
        if self.is_meta:  # as PyTorch's collectives' meta kernels: nothing moves, the full parameters are meta
            for p in self.fsdp_params:
                p.to_unsharded()
            self.sharded_state = ShardedState.UNSHARDED
            return
        if _trace.RECORDER is not None:  # the unit these collectives belong to; see [Note: Timeline]
            _trace.RECORDER.label = _trace.RECORDER.units.get(id(self))
        if self.sharded_state == ShardedState.SHARDED_POST_FORWARD:
            result = foreach_all_gather(self._post_forward_buffer, self.post_forward_mesh_info.shard_process_group,
                                        self.all_gather_comm, [p.post_forward_layout for p in self.fsdp_params],
                                        self.post_forward_total, self.device)
        else:
            result = foreach_all_gather(self._all_gather_input(), self.mesh_info.shard_process_group,
                                        self.all_gather_comm, [p.layout for p in self.fsdp_params], self.total,
                                        self.device, self.param_dtype)
        self._all_gather_result = result
        self.sharded_state = ShardedState.UNSHARDING
        if _trace.RECORDER is not None:
            _trace.RECORDER.label = None
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self):
        if self.sharded_state != ShardedState.UNSHARDING:
            return
        foreach_all_gather_copy_out(self._all_gather_result, self.fsdp_params)
        for p in self.fsdp_params:
            p.to_unsharded()
        self._all_gather_result = None
        self._post_forward_buffer = None
        self.sharded_state = ShardedState.UNSHARDED

    # -- reshard ------------------------------------------------------------------------------------
    def reshard(self):
        self.wait_for_unshard()
        if self.sharded_state == ShardedState.SHARDED:
            return
        if self.sharded_state == ShardedState.UNSHARDED:
            for p in self.fsdp_params:
                p.set_on_modules(p.sharded_param)
                p.free_unsharded(self.unshard_in_backward)
        self._post_forward_buffer = None
        self.sharded_state = ShardedState.SHARDED

    def reshard_post_forward(self):
        """Reshard after forward: fully (post-forward group is the shard group), onto the smaller
        post-forward group (int reshard_after_forward), or not at all (None)."""
        info = self.post_forward_mesh_info
        if info is None:
            return
        if info is self.mesh_info or self.sharded_state != ShardedState.UNSHARDED:
            self.reshard()
            return
        xp = _backend.array_module(self.fsdp_params[0].unsharded_param._data)
        buffer = xp.zeros((self.post_forward_total,), dtype=self.param_dtype)
        for p in self.fsdp_params:
            layout = p.post_forward_layout
            layout.segment(buffer)[:layout.stop - layout.start] = p.unsharded_front()[layout.start:layout.stop]
        self.reshard()
        self._post_forward_buffer = buffer
        self.sharded_state = ShardedState.SHARDED_POST_FORWARD

    # -- forward / backward transitions ---------------------------------------------------------------
    def pre_forward(self, prefetch=None):
        """Unshard for forward. ``prefetch`` (the next units' all-gathers) is issued before the wait, so the
        communication thread finds it queued behind this group's; see [Note: Prefetch before the wait]."""
        self._check_not_meta("run forward with")
        self.training_state = check_transition(self.training_state, TrainingState.FORWARD, "pre-forward")
        self.unshard(async_op=True)
        if prefetch is not None:
            prefetch()
        self.wait_for_unshard()
        for p in self.fsdp_params:  # still unsharded from an earlier forward: a freeze since then counts too
            p.sync_requires_grad()

    def post_forward(self):
        self.reshard_post_forward()
        self.training_state = check_transition(self.training_state, TrainingState.IDLE, "post-forward")

    def pre_backward(self, prefetch=None):
        self.training_state = check_transition(self.training_state, TrainingState.PRE_BACKWARD, "pre-backward")
        self.needs_post_backward = True
        if self.unshard_in_backward:
            self.unshard(async_op=True)
        if prefetch is not None:
            prefetch()
        if self.unshard_in_backward:
            self.wait_for_unshard()

    def post_backward(self, reductions):
        """One use of the group finished its backward; reduce once every use has. ``reductions``: the
        queue of reductions in flight shared by the root's states."""
        if self.uses_left > 1 or self.pending_recomputes > 0:
            self.uses_left = max(self.uses_left - 1, 0)
            return
        self.uses_left = 0
        if not self.needs_post_backward:
            return
        self.needs_post_backward = False
        self.training_state = check_transition(self.training_state, TrainingState.POST_BACKWARD, "post-backward")
        if not self.reduce_grads:
            self._accumulate_unreduced()
        elif any(p.reduces_grad() for p in self.fsdp_params):
            self._reduce(reductions)
        if self.reshard_after_backward:
            self.reshard()

    def finalize(self, reductions, wait: bool = True):
        """End of backward: reduce what no post-backward reduced, wait for every reduction in ``reductions``
        (unless ``wait`` is false: not the last backward of the step), go IDLE."""
        has_grads = self.reduce_grads and any(
            p.accumulated_grad is not None or (p.unsharded_param is not None and p.unsharded_param.grad is not None)
            for p in self.fsdp_params)
        if self.needs_post_backward or has_grads:
            self.uses_left = 0
            self.needs_post_backward = True
            self.post_backward(reductions)
        if self.reshard_after_backward:
            self.reshard()
        while reductions and wait:
            finish_reduce(reductions.popleft())
        self.uses_left = 0
        self.pending_recomputes = 0
        self.needs_post_backward = False
        self.backward_steps += 1
        self.training_state = TrainingState.IDLE

    # -- gradient reduction ---------------------------------------------------------------------------
    def _accumulate_unreduced(self):
        """No reduction this backward (set_requires_gradient_sync(False)): with a reduce dtype wider than the
        compute dtype, the unsharded gradients accumulate in the reduce dtype, as PyTorch's
        (``unsharded_accumulated_grad``); otherwise autograd accumulates them in place."""
        if self.reduce_dtype == self.param_dtype:
            return
        for p in self.fsdp_params:
            p.accumulate_unsharded_grad(self.reduce_dtype)

    def _reduce(self, reductions):
        # At most reduce_scatter_max_input_buffers reduce-scatter inputs alive: wait for the oldest reduce-scatters
        # (not their all-reduces) before this one's input is allocated. See [Note: HSDP all-reduce].
        live = [r for r in reductions if r.input_work is not None]
        while live and len(live) >= self.reduce_scatter_max_input_buffers:
            wait_reduce_input(live.pop(0))
        while len(reductions) >= MAX_REDUCTIONS_IN_FLIGHT:
            finish_reduce(reductions.popleft())
        params, layouts, total = self._reduce_plan()
        if self._partial_reduce is not None and self._partial_reduce.shape != (total,):
            raise RuntimeError(
                "FSDP: the set of parameters that require grad changed while gradients reduced inside the shard "
                "group wait for their all-reduce (set_requires_all_reduce(False)); change requires_grad only "
                "after a step that all-reduces")
        grads = [p.take_unsharded_grad() for p in params]
        info = self.mesh_info
        if _trace.RECORDER is not None:
            _trace.RECORDER.label = _trace.RECORDER.units.get(id(self))
        result, self._partial_reduce = foreach_reduce(
            self, params, layouts, grads, total,
            self.reduce_scatter_group or info.shard_process_group, self.reduce_scatter_comm, self.reduce_dtype,
            self.device, self.gradient_divide_factor, self.force_sum_reduction_for_comms,
            info.replicate_process_group if info.is_hsdp and not self.replicas_reduced_by_comm else None,
            self.all_reduce_grads, self._partial_reduce)
        if _trace.RECORDER is not None:
            _trace.RECORDER.label = None
        if result is not None:
            result.hook = self.all_reduce_hook
            reductions.append(result)


def _on_device(device):
    """A context in which CuPy allocates on ``device`` (a no-op for the CPU)."""
    if device.type != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return _backend.array_module(device).cuda.Device(device.index)


def _to_storage(arr, device):
    """``arr`` on ``device``: unchanged when it is there already, else copied (host, or the current GPU)."""
    if device.type == "cpu":
        return _backend.to_numpy(arr)
    xp = _backend.array_module(device)
    index = device.index if device.index is not None else _backend.current_cuda_device()
    if _backend.is_cupy_array(arr) and arr.device.id == index:
        return arr
    return xp.array(arr, copy=True) if _backend.is_cupy_array(arr) else xp.asarray(arr)
