"""Exact tier: the closed forms of stats.py (the t and chi-square distributions, random effects over
seeds, the t interval) against closed forms, published meta-analyses, and their coverage on simulations;
its exact tests (signed-rank, sign test) and Holm's correction against hand enumeration, textbook
examples and Holm's step-down procedure as he stated it."""
import itertools
import math
import random
from statistics import NormalDist

import pytest
import torch

from lab.analysis import stats


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms(p):
    # df = 1 is the Cauchy distribution; df = 2 has t_p = (2p - 1) / sqrt(2 p (1 - p)).
    assert stats.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    assert stats.t_quantile(1 - p, 2) == pytest.approx(-stats.t_quantile(p, 2), rel=1e-9)  # symmetric
    z = NormalDist().inv_cdf(p)  # large df: the first Cornish-Fisher term, t = z + (z^3 + z) / (4 df)
    assert stats.t_quantile(p, 2000) == pytest.approx(z + (z ** 3 + z) / 8000, abs=1e-5)


@pytest.mark.parametrize("df", [3, 4, 5, 8])
def test_t_cdf_matches_numerical_integration_of_the_density(df):
    def pdf(x):
        return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) \
            * (1 + x * x / df) ** (-(df + 1) / 2)
    for t in (0.3, 1.0, 2.5):
        n = 4000  # Simpson's rule on [0, t]: P(T <= t) = 1/2 + integral
        h = t / n
        integral = h / 3 * (pdf(0) + pdf(t) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n)))
        assert stats.t_cdf(t, df) == pytest.approx(0.5 + integral, abs=1e-9)
        assert stats.t_cdf(-t, df) == pytest.approx(0.5 - integral, abs=1e-9)


def test_geometric_mean_known_answer():
    # logs 0, 2, 4: mean 2, sd 2, 2 degrees of freedom.
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


def test_welch_interval_reduces_to_the_known_intervals_and_covers():
    """Two samples of one size and one spread: df = 2 (n - 1), the pooled two-sample t interval. One sample
    without spread: the one-sample t interval of the other (df = n - 1). Unequal sizes and spreads: at least
    95% of the intervals cover the true difference (the degrees of freedom rounded down: conservative;
    4,000 draws, binomial s.e. 0.0034)."""
    x, y = [1.0, 2.0, 4.0, 7.0], [0.0, 3.0, 5.0, 6.0]  # both: sum of squared deviations 21 (x) and 21 (y)
    d, lo, hi = stats.welch_interval(x, y)
    pooled_sd = math.sqrt((21 + 21) / 6)
    half = stats.t_quantile(0.975, 6) * pooled_sd * math.sqrt(1 / 4 + 1 / 4)
    assert d == pytest.approx(0.0) and (lo, hi) == pytest.approx((-half, half))
    d, lo, hi = stats.welch_interval([0.5] * 6, [0.4] * 3 + [0.3] * 3)
    mean, one_lo, one_hi = stats.mean_interval([0.5 - v for v in [0.4] * 3 + [0.3] * 3])
    assert (d, lo, hi) == pytest.approx((mean, one_lo, one_hi))
    assert math.isnan(stats.welch_interval([1.0], [1.0, 2.0])[1])  # one value: no spread to read
    gen = torch.Generator().manual_seed(1)
    hits, sims = 0, 4000
    for _ in range(sims):
        a = (torch.randn(5, generator=gen, dtype=torch.float64) * 1.0 + 2.0).tolist()
        b = (torch.randn(15, generator=gen, dtype=torch.float64) * 3.0).tolist()
        _, lo, hi = stats.welch_interval(a, b)
        hits += lo <= 2.0 <= hi
    assert 0.94 <= hits / sims <= 0.97


def test_verdict_of_an_interval():
    assert stats.verdict(1.2, 3.0) == "above" and stats.verdict(0.2, 0.9) == "below"
    assert stats.verdict(0.8, 1.3) == "covers" and stats.verdict(math.nan, math.nan) == "covers"


def test_helpers():
    assert stats.mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / math.sqrt(3)))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert stats.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert stats.spearman(x, x ** 3) == pytest.approx(1.0)
    assert stats.spearman(x, -x) == pytest.approx(-1.0)


# ---- Seeds: the random-effects check, eqs. (6)-(6'')

def test_chi2_survival_function():
    for x in (0.5, 2.0, 7.3):
        assert stats.chi2_sf(x, 1) == pytest.approx(2 * (1 - NormalDist().cdf(math.sqrt(x))), rel=1e-12)
        assert stats.chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)
    # the 95% critical values of the chi-square tables (df 1-5)
    for df, crit in [(1, 3.841459), (2, 5.991465), (3, 7.814728), (4, 9.487729), (5, 11.070498)]:
        assert stats.chi2_sf(crit, df) == pytest.approx(0.05, abs=2e-7)

    def pdf(x, df):
        return math.exp((df / 2 - 1) * math.log(x) - x / 2 - df / 2 * math.log(2) - math.lgamma(df / 2))
    for df in (3, 4, 7):  # Simpson's rule on [x, 60]
        x, n = 2.5, 20000
        h = (60 - x) / n
        tail = h / 3 * (pdf(x, df) + pdf(60, df) + sum((4 if i % 2 else 2) * pdf(x + i * h, df) for i in range(1, n)))
        assert stats.chi2_sf(x, df) == pytest.approx(tail, abs=1e-9)


def test_random_effects_by_hand():
    # y = (0, 1), se = (1, 1): Q = 0.5 < df, tau^2 = 0, the fixed-effect mean 0.5 with s.e. sqrt(1/2).
    z = NormalDist().inv_cdf(0.975)
    r = stats.random_effects([0.0, 1.0], [1.0, 1.0])
    assert (r["Q"], r["tau2"], r["mean"], r["se"], r["I2"]) == pytest.approx((0.5, 0.0, 0.5, math.sqrt(0.5), 0.0))
    # y = (0, 4), se = (1, 1): Q = 2^2 + 2^2 = 8, c = 2 - 2/2 = 1, tau^2 = 7, w* = 1/8 each,
    # mean 2, s.e. sqrt(1 / (2/8)) = 2, I^2 = 7/8, p = P(chi2_1 >= 8) = erfc(2).
    r = stats.random_effects([0.0, 4.0], [1.0, 1.0])
    assert (r["Q"], r["tau2"], r["mean"], r["se"], r["I2"]) == pytest.approx((8.0, 7.0, 2.0, 2.0, 7 / 8))
    assert (r["lo"], r["hi"]) == pytest.approx((2 - 2 * z, 2 + 2 * z)) and r["p"] == pytest.approx(math.erfc(2.0))
    assert r["df"] == 1 and r["k"] == 2
    assert math.isnan(stats.random_effects([0.0, math.nan], [1.0, 1.0])["mean"])  # a seed without a log-ratio


def test_random_effects_reproduces_the_bcg_meta_analysis():
    # The BCG vaccine trials (Colditz et al. 1994; metafor's dat.bcg: tpos, tneg, cpos, cneg), log risk
    # ratios with var 1/a - 1/(a+b) + 1/c - 1/(c+d). metafor's rma(method = "DL") reports estimate
    # -0.7141, CI [-1.0644, -0.3638], tau^2 0.3088, I^2 92.12%, Q(df = 12) = 152.2330 (its test file
    # tests/testthat/test_misc_metan_vs_rma.uni_with_dat.bcg.r, checked against Stata's metan).
    bcg = [(4, 119, 11, 128), (6, 300, 29, 274), (3, 228, 11, 209), (62, 13536, 248, 12619),
           (33, 5036, 47, 5761), (180, 1361, 372, 1079), (8, 2537, 10, 619), (505, 87886, 499, 87892),
           (29, 7470, 45, 7232), (17, 1699, 65, 1600), (186, 50448, 141, 27197), (5, 2493, 3, 2338),
           (27, 16886, 29, 17825)]
    y = [math.log(a / (a + b) / (c / (c + d))) for a, b, c, d in bcg]
    se = [math.sqrt(1 / a - 1 / (a + b) + 1 / c - 1 / (c + d)) for a, b, c, d in bcg]
    r = stats.random_effects(y, se)
    assert r["mean"] == pytest.approx(-0.7141, abs=1e-4) and r["lo"] == pytest.approx(-1.0644, abs=1e-4)
    assert r["hi"] == pytest.approx(-0.3638, abs=1e-4) and r["tau2"] == pytest.approx(0.3088, abs=1e-4)
    assert r["Q"] == pytest.approx(152.2330, abs=1e-4) and r["I2"] == pytest.approx(0.9212, abs=1e-4)
    assert r["df"] == 12 and r["p"] < 1e-20


# The teacher-expectancy studies (Raudenbush 1984; metafor's dat.raudenbush1985: yi, vi), the
# worked example of Raudenbush (2009), "Analyzing effect sizes: random-effects models", in Cooper,
# Hedges & Valentine (eds.), The Handbook of Research Synthesis and Meta-Analysis, 2nd ed., Table 16.3
# (p. 309), as metafor's tests/testthat/test_analysis_example_raudenbush2009.r checks it.
TEACHER_Y = [0.03, 0.12, -0.14, 1.18, 0.26, -0.06, -0.02, -0.32, 0.27, 0.80, 0.54, 0.18, -0.02, 0.23,
             -0.18, -0.06, 0.30, 0.07, -0.07]
TEACHER_V = [0.0156, 0.0216, 0.0279, 0.1391, 0.1362, 0.0106, 0.0106, 0.0484, 0.0269, 0.0630, 0.0912,
             0.0497, 0.0835, 0.0841, 0.0253, 0.0279, 0.0193, 0.0088, 0.0303]


def test_dersimonian_laird_and_hartung_knapp_reproduce_raudenbush_2009_table_16_3():
    se = [math.sqrt(v) for v in TEACHER_V]
    dl = stats.random_effects(TEACHER_Y, se)  # the DL row, conventional: tau^2 .0259, mu .0893, se .0558
    assert (dl["tau2"], dl["mean"], dl["se"]) == pytest.approx((0.0259, 0.0893, 0.0558), abs=5e-5)
    assert (dl["lo"], dl["hi"]) == pytest.approx((-0.0200, 0.1987), abs=5e-5)
    hk = stats.hartung_knapp(TEACHER_Y, se)  # the DL row, Knapp-Hartung: se .0636, t 1.405, [-.0442, .2229]
    assert (hk["mean"], hk["se"], hk["mean"] / hk["se"]) == pytest.approx((0.0893, 0.0636, 1.405), abs=5e-4)
    assert (hk["lo"], hk["hi"]) == pytest.approx((-0.0442, 0.2229), abs=5e-5)
    assert hk["t_df"] == 18 and hk["tau2"] == dl["tau2"]


# 50 studies of a published meta-analysis (Cisneros et al. 2024, late adaptation, standardised mean
# differences TE with standard errors seTE, as tabulated to 4 decimals), and what R's meta 8.2.1 printed
# for them with metagen(..., method.tau = "DL", prediction = TRUE, method.predict = "HTS") (the
# Higgins-Thompson-Spiegelhalter interval, df.predict = k - 2 = 48) and with method.random.ci = "HK":
# recorded in the public fixture validation/fixtures/r_reference.json of github.com/ShadowCoder1/autometa
# (key cisneros_late, "DL" and "DL_HK"). Computed by R, not by this project.
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


def test_prediction_interval_reproduces_r_meta_on_a_published_meta_analysis():
    assert len(CISNEROS_TE) == len(CISNEROS_SE) == 50
    dl = stats.random_effects(CISNEROS_TE, CISNEROS_SE)  # meta: tau2, TE.random, seTE.random, Q
    assert (dl["tau2"], dl["mean"], dl["se"], dl["Q"]) == pytest.approx(
        (0.2793804883534, -0.516382353913, 0.09044342871575, 179.059081042789), rel=1e-9)
    assert (dl["lo"], dl["hi"], dl["I2"]) == pytest.approx((-0.6936482168342, -0.3391164909918, 0.7263473055115),
                                                           rel=1e-9)
    hk = stats.hartung_knapp(CISNEROS_TE, CISNEROS_SE)  # meta's DL_HK: seTE.random, lower/upper.random
    assert (hk["se"], hk["lo"], hk["hi"]) == pytest.approx((0.09979069195591, -0.7169192573636, -0.3158454504624),
                                                           rel=1e-9)
    published = (-1.594578568019, 0.5618138601935)  # lower.predict, upper.predict
    assert stats.prediction_interval(CISNEROS_TE, CISNEROS_SE) == pytest.approx(published, rel=1e-9)
    # The variants it is not: t with k - 1 degrees of freedom (meta >= 8's default) or the normal quantile
    # (metafor's default) miss the printed interval by far more than its 13 digits.
    scale = math.sqrt(dl["tau2"] + dl["se"] ** 2)
    for q in (stats.t_quantile(0.975, 49), NormalDist().inv_cdf(0.975)):
        assert abs(dl["mean"] - q * scale - published[0]) > 1e-4


def test_hartung_knapp_with_equal_weights_is_the_t_interval_of_the_mean():
    # Equal se and tau^2 > 0: every w*_s is equal, mu is the plain mean and q / sum w* = s^2 / k,
    # so (6') is exactly mean_interval's t interval.
    y = [0.3, -0.2, 0.9, 0.1, 0.5]
    hk = stats.hartung_knapp(y, [0.1] * 5)
    mu, lo, hi = stats.mean_interval(y)
    assert hk["tau2"] > 0 and (hk["mean"], hk["lo"], hk["hi"]) == pytest.approx((mu, lo, hi), rel=1e-9)


def test_prediction_interval_by_hand_and_its_coverage():
    # By hand on the teacher data: mu +- t_{17, .975} sqrt(tau^2 + se(mu)^2) with the DL fit.
    se = [math.sqrt(v) for v in TEACHER_V]
    dl = stats.random_effects(TEACHER_Y, se)
    half = 2.109815577833 * math.sqrt(dl["tau2"] + dl["se"] ** 2)  # t_{17, 0.975} (tables: 2.110)
    assert stats.prediction_interval(TEACHER_Y, se) == pytest.approx((dl["mean"] - half, dl["mean"] + half), abs=1e-9)
    assert all(math.isnan(x) for x in stats.prediction_interval([0.0, 1.0], [1.0, 1.0]))  # k < 3
    # Coverage: k = 30 strata, true effects N(0, tau^2 = 1), se = 0.5; the interval should hold a new
    # stratum's true effect about 95% of the time (the normal interval of the mean alone would not).
    gen = torch.Generator().manual_seed(0)
    hits, trials = 0, 400
    for _ in range(trials):
        theta = torch.randn(31, generator=gen, dtype=torch.float64)
        y = (theta[:30] + 0.5 * torch.randn(30, generator=gen, dtype=torch.float64)).tolist()
        lo, hi = stats.prediction_interval(y, [0.5] * 30)
        hits += lo <= theta[30].item() <= hi
    assert 0.91 <= hits / trials <= 0.99


# ---- Exact tests on paired differences, eq. (9), and Holm's correction, eq. (10)

def holm_rejects(ps, alpha):
    """Holm's procedure as Holm (1979) states it: test the P values in increasing order, the k-th
    (from 1) at alpha / (m - k + 1); reject until the first that is not below its level, then stop."""
    m, rejected = len(ps), set()
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i]), start=1):
        if ps[i] > alpha / (m - k + 1):
            break
        rejected.add(i)
    return rejected


def test_holm_hand_values_and_the_step_down_procedure():
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # 0.01..0.05 times 5..1 = 0.05, 0.08, 0.09, 0.08, 0.05 -> 0.05, 0.08, 0.09, 0.09, 0.09
    assert stats.holm([0.05, 0.04, 0.03, 0.02, 0.01]) == pytest.approx([0.09, 0.09, 0.09, 0.08, 0.05])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0] and stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    with pytest.raises(ValueError, match="1.5"):
        stats.holm([0.1, 1.5])
    # an adjusted P is <= alpha exactly when the step-down procedure rejects that test, at every alpha
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        m = int(torch.randint(1, 7, (1,), generator=gen))
        ps = (torch.rand(m, generator=gen) ** 3).tolist()  # many small P values
        adjusted = stats.holm(ps)
        for alpha in (0.001, 0.01, 0.05, 0.1, 0.3):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == holm_rejects(ps, alpha), (ps, alpha)


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
    assert (r["n"], r["w_plus"], r["p"]) == (9, 40.0, 20 / 512)
    # n = 10, W- = 8 (the 8th smallest |d| negative): the subsets of 1..10 with sum <= 8 number
    # 1 + 1 + 1 + 2 + 2 + 3 + 4 + 5 + 6 = 25 (sum 0, 1, ..., 8): P = 50 / 1024, the tables' critical value
    d = [1, 2, 3, 4, 5, 6, 7, -8, 9, 10]
    assert stats.signed_rank(d) == dict(n=10, w_plus=47.0, p=50 / 1024)
    assert stats.signed_rank([0, 0] + d)["p"] == 50 / 1024  # zeros are dropped
    assert stats.signed_rank([0, 0]) == dict(n=0, w_plus=0, p=1.0)


def test_signed_rank_with_ties_equals_enumeration():
    rng = random.Random(1)
    cases = [[3, -3, 3, 1], [5, 5, -5, -5, 2], [2, 2, 2, 2, -1, 0]]
    cases += [[rng.choice([-1, 1]) * rng.randint(0, 6) for _ in range(rng.randint(1, 11))] for _ in range(40)]
    for d in cases:
        assert stats.signed_rank(d)["p"] == pytest.approx(enumerated_signed_rank(d), abs=1e-15), d


def test_sign_test_closed_forms():
    # 10 against 5: 2 (C(15,0) + ... + C(15,5)) / 2^15 = 2 (1 + 15 + 105 + 455 + 1365 + 3003) / 32768
    assert stats.sign_test(10, 5) == 2 * 4944 / 32768 == stats.sign_test(5, 10)
    assert stats.sign_test(2, 3) == 1.0  # 2 (1 + 5 + 10) / 32 = 1
    assert stats.sign_test(6, 0) == 2 / 64 and stats.sign_test(0, 0) == 1.0
    with pytest.raises(ValueError, match="b=-1"):
        stats.sign_test(-1, 3)
