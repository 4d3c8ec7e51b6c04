"""Exact tier: the scale-free metrics of scale_free.py against hand-computed cases, known laws and
exact expectations on the enumerable toy bandit; coverage of their bootstrap intervals. The known
factors (E g = c grad J) also hold when responses contain a tool's output (holes in the mask),
checked by enumerating every group of a small policy with a tool."""
import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings, strategies as st

import otb
from lab.analysis import scale_free
from benchmarks import common
from toy_env import ToyConfig, enumerate_toy
from toy_harness import batch_gradients


def _point(s, factor=None):
    U = s["V"].shape[0]
    return {k: v.item() for k, v in scale_free.evaluate(s, torch.full((1, U), 1 / U, dtype=torch.float64),
                                                          factor).items()}


def test_hand_computed_case_uses_pairs_of_different_units():
    # Unit means (1,0), (0,1), (1,1), variances 1, 2, 3, exact r = (1, 0).
    # Pairs u != v: <m_u, m_v> = 0, 1, 1 -> ||E g||^2 ~ 2/3; <m_u, r> = 1, 0, 1 -> <E g, r> ~ 2/3;
    # V = 2; ||r||^2 = 1. alpha = 2/3, cosine = (2/3) / sqrt(2/3), nvar = 3, rmse = 1 - (4/9) / (8/3).
    s = scale_free.gram_stats([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [1.0, 2.0, 3.0], [1.0, 0.0])
    out = _point(s)
    assert out["alpha"] == pytest.approx(2 / 3)
    assert out["cosine"] == pytest.approx(math.sqrt(2 / 3))
    assert out["nvar"] == pytest.approx(3.0)
    assert out["rmse"] == pytest.approx(5 / 6)
    assert out["raw_variance"] == pytest.approx(2.0)


def test_a_known_factor_fixes_alpha_and_cosine():
    s = scale_free.gram_stats([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [1.0, 2.0, 3.0],
                              [[2.0, 0.0], [2.0, 0.0], [2.0, 0.0]])  # refs: ||r||^2 = 4
    out = _point(s, factor=0.75)
    assert out["alpha"] == pytest.approx(0.75) and out["cosine"] == pytest.approx(1.0)
    assert out["nvar"] == pytest.approx(2.0 / (0.75 ** 2 * 4))


def test_gain_between_known_factors_is_the_variance_ratio_exactly():
    # Two estimators on the same units; factors 1 and 3/4: gain = (V_b / c_b^2) / (V_a / c_a^2).
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    refs = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    Va, Vb = torch.rand(6, generator=gen, dtype=torch.float64) + 1, torch.rand(6, generator=gen, dtype=torch.float64) + 2
    units = {"a": scale_free.gram_stats(means, Va, refs), "b": scale_free.gram_stats(means * 0.75, Vb, refs)}
    out = scale_free.bootstrap(units, factors={"a": 1.0, "b": 0.75}, baseline="b", replicates=300)
    assert out["a"]["gain"][0] == pytest.approx((Vb.mean() / 0.75 ** 2 / Va.mean()).item())
    assert out["a"]["gain"][1] <= out["a"]["gain"][0] <= out["a"]["gain"][2]
    assert out["b"]["gain"][:1] == pytest.approx((1.0,))


def test_group_mean_expectation_is_exactly_one_minus_one_over_n_of_reinforce():
    # Enumerate every ordered pair of responses of the toy (N = 2): E g = sum_ij pi_i pi_j g_ij.
    en = enumerate_toy(ToyConfig(K=3, T=4, min_len=3))
    M = en.pi.shape[0]
    rows = torch.stack(torch.meshgrid(torch.arange(M), torch.arange(M), indexing="ij"), -1).reshape(-1)  # (M*M*2,)
    gid = torch.arange(M * M).repeat_interleave(2)
    weight = (en.pi[:, None] * en.pi[None, :]).reshape(-1)  # pi_i pi_j, (M*M,)
    expect = {}
    for name in ("reinforce", "group_mean", "rloo", "otb_loo", "otb"):
        A = otb.ESTIMATORS[name](**en.batch(rows), group_index=gid)[0]
        expect[name] = weight @ batch_gradients(en, A, rows, 2)  # E g, (P,)
    assert torch.allclose(expect["reinforce"], en.grad_J, atol=1e-12)
    for name in ("rloo", "otb_loo"):
        assert torch.allclose(expect[name], en.grad_J, atol=1e-12), name
    assert torch.allclose(expect["group_mean"], (1 - 1 / 2) * en.grad_J, atol=1e-12)
    assert scale_free.FACTORS["group_mean"](2) == 0.5
    assert not torch.allclose(expect["otb"], en.grad_J, atol=1e-6)  # OTB's is unknown: not in FACTORS
    assert "otb" not in scale_free.FACTORS


def tool_toy():
    """A two-action policy with a tool, every response enumerated: (responses (M, T), mask (M, T),
    rewards at the last action (M, T), log pi(y_t) and sum pi^2 (M, T), p(tau) (M,), scores s_t
    (M, T, P), grad J (P,)).

    The first action answers (0) or calls the tool (1); a call gets the tool's output, token 3 or
    4 with probabilities 0.3 / 0.7 (mask 0: not an action, no parameter); then a second action 0
    or 1, from a softmax of its own per context. So calls put a hole at t = 1 and shift the second
    action to t = 2. The holes hold garbage: a reward of 5 and NaN log-probs.
    """
    theta = torch.tensor([[0.3, -0.2], [0.5, 0.1], [-0.4, 0.6], [0.2, 0.9]], dtype=torch.float64,
                         requires_grad=True)  # logits of the contexts (), (0,), (1, 3), (1, 4)
    second = {(0,): 1, (1, 3): 2, (1, 4): 3}  # prefix -> context of the second action
    tool = {3: 0.3, 4: 0.7}
    responses = [(0, y) for y in (0, 1)] + [(1, x, y) for x in (3, 4) for y in (0, 1)]
    R = torch.tensor([0.0, 0.5, 1.0, 0.0, 0.2, 1.5], dtype=torch.float64)
    M, T = len(responses), 3
    tokens, mask = torch.zeros(M, T, dtype=torch.long), torch.zeros(M, T, dtype=torch.float64)
    lp, spp = (torch.full((M, T), math.nan, dtype=torch.float64) for _ in range(2))  # NaN in the holes
    r = torch.zeros(M, T, dtype=torch.float64)
    scores = torch.zeros(M, T, theta.numel(), dtype=torch.float64)
    log_p = []
    for i, resp in enumerate(responses):
        tokens[i, :len(resp)] = torch.tensor(resp)
        acts = [(0, 0)] + [(len(resp) - 1, second[resp[:-1]])]  # (position, context) of each action
        logp_tau = torch.log(torch.tensor(tool[resp[1]], dtype=torch.float64)) if len(resp) == 3 else 0.0
        for t, c in acts:
            logp = torch.log_softmax(theta[c], -1)[resp[t]]
            scores[i, t] = torch.autograd.grad(logp, theta, retain_graph=True)[0].reshape(-1)  # s_t
            mask[i, t], lp[i, t] = 1.0, logp.item()
            spp[i, t] = torch.softmax(theta[c], -1).square().sum().item()
            logp_tau = logp_tau + logp
        log_p.append(logp_tau)
        r[i, len(resp) - 1] = R[i]
        if len(resp) == 3:
            r[i, 1] = 5.0  # a reward inside the hole: garbage every estimator must ignore
    p = torch.stack(log_p).exp()  # p(tau), (M,)
    grad_J = torch.autograd.grad((p * R).sum(), theta)[0].reshape(-1)  # (P,)
    return tokens, mask, r, lp, spp, p.detach(), scores, grad_J


@pytest.mark.parametrize("N", [2, 3, 4])
def test_known_factors_hold_with_tool_output_in_the_responses(N):
    # scale_free.FACTORS with holes: every ordered N-tuple of the tool toy's responses is a group,
    # E g = sum over tuples of p(tuple) (1/N) sum_i sum_t A_t s_t (valid t only), exactly.
    _, mask, r, lp, spp, p, scores, grad_J = tool_toy()
    M = len(p)
    rows = torch.cartesian_prod(*[torch.arange(M)] * N).reshape(-1)  # (M^N * N,)
    gid = torch.arange(M ** N).repeat_interleave(N)
    weight = p[rows].reshape(-1, N).prod(-1)  # p(tuple), (M^N,)
    assert weight.sum().item() == pytest.approx(1.0, abs=1e-12)
    exact = torch.einsum("btp->bp", scores).square().sum(-1)  # ||S_i||^2 of each response, (M,)
    ests = {**{name: partial(common.advantages, name) for name in scale_free.FACTORS},
            "otb_tir leave-one-out": lambda **kw: partial(otb.action_aligned_otb, leave_one_out=True)(**kw)[0]}
    for name, fn in ests.items():
        A = fn(token_rewards=r[rows], response_mask=mask[rows], group_index=gid, log_probs=lp[rows],
               sum_pi_sq=spp[rows], **({"exact_energy": exact[rows]} if name.startswith("seq_") else {}))
        g = torch.einsum("bt,btp->bp", A, scores[rows]).reshape(-1, N, grad_J.numel()).mean(1)  # (M^N, P)
        c = scale_free.FACTORS.get(name, lambda N: 1.0)(N)
        assert torch.allclose(weight @ g, c * grad_J, atol=1e-12), name
    assert grad_J.norm() > 0.1


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(0.01, 100.0), seed=st.integers(0, 10_000))
def test_rescaling_changes_alpha_and_raw_numbers_only(scale, seed):
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(8, 5, generator=gen, dtype=torch.float64) + torch.arange(5.0)
    V = torch.rand(8, generator=gen, dtype=torch.float64)
    ref = torch.randn(5, generator=gen, dtype=torch.float64) + 3.0
    base = _point(scale_free.gram_stats(means, V, ref))
    scaled = _point(scale_free.gram_stats(scale * means, scale ** 2 * V, ref))
    for k in ("cosine", "nvar", "rmse"):
        if not math.isnan(base[k]):
            assert scaled[k] == pytest.approx(base[k], rel=1e-9), k
    assert scaled["alpha"] == pytest.approx(scale * base["alpha"], rel=1e-9)
    assert scaled["raw_variance"] == pytest.approx(scale ** 2 * base["raw_variance"], rel=1e-9)


def _gaussian_units(gen, U, K, mu, sigma):
    samples = mu + sigma * torch.randn(U, K, mu.shape[0], generator=gen, dtype=torch.float64)
    summ = [scale_free.unit_summary(x) for x in samples]
    return torch.stack([m for m, _, _ in summ]), [v for _, v, _ in summ]


def test_bootstrap_interval_of_nvar_covers_the_known_law():
    # g = mu + sigma z in D dimensions: nvar = D sigma^2 / ||mu||^2 (unknown factor: estimated).
    gen = torch.Generator().manual_seed(2)
    D, sigma, U, K, sims = 6, 1.0, 30, 4, 120
    mu = torch.full((D,), 0.5, dtype=torch.float64)
    truth = D * sigma ** 2 / (mu @ mu).item()  # 4.0
    hits = 0
    for i in range(sims):
        means, V = _gaussian_units(gen, U, K, mu, sigma)
        out = scale_free.bootstrap({"e": scale_free.gram_stats(means, V, mu)}, replicates=500, seed=i)
        _, lo, hi = out["e"]["nvar"]
        hits += lo <= truth <= hi
    assert 0.85 <= hits / sims <= 1.0  # about 95%; s.e. 0.02 at 120 simulations


def test_signal_lost_in_noise_is_unresolved():
    gen = torch.Generator().manual_seed(3)
    means, V = _gaussian_units(gen, 8, 2, torch.zeros(50, dtype=torch.float64), 1.0)  # E g = 0
    out = scale_free.bootstrap({"e": scale_free.gram_stats(means, V, torch.ones(50))}, replicates=300)
    assert out["e"]["nvar"][2] == math.inf and all(math.isnan(x) for x in out["e"]["cosine"])  # no upper end
    assert scale_free.cell("nvar", out["e"]["nvar"]).startswith(("\u2265", "unresolved"))
    assert out["e"]["raw_variance"][0] > 0  # the noise itself is measured


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="K >= 2"):
        scale_free.unit_summary(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="U >= 2"):
        scale_free.gram_stats(torch.zeros(1, 3), [1.0], torch.zeros(3))
    with pytest.raises(ValueError, match="refs must be"):
        scale_free.gram_stats(torch.zeros(2, 3), [1.0, 1.0], torch.zeros(4))


def test_pooled_reference_is_the_gram_of_the_averaged_estimates():
    gen = torch.Generator().manual_seed(4)
    m, r = torch.randn(5, 3, generator=gen, dtype=torch.float64), torch.randn(5, 3, generator=gen, dtype=torch.float64)
    s = scale_free.gram_stats(m, torch.ones(5), r)
    j = (m + r) / 2  # eq. (8), computed directly
    assert torch.allclose(scale_free.pooled_reference(s), j @ j.T)
    # a known factor then takes its ||grad J||^2 from it: signal = c^2 P(j, j), alpha = c
    w = torch.full((1, 5), 0.2, dtype=torch.float64)
    out = scale_free.evaluate(s, w, factor=0.5, j_gram=scale_free.pooled_reference(s))
    assert out["signal"].item() == pytest.approx(0.25 * scale_free.pairs(j @ j.T, w).item())
    assert out["alpha"].item() == pytest.approx(0.5)


def test_cell_marks_known_expectations_exact_and_keeps_values_in_range():
    assert scale_free.cell("alpha", (0.7, 0.6, 0.8), factor=0.75) == "0.75 (exact)"
    assert scale_free.cell("cosine", (0.7, 0.6, 0.8), factor=0.75) == "1 (exact)"
    assert scale_free.cell("cosine", (1.02, 0.95, 1.05)) == "1.00* [0.95, 1.00*]"  # a cosine never above 1
    assert scale_free.cell("cosine", (1.0, 0.95, 1.0), moved=True) == "1.00* [0.95, 1.00]"
    assert scale_free.cell("nvar", (float("nan"), 0.0, 1.0)) == "unresolved"
    assert scale_free.cell("gain", (3.0, 1.5, math.inf)) == "\u2265 1.50"  # a one-sided set
    assert scale_free.cell("gain", (0.8, 0.0, 2.5)) == "\u2264 2.50"
    assert scale_free.cell("alpha", (1.2, 1.1, 1.3), digits=1) == "1.2 [1.1, 1.3]"  # alpha has no bound
