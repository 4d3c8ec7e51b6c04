"""Exact tier: stats.py calls scipy and statsmodels with the intended options. Each wrapper equals the
library call it names (which interval, which tail, which degrees of freedom) and differs from the
options it does not take; where a wrapper steps around a library defect (statsmodels' untruncated
DerSimonian-Laird tau^2, scipy's nan in the noncentral t's far tail) the step is shown to matter. What
stats.py keeps by hand is checked against independent answers: the prediction interval against R's
meta package, the sign-flip test against scipy's exhaustive permutation test. The intervals' coverage
on simulations checks what a reader relies on: the t interval of a mean and Welch's interval cover
95% of the time."""
import itertools
import math
import random
import warnings

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.proportion import proportion_confint
import torch

from lab.analysis import stats

Z = sps.norm.ppf(0.975)


# ---- The t distribution: means over seeds, eq. (7)

def test_mean_interval_is_scipys_t_interval_with_k_minus_1_degrees_of_freedom():
    xs = [0.3, -0.1, 0.8, 0.25]
    mu, lo, hi = stats.mean_interval(xs)
    ci = sps.ttest_1samp(xs, 0.0).confidence_interval(0.95)
    assert (mu, lo, hi) == pytest.approx((np.mean(xs), ci.low, ci.high), rel=1e-12)
    half = sps.t.ppf(0.975, 3) * np.std(xs, ddof=1) / 2  # by hand: t_{k-1} s / sqrt(k)
    assert (lo, hi) == pytest.approx((mu - half, mu + half), rel=1e-12)
    narrower = Z * np.std(xs, ddof=1) / 2  # the normal quantile, or k degrees of freedom, would be narrower
    assert hi - mu > narrower * 1.5 and hi - mu > sps.t.ppf(0.975, 4) * np.std(xs, ddof=1) / 2 * 1.05
    assert stats.mean_interval(xs, level=0.9)[2] == pytest.approx(mu + sps.t.ppf(0.95, 3) * np.std(xs, ddof=1) / 2)
    assert stats.mean_interval([2.0])[0] == 2.0 and math.isnan(stats.mean_interval([2.0])[1])
    assert stats.mean_interval([0.0] * 4) == (0.0, 0.0, 0.0)  # a collapsed run: no spread, the mean itself


def test_geometric_mean_known_answer():
    # logs 0, 2, 4: mean 2, sd 2, 2 degrees of freedom, t_{2, p} = (2p - 1) / sqrt(2 p (1 - p)).
    gm, lo, hi = stats.geometric_mean([1.0, math.e ** 2, math.e ** 4])
    half = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025) * 2 / math.sqrt(3)
    assert gm == pytest.approx(math.e ** 2)
    assert (lo, hi) == pytest.approx((math.exp(2 - half), math.exp(2 + half)))
    assert all(math.isnan(x) for x in stats.geometric_mean([1.0, -2.0, 3.0]))  # not a positive ratio
    assert math.isnan(stats.geometric_mean([2.0])[1])  # one seed: no interval


def test_mean_interval_covers_95_percent_of_gaussian_means():
    gen = torch.Generator().manual_seed(0)
    hits, sims = 0, 4000
    x = torch.randn(sims, 3, generator=gen, dtype=torch.float64) * 2.0 + 5.0  # 3 seeds each
    for row in x.tolist():
        _, lo, hi = stats.mean_interval(row)
        hits += lo <= 5.0 <= hi
    assert 0.935 <= hits / sims <= 0.965  # binomial s.e. 0.0034


def test_welch_interval_uses_the_fractional_welch_satterthwaite_degrees_of_freedom():
    """statsmodels' CompareMeans with usevar="unequal", the interval of scipy's ttest_ind with
    equal_var=False; its degrees of freedom are Welch-Satterthwaite's, by hand here, not rounded down
    (6.998 would give 6) and not the pooled test's na + nb - 2."""
    x, y = [1.0, 2.0, 4.0, 7.0], [0.0, 3.0, 5.0, 6.0, 9.0]
    d, lo, hi = stats.welch_interval(x, y)
    ci = sps.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert (d, lo, hi) == pytest.approx((np.mean(x) - np.mean(y), ci.low, ci.high), rel=1e-12)
    va, vb = np.var(x, ddof=1) / 4, np.var(y, ddof=1) / 5
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)
    assert df == pytest.approx(6.998, abs=1e-3)
    assert hi - d == pytest.approx(sps.t.ppf(0.975, df) * math.sqrt(va + vb), rel=1e-12)
    for wrong in (6, 7):  # rounded down, and the pooled test's degrees of freedom
        assert abs(hi - d - sps.t.ppf(0.975, wrong) * math.sqrt(va + vb)) > 1e-4


def test_weighted_welch_interval_treats_the_weights_as_reliability_weights():
    """Weights set each value's share of its mean (the token-weighted success of a run's steps), each value
    one draw: the weighted mean's variance is s^2 sum w^2 / (sum w)^2 with s^2 numpy's unbiased
    reliability-weighted variance (np.cov with aweights), and each side has Kish's n_eff - 1 degrees of
    freedom, n_eff = (sum w)^2 / sum w^2, in Welch-Satterthwaite's formula; computed here without
    statsmodels. Weights scaled by any factor give the same interval, equal weights the unweighted one; the
    weights read as frequencies over the values' n - 1 degrees of freedom give a narrower interval."""
    x, wx = [0.5, 0.4, 0.7, 0.6], [100, 300, 90, 20]
    y, wy = [0.3, 0.35, 0.2, 0.4, 0.5, 0.1], [400, 60, 380, 450, 90, 390]
    d, lo, hi = stats.welch_interval(x, y, wx=wx, wy=wy)
    assert d == pytest.approx(np.average(x, weights=wx) - np.average(y, weights=wy), rel=1e-12)
    assert (d, lo, hi) == pytest.approx(stats.welch_interval(x, y, wx=[3 * w for w in wx], wy=wy), rel=1e-12)
    assert stats.welch_interval(x, y, wx=[2] * 4, wy=[5] * 6) == pytest.approx(stats.welch_interval(x, y), rel=1e-12)
    se2, dfs, old = [], [], []
    for v, w in ((x, wx), (y, wy)):
        w = np.array(w, dtype=float)
        se2.append(np.cov(v, aweights=w) * (w ** 2).sum() / w.sum() ** 2)
        dfs.append(w.sum() ** 2 / (w ** 2).sum() - 1)
        m = np.average(v, weights=w)  # the frequency reading: sum w (x - m)^2 / sum w / (n - 1) per value
        old.append(np.sum(w * (np.array(v) - m) ** 2) / w.sum() / (len(v) - 1))
    df = sum(se2) ** 2 / (se2[0] ** 2 / dfs[0] + se2[1] ** 2 / dfs[1])
    assert hi - d == pytest.approx(sps.t.ppf(0.975, df) * math.sqrt(sum(se2)), rel=1e-9)
    assert d - lo == pytest.approx(hi - d, rel=1e-9)
    df_old = sum(old) ** 2 / (old[0] ** 2 / 3 + old[1] ** 2 / 5)
    assert hi - d > 1.05 * sps.t.ppf(0.975, df_old) * math.sqrt(sum(old))  # the frequency reading: too narrow


def test_welch_interval_reduces_to_the_known_intervals_and_covers():
    """Two samples of one size and one spread: df = 2 (n - 1), the pooled two-sample t interval. One sample
    without spread: the one-sample t interval of the other (df = n - 1). Unequal sizes and spreads: 95%
    of the intervals cover the true difference (4,000 draws, binomial s.e. 0.0034)."""
    x, y = [1.0, 2.0, 4.0, 7.0], [0.0, 3.0, 5.0, 6.0]  # both: sum of squared deviations 21 (x) and 21 (y)
    d, lo, hi = stats.welch_interval(x, y)
    pooled_sd = math.sqrt((21 + 21) / 6)
    half = sps.t.ppf(0.975, 6) * pooled_sd * math.sqrt(1 / 4 + 1 / 4)
    assert d == pytest.approx(0.0) and (lo, hi) == pytest.approx((-half, half))
    d, lo, hi = stats.welch_interval([0.5] * 6, [0.4] * 3 + [0.3] * 3)
    mean, one_lo, one_hi = stats.mean_interval([0.5 - v for v in [0.4] * 3 + [0.3] * 3])
    assert (d, lo, hi) == pytest.approx((mean, one_lo, one_hi))
    assert math.isnan(stats.welch_interval([1.0], [1.0, 2.0])[1])  # one value: no spread to read
    assert math.isnan(stats.welch_interval([1.0, 1.0], [2.0, 2.0])[1])  # no spread on either side
    gen = torch.Generator().manual_seed(1)
    hits, sims = 0, 4000
    for _ in range(sims):
        a = (torch.randn(5, generator=gen, dtype=torch.float64) * 1.0 + 2.0).tolist()
        b = (torch.randn(15, generator=gen, dtype=torch.float64) * 3.0).tolist()
        _, lo, hi = stats.welch_interval(a, b)
        hits += lo <= 2.0 <= hi
    assert 0.935 <= hits / sims <= 0.965


def test_verdict_of_an_interval():
    assert stats.verdict(1.2, 3.0) == "above" and stats.verdict(0.2, 0.9) == "below"
    assert stats.verdict(0.8, 1.3) == "covers" and stats.verdict(math.nan, math.nan) == "covers"


def test_helpers_are_scipys():
    assert stats.mean_se([1.0, 2.0, None, 3.0, math.nan]) == pytest.approx((2.0, 1 / math.sqrt(3)))
    assert math.isnan(stats.mean_se([1.0])[1]) and all(math.isnan(v) for v in stats.mean_se([]))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert stats.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert stats.spearman(x, x ** 3) == pytest.approx(1.0) and stats.spearman(x, -x) == pytest.approx(-1.0)
    a, b = [3.0, 1.0, 1.0, 2.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.pearson(a, b) == pytest.approx(sps.pearsonr(a, b).statistic, rel=1e-12)
    # ties share their mean rank (ranks 4, 1.5, 1.5, 3, 5 against 1..5); broken by order they would not
    assert stats.spearman(a, b) == pytest.approx(sps.spearmanr(a, b).statistic, rel=1e-12)
    assert stats.spearman(a, b) == pytest.approx(np.corrcoef([4, 1.5, 1.5, 3, 5], b)[0, 1], rel=1e-12)
    assert abs(stats.spearman(a, b) - np.corrcoef([4, 1, 2, 3, 5], b)[0, 1]) > 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a constant series: nan, and no warning on the screen
        assert math.isnan(stats.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


# ---- Seeds: the random-effects check, eqs. (6)-(6''), on statsmodels' DerSimonian-Laird fit

# 50 studies of a published meta-analysis (Cisneros et al. 2024, late adaptation, standardised mean
# differences TE with standard errors seTE, as tabulated to 4 decimals); between-study variance well
# above 0 (tau^2 0.28), so the random-effects and fixed-effect fits differ.
CISNEROS_TE = [-0.1941, 0.3245, 0.1704, -1.676, -0.4374, -0.5739, -1.8986, -0.4022, -1.0348, 0.2493, -0.1983,
               -0.06641, -0.374, -0.294, -0.24, -0.8561, -0.1907, 0.0521, -0.5357, -0.1462, -0.492, -0.9365,
               -0.3533, -0.37879, -0.6793, -0.6798, -1.685, -2.374, -0.6544, -0.6479, -0.7915, -1.1575, 0.1466,
               -0.2582, 0.6418, 0.913, -1.067, -0.7166, 0.654, -1.275, -0.6893, -1.3985, -0.624, -0.224, -2.62,
               0.0369, 0.1389, -0.346, 0.0428, -1.7101]
CISNEROS_SE = [0.3212, 0.3285, 0.3443, 0.4801, 0.6418, 0.2478, 0.3839, 0.2566, 0.3336, 0.3175, 0.3094, 0.3179,
               0.137, 0.2596, 0.351, 0.4037, 0.4275, 0.2858, 0.4405, 0.2212, 0.2873, 0.334, 0.3361, 0.3364,
               0.4054, 0.4613, 0.4547, 0.5126, 0.3004, 0.2281, 0.2642, 0.4307, 0.3387, 0.3445, 0.3883, 0.3436,
               0.5392, 0.518, 0.4854, 0.5225, 0.3345, 0.3639, 0.3242, 0.461, 0.399, 0.2928, 0.2711, 0.4633,
               0.3163, 0.3006]


def fit(y, se):
    return combine_effects(np.array(y), np.array(se) ** 2, method_re="dl")


def test_random_effects_is_statsmodels_dersimonian_laird_with_the_normal_interval_and_the_upper_tail():
    f = fit(CISNEROS_TE, CISNEROS_SE)
    r = stats.random_effects(CISNEROS_TE, CISNEROS_SE)
    assert f.tau2 > 0.2 and r["tau2"] == pytest.approx(f.tau2, rel=1e-12)
    want = (f.mean_effect_re, f.sd_eff_w_re, f.q, f.i2)
    assert (r["mean"], r["se"], r["Q"], r["I2"]) == pytest.approx(want, rel=1e-12)
    assert (r["lo"], r["hi"]) == pytest.approx(tuple(f.conf_int(alpha=0.05, use_t=False)[1]), rel=1e-12)
    assert r["hi"] - r["mean"] == pytest.approx(Z * f.sd_eff_w_re, rel=1e-12)  # z, not t_{k-1}
    assert abs(r["hi"] - f.conf_int(alpha=0.05, use_t=True)[1][1]) > 1e-3
    assert r["mean"] != pytest.approx(f.mean_effect_fe, rel=1e-3)  # the random-effects mean, not the fixed one
    assert r["p"] == pytest.approx(sps.chi2.sf(f.q, 49), rel=1e-12) and r["p"] < 1e-10  # Q's upper tail
    r90 = stats.random_effects(CISNEROS_TE, CISNEROS_SE, level=0.9)
    assert (r90["lo"], r90["hi"]) == pytest.approx(tuple(f.conf_int(alpha=0.1, use_t=False)[1]), rel=1e-12)


def test_random_effects_by_hand():
    # y = (0, 4), se = (1, 1): Q = 2^2 + 2^2 = 8, c = 2 - 2/2 = 1, tau^2 = 7, w* = 1/8 each,
    # mean 2, s.e. sqrt(1 / (2/8)) = 2, I^2 = 7/8, p = P(chi2_1 >= 8) = erfc(2).
    r = stats.random_effects([0.0, 4.0], [1.0, 1.0])
    assert (r["Q"], r["tau2"], r["mean"], r["se"], r["I2"]) == pytest.approx((8.0, 7.0, 2.0, 2.0, 7 / 8))
    assert (r["lo"], r["hi"]) == pytest.approx((2 - 2 * Z, 2 + 2 * Z)) and r["p"] == pytest.approx(math.erfc(2.0))
    assert r["df"] == 1 and r["k"] == 2
    assert math.isnan(stats.random_effects([0.0, math.nan], [1.0, 1.0])["mean"])  # a seed without a log-ratio
    one = stats.random_effects([0.3], [0.5])  # one seed: itself, with its own normal interval
    assert (one["mean"], one["lo"], one["tau2"], one["I2"]) == pytest.approx((0.3, 0.3 - 0.5 * Z, 0.0, 0.0))


def test_tau2_is_truncated_at_zero_where_statsmodels_is_not():
    """y = (0, 1), se = (1, 1): Q = 0.5 < df = 1, so DerSimonian and Laird's tau^2 is 0 and the fit is the
    fixed-effect one: mean 0.5, s.e. sqrt(1/2). statsmodels' own random-effects fields carry tau^2 = -0.5
    (weights 1 / (1 - 0.5)) and a standard error of 0.5: the wrapper must not read them."""
    f = fit([0.0, 1.0], [1.0, 1.0])
    assert f.tau2 == pytest.approx(-0.5) and f.sd_eff_w_re == pytest.approx(0.5)
    r = stats.random_effects([0.0, 1.0], [1.0, 1.0])
    assert (r["Q"], r["tau2"], r["mean"], r["se"], r["I2"]) == pytest.approx((0.5, 0.0, 0.5, math.sqrt(0.5), 0.0))
    assert (r["lo"], r["hi"]) == pytest.approx(tuple(f.conf_int(alpha=0.05)[0]), rel=1e-12)  # the fixed-effect one
    hk = stats.hartung_knapp([0.0, 1.0], [1.0, 1.0])
    assert (hk["lo"], hk["hi"]) == pytest.approx(tuple(f.conf_int(alpha=0.05, use_t=True)[2]), rel=1e-12)


def test_hartung_knapp_is_statsmodels_estimated_scale_interval_with_t_k_minus_1():
    f = fit(CISNEROS_TE, CISNEROS_SE)
    hk = stats.hartung_knapp(CISNEROS_TE, CISNEROS_SE)
    assert (hk["lo"], hk["hi"]) == pytest.approx(tuple(f.conf_int(alpha=0.05, use_t=True)[3]), rel=1e-12)
    assert hk["se"] == pytest.approx(f.sd_eff_w_re_hksj, rel=1e-12) and hk["t_df"] == 49
    assert hk["hi"] - hk["mean"] == pytest.approx(sps.t.ppf(0.975, 49) * f.sd_eff_w_re_hksj, rel=1e-12)
    assert abs(hk["hi"] - f.conf_int(alpha=0.05, use_t=False)[3][1]) > 1e-4  # the z quantile: not HK
    assert abs(hk["hi"] - f.conf_int(alpha=0.05, use_t=True)[1][1]) > 1e-4  # t with unit scale: not HK
    assert hk["q"] == pytest.approx((f.sd_eff_w_re_hksj / f.sd_eff_w_re) ** 2, rel=1e-12)
    assert hk["mean"] == stats.random_effects(CISNEROS_TE, CISNEROS_SE)["mean"] and math.isnan(
        stats.hartung_knapp([0.3], [0.5])["lo"])


def test_hartung_knapp_with_equal_weights_is_the_t_interval_of_the_mean():
    # Equal se and tau^2 > 0: every w*_s is equal, mu is the plain mean and q / sum w* = s^2 / k,
    # so (6') is exactly mean_interval's t interval.
    y = [0.3, -0.2, 0.9, 0.1, 0.5]
    hk = stats.hartung_knapp(y, [0.1] * 5)
    mu, lo, hi = stats.mean_interval(y)
    assert hk["tau2"] > 0 and (hk["mean"], hk["lo"], hk["hi"]) == pytest.approx((mu, lo, hi), rel=1e-9)


def test_prediction_interval_reproduces_r_meta_on_a_published_meta_analysis():
    """The prediction interval is computed by hand (statsmodels has none), so it is checked against R:
    what R's meta 8.2.1 printed for the 50 studies with metagen(..., method.tau = "DL", prediction = TRUE,
    method.predict = "HTS") (df.predict = k - 2 = 48), recorded in the public fixture
    validation/fixtures/r_reference.json of github.com/ShadowCoder1/autometa (key cisneros_late, "DL")."""
    published = (-1.594578568019, 0.5618138601935)  # lower.predict, upper.predict
    assert stats.prediction_interval(CISNEROS_TE, CISNEROS_SE) == pytest.approx(published, rel=1e-9)
    # The variants it is not: t with k - 1 degrees of freedom (meta >= 8's default) or the normal quantile
    # (metafor's default) miss the printed interval by far more than its 13 digits.
    dl = stats.random_effects(CISNEROS_TE, CISNEROS_SE)
    scale = math.sqrt(dl["tau2"] + dl["se"] ** 2)
    for q in (sps.t.ppf(0.975, 49), Z):
        assert abs(dl["mean"] - q * scale - published[0]) > 1e-4
    assert all(math.isnan(x) for x in stats.prediction_interval([0.0, 1.0], [1.0, 1.0]))  # k < 3


def test_prediction_interval_covers_a_new_stratum():
    # k = 30 strata, true effects N(0, tau^2 = 1), se = 0.5; the interval should hold a new stratum's true
    # effect about 95% of the time (the normal interval of the mean alone would not).
    gen = torch.Generator().manual_seed(0)
    hits, trials = 0, 400
    for _ in range(trials):
        theta = torch.randn(31, generator=gen, dtype=torch.float64)
        y = (theta[:30] + 0.5 * torch.randn(30, generator=gen, dtype=torch.float64)).tolist()
        lo, hi = stats.prediction_interval(y, [0.5] * 30)
        hits += lo <= theta[30].item() <= hi
    assert 0.91 <= hits / trials <= 0.99


# ---- Planning: the paired t test's power, eq. (8)

def test_power_is_statsmodels_two_sided_t_power_and_finite_where_statsmodels_gives_nan():
    for effect, n in [(0.3, 5), (1.49, 6), (-0.8, 12), (0.0, 4)]:
        want = TTestPower().power(effect_size=effect, nobs=n, alpha=0.05, alternative="two-sided")
        assert stats.paired_t_power(effect, 1.0, n) == pytest.approx(want, rel=1e-9)
        one_sided = TTestPower().power(effect_size=abs(effect), nobs=n, alpha=0.05, alternative="larger")
        assert effect == 0 or abs(stats.paired_t_power(effect, 1.0, n) - one_sided) > 1e-3  # two tails, alpha / 2 each
    assert stats.paired_t_power(2.0, 4.0, 8) == pytest.approx(TTestPower().power(0.5, 8, 0.05), rel=1e-9)  # effect / sd
    # Near power 1 statsmodels reads scipy's nct.cdf far in its lower tail, where scipy returns nan.
    if math.isnan(TTestPower().power(effect_size=2.9, nobs=19, alpha=0.05)):
        assert stats.paired_t_power(2.9, 1.0, 19) == pytest.approx(1.0, abs=1e-12)
    assert stats.seeds_needed(10.0, 1.0) == 3  # power 0.73 at 2 pairs, 0.99 at 3


# ---- Exact tests on paired differences, eq. (9), and Holm's correction, eq. (10)

def test_signflip_p_equals_scipys_exhaustive_permutation_test():
    """signflip_p counts the sign patterns by their sum; scipy lists them all (2^n, exact for n <= 12)."""
    rng = random.Random(0)
    cases = [[3, -1, 4, 1, -5, 9, 2, 6], [0, 0, 5], [7, 7, 7, 7, 7, 7], [1, -1]]
    cases += [[rng.randint(-9, 9) for _ in range(rng.randint(2, 12))] for _ in range(20)]
    for d in cases:
        want = sps.permutation_test((np.array(d, dtype=float),), np.sum, permutation_type="samples",
                                    n_resamples=np.inf, alternative="two-sided").pvalue
        assert stats.signflip_p(d) == pytest.approx(want, rel=1e-9, abs=1e-15), d
    assert stats.signflip_p([]) == 1.0 and stats.signflip_p([10] * 6) == pytest.approx(2 / 64)


def enumerated_signed_rank(d):
    """Two-sided exact P of Wilcoxon's signed-rank statistic by listing the 2^n sign patterns: zeros
    dropped, mid-rank of |x| = #{|y| < |x|} + (#{|y| = |x|} + 1) / 2, W+ = sum of the positive ranks,
    P = share of patterns whose W+ lies at least as far from its null mean T / 2 as the observed one."""
    d = [x for x in d if x != 0]
    a = [abs(x) for x in d]
    ranks = [sum(y < x for y in a) + (sum(y == x for y in a) + 1) / 2 for x in a]
    half = sum(ranks) / 2
    obs = abs(sum(r for r, x in zip(ranks, d) if x > 0) - half)
    pats = list(itertools.product((0, 1), repeat=len(d)))
    return sum(abs(sum(r for r, s in zip(ranks, signs) if s) - half) >= obs - 1e-9 for signs in pats) / len(pats)


def test_signed_rank_textbook_examples():
    # Hollander & Wolfe's depression scores (R's ?wilcox.test: paired, V = 40, two-sided p = 0.03906):
    # the negative differences are the 2nd and 3rd smallest |d|, so W- = 5, W+ = 45 - 5 = 40, and the
    # subsets of ranks 1..9 with sum <= 5 are {}, 1, 2, 3, 4, 5, 12, 13, 14, 23: P = 2 x 10 / 512.
    x = [1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30]
    y = [0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29]
    r = stats.signed_rank([a - b for a, b in zip(x, y)])
    assert (r["n"], r["w_plus"]) == (9, 40.0) and r["p"] == pytest.approx(20 / 512, rel=1e-12)
    # n = 10, W- = 8 (the 8th smallest |d| negative): the subsets of 1..10 with sum <= 8 number
    # 1 + 1 + 1 + 2 + 2 + 3 + 4 + 5 + 6 = 25 (sum 0, 1, ..., 8): P = 50 / 1024, the tables' critical value
    d = [1, 2, 3, 4, 5, 6, 7, -8, 9, 10]
    assert stats.signed_rank(d) == dict(n=10, w_plus=47.0, p=pytest.approx(50 / 1024, rel=1e-12))
    assert stats.signed_rank([0, 0] + d)["p"] == pytest.approx(50 / 1024, rel=1e-12)  # zeros are dropped
    assert stats.signed_rank([0, 0]) == dict(n=0, w_plus=0.0, p=1.0)


def test_signed_rank_with_ties_is_exact_where_scipys_exact_method_is_not():
    """The exhaustive permutation P given the mid-ranks equals enumeration; scipy's method="exact" uses the
    untied distribution and misses it on tied data."""
    rng = random.Random(1)
    cases = [[3, -3, 3, 1], [5, 5, -5, -5, 2], [2, 2, 2, 2, -1, 0]]
    cases += [[rng.choice([-1, 1]) * rng.randint(0, 6) for _ in range(rng.randint(2, 11))] for _ in range(40)]
    for d in cases:
        assert stats.signed_rank(d)["p"] == pytest.approx(enumerated_signed_rank(d), abs=1e-12), d
    tied = [-35, -8, 2, 84, 110, -51, 110, 77, -16, 94, 58, -51, 54, 28, 32]  # the stability replication's
    assert stats.signed_rank(tied)["p"] == pytest.approx(enumerated_signed_rank(tied), abs=1e-12)
    assert abs(sps.wilcoxon(tied, method="exact").pvalue - stats.signed_rank(tied)["p"]) > 1e-3


def test_sign_test_is_scipys_two_sided_binomial_test():
    # 10 against 5: 2 (C(15,0) + ... + C(15,5)) / 2^15 = 2 (1 + 15 + 105 + 455 + 1365 + 3003) / 32768
    assert stats.sign_test(10, 5) == pytest.approx(2 * 4944 / 32768, rel=1e-12) and stats.sign_test(5, 10) == \
        stats.sign_test(10, 5)
    assert stats.sign_test(10, 5) == sps.binomtest(10, 15, 0.5, alternative="two-sided").pvalue
    assert abs(stats.sign_test(10, 5) - sps.binomtest(10, 15, 0.5, alternative="greater").pvalue) > 0.1  # one tail
    assert stats.sign_test(2, 3) == 1.0 and stats.sign_test(6, 0) == pytest.approx(2 / 64)
    assert stats.sign_test(2, 0) == pytest.approx(0.5) and stats.sign_test(0, 0) == 1.0
    with pytest.raises(ValueError, match="b=-1"):
        stats.sign_test(-1, 3)


def holm_rejects(ps, alpha):
    """Holm's procedure as Holm (1979) states it: test the P values in increasing order, the k-th
    (from 1) at alpha / (m - k + 1); reject until the first that is not below its level, then stop."""
    m, rejected = len(ps), set()
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i]), start=1):
        if ps[i] > alpha / (m - k + 1):
            break
        rejected.add(i)
    return rejected


def test_holm_is_statsmodels_holm_and_holms_step_down_procedure():
    ps = [0.01, 0.04, 0.03, 0.005]
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert stats.holm(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm(ps) == pytest.approx(list(multipletests(ps, method="holm")[1]), rel=1e-12)
    assert stats.holm(ps) != pytest.approx(list(multipletests(ps, method="holm-sidak")[1]), rel=1e-6)
    assert stats.holm([0.05, 0.04, 0.03, 0.02, 0.01]) == pytest.approx([0.09, 0.09, 0.09, 0.08, 0.05])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0] and stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    with pytest.raises(ValueError, match="1.5"):
        stats.holm([0.1, 1.5])
    # an adjusted P is <= alpha exactly when the step-down procedure rejects that test, at every alpha
    # (30 draws: each multipletests call runs a full garbage collection, 0.1 s beside torch)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        m = int(torch.randint(1, 7, (1,), generator=gen))
        ps = (torch.rand(m, generator=gen) ** 3).tolist()  # many small P values
        adjusted = stats.holm(ps)
        for alpha in (0.001, 0.01, 0.05, 0.1, 0.3):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == holm_rejects(ps, alpha), (ps, alpha)


# ---- Success rates

def test_wilson_is_statsmodels_wilson_interval():
    for k, n in [(0, 12), (3, 10), (12, 12), (7, 24)]:
        p, lo, hi = stats.wilson(k, n)
        assert (p, lo, hi) == pytest.approx((k / n, *proportion_confint(k, n, alpha=0.05, method="wilson")), rel=1e-12)
        assert stats.wilson(k, n, level=0.9)[1:] == pytest.approx(proportion_confint(k, n, alpha=0.1, method="wilson"))
    assert abs(stats.wilson(3, 10)[1] - proportion_confint(3, 10, method="normal")[0]) > 0.01  # not Wald's
    with pytest.raises(ValueError, match="k=9, n=8"):
        stats.wilson(9, 8)
