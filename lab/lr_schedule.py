"""Learning-rate schedules as plain functions: the length-triggered rule and two fixed clocks.

Why
---
The second paper behind this repository observes three things that move together during RL
training of a language model:

* the gradient noise (the spread of per-sequence gradients around their mean) grows;
* the training-inference mismatch grows: the log-probs that the rollout engine used to sample a
  response drift away from the log-probs that the training forward pass assigns to the same tokens;
* the mean response length rises, and it rises *before* training collapses.

Shrinking the update size suppresses the mismatch, and response length is cheap to watch, so the
length rule below uses a length surge as an early warning and decays the learning rate from then
on, instead of decaying on a fixed clock (cosine) or not at all (constant).

The rule
--------
Training steps are numbered i = 1, 2, 3, ..., and L_i is the mean response length of step i.

    L0  = (1 / W) * sum_{i=1..W} L_i                    baseline, W = warmup_window
    s   = min { i > W : L_i > r * L0 }                  surge step, r = surge_ratio (never reset)
    P   = c * s                                         decay period, c = decay_period_factor (real)
    k_i = 0                                 if no surge yet or i < s
        = 1 + floor((i - s) / P)            if i >= s   number of decays decided after step i
    eta_i = eta_0 * max(d ** k_i, f)                    d = decay_factor, f = floor

So the first decay is decided *at the surge step itself* (k_s = 1): a surge is an alarm, and waiting
a whole period (1.8 x 50 = 90 steps or more) before reacting would let the collapse it warns about
happen. Further decays come each time another full period has elapsed since s, i.e. at the first
integer steps i >= s + P, s + 2P, ...; P need not be an integer (for s = 11, P = 19.8, so decays at
i = 11, 31 (>= 30.8), 51 (>= 50.6), ...). Because 1.8 * s is computed in floating point, the ratio
(i - s) / P is nudged by 1e-9 before the floor so that a boundary that lands on a whole step
counts as reached (s = 13: 5 P = 117, yet (130 - 13) / (1.8 * 13) = 4.999999999999999).
The rate never goes below f * eta_0.

Which step's learning rate does L_i change?
-------------------------------------------
eta_i is computed after step i, from L_1..L_i, so it is the rate of step i + 1: the rate of step n
depends only on L_1..L_{n-1}, and the first rate that can react to a surge at step s is the one of
step s + 1. That is the whole interface: ``lr_factor(name, lengths, total_steps)`` takes the mean
lengths of the steps done so far and returns eta / eta_0 for the next step; train.py multiplies
its base rate by it and writes the result into the optimizer's param groups. The only state is the
list of observed lengths, which train.py saves in its checkpoints, so a resumed run gets exactly
the rates of an uninterrupted one.

Departures and readings (not confirmed from the paper)
------------------------------------------------------
W = 50, r = 3.0, d = 0.5, c = 1.8 and f = 0.1 are *one published reading* of the rule, not numbers
checked against the paper itself, so every one is an argument. Also our own choices: the surge is
declared once and never re-armed; the first decay at the surge step (above); steps numbered from 1;
the rate is a closed form of eta_0 (it overwrites, rather than composes with, other schedules).
"""
import math

SCHEDULES = ("constant", "cosine", "length")
DEFAULTS = dict(warmup_window=50, surge_ratio=3.0, decay_factor=0.5, decay_period_factor=1.8, floor=0.1)

# Slack added to (i - s) / P before the floor, so a whole number of periods computed as 4.999...9 counts as 5.
_ROUND_OFF = 1e-9


def check_args(warmup_window=50, surge_ratio=3.0, decay_factor=0.5, decay_period_factor=1.8, floor=0.1):
    """Raise ValueError naming the first bad hyper-parameter and its value."""
    checks = [
        ("warmup_window", warmup_window,
         isinstance(warmup_window, int) and not isinstance(warmup_window, bool) and warmup_window >= 1,
         "an integer >= 1"),
        ("surge_ratio", surge_ratio, surge_ratio > 0 and math.isfinite(surge_ratio), "finite and > 0"),
        ("decay_factor", decay_factor, 0 < decay_factor <= 1, "in (0, 1]"),
        ("decay_period_factor", decay_period_factor, 0 < decay_period_factor < math.inf, "finite and > 0"),
        ("floor", floor, 0 <= floor <= 1, "in [0, 1]"),
    ]
    for name, value, ok, want in checks:
        if not ok:
            raise ValueError(f"{name}={value!r} is invalid: must be {want}")


def surge_step(lengths, warmup_window=50, surge_ratio=3.0):
    """s: the first step i > W with L_i > r * L0 (1-based), or None. lengths = [L_1, L_2, ...]."""
    if len(lengths) <= warmup_window:
        return None
    L0 = math.fsum(lengths[:warmup_window]) / warmup_window  # baseline length
    return next((i for i in range(warmup_window + 1, len(lengths) + 1)
                 if lengths[i - 1] > surge_ratio * L0), None)


def num_decays(step, surge_step, decay_period_factor):
    """k_i: how many decays have been decided after step i (1-based). 0 before any surge."""
    if surge_step is None or step < surge_step:
        return 0
    period = decay_period_factor * surge_step  # P = c * s, real-valued
    return 1 + math.floor((step - surge_step) / period + _ROUND_OFF)


def cosine_factor(step, total_steps, floor=0.1):
    """eta_t / eta_0 = f + (1 - f) * (1 + cos(pi * min(t, T) / T)) / 2: 1 at t = 0, f from t = T on."""
    t = min(step, total_steps)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t / total_steps))


def lr_factor(name, lengths, total_steps, **kwargs):
    """eta / eta_0 for the next training step, after the steps whose mean lengths are ``lengths``.

    i = len(lengths) steps are done. "constant": 1. "cosine": cosine_factor(i, total_steps, floor),
    from 1 down to ``floor`` at step total_steps + 1, then flat. "length": max(d ** k_i, f) with the
    surge step s found in ``lengths`` (the module docstring). ``kwargs`` are the length-rule
    hyper-parameters (DEFAULTS); unknown names raise TypeError, bad values ValueError.
    """
    if name not in SCHEDULES:
        raise ValueError(f"name={name!r} is not a known schedule; choose one of {SCHEDULES}")
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown schedule argument(s) {unknown}; allowed: {tuple(DEFAULTS)}")
    p = {**DEFAULTS, **kwargs}
    check_args(**p)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps={total_steps!r} is invalid: must be an integer >= 1")
    bad = next((L for L in lengths if not (math.isfinite(L) and L >= 0)), None)
    if bad is not None:
        raise ValueError(f"lengths: {bad!r} is invalid: every mean length must be finite and >= 0")
    i = len(lengths)
    if name == "constant":
        return 1.0
    if name == "cosine":
        return cosine_factor(i, total_steps, p["floor"])
    s = surge_step(lengths, p["warmup_window"], p["surge_ratio"])
    return max(p["decay_factor"] ** num_decays(i, s, p["decay_period_factor"]), p["floor"])


if __name__ == "__main__":  # a 400-step demo: flat lengths, then a surge at step 80 (P = 144)
    lengths, previous = [], 1.0
    for i in range(1, 401):
        lengths.append(100.0 if i < 80 else 400.0)  # L_i
        factor = lr_factor("length", lengths, 400)  # eta_i / eta_0, the rate of step i + 1
        if factor != previous:
            print(f"after step {i:3d}: surge_step={surge_step(lengths)} lr factor={factor:.4f}")
        previous = factor
