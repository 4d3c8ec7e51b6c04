"""Length-triggered learning-rate schedule: decay the step size when responses start to grow.

Why
---
The second paper behind this repository observes three things that move together during RL
training of a language model:

* the gradient noise (the spread of per-sequence gradients around their mean) grows;
* the training-inference mismatch grows: the log-probs that the rollout engine used to sample a
  response drift away from the log-probs that the training forward pass assigns to the same tokens;
* the mean response length rises, and it rises *before* training collapses.

Shrinking the update size suppresses the mismatch, and response length is cheap to watch, so the
schedule below uses a length surge as an early warning and decays the learning rate from then on,
instead of decaying on a fixed clock (cosine) or not at all (constant).

The rule
--------
Training steps are numbered i = 1, 2, 3, ... in the order ``observe`` is called, and L_i is the mean
response length of step i.

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
One training step is ``observe(L_i)`` -> ``optimizer.step()`` -> ``scheduler.step()``. The optimizer
step of step i has already used its rate, so eta_i (computed in ``scheduler.step()`` right after
step i) is the rate of step i + 1. The rate applied on step n therefore depends only on L_1..L_{n-1};
the first rate that can react to the surge at step s is the one of step s + 1. In PyTorch terms,
``scheduler.last_epoch == i`` after the i-th ``scheduler.step()``, and ``get_last_lr()`` returns
eta_i for each parameter group (each group scaled from its own initial rate eta_0).

Departures and readings (not confirmed from the paper)
------------------------------------------------------
W = 50, r = 3.0, d = 0.5, c = 1.8 and f = 0.1 are *one published reading* of the rule, not numbers
checked against the paper itself, so every one is an argument. Also our own choices: the surge is
declared once and never re-armed; the first decay at the surge step (above); steps numbered from 1;
the rate is a closed form of eta_0 (it overwrites, rather than composes with, other schedulers).

``make_scheduler`` builds this schedule or the two fixed-clock baselines it is compared against
("constant" and "cosine"), so that ``train.py`` changes one flag between them.
"""
from __future__ import annotations

import math
import numbers

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

# Slack added to (i - s) / P before the floor, so a whole number of periods computed as 4.999...9 counts as 5.
_ROUND_OFF = 1e-9


def _check_args(warmup_window, surge_ratio, decay_factor, decay_period_factor, floor):
    """Raise ValueError naming the first bad hyper-parameter and its value."""
    checks = [
        ("warmup_window", warmup_window,
         isinstance(warmup_window, numbers.Integral) and not isinstance(warmup_window, bool) and warmup_window >= 1,
         "an integer >= 1"),
        ("surge_ratio", surge_ratio, surge_ratio > 0, "> 0"),
        ("decay_factor", decay_factor, 0 < decay_factor <= 1, "in (0, 1]"),
        ("decay_period_factor", decay_period_factor, decay_period_factor > 0, "> 0"),
        ("floor", floor, 0 <= floor <= 1, "in [0, 1]"),
    ]
    for name, value, ok, want in checks:
        if not ok:
            raise ValueError(f"{name}={value!r} is invalid: must be {want}")


def num_decays(step, surge_step, decay_period_factor):
    """k_i: how many decays have been decided after step i (1-based). 0 before any surge."""
    if surge_step is None or step < surge_step:
        return 0
    period = decay_period_factor * surge_step  # P = c * s, real-valued
    return 1 + math.floor((step - surge_step) / period + _ROUND_OFF)


def length_lr_factor(step, surge_step, decay_factor, decay_period_factor, floor):
    """eta_i / eta_0 = max(d ** k_i, f): the closed form the scheduler applies."""
    k = num_decays(step, surge_step, decay_period_factor)  # k_i
    return max(decay_factor ** k, floor)


class LengthTriggeredLR(LRScheduler):
    """Decay the learning rate by ``decay_factor`` every ``decay_period_factor * s`` steps after a
    length surge at step s, never below ``floor * initial_lr`` (see the module docstring).

    Per training step: ``observe(mean_length)`` -> ``optimizer.step()`` -> ``scheduler.step()``.
    ``surge_step`` is None until a surge is declared, then the 1-based step number s.
    ``baseline_length`` is None until the warm-up window is complete, then L0.
    """

    def __init__(self, optimizer, warmup_window=50, surge_ratio=3.0, decay_factor=0.5,
                 decay_period_factor=1.8, floor=0.1, last_epoch=-1):
        _check_args(warmup_window, surge_ratio, decay_factor, decay_period_factor, floor)
        if last_epoch != -1:
            raise ValueError(f"last_epoch={last_epoch!r} is invalid: the length statistics cannot be "
                             "rebuilt from a step count; resume with load_state_dict() instead")
        self.warmup_window = warmup_window        # W: steps whose mean length sets the baseline
        self.surge_ratio = float(surge_ratio)     # r: surge when L_i > r * L0
        self.decay_factor = float(decay_factor)   # d: multiplier per decay
        self.decay_period_factor = float(decay_period_factor)  # c: period P = c * s
        self.floor = float(floor)                 # f: the rate never goes below f * eta_0
        # Everything below is plain Python data, so state_dict() carries it and torch.load(weights_only=True) reads it.
        self.warmup_lengths: list[float] = []     # L_1..L_W
        self.baseline_length: float | None = None  # L0
        self.surge_step: int | None = None        # s
        self.num_observed = 0                     # i of the last observed step
        self.last_length: float | None = None     # L_i of the last observed step
        self._pending_length: float | None = None  # observed but not yet consumed by step()
        self._ready = False                       # False only during LRScheduler.__init__'s initial step
        super().__init__(optimizer, last_epoch)
        self._ready = True

    def observe(self, mean_length: float) -> None:
        """Record L_i, the mean response length of the current step (once per step, before step())."""
        if self._pending_length is not None:
            raise RuntimeError("observe() called twice without step(); call it once per training step")
        mean_length = float(mean_length)
        if not math.isfinite(mean_length) or mean_length < 0:
            raise ValueError(f"mean_length={mean_length!r} is invalid: must be finite and >= 0")
        self._pending_length = mean_length

    def step(self) -> None:
        """Consume the observed L_i, update L0 / s, then set eta_i (the rate of the next step)."""
        if not self._ready:  # the base class's initial step: eta_0, nothing observed yet
            super().step()
            return
        if self._pending_length is None:
            raise RuntimeError("step() called without observe(mean_length) for this training step")
        length, self._pending_length = self._pending_length, None
        self.num_observed += 1
        i = self.num_observed                     # 1-based step number
        self.last_length = length                 # L_i
        if i <= self.warmup_window:
            self.warmup_lengths.append(length)
            if i == self.warmup_window:
                self.baseline_length = math.fsum(self.warmup_lengths) / self.warmup_window  # L0
        elif self.surge_step is None and length > self.surge_ratio * self.baseline_length:
            self.surge_step = i                   # s
        super().step()                            # last_epoch becomes i, then get_lr() gives eta_i
        assert self.last_epoch == i, (self.last_epoch, i)

    def get_lr(self) -> list[float]:
        """eta_i for every parameter group (called by the base class inside step())."""
        factor = length_lr_factor(self.last_epoch, self.surge_step, self.decay_factor,
                                  self.decay_period_factor, self.floor)  # eta_i / eta_0
        return [base_lr * factor for base_lr in self.base_lrs]

    @property
    def num_decays(self) -> int:
        """k_i after the last step() (for logging)."""
        return num_decays(self.last_epoch, self.surge_step, self.decay_period_factor)


# ---------------------------------------------------------------------------------------------
# The fixed-clock baselines and the one-flag factory used by train.py
# ---------------------------------------------------------------------------------------------
SCHEDULES = ("constant", "cosine", "length")


def cosine_factor(step, total_steps, floor=0.1):
    """eta_t / eta_0 = f + (1 - f) * (1 + cos(pi * min(t, T) / T)) / 2: 1 at t = 0, f from t = T on."""
    t = min(step, total_steps)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t / total_steps))


def make_scheduler(name, optimizer, total_steps, **length_kwargs) -> LRScheduler:
    """Build the schedule called ``name``.

    * "constant": the rate never changes (LambdaLR with factor 1).
    * "cosine": cosine decay from eta_0 down to ``floor * eta_0`` (floor from ``length_kwargs``,
      0.1 by default, the same floor the length schedule stops at) over ``total_steps`` scheduler
      steps, then flat; the rate of training step n (1-based) is eta_0 * cosine_factor(n - 1).
    * "length": ``LengthTriggeredLR(optimizer, **length_kwargs)``; the caller must ``observe()``.

    ``length_kwargs`` are the LengthTriggeredLR hyper-parameters; they are validated for every name
    (so a typo fails loudly), and ignored by "constant". Unknown names raise ValueError.
    """
    if name not in SCHEDULES:
        raise ValueError(f"name={name!r} is not a known schedule; choose one of {SCHEDULES}")
    allowed = ("warmup_window", "surge_ratio", "decay_factor", "decay_period_factor", "floor")
    unknown = sorted(set(length_kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"unknown length-schedule argument(s) {unknown}; allowed: {allowed}")
    if name == "length":
        return LengthTriggeredLR(optimizer, **length_kwargs)
    defaults = dict(warmup_window=50, surge_ratio=3.0, decay_factor=0.5, decay_period_factor=1.8, floor=0.1)
    merged = {**defaults, **length_kwargs}
    _check_args(**merged)
    if name == "constant":
        return LambdaLR(optimizer, lambda step: 1.0)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps={total_steps!r} is invalid: must be an integer >= 1")
    floor = merged["floor"]
    return LambdaLR(optimizer, lambda step: cosine_factor(step, total_steps, floor))


if __name__ == "__main__":  # a 400-step demo: flat lengths, then a surge at step 80 (P = 144)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = LengthTriggeredLR(opt)
    previous = sched.get_last_lr()[0]
    for i in range(1, 401):
        sched.observe(100.0 if i < 80 else 400.0)  # L_i
        opt.step()
        sched.step()
        lr = sched.get_last_lr()[0]  # eta_i, the rate of step i + 1
        if lr != previous:
            print(f"after step {i:3d}: surge_step={sched.surge_step} k={sched.num_decays} lr={lr:.4f}")
        previous = lr
