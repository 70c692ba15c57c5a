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

After backward, ``post_backward`` packs the unsharded gradients (cast to reduce_dtype) rank-major and
issues one reduce-scatter (then, for HSDP, an all-reduce of the result across replicas) on the
communication thread, and returns. The sharded gradients are written when the reduction is waited
for: when more than ``reduce_scatter_max_input_buffers`` reductions are in flight, or at the end of
backward (``finalize``). This bounds memory to a few unsharded groups while reductions overlap compute.
"""

import collections
import os
import time

from .... import _backend
from ...._tensor import Tensor
from ...process_group import ReduceOp
from ._fsdp_common import ShardedState, TrainingState, check_transition
from ._fsdp_param import FSDPParam, local_grad_from

__all__ = ["FSDPParamGroup", "exposed_comm_seconds"]

_exposed = [0.0]  # seconds the main thread spent waiting for FSDP's collectives (this process)


def exposed_comm_seconds(reset: bool = False) -> float:
    """Total time the main thread waited on FSDP all-gathers and reductions; optionally reset it."""
    value = _exposed[0]
    if reset:
        _exposed[0] = 0.0
    return value

_Pending = collections.namedtuple("_Pending", "group works out params had_grad")


class FSDPParamGroup:
    def __init__(self, params: list[FSDPParam], modules, mesh_info, post_forward_mesh_info, device, mp_policy,
                 offload_policy):
        self.fsdp_params = params
        self.modules = modules
        self.mesh_info = mesh_info
        self.post_forward_mesh_info = post_forward_mesh_info
        self.device = _backend.to_device(device)
        self.mp_policy = mp_policy
        self.offload = type(offload_policy).__name__ == "CPUOffloadPolicy"
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            names = ", ".join(f"{p.name}: {p.dtype}" for p in params)
            raise ValueError(f"fully_shard needs one dtype per parameter group, got {names}")
        self.dtype = params[0].dtype
        self.param_dtype = params[0].param_dtype
        self.reduce_dtype = params[0].reduce_dtype
        self.total = self._assign_offsets([p.layout for p in params])
        self.rs_params = [p for p in params if p.requires_grad]
        self.rs_total = self._assign_offsets([p.rs_layout for p in self.rs_params])
        self.pf_total = self._assign_offsets([p.pf_layout for p in params]) if params[0].pf_layout else 0
        self.sharded_state = ShardedState.SHARDED
        self.training_state = TrainingState.IDLE
        # policy knobs (FSDPModule setters)
        self.reduce_grads = True
        self.all_reduce_grads = True
        self.reshard_after_backward = True
        self.unshard_in_backward = True
        self.gradient_divide_factor = None
        self.reduce_scatter_unused_params = False
        self.keep_low_precision_grads = False  # FSDP1 MixedPrecision: sharded grads stay in param_dtype
        self.reduce_scatter_max_input_buffers = 1
        self.unshard_async_op = False
        self._all_gather_comm = None
        self._reduce_scatter_comm = None
        self._all_reduce_hook = None
        self.post_optim_event = None  # set_post_optim_event: the next all-gather waits on it
        self._rs_group = None  # set_separate_reduce_scatter_group
        # per-pass state
        self._ag = None  # (work, out buffer, layouts, total, world) while UNSHARDING
        self._pf_buf = None
        self._pending = collections.deque()  # reductions in flight: shared by all groups of a root (lazy init)
        self._partial_reduce = None  # HSDP without all-reduce: locally accumulated reduce-scatter output
        self.uses_left = 0  # forward calls whose post-backward has not run yet
        self.backward_steps = 0  # completed backward passes (for error messages)
        self.needs_post_backward = False
        self._init_sharded_storage()

    @staticmethod
    def _assign_offsets(layouts) -> int:
        off = 0
        for lay in layouts:
            lay.offset = off
            off += lay.numel
        return off

    # -- storage ------------------------------------------------------------------------------------
    def _storage_device(self):
        return _backend.device("cpu") if self.offload else self.device

    def _init_sharded_storage(self, sources=None):
        """Allocate the flat sharded buffer and bind every parameter's local view to it."""
        is_meta = sources is None and any(_backend.is_meta_array(p.module_infos[0][0]._parameters[
            p.module_infos[0][1]]._data) for p in self.fsdp_params)
        dev = self._storage_device()
        if is_meta:
            self.flat = _backend.meta_array((self.total,), self.dtype)
        else:
            xp = _backend.array_module(dev)
            self.flat = xp.zeros((self.total,), dtype=self.dtype)
        for p in self.fsdp_params:
            if sources is not None:
                src = sources[id(p)]
            else:
                orig = p.module_infos[0][0]._parameters[p.module_infos[0][1]]
                src = None if is_meta else _to_storage(orig._data, dev)
            p.bind_flat(self.flat, src)
        self.is_meta = is_meta

    def reallocate(self, fn):
        """Re-create the sharded storage after ``Module._apply(fn)`` (to_empty, to(device/dtype))."""
        new_locals = {}
        for p in self.fsdp_params:
            out = fn(Tensor._wrap(p._local))
            arr = out._data if isinstance(out, Tensor) else out
            new_locals[id(p)] = arr
        sample = next(iter(new_locals.values()))
        self.device = _backend.device_of_array(sample) if not self.offload else self.device
        self.dtype = sample.dtype
        for p in self.fsdp_params:
            p.dtype = sample.dtype
        xp = _backend.array_module(sample)
        self.flat = xp.zeros((self.total,), dtype=self.dtype)
        self.is_meta = _backend.is_meta_array(sample)
        for p in self.fsdp_params:
            p.sharded_param._data = p._local  # bind_flat replaces it
            seg = p.layout.segment(self.flat)[:p.local_rows()]
            arr = new_locals[id(p)]
            if not self.is_meta:
                seg[...] = _backend.array_module(seg).moveaxis(arr, p.shard_dim, 0) if p.shard_dim else arr
            p.bind_flat(self.flat)
            if p.sharded_param.grad is not None:
                p.sharded_param.grad = None

    def _check_not_meta(self, what):
        if self.is_meta:
            raise RuntimeError(
                f"FSDP cannot {what} parameters on the meta device; call module.to_empty(device=...) and "
                "reset_parameters() first")

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
        if flat.dtype != self.param_dtype:
            flat = flat.astype(self.param_dtype)
        return flat

    def unshard(self, async_op: bool = False):
        if self.sharded_state in (ShardedState.UNSHARDED, ShardedState.UNSHARDING):
            return
        self._check_not_meta("unshard")
        self.lazy_init()
        if self.sharded_state == ShardedState.SHARDED_POST_FORWARD:
            inp, pg, total = self._pf_buf, self.post_forward_mesh_info.shard_process_group, self.pf_total
            layouts = [p.pf_layout for p in self.fsdp_params]
        else:
            inp, pg, total = self._all_gather_input(), self.mesh_info.shard_process_group, self.total
            layouts = [p.layout for p in self.fsdp_params]
        xp = _backend.array_module(inp)
        world = pg.size()
        comm = self._all_gather_comm
        if comm is None:
            out = xp.empty((world * total,), dtype=inp.dtype)
            work = pg.all_gather_into(out, inp, async_op=True)
        else:
            out_t = comm.allocate((world * total,), dtype=inp.dtype, device=self.device)
            work = comm(out_t, Tensor._wrap(inp), pg, async_op=True)
            out = out_t._data
        self._ag = (work, out, layouts, total)
        self.sharded_state = ShardedState.UNSHARDING
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self):
        if self.sharded_state != ShardedState.UNSHARDING:
            return
        work, out, layouts, total = self._ag
        if work is not None:
            t0 = time.perf_counter()
            work.wait()
            _exposed[0] += time.perf_counter() - t0
        xp = _backend.array_module(out)
        for p, lay in zip(self.fsdp_params, layouts):
            p.set_unsharded_data(lay.gathered(out, total, xp, out.dtype))
            p.set_on_modules(p.unsharded_param)
        self._ag = None
        self._pf_buf = None
        self.sharded_state = ShardedState.UNSHARDED

    # -- reshard ------------------------------------------------------------------------------------
    def reshard(self):
        self.wait_for_unshard()
        if self.sharded_state == ShardedState.SHARDED:
            return
        if self.sharded_state == ShardedState.UNSHARDED:
            for p in self.fsdp_params:
                p.set_on_modules(p.sharded_param)
                p.free_unsharded()
        self._pf_buf = None
        self.sharded_state = ShardedState.SHARDED

    def write_back_unsharded(self):
        """Copy the (possibly modified) unsharded parameters back into this rank's shards."""
        if self.sharded_state != ShardedState.UNSHARDED:
            return
        for p in self.fsdp_params:
            seg = p.layout.segment(self.flat)[:p.local_rows()]
            front = p.unsharded_front()[p.layout.start:p.layout.stop]
            seg[...] = _backend.to_numpy(front) if self.offload else front

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
        buf = xp.zeros((self.pf_total,), dtype=self.param_dtype)
        for p in self.fsdp_params:
            seg = p.pf_layout.segment(buf)
            lay = p.pf_layout
            seg[:lay.stop - lay.start] = p.unsharded_front()[lay.start:lay.stop]
        self.reshard()
        self._pf_buf = buf
        self.sharded_state = ShardedState.SHARDED_POST_FORWARD

    # -- forward / backward transitions ---------------------------------------------------------------
    def pre_forward(self):
        self.training_state = check_transition(self.training_state, TrainingState.FORWARD, "pre-forward")
        self.unshard(self.unshard_async_op)
        self.wait_for_unshard()

    def post_forward(self):
        self.reshard_post_forward()
        self.training_state = check_transition(self.training_state, TrainingState.IDLE, "post-forward")

    def pre_backward(self):
        self.training_state = check_transition(self.training_state, TrainingState.PRE_BACKWARD, "pre-backward")
        self.needs_post_backward = True
        if self.unshard_in_backward:
            self.unshard()
            self.wait_for_unshard()

    def post_backward(self):
        """One use of the group finished its backward; reduce once every use has."""
        if self.uses_left > 1:
            self.uses_left -= 1
            return
        self.uses_left = 0
        if not self.needs_post_backward:
            return
        self.needs_post_backward = False
        self.training_state = check_transition(self.training_state, TrainingState.POST_BACKWARD, "post-backward")
        if self.reduce_grads and self.rs_params:
            self._reduce_scatter()
        if self.reshard_after_backward:
            self.reshard()

    def finalize(self, wait: bool = True):
        """End of backward: reduce what no post-backward reduced, wait for every reduction (unless
        ``wait`` is false: not the last backward of the step), go IDLE."""
        has_grads = self.reduce_grads and any(
            p.unsharded_param is not None and p.unsharded_param.grad is not None for p in self.rs_params)
        if self.needs_post_backward or has_grads:
            self.uses_left = 0
            self.needs_post_backward = True
            self.post_backward()
        if self.reshard_after_backward:
            self.reshard()
        while self._pending and wait:
            self._finish_oldest()
        self.uses_left = 0
        self.needs_post_backward = False
        self.backward_steps += 1
        self.training_state = TrainingState.IDLE

    # -- gradient reduction ---------------------------------------------------------------------------
    def _divide_factor(self) -> float:
        if self.gradient_divide_factor is not None:
            return float(self.gradient_divide_factor)
        n = self.mesh_info.shard_world_size
        if self.mesh_info.is_hsdp:
            n *= self.mesh_info.replicate_world_size
        return float(n)

    def _reduce_scatter(self):
        # Finish the oldest reductions first, so that their input buffers are freed before this one's is
        # allocated: at most reduce_scatter_max_input_buffers reductions in flight.
        while len(self._pending) >= self.reduce_scatter_max_input_buffers:
            self._finish_oldest()
        pg = self._rs_group or self.mesh_info.shard_process_group
        world = pg.size()
        grads = [p.unsharded_param.grad for p in self.rs_params]
        had_grad = [g is not None for g in grads]
        xp = _backend.array_module(self.device)
        rs_in = xp.empty((world * self.rs_total,), dtype=self.reduce_dtype)
        for p, g in zip(self.rs_params, grads):
            if g is None:
                rs_in.reshape(world, self.rs_total)[:, p.rs_layout.offset:p.rs_layout.offset + p.rs_layout.numel] = 0
            else:
                front = _backend.array_module(g._data).moveaxis(g._data, p.shard_dim, 0) if p.shard_dim else g._data
                p.rs_layout.scatter_into(rs_in, self.rs_total, front)
            p.unsharded_param.grad = None
        comm = self._reduce_scatter_comm
        if comm is None:
            out = xp.empty((self.rs_total,), dtype=self.reduce_dtype)
            works = [pg.reduce_scatter_into(out, rs_in, ReduceOp.SUM, async_op=True)]
        else:
            out_t = comm.allocate((self.rs_total,), dtype=self.reduce_dtype, device=self.device)
            works = [comm(out_t, Tensor._wrap(rs_in), pg, ReduceOp.SUM, async_op=True)]
            out = out_t._data
        if self.mesh_info.is_hsdp:
            rpg = self.mesh_info.replicate_process_group
            if not self.all_reduce_grads:
                _wait_all(works)
                works = []
                self._partial_reduce = out if self._partial_reduce is None else self._partial_reduce + out
                out = None
            else:
                if self._partial_reduce is not None:
                    _wait_all(works)
                    works = []
                    out += self._partial_reduce
                    self._partial_reduce = None
                works.append(rpg.all_reduce_(out, ReduceOp.SUM, async_op=True))
        if out is not None:
            self._pending.append(_Pending(self, works, out, self.rs_params, had_grad))

    def _finish_oldest(self):
        """Wait for the oldest reduction in flight (of any group of this root) and write its gradients."""
        item = self._pending.popleft()
        t0 = time.perf_counter()
        _wait_all(item.works)
        _exposed[0] += time.perf_counter() - t0
        item.group._write_grads(item)

    def _write_grads(self, item):
        out = item.out
        out *= out.dtype.type(1.0 / self._divide_factor())
        if self._all_reduce_hook is not None:
            self._all_reduce_hook(Tensor._wrap(out))
        for p, had in zip(item.params, item.had_grad):
            if not (had or self.reduce_scatter_unused_params):
                continue
            g = local_grad_from(p.rs_layout, out, p.shard_dim)
            if self.offload:
                g = _backend.to_numpy(g)
            dtype = p.param_dtype if self.keep_low_precision_grads else p.dtype
            if g.dtype != dtype:
                g = g.astype(dtype)
            if _CHECK_FINITE:
                _check_finite(g, p, self)
            sp = p.sharded_param
            if sp.grad is None and self.keep_low_precision_grads:
                sp._grad = p.sharded_grad(g)  # a low-precision grad of a full-precision parameter, on purpose
            elif sp.grad is None:
                sp.grad = p.sharded_grad(g)
            else:
                sp.grad._data += g


_CHECK_FINITE = os.environ.get("HPCFSDP_CHECK_FINITE", "0") not in ("", "0")


def _check_finite(g, p, group):
    """HPCFSDP_CHECK_FINITE=1: fail on the first NaN/Inf in a reduced gradient, naming parameter and step."""
    xp = _backend.array_module(g)
    if g.size and not bool(xp.isfinite(g).all()):
        bad = int((~xp.isfinite(g)).sum())
        raise FloatingPointError(
            f"HPCFSDP_CHECK_FINITE: gradient of {p.fqn or p.name} has {bad} non-finite value(s) at backward "
            f"step {group.backward_steps} (this rank's shard of shape {tuple(g.shape)})")


def _wait_all(works):
    for w in works:
        if w is not None:
            w.wait()


def _to_storage(arr, dev):
    xp = _backend.array_module(dev)
    if xp is _backend.array_module(arr):
        return arr
    return _backend.to_numpy(arr) if dev.type == "cpu" else xp.asarray(arr)
