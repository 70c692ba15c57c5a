"""FSDPState: the hooks of one fully_shard call, the root's lazy init, prefetch order and the end-of-backward callback.

[Note: Hook order]
forward pre-hook: (root: lazy init) -> unshard own group, wait -> prefetch the next group's all-gather
    -> wrap inputs that require grad in RegisterPostBackward (its backward is "this module's backward is done").
forward hook: reshard per reshard_after_forward -> register a pre-backward hook on every output requiring grad.
pre-backward (first output gradient to arrive): queue the end-of-backward callback once per backward,
    unshard again if resharded, prefetch the group that runs next in backward.
post-backward: reduce-scatter gradients, reshard.
end of backward (root callback): reduce what did not run (unused parameters, inputs without grad), wait for
    every reduction, write sharded gradients, reset.
Every rank runs the same modules in the same order, so every rank issues the same collectives in the same
order on its communication thread; prefetch only changes when they are issued, never their order.

[Note: Prefetch before the wait]
A unit's pre-forward (and pre-backward) issues its own all-gather, then the prefetch of the next unit's,
and only then waits for its own. Waiting first would leave the communication thread idle from the end of
this unit's all-gather until the main thread wakes up and issues the next one (on a GPU the wait is a
stream wait and the CPU issues the next all-gather at once; here the wait blocks the CPU). Issued first,
the next all-gather is queued right behind, so a slow link carries the all-gathers back to back. The order
of the collectives, and so the result, is unchanged; at most two units are gathered at a time, as before.
"""

import collections
import functools

from .... import _backend, _trace
from ...._tensor import Tensor
from ....autograd import engine as _engine
from ....autograd.function import Function
from ....autograd.grad_mode import is_grad_enabled
from ....utils import checkpoint as _ckpt
from ._fsdp_assigned import adopt_assigned_params
from ._fsdp_collectives import finish_reduce, raise_finite_errors
from ._fsdp_common import TrainingState, get_module_fsdp_state

__all__ = ["FSDPState", "FSDPStateContext"]


class FSDPStateContext:
    """Shared by all states under one root. Every state starts with its own; the root's lazy init gives
    all states under it the root's (settings made on a child's context before that are replaced)."""

    def __init__(self):
        self.all_states: list = []
        self.final_callback_queued = False
        self.is_last_backward = True
        self.forward_order: list = []  # states in pre-forward order (recorded on the first iteration)
        self.forward_order_frozen = False
        self.post_forward_order: list = []  # states in post-forward order, this iteration
        self.reductions = collections.deque()  # ReduceResults in flight, oldest first, of all groups


class RegisterPostBackward(Function):
    """Identity on a module's inputs; its backward runs once the module's backward is done."""

    @staticmethod
    def forward(ctx, state, *inputs):
        ctx.state = state
        return inputs

    @staticmethod
    def backward(ctx, *grads):
        ctx.state._post_backward()
        return (None,) + grads


def _tensors_in(obj, out):
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    return out


def _map_tensors(obj, fn):
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(x, fn) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


class FSDPState:
    def __init__(self, modules, mp_policy):
        self._modules = modules
        self._mp_policy = mp_policy
        self._param_group = None
        self._is_root = None  # None until the root's lazy init, then whether this state is the root
        self._ctx = FSDPStateContext()
        self._auto_reshard_after_forward = False  # reshard_after_forward=None: the root keeps its parameters
        self._states_to_forward_prefetch = None
        self._states_to_backward_prefetch = None
        self._pre_backward_hook_ran = False
        self._modules_to_run = set()  # ids of this unit's modules whose forward has not run yet (several modules)
        self._backward_prefetch_post = False  # FSDP1 BACKWARD_POST: prefetch after this module's backward
        # FSDP1 MixedPrecision: cast_forward_inputs when this state is not the root (cast_root_forward_inputs
        # is its policy's), since whether an instance is the root shows only at lazy init
        self._nonroot_cast_forward_inputs = None

    # -- hooks ----------------------------------------------------------------------------------------
    def register_hooks(self):
        """Forward hooks on every module of the call. Modules passed together (``fully_shard([m1, m2])``)
        are one unit: its pre-forward runs before the first of them runs, its post-forward after the last."""
        for m in self._modules:
            m.register_forward_pre_hook(self._pre_forward_hook, prepend=True, with_kwargs=True)
            m.register_forward_hook(functools.partial(self._post_forward_hook, m), prepend=False)

    def register_state_dict_hooks(self):
        """State-dict hooks on every module of the call: loading writes into the sharded parameters, what
        assign=True puts on the modules is adopted (see [Note: Assigned parameters]), and state_dict() between
        passes gives the sharded DTensors."""
        def to_sharded(*args, **kwargs):
            for group in self._all_param_groups():
                group.reshard()

        def adopt(module, incompatible_keys):
            for group in self._all_param_groups():
                adopt_assigned_params(group)

        def to_sharded_when_idle(*args, **kwargs):
            for group in self._all_param_groups():
                if group.training_state == TrainingState.IDLE:
                    group.reshard()

        for m in self._modules:
            m.register_state_dict_pre_hook(to_sharded_when_idle)
            m._register_load_state_dict_pre_hook(to_sharded)
            m.register_load_state_dict_post_hook(adopt)

    def _pre_forward_hook(self, module, args, kwargs):
        if _ckpt.in_recompute():
            return self._recompute_pre_forward(args, kwargs)
        if _ckpt.in_checkpointed_forward() and self._param_group is not None:
            self._param_group.pending_recomputes += 1  # one module call backward will run again
        if len(self._modules) > 1:
            if self._modules_to_run:
                return None
            self._modules_to_run = {id(m) for m in self._modules}
        return self._pre_forward(module, args, kwargs)

    def _post_forward_hook(self, registered, module, args, output):
        if _ckpt.in_recompute():
            return self._recompute_post_forward(output)
        if len(self._modules) > 1:
            self._modules_to_run.discard(id(registered))
            if self._modules_to_run:
                return None
        return self._post_forward(module, args, output)

    def _all_param_groups(self):
        return [self._param_group] if self._param_group is not None else []

    # -- lazy init ------------------------------------------------------------------------------------
    def _lazy_init(self):
        if self._is_root is not None:
            return
        self._is_root = True
        ctx = self._ctx
        seen = set()
        for root in self._modules:
            for m in root.modules():
                st = get_module_fsdp_state(m)
                if st is None or id(st) in seen:
                    continue
                seen.add(id(st))
                if st is not self:
                    if st._is_root:
                        raise RuntimeError("FSDP found a nested root: a sharded submodule ran forward on its own "
                                           "before its parent; run the outermost module first")
                    st._is_root = False
                ctx.all_states.append(st)
        names = {}
        for root in self._modules:
            for n, p in root.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), n)
        for st in ctx.all_states:  # parameters replaced on the modules since fully_shard (PyTorch's
            if st._param_group is not None:  # reset_sharded_param at lazy init); see [Note: Assigned parameters]
                adopt_assigned_params(st._param_group, "a Parameter set on the module after fully_shard")
        _check_no_shared_params(ctx.all_states, names)
        for st in ctx.all_states:
            st._ctx = ctx
            if st._param_group is not None:
                st._param_group.lazy_init()
                for fp in st._param_group.fsdp_params:
                    fp.fqn = names.get(id(fp.sharded_param))
        # The root keeps its parameters after forward when the user left the choice to FSDP (None).
        if self._param_group is not None and self._auto_reshard_after_forward:
            self._param_group.post_forward_mesh_info = None

    # -- forward --------------------------------------------------------------------------------------
    def _pre_forward(self, module, args, kwargs):
        self._lazy_init()
        ctx = self._ctx
        if _trace.RECORDER is not None:  # see [Note: Timeline] in hpcfsdp/_trace.py
            _trace_begin(self, "forward")
        if self._is_root:
            self._root_pre_forward()
        args, kwargs = self._cast_inputs(args, kwargs)
        if not ctx.forward_order_frozen and self not in ctx.forward_order:
            ctx.forward_order.append(self)
        g = self._param_group
        if g is not None:
            g.pre_forward(self._prefetch_forward)
        else:
            self._prefetch_forward()
        if is_grad_enabled() and g is not None:
            args, kwargs = self._register_post_backward(g, args, kwargs)
        return args, kwargs

    def _register_post_backward(self, g, args, kwargs):
        """Wrap the inputs that require grad in RegisterPostBackward (one more use of the group to wait for in
        backward); without such inputs the end-of-backward callback reduces the group."""
        ts = [t for t in _tensors_in((args, kwargs), []) if t.requires_grad]
        if ts:
            g.uses_left += 1
            g.needs_post_backward = True
            new = RegisterPostBackward.apply(self, *ts)
            new = new if isinstance(new, tuple) else (new,)
            swap = {id(t): n for t, n in zip(ts, new)}
            args, kwargs = _map_tensors((args, kwargs), lambda t: swap.get(id(t), t))
        elif any(p.reduces_grad() for p in g.fsdp_params):
            g.needs_post_backward = True
        return args, kwargs

    # [Note: Recompute under FSDP]
    # Activation checkpointing runs a unit's modules twice: in forward under no_grad (the unit gathers and
    # reshards as usual; nothing is registered for backward), and again inside backward, where the
    # recomputed graph is backpropagated at once (see [Note: Activation checkpointing]). The recompute is
    # part of the unit's backward, as in PyTorch: each module call there unshards if needed (no reshard
    # after it, no prefetch of the next forward unit, no training-state change), hooks its inputs for the
    # post-backward and its outputs for the pre-backward. Every module call the first forward made under a
    # checkpoint is counted (``pending_recomputes``) and the group reduces only once all of them have been
    # recomputed and their backward has run, so a unit of several modules (``fully_shard([m1, m2])``),
    # each checkpointed on its own, reduces once, after its last module's backward.
    def _recompute_pre_forward(self, args, kwargs):
        args, kwargs = self._cast_inputs(args, kwargs)
        g = self._param_group
        if g is None:
            return args, kwargs
        g._check_not_meta("run forward with")
        g.pending_recomputes = max(g.pending_recomputes - 1, 0)
        g.unshard(async_op=True)  # a no-op when a backward prefetch already issued it
        g.wait_for_unshard()
        return self._register_post_backward(g, args, kwargs)

    def _recompute_post_forward(self, output):
        for t in _tensors_in(output, []):
            if t.requires_grad:
                t.register_hook(self._pre_backward)
        return self._cast_output(output)

    def _cast_output(self, output):
        if self._mp_policy.output_dtype is None:
            return output
        odt = _backend.to_dtype(self._mp_policy.output_dtype)
        return _map_tensors(output, lambda t: t.to(dtype=odt) if _backend.is_floating_dtype(t.dtype) else t)

    def _root_pre_forward(self):
        ctx = self._ctx
        # A new iteration: whatever the last backward left (e.g. no backward ran) is finished first.
        while ctx.reductions:  # reductions a backward left in flight (set_is_last_backward(False))
            finish_reduce(ctx.reductions.popleft())
        raise_finite_errors(st._param_group for st in ctx.all_states)
        if ctx.forward_order:
            ctx.forward_order_frozen = True
        ctx.post_forward_order = []

    def _cast_inputs(self, args, kwargs):
        dt = self._mp_policy.param_dtype
        cast = self._mp_policy.cast_forward_inputs
        if self._nonroot_cast_forward_inputs is not None and self._is_root is False:
            cast = self._nonroot_cast_forward_inputs
        if dt is None or not cast:
            return args, kwargs
        dt = _backend.to_dtype(dt)

        def cast(t):
            if _backend.is_floating_dtype(t.dtype) and t.dtype != dt:
                return t.to(dtype=dt)
            return t

        return _map_tensors(args, cast), _map_tensors(kwargs, cast)

    def _prefetch_forward(self):
        targets = self._states_to_forward_prefetch
        if targets is None:
            order = self._ctx.forward_order
            if not self._ctx.forward_order_frozen or self not in order:
                return
            i = order.index(self)
            targets = order[i + 1:i + 2]
        for st in targets:
            if st._param_group is not None:
                st._param_group.unshard(async_op=True)

    def _post_forward(self, module, args, output):
        g = self._param_group
        if g is not None:
            g.post_forward()
        if _trace.RECORDER is not None:
            _trace_end(self, "forward")
        self._ctx.post_forward_order.append(self)
        if is_grad_enabled():
            for t in _tensors_in(output, []):
                if t.requires_grad:
                    t.register_hook(self._pre_backward)
        return self._cast_output(output)  # every unit's output_dtype, as PyTorch's (not the root's only)

    # -- backward -------------------------------------------------------------------------------------
    def _pre_backward(self, grad):
        ctx = self._ctx
        if not ctx.final_callback_queued:
            ctx.final_callback_queued = True
            root = ctx.all_states[0]
            _engine.queue_callback(root._root_post_backward_final_callback)
        if self._pre_backward_hook_ran:
            return None
        self._pre_backward_hook_ran = True
        if _trace.RECORDER is not None:
            _trace_begin(self, "backward")
        g = self._param_group
        prefetch = None if self._backward_prefetch_post else self._prefetch_backward
        if g is not None:
            g.pre_backward(prefetch)
        elif prefetch is not None:
            prefetch()
        return None

    def _prefetch_backward(self):
        targets = self._states_to_backward_prefetch
        if targets is None:
            order = self._ctx.post_forward_order
            if self not in order:
                return
            i = len(order) - 1 - order[::-1].index(self)
            targets = order[i - 1:i] if i > 0 else []
        for st in targets:  # a group told not to unshard in backward is not gathered by a prefetch either
            if st._param_group is not None and st._param_group.unshard_in_backward:
                st._param_group.unshard(async_op=True)

    def _post_backward(self):
        g = self._param_group
        if g is not None:
            g.post_backward(self._ctx.reductions)
        if _trace.RECORDER is not None:
            _trace_end(self, "backward")
        if self._backward_prefetch_post:
            self._prefetch_backward()

    def _root_post_backward_final_callback(self):
        ctx = self._ctx
        for st in ctx.all_states:
            if st._param_group is not None:
                st._param_group.finalize(ctx.reductions, wait=ctx.is_last_backward)
            if _trace.RECORDER is not None:  # units whose backward ended here (inputs without grad)
                _trace_end(st, "backward")
            st._pre_backward_hook_ran = False
        ctx.final_callback_queued = False
        ctx.post_forward_order = []
        raise_finite_errors(st._param_group for st in ctx.all_states)

    def _reset_iter_state(self):
        ctx = self._ctx
        for st in ctx.all_states:
            st._pre_backward_hook_ran = False
            if st._param_group is not None:
                st._param_group.uses_left = 0
                st._param_group.pending_recomputes = 0
        ctx.final_callback_queued = False
        ctx.post_forward_order = []


def _check_no_shared_params(states, names) -> None:
    """One parameter object given to two fully_shard calls would become two shards trained apart (silently
    untied): PyTorch's ValueError instead."""
    seen = set()
    for st in states:
        for fp in (st._param_group.fsdp_params if st._param_group is not None else ()):
            if fp.orig_uid in seen:
                name = names.get(id(fp.sharded_param), fp.name)
                raise ValueError(
                    f"Parameter '{name}' is shared with a parameter already managed by another FSDP group. For "
                    "shared/tied parameters, use fully_shard([module_a, module_b]) to place them in the same FSDP "
                    "group.")
            seen.add(fp.orig_uid)


def _trace_unit(st) -> str:
    """The unit's module path under its root ("root" for the root), named once per recorder."""
    rec = _trace.RECORDER
    name = rec.units.get(id(st))
    if name is None:
        states = st._ctx.all_states or [st]
        where = {}
        for r in states[0]._modules:
            for n, m in r.named_modules():
                where.setdefault(id(m), n or "root")
        for s in states:
            rec.units[id(s)] = "+".join(where.get(id(m), type(m).__name__) for m in s._modules)
            if s._param_group is not None:
                rec.units[id(s._param_group)] = rec.units[id(s)]
        name = rec.units[id(st)]
    return name


def _trace_begin(st, phase: str) -> None:
    rec = _trace.RECORDER
    if phase == "forward" and st._is_root:
        rec.instant("iteration", "iteration", {"n": rec.iterations})
        rec.iterations += 1
    _trace_unit(st)  # names every unit of the root before its collectives are issued
    rec.begin((phase, id(st)))


def _trace_end(st, phase: str) -> None:
    unit = _trace_unit(st)
    _trace.RECORDER.end((phase, id(st)), f"{phase} {unit}", "compute", {"unit": unit})
