"""FSDP's fused copies (hpcfsdp/_kernels/fsdp.cu): one launch per group each way, equal to the per-parameter copies
of ParamLayout (gathered / scatter_into) for uneven rows, padding and parameters without gradient.

Marked `gpu`: runs on the simulated device (HPCFSDP_CUDA_SIM=1) or a real GPU.
"""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp._kernels import fsdp as F
from hpcfsdp.distributed.fsdp._fully_shard._fsdp_param import ParamLayout

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(5, 3), (8,), (1, 4), (7, 2, 3), (2,)]  # rows 5, 8, 1, 7, 2 over 4 ranks: padding, empty pieces


def _layouts(world):
    lays, off = [], 0
    for s in SHAPES:
        lay = ParamLayout(s[0], s[1:], world, 0)
        lay.offset = off
        off += lay.numel
        lays.append(lay)
    return lays, off + 3  # trailing group padding


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
def test_copy_out_equals_the_per_parameter_copies(world, dtype):
    lays, total = _layouts(world)
    rng = np.random.default_rng(world)
    out = rng.standard_normal(world * total).astype(dtype)
    fulls = F.GroupCopies(lays, total, world).copy_out(cp.asarray(out))
    for lay, flat in zip(lays, fulls):
        ref = lay.gathered(out, total, np, dtype)
        np.testing.assert_array_equal(flat.get().reshape(ref.shape).view(np.uint8), ref.view(np.uint8))
        assert flat.flags.c_contiguous


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("gdt,idt", [(np.float32, np.float32), (BF16, np.float32), (BF16, BF16)])
def test_copy_in_equals_the_per_parameter_copies_and_zeroes_what_has_no_gradient(world, gdt, idt):
    lays, total = _layouts(world)
    rng = np.random.default_rng(7)
    grads = [rng.standard_normal(s).astype(gdt) for s in SHAPES]
    grads[2] = None
    ref = np.full(world * total, 5, idt)  # what the per-parameter path writes (group padding left alone)
    for lay, g in zip(lays, grads):
        if g is None:
            ref.reshape(world, total)[:, lay.offset:lay.offset + lay.numel] = 0
        else:
            lay.scatter_into(ref, total, g)
    inp = cp.full(world * total, 5, idt)
    F.GroupCopies(lays, total, world).copy_in([None if g is None else cp.asarray(g) for g in grads], inp)
    got = inp.get().reshape(world, total)
    np.testing.assert_array_equal(got[:, :total - 3].view(np.uint8), ref.reshape(world, total)[:, :total - 3]
                                  .view(np.uint8))
    assert (got[:, total - 3:] == 0).all()  # the padding after the last parameter is zeroed, never stale


def test_one_launch_each_way():
    from hpcfsdp.testing import cuda_sim
    lays, total = _layouts(4)
    copies = F.GroupCopies(lays, total, 4)
    out = cp.zeros(4 * total, np.float32)
    copies.copy_out(out)  # the first call uploads the metadata
    grads = [cp.ones(s, np.float32) for s in SHAPES]
    inp = cp.empty(4 * total, np.float32)
    with cuda_sim.counting() as c:
        copies.copy_out(out)
        copies.copy_in(grads, inp)  # the address table goes up from pinned memory: no launch, no sync
    assert dict(c.launches_by_op) == {"kernel fsdp_copy_out<float>": 1, "kernel fsdp_copy_in<float>": 1}
    assert c.host_syncs == []
