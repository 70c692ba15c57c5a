"""Learning-rate schedulers against their closed forms."""
import math

import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import SGD
from hpcfsdp.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR


def _opt(lr=0.1, groups=1):
    ps = [nn.Parameter(hp.zeros(1)) for _ in range(groups)]
    return SGD([{"params": [p], "lr": lr * (i + 1)} for i, p in enumerate(ps)], lr=lr)


def _lrs(opt, sched, n):
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_lambda_lr():
    opt = _opt(0.5, groups=2)
    s = LambdaLR(opt, [lambda e: 0.9**e, lambda e: 1.0 / (e + 1)])
    for e in range(6):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * 0.9**e)
        assert opt.param_groups[1]["lr"] == pytest.approx(1.0 / (e + 1))
        assert s.get_last_lr() == [g["lr"] for g in opt.param_groups]
        s.step()
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        LambdaLR(opt, [lambda e: 1.0])


def test_cosine_annealing_closed_form():
    opt = _opt(0.2)
    s = CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
    lrs = _lrs(opt, s, 15)
    for e, lr in enumerate(lrs):
        assert lr == pytest.approx(0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * e / 10)) / 2, abs=1e-12)
    assert lrs[10] == pytest.approx(0.01)


def test_linear_lr():
    opt = _opt(0.3)
    s = LinearLR(opt, start_factor=0.25, end_factor=1.0, total_iters=4)
    lrs = _lrs(opt, s, 7)
    for e, lr in enumerate(lrs):
        assert lr == pytest.approx(0.3 * (0.25 + 0.75 * min(e, 4) / 4))
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="Ending multiplicative factor"):
        LinearLR(opt, end_factor=1.5)


def test_sequential_warmup_then_cosine():
    opt = _opt(1.0)
    warm = LinearLR(opt, start_factor=0.1, total_iters=5)
    cos = CosineAnnealingLR(opt, T_max=20, eta_min=0.0)
    s = SequentialLR(opt, [warm, cos], milestones=[5])
    lrs = _lrs(opt, s, 25)
    for e, lr in enumerate(lrs):
        ref = 0.1 + 0.9 * e / 5 if e < 5 else (1 + math.cos(math.pi * (e - 5) / 20)) / 2
        assert lr == pytest.approx(ref, abs=1e-12), e
    assert s.get_last_lr() == [lrs[-1]]
    with pytest.raises(ValueError, match="number of milestones"):
        SequentialLR(opt, [warm, cos], milestones=[5, 10])


def test_scheduler_state_dict_resume():
    opt = _opt(1.0)
    s = SequentialLR(opt, [LinearLR(opt, start_factor=0.5, total_iters=3), CosineAnnealingLR(opt, T_max=8)],
                     milestones=[3])
    for _ in range(5):
        s.step()
    sd = s.state_dict()
    assert "optimizer" not in sd and len(sd["_schedulers"]) == 2
    expected = _lrs(opt, s, 4)[1:]
    opt2 = _opt(1.0)
    s2 = SequentialLR(opt2, [LinearLR(opt2, start_factor=0.5, total_iters=3), CosineAnnealingLR(opt2, T_max=8)],
                      milestones=[3])
    s2.load_state_dict(sd)
    assert _lrs(opt2, s2, 4)[1:] == pytest.approx(expected)
    opt3 = _opt(1.0)
    l3 = LambdaLR(opt3, lambda e: 0.5**e)
    l3.step()
    assert l3.state_dict()["lr_lambdas"] == [None]
    with pytest.raises(TypeError, match="is not an Optimizer"):
        LambdaLR(object(), lambda e: 1.0)
