"""Tests for lr_schedule.py: the length-triggered rule against an independent loop, hand-derived
values, the floor, causality, exact resume through a checkpoint, the fixed clocks and argument checks.
"""
import io
import math
import random
from fractions import Fraction
from statistics import fmean

import pytest
import torch

from lab.lr_schedule import DEFAULTS, SCHEDULES, cosine_factor, lr_factor, surge_step


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def run(lengths, name="length", total_steps=None, **kwargs):
    """eta_i / eta_0 after each step i: eta[i - 1] is the factor of step i + 1, from L_1..L_i."""
    total = total_steps or len(lengths)
    return [lr_factor(name, lengths[:i], total, **kwargs) for i in range(1, len(lengths) + 1)]


def used_rates(lengths, **kwargs):
    """used[n - 1]: the factor step n uses, from L_1..L_{n-1} (step 1 uses eta_0)."""
    return [lr_factor("length", lengths[:n - 1], len(lengths), **kwargs) for n in range(1, len(lengths) + 1)]


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
    assert surge_step(lengths) is None
    assert all(f == 1.0 for f in run(lengths))
    # A ratio of 1.5 is still never crossed: 1.5 * L0 >= 120 >= L_i (the test is strict, ">").
    assert surge_step(lengths, surge_ratio=1.5) is None
    assert all(f == 1.0 for f in run(lengths, surge_ratio=1.5))


def test_hand_derived_values():
    # W = 5, L0 = 10; L = 30 = 3 L0 at steps 6..9 is not a surge (strict ">"); L = 31 at step 10 is.
    # P = 1.8 * 10 = 18, so k = 1 after steps 10..27, 2 after 28..45, 3 after 46..63, 4 from 64 on.
    lengths = [10.0] * 5 + [30.0] * 4 + [31.0] * 91
    assert lr_factor("length", [], 100, warmup_window=5) == 1.0  # eta_0
    used = used_rates(lengths, warmup_window=5)  # used[n - 1]: rate of step n
    assert surge_step(lengths, warmup_window=5) == 10
    expected = {1: 1.0, 10: 1.0, 11: 0.5, 28: 0.5, 29: 0.25, 46: 0.25, 47: 0.125, 64: 0.125,
                65: 0.1, 100: 0.1}  # 0.5 ** 4 = 0.0625 < floor 0.1
    for n, lr in expected.items():
        assert used[n - 1] == lr, (n, used[n - 1], lr)


def test_non_integer_period_hand_values():
    # s = 11, P = 19.8: decays decided after the first whole steps >= 11 + j * 19.8 = 11, 30.8, 50.6, 70.4, 90.2.
    lengths = [10.0] * 10 + [40.0] * 90
    eta = run(lengths, warmup_window=10, floor=0.0)
    assert surge_step(lengths, warmup_window=10) == 11
    changes = [i for i in range(2, 101) if eta[i - 1] != eta[i - 2]]
    assert changes == [11, 31, 51, 71, 91]
    assert eta[-1] == 0.5 ** 5
    # s = 13, P = 23.4 and 5 P = 117 exactly, but (130 - 13) / (1.8 * 13) < 5 in floating point:
    # the fifth period must still count as elapsed after step 130 (k = 6), not after step 131.
    lengths = [10.0] * 12 + [40.0] * 130
    eta = run(lengths, warmup_window=12, floor=0.0)
    assert surge_step(lengths, warmup_window=12) == 13
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
    full = {**DEFAULTS, **kwargs}
    lengths = surge_lengths(400, surge_at, seed=surge_at)
    lr0 = 2e-3
    eta = [lr0 * f for f in run(lengths, **full)]
    ref, s = reference_rates(lengths, lr0, **full)
    assert s == surge_at and surge_step(lengths, full["warmup_window"], full["surge_ratio"]) == surge_at
    assert eta == pytest.approx(ref, rel=1e-12, abs=0.0)
    assert all(lr >= full["floor"] * lr0 * (1 - 1e-12) for lr in eta)
    assert eta[surge_at - 2] == lr0  # the rate is untouched up to and including eta_{s-1}


def test_never_below_floor():
    lengths = [10.0] * 5 + [100.0] * 295  # surge at 6, P = 0.6: decays every step
    eta = run(lengths, warmup_window=5, decay_period_factor=0.1, floor=0.3)
    assert min(eta) == 0.3 and eta[-1] == 0.3
    eta = run(lengths, warmup_window=5, decay_period_factor=0.1, floor=0.0)
    assert all(lr >= 0.0 for lr in eta) and eta[-1] < 1e-100


def test_rate_of_step_n_depends_only_on_earlier_lengths():
    base = [50.0] * 30
    surged = list(base)
    surged[19] = 500.0  # a surge at step 20 in one run only
    rates = [used_rates(lengths, warmup_window=10) for lengths in (base, surged)]
    assert rates[0][:20] == rates[1][:20]  # steps 1..20 cannot see L_20
    assert rates[1][20] == 0.5 and rates[0][20] == 1.0  # step 21 is the first to react


def test_surge_is_not_rearmed_and_bad_lengths_raise():
    assert surge_step([10.0] * 5 + [100.0] + [10.0] * 10 + [1000.0], warmup_window=5) == 6
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="lengths"):
            lr_factor("length", [3.0, bad], 10)


# ------------------------------------------------------------------------------------------------
# resume: the state is the list of observed lengths
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("save_at", [4, 10, 20, 40, 51, 52])  # in warm-up, at its end, pre-surge, post-surge, at decays
def test_resume_through_a_checkpoint_matches_uninterrupted_run(save_at):
    """Save the lengths with torch.save, load them with weights_only=True, continue: the same rates."""
    kw = dict(warmup_window=10, decay_period_factor=0.7)  # W = 10; surge at 30, P = 21
    lengths = surge_lengths(120, 30, seed=7)
    full = run(lengths, **kw)
    buf = io.BytesIO()
    torch.save({"lengths": lengths[:save_at]}, buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=True)["lengths"]
    resumed = run(lengths[:save_at], total_steps=120, **kw)
    resumed += [lr_factor("length", restored + lengths[save_at:i], 120, **kw) for i in range(save_at + 1, 121)]
    assert resumed == full  # exact, not approximate
    assert len(set(full)) > 3  # the comparison covers several decays


# ------------------------------------------------------------------------------------------------
# fixed clocks and arguments
# ------------------------------------------------------------------------------------------------
def test_constant_and_cosine():
    assert SCHEDULES == ("constant", "cosine", "length")
    assert set(used_rates_for("constant", 500, 100, warmup_window=5)) == {1.0}
    used = used_rates_for("cosine", 150, 100)  # used[t] = factor(t)
    assert used[0] == 1.0
    assert used[50] == pytest.approx(0.55, rel=1e-12)   # half-way: (1 + f) / 2
    assert used[100] == pytest.approx(0.1, rel=1e-12)   # reaches f after total_steps steps...
    assert all(lr == pytest.approx(0.1, rel=1e-12) for lr in used[100:])  # ...and stays there
    assert all(a >= b for a, b in zip(used, used[1:]))
    assert used[25] == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2, rel=1e-12)  # cos(pi/4)
    assert cosine_factor(0, 10, floor=0.3) == 1.0 and cosine_factor(10, 10, floor=0.3) == pytest.approx(0.3)
    assert used_rates_for("cosine", 101, 100, floor=0.0)[100] == pytest.approx(0.0, abs=1e-15)


def used_rates_for(name, n, total_steps, **kwargs):
    return [lr_factor(name, [5.0] * t, total_steps, **kwargs) for t in range(n)]


def test_unknown_names_and_bad_total_steps():
    with pytest.raises(ValueError, match="linear"):
        lr_factor("linear", [], 100)
    with pytest.raises(TypeError, match="warmup_steps"):
        lr_factor("constant", [], 100, warmup_steps=5)
    with pytest.raises(ValueError, match="total_steps=0"):
        lr_factor("cosine", [], 0)
    with pytest.raises(ValueError, match="floor=1.5"):
        lr_factor("cosine", [], 10, floor=1.5)


@pytest.mark.parametrize(
    "name,value",
    [("warmup_window", 0), ("warmup_window", 2.5), ("surge_ratio", 0.0), ("surge_ratio", -1.0),
     ("surge_ratio", float("nan")), ("surge_ratio", float("inf")), ("decay_factor", 0.0), ("decay_factor", 1.5),
     ("decay_period_factor", 0.0), ("decay_period_factor", float("nan")), ("floor", -0.1), ("floor", 1.01)],
)
def test_bad_arguments_raise_with_name(name, value):
    for schedule in SCHEDULES:  # checked for every schedule, so a typo fails loudly
        with pytest.raises(ValueError, match=f"{name}={value!r}"):
            lr_factor(schedule, [], 10, **{name: value})
