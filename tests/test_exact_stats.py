"""Exact tier: the intervals of stats.py against closed forms, and their coverage on simulations."""
import math
from statistics import NormalDist

import pytest
import torch

import stats


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


def test_bootstrap_weights_are_resamples():
    w = stats.bootstrap_weights(7, replicates=500, seed=3)
    assert w.shape == (500, 7)
    assert torch.allclose(w.sum(1), torch.ones(500, dtype=torch.float64))
    assert torch.equal(w * 7, (w * 7).round())  # counts / U
    assert abs(w.mean().item() - 1 / 7) < 1e-12 and 0.1 < (w == 0).double().mean() < 0.5  # (6/7)^7 = 0.34
    with pytest.raises(ValueError, match="at least 2 units"):
        stats.bootstrap_weights(1)


def test_unresolved_ratio_and_printing_inside_the_range():
    assert all(math.isnan(x) for x in stats.ratio(3.0, torch.ones(10), -0.1, 0.5))  # den covers 0
    assert stats.ratio(3.0, torch.arange(100.0), 0.2, 0.5)[0] == 3.0
    assert stats.fmt(math.nan) == "unresolved"
    assert stats.fmt(1.08, 0.93, 1.2, low=-1, high=1) == "1.00* [0.93, 1.00]"
    assert stats.fmt(0.5, 0.4, 0.6) == "0.50 [0.40, 0.60]"
    assert stats.fmt(2.0, digits=1, suffix="x") == "2.0x"


def test_mean_interval_covers_95_percent_of_gaussian_means():
    gen = torch.Generator().manual_seed(0)
    hits, sims = 0, 4000
    x = torch.randn(sims, 3, generator=gen, dtype=torch.float64) * 2.0 + 5.0  # 3 seeds each
    for row in x.tolist():
        _, lo, hi = stats.mean_interval(row)
        hits += lo <= 5.0 <= hi
    assert 0.935 <= hits / sims <= 0.965  # binomial s.e. 0.0034


def test_bootstrap_interval_of_a_mean_covers_about_95_percent():
    gen = torch.Generator().manual_seed(1)
    sims, U, hits = 300, 40, 0
    for _ in range(sims):
        x = torch.randn(U, generator=gen, dtype=torch.float64)
        w = stats.bootstrap_weights(U, 1000, seed=int(torch.randint(1 << 30, (1,), generator=gen)))
        lo, hi = stats.interval(w @ x)
        hits += lo <= 0.0 <= hi
    assert 0.89 <= hits / sims <= 0.99  # percentile bootstrap at U = 40 runs a little short of 0.95


def test_helpers():
    assert stats.mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / math.sqrt(3)))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert stats.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert stats.spearman(x, x ** 3) == pytest.approx(1.0)
    assert stats.spearman(x, -x) == pytest.approx(-1.0)
