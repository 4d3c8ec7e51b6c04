"""Tests for lr_schedule.py: the length-triggered rule against an independent loop, hand-derived
values, the floor, causality, exact resume, the factory and argument checks.

Every warning is an error here, so a deprecated torch call (or scheduler.step() before
optimizer.step()) fails the file.
"""
import io
import math
import random
from fractions import Fraction
from statistics import fmean

import pytest
import torch

from lr_schedule import SCHEDULES, LengthTriggeredLR, cosine_factor, make_scheduler

pytestmark = pytest.mark.filterwarnings("error")


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def make_optimizer(lrs=(1.0,), momentum=0.0, seed=0):
    """SGD over one small parameter per group, one group per entry of ``lrs``."""
    g = torch.Generator().manual_seed(seed)
    groups = [{"params": [torch.nn.Parameter(torch.randn(3, generator=g))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, momentum=momentum)


def train_step(opt, sched, length):
    """One training step in the documented order; returns the rates the optimizer step used."""
    sched.observe(length)
    used = [group["lr"] for group in opt.param_groups]
    opt.zero_grad()
    loss = sum((p ** 2).sum() for group in opt.param_groups for p in group["params"])
    loss.backward()
    opt.step()
    sched.step()
    assert sched.get_last_lr() == [group["lr"] for group in opt.param_groups]
    return used


def run(lengths, lrs=(1.0,), **kwargs):
    """Returns (scheduler, eta) with eta[i - 1] = get_last_lr()[0] after step i (eta_i)."""
    opt = make_optimizer(lrs)
    sched = LengthTriggeredLR(opt, **kwargs)
    eta = []
    for length in lengths:
        train_step(opt, sched, length)
        eta.append(sched.get_last_lr()[0])
    return sched, eta


def reference_rates(lengths, lr0, warmup_window, surge_ratio, decay_factor, decay_period_factor, floor):
    """The written rule as a naive loop with an exact rational period: eta_1..eta_n and s."""
    W = warmup_window
    L0 = fmean(lengths[:W])
    s = next((i for i in range(W + 1, len(lengths) + 1) if lengths[i - 1] > surge_ratio * L0), None)
    lr, next_boundary, out = lr0, None, []
    for i in range(1, len(lengths) + 1):
        if i == s:  # the first decay is decided at the surge step itself
            lr = max(lr * decay_factor, floor * lr0)
            next_boundary = s + Fraction(str(decay_period_factor)) * s  # s + P, exact
        while next_boundary is not None and i >= next_boundary:  # one more decay per elapsed period
            lr = max(lr * decay_factor, floor * lr0)
            next_boundary += Fraction(str(decay_period_factor)) * s
        out.append(lr)
    return out, s


def surge_lengths(n, surge_at, seed=0, base=100.0):
    """Noisy lengths in [0.8, 1.2] * base, jumping to > 3.6 * base at step ``surge_at`` (1-based),
    then wandering anywhere in [0.5, 5] * base (the surge is never re-armed)."""
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        if i < surge_at:
            out.append(base * rng.uniform(0.8, 1.2))
        elif i == surge_at:
            out.append(base * 3.7)
        else:
            out.append(base * rng.uniform(0.5, 5.0))
    return out


# ------------------------------------------------------------------------------------------------
# the rule
# ------------------------------------------------------------------------------------------------
def test_no_surge_rate_never_changes():
    rng = random.Random(1)
    lengths = [rng.uniform(80.0, 120.0) for _ in range(500)]  # L0 >= 80, so 3 L0 >= 240 > any L_i
    sched, eta = run(lengths, lrs=(3e-4, 1e-5))
    assert sched.surge_step is None
    assert sched.baseline_length == pytest.approx(fmean(lengths[:50]), rel=1e-12)
    assert all(lr == 3e-4 for lr in eta)
    assert sched.get_last_lr() == [3e-4, 1e-5]
    # A ratio of 1.5 is still never crossed: 1.5 * L0 >= 120 >= L_i (the test is strict, ">").
    sched, eta = run(lengths, surge_ratio=1.5)
    assert sched.surge_step is None and all(lr == 1.0 for lr in eta)


def test_hand_derived_values():
    # W = 5, L0 = 10; L = 30 = 3 L0 at steps 6..9 is not a surge (strict ">"); L = 31 at step 10 is.
    # P = 1.8 * 10 = 18, so k = 1 after steps 10..27, 2 after 28..45, 3 after 46..63, 4 from 64 on.
    lengths = [10.0] * 5 + [30.0] * 4 + [31.0] * 91
    opt = make_optimizer()
    sched = LengthTriggeredLR(opt, warmup_window=5)
    assert sched.get_last_lr() == [1.0]  # eta_0
    used = [train_step(opt, sched, length)[0] for length in lengths]  # used[n - 1]: rate of step n
    assert sched.baseline_length == 10.0 and sched.surge_step == 10
    expected = {1: 1.0, 10: 1.0, 11: 0.5, 28: 0.5, 29: 0.25, 46: 0.25, 47: 0.125, 64: 0.125,
                65: 0.1, 100: 0.1}  # 0.5 ** 4 = 0.0625 < floor 0.1
    for n, lr in expected.items():
        assert used[n - 1] == lr, (n, used[n - 1], lr)


def test_non_integer_period_hand_values():
    # s = 11, P = 19.8: decays decided after the first whole steps >= 11 + j * 19.8 = 11, 30.8, 50.6, 70.4, 90.2.
    lengths = [10.0] * 10 + [40.0] * 90
    sched, eta = run(lengths, warmup_window=10, floor=0.0)
    assert sched.surge_step == 11
    changes = [i for i in range(2, 101) if eta[i - 1] != eta[i - 2]]
    assert changes == [11, 31, 51, 71, 91]
    assert eta[-1] == 0.5 ** 5
    # s = 13, P = 23.4 and 5 P = 117 exactly, but (130 - 13) / (1.8 * 13) < 5 in floating point:
    # the fifth period must still count as elapsed after step 130 (k = 6), not after step 131.
    lengths = [10.0] * 12 + [40.0] * 130
    sched, eta = run(lengths, warmup_window=12, floor=0.0)
    assert sched.surge_step == 13
    assert eta[129 - 1] == 0.5 ** 5 and eta[130 - 1] == 0.5 ** 6


@pytest.mark.parametrize(
    "kwargs,surge_at",
    [
        (dict(warmup_window=50), 80),                                      # the published reading
        (dict(warmup_window=5, decay_period_factor=1.8), 6),               # earliest possible surge: W + 1
        (dict(warmup_window=7, decay_period_factor=1.8), 11),              # P = 19.8, not an integer
        (dict(warmup_window=4, decay_period_factor=0.3, decay_factor=0.8, floor=0.2), 9),  # P = 2.7
        (dict(warmup_window=3, decay_period_factor=0.1, decay_factor=0.9, floor=0.05), 6),  # P = 0.6 < 1
        (dict(warmup_window=10, surge_ratio=2.0, decay_factor=1.0), 20),   # d = 1: surge but no decay
    ],
)
def test_matches_independent_loop(kwargs, surge_at):
    full = dict(warmup_window=50, surge_ratio=3.0, decay_factor=0.5, decay_period_factor=1.8, floor=0.1)
    full.update(kwargs)
    lengths = surge_lengths(400, surge_at, seed=surge_at)
    lr0 = 2e-3
    sched, eta = run(lengths, lrs=(lr0,), **full)
    ref, s = reference_rates(lengths, lr0, **full)
    assert s == surge_at and sched.surge_step == surge_at
    assert eta == pytest.approx(ref, rel=1e-12, abs=0.0)
    assert all(lr >= full["floor"] * lr0 * (1 - 1e-12) for lr in eta)
    assert eta[surge_at - 2] == lr0  # the rate is untouched up to and including eta_{s-1}


def test_never_below_floor_and_per_group():
    lengths = [10.0] * 5 + [100.0] * 295  # surge at 6, P = 0.6: decays every step
    sched, eta = run(lengths, lrs=(1.0, 0.01), warmup_window=5, decay_period_factor=0.1, floor=0.3)
    assert min(eta) == 0.3 and eta[-1] == 0.3
    assert sched.get_last_lr() == [0.3, pytest.approx(0.003, rel=1e-12)]  # each group floors at f * its own eta_0
    sched, eta = run(lengths, warmup_window=5, decay_period_factor=0.1, floor=0.0)
    assert all(lr >= 0.0 for lr in eta) and eta[-1] < 1e-100


def test_rate_of_step_n_depends_only_on_earlier_lengths():
    base = [50.0] * 30
    surged = list(base)
    surged[19] = 500.0  # a surge at step 20 in one run only
    rates = []
    for lengths in (base, surged):
        opt = make_optimizer()
        sched = LengthTriggeredLR(opt, warmup_window=10)
        rates.append([train_step(opt, sched, length)[0] for length in lengths])
    assert rates[0][:20] == rates[1][:20]  # steps 1..20 cannot see L_20
    assert rates[1][20] == 0.5 and rates[0][20] == 1.0  # step 21 is the first to react


def test_surge_is_not_rearmed_and_misuse_raises():
    sched, _ = run([10.0] * 5 + [100.0] + [10.0] * 10 + [1000.0], warmup_window=5)
    assert sched.surge_step == 6
    opt = make_optimizer()
    sched = LengthTriggeredLR(opt)
    opt.step()
    with pytest.raises(RuntimeError, match="observe"):
        sched.step()
    sched.observe(3.0)
    with pytest.raises(RuntimeError, match="twice"):
        sched.observe(3.0)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="mean_length"):
            LengthTriggeredLR(make_optimizer()).observe(bad)


# ------------------------------------------------------------------------------------------------
# resume
# ------------------------------------------------------------------------------------------------
KW = dict(warmup_window=10, decay_period_factor=0.7)  # W = 10; surge at 30, P = 21


def resumed_run(lengths, save_at):
    """Run save_at steps, checkpoint through torch.save/torch.load(weights_only=True), rebuild
    everything fresh, load, continue. Returns (rates used per step, final parameters)."""
    opt = make_optimizer(momentum=0.9)
    sched = LengthTriggeredLR(opt, **KW)
    used = [train_step(opt, sched, length)[0] for length in lengths[:save_at]]
    buf = io.BytesIO()
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), "params": params}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    opt = make_optimizer(momentum=0.9, seed=123)  # different initial parameters, restored below
    sched = LengthTriggeredLR(opt, **KW)
    with torch.no_grad():
        for p, saved in zip((p for g in opt.param_groups for p in g["params"]), ckpt["params"]):
            p.copy_(saved)
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    used += [train_step(opt, sched, length)[0] for length in lengths[save_at:]]
    return used, [p.detach().clone() for g in opt.param_groups for p in g["params"]], sched


@pytest.mark.parametrize("save_at", [4, 10, 20, 40, 51, 52])  # in warm-up, at its end, pre-surge, post-surge, at decays
def test_resume_matches_uninterrupted_run(save_at):
    lengths = surge_lengths(120, 30, seed=7)
    opt = make_optimizer(momentum=0.9)
    sched = LengthTriggeredLR(opt, **KW)
    used = [train_step(opt, sched, length)[0] for length in lengths]
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    used_r, params_r, sched_r = resumed_run(lengths, save_at)
    assert sched.surge_step == sched_r.surge_step == 30
    assert sched_r.baseline_length == sched.baseline_length
    assert used_r == used  # exact, not approximate
    assert len(set(used)) > 3  # the comparison covers several decays
    assert all(torch.equal(a, b) for a, b in zip(params, params_r))


def test_state_dict_holds_length_statistics():
    sched, _ = run(surge_lengths(40, 30), **KW)
    state = sched.state_dict()
    for key in ("warmup_lengths", "baseline_length", "surge_step", "num_observed", "last_epoch"):
        assert key in state
    assert state["surge_step"] == 30 and state["num_observed"] == 40 and len(state["warmup_lengths"]) == 10


# ------------------------------------------------------------------------------------------------
# factory and arguments
# ------------------------------------------------------------------------------------------------
def run_plain(sched, opt, n):
    used = []
    for _ in range(n):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


def test_make_scheduler_constant_and_cosine():
    assert SCHEDULES == ("constant", "cosine", "length")
    opt = make_optimizer((0.5,))
    assert set(run_plain(make_scheduler("constant", opt, 100, warmup_window=5), opt, 500)) == {0.5}

    opt = make_optimizer((2.0,))
    used = run_plain(make_scheduler("cosine", opt, 100), opt, 150)  # used[t] = 2 * factor(t)
    assert used[0] == 2.0
    assert used[50] == pytest.approx(2.0 * 0.55, rel=1e-12)   # half-way: (1 + f) / 2
    assert used[100] == pytest.approx(2.0 * 0.1, rel=1e-12)   # reaches f after total_steps steps...
    assert all(lr == pytest.approx(0.2, rel=1e-12) for lr in used[100:])  # ...and stays there
    assert all(a >= b for a, b in zip(used, used[1:]))
    assert used[25] == pytest.approx(2.0 * (0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2), rel=1e-12)  # cos(pi/4)
    assert cosine_factor(0, 10, floor=0.3) == 1.0 and cosine_factor(10, 10, floor=0.3) == pytest.approx(0.3)

    opt = make_optimizer((2.0,))
    used = run_plain(make_scheduler("cosine", opt, 100, floor=0.0), opt, 101)
    assert used[100] == pytest.approx(0.0, abs=1e-15)


def test_make_scheduler_length_and_errors():
    opt = make_optimizer()
    sched = make_scheduler("length", opt, 100, warmup_window=7, surge_ratio=2.5, decay_factor=0.7,
                           decay_period_factor=1.1, floor=0.2)
    assert isinstance(sched, LengthTriggeredLR)
    assert (sched.warmup_window, sched.surge_ratio, sched.decay_factor, sched.decay_period_factor,
            sched.floor) == (7, 2.5, 0.7, 1.1, 0.2)
    with pytest.raises(ValueError, match="linear"):
        make_scheduler("linear", make_optimizer(), 100)
    with pytest.raises(TypeError, match="warmup_steps"):
        make_scheduler("constant", make_optimizer(), 100, warmup_steps=5)
    with pytest.raises(ValueError, match="total_steps=0"):
        make_scheduler("cosine", make_optimizer(), 0)
    with pytest.raises(ValueError, match="floor=1.5"):
        make_scheduler("cosine", make_optimizer(), 10, floor=1.5)


@pytest.mark.parametrize(
    "name,value",
    [("warmup_window", 0), ("warmup_window", 2.5), ("surge_ratio", 0.0), ("surge_ratio", -1.0),
     ("surge_ratio", float("nan")), ("decay_factor", 0.0), ("decay_factor", 1.5),
     ("decay_period_factor", 0.0), ("floor", -0.1), ("floor", 1.01)],
)
def test_bad_arguments_raise_with_name(name, value):
    with pytest.raises(ValueError, match=f"{name}={value!r}"):
        LengthTriggeredLR(make_optimizer(), **{name: value})
    with pytest.raises(ValueError, match=name):
        make_scheduler("length", make_optimizer(), 10, **{name: value})


def test_last_epoch_other_than_minus_one_is_refused():
    with pytest.raises(ValueError, match="last_epoch=5"):
        LengthTriggeredLR(make_optimizer(), last_epoch=5)
