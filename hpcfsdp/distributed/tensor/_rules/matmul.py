"""Sharding rules of the matmul family: matmul/@, mm, bmm, dot, outer, addmm, baddbmm, einsum.

[Note: Matmul placements]
A Partial("sum") operand beside Replicate ones stays Partial (the product is linear in it; not in
addmm/baddbmm). Otherwise each operand dim gets a label as in einsum (matmul: batch dims aligned from the right, then m, k / k, n; a
dim of size 1 that broadcasts against a larger one is its own, unshared label). Per mesh dim, Partial
operands are reduced first; then the first operand sharded there along a label decides: every operand with
that label is laid out Shard of it, every other operand Replicate (a redistribution where an operand is laid
out otherwise), and the result is Shard of the label's result dim, or Partial("sum") where the label is
contracted (Shard(1) @ Shard(0)). So Shard(0) @ Replicate is Shard(0), Replicate @ Shard(1) is Shard(1),
batch dims sharded alike stay, and nothing is ever computed on mismatched pieces. addmm/baddbmm add their
input once: a contracted label is not kept there (the operands sharded along it are gathered).

An operand used whole (Replicate) on a mesh dim where the result is Shard or Partial meets only this rank's
piece of the computation, so its local gradient is a partial sum: ``_SumGrad`` all-reduces it over those mesh
dims in the backward (PyTorch's Partial gradient of a replicated operand, reduced).
"""
from __future__ import annotations

from hpcfsdp.distributed.tensor._dispatch import OpCall, _is_dt, _SumGrad, local_args, register_rule, wrap
from hpcfsdp.distributed.tensor._rules.view import bound, fallback
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate, Shard

_BATCH = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _matmul_labels(sa, sb):
    """(labels of a, labels of b, labels of the result) of ``a @ b`` for shapes ``sa``, ``sb``."""
    la = ["m", "k"] if len(sa) >= 2 else ["k"]
    lb = ["k", "n"] if len(sb) >= 2 else ["k"]
    ba, bb = len(sa) - len(la), len(sb) - len(lb)
    nb = max(ba, bb)
    batch = []
    for j in range(nb):  # j-th batch dim of the result, from the left
        ia, ib = j - (nb - ba), j - (nb - bb)
        xa = sa[ia] if ia >= 0 else None
        xb = sb[ib] if ib >= 0 else None
        batch.append((_BATCH[j], xa, xb))
    pa = [lab if xa is not None and (xa != 1 or xb in (None, 1)) else lab + "#a"
          for lab, xa, xb in batch if xa is not None]
    pb = [lab if xb is not None and (xb != 1 or xa in (None, 1)) else lab + "#b"
          for lab, xa, xb in batch if xb is not None]
    out = [lab for lab, _, _ in batch]
    if len(sa) >= 2:
        out.append("m")
    if len(sb) >= 2:
        out.append("n")
    return pa + la, pb + lb, out


def _einsum_labels(eq, operands):
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        return None
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    n_ell = max([o.ndim - (len(s) - 3) for s, o in zip(ins, operands) if "..." in s], default=0)
    ell = "".join(free[:n_ell])
    ins = [s.replace("...", ell[len(ell) - (o.ndim - (len(s) - 3)):]) if "..." in s else s
           for s, o in zip(ins, operands)]  # ellipsis dims align from the right
    if any(len(s) != o.ndim for s, o in zip(ins, operands)):
        return None
    if arrow:
        rhs = rhs.replace("...", ell)
    else:
        letters = "".join(ins)
        rhs = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    labels = [list(s) for s in ins]
    for s, o in zip(labels, operands):  # broadcast size-1 dims get their own label
        for k, c in enumerate(s):
            if o.shape[k] == 1 and any(o2.shape[s2.index(c)] != 1 for s2, o2 in zip(labels, operands) if c in s2):
                s[k] = c + "#"
    return labels, list(rhs)


def _layout(call: OpCall):
    """(operands in label order, their labels, result labels, labels not to contract-shard) or None."""
    name = call.entry.name
    a = bound(call)
    if name == "einsum":
        ops = list(a["operands"])
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = list(ops[0])
        got = _einsum_labels(a["equation"], ops)
        if got is None:
            return None
        return ops, got[0], got[1], False
    if name == "__rmatmul__":
        x, y = a["other"], a["self"]
    else:
        x = a["self"]
        y = a.get("other", a.get("mat2", a.get("vec2")))
    if name in ("addmm", "baddbmm"):
        m1, m2 = (a["mat1"], a["mat2"]) if name == "addmm" else (a["batch1"], a["batch2"])
        l1, l2, lo = _matmul_labels(tuple(m1.shape), tuple(m2.shape))
        inp = a["self"]
        li = lo[len(lo) - inp.ndim:] if inp.ndim else []
        li = [c if inp.shape[k] != 1 or _size(c, l1, m1, l2, m2) == 1 else c + "#" for k, c in enumerate(li)]
        return [inp, m1, m2], [li, l1, l2], lo, True
    if name == "outer":
        return [x, y], [["m"], ["n"]], ["m", "n"], False
    la, lb, lo = _matmul_labels(tuple(x.shape), tuple(y.shape))
    return [x, y], [la, lb], lo, False


def _size(c, l1, m1, l2, m2):
    for labs, t in ((l1, m1), (l2, m2)):
        if c in labs:
            return t.shape[labs.index(c)]
    return 1


def matmul(call: OpCall):
    lay = _layout(call)
    if lay is None or any(isinstance(p, Shard) and type(p) is not Shard for d in call.dtensors
                          for p in d._spec.placements):
        return fallback(call)
    ops, labels, out_labels, no_contract = lay
    if any(len(set(labs)) != len(labs) for labs in labels):  # a diagonal ("ii->i")
        return fallback(call)
    mesh = call.mesh
    targets = {id(o): [None] * mesh.ndim for o in ops if _is_dt(o)}
    out_pl = []
    for i in range(mesh.ndim):
        pls = [o._spec.placements[i] for o in ops if _is_dt(o)]
        partial = [p for p in pls if isinstance(p, Partial)]
        if (not no_contract and len(partial) == 1 and partial[0].reduce_op == "sum"
                and all(isinstance(p, (Replicate, Partial)) for p in pls)):
            for o in ops:  # linear in its one Partial operand: the result stays Partial
                if _is_dt(o):
                    targets[id(o)][i] = o._spec.placements[i]
            out_pl.append(Partial("sum"))
            continue
        chosen = None
        for o, labs in zip(ops, labels):
            if _is_dt(o):
                p = o._spec.placements[i]
                if (isinstance(p, Shard) and "#" not in labs[p.dim]
                        and labs[p.dim] in (out_labels if no_contract else labs)):
                    chosen = labs[p.dim]
                    break
        for o, labs in zip(ops, labels):
            if _is_dt(o):
                targets[id(o)][i] = Shard(labs.index(chosen)) if chosen in labs else Replicate()
        if chosen is None:
            out_pl.append(Replicate())
        elif chosen in out_labels:
            out_pl.append(Shard(out_labels.index(chosen)))
        else:
            out_pl.append(Partial("sum"))
    for d in call.dtensors:
        if id(d) not in targets:  # a DTensor operand the labels do not see
            return fallback(call)
    args, kwargs = local_args(call, [tuple(targets[id(d)]) for d in call.dtensors])
    summed = {}
    for d in call.dtensors:
        dims = tuple(i for i, p in enumerate(targets[id(d)]) if isinstance(p, Replicate)
                     and not isinstance(out_pl[i], Replicate))
        if dims and d.requires_grad:
            summed[id(d)] = dims
    if summed:
        it = iter(call.dtensors)

        def conv(local, orig):
            if _is_dt(orig):
                d = next(it)
                if id(d) in summed:
                    return _SumGrad.apply(local, mesh, summed[id(d)])
            return local

        def walk(loc, orig):
            if isinstance(orig, (list, tuple)):
                return type(orig)(conv(x, o) for x, o in zip(loc, orig))
            return conv(loc, orig)

        args = tuple(walk(x, o) for x, o in zip(args, call.args))
        kwargs = {k: walk(v, call.kwargs[k]) for k, v in kwargs.items()}
    out = call.compute(*args, **kwargs)
    sizes = {}
    for o, labs in zip(ops, labels):
        for c, n in zip(labs, o.shape):
            sizes[c] = max(sizes.get(c, 1), n)
    shape = [sizes.get(c, 1) for c in out_labels]
    return wrap(out, mesh, out_pl, shape)


register_rule(matmul, "matmul", "__rmatmul__", "mm", "bmm", "dot", "outer", "addmm", "baddbmm", "einsum")
