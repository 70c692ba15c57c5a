"""Tensor-parallel styles: Colwise-/RowwiseParallel (Linear, Embedding), SequenceParallel, PrepareModuleInput/Output."""

from __future__ import annotations

from hpcfsdp.distributed.device_mesh import DeviceMesh
from hpcfsdp.distributed.tensor._dtensor import DTensor, distribute_tensor
from hpcfsdp.distributed.tensor.parallel import _functions as fc
from hpcfsdp.distributed.tensor.placement_types import Replicate, Shard, _InterleavedShard

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
           "PrepareModuleOutput"]

# [Note: Local outputs]
# Parallelized modules compute on the local pieces of their DTensor parameters (F.linear and the other
# nn.functional ops run their autograd Functions on local arrays), with the communication in the autograd
# Functions of _functions.py. At the boundary they follow PyTorch: an input may be a plain local tensor (taken
# to be laid out as the style's input_layouts) or a DTensor (redistributed to them, differentiably); the
# output is this rank's local tensor with use_local_output=True, else a DTensor of the style's output
# layout (ColwiseParallel: Shard(-1) by default; RowwiseParallel: Replicate() or Shard(d); SequenceParallel:
# Shard(sequence_dim), its default, as PyTorch's), on which later ops dispatch (See [Note: DTensor op
# dispatch]). The gradient of a DTensor output moves as its local piece, the convention of _functions.py.


def _local_in(x, mesh, layout):
    """A plain local tensor of input ``x`` in ``layout``: a DTensor is redistributed (differentiable), a plain
    tensor is taken as already laid out so (See [Note: Local outputs])."""
    if isinstance(x, DTensor):
        return x.redistribute(mesh, [layout]).to_local()
    return x


def _whole_last(y, mesh, width):
    """The whole of ``y``, this rank's torch.chunk piece of a last dim of ``width`` (all-gathered; backward: own
    piece)."""
    shape = tuple(y.shape[:-1]) + (width,)
    return DTensor.from_local(y, mesh, [Shard(y.ndim - 1)], shape=shape).full_tensor()


def _dtensor_out(y, mesh, layout, use_local_output):
    """Output ``y`` (this rank's local piece in ``layout``) as the style returns it."""
    from hpcfsdp._tensor import Tensor

    if use_local_output or not isinstance(y, Tensor) or isinstance(y, DTensor):
        return y
    return DTensor.from_local(y, mesh, [layout], run_check=False)


def _placement(p, what):
    if p is None:
        return None
    if isinstance(p, (tuple, list)):
        if len(p) != 1:
            raise ValueError(f"{what}: expected one placement for a 1-D tensor-parallel mesh, got {p!r}")
        p = p[0]
    if not isinstance(p, (Shard, Replicate)):
        raise TypeError(f"{what}: expected Shard(dim) or Replicate(), got {p!r}")
    return p


def _mesh_1d(mesh, style):
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"{style}: device_mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"{style}: needs a 1-D tensor-parallel mesh (slice it, e.g. mesh['tp']), got {mesh!r}")
    return mesh


def _shard_param(module, name, mesh, placement, owner, uneven=False):
    p = module._parameters.get(name)
    if p is None:
        return
    if isinstance(p, DTensor):
        raise ValueError(f"{owner}: parameter {name!r} is already a DTensor ({p.placements} on {p.device_mesh!r}); "
                         "apply tensor parallelism before fully_shard and only once")
    n = mesh.size(0)
    if isinstance(placement, Shard) and p.shape[placement.dim] % n and not uneven:
        raise ValueError(f"{owner}: parameter {name!r} of shape {tuple(p.shape)} does not divide evenly over "
                         f"{n} tensor-parallel ranks along dim {placement.dim}")
    from hpcfsdp.nn import Parameter

    module._parameters[name] = Parameter(distribute_tensor(p.detach(), mesh, [placement]),
                                         requires_grad=p.requires_grad)


class ParallelStyle:
    """How one module is parallelized over a 1-D tensor-parallel mesh."""

    def _apply(self, module, device_mesh):  # pragma: no cover - interface
        raise NotImplementedError


class _LinearStyle(ParallelStyle):
    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True):
        name = type(self).__name__
        self.input_layouts = _placement(input_layouts, f"{name}(input_layouts)") or self._default_in
        self.output_layouts = _placement(output_layouts, f"{name}(output_layouts)") or self._default_out
        self.use_local_output = bool(use_local_output)

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts!r}, "
                f"output_layouts={self.output_layouts!r}, use_local_output={self.use_local_output})")


class ColwiseParallel(_LinearStyle):
    """Linear: weight Shard(0), bias Shard(0) (Embedding: weight Shard(1)). Input Replicate (or Shard(d):
    all-gathered), output Shard(-1) local (or Replicate: all-gathered)."""

    _default_in, _default_out = Replicate(), Shard(-1)

    def _weight_placement(self, module, mesh, owner):
        return Shard(0)

    def _apply(self, module, device_mesh):
        from hpcfsdp import nn

        mesh = _mesh_1d(device_mesh, type(self).__name__)
        owner = f"{type(self).__name__} on {type(module).__name__}"
        if isinstance(module, nn.Linear):
            placement = self._weight_placement(module, mesh, owner)
            uneven = type(placement) is Shard  # torch.chunk pieces, as PyTorch (not the packed q/k/v split)
            _shard_param(module, "weight", mesh, placement, owner, uneven)
            _shard_param(module, "bias", mesh, placement, owner, uneven)
        elif isinstance(module, nn.Embedding):
            _shard_param(module, "weight", mesh, Shard(1), owner)
        else:
            raise NotImplementedError(f"{owner}: only nn.Linear and nn.Embedding are supported")
        group = mesh.get_group(0)
        inp, out = self.input_layouts, self.output_layouts
        embedding = isinstance(module, nn.Embedding)
        width = module.weight.shape[1] if embedding else module.weight.shape[0]  # the output's global width

        def pre(mod, args):
            x = args[0]
            if embedding:
                if isinstance(x, DTensor):  # token ids: not differentiable, taken whole
                    return (x.full_tensor(),) + tuple(args[1:])
                return None
            x = _local_in(x, mesh, inp)
            # sharded input: all-gather forward, reduce-scatter backward (which also sums the partial input
            # gradients of the ranks' column pieces); replicated input: identity forward, all-reduce backward
            x = fc.all_gather_along(x, group, inp.dim) if isinstance(inp, Shard) else fc.copy_to_group(x, group)
            return (x,) + tuple(args[1:])

        def post(mod, args, y):
            if isinstance(out, Replicate):
                return _dtensor_out(_whole_last(y, mesh, width), mesh, out, self.use_local_output)
            if out.dim % y.ndim != y.ndim - 1:
                raise NotImplementedError(f"{owner}: output_layouts {out!r}: only Shard(-1) or Replicate()")
            if self.use_local_output:
                return y
            return DTensor.from_local(y, mesh, [Shard(y.ndim - 1)], shape=tuple(y.shape[:-1]) + (width,))

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


class _PackedColwiseParallel(ColwiseParallel):
    """ColwiseParallel for a Linear whose output packs ``blocks`` equal parts of ``heads`` heads each (a fused
    q/k/v projection: blocks=3, heads=n_head): every rank holds the rows (and bias entries) of its heads in each
    part, weight and bias ``_InterleavedShard(0, blocks)`` (see [Note: Interleaved shard]); its local output is
    [q, k, v] of its heads. ``heads`` must divide over the tensor-parallel ranks."""

    def __init__(self, blocks: int, heads: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(self.output_layouts, Replicate):  # gathering would interleave the ranks' parts
            raise NotImplementedError(f"{type(self).__name__}: output_layouts must be Shard(-1) (each rank's "
                                      "parts of its heads)")
        self.blocks, self.heads = blocks, heads

    def _weight_placement(self, module, mesh, owner):
        n = mesh.size(0)
        if module.out_features % self.blocks or (module.out_features // self.blocks) % self.heads:
            raise ValueError(f"{owner}: out_features {module.out_features} is not {self.blocks} parts of "
                             f"{self.heads} equal heads")
        if self.heads % n:
            raise ValueError(f"{owner}: n_head ({self.heads}) is not divisible by the tensor-parallel size ({n}); "
                             "attention is split by heads, so the tp size must divide the number of heads")
        return _InterleavedShard(0, self.blocks)

    def __repr__(self):
        return f"{super().__repr__()[:-1]}, blocks={self.blocks}, heads={self.heads})"


class RowwiseParallel(_LinearStyle):
    """Linear: weight Shard(1), bias Replicate (added after the reduction). Input Shard(-1) (or Replicate:
    sliced), output Replicate (all-reduce) or Shard(d) (reduce-scatter). Embedding: the vocabulary split
    (weight Shard(0)); ids Replicate (or Shard(d): all-gathered)."""

    _default_in, _default_out = Shard(-1), Replicate()

    def _apply(self, module, device_mesh):
        from hpcfsdp import nn
        from hpcfsdp.nn import functional as F

        mesh = _mesh_1d(device_mesh, "RowwiseParallel")
        owner = f"RowwiseParallel on {type(module).__name__}"
        if isinstance(module, nn.Embedding):
            return self._apply_embedding(module, mesh, owner)
        if not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{owner}: only nn.Linear and nn.Embedding are supported")
        _shard_param(module, "weight", mesh, Shard(1), owner, uneven=True)
        _shard_param(module, "bias", mesh, Replicate(), owner)
        group = mesh.get_group(0)
        inp, out = self.input_layouts, self.output_layouts

        def forward(x):
            x = _local_in(x, mesh, inp)
            if isinstance(inp, Replicate):  # this rank's columns (torch.chunk pieces); all-gather backward
                x = DTensor.from_local(x, mesh, [Replicate()]).redistribute(mesh, [Shard(x.ndim - 1)]).to_local()
            elif inp.dim % x.ndim != x.ndim - 1:
                raise NotImplementedError(f"{owner}: input_layouts {inp!r}: only Shard(-1) or Replicate()")
            y = F.linear(x, module.weight)
            if isinstance(out, Replicate):
                y = fc.reduce_from_group(y, group)
                y = y if module.bias is None else y + module.bias
            else:
                y = fc.reduce_scatter_along(y, group, out.dim)
                # a replicated bias added to a sequence shard: its gradient is summed over the group
                y = y if module.bias is None else y + fc.copy_to_group(module.bias, group)
            return _dtensor_out(y, mesh, out, self.use_local_output)

        module.forward = forward
        return module

    def _apply_embedding(self, module, mesh, owner):
        """Vocabulary-parallel Embedding: weight Shard(0) (each rank a contiguous block of the vocabulary);
        ids outside the local block look up zeros, and the partial rows are summed (or reduce-scattered)."""
        import numpy as np

        from hpcfsdp._backend import array_module
        from hpcfsdp._tensor import Tensor
        from hpcfsdp.nn import functional as F

        if module.padding_idx is not None or module.max_norm is not None:
            raise NotImplementedError(f"{owner}: padding_idx and max_norm are not supported with a split vocabulary")
        _shard_param(module, "weight", mesh, Shard(0), owner)
        group = mesh.get_group(0)
        rows = module.weight._data.shape[0]
        start = group.rank() * rows
        inp, out = self.input_layouts, self.output_layouts

        def forward(idx):
            if isinstance(idx, DTensor):  # token ids: not differentiable, taken whole
                idx = idx.full_tensor()
            elif isinstance(inp, Shard):  # token ids are not differentiable: a plain all-gather
                ids = idx._data if isinstance(idx, Tensor) else np.asarray(idx)
                idx = Tensor._wrap(fc._all_gather(ids, group, inp.dim % ids.ndim))
            ids = idx._data if isinstance(idx, Tensor) else np.asarray(idx)
            xp = array_module(ids)
            local = ids - start
            mask = (local >= 0) & (local < rows)
            y = F.embedding(Tensor._wrap(xp.where(mask, local, 0)), module.weight)
            y = y * Tensor._wrap(mask[..., None].astype(y._data.dtype))
            y = fc.reduce_from_group(y, group) if isinstance(out, Replicate) else \
                fc.reduce_scatter_along(y, group, out.dim)
            return _dtensor_out(y, mesh, out, self.use_local_output)

        module.forward = forward
        return module


class SequenceParallel(ParallelStyle):
    """Run a module (LayerNorm, RMSNorm, Dropout, ...) on this rank's shard of the sequence dim: parameters
    Replicate over the tp mesh, input and output Shard(``sequence_dim``): a DTensor input is redistributed to
    it, a plain one is taken as this rank's shard; the output is a DTensor (use_local_output=False, PyTorch's
    default) or its local tensor (see [Note: Local outputs]). Each parameter enters the computation through an identity whose backward sums the gradient
    over the group, since each rank's gradient covers only its part of the sequence. Pairs with
    ``ColwiseParallel(input_layouts=Shard(1))`` (all-gather on the sequence in, reduce-scatter back) and
    ``RowwiseParallel(output_layouts=Shard(1))`` (reduce-scatter on the sequence out, all-gather back)."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        if isinstance(sequence_dim, bool) or not isinstance(sequence_dim, int):
            raise TypeError(f"SequenceParallel(sequence_dim={sequence_dim!r}): expected an int")
        self.sequence_dim = sequence_dim
        self.use_local_output = bool(use_local_output)

    def __repr__(self):
        return f"SequenceParallel(sequence_dim={self.sequence_dim}, use_local_output={self.use_local_output})"

    def _apply(self, module, device_mesh):
        mesh = _mesh_1d(device_mesh, "SequenceParallel")
        owner = f"SequenceParallel on {type(module).__name__}"
        for m in module.modules():
            for name in list(m._parameters):
                _shard_param(m, name, mesh, Replicate(), owner)
        group = mesh.get_group(0)
        orig = module.forward
        seq = self.sequence_dim

        def forward(*args, **kwargs):
            if args and isinstance(args[0], DTensor):
                args = (_local_in(args[0], mesh, Shard(seq % args[0].ndim)),) + tuple(args[1:])
            x = args[0] if args else None
            if x is not None and hasattr(x, "ndim") and not -x.ndim <= seq < x.ndim:
                raise ValueError(f"{owner}: sequence_dim {seq} is out of range for an input of shape {tuple(x.shape)}")
            saved = []
            for m in module.modules():
                for name, p in list(m._parameters.items()):
                    if p is not None and p.requires_grad:
                        saved.append((m, name, p))
                        m._parameters[name] = fc.copy_to_group(p, group)
            try:
                y = orig(*args, **kwargs)
                if hasattr(y, "ndim"):
                    y = _dtensor_out(y, mesh, Shard(seq % y.ndim), self.use_local_output)
                return y
            finally:
                for m, name, p in saved:
                    m._parameters[name] = p

        module.forward = forward
        return module


def _layouts(value, what):
    """A placement or a tuple of (placement or None) -> tuple of (placement or None)."""
    if value is None:
        return None
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for p in items:
        if p is not None and not isinstance(p, (Shard, Replicate)):
            raise TypeError(f"{what}: expected Shard(dim), Replicate() or None, got {p!r}")
    return items


def _convert(x, src, dst, mesh, use_local_output):
    """Input or output ``x`` from layout ``src`` (a plain tensor is taken as this rank's piece of it; a DTensor
    is taken as it is) to ``dst`` (None: left as it is), as PyTorch's PrepareModuleInput/Output: a DTensor,
    or its local tensor with ``use_local_output``. Differentiable (See [Note: Local outputs])."""
    from hpcfsdp._tensor import Tensor

    if src is None or not isinstance(x, Tensor):
        return x
    dt = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [src], run_check=False)
    if dst is not None and dst != src:
        dt = dt.redistribute(mesh, [dst])
    return dt.to_local() if use_local_output else dt


def _pair(src, dst, what):
    if src is None or dst is None:
        raise ValueError(f"{what}: both the current and the desired layouts are required")
    if len(src) != len(dst):
        raise ValueError(f"{what}: {len(src)} current layouts but {len(dst)} desired ones")
    return src, dst


class PrepareModuleInput(ParallelStyle):
    """Convert a module's positional inputs from ``input_layouts`` to ``desired_input_layouts`` on the
    tensor-parallel mesh (one entry per input, None: left alone), as PyTorch: each converted input is a DTensor,
    or its local tensor with ``use_local_output=True`` (see [Note: Local outputs]). Keyword inputs are not
    converted."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False):
        if input_kwarg_layouts or desired_input_kwarg_layouts:
            raise NotImplementedError("PrepareModuleInput: input_kwarg_layouts are not supported")
        self.input_layouts, self.desired_input_layouts = _pair(
            _layouts(input_layouts, "PrepareModuleInput(input_layouts)"),
            _layouts(desired_input_layouts, "PrepareModuleInput(desired_input_layouts)"), "PrepareModuleInput")
        self.use_local_output = bool(use_local_output)

    def _apply(self, module, device_mesh):
        mesh = _mesh_1d(device_mesh, "PrepareModuleInput")
        src, dst = self.input_layouts, self.desired_input_layouts
        local = self.use_local_output

        def pre(mod, args):
            if len(args) < len(src):
                raise ValueError(f"PrepareModuleInput on {type(mod).__name__}: {len(src)} input layouts for "
                                 f"{len(args)} positional inputs")
            return tuple(_convert(a, s, d, mesh, local) for a, s, d in zip(args, src, dst)) + \
                tuple(args[len(src):])

        module.register_forward_pre_hook(pre)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Convert a module's output (a local tensor, or a tuple of them) from ``output_layouts`` to
    ``desired_output_layouts`` on the tensor-parallel mesh, as PrepareModuleInput does for inputs."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True):
        self.output_layouts, self.desired_output_layouts = _pair(
            _layouts(output_layouts, "PrepareModuleOutput(output_layouts)"),
            _layouts(desired_output_layouts, "PrepareModuleOutput(desired_output_layouts)"), "PrepareModuleOutput")
        self.use_local_output = bool(use_local_output)

    def _apply(self, module, device_mesh):
        mesh = _mesh_1d(device_mesh, "PrepareModuleOutput")
        src, dst = self.output_layouts, self.desired_output_layouts
        local = self.use_local_output

        def post(mod, args, out):
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != len(src):
                raise ValueError(f"PrepareModuleOutput on {type(mod).__name__}: {len(src)} output layouts for "
                                 f"{len(outs)} outputs")
            new = tuple(_convert(o, s, d, mesh, local) for o, s, d in zip(outs, src, dst))
            return new if isinstance(out, tuple) else new[0]

        module.register_forward_hook(post)
        return module
