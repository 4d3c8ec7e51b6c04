"""OPO and the sequence-level optimal baseline, otb eq. (9), against references written independently.

- verl 0.9.1's ``compute_opo_outcome_advantage`` transcribed as it runs there: a Python loop that
  collects each prompt's scores and lengths in dicts, b = sum l R / sum l per prompt (own row in, 0 for a
  singleton), on the inputs of every case of the shared reference vectors;
- eq. (9) with any energy and with the own row left out, as a plain loop over rows;
- the exact statement behind (9): on the enumerated toy bandit, b* = E[R ||S||^2] / E[||S||^2] is the
  constant that minimises tr Var((R - b) S), found here by the quadratic's own minimum.
"""
import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import otb
from toy_env import ToyConfig, enumerate_toy

CASES = json.loads(gzip.decompress((Path(__file__).parent / "data" / "verl_reference_vectors.json.gz")
                                   .read_bytes()))["cases"]


def verl_opo(token_level_rewards, response_mask, index):
    """verl 0.9.1's OPO as it computes it: scores and lengths per prompt id in dicts, the length-weighted
    mean of the scores as the baseline (own row in), 0 for a prompt with one response; the advantage
    broadcast over the mask."""
    response_length = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1).clone()
    id2score, id2len, id2bsl = defaultdict(list), defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(response_length[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = torch.tensor(0.0, dtype=scores.dtype)
        else:
            s, n = torch.stack(id2score[idx]), torch.stack(id2len[idx])
            id2bsl[idx] = (n * s).sum() / n.sum()
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2bsl[index[i]]
    return scores.unsqueeze(-1) * response_mask


def loop_energy_baseline(r, m, gid, energy, leave_one_out):
    """Eq. (9) row by row: A_i = R_i - sum_j e_j R_j / sum_j e_j over i's group (j != i with leave_one_out);
    b = 0 for a singleton or where the energies sum to 0. float64 numpy (B, T)."""
    r, m, e = np.asarray(r, float), np.asarray(m, float), np.asarray(energy, float)
    R = (r * m).sum(-1)
    A = np.zeros_like(r)
    for i in range(len(r)):
        group = [j for j in range(len(r)) if gid[j] == gid[i]]
        used = [j for j in group if j != i] if leave_one_out else group
        den = sum(e[j] for j in used)
        b = sum(e[j] * R[j] for j in used) / den if len(group) > 1 and den > 0 else 0.0
        A[i] = (R[i] - b) * m[i]
    return A


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_opo_equals_verl_on_the_reference_vectors(case_name):
    case = CASES[case_name]
    r, m = torch.tensor(case["token_level_rewards"], dtype=torch.float64), torch.tensor(case["response_mask"],
                                                                                         dtype=torch.float64)
    want = verl_opo(r, m, list(case["group_index"]))
    got, ret = otb.ESTIMATORS["opo"](token_rewards=r, response_mask=m, group_index=list(case["group_index"]))
    assert torch.allclose(got, want, rtol=0, atol=1e-10), (got - want).abs().max()
    assert torch.allclose(ret, (r * m).sum(-1, keepdim=True) * m)  # returns: R on every valid token
    lengths = m.sum(-1)
    assert len(set(lengths.tolist())) > 1  # unequal lengths: OPO's baseline is not the group mean here
    assert not torch.allclose(got, otb.group_mean(r, m, list(case["group_index"]))[0], atol=1e-6) or \
        len(set(case["group_index"])) == len(case["group_index"])


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_opo_loo_is_the_loop_over_the_other_rows(case_name):
    case = CASES[case_name]
    r, m, gid = case["token_level_rewards"], case["response_mask"], list(case["group_index"])
    got, _ = otb.ESTIMATORS["opo_loo"](token_rewards=r, response_mask=m, group_index=gid)
    want = loop_energy_baseline(r, m, gid, np.asarray(m, float).sum(-1), leave_one_out=True)
    assert np.allclose(got.numpy(), want, rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4), seed=st.integers(0, 10_000),
       loo=st.booleans(), zero_energy=st.booleans())
def test_sequence_optimal_baseline_is_the_loop(sizes, seed, loo, zero_energy):
    g = torch.Generator().manual_seed(seed)
    B, T = sum(sizes), 6
    gid = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))[torch.randperm(B, generator=g)]
    m = (torch.arange(T)[None] < torch.randint(1, T + 1, (B, 1), generator=g)).double()
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    e = torch.rand(B, generator=g, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (B,), generator=g)
    if zero_energy:
        e[gid == gid[0]] = 0.0  # a group with no energy to weigh by: b = 0
    got, ret = otb.sequence_optimal_baseline(r, m, gid, e, leave_one_out=loo)
    assert np.allclose(got.numpy(), loop_energy_baseline(r, m, gid.tolist(), e, loo), rtol=1e-9, atol=1e-9)
    assert torch.equal(got * (1 - m), torch.zeros_like(got))  # 0 on padding


def test_length_as_the_energy_is_opo():
    case = CASES["outcome_mixed_groups"]
    r, m, gid = case["token_level_rewards"], case["response_mask"], list(case["group_index"])
    length = torch.tensor(m, dtype=torch.float64).sum(-1)
    for loo in (False, True):
        a = otb.sequence_optimal_baseline(r, m, gid, length, leave_one_out=loo)[0]
        b = otb.opo(r, m, gid, leave_one_out=loo)[0]
        assert torch.allclose(a, b, atol=1e-12)


def test_the_classic_optimal_baseline_minimises_the_variance_on_the_toy():
    # tr Var((R - b) S) = E[(R - b)^2 ||S||^2] - ||grad J||^2 is a quadratic in b; its minimum sits at
    # E[R ||S||^2] / E[||S||^2], which eq. (9) estimates. Exact over every response of the toy.
    en = enumerate_toy(ToyConfig(K=3, T=4, min_len=3))
    S, R, p = en.scores.sum(1), en.R, en.pi  # S(tau) (M, P), R(tau), pi(tau) (M,)
    sq = S.square().sum(-1)  # ||S||^2, (M,)

    def tr_var(b):
        g = (R - b)[:, None] * S  # (M, P)
        mean = p @ g
        return (p @ g.square().sum(-1) - mean.square().sum()).item()
    b_star = ((p * R * sq).sum() / (p * sq).sum()).item()
    bs = np.linspace(b_star - 1, b_star + 1, 201)
    assert abs(bs[np.argmin([tr_var(b) for b in bs])] - b_star) <= 0.01
    assert tr_var(b_star) < tr_var((p * R).sum().item())  # better than the mean reward E[R]


def test_bad_energy_is_named():
    r, m = [[1.0, 0.0], [0.0, 1.0]], [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="energy must hold one number per row"):
        otb.sequence_optimal_baseline(r, m, [0, 0], [1.0])
    with pytest.raises(ValueError, match=r"energy must be finite and >= 0, found -1"):
        otb.sequence_optimal_baseline(r, m, [0, 0], [1.0, -1.0])
    with pytest.raises(ValueError, match="energy must be finite"):
        otb.sequence_optimal_baseline(r, m, [0, 0], [1.0, float("nan")])
