"""Exact tier: the scale-free metrics of scale_free.py against hand-computed cases and known laws."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scale_free


def test_hand_computed_case():
    # Three samples (3,1), (1,1), (2,1) of one unit; reference r = (1, 0).
    # m = (2, 1); V = (1 + 1 + 0) / 2 = 1; ||E g||^2 ~ ||m||^2 - V / K = 5 - 1/3 = 14/3;
    # E||g||^2 ~ V + 14/3 = 17/3; <m, r> = 2.
    out = scale_free.metrics_from_samples([[3.0, 1.0], [1.0, 1.0], [2.0, 1.0]], [1.0, 0.0], units=1)
    assert out["alpha"] == pytest.approx(2.0)
    assert out["cosine"] == pytest.approx(2 / math.sqrt(14 / 3))
    assert out["nvar"] == pytest.approx(3 / 14)
    assert out["rmse"] == pytest.approx(1 - 4 / (17 / 3))  # 5/17
    assert out["raw_variance"] == pytest.approx(1.0)
    assert out["raw_mse"] == pytest.approx((5 + 1 + 2) / 3)  # mean ||g_k - r||^2, computed directly


def test_units_pool_means_and_variances():
    # Two units with different means (two prompts): E g = mean of the unit means,
    # tr Var = mean of the unit variances, ||E g||^2 debiased by sum V_u / (U^2 K_u).
    a = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # m = (2, 0), V = 2
    b = torch.tensor([[0.0, 1.0], [0.0, 3.0]])  # m = (0, 2), V = 2
    units = [scale_free.unit_summary(x) for x in (a, b)]
    out = scale_free.scale_free_metrics(torch.stack([u[0] for u in units]), [u[1] for u in units],
                                        [u[2] for u in units], torch.tensor([1.0, 1.0]))
    mean_sq = 2.0 - (2 / 2 + 2 / 2) / 4  # ||(1, 1)||^2 - (1/4)(V_a/2 + V_b/2) = 1.5
    assert out["raw_variance"] == pytest.approx(2.0)
    assert out["nvar"] == pytest.approx(2.0 / mean_sq)
    assert out["alpha"] == pytest.approx(1.0)
    assert out["cosine"] == pytest.approx(2 / math.sqrt(mean_sq * 2))


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(0.01, 100.0), seed=st.integers(0, 10_000))
def test_rescaling_changes_alpha_and_raw_numbers_only(scale, seed):
    gen = torch.Generator().manual_seed(seed)
    samples = torch.randn(40, 5, generator=gen, dtype=torch.float64) + torch.arange(5.0)
    ref = torch.randn(5, generator=gen, dtype=torch.float64) + 3.0
    base = scale_free.metrics_from_samples(samples, ref, units=8)
    scaled = scale_free.metrics_from_samples(scale * samples, ref, units=8)
    for k in ("cosine", "nvar", "rmse"):
        assert scaled[k] == pytest.approx(base[k], rel=1e-9), k
        assert scaled[k + "_se"] == pytest.approx(base[k + "_se"], rel=1e-6, abs=1e-12), k
    assert scaled["alpha"] == pytest.approx(scale * base["alpha"], rel=1e-9)
    assert scaled["raw_variance"] == pytest.approx(scale ** 2 * base["raw_variance"], rel=1e-9)


def test_gaussian_samples_recover_the_known_law():
    # g = mu + sigma * noise in D dimensions: nvar = D sigma^2 / ||mu||^2, alpha = <mu, r>/||r||^2
    gen = torch.Generator().manual_seed(0)
    D, sigma = 10, 0.7
    mu = torch.linspace(0.5, 1.5, D, dtype=torch.float64)
    r = mu * 2.0
    samples = mu + sigma * torch.randn(20_000, D, generator=gen, dtype=torch.float64)
    out = scale_free.metrics_from_samples(samples, r, units=40)
    truth = D * sigma ** 2 / (mu @ mu).item()
    assert abs(out["nvar"] - truth) < 4 * out["nvar_se"]
    assert abs(out["alpha"] - 0.5) < 4 * out["alpha_se"]
    assert out["cosine"] == pytest.approx(1.0, abs=4 * out["cosine_se"] + 1e-3)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="K >= 2"):
        scale_free.unit_summary(torch.zeros(1, 3))

def test_a_reference_lost_in_its_noise_leaves_only_nvar():
    samples = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [2.0, -1.0]])
    out = scale_free.metrics_from_samples(samples, [0.1, 0.0], units=2, ref_var=0.5)  # ||r||^2 < ref_var
    assert math.isnan(out["alpha"]) and math.isnan(out["cosine"]) and math.isnan(out["rmse"])
    assert out["nvar"] == pytest.approx(scale_free.metrics_from_samples(samples, [1.0, 0.0], units=2)["nvar"])
    with pytest.raises(ValueError, match=r"means must be \(U, D\)"):
        scale_free.scale_free_metrics(torch.zeros(2, 3), [1.0, 1.0], [2, 2], torch.zeros(4))
