"""Exact tier: the intervals of resampling.py (the bootstrap over prompts, the sets for ratios, seeds as
strata) against closed forms, scans of their rules, and their coverage on simulations."""
import math

import pytest
import torch

from lab.analysis import resampling


def test_bootstrap_weights_are_resamples():
    w = resampling.bootstrap_weights(7, replicates=500, seed=3)
    assert w.shape == (500, 7)
    assert torch.allclose(w.sum(1), torch.ones(500, dtype=torch.float64))
    assert torch.equal(w * 7, (w * 7).round())  # counts / U
    assert abs(w.mean().item() - 1 / 7) < 1e-12 and 0.1 < (w == 0).double().mean() < 0.5  # (6/7)^7 = 0.34
    with pytest.raises(ValueError, match="at least 2 units"):
        resampling.bootstrap_weights(1)


def test_bootstrap_interval_of_a_mean_covers_about_95_percent():
    gen = torch.Generator().manual_seed(1)
    sims, U, hits = 300, 40, 0
    for _ in range(sims):
        x = torch.randn(U, generator=gen, dtype=torch.float64)
        w = resampling.bootstrap_weights(U, 1000, seed=int(torch.randint(1 << 30, (1,), generator=gen)))
        lo, hi = resampling.interval(w @ x)
        hits += lo <= 0.0 <= hi
    assert 0.89 <= hits / sims <= 0.99  # percentile bootstrap at U = 40 runs a little short of 0.95


def test_printing_inside_the_range():
    assert resampling.covers_zero(-0.1, 0.5) and not resampling.covers_zero(0.2, 0.5) and resampling.covers_zero(math.nan, 1.0)
    assert resampling.fmt(math.nan) == "unresolved"
    assert resampling.fmt(1.08, 0.93, 1.2, low=-1, high=1) == "1.00* [0.93, 1.00*]"  # each clipped number marked
    assert resampling.fmt(0.3, -2.71, 1.2, low=0.0) == "0.30 [0.00*, 1.20]"
    assert resampling.fmt(1.0, 0.9, 1.0, moved=True) == "1.00* [0.90, 1.00]"  # clipped before it was stored
    assert resampling.fmt(0.5, 0.4, 0.6) == "0.50 [0.40, 0.60]"
    assert resampling.fmt(2.0, digits=1, suffix="x") == "2.0x"


# ---- Ratios near zero: the bootstrap's inversion of the test, eq. (4')

def test_replicate_verdicts_with_the_monte_carlo_error_in_view():
    b = torch.ones(400, dtype=torch.float64)

    def shares(k):  # k of 400 replicates with a* > b*, the rest with a* < b*
        return torch.cat([torch.full((k,), 2.0), torch.full((400 - k,), 0.5)]).double()
    # t = 0.975, s.e. = sqrt(0.975 * 0.025 / 400) = 0.0078: the edge band is 0.952-0.998, i.e. 381-399
    assert resampling.replicate_verdict(shares(400), b) == "above"
    assert resampling.replicate_verdict(shares(390), b) == "edge" and resampling.replicate_verdict(shares(381), b) == "edge"
    assert resampling.replicate_verdict(shares(380), b) == "covers" and resampling.replicate_verdict(shares(200), b) == "covers"
    assert resampling.replicate_verdict(shares(0), b) == "below" and resampling.replicate_verdict(shares(15), b) == "edge"


def test_inverted_set_is_the_percentile_interval_when_the_denominator_stays_positive():
    gen = torch.Generator().manual_seed(6)
    a = 5 + torch.randn(2000, generator=gen, dtype=torch.float64)
    b = 2 + 0.3 * torch.randn(2000, generator=gen, dtype=torch.float64)
    assert (b > 0).all()
    assert resampling.inverted_set(a, b) == resampling.interval(a / b)  # the same order statistics
    assert resampling.ratio_set(5.0, 2.0, a, b, low=0.0) == (2.5, *resampling.interval(a / b))


@pytest.mark.parametrize("mean_b", [0.1, 0.6, 1.5])
def test_inverted_set_matches_a_scan_of_its_rule(mean_b):
    # Enumerate rho on a grid: keep rho unless more than 97.5% of a* - rho b* lie on one side of 0.
    gen = torch.Generator().manual_seed(7)
    a = 2 + torch.randn(400, generator=gen, dtype=torch.float64)
    b = mean_b + 0.5 * torch.randn(400, generator=gen, dtype=torch.float64)  # some b* <= 0
    grid = torch.linspace(-40, 40, 80_001, dtype=torch.float64)
    t = a[None, :] - grid[:, None] * b[None, :]  # (rho, R)
    kept = grid[((t < 0).sum(1) <= 0.975 * 400) & ((t > 0).sum(1) <= 0.975 * 400)].tolist()
    lo, hi = resampling.inverted_set(a, b, low=0.0)
    kept = [r for r in kept if r >= 0]
    gaps = [y - x for x, y in zip(kept, kept[1:]) if y - x > 2e-3]
    if hi == math.inf and lo > 0:  # one-sided: a lower bound, kept up to the grid's end
        assert kept[-1] == 40 and kept[0] == pytest.approx(lo, abs=2e-3) and not gaps
    elif hi == math.inf:  # nothing said within [0, inf)
        assert kept[-1] == 40 and (kept[0] == 0 or gaps)
    else:
        assert (kept[0], kept[-1]) == pytest.approx((lo, hi), abs=2e-3) and not gaps


def test_printing_a_set():
    assert resampling.fmt_set(3.3, 1.2, 7.2, low=0.0, suffix="x") == "3.30x [1.20x, 7.20x]"
    assert resampling.fmt_set(3.3, 1.2, math.inf, low=0.0, suffix="x") == "\u2265 1.20x"  # only the lower end
    assert resampling.fmt_set(1.1, 0.0, 2.71, low=0.0) == "\u2264 2.71"  # only the upper end
    assert resampling.fmt_set(1.1, 0.0, math.inf, low=0.0) == "unresolved"
    assert resampling.clip(1.02, 0.9, 1.1, -1.0, 1.0) == (1.0, 0.9, 1.0, True)
    assert resampling.clip(0.5, 0.4, 0.6, -1.0, 1.0) == (0.5, 0.4, 0.6, False)


# ---- Seeds as strata, eq. (5), and each seed's log-ratio

def test_stratified_bootstrap_variance_is_the_sum_of_the_strata():
    # The bootstrap variance of a mean of U values is exactly s^2 / U with s^2 = (1/U) sum (x - xbar)^2
    # (plug-in); independent draws per stratum add: Var(sum_s mean_s) = sum_s s_s^2 / U_s.
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(U, generator=gen, dtype=torch.float64) * sd for U, sd in ((12, 1.0), (20, 3.0), (8, 0.5))]
    parts = [(x.mean().item(), resampling.bootstrap_weights(len(x), 40_000, seed=10 + i) @ x) for i, x in enumerate(xs)]
    point, reps = resampling.stratified(parts)
    assert point == pytest.approx(sum(x.mean().item() for x in xs))
    exact = sum(((x - x.mean()) ** 2).mean().item() / len(x) for x in xs)
    assert reps.var().item() == pytest.approx(exact, rel=0.03)  # 40,000 draws: s.e. of a variance ~0.7%


def test_log_ratio_se():
    a = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    b = torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)
    assert resampling.log_ratio_se(a, b) == pytest.approx(torch.tensor([2.0, 3.0, 2.0]).log().std().item())
    assert math.isnan(resampling.log_ratio_se(a, -b)) and math.isnan(resampling.log_ratio_se(a * math.inf, b))
    a40, b40 = torch.cat([a.repeat(13), torch.tensor([-1.0])]), torch.cat([b.repeat(13), torch.tensor([1.0])])
    assert resampling.log_ratio_se(a40, b40) == pytest.approx(torch.tensor([2.0, 3.0, 2.0]).repeat(13).log().std().item())
    assert math.isnan(resampling.log_ratio_se(a40, b40, share=0.99))  # 39 of 40 positive: 97.5%
