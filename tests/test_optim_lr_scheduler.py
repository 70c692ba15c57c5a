"""Learning-rate schedulers (hpcfsdp.optim.lr_scheduler, every kind) against PyTorch's documented closed forms, their
state_dict round trips and argument errors."""
import math
import warnings

import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import SGD, Adam
from hpcfsdp.optim.lr_scheduler import (ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts,
                                        CyclicLR, ExponentialLR, LambdaLR, LinearLR, MultiplicativeLR, MultiStepLR,
                                        OneCycleLR, PolynomialLR, ReduceLROnPlateau, SequentialLR, StepLR)

BASES = (0.1, 0.2)  # the two param groups' lrs


def _opt(kind="sgd", lrs=BASES):
    groups = [{"params": [nn.Parameter(hp.zeros(1))], "lr": lr} for lr in lrs]
    return SGD(groups, lr=lrs[0], momentum=0.9) if kind == "sgd" else Adam(groups, lr=lrs[0])


def _momentum(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


def _run(opt, sched, n, metrics=None):
    """[(lrs, momentums)] at epochs 0..n: the optimizer steps, then the scheduler."""
    out = [([g["lr"] for g in opt.param_groups], _momentum(opt))]
    for i in range(n):
        opt.step()
        sched.step() if metrics is None else sched.step(metrics[i])
        lrs = [g["lr"] for g in opt.param_groups]
        assert sched.get_last_lr() == lrs
        out.append((lrs, _momentum(opt)))
    return out


def _lrs(opt, sched, n, metrics=None):
    return [lrs for lrs, _ in _run(opt, sched, n, metrics)]


def _check(got, expected_fn, n_groups=2):
    for e, lrs in enumerate(got):
        for i in range(n_groups):
            assert lrs[i] == pytest.approx(expected_fn(e, i), rel=1e-12, abs=1e-15), (e, i)


def _sgd(lr=0.1, groups=1):
    """Plain SGD with ``groups`` param groups of lrs lr, 2 lr, ..."""
    ps = [nn.Parameter(hp.zeros(1)) for _ in range(groups)]
    return SGD([{"params": [p], "lr": lr * (i + 1)} for i, p in enumerate(ps)], lr=lr)


def _first_group_lrs(opt, sched, n):
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


# ---- LambdaLR, CosineAnnealingLR, LinearLR, SequentialLR: one param group ---------------------------------------

def test_lambda_lr():
    opt = _sgd(0.5, groups=2)
    s = LambdaLR(opt, [lambda e: 0.9**e, lambda e: 1.0 / (e + 1)])
    for e in range(6):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * 0.9**e)
        assert opt.param_groups[1]["lr"] == pytest.approx(1.0 / (e + 1))
        assert s.get_last_lr() == [g["lr"] for g in opt.param_groups]
        s.step()
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        LambdaLR(opt, [lambda e: 1.0])


def test_cosine_annealing_closed_form():
    opt = _sgd(0.2)
    s = CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
    lrs = _first_group_lrs(opt, s, 15)
    for e, lr in enumerate(lrs):
        assert lr == pytest.approx(0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * e / 10)) / 2, abs=1e-12)
    assert lrs[10] == pytest.approx(0.01)


def test_linear_lr():
    opt = _sgd(0.3)
    s = LinearLR(opt, start_factor=0.25, end_factor=1.0, total_iters=4)
    lrs = _first_group_lrs(opt, s, 7)
    for e, lr in enumerate(lrs):
        assert lr == pytest.approx(0.3 * (0.25 + 0.75 * min(e, 4) / 4))
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="Ending multiplicative factor"):
        LinearLR(opt, end_factor=1.5)


def test_sequential_warmup_then_cosine():
    opt = _sgd(1.0)
    warm = LinearLR(opt, start_factor=0.1, total_iters=5)
    cos = CosineAnnealingLR(opt, T_max=20, eta_min=0.0)
    s = SequentialLR(opt, [warm, cos], milestones=[5])
    lrs = _first_group_lrs(opt, s, 25)
    for e, lr in enumerate(lrs):
        ref = 0.1 + 0.9 * e / 5 if e < 5 else (1 + math.cos(math.pi * (e - 5) / 20)) / 2
        assert lr == pytest.approx(ref, abs=1e-12), e
    assert s.get_last_lr() == [lrs[-1]]
    with pytest.raises(ValueError, match="number of milestones"):
        SequentialLR(opt, [warm, cos], milestones=[5, 10])


def test_scheduler_state_dict_resume():
    opt = _sgd(1.0)
    s = SequentialLR(opt, [LinearLR(opt, start_factor=0.5, total_iters=3), CosineAnnealingLR(opt, T_max=8)],
                     milestones=[3])
    for _ in range(5):
        s.step()
    sd = s.state_dict()
    assert "optimizer" not in sd and len(sd["_schedulers"]) == 2
    expected = _first_group_lrs(opt, s, 4)[1:]
    opt2 = _sgd(1.0)
    s2 = SequentialLR(opt2, [LinearLR(opt2, start_factor=0.5, total_iters=3), CosineAnnealingLR(opt2, T_max=8)],
                      milestones=[3])
    s2.load_state_dict(sd)
    assert _first_group_lrs(opt2, s2, 4)[1:] == pytest.approx(expected)
    opt3 = _sgd(1.0)
    l3 = LambdaLR(opt3, lambda e: 0.5**e)
    l3.step()
    assert l3.state_dict()["lr_lambdas"] == [None]
    with pytest.raises(TypeError, match="is not an Optimizer"):
        LambdaLR(object(), lambda e: 1.0)


# ---- closed forms --------------------------------------------------------------------------------------------

def test_step_lr():
    opt = _opt()
    _check(_lrs(opt, StepLR(opt, step_size=3, gamma=0.5), 14), lambda e, i: BASES[i] * 0.5 ** (e // 3))
    opt = _opt()
    _check(_lrs(opt, StepLR(opt, step_size=2), 7), lambda e, i: BASES[i] * 0.1 ** (e // 2))  # gamma=0.1 default


def test_multistep_lr_counts_repeated_milestones():
    opt = _opt()
    milestones = [2, 5, 5, 9]
    _check(_lrs(opt, MultiStepLR(opt, milestones, gamma=0.3), 12),
           lambda e, i: BASES[i] * 0.3 ** sum(m <= e for m in milestones))


def test_exponential_lr():
    opt = _opt()
    _check(_lrs(opt, ExponentialLR(opt, gamma=0.9), 20), lambda e, i: BASES[i] * 0.9 ** e)


def test_constant_lr():
    opt = _opt()
    _check(_lrs(opt, ConstantLR(opt), 9), lambda e, i: BASES[i] * (1 / 3 if e < 5 else 1.0))  # defaults 1/3, 5
    opt = _opt()
    _check(_lrs(opt, ConstantLR(opt, factor=0.5, total_iters=2), 5), lambda e, i: BASES[i] * (0.5 if e < 2 else 1))


def test_multiplicative_lr():
    opt = _opt()
    _check(_lrs(opt, MultiplicativeLR(opt, [lambda e: 0.9, lambda e: 1.0 / (e + 1)]), 8),
           lambda e, i: BASES[i] * (0.9 ** e if i == 0 else 1.0 / math.factorial(e + 1)))


def test_polynomial_lr():
    opt = _opt()
    _check(_lrs(opt, PolynomialLR(opt, total_iters=6, power=2.0), 10),
           lambda e, i: BASES[i] * (1 - min(e, 6) / 6) ** 2)
    opt = _opt()
    _check(_lrs(opt, PolynomialLR(opt), 7), lambda e, i: BASES[i] * (1 - min(e, 5) / 5))  # defaults 5, 1.0


def _sgdr(e, base, eta_min, t0, t_mult):
    t_i, t_cur = t0, e
    while t_cur >= t_i:
        t_cur, t_i = t_cur - t_i, t_i * t_mult
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


@pytest.mark.parametrize("t_mult", [1, 2, 3])
def test_cosine_annealing_warm_restarts(t_mult):
    opt = _opt()
    s = CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=t_mult, eta_min=0.001)
    _check(_lrs(opt, s, 40), lambda e, i: _sgdr(e, BASES[i], 0.001, 3, t_mult))


def test_cosine_annealing_warm_restarts_fractional_epochs():
    opt = _opt()
    s = CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2)
    for epoch in [0.5, 1.25, 3.0, 4.5, 9.0, 10.2, 2.0, 21.0]:  # step(epoch) is its documented use: no warning
        s.step(epoch)
        assert opt.param_groups[1]["lr"] == pytest.approx(_sgdr(epoch, 0.2, 0.0, 3, 2), rel=1e-12)
        assert s.last_epoch == math.floor(epoch)


def _anneal(strategy, start, end, pct):
    if strategy == "cos":
        return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
    return start + (end - start) * pct


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_one_cycle_two_phases(strategy, kind):
    opt = _opt(kind)
    total, pct, max_lrs = 20, 0.3, (1.0, 2.0)
    s = OneCycleLR(opt, max_lr=list(max_lrs), total_steps=total, pct_start=pct, anneal_strategy=strategy)
    up = pct * total - 1  # the last step of the rise
    for e, (lrs, moms) in enumerate(_run(opt, s, total - 1)):
        for i, max_lr in enumerate(max_lrs):
            initial, low = max_lr / 25.0, max_lr / 25.0 / 1e4
            if e <= up:
                lr, mom = _anneal(strategy, initial, max_lr, e / up), _anneal(strategy, 0.95, 0.85, e / up)
            else:
                p = (e - up) / (total - 1 - up)
                lr, mom = _anneal(strategy, max_lr, low, p), _anneal(strategy, 0.85, 0.95, p)
            assert lrs[i] == pytest.approx(lr, rel=1e-12) and moms[i] == pytest.approx(mom, rel=1e-12), e
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0 / 25 / 1e4)
    if kind == "adam":
        assert opt.param_groups[0]["betas"][1] == 0.999  # only beta1 cycles
    opt.step()
    s.step()  # step `total` is still allowed (PyTorch's off-by-one), one more is not
    with pytest.raises(ValueError, match="Tried to step 21 times. The specified number of total steps is 20"):
        s.step()


def test_one_cycle_three_phases_epochs_and_no_momentum():
    opt = _opt()
    s = OneCycleLR(opt, max_lr=1.0, epochs=4, steps_per_epoch=5, pct_start=0.25, three_phase=True,
                   cycle_momentum=False, div_factor=10.0, final_div_factor=100.0)
    assert s.total_steps == 20
    a, b, c = 0.25 * 20 - 1, 2 * 0.25 * 20 - 2, 19  # phase ends
    for e, (lrs, moms) in enumerate(_run(opt, s, 19)):
        if e <= a:
            lr = _anneal("cos", 0.1, 1.0, e / a)
        elif e <= b:
            lr = _anneal("cos", 1.0, 0.1, (e - a) / (b - a))
        else:
            lr = _anneal("cos", 0.1, 0.001, (e - b) / (c - b))
        assert lrs == pytest.approx([lr, lr], rel=1e-12) and moms == [0.9, 0.9], e  # momentum untouched


def _triangular(e, base, top, up, down):
    cycle = math.floor(1 + e / (up + down))
    x = e - (cycle - 1) * (up + down)  # position in the cycle
    frac = x / up if x <= up else (up + down - x) / down
    return cycle, frac


@pytest.mark.parametrize("mode", ["triangular", "triangular2", "exp_range"])
def test_cyclic_lr_modes_and_momentum(mode):
    opt = _opt()
    s = CyclicLR(opt, base_lr=[0.01, 0.02], max_lr=[0.1, 0.3], step_size_up=3, step_size_down=5, mode=mode,
                 gamma=0.9)
    for e, (lrs, moms) in enumerate(_run(opt, s, 30)):
        cycle, frac = _triangular(e, None, None, 3, 5)
        scale = {"triangular": 1.0, "triangular2": 0.5 ** (cycle - 1), "exp_range": 0.9 ** e}[mode]
        for i, (lo, hi) in enumerate([(0.01, 0.1), (0.02, 0.3)]):
            assert lrs[i] == pytest.approx(lo + (hi - lo) * frac * scale, rel=1e-12, abs=1e-15), e
            assert moms[i] == pytest.approx(0.9 - 0.1 * frac * scale, rel=1e-12), e


def test_cyclic_lr_custom_scale_fn_and_adam_beta1():
    opt = _opt("adam")
    s = CyclicLR(opt, 0.01, 0.1, step_size_up=2, scale_fn=lambda x: 0.5 ** x, scale_mode="iterations",
                 base_momentum=0.7, max_momentum=0.8)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.01]  # base_lr replaces the optimizer's lr
    for e, (lrs, moms) in enumerate(_run(opt, s, 12)):
        _, frac = _triangular(e, None, None, 2, 2)
        assert lrs[0] == pytest.approx(0.01 + 0.09 * frac * 0.5 ** e, rel=1e-12)
        assert moms[0] == pytest.approx(0.8 - 0.1 * frac * 0.5 ** e, rel=1e-12)


def test_chained_scheduler_multiplies_factors():
    opt = _opt()
    s = ChainedScheduler([ConstantLR(opt, factor=0.1, total_iters=2), ExponentialLR(opt, gamma=0.9)])
    _check(_lrs(opt, s, 8), lambda e, i: BASES[i] * (0.1 if e < 2 else 1.0) * 0.9 ** e)
    opt = _opt()
    s = ChainedScheduler([StepLR(opt, 2, 0.5), MultiplicativeLR(opt, lambda e: 0.99), PolynomialLR(opt, 5)],
                         optimizer=opt)
    _check(_lrs(opt, s, 9), lambda e, i: BASES[i] * 0.5 ** (e // 2) * 0.99 ** e * (1 - min(e, 5) / 5))


def test_chainable_form_keeps_a_manual_lr_change():
    opt = _opt()
    s = ExponentialLR(opt, gamma=0.5)
    opt.step()
    s.step()
    opt.param_groups[0]["lr"] = 1.0
    opt.step()
    s.step()
    assert opt.param_groups[0]["lr"] == 0.5  # from the current lr, not base_lr * gamma ** 2


def test_sequential_lr_with_new_schedulers():
    opt = _opt()
    s = SequentialLR(opt, [ConstantLR(opt, factor=0.1, total_iters=2), ExponentialLR(opt, gamma=0.9)],
                     milestones=[3])
    _check(_lrs(opt, s, 8), lambda e, i: BASES[i] * (0.1 if e < 2 else 1.0) if e < 3 else BASES[i] * 0.9 ** (e - 3))
    opt = _opt()  # a milestone at 0: the second scheduler drives from the start
    s = SequentialLR(opt, [ExponentialLR(opt, 0.5), StepLR(opt, 2, 0.5)], milestones=[0])
    _check(_lrs(opt, s, 6), lambda e, i: BASES[i] * 0.5 ** (e // 2))
    opt = _opt()  # a ChainedScheduler inside: its schedulers' construction steps are undone too; its own initial
    # step is a plain step of each, so ExponentialLR already multiplies at epoch 0 (PyTorch's values)
    s = SequentialLR(opt, [ChainedScheduler([ConstantLR(opt, 0.5, 2), ExponentialLR(opt, 0.9)]),
                           StepLR(opt, 2, 0.5)], milestones=[4])
    _check(_lrs(opt, s, 8), lambda e, i: BASES[i] * ((0.5 if e < 2 else 1) * 0.9 ** (e + 1) if e < 4
                                                     else 0.5 ** ((e - 4) // 2)))


def test_reduce_lr_on_plateau_min_rel_with_cooldown_and_min_lr():
    opt = _opt()
    s = ReduceLROnPlateau(opt, patience=2, factor=0.5, cooldown=1, min_lr=[0.01, 0.06])
    metrics = [5, 4, 4, 4, 4, 4, 3, 3.9999, 3.99999, 4, 4, 4, 4, 4, 4, 4]
    got = _lrs(opt, s, len(metrics), metrics)
    # best 4 at epoch 2; bad epochs 3,4,5 -> reduce at epoch 5 (3 > patience 2); epoch 6 is cooldown; 3 improves at
    # 7; 3.9999 and 3.99999 are not better than 3 (rel threshold); bad 8,9,10 -> reduce at 10; cooldown 11; bad
    # 12,13,14 -> reduce at 14
    expected = [0.1] * 5 + [0.05] * 5 + [0.025] * 4 + [0.0125] * 3
    assert [lrs[0] for lrs in got] == pytest.approx(expected)
    assert [lrs[1] for lrs in got] == pytest.approx([0.2] * 5 + [0.1] * 5 + [0.06] * 7)  # floored at min_lr
    assert s.best == 3 and s.last_epoch == len(metrics)


def test_reduce_lr_on_plateau_max_abs_and_eps():
    opt = _opt()
    s = ReduceLROnPlateau(opt, mode="max", threshold_mode="abs", threshold=0.1, patience=0)
    got = _lrs(opt, s, 6, [1, 1.05, 1.2, 1.25, 1.31, hp.tensor(2.0)])  # a 0-d tensor metric is float()ed
    assert [lrs[0] for lrs in got] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.001])
    opt = _opt()
    s = ReduceLROnPlateau(opt, patience=0, factor=0.5, eps=0.02)  # group 0's reduction 0.05 > eps, then 0.025 ...
    got = _lrs(opt, s, 4, [1] * 4)
    assert [lrs[0] for lrs in got] == pytest.approx([0.1, 0.1, 0.05, 0.025, 0.025])
    assert [lrs[1] for lrs in got] == pytest.approx([0.2, 0.2, 0.1, 0.05, 0.025])


# ---- state_dict, resume, deprecated forms ----------------------------------------------------------------------

MAKERS = {
    "step": lambda o: StepLR(o, 2, 0.5),
    "multistep": lambda o: MultiStepLR(o, [1, 3, 3, 6], 0.5),
    "constant": lambda o: ConstantLR(o, 0.5, 4),
    "exponential": lambda o: ExponentialLR(o, 0.8),
    "multiplicative": lambda o: MultiplicativeLR(o, lambda e: 0.9),
    "polynomial": lambda o: PolynomialLR(o, 8, 2.0),
    "warm_restarts": lambda o: CosineAnnealingWarmRestarts(o, 2, 2, 0.01),
    "one_cycle": lambda o: OneCycleLR(o, 1.0, total_steps=12, three_phase=True),
    "cyclic": lambda o: CyclicLR(o, 0.01, 0.1, 2, mode="triangular2"),
    "chained": lambda o: ChainedScheduler([ConstantLR(o, 0.5, 3), ExponentialLR(o, 0.9)]),
    "sequential": lambda o: SequentialLR(o, [LinearLR(o, 0.5, total_iters=3), StepLR(o, 2, 0.5)], [3]),
    "plateau": lambda o: ReduceLROnPlateau(o, patience=0, factor=0.5),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_state_dict_round_trip_resumes_the_same_sequence(name):
    metrics = [1.0, 0.5, 0.6, 0.7, 0.4, 0.4, 0.4, 0.3, 0.3, 0.3, 0.3]
    opt = _opt()
    s = MAKERS[name](opt)
    whole = _run(opt, s, 11, metrics if name == "plateau" else None)

    opt = _opt()
    s = MAKERS[name](opt)
    first = _run(opt, s, 5, metrics[:5] if name == "plateau" else None)
    sd, opt_sd = s.state_dict(), opt.state_dict()
    assert "optimizer" not in sd
    opt2 = _opt()
    s2 = MAKERS[name](opt2)
    opt2.load_state_dict(opt_sd)  # the chainable forms continue from the optimizer's lrs (as in PyTorch)
    s2.load_state_dict(sd)
    rest = _run(opt2, s2, 6, metrics[5:] if name == "plateau" else None)
    assert first + rest[1:] == whole
    assert s2.get_last_lr() == whole[-1][0]


def test_state_dict_keeps_callable_objects_state():
    class Factor:
        def __init__(self):
            self.f = 0.5

        def __call__(self, epoch):
            return self.f

    opt = _opt()
    s = MultiplicativeLR(opt, [Factor(), lambda e: 1.0])
    s.lr_lambdas[0].f = 0.25
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [{"f": 0.25}, None]
    s2 = MultiplicativeLR(_opt(), [Factor(), lambda e: 1.0])
    s2.load_state_dict(sd)
    assert s2.lr_lambdas[0].f == 0.25
    c = CyclicLR(_opt(), 0.01, 0.1, scale_fn=Factor())
    assert c.state_dict()["_scale_fn_custom"] == {"f": 0.5} and "_scale_fn_ref" not in c.state_dict()
    c2 = CyclicLR(_opt(), 0.01, 0.1, mode="exp_range", gamma=0.5)
    sd2 = c2.state_dict()
    c3 = CyclicLR(_opt(), 0.01, 0.1)
    c3.load_state_dict(sd2)
    assert c3.mode == "exp_range" and c3.scale_fn(2) == 0.25  # the scale function follows the loaded mode


def test_step_with_epoch_uses_the_closed_form_and_warns():
    opt = _opt()
    s = StepLR(opt, 3, 0.5)
    with pytest.warns(UserWarning, match="deprecated"):
        s.step(7)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 2) and s.last_epoch == 7
    opt = _opt()
    s = MultiStepLR(opt, [2, 4, 4])
    with pytest.warns(UserWarning):
        s.step(4)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.2 * 0.1 ** 3)


def test_get_lr_outside_step_warns():
    opt = _opt()
    s = ExponentialLR(opt, 0.5)
    with pytest.warns(UserWarning, match="get_last_lr"):
        s.get_lr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
        s.step()  # no warning from within step()


def test_resume_with_last_epoch_needs_initial_lr():
    opt = _opt()
    with pytest.raises(KeyError, match="initial_lr"):
        StepLR(opt, 2, last_epoch=3)
    ExponentialLR(opt, 0.5)
    s = StepLR(opt, 2, 0.5, last_epoch=3)  # initial_lr is there now
    assert s.last_epoch == 4 and s.base_lrs == list(BASES)


# ---- bad arguments ---------------------------------------------------------------------------------------------

def _no_momentum_opt():
    opt = _opt()
    opt.defaults.pop("momentum")
    return opt


ERRORS = [
    (lambda o: ConstantLR(o, factor=1.5), ValueError, "Constant multiplicative factor expected to be between 0 and 1"),
    (lambda o: MultiplicativeLR(o, 3), TypeError, "lr_lambda should be a function, but got int"),
    (lambda o: MultiplicativeLR(o, [lambda e: 1.0]), ValueError, "Expected 2 lr_lambdas, but got 1"),
    (lambda o: StepLR(object(), 2), TypeError, "object is not an Optimizer"),
    (lambda o: CosineAnnealingWarmRestarts(o, T_0=0), ValueError, "Expected positive integer T_0, but got 0"),
    (lambda o: CosineAnnealingWarmRestarts(o, T_0=2.0), ValueError, "Expected positive integer T_0, but got 2.0"),
    (lambda o: CosineAnnealingWarmRestarts(o, 2, T_mult=0), ValueError, "Expected integer T_mult >= 1, but got 0"),
    (lambda o: CosineAnnealingWarmRestarts(o, 2, eta_min="a"), ValueError, "Expected float or int eta_min"),
    (lambda o: CosineAnnealingWarmRestarts(o, 2).step(-1), ValueError, "Expected non-negative epoch, but got -1"),
    (lambda o: OneCycleLR(o, 1.0), ValueError, r"You must define either total_steps OR \(epochs AND steps_per_epoch\)"),
    (lambda o: OneCycleLR(o, 1.0, total_steps=2.5), ValueError, "Expected positive integer total_steps, but got 2.5"),
    (lambda o: OneCycleLR(o, 1.0, epochs=0, steps_per_epoch=2), ValueError, "Expected positive integer epochs"),
    (lambda o: OneCycleLR(o, 1.0, epochs=2, steps_per_epoch=-1), ValueError, "positive integer steps_per_epoch"),
    (lambda o: OneCycleLR(o, 1.0, total_steps=5, pct_start=1), ValueError, "Expected float between 0 and 1 pct_start"),
    (lambda o: OneCycleLR(o, 1.0, total_steps=5, anneal_strategy="exp"), ValueError,
     "anneal_strategy must be one of 'cos' or 'linear', instead got exp"),
    (lambda o: OneCycleLR(o, [1.0], total_steps=5), ValueError, "max_lr must have the same length as"),
    (lambda o: OneCycleLR(_no_momentum_opt(), 1.0, total_steps=5), ValueError, "optimizer must support momentum"),
    (lambda o: CyclicLR(o, 0.1, 1.0, mode="foo"), ValueError, "mode is invalid and scale_fn is None"),
    (lambda o: CyclicLR(o, [0.1], 1.0), ValueError, "base_lr must have the same length as optimizer.param_groups"),
    (lambda o: ChainedScheduler([]), ValueError, "expects at least one scheduler to be chained"),
    (lambda o: ChainedScheduler([StepLR(o, 2), StepLR(_opt(), 2)]), ValueError, "belong to the same optimizer"),
    (lambda o: ChainedScheduler([StepLR(o, 2), ReduceLROnPlateau(o)]), ValueError, "does not support `ReduceLROnP"),
    (lambda o: ChainedScheduler([StepLR(o, 2), 3]), TypeError, "at index 1 should have `optimizer` as its attr"),
    (lambda o: SequentialLR(o, [StepLR(o, 2), ReduceLROnPlateau(o)], [2]), ValueError, "does not support `Reduc"),
    (lambda o: ReduceLROnPlateau(o, factor=1.0), ValueError, r"Factor should be < 1.0."),
    (lambda o: ReduceLROnPlateau(o, mode="avg"), ValueError, "mode avg is unknown!"),
    (lambda o: ReduceLROnPlateau(o, threshold_mode="x"), ValueError, "threshold mode x is unknown!"),
    (lambda o: ReduceLROnPlateau(o, min_lr=[0.1]), ValueError, "expected 2 min_lrs, got 1"),
    (lambda o: LambdaLR(o, [lambda e: 1.0] * 3), ValueError, "Expected 2 lr_lambdas, but got 3"),
]


@pytest.mark.parametrize("make,exc,match", ERRORS, ids=[f"{i}-{e[1].__name__}" for i, e in enumerate(ERRORS)])
def test_bad_arguments_raise_pytorch_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make(_opt())


def test_plateau_min_lrs_follow_new_param_groups():
    opt = _opt()
    s = ReduceLROnPlateau(opt, patience=0, min_lr=0.05)
    opt.add_param_group({"params": [nn.Parameter(hp.zeros(1))], "lr": 1.0})
    s.step(1.0)
    s.step(1.0)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.05, 0.1])
    opt = _opt()
    s = ReduceLROnPlateau(opt, patience=0, min_lr=[0.0, 0.0])
    opt.add_param_group({"params": [nn.Parameter(hp.zeros(1))], "lr": 1.0})
    s.step(1.0)
    with pytest.raises(RuntimeError, match=r"differs from when `ReduceLROnPlateau` was initialized \(2\)"):
        s.step(1.0)
