"""Intervals a referee would sign: the bootstrap over prompts, paired ratios, seeds on the log scale.

Every quality number this project prints (``scale_free.py``'s alpha, cosine and normalised
variance, and the gain of one estimator over another) is an estimate from a finite sample, and
the thing that was sampled is the *prompt* (on the toy bandit: a block of groups). So its
uncertainty comes from resampling prompts, and nothing else:

    bootstrap    draw U prompts with replacement from the U measured ones, R times; each draw is
                 a weight vector w (U,) with w_u = (times prompt u was drawn) / U          (1)
    paired       every estimator of a comparison is recomputed on the *same* draw, so a ratio
                 between two of them keeps the correlation of their shared prompts          (2)
    interval     the 2.5% and 97.5% quantiles of the R recomputed values (percentile)      (3)

A ratio whose denominator's interval covers 0 has no meaningful size (it can be anything from
-inf to +inf): it is reported as "unresolved", never as a number. Values with a known range
(a cosine lies in [-1, 1]) are shown inside it; an estimate that fell outside is shown at the
bound and marked with ``*``.

Seeds (independent warm-ups and training runs) are a second, coarser unit. A ratio measured on k
seeds is combined on the log scale, where ratios add:

    geometric mean  exp(mean_s log x_s),  interval  exp(mean +- t(0.975, k - 1) sd / sqrt(k))  (4)

with the t quantile of k - 1 degrees of freedom (``t_quantile``, exact for integer degrees of
freedom: the Student t distribution function has a closed form then, Abramowitz & Stegun 26.7.3-4).
With 3 seeds that is t = 4.30: three seeds resolve only large effects, and the tables say so.

Small helpers used by the benchmarks sit at the end: mean and standard error, a t interval of a
mean (paired differences), Pearson and Spearman correlations.
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


def ratio(point, reps, den_lo, den_hi, level=0.95):
    """A ratio's (value, lo, hi), or (nan, nan, nan) when its denominator's interval covers 0."""
    if covers_zero(den_lo, den_hi) or not math.isfinite(point):
        return math.nan, math.nan, math.nan
    lo, hi = interval(reps, level)
    return point, lo, hi


# =====================================================================================
# Seeds on the log scale, eq. (4)
# =====================================================================================

def t_cdf(t, df):
    """P(T <= t) for Student's t with an integer number of degrees of freedom (closed form)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: A = (2/pi) [theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...)]
        term, series = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        A = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
    else:  # even: A = sin [1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...]
        term = series = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        A = math.sin(theta) * series
    return 0.5 + math.copysign(A / 2, t)  # A = P(|T| <= |t|)


def t_quantile(p, df):
    """The p-quantile of Student's t (integer df), by bisection on ``t_cdf``."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mean_interval(xs, level=0.95):
    """(mean, lo, hi): the t interval of a mean over k values (k - 1 degrees of freedom)."""
    xs = [float(x) for x in xs]
    k = len(xs)
    if k < 2 or any(math.isnan(x) for x in xs):
        return (xs[0] if k == 1 else math.nan), math.nan, math.nan
    mu = sum(xs) / k
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (k - 1))
    half = t_quantile((1 + level) / 2, k - 1) * sd / math.sqrt(k)
    return mu, mu - half, mu + half


def geometric_mean(xs, level=0.95):
    """Eq. (4): (geometric mean, lo, hi) over seeds; nan when any value is not a positive number."""
    xs = [float(x) for x in xs]
    if not xs or any(not (x > 0) or math.isinf(x) for x in xs):
        return math.nan, math.nan, math.nan
    mu, lo, hi = mean_interval([math.log(x) for x in xs], level)
    return math.exp(mu), math.exp(lo) if not math.isnan(lo) else math.nan, math.exp(hi) if not math.isnan(hi) else math.nan


# =====================================================================================
# Printing: nothing outside its range, "unresolved" instead of a meaningless number
# =====================================================================================

def fmt(value, lo=math.nan, hi=math.nan, digits=2, low=-math.inf, high=math.inf, suffix=""):
    """'value [lo, hi]' with every number clipped to [low, high] (a clipped estimate is marked *);
    'unresolved' when value is nan. Without an interval (nan lo/hi) only the value is shown."""
    if value is None or math.isnan(value):
        return "unresolved"

    def show(x, mark=False):
        y = min(max(x, low), high)
        return f"{y:.{digits}f}{suffix}" + ("*" if mark and y != x else "")

    text = show(value, mark=True)
    if not (math.isnan(lo) or math.isnan(hi)):
        text += f" [{show(lo)}, {show(hi)}]"
    return text


# =====================================================================================
# Small helpers shared by the benchmarks
# =====================================================================================

def mean_se(xs):
    """(mean, standard error of the mean) of the values present (None and nan are left out); the
    s.e. is nan for fewer than 2 values, both are nan for none."""
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    k = len(xs)
    mu = sum(xs) / k
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (k - 1)) if k > 1 else math.nan
    return mu, sd / math.sqrt(k)


def pearson(x, y):
    """Pearson correlation of two 1-D tensors or lists; nan when either is constant."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return (x @ y / (x.norm() * y.norm())).item()


def spearman(x, y):
    """Spearman rank correlation of two 1-D tensors (ties broken by order)."""
    rank = lambda v: torch.argsort(torch.argsort(v)).double()  # noqa: E731
    return pearson(rank(x), rank(y))
