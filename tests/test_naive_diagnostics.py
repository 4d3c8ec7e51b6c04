"""diagnostics.py: the forward-only gradient power, ||mean g||^2 and pure noise.

gradient_power against its formula; mean_gradient_sq_norm and context_ids against the naive
definition (``tests/naive.py``: a dict keyed by (group, whole prefix)) on random batches with
interleaved groups, shared prefixes of random depth and padding that holds garbage;
noise_diagnostics against numbers worked out by hand. (``tests/test_e2e_train.py`` also checks
mean_gradient_sq_norm against explicit per-context logit-gradient vectors of a real model.)
"""
import numpy as np
import pytest
import torch

import diagnostics
import otb
from naive import make_batch, naive_mean_gradient_sq_norm


def _close(actual, expected, atol=1e-9):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=0, atol=atol)


def test_gradient_power_is_sum_of_w_times_squared_advantage():
    b = make_batch(8, [3, 4], 6, process=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    adv, _ = otb.optimal_token_baseline(t(b["r"]), t(b["m"]), b["gid"], t(b["lp"]), t(b["spi"]))
    P = diagnostics.gradient_power(adv, t(b["m"]), t(b["lp"]), t(b["spi"]))
    w = np.clip(1 - 2 * np.exp(b["lp"]) + b["spi"], 0, 2)
    expected = [sum(w[i, s] * adv[i, s].item() ** 2 for s in range(6) if b["m"][i, s]) for i in range(7)]
    _close(P, np.array(expected))
    # constant advantage over the response: P = W(tau) A^2
    const = t(b["m"]) * 2.0
    _close(diagnostics.gradient_power(const, t(b["m"]), t(b["lp"]), t(b["spi"])), 4.0 * (w * b["m"]).sum(1))


def shared_prefix_batch(seed, sizes, T, vocab=3):
    """Interleaved groups whose rows copy a random-depth prefix of their group's trunk.

    A vocabulary of 3 makes further chance agreements (deeper shared contexts) common. Padding
    holds the token 99 and NaN log-probs. Each context gets its own random softmax pi, as for a
    real model (rows at one context share it): log pi(y) and sum pi^2 are read from it.
    """
    rng = np.random.default_rng(seed)
    gid = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))  # (B,) interleaved groups
    B = len(gid)
    trunks = rng.integers(0, vocab, (len(sizes), T))
    tokens = rng.integers(0, vocab, (B, T))
    depth = rng.integers(0, T + 1, B)
    for i in range(B):
        tokens[i, :depth[i]] = trunks[gid[i], :depth[i]]
    lengths = rng.integers(0, T + 1, B)  # a row may be empty
    mask = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    pi_of = {}  # context -> its softmax over the vocabulary
    spp, lp = np.full((B, T), np.nan), np.full((B, T), np.nan)
    for i in range(B):
        for t in range(lengths[i]):
            pi = pi_of.setdefault((gid[i], tuple(tokens[i, :t])), rng.dirichlet(np.ones(vocab)))
            spp[i, t], lp[i, t] = (pi ** 2).sum(), np.log(pi[tokens[i, t]])
    tokens[~mask] = 99
    adv = np.where(mask, rng.normal(size=(B, T)), np.nan)
    t = lambda x: torch.tensor(x)  # noqa: E731
    return t(tokens), t(mask.astype(np.float64)), [f"p{g}" for g in gid], t(adv), t(lp), t(spp)


@pytest.mark.parametrize("seed", range(12))
def test_mean_gradient_sq_norm_matches_naive_definition(seed):
    rng = np.random.default_rng(1000 + seed)
    sizes = list(rng.integers(1, 6, rng.integers(1, 5)))
    response, mask, gidx, adv, lp, spp = shared_prefix_batch(seed, sizes, T=int(rng.integers(1, 12)))
    adv = torch.nan_to_num(adv)  # advantages are 0 on padding, as the estimators return them
    expected = naive_mean_gradient_sq_norm(response, mask, gidx, adv, lp, spp)
    got = diagnostics.mean_gradient_sq_norm(response, mask, gidx, adv, lp, spp)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # the same with an integer tensor as group ids
    codes = torch.tensor([int(g[1:]) for g in gidx])
    got = diagnostics.mean_gradient_sq_norm(response, mask, codes, adv, lp, spp)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_shared_contexts_change_the_value():
    # The test above has power: with every row its own group the same inputs give another number.
    response, mask, gidx, adv, lp, spp = shared_prefix_batch(3, [4, 3], T=8)
    adv = torch.nan_to_num(adv)
    pooled = diagnostics.mean_gradient_sq_norm(response, mask, gidx, adv, lp, spp)
    apart = diagnostics.mean_gradient_sq_norm(response, mask, list(range(len(gidx))), adv, lp, spp)
    power = diagnostics.gradient_power(adv, mask, lp, spp)
    assert apart == pytest.approx(power.sum().item() / len(gidx) ** 2, rel=1e-10)
    assert abs(pooled - apart) > 1e-3 * abs(apart)


@pytest.mark.parametrize("seed", range(6))
def test_context_ids_equal_exactly_for_same_group_and_prefix(seed):
    response, mask, gidx, *_ = shared_prefix_batch(seed, [3, 4, 1, 5], T=7)
    ids = diagnostics.context_ids(response, mask, gidx)
    valid = mask.bool()
    keys = {}
    for i in range(len(gidx)):
        for t in range(int(valid[i].sum())):
            keys.setdefault((gidx[i], tuple(response[i, :t].tolist())), set()).add(ids[i, t].item())
    assert all(len(v) == 1 for v in keys.values())  # one id per context
    assert len({next(iter(v)) for v in keys.values()}) == len(keys)  # distinct contexts, distinct ids
    assert any(t > 0 for _, prefix in keys for t in [len(prefix)])


def test_mean_gradient_sq_norm_of_an_all_padding_batch_is_zero():
    z = torch.zeros(3, 4)
    assert diagnostics.mean_gradient_sq_norm(z.long(), z, [0, 0, 1], z, z - 1, z + 0.5) == 0.0


def test_noise_diagnostics_by_hand():
    # P = (1, 2, 3, 6): total power 3; ||mean g||^2 = 1.5 -> pure noise (3 - 1.5) / 3 = 0.5
    d = diagnostics.noise_diagnostics(torch.tensor([1.0, 2.0, 3.0, 6.0]), 1.5)
    assert d == pytest.approx({"total_power": 3.0, "pure_noise": 0.5})
    assert np.isnan(diagnostics.noise_diagnostics(torch.tensor([2.0]), 1.0)["pure_noise"])
