"""diagnostics.py: the forward-only gradient power, ||mean g||^2 and pure noise.

gradient_power against its formula; mean_gradient_sq_norm and context_ids against the naive
definition (``tests/naive.py``: a dict keyed by (group, whole prefix)) on random batches with
interleaved groups, shared prefixes of random depth and padding that holds garbage;
noise_diagnostics against numbers worked out by hand. (``tests/test_e2e_train.py`` also checks
mean_gradient_sq_norm against explicit per-context logit-gradient vectors of a real model.)

Responses with tool output (mask 0 inside a response): gradient_power counts the valid tokens only
(a batch with holes gives its compacted twin's numbers, ``naive.insert_holes``), and the tool's
tokens are part of the context of every token after them (rows that differ only in a tool's output
share no context after it).
"""
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab import diagnostics
import otb
from naive import insert_holes, make_batch, naive_mean_gradient_sq_norm
from test_naive_otb import SETTINGS, batch_args


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


def naive_context_ids(response, mask, group_index):
    """context_ids one row and one position at a time: the id of (row i, position t) is t * B plus
    the rank of (group, y_0, ..., y_{t-1}) among position t's distinct contexts in sorted order;
    padding (no valid token at or after t) reads as token 0."""
    B, T = response.shape
    gid = otb.group_ids(group_index, B)[0].tolist()
    valid = mask.bool().tolist()
    y = [[tok if any(valid[i][t:]) else 0 for t, tok in enumerate(row)] for i, row in enumerate(response.tolist())]
    out = torch.empty(B, T, dtype=torch.long)
    for t in range(T):
        context = [(gid[i], tuple(y[i][:t])) for i in range(B)]
        rank = {c: r for r, c in enumerate(sorted(set(context)))}
        for i in range(B):
            out[i, t] = t * B + rank[context[i]]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_context_ids_equal_the_per_row_definition_exactly(seed):
    """Random batches: group labels as tensors or strings (groups numbered by first appearance), small
    vocabularies (deep shared prefixes), holes (tool output) and padding holding garbage."""
    rng = np.random.default_rng(3000 + seed)
    B, T, vocab = int(rng.integers(1, 30)), int(rng.integers(1, 16)), int(rng.integers(1, 5))
    response = torch.tensor(rng.integers(0, vocab, (B, T)))
    lengths = rng.integers(0, T + 1, B)
    mask = (np.arange(T)[None, :] < lengths[:, None]) & (rng.random((B, T)) > 0.2)  # holes inside
    response[torch.tensor(np.arange(T)[None, :] >= lengths[:, None])] = 7  # padding: garbage
    labels = rng.integers(0, 4, B)
    for group_index in (torch.tensor(labels), [f"p{g}" for g in labels]):
        mask_t = torch.tensor(mask, dtype=torch.float64)
        assert torch.equal(diagnostics.context_ids(response, mask_t, group_index),
                           naive_context_ids(response, mask_t, group_index))


def test_mean_gradient_sq_norm_of_an_all_padding_batch_is_zero():
    z = torch.zeros(3, 4)
    assert diagnostics.mean_gradient_sq_norm(z.long(), z, [0, 0, 1], z, z - 1, z + 0.5) == 0.0


def test_noise_diagnostics_by_hand():
    # P = (1, 2, 3, 6): total power 3; ||mean g||^2 = 1.5 -> pure noise (3 - 1.5) / 3 = 0.5
    d = diagnostics.noise_diagnostics(torch.tensor([1.0, 2.0, 3.0, 6.0]), 1.5)
    assert d == pytest.approx({"total_power": 3.0, "pure_noise": 0.5})
    assert np.isnan(diagnostics.noise_diagnostics(torch.tensor([2.0]), 1.0)["pure_noise"])


# ----------------------------------------------------------------------------- responses with tool output

@SETTINGS
@given(args=batch_args, hole_seed=st.integers(0, 2**16))
def test_gradient_power_with_holes_is_the_compacted_twins(args, hole_seed):
    twin = make_batch(**args)
    b, where = insert_holes(twin, hole_seed)
    adv = np.random.default_rng(hole_seed).normal(size=twin["m"].shape) * twin["m"]  # A_t, 0 on padding
    holes_adv = np.zeros(b["m"].shape)
    np.put_along_axis(holes_adv, where, adv, axis=1)  # the same A at the same tokens, 0 in the holes
    P = diagnostics.gradient_power(holes_adv, b["m"], b["lp"], b["spi"])  # NaN log-probs in the holes
    _close(P, diagnostics.gradient_power(adv, twin["m"], twin["lp"], twin["spi"]), atol=1e-12)


def tool_batch(seed, sizes, T, tool_tokens=(3, 4)):
    """Rows that interleave policy tokens (vocabulary 0-2, mask 1) with tool output (tokens 3-4,
    mask 0) and share prefixes often. Each context (group, whole prefix, tool output included) has
    its own softmax pi, so rows at one context share log pi and sum pi^2, as with a real model."""
    rng = np.random.default_rng(seed)
    gid = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    B = len(gid)
    tokens, mask = np.full((B, T), 99), np.zeros((B, T))
    lp, spp = np.full((B, T), np.nan), np.full((B, T), np.nan)
    pi_of = {}
    for i in range(B):
        for t in range(int(rng.integers(1, T + 1))):
            if t > 0 and rng.random() < 0.35:  # the tool's output: not an action
                tokens[i, t] = rng.choice(tool_tokens)
                continue
            pi = pi_of.setdefault((gid[i], tuple(tokens[i, :t])), rng.dirichlet(np.ones(3)))
            tokens[i, t] = rng.choice(3)
            mask[i, t], lp[i, t], spp[i, t] = 1.0, np.log(pi[tokens[i, t]]), (pi ** 2).sum()
    adv = np.where(mask > 0, rng.normal(size=(B, T)), 0.0)
    return torch.tensor(tokens), torch.tensor(mask), [f"p{g}" for g in gid], torch.tensor(adv), \
        torch.tensor(lp), torch.tensor(spp)


@pytest.mark.parametrize("seed", range(12))
def test_mean_gradient_sq_norm_with_tool_output_matches_naive_definition(seed):
    rng = np.random.default_rng(2000 + seed)
    sizes = list(rng.integers(1, 6, rng.integers(1, 4)))
    response, mask, gidx, adv, lp, spp = tool_batch(seed, sizes, T=int(rng.integers(2, 9)))
    expected = naive_mean_gradient_sq_norm(response, mask, gidx, adv, lp, spp)
    got = diagnostics.mean_gradient_sq_norm(response, mask, gidx, adv, lp, spp)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_a_tools_output_is_part_of_the_context():
    # Two rows, one group, the same actions 1 then 2; the tool between them answered 3 in one row
    # and 4 in the other. The second actions have different contexts, so they do not pool: the
    # result is the sum of the rows' own powers at t = 2 plus the shared first context.
    t64 = partial(torch.tensor, dtype=torch.float64)
    response = torch.tensor([[1, 3, 2], [1, 4, 2]])
    mask = adv = t64([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    lp = torch.log(t64([[0.5, 1.0, 0.25], [0.5, 1.0, 0.8]]))  # log pi(y_t); 1.0 in the holes (unused)
    spp = t64([[0.5, 1.0, 0.4], [0.5, 1.0, 0.7]])
    got = diagnostics.mean_gradient_sq_norm(response, mask, ["p", "p"], adv, lp, spp)
    # t = 0: both rows sampled token 1 at one context: c = 2, S = 2 -> 4 - 2*2*(2*0.5) + 4*0.5 = 2
    # t = 2, each row alone: w A^2 with w = 1 - 2 pi(y) + sum pi^2
    first = 4 - 2 * 2 * (2 * 0.5) + 4 * 0.5
    alone = (1 - 2 * 0.25 + 0.4) + (1 - 2 * 0.8 + 0.7)
    assert got == pytest.approx((first + alone) / 4, rel=1e-12)
    naive = naive_mean_gradient_sq_norm(response, mask, ["p", "p"], adv, lp, spp)
    assert got == pytest.approx(naive, rel=1e-12)
