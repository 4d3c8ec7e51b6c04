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

Seeds: strata, and a random-effects check
-----------------------------------------
Seeds (independent warm-ups) are a second unit. The headline for a cell measured on several
seeds is the *stratified pooled ratio*: prompts are resampled within each seed (independent
draws per seed), each side of the ratio is summed over seeds, and (4') is applied to the sums:

    a = sum_s a_s,  b = sum_s b_s,   replicates a^(r) = sum_s a_s^(r)                       (5)

a statement about these checkpoints (their prompts are the random part). Beside it, to show
whether the seeds agree, each seed's log-ratio y_s with its bootstrap standard error se_s enters
a DerSimonian-Laird random-effects model (DerSimonian & Laird 1986), with weights w_s = 1 / se_s^2:

    Q = sum_s w_s (y_s - y_w)^2,   y_w = sum_s w_s y_s / sum_s w_s       (Cochran's Q, df k - 1)
    tau^2 = max(0, (Q - (k - 1)) / (sum w - sum w^2 / sum w))          (between-seed variance)
    mu = sum w*_s y_s / sum w*_s,  w*_s = 1 / (se_s^2 + tau^2),  mu +- z / sqrt(sum w*_s)     (6)

and I^2 = max(0, (Q - (k - 1)) / Q), the share of the spread that is between seeds. Q's p-value
is the chi-square survival function with k - 1 degrees of freedom (closed form for integer df).

With few seeds the normal interval (6) is too narrow: it treats tau^2 and the weights as known.
The Hartung-Knapp(-Sidik-Jonkman) interval keeps mu and w*_s but estimates the variance of mu from
the spread of the seeds themselves, with a t quantile (Hartung & Knapp 2001; Sidik & Jonkman 2002):

    q = sum_s w*_s (y_s - mu)^2 / (k - 1),   mu +- t_{k-1} sqrt(q / sum w*_s)                 (6')

and a new seed's (a new checkpoint's) log-ratio is predicted, not estimated, by the interval of
Higgins, Thompson & Spiegelhalter (2009), which adds tau^2 to the mean's variance:

    mu +- t_{k-2} sqrt(tau^2 + 1 / sum w*_s)                                                 (6'')

A verdict (a ratio above ``null``, below it, or around it) is read from the replicates at rho = null
(``replicate_verdict``), with the Monte Carlo error of R draws in view: a share within 3 standard
errors of (1 + level) / 2 is an "edge", which another set of draws could decide either way.

Values with a known range (a cosine lies in [-1, 1], a gain and a squared bias in [0, inf)) are
stored as estimated and listed by the caller as out of range (``clip`` says whether a value leaves
it); printing clips them and marks every clipped number ``*``.

The t distribution (``t_cdf``, ``t_quantile``: exact for integer degrees of freedom, Abramowitz &
Stegun 26.7.3-4) serves paired differences over seeds (``mean_interval``); ``wilson`` is the
score interval of a success rate. Small helpers used by the benchmarks sit at the end: mean and standard error, Pearson and Spearman correlations.
"""
import math
from statistics import NormalDist

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
# Ratios near zero: the test-inversion (Fieller) set, eq. (4)
# =====================================================================================

def z_quantile(p):
    """The p-quantile of the standard normal distribution."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return NormalDist().inv_cdf(p)


def fieller(a, b, v_aa, v_bb, v_ab, level=0.95, low=-math.inf, high=math.inf):
    """Eq. (4): the ratios rho = a / b that a z test of a - rho b = 0 does not reject, given the
    variances v_aa, v_bb and covariance v_ab of (a, b), intersected with the range [low, high].
    Returns (lo, hi): a bounded interval; one end at the range's end (a one-sided bound, the other end
    open); (low, high) when the set says nothing (the whole line, or two pieces within the range)."""
    z2 = z_quantile((1 + level) / 2) ** 2
    A, B, C = b * b - z2 * v_bb, -2 * (a * b - z2 * v_ab), a * a - z2 * v_aa  # A rho^2 + B rho + C <= 0
    D = B * B - 4 * A * C
    if A > 0:  # b resolved: a bounded interval (D >= 0, since rho = a / b satisfies (4))
        r = math.sqrt(max(D, 0.0))
        pieces = [((-B - r) / (2 * A), (-B + r) / (2 * A))]
    elif D > 0:  # b not resolved: two rays outside the roots
        r1, r2 = sorted(((-B - math.sqrt(D)) / (2 * A), (-B + math.sqrt(D)) / (2 * A)))
        pieces = [(-math.inf, r1), (r2, math.inf)]
    else:  # nothing is rejected
        pieces = [(-math.inf, math.inf)]
    inside = [(max(lo, low), min(hi, high)) for lo, hi in pieces if hi >= low and lo <= high]
    if len(inside) == 1:
        return inside[0]
    if inside:  # two pieces within the range: no single statement
        return low, high
    return (low, low) if pieces[0][1] < low else (high, high)  # the data reject the whole range: its end


def inverted_set(a_reps, b_reps, a=None, b=None, level=0.95, low=-math.inf, high=math.inf):
    """Eq. (4'): the ratios rho for which neither side of 0 holds more than (1 + level) / 2 of the
    bootstrap replicates of a* - rho b* (the percentile test of a - rho b = 0, inverted), within
    [low, high]. Where every b* > 0 this is the percentile interval of a* / b*; replicates with b* <= 0
    need no division. Returns (lo, hi) as ``fieller`` does (an end at the range's end is open).
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


def verdict(lo, hi, null=1.0):
    """'above' / 'below' when the set (lo, hi) lies entirely on one side of ``null``, else 'covers'."""
    return "above" if lo > null else "below" if hi < null else "covers"


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
# Seeds: strata of the bootstrap, and the random-effects check, eqs. (5)-(6)
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


def chi2_sf(x, df):
    """P(X >= x) for a chi-square with an integer number of degrees of freedom (closed forms)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if x <= 0:
        return 1.0
    if df % 2 == 0:  # exp(-x/2) sum_{k < df/2} (x/2)^k / k!
        term = total = 1.0
        for k in range(1, df // 2):
            term *= x / 2 / k
            total += term
        return math.exp(-x / 2) * total
    # odd: erfc(sqrt(x/2)) + sqrt(2/pi) exp(-x/2) sum_{k=1}^{(df-1)/2} x^{k - 1/2} / (1*3*...*(2k-1))
    term, total = math.sqrt(x), 0.0
    for k in range(1, (df - 1) // 2 + 1):
        total += term
        term *= x / (2 * k + 1)
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 / math.pi) * math.exp(-x / 2) * total


def random_effects(y, se, level=0.95):
    """Eq. (6), DerSimonian-Laird: per-stratum estimates y (k,) with standard errors se (k,) ->
    dict(mean, lo, hi, se, tau2, Q, df, p (Q's chi-square p-value), I2, k). nan without k >= 1 finite
    pairs with se > 0."""
    y, se = [float(v) for v in y], [float(v) for v in se]
    k = len(y)
    if k == 0 or any(not math.isfinite(v) for v in y + se) or any(v <= 0 for v in se):
        return dict(mean=math.nan, lo=math.nan, hi=math.nan, se=math.nan, tau2=math.nan, Q=math.nan,
                    df=max(k - 1, 0), p=math.nan, I2=math.nan, k=k)
    w = [1 / v ** 2 for v in se]  # w_s
    y_w = sum(wi * yi for wi, yi in zip(w, y)) / sum(w)
    Q = sum(wi * (yi - y_w) ** 2 for wi, yi in zip(w, y))  # Cochran's Q
    c = sum(w) - sum(wi ** 2 for wi in w) / sum(w)
    tau2 = max(0.0, (Q - (k - 1)) / c) if k > 1 else 0.0  # tau^2
    w_star = [1 / (v ** 2 + tau2) for v in se]  # w*_s
    mu = sum(wi * yi for wi, yi in zip(w_star, y)) / sum(w_star)
    se_mu = math.sqrt(1 / sum(w_star))
    half = z_quantile((1 + level) / 2) * se_mu
    return dict(mean=mu, lo=mu - half, hi=mu + half, se=se_mu, tau2=tau2, Q=Q, df=k - 1,
                p=chi2_sf(Q, k - 1) if k > 1 else math.nan,
                I2=max(0.0, (Q - (k - 1)) / Q) if k > 1 and Q > 0 else 0.0, k=k)


def hartung_knapp(y, se, level=0.95):
    """Eq. (6'): the DerSimonian-Laird fit of ``random_effects`` with the Hartung-Knapp interval:
    its dict with lo, hi and se replaced (se = sqrt(q / sum w*_s)), and q and the t degrees of freedom
    (k - 1) added as ``q`` and ``t_df``. nan interval for k < 2."""
    r = random_effects(y, se, level)
    k = r["k"]
    if k < 2 or math.isnan(r["mean"]):
        return dict(r, lo=math.nan, hi=math.nan, se=math.nan, q=math.nan, t_df=max(k - 1, 0))
    w_star = [1 / (float(v) ** 2 + r["tau2"]) for v in se]  # w*_s
    q = sum(wi * (float(yi) - r["mean"]) ** 2 for wi, yi in zip(w_star, y)) / (k - 1)
    se_hk = math.sqrt(q / sum(w_star))
    half = t_quantile((1 + level) / 2, k - 1) * se_hk
    return dict(r, lo=r["mean"] - half, hi=r["mean"] + half, se=se_hk, q=q, t_df=k - 1)


def prediction_interval(y, se, level=0.95):
    """Eq. (6''): (lo, hi), where a new stratum's true effect is expected to lie under the
    DerSimonian-Laird fit, mu +- t_{k-2} sqrt(tau^2 + 1 / sum w*_s) (Higgins, Thompson &
    Spiegelhalter 2009); (nan, nan) for k < 3."""
    r = random_effects(y, se, level)
    if r["k"] < 3 or math.isnan(r["mean"]):
        return math.nan, math.nan
    half = t_quantile((1 + level) / 2, r["k"] - 2) * math.sqrt(r["tau2"] + r["se"] ** 2)  # r["se"]^2 = 1/sum w*
    return r["mean"] - half, r["mean"] + half


# =====================================================================================
# The t distribution: paired differences over seeds
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



def paired_t_power(effect, sd, n, alpha=0.05):
    """Power of the two-sided paired t test (n pairs, level alpha) when the paired differences are
    normal with mean ``effect`` and standard deviation ``sd``: P(|T'| > c), c = t(1 - alpha/2, n - 1),
    T' = (Z + delta) / S noncentral t, delta = effect sqrt(n) / sd, S = sqrt(chi2_{n-1} / (n - 1)).

        P(T' > c) = E_S[1 - Phi(c S - delta)],   P(T' < -c) = E_S[Phi(-c S - delta)]

    integrated over the density of S, f(s) = 2 k^(k/2) s^(k-1) exp(-k s^2 / 2) / (2^(k/2) Gamma(k/2)),
    k = n - 1, on [0, top], top = 1 + 12 / sqrt(k), by Simpson's rule (2000 intervals) in x, s = top x^2
    (points dense near s = 0, where a large c rejects)."""
    if n < 2 or int(n) != n:
        raise ValueError(f"n must be an integer >= 2, got {n}")
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    k, Phi = n - 1, NormalDist().cdf
    c, delta = t_quantile(1 - alpha / 2, k), effect * math.sqrt(n) / sd
    log_norm = math.log(2) + (k / 2) * math.log(k) - (k / 2) * math.log(2) - math.lgamma(k / 2)
    top, m = 1 + 12 / math.sqrt(k), 2000
    total = 0.0
    for i in range(1, m + 1):  # the integrand is 0 at x = 0 (ds / dx = 2 top x)
        x = i / m
        s = top * x * x
        f = math.exp(log_norm + (k - 1) * math.log(s) - k * s * s / 2)  # f(s)
        weight = 1 if i == m else (4 if i % 2 else 2)
        total += weight * f * 2 * top * x * (1 - Phi(c * s - delta) + Phi(-c * s - delta))
    return total / (3 * m)


def seeds_needed(effect, sd, alpha=0.05, power=0.8, most=10_000):
    """The fewest pairs n >= 2 whose two-sided paired t test at level alpha has at least ``power``
    against a mean difference ``effect`` with between-pair standard deviation ``sd``
    (``paired_t_power``). Close to the normal-theory n = ((z(1 - alpha/2) + z(power)) sd / effect)^2
    plus z(1 - alpha/2)^2 / 2 (Guenther's correction for estimating sd)."""
    if effect == 0:
        raise ValueError("effect must be non-zero: no number of seeds resolves a zero difference")
    n_z = ((NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)) * sd / effect) ** 2
    for n in range(max(2, math.floor(n_z)), most + 1):  # a known sd would need n_z: the t test no fewer
        if paired_t_power(effect, sd, n, alpha) >= power:
            return n
    raise ValueError(f"more than {most} pairs needed")

def wilson(k, n, z=NormalDist().inv_cdf(0.975)):
    """(k / n, lo, hi): the Wilson score interval of a binomial proportion (95% by default)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def geometric_mean(xs, level=0.95):
    """(geometric mean, lo, hi) of positive ratios over k runs: exp of the t interval of their logs
    (mean_interval); nan when any value is not a positive number. The sweeps pool seeds as strata
    instead (eq. (5)); this serves studies whose unit is the run itself."""
    xs = [float(x) for x in xs]
    if not xs or any(not (x > 0) or math.isinf(x) for x in xs):
        return math.nan, math.nan, math.nan
    mu, lo, hi = mean_interval([math.log(x) for x in xs], level)
    return math.exp(mu), math.exp(lo) if not math.isnan(lo) else math.nan, math.exp(hi) if not math.isnan(hi) else math.nan


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
    """An eq. (4) or (4') set: 'value [lo, hi]' when bounded inside the range, '>= lo' or '<= hi' when only
    one end is resolved, 'unresolved' when neither is (or value is nan)."""
    open_lo, open_hi = not lo > low, not hi < high
    if value is None or math.isnan(value) or (open_lo and open_hi):
        return "unresolved"
    if open_hi:
        return f"\u2265 {lo:.{digits}f}{suffix}"
    if open_lo:
        return f"\u2264 {hi:.{digits}f}{suffix}"
    return f"{value:.{digits}f}{suffix} [{lo:.{digits}f}{suffix}, {hi:.{digits}f}{suffix}]"


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
