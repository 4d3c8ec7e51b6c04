"""Intervals a referee would sign: the bootstrap over prompts, ratios near zero, seeds as strata.

Every quality number this project prints (``scale_free.py``'s alpha, cosine and normalised
variance, and the gain of one estimator over another) is an estimate from a finite sample, and
the thing that was sampled is the *prompt* (on the toy bandit: a block of groups). So its
uncertainty comes from resampling prompts, and nothing else:

    bootstrap    draw U prompts with replacement from the U measured ones, R times; each draw is
                 a weight vector w (U,) with w_u = (times prompt u was drawn) / U          (1)
    paired       every estimator of a comparison is recomputed on the *same* draw, so a ratio
                 between two of them keeps the correlation of their shared prompts          (2)
    interval     the 2.5% and 97.5% quantiles of the R recomputed values (percentile)      (3)

Ratios near zero
----------------
A ratio rho = a / b whose denominator b is weakly resolved has no stable percentile interval: an
estimate of b near 0 sends replicates to +-inf. Fieller's method instead keeps the set of rho that
a z test of a - rho b = 0 does not reject, with the variances and covariance of (a, b):

    (a - rho b)^2 <= z^2 (v_aa - 2 rho v_ab + rho^2 v_bb),   z = z_{(1 + level) / 2}      (4)

a quadratic inequality in rho. When b is resolved (b^2 > z^2 v_bb) the set is a bounded interval;
otherwise it is two rays or the whole line: a ratio with one resolved side only (the set's one
finite end is a one-sided bound), or none. If (a, b) is normal with known covariance, the set
covers the true ratio with probability ``level`` exactly, bounded or not. The quantities divided
here (sums of squared gradient norms over prompts) are far from normal: their bootstrap
distributions are skewed, with standard deviations above their means, and (4) then leaves the set
unbounded although no replicate of b comes near 0. So the tables invert the same test with the
bootstrap's own quantiles instead of the normal ones:

    rho is kept  <=>  neither a* - rho b* < 0 nor a* - rho b* > 0 holds in more than a share
                      (1 + level) / 2 of the replicates                                     (4')

Where every b* > 0 this is exactly the percentile interval of a* / b*; replicates with b* <= 0
enter without a division, and when more than (1 - level) / 2 of them have b* <= 0 the set is
unbounded: one-sided, or nothing. A ratio that must be >= 0 (a gain) is reported on the set
intersected with [0, inf).

A verdict (a ratio above ``null``, below it, or around it) is read from the replicates at rho = null
(``replicate_verdict``), with the Monte Carlo error of R draws in view: a share within 3 standard
errors of (1 + level) / 2 is an "edge", which another set of draws could decide either way.

Seeds as strata
---------------
Seeds (independent warm-ups) are a second unit. The headline for a cell measured on several
seeds is the *stratified pooled ratio*: prompts are resampled within each seed (independent
draws per seed), each side of the ratio is summed over seeds, and (4') is applied to the sums:

    a = sum_s a_s,  b = sum_s b_s,   replicates a^(r) = sum_s a_s^(r)                       (5)

a statement about these checkpoints (their prompts are the random part). Whether the seeds agree
with each other is asked of each seed's log-ratio y_s = log(a_s / b_s) and its bootstrap standard
error se_s (``log_ratio_se``: the standard deviation of log a_s* - log b_s* over the replicates) by
the random-effects model of ``stats.py``, whose eqs. (6)-(6'') continue this numbering.

Values with a known range (a cosine lies in [-1, 1], a gain and a squared bias in [0, inf)) are
stored as estimated and listed by the caller as out of range (``clip`` says whether a value leaves
it); printing clips them and marks every clipped number ``*``.

Why the draws (1) are made here and not by ``scipy.stats.bootstrap``: one draw of prompts is shared by
every estimator and every sum of a table (2), each statistic is a weighted sum over prompts computed for
all R draws at once as a matrix product, the seeds are strata (5), and the set (4') inverts a test over
those shared replicates; scipy's bootstrap resamples the data passed to one statistic and returns its
interval, so it holds none of these. Where the form fits, a percentile interval of one mean over seeds,
the project calls it (benchmarks/stability_replication.py).
"""
import math

import torch


# =====================================================================================
# The bootstrap over units, eqs. (1)-(3)
# =====================================================================================

def bootstrap_weights(units, replicates=2000, seed=0):
    """Eq. (1): ``replicates`` resamples of ``units`` units as weights, (R, U) float64, rows sum to 1."""
    if units < 2:
        raise ValueError(f"the bootstrap needs at least 2 units (prompts), got {units}")
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(units, (replicates, units), generator=gen)  # (R, U) unit drawn at each slot
    counts = torch.zeros(replicates, units, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(replicates, units, dtype=torch.float64))  # (R, U)
    return counts / units


def interval(replicates, level=0.95):
    """Eq. (3): the percentile interval (lo, hi) of bootstrap replicates (R,); nan if any is nan."""
    reps = torch.as_tensor(replicates, dtype=torch.float64)
    if torch.isnan(reps).any():
        return math.nan, math.nan
    lo = torch.quantile(reps, (1 - level) / 2, interpolation="lower").item()  # order statistics:
    hi = torch.quantile(reps, (1 + level) / 2, interpolation="higher").item()  # +-inf replicates stay valid
    return lo, hi


def covers_zero(lo, hi):
    """True when an interval (lo, hi) contains 0, or is undefined: the quantity is not resolved."""
    return not (lo > 0 or hi < 0)  # nan compares False both ways: unresolved


# =====================================================================================
# Ratios near zero: the test inverted with the bootstrap's quantiles, eq. (4')
# =====================================================================================

def inverted_set(a_reps, b_reps, a=None, b=None, level=0.95, low=-math.inf, high=math.inf):
    """Eq. (4'): the ratios rho for which neither side of 0 holds more than (1 + level) / 2 of the
    bootstrap replicates of a* - rho b* (the percentile test of a - rho b = 0, inverted), within
    [low, high]. Where every b* > 0 this is the percentile interval of a* / b*; replicates with b* <= 0
    need no division. Returns (lo, hi): a bounded interval; one end at the range's end (a one-sided bound,
    the other end open); (low, high) when the set says nothing (two pieces within the range).
    a, b: the point estimates, only to place the set when it is empty (never in practice)."""
    x, y = torch.as_tensor(a_reps, dtype=torch.float64), torch.as_tensor(b_reps, dtype=torch.float64)
    ok = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[ok], y[ok]
    limit = (1 + level) / 2 * x.numel()  # at most this many replicates strictly on one side of 0
    pos, neg = y > 0, y < 0
    r_pos, _ = (x[pos] / y[pos]).sort()  # a* - rho b* < 0  <=>  rho > r  (b* > 0)
    r_neg, _ = (x[neg] / y[neg]).sort()  # a* - rho b* < 0  <=>  rho < r  (b* < 0)
    zero = ~(pos | neg)
    below0, above0 = (x[zero] < 0).sum().item(), (x[zero] > 0).sum().item()  # b* = 0: fixed sides
    cuts = torch.cat([r_pos, r_neg]).unique()  # (C,) the only places where the counts change
    if cuts.numel():
        mids = (cuts[1:] + cuts[:-1]) / 2
        span = (cuts[-1] - cuts[0]).abs().item() + 1.0
        probes = torch.cat([cuts, mids, torch.tensor([cuts[0].item() - span, cuts[-1].item() + span],
                                                     dtype=torch.float64)]).sort()[0]
    else:
        probes = torch.tensor([0.0], dtype=torch.float64)

    def counts(rho):  # replicates with a* - rho b* < 0, and > 0
        n_lt = (r_pos.numel() - torch.searchsorted(r_pos, rho, right=True)) + torch.searchsorted(r_neg, rho)
        n_gt = torch.searchsorted(r_pos, rho) + (r_neg.numel() - torch.searchsorted(r_neg, rho, right=True))
        return n_lt + below0, n_gt + above0
    n_lt, n_gt = counts(probes)
    accept = (n_lt <= limit) & (n_gt <= limit)  # (probes,)
    edge = torch.diff(accept.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8),
                      append=torch.zeros(1, dtype=torch.int8))  # +1 where a run of kept probes starts
    starts, ends = (edge == 1).nonzero().flatten().tolist(), ((edge == -1).nonzero().flatten() - 1).tolist()
    last, at = len(accept) - 1, probes.tolist()  # the outer probes stand for -inf and +inf
    pieces = [(-math.inf if i == 0 else at[i], math.inf if j == last else at[j]) for i, j in zip(starts, ends)]
    inside = [(max(lo, low), min(hi, high)) for lo, hi in pieces if hi >= low and lo <= high]
    if len(inside) == 1:
        return inside[0]
    if inside or not pieces:  # two pieces within the range, or (never in practice) none at all
        return (low, high) if inside or a is None or b is None or b == 0 else (min(max(a / b, low), high),) * 2
    return (low, low) if pieces[-1][1] < low else (high, high)  # the data reject the whole range: its end


def ratio_set(a, b, a_reps, b_reps, level=0.95, low=-math.inf, high=math.inf):
    """A ratio a / b with its eq. (4') set from paired bootstrap replicates of (a, b): (value, lo, hi);
    value as estimated (nan when b is 0 or either side is not finite), the set within [low, high]."""
    value = a / b if b != 0 and math.isfinite(a) and math.isfinite(b) else math.nan
    return (value, *inverted_set(a_reps, b_reps, a, b, level=level, low=low, high=high))


def replicate_verdict(a_reps, b_reps, null=1.0, level=0.95, band=3.0):
    """Whether a / b lies above or below ``null`` by eq. (4') at rho = null, with the Monte Carlo error
    of R replicates in view. The share of replicates with a* > null b* (or a* < null b*) is compared
    with t = (1 + level) / 2: 'above' ('below') when it exceeds t by more than ``band`` standard errors
    sqrt(t (1 - t) / R); 'edge' when it lies within that band of t (another set of draws could decide
    either way); else 'covers'."""
    x, y = torch.as_tensor(a_reps, dtype=torch.float64), torch.as_tensor(b_reps, dtype=torch.float64)
    ok = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[ok], y[ok]
    t = (1 + level) / 2
    se = math.sqrt(t * (1 - t) / max(x.numel(), 1))
    for share, word in (((x > null * y).double().mean().item(), "above"),
                        ((x < null * y).double().mean().item(), "below")):
        if share > t + band * se:
            return word
        if share >= t - band * se:
            return "edge"
    return "covers"


# =====================================================================================
# Seeds: strata of the bootstrap, eq. (5), and each seed's log-ratio
# =====================================================================================

def stratified(parts):
    """Eq. (5): [(point, replicates (R,)), ...] over strata (seeds, each with its own independent
    draws) -> (sum of the points, sum of the replicates (R,))."""
    points, reps = zip(*parts)
    return sum(float(x) for x in points), torch.stack([torch.as_tensor(r, dtype=torch.float64) for r in reps]).sum(0)


def log_ratio_se(a_reps, b_reps, share=0.975):
    """The bootstrap standard error of log(a / b) from paired replicates, over the pairs where both are
    positive and finite; nan when those are fewer than ``share`` of them (a ratio not resolved away
    from 0 has no log scale)."""
    a, b = torch.as_tensor(a_reps, dtype=torch.float64), torch.as_tensor(b_reps, dtype=torch.float64)
    ok = torch.isfinite(a) & torch.isfinite(b) & (a > 0) & (b > 0)
    if ok.double().mean().item() < share or ok.sum() < 2:
        return math.nan
    return (a[ok].log() - b[ok].log()).std().item()


# =====================================================================================
# Printing and storing: nothing outside its range without a mark, "unresolved" for no statement
# =====================================================================================

def clip(value, lo=math.nan, hi=math.nan, low=-math.inf, high=math.inf):
    """(value, lo, hi) moved into [low, high] (nan stays nan) and whether anything moved."""
    out = [x if math.isnan(x) else min(max(x, low), high) for x in (value, lo, hi)]
    return (*out, any(a != b for a, b in zip(out, (value, lo, hi)) if not math.isnan(a)))


def fmt(value, lo=math.nan, hi=math.nan, digits=2, low=-math.inf, high=math.inf, suffix="", moved=False):
    """'value [lo, hi]' with each number clipped to [low, high] and marked * where it was clipped
    here, or (the value) where ``moved`` says it was clipped before it was stored; 'unresolved' when
    value is nan. Without an interval (nan lo/hi) only the value is shown."""
    if value is None or math.isnan(value):
        return "unresolved"

    def show(x, mark=False):
        y = min(max(x, low), high)
        return f"{y:.{digits}f}{suffix}" + ("*" if mark or y != x else "")

    text = show(value, moved)
    if not (math.isnan(lo) or math.isnan(hi)):
        text += f" [{show(lo)}, {show(hi)}]"
    return text


def fmt_set(value, lo, hi, digits=2, low=-math.inf, high=math.inf, suffix=""):
    """An eq. (4') set: 'value [lo, hi]' when bounded inside the range, '>= lo' or '<= hi' when only
    one end is resolved, 'unresolved' when neither is (or value is nan)."""
    open_lo, open_hi = not lo > low, not hi < high
    if value is None or math.isnan(value) or (open_lo and open_hi):
        return "unresolved"
    if open_hi:
        return f"\u2265 {lo:.{digits}f}{suffix}"
    if open_lo:
        return f"\u2264 {hi:.{digits}f}{suffix}"
    return f"{value:.{digits}f}{suffix} [{lo:.{digits}f}{suffix}, {hi:.{digits}f}{suffix}]"
