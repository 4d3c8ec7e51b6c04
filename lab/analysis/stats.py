"""Closed forms over seeds: random effects, the t distribution, the power of a paired test, exact
tests of paired differences and Holm's correction.

``resampling.py`` puts an interval on one comparison by resampling the prompts of each seed. The
questions about seeds themselves (do they agree, where would a new one land, what does a mean over
a handful of them say, how many are needed to resolve a difference) have few units to resample and
are answered here with closed forms: the normal, chi-square and t distributions. The equations
continue the numbering of ``resampling.py`` (eqs. (1)-(5) there).

Seeds: a random-effects check
-----------------------------
Each seed's log-ratio y_s with its bootstrap standard error se_s (``resampling.log_ratio_se``) enters
a DerSimonian-Laird random-effects model (DerSimonian & Laird 1986), with weights w_s = 1 / se_s^2:

    Q = sum_s w_s (y_s - y_w)^2,   y_w = sum_s w_s y_s / sum_s w_s       (Cochran's Q, df k - 1)
    tau^2 = max(0, (Q - (k - 1)) / (sum w - sum w^2 / sum w))          (between-seed variance)
    mu = sum w*_s y_s / sum w*_s,  w*_s = 1 / (se_s^2 + tau^2),  mu +- z / sqrt(sum w*_s)     (6)

and I^2 = max(0, (Q - (k - 1)) / Q), the share of the spread that is between seeds. Q's p-value
is the chi-square survival function with k - 1 degrees of freedom (``chi2_sf``, closed form for
integer df).

With few seeds the normal interval (6) is too narrow: it treats tau^2 and the weights as known.
The Hartung-Knapp(-Sidik-Jonkman) interval keeps mu and w*_s but estimates the variance of mu from
the spread of the seeds themselves, with a t quantile (Hartung & Knapp 2001; Sidik & Jonkman 2002):

    q = sum_s w*_s (y_s - mu)^2 / (k - 1),   mu +- t_{k-1} sqrt(q / sum w*_s)                 (6')

and a new seed's (a new checkpoint's) log-ratio is predicted, not estimated, by the interval of
Higgins, Thompson & Spiegelhalter (2009), which adds tau^2 to the mean's variance:

    mu +- t_{k-2} sqrt(tau^2 + 1 / sum w*_s)                                                 (6'')

The t distribution: paired differences over seeds
-------------------------------------------------
``t_cdf`` and ``t_quantile`` are exact for integer degrees of freedom (Abramowitz & Stegun
26.7.3-4). A difference measured once per seed (k paired seeds) gets the t interval of its mean,

    xbar +- t_{k-1} s / sqrt(k),   s^2 = sum_s (x_s - xbar)^2 / (k - 1)                      (7)

(``mean_interval``), and ``verdict`` says on which side of a null value such an interval (or any
set) lies; ``geometric_mean`` is exp of (7) on the logs of positive ratios, for studies whose unit is
the run itself.

Planning: how many seeds
------------------------
The two-sided paired t test at level alpha rejects when |T'| > c = t_{n-1, 1 - alpha/2}; with
normal differences of mean ``effect`` and standard deviation ``sd``, T' is noncentral t,
T' = (Z + delta) / S with delta = effect sqrt(n) / sd and S = sqrt(chi2_{n-1} / (n - 1)), so

    power = E_S[1 - Phi(c S - delta) + Phi(-c S - delta)]                                    (8)

integrated over the density of S (``paired_t_power``); ``seeds_needed`` is the fewest n whose (8)
reaches the wanted power (it sizes the GPU preset's seeds).

Exact tests on paired differences, and a correction for several of them
-----------------------------------------------------------------------
With few seeds and whole-step differences, the tests that need no distribution are exact: under the
null each paired difference d_s is as likely to be +|d_s| as -|d_s|, so

    P = #{signs e in {-1, +1}^n : |sum_s e_s x_s| >= |sum_s sign(d_s) x_s|} / 2^n             (9)

counted exactly by convolving the n two-point distributions (``signflip_p``). With x_s = |d_s| it is
the sign-flip (permutation) test of the mean; with x_s = the rank of |d_s| among the non-zero
differences (tied |d_s| share their mean rank), Wilcoxon's signed-rank test, exact given the ties
(``signed_rank``). The sign test, which counts only the signs, is the binomial test of McNemar's
form (``sign_test``): P = min(1, 2 P(Bin(b + c, 1/2) <= min(b, c))).

When m tests answer one question, Holm's step-down correction (Holm 1979) keeps the chance of any
false rejection at alpha: with the P values in increasing order p_(1) <= ... <= p_(m),

    adjusted p_(k) = min(1, max_{j <= k} (m - j + 1) p_(j))                                   (10)

and a test rejects at alpha exactly when its adjusted P is <= alpha (``holm``).

``wilson`` is the score interval of a success rate. Small helpers used by the benchmarks sit at the
end: mean and standard error, Pearson and Spearman correlations.
"""
import math
from statistics import NormalDist

import torch


# =====================================================================================
# The normal quantile
# =====================================================================================

def z_quantile(p):
    """The p-quantile of the standard normal distribution."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return NormalDist().inv_cdf(p)


# =====================================================================================
# Seeds: the random-effects check, eqs. (6)-(6'')
# =====================================================================================

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
# The t distribution: paired differences over seeds, eq. (7)
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


def welch_interval(xs, ys, level=0.95):
    """(mean(xs) - mean(ys), lo, hi): Welch's t interval for a difference of two independent means, with
    the Welch-Satterthwaite degrees of freedom (va + vb)^2 / (va^2 / (na - 1) + vb^2 / (nb - 1)), va = sd_a^2 / na,
    rounded down to a whole number (``t_quantile`` takes integers; fewer degrees of freedom, a wider and so
    conservative interval); nan bounds with fewer than 2 values on a side, or with no spread on either."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    na, nb = len(xs), len(ys)
    if na < 1 or nb < 1:
        return math.nan, math.nan, math.nan
    d = sum(xs) / na - sum(ys) / nb
    if na < 2 or nb < 2:
        return d, math.nan, math.nan
    va = sum((x - sum(xs) / na) ** 2 for x in xs) / (na - 1) / na  # the squared standard error of each mean
    vb = sum((y - sum(ys) / nb) ** 2 for y in ys) / (nb - 1) / nb
    if va + vb == 0:
        return d, math.nan, math.nan
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    half = t_quantile((1 + level) / 2, max(1, math.floor(df + 1e-9))) * math.sqrt(va + vb)  # 1e-9: rounding
    return d, d - half, d + half


def verdict(lo, hi, null=1.0):
    """'above' / 'below' when the set (lo, hi) lies entirely on one side of ``null``, else 'covers'."""
    return "above" if lo > null else "below" if hi < null else "covers"


def geometric_mean(xs, level=0.95):
    """(geometric mean, lo, hi) of positive ratios over k runs: exp of the t interval of their logs
    (mean_interval); nan when any value is not a positive number. The sweeps pool seeds as strata
    instead (eq. (5)); this serves studies whose unit is the run itself."""
    xs = [float(x) for x in xs]
    if not xs or any(not (x > 0) or math.isinf(x) for x in xs):
        return math.nan, math.nan, math.nan
    mu, lo, hi = mean_interval([math.log(x) for x in xs], level)
    return (math.exp(mu), math.exp(lo) if not math.isnan(lo) else math.nan,
            math.exp(hi) if not math.isnan(hi) else math.nan)


# =====================================================================================
# Planning: the power of a paired t test and the seeds it needs, eq. (8)
# =====================================================================================

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


# =====================================================================================
# Exact tests on paired differences, eq. (9), and Holm's correction, eq. (10)
# =====================================================================================

def signflip_p(values):
    """Eq. (9) on whole numbers: the share of the 2^n sign patterns e with |sum e_s |x_s|| >= |sum x_s|
    (x_s carries its own sign). 1.0 for no values; a zero counts in every pattern unchanged."""
    x = [int(round(v)) for v in values]
    if not x:
        return 1.0
    span = sum(abs(v) for v in x)
    counts = torch.zeros(2 * span + 1, dtype=torch.float64)  # counts[span + v]: patterns with sum v
    counts[span] = 1.0
    for v in x:
        if v:
            counts = torch.roll(counts, abs(v)) + torch.roll(counts, -abs(v))  # no wrap: |sum| <= span
        else:
            counts = 2 * counts
    sums = torch.arange(-span, span + 1, dtype=torch.float64)
    return (counts[sums.abs() >= abs(sum(x))].sum() / 2 ** len(x)).item()


def signed_rank(diffs):
    """Wilcoxon's signed-rank test, exact: the zero differences dropped, |d| ranked 1..n with tied
    values sharing their mean rank, and eq. (9) on the signed ranks (doubled, so whole numbers).
    Returns dict(n, w_plus (the sum of the ranks of the positive d), p (two-sided))."""
    d = [float(x) for x in diffs if x != 0]
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    twice = [0] * len(d)  # 2 x the mid-rank of each |d|
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            twice[order[k]] = (i + 1) + (j + 1)  # ranks i+1..j+1 share (i + j + 2) / 2
        i = j + 1
    signed = [r if x > 0 else -r for r, x in zip(twice, d)]
    return dict(n=len(d), w_plus=sum(r for r in signed if r > 0) / 2, p=signflip_p(signed))


def sign_test(b, c):
    """The exact two-sided sign test of b positive against c negative signs (McNemar's exact test when
    b, c are the discordant pairs): min(1, 2 P(Bin(b + c, 1/2) <= min(b, c)))."""
    if b < 0 or c < 0 or int(b) != b or int(c) != c:
        raise ValueError(f"counts must be whole numbers >= 0, got b={b}, c={c}")
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2 ** m)


def holm(pvalues):
    """Eq. (10): Holm's step-down adjusted P values, in the order given."""
    ps = [float(p) for p in pvalues]
    if any(not 0 <= p <= 1 for p in ps):
        raise ValueError(f"P values must lie in [0, 1], got {ps}")
    m, adjusted, running = len(ps), [0.0] * len(ps), 0.0
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - k) * ps[i]))  # (m - j + 1) p_(j), j = k + 1
        adjusted[i] = running
    return adjusted


# =====================================================================================
# Success rates, and small helpers shared by the benchmarks
# =====================================================================================

def wilson(k, n, z=NormalDist().inv_cdf(0.975)):
    """(k / n, lo, hi): the Wilson score interval of a binomial proportion (95% by default)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


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
