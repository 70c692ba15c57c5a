"""Training state in host memory: a rank's image, copies of it on a partner rank, and the restore that reshards
the survivors' images onto a new world.

[Note: Partner copies]
SCR's partner scheme: every ``interval`` committed steps each rank copies its state (what a checkpoint of it
would hold: its shards of the parameters and of the optimizer state, and the JSON values) into one host
buffer, its *image*, and sends the image to its partner: the rank with the same local index on the next host
(the next rank when the job has one host), which keeps it in its own memory. The send is nonblocking and is
finished at the next copy, so a step stalls for the local copy only. Each rank keeps its own last two images
and the last two it received from each rank that sends to it (a copy in flight when a rank dies may have
reached some partners and not others: the one before is complete everywhere), so the memory cost is four
images of the rank's state at most (two while only one generation exists). An image is lost with both the
rank and its partner (two hosts at once); the disk checkpoint then takes over.

[Note: Restoring from images]
After a recovery every survivor holds images of old ranks: its own (and, with HYBRID_SHARD, the live state of
its replica peers is the same), and those of the ranks that sent to it. ``restore`` fills a state dict of
the new world (its DTensors sharded on the new mesh) from them, as ``dcp.load`` fills one from a checkpoint
written at another world size: the survivors exchange which boxes of which tensors they hold (one
allgather), each rank picks for every box it needs the held boxes that cover it (identical boxes, the
replicas, once: its own first), asks their holders for the overlaps and gets them (two alltoalls). A box not
covered exactly is an error on every rank: nothing is guessed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcfsdp import _backend
from hpcfsdp.distributed._mpi import get_mpi

__all__ = ["Image", "take_image", "restore", "PartnerCopies", "StateLost"]

_ALIGN = 64


class StateLost(RuntimeError):
    """No step's state survives complete in memory (a rank and its partner were lost together)."""


@dataclass
class Image:
    """One rank's state at one step in one host buffer: ``entries`` say where each box of each tensor lies."""

    rank: int  # the rank it was taken on, in the world of that time
    step: int
    skeleton: Any  # the state dict's JSON values, with tensor placeholders (checkpoint._walk)
    entries: list  # [name, global shape, dtype name, offsets, local shape, byte offset]
    buf: np.ndarray = field(repr=False)  # uint8

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes)

    def boxes(self):
        """(name, global shape, offsets, array view of ``buf``) for every box."""
        from hpcfsdp.distributed.checkpoint._metadata import DTYPES

        for name, shape, dt, off, lshape, at in self.entries:
            dtype = DTYPES[dt]
            n = int(np.prod(lshape, dtype=np.int64)) * dtype.itemsize
            yield name, tuple(shape), tuple(off), self.buf[at:at + n].view(dtype).reshape(lshape)

    def header(self) -> bytes:
        return json.dumps({"rank": self.rank, "step": self.step, "skeleton": self.skeleton,
                           "entries": self.entries}).encode()

    @classmethod
    def from_parts(cls, header: bytes, buf: np.ndarray) -> "Image":
        h = json.loads(header.decode())
        return cls(int(h["rank"]), int(h["step"]), h["skeleton"], h["entries"], buf)


def _tensors(state_dict):
    from hpcfsdp.distributed.checkpoint import _stateful_to_state_dict, _walk

    tensors: dict = {}
    skeleton = _walk(_stateful_to_state_dict(state_dict), "", tensors, None)
    return tensors, skeleton


def take_image(state_dict, *, rank: int, step: int) -> Image:
    """Copy this rank's part of ``state_dict`` into one host buffer (local: no communication)."""
    from hpcfsdp.distributed.checkpoint import _boxes
    from hpcfsdp.distributed.checkpoint._metadata import dtype_name

    tensors, skeleton = _tensors(state_dict)
    entries, views, total = [], [], 0
    for name, t in tensors.items():
        for shape, off, arr in _boxes(t, host=False):
            entries.append([name, list(shape), dtype_name(arr.dtype), [int(o) for o in off], list(arr.shape), total])
            views.append(arr)
            total += -(-arr.nbytes // _ALIGN) * _ALIGN
    buf = np.empty(total, np.uint8)
    for e, arr in zip(entries, views):
        dst = buf[e[5]:e[5] + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        dst[...] = _backend.to_numpy(arr)
    return Image(rank, step, skeleton, entries, buf)


# ------------------------------------------------------------------------------------------------ restore


def _overlap(a_off, a_shape, b_off, b_shape):
    """The intersection of two boxes as (lo, hi) per dimension, or None."""
    lo = tuple(max(x, y) for x, y in zip(a_off, b_off))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a_off, a_shape, b_off, b_shape))
    return None if any(h <= q for q, h in zip(lo, hi)) else (lo, hi)


def _sl(lo, hi, base):
    return tuple(slice(q - b, h - b) for q, h, b in zip(lo, hi, base))


def restore(state_dict, images: list, comm) -> int | None:
    """Fill ``state_dict`` (this world's sharding; tensors in place, JSON values replaced) from the newest step
    whose images, over all ranks of ``comm``, cover it exactly (``images``: this rank's); return that step, or
    None (nothing filled) when no rank holds any image. Collective over ``comm``; StateLost on every rank when
    no step is complete. See [Note: Restoring from images]."""
    everyone = comm.allgather([(im.rank, im.step, [(name, off, a.shape) for name, _, off, a in im.boxes()])
                               for im in images])
    if not any(everyone):
        return None
    tensors, _ = _tensors(state_dict)
    why = ""
    for step in sorted({st for held in everyone for _, st, _ in held}, reverse=True):
        asks, plan, problems = _plan(tensors, everyone, comm.Get_rank(), step)
        bad = [p for ps in comm.allgather(problems[:3]) for p in ps]
        if not bad:
            _transfer(asks, plan, [im for im in images if im.step == step], comm)
            skels = comm.allgather(next((im.skeleton for im in images if im.step == step), None))
            _fill_json(next(s for s in skels if s is not None), state_dict)
            return step
        why = why or f"step {step}: {'; '.join(bad[:3])}"
    raise StateLost(f"no step's state is complete in the survivors' memory ({why or 'no images'})")


def _fill_json(skel, state_dict) -> None:
    from hpcfsdp.distributed.checkpoint import _fill

    _fill(skel, state_dict, "")


def _plan(tensors, everyone, me: int, step: int):
    """What to ask each holder for (asks) and where each answer goes (plan) to fill ``tensors`` from the images
    of ``step``; problems: the boxes not covered exactly."""
    from hpcfsdp.distributed.checkpoint import _local_views

    # the candidate boxes of every tensor, identical boxes (replicas) once: this rank's copy first
    cands: dict[str, dict] = {}
    for holder in [me] + [h for h in range(len(everyone)) if h != me]:
        for irank, st, boxes in everyone[holder]:
            if st != step:
                continue
            for i, (name, off, shape) in enumerate(boxes):
                cands.setdefault(name, {}).setdefault((tuple(off), tuple(shape)), (holder, irank, i))
    asks: list[list] = [[] for _ in everyone]
    plan, problems = [], []
    for name, t in tensors.items():
        for off, view in _local_views(t):
            host = view if isinstance(view, np.ndarray) else np.empty(view.shape, view.dtype)
            need, got = int(np.prod(view.shape, dtype=np.int64)), 0
            for (c_off, c_shape), (holder, irank, i) in (cands.get(name) or {}).items():
                ov = _overlap(off, view.shape, c_off, c_shape)
                if ov is not None:
                    got += int(np.prod([h - q for q, h in zip(*ov)], dtype=np.int64))
                    asks[holder].append((irank, i, _sl(*ov, c_off)))
                    plan.append((holder, host, _sl(*ov, off)))
            if got != need:
                problems.append(f"{name} at {tuple(off)}: {got} of {need} elements held")
            if host is not view:
                plan.append((None, view, host))
    return asks, plan, problems


def _transfer(asks, plan, images, comm) -> None:
    """Answer every rank's asks from this rank's images; write the answers to this rank's as planned."""
    by_rank = {im.rank: list(im.boxes()) for im in images}
    replies = [[np.array(by_rank[irank][i][3][sl], copy=True)  # (0-d stays 0-d)
                 for irank, i, sl in ask]
               for ask in comm.alltoall(asks)]
    data = comm.alltoall(replies)
    cursor = [0] * comm.Get_size()
    for holder, dst, sl in plan:
        if holder is None:  # a device view, from the host copy just filled
            dst[...] = _backend.array_module(dst).asarray(sl)
            continue
        dst[sl] = data[holder][cursor[holder]]
        cursor[holder] += 1


# ------------------------------------------------------------------------------------------ partner copies


def _partner_of(node_of_rank: list, rank: int) -> int | None:
    """The rank with ``rank``'s local index on the next host (the next rank on a one-host job); None alone."""
    n = len(node_of_rank)
    if n == 1:
        return None
    hosts = sorted(set(node_of_rank))
    if len(hosts) == 1:
        return (rank + 1) % n
    members = {h: [r for r in range(n) if node_of_rank[r] == h] for h in hosts}
    h = node_of_rank[rank]
    nxt = members[hosts[(hosts.index(h) + 1) % len(hosts)]]
    return nxt[members[h].index(rank) % len(nxt)]


class PartnerCopies:
    """This rank's last images and those its senders copied to it. See [Note: Partner copies]. ``setup`` and
    ``save`` are collective over the default group; ``send=False`` keeps the own images only."""

    def __init__(self, interval: int, send: bool = True):
        if interval < 0:
            raise ValueError(f"memory checkpoint interval {interval}: expected >= 0 (0: none)")
        self.interval, self.send = int(interval), bool(send)
        self.own: list[Image] = []  # the last two, oldest first
        self.held: dict[int, list[Image]] = {}  # sender rank -> its last two images, oldest first
        self._inflight = None  # (reqs, [(sender, header buffer, data buffer)])
        self.comm = None
        self.stall_s: list[float] = []  # per save: the time the step waited

    def setup(self) -> None:
        """On the current default group (collective): a communicator of its own and the partner layout."""
        from hpcfsdp.distributed import _c10d_groups
        from hpcfsdp.distributed import _comm_thread as CT
        from hpcfsdp.distributed._mpi import node_layout

        from ._world import track

        pg = _c10d_groups.default_group()
        self.comm = CT.call_sync("Comm.Dup (partner copies)", pg.comm.Dup)
        track(self.comm)
        nodes = CT.call_sync("node layout (partner copies)", lambda: node_layout(self.comm))["node_of_rank"]
        w, r = self.comm.Get_size(), self.comm.Get_rank()
        self.partner = _partner_of(nodes, r) if self.send else None
        self.senders = [q for q in range(w) if self.send and _partner_of(nodes, q) == r]
        self.own, self.held, self._inflight = [], {}, None

    def due(self, step: int) -> bool:
        return self.interval > 0 and step % self.interval == 0

    def memory_bytes(self) -> int:
        return sum(im.nbytes for im in self.own) + sum(im.nbytes for ims in self.held.values() for im in ims)

    def _finish(self, block: bool) -> bool:
        """Complete the copies in flight (block) or test them; keep what arrived. Whether none is left."""
        if self._inflight is None:
            return True
        MPI = get_mpi()
        reqs, incoming, step = self._inflight
        if block:
            MPI.Request.Waitall(reqs)
        elif not MPI.Request.Testall(reqs):
            return False
        for sender, hbuf, dbuf in incoming:
            self.held[sender] = (self.held.get(sender, []) + [Image.from_parts(hbuf.tobytes(), dbuf)])[-2:]
        self._inflight = None
        return True

    def save(self, state_dict, step: int) -> Image:
        """Take this rank's image of ``step`` and start copying it to the partner (collective)."""
        from hpcfsdp.distributed import _comm_thread as CT

        t0 = time.perf_counter()
        CT.call_sync("partner copies: finish", lambda: self._finish(block=True))
        img = take_image(state_dict, rank=self.comm.Get_rank(), step=step)
        self.own = (self.own + [img])[-2:]
        if self.partner is not None or self.senders:
            hdr = np.frombuffer(img.header(), np.uint8)
            self._inflight = CT.call_sync("partner copies: start", lambda: self._start(hdr, img, step))
        self.stall_s.append(time.perf_counter() - t0)
        return img

    def _start(self, hdr, img, step):
        w = self.comm.Get_size()
        sizes = np.zeros((w, 2), np.int64)
        if self.partner is not None:
            sizes[self.partner] = (hdr.nbytes, img.nbytes)
        got = np.empty_like(sizes)
        self.comm.Alltoall(sizes, got)
        reqs, incoming = [], []
        for q in self.senders:
            hbuf, dbuf = np.empty(int(got[q, 0]), np.uint8), np.empty(int(got[q, 1]), np.uint8)
            reqs += [self.comm.Irecv(hbuf, source=q, tag=1), self.comm.Irecv(dbuf, source=q, tag=2)]
            incoming.append((q, hbuf, dbuf))
        if self.partner is not None:
            reqs += [self.comm.Isend(hdr, dest=self.partner, tag=1), self.comm.Isend(img.buf, dest=self.partner, tag=2)]
        return reqs, incoming, step

    def salvage(self) -> None:
        """After a failure: keep whatever copy in flight has completed (never raises)."""
        try:
            self._finish(block=False)
        except Exception:  # the requests of a revoked communicator
            pass
        self._inflight = None

    def images(self) -> list:
        """Every image this rank holds: its own, newest first, then those sent to it."""
        return [im for im in reversed(self.own)] + [im for ims in self.held.values() for im in reversed(ims)]
