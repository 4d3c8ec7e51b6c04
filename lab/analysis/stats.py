"""Statistics over seeds and runs, on scipy and statsmodels: random effects, t intervals, the power of a
paired test, exact tests of paired differences and Holm's correction.

``resampling.py`` puts an interval on one comparison by resampling the prompts of each seed. The
questions about seeds themselves (do they agree, where would a new one land, what does a mean over
a handful of them say, how many are needed to resolve a difference) have few units to resample and
are answered here with the normal, chi-square and t distributions. Each function is a thin wrapper
that fixes the options of a scipy or statsmodels call (which interval, which tail, which degrees of
freedom) and returns the plain numbers the benchmarks print; the library is checked against R by its
maintainers, and tests/test_exact_stats.py checks that the wrappers pass the intended options. Three
things are computed here by hand, each saying why in its docstring: the prediction interval (6''),
the sign-flip test (9) counted over integer sums, and ``verdict``; two wrappers step around a defect
of the library they call (statsmodels' DerSimonian-Laird tau^2 is not truncated at 0; scipy's
noncentral t returns nan far in one tail) and say how. The equations continue the numbering of
``resampling.py`` (eqs. (1)-(5) there).

Seeds: a random-effects check
-----------------------------
Each seed's log-ratio y_s with its bootstrap standard error se_s (``resampling.log_ratio_se``) enters
a DerSimonian-Laird random-effects model (DerSimonian & Laird 1986), with weights w_s = 1 / se_s^2:

    Q = sum_s w_s (y_s - y_w)^2,   y_w = sum_s w_s y_s / sum_s w_s       (Cochran's Q, df k - 1)
    tau^2 = max(0, (Q - (k - 1)) / (sum w - sum w^2 / sum w))          (between-seed variance)
    mu = sum w*_s y_s / sum w*_s,  w*_s = 1 / (se_s^2 + tau^2),  mu +- z / sqrt(sum w*_s)     (6)

and I^2 = max(0, (Q - (k - 1)) / Q), the share of the spread that is between seeds; Q's p-value is the
chi-square tail with k - 1 degrees of freedom (``statsmodels.stats.meta_analysis.combine_effects``,
``method_re="dl"``).

With few seeds the normal interval (6) is too narrow: it treats tau^2 and the weights as known.
The Hartung-Knapp(-Sidik-Jonkman) interval keeps mu and w*_s but estimates the variance of mu from
the spread of the seeds themselves, with a t quantile (Hartung & Knapp 2001; Sidik & Jonkman 2002;
the same fit with ``use_t=True``, its estimated-scale interval):

    q = sum_s w*_s (y_s - mu)^2 / (k - 1),   mu +- t_{k-1} sqrt(q / sum w*_s)                 (6')

and a new seed's (a new checkpoint's) log-ratio is predicted, not estimated, by the interval of
Higgins, Thompson & Spiegelhalter (2009), which adds tau^2 to the mean's variance:

    mu +- t_{k-2} sqrt(tau^2 + 1 / sum w*_s)                                                 (6'')

The t distribution: means over seeds
------------------------------------
A difference measured once per seed (k paired seeds) gets the t interval of its mean,

    xbar +- t_{k-1} s / sqrt(k),   s^2 = sum_s (x_s - xbar)^2 / (k - 1)                      (7)

(``mean_interval``, ``scipy.stats.ttest_1samp``); two independent samples get Welch's interval with its
fractional Welch-Satterthwaite degrees of freedom (``welch_interval``, statsmodels' ``CompareMeans``,
which also takes weighted means).
``verdict`` says on which side of a null value such an interval (or any set) lies; ``geometric_mean``
is exp of (7) on the logs of positive ratios, for studies whose unit is the run itself.

Planning: how many seeds
------------------------
The two-sided paired t test at level alpha rejects when |T'| > t_{n-1, 1 - alpha/2}; with normal
differences of mean ``effect`` and standard deviation ``sd``, T' is noncentral t with noncentrality
delta = effect sqrt(n) / sd, so

    power = P(|T'| > t_{n-1, 1 - alpha/2})                                                   (8)

(``paired_t_power``, the noncentral t of ``scipy.stats.nct``); ``seeds_needed`` is the fewest n whose
(8) reaches the wanted power (it sizes the GPU preset's seeds).

Exact tests on paired differences, and a correction for several of them
-----------------------------------------------------------------------
With few seeds and whole-step differences, the tests that need no distribution are exact: under the
null each paired difference d_s is as likely to be +|d_s| as -|d_s|, so

    P = #{signs e in {-1, +1}^n : |sum_s e_s |d_s|| >= |sum_s d_s|} / 2^n                      (9)

the sign-flip (permutation) test of the mean (``signflip_p``). Wilcoxon's signed-rank test is (9) on the
ranks of |d_s| (``signed_rank``, ``scipy.stats.wilcoxon``, exact given ties), and the sign test, which
counts only the signs, is the binomial test of McNemar's form (``sign_test``, ``scipy.stats.binomtest``).

When m tests answer one question, Holm's step-down correction (Holm 1979) keeps the chance of any
false rejection at alpha: with the P values in increasing order p_(1) <= ... <= p_(m),

    adjusted p_(k) = min(1, max_{j <= k} (m - j + 1) p_(j))                                   (10)

and a test rejects at alpha exactly when its adjusted P is <= alpha (``holm``,
``statsmodels.stats.multitest.multipletests``).

``wilson`` is the score interval of a success rate (``statsmodels.stats.proportion.proportion_confint``).
Small helpers used by the benchmarks sit at the end: mean and standard error, Pearson and Spearman
correlations (scipy.stats).
"""
import math
import warnings
from contextlib import contextmanager

import numpy as np
from scipy import stats as sps
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW


# =====================================================================================
# Seeds: the random-effects check, eqs. (6)-(6'')
# =====================================================================================

def dersimonian_laird(y, se, level, use_t):
    """statsmodels' DerSimonian-Laird fit of estimates y with standard errors se (``combine_effects``,
    ``method_re="dl"``) as the random-effects model reads it: dict(fit, mean, se, tau2, ci (the interval
    with unit scale: z, or t_{k-1} with ``use_t``), se_hk and ci_hk (the estimated-scale, Hartung-Knapp
    ones)). statsmodels does not truncate its DL tau^2 at 0 (Q < k - 1 gives a negative between-seed
    variance); DerSimonian and Laird's tau^2 = max(0, ...) makes the random-effects fit the fixed-effect
    one, which the same statsmodels fit holds, so that one is read then, and for one seed (whose tau^2
    statsmodels computes as 0 / 0, up to rounding)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # one seed: statsmodels divides 0 by 0 for tau^2
        fit = combine_effects(np.asarray(y, dtype=float), np.asarray(se, dtype=float) ** 2, method_re="dl",
                              use_t=use_t)
        fe_ci, re_ci, fe_hk, re_hk = fit.conf_int(alpha=1 - level)  # the order statsmodels returns them in
    if len(y) > 1 and fit.tau2 > 0:
        return dict(fit=fit, mean=fit.mean_effect_re, se=fit.sd_eff_w_re, tau2=fit.tau2, ci=re_ci,
                    se_hk=fit.sd_eff_w_re_hksj, ci_hk=re_hk)
    return dict(fit=fit, mean=fit.mean_effect_fe, se=fit.sd_eff_w_fe, tau2=0.0, ci=fe_ci,
                se_hk=fit.sd_eff_w_fe_hksj, ci_hk=fe_hk)


def random_effects(y, se, level=0.95):
    """Eq. (6), DerSimonian-Laird: per-stratum estimates y (k,) with standard errors se (k,) ->
    dict(mean, lo, hi (the normal interval), se, tau2, Q, df, p (Q's chi-square p-value), I2, k). nan
    without k >= 1 finite pairs with se > 0."""
    y, se = [float(v) for v in y], [float(v) for v in se]
    k = len(y)
    if k == 0 or any(not math.isfinite(v) for v in y + se) or any(v <= 0 for v in se):
        return dict(mean=math.nan, lo=math.nan, hi=math.nan, se=math.nan, tau2=math.nan, Q=math.nan,
                    df=max(k - 1, 0), p=math.nan, I2=math.nan, k=k)
    dl = dersimonian_laird(y, se, level, use_t=False)
    fit, Q = dl["fit"], float(dl["fit"].q) if k > 1 else 0.0
    return dict(mean=float(dl["mean"]), lo=float(dl["ci"][0]), hi=float(dl["ci"][1]), se=float(dl["se"]),
                tau2=float(dl["tau2"]), Q=Q, df=k - 1, p=float(fit.test_homogeneity().pvalue) if k > 1 else math.nan,
                I2=max(0.0, float(fit.i2)) if k > 1 and Q > 0 else 0.0, k=k)


def hartung_knapp(y, se, level=0.95):
    """Eq. (6'): the DerSimonian-Laird fit of ``random_effects`` with the Hartung-Knapp interval (the
    fit's estimated-scale interval with t_{k-1}, ``use_t=True``): its dict with lo, hi and se replaced
    (se = sqrt(q / sum w*_s)), and q and the t degrees of freedom (k - 1) added as ``q`` and ``t_df``.
    nan interval for k < 2."""
    r = random_effects(y, se, level)
    k = r["k"]
    if k < 2 or math.isnan(r["mean"]):
        return dict(r, lo=math.nan, hi=math.nan, se=math.nan, q=math.nan, t_df=max(k - 1, 0))
    dl = dersimonian_laird(y, se, level, use_t=True)
    return dict(r, lo=float(dl["ci_hk"][0]), hi=float(dl["ci_hk"][1]), se=float(dl["se_hk"]),
                q=float((dl["se_hk"] / dl["se"]) ** 2), t_df=k - 1)


def prediction_interval(y, se, level=0.95):
    """Eq. (6''): (lo, hi), where a new stratum's true effect is expected to lie under the
    DerSimonian-Laird fit, mu +- t_{k-2} sqrt(tau^2 + 1 / sum w*_s) (Higgins, Thompson &
    Spiegelhalter 2009); (nan, nan) for k < 3. By hand on the library's fit: statsmodels' meta-analysis
    gives the mean's intervals but no prediction interval, and no other well-kept Python library does."""
    r = random_effects(y, se, level)
    if r["k"] < 3 or math.isnan(r["mean"]):
        return math.nan, math.nan
    half = sps.t.ppf((1 + level) / 2, r["k"] - 2) * math.sqrt(r["tau2"] + r["se"] ** 2)  # r["se"]^2 = 1/sum w*
    return r["mean"] - half, r["mean"] + half


# =====================================================================================
# The t distribution: means over seeds, eq. (7)
# =====================================================================================

@contextmanager
def quiet_constant():
    """scipy's warning about data with no spread, silenced: a collapsed run's success can be 0 at every
    step, and its interval is then exactly its mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred in moment calculation")
        yield


def mean_interval(xs, level=0.95):
    """(mean, lo, hi): the t interval of a mean over k values (k - 1 degrees of freedom,
    ``scipy.stats.ttest_1samp``); nan bounds for fewer than 2 values or a nan among them."""
    xs = [float(x) for x in xs]
    k = len(xs)
    if k < 2 or any(math.isnan(x) for x in xs):
        return (xs[0] if k == 1 else math.nan), math.nan, math.nan
    with quiet_constant():
        ci = sps.ttest_1samp(xs, 0.0).confidence_interval(level)
    return float(np.mean(xs)), float(ci.low), float(ci.high)


def welch_interval(xs, ys, level=0.95, wx=None, wy=None):
    """(mean(xs) - mean(ys), lo, hi): Welch's t interval for a difference of two independent means, with
    the (fractional) Welch-Satterthwaite degrees of freedom (statsmodels' ``CompareMeans`` of two
    ``DescrStatsW``, ``usevar="unequal"``). Weights wx, wy (default equal) make each mean a weighted one
    (a run's steps weighted by their tokens): reliability weights, each value one draw whose weight sets
    its share of the mean, so the mean's variance is s^2 sum w^2 / (sum w)^2 with s^2 the unbiased
    reliability-weighted variance sum w (x - xbar_w)^2 / (sum w - sum w^2 / sum w) (numpy's ``cov`` with
    ``aweights``). statsmodels counts weights as frequencies, so each side's are rescaled to sum to Kish's
    effective number of values n_eff = (sum w)^2 / sum w^2, which gives exactly that variance, and n_eff - 1
    degrees of freedom to each side in Welch-Satterthwaite's formula; equal weights give the unweighted
    interval. nan bounds with fewer than 2 values on a side, or with no spread on either."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if not xs or not ys:
        return math.nan, math.nan, math.nan
    a, b = (DescrStatsW(np.array(v), weights=w * w.sum() / (w ** 2).sum())  # sum: n_eff
            for v, w in ((xs, np.ones(len(xs)) if wx is None else np.asarray(wx, dtype=float)),
                         (ys, np.ones(len(ys)) if wy is None else np.asarray(wy, dtype=float))))
    d = float(a.mean - b.mean)
    if len(xs) < 2 or len(ys) < 2 or (np.var(xs) == 0 and np.var(ys) == 0):
        return d, math.nan, math.nan
    lo, hi = CompareMeans(a, b).tconfint_diff(alpha=1 - level, usevar="unequal")
    return d, float(lo), float(hi)


def verdict(lo, hi, null=1.0):
    """'above' / 'below' when the set (lo, hi) lies entirely on one side of ``null``, else 'covers'. By
    hand: it reads a set that this project computes (a t interval, a test-inversion set), not a test."""
    return "above" if lo > null else "below" if hi < null else "covers"


def geometric_mean(xs, level=0.95):
    """(geometric mean, lo, hi) of positive ratios over k runs: exp of the t interval of their logs
    (mean_interval); nan when any value is not a positive number. The sweeps pool seeds as strata
    instead (eq. (5)); this serves studies whose unit is the run itself."""
    xs = [float(x) for x in xs]
    if not xs or any(not (x > 0) or math.isinf(x) for x in xs):
        return math.nan, math.nan, math.nan
    mu, lo, hi = mean_interval(np.log(xs), level)
    return math.exp(mu), math.exp(lo), math.exp(hi)  # exp(nan) = nan: one run, no interval


# =====================================================================================
# Planning: the power of a paired t test and the seeds it needs, eq. (8)
# =====================================================================================

def paired_t_power(effect, sd, n, alpha=0.05):
    """Eq. (8): power of the two-sided paired t test (n pairs, level alpha) when the paired differences
    are normal with mean ``effect`` and standard deviation ``sd``: T' is noncentral t with n - 1 degrees
    of freedom and noncentrality delta = effect sqrt(n) / sd, and the power is P(T' > c) + P(T' < -c),
    c = t_{n-1, 1 - alpha/2} (``scipy.stats.nct``). statsmodels' ``TTestPower`` sums the same two tails,
    but reads the far one through ``scipy.special.nctdtr``, which in scipy 1.17 returns nan there (a
    known scipy defect) and makes the whole power nan once it nears 1; so the far tail is read here as
    P(T'(-delta) > c), the same number by symmetry."""
    if n < 2 or int(n) != n:
        raise ValueError(f"n must be an integer >= 2, got {n}")
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    c, delta = sps.t.ppf(1 - alpha / 2, n - 1), effect * math.sqrt(n) / sd
    return float(sps.nct.sf(c, n - 1, delta) + sps.nct.sf(c, n - 1, -delta))  # P(T' > c) + P(T' < -c)


def seeds_needed(effect, sd, alpha=0.05, power=0.8, most=10_000):
    """The fewest pairs n >= 2 whose two-sided paired t test at level alpha has at least ``power``
    against a mean difference ``effect`` with between-pair standard deviation ``sd``
    (``paired_t_power``), each whole n tried in turn: statsmodels' ``TTestPower.solve_power`` searches
    through the same nan-prone tail (at effect / sd = 10 it returns 2 pairs, whose power is 0.73)."""
    if effect == 0:
        raise ValueError("effect must be non-zero: no number of seeds resolves a zero difference")
    n = next((n for n in range(2, most + 1) if paired_t_power(effect, sd, n, alpha) >= power), None)
    if n is None:
        raise ValueError(f"more than {most} pairs needed")
    return n


# =====================================================================================
# Exact tests on paired differences, eq. (9), and Holm's correction, eq. (10)
# =====================================================================================

def signflip_p(values):
    """Eq. (9) on whole numbers: the share of the 2^n sign patterns e with |sum e_s |x_s|| >= |sum x_s|
    (x_s carries its own sign). 1.0 for no values; a zero counts in every pattern unchanged.

    By hand: ``scipy.stats.permutation_test`` (``permutation_type="samples"``, ``n_resamples=np.inf``)
    gives the same exact P by listing all 2^n patterns, 16.7 million statistics for the 24 seeds of the
    stability replication, and its power simulation calls this thousands of times at up to 32 seeds;
    counting the patterns by the value of their sum (convolving the n two-point distributions) is exact
    in n * sum |x_s| steps. tests/test_exact_stability_replication.py checks it against permutation_test."""
    x = [int(round(v)) for v in values]
    if not x:
        return 1.0
    span = sum(abs(v) for v in x)
    counts = np.zeros(2 * span + 1)  # counts[span + v]: patterns with sum v
    counts[span] = 1.0
    for v in x:
        counts = np.roll(counts, abs(v)) + np.roll(counts, -abs(v)) if v else 2 * counts  # no wrap: |sum| <= span
    sums = np.arange(-span, span + 1)
    return float(counts[np.abs(sums) >= abs(sum(x))].sum() / 2 ** len(x))


def signed_rank(diffs):
    """Wilcoxon's signed-rank test, exact given ties: the zero differences dropped, |d| ranked with tied
    values sharing their mean rank, the P of all 2^n sign patterns (``scipy.stats.wilcoxon`` with an
    exhaustive ``PermutationMethod``: its ``method="exact"`` assumes no ties). Returns dict(n, w_plus (the
    sum of the ranks of the positive d), p (two-sided)); P = 1 for fewer than 2 non-zero differences
    (both signs of one are as extreme)."""
    d = [float(x) for x in diffs if x != 0]
    if len(d) < 2:
        return dict(n=len(d), w_plus=float(sum(x > 0 for x in d)), p=1.0)
    ranks = sps.rankdata(np.abs(d))  # mid-ranks for ties
    test = sps.wilcoxon(d, zero_method="wilcox", method=sps.PermutationMethod(n_resamples=np.inf, batch=4096))
    return dict(n=len(d), w_plus=float(ranks[np.asarray(d) > 0].sum()), p=float(test.pvalue))


def sign_test(b, c):
    """The exact two-sided sign test of b positive against c negative signs (McNemar's exact test when
    b, c are the discordant pairs): ``scipy.stats.binomtest(b, b + c, 1/2)``, which for p = 1/2 is
    min(1, 2 P(Bin(b + c, 1/2) <= min(b, c))); 1.0 with no signs."""
    if b < 0 or c < 0 or int(b) != b or int(c) != c:
        raise ValueError(f"counts must be whole numbers >= 0, got b={b}, c={c}")
    return float(sps.binomtest(int(b), int(b + c), 0.5).pvalue) if b + c else 1.0


def holm(pvalues):
    """Eq. (10): Holm's step-down adjusted P values, in the order given
    (``statsmodels.stats.multitest.multipletests``, ``method="holm"``)."""
    ps = [float(p) for p in pvalues]
    if any(not 0 <= p <= 1 for p in ps):
        raise ValueError(f"P values must lie in [0, 1], got {ps}")
    return [float(p) for p in multipletests(ps, method="holm")[1]] if ps else []


# =====================================================================================
# Success rates, and small helpers shared by the benchmarks
# =====================================================================================

def wilson(k, n, level=0.95):
    """(k / n, lo, hi): the Wilson score interval of a binomial proportion
    (``statsmodels.stats.proportion.proportion_confint``, ``method="wilson"``)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    lo, hi = proportion_confint(k, n, alpha=1 - level, method="wilson")
    return k / n, float(lo), float(hi)


def mean_se(xs):
    """(mean, standard error of the mean) of the values present (None and nan are left out); the
    s.e. (``scipy.stats.sem``) is nan for fewer than 2 values, both are nan for none."""
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return float(np.mean(xs)), float(sps.sem(xs)) if len(xs) > 1 else math.nan


def correlation(test, x, y):
    """``test(x, y).statistic`` for 1-D tensors, arrays or lists; nan (without scipy's warning) when
    either is constant, where no correlation is defined."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.ConstantInputWarning)
        return float(test(np.asarray(x, dtype=float), np.asarray(y, dtype=float)).statistic)


def pearson(x, y):
    """Pearson correlation (``scipy.stats.pearsonr``); nan when either is constant."""
    return correlation(sps.pearsonr, x, y)


def spearman(x, y):
    """Spearman rank correlation (``scipy.stats.spearmanr``, tied values at their mean rank)."""
    return correlation(sps.spearmanr, x, y)
