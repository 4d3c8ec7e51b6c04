"""otb.py against naive loops: every vectorised estimator re-written as plain Python.

Tier 2 of the house testing ladder: every estimator in ``otb.py`` is vectorised, so here each one
is compared with its plainest float64 Python loop (``tests/naive.py``, straight from the formulas)
on random batches drawn by hypothesis (varied lengths, interleaved groups of sizes 1-8, process
rewards at several positions, importance weights, zero tail, leave-one-out).

The properties (closed forms, invariances, sum pi^2 precision, the autograd check of the proxy)
are in ``test_exact_otb_properties.py``, which reuses the hypothesis settings and helpers defined here.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otb
from naive import loop_reference, make_batch, naive_otb, naive_otb_by_action, naive_scores

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# =====================================================================================
# Random batches
# =====================================================================================

batch_args = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    n_pos=st.integers(1, 9),
    process=st.booleans(),
    consistent=st.booleans(),
    with_isw=st.booleans(),
))


def _otb(b, dtype=torch.float64, **kw):
    t = lambda x: None if x is None else torch.tensor(x, dtype=dtype)  # noqa: E731
    return otb.optimal_token_baseline(t(b["r"]), t(b["m"]), b["gid"], t(b["lp"]), t(b["spi"]),
                                      is_weights=t(b["isw"]), **kw)


def _close(actual, expected, atol=1e-9):
    actual = actual.detach().double().numpy()
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


# =====================================================================================
# Vectorised == naive loop
# =====================================================================================

@settings(SETTINGS, max_examples=150)
@given(args=batch_args, leave_one_out=st.booleans(), zero_tail=st.booleans())
def test_otb_matches_naive_loop(args, leave_one_out, zero_tail):
    b = make_batch(**args)
    adv, ret = _otb(b, leave_one_out=leave_one_out, zero_tail=zero_tail)
    A, G = naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], b["isw"],
                     leave_one_out=leave_one_out, zero_tail=zero_tail)
    _close(ret, G)
    _close(adv, A)


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_otb_eps_enters_the_denominator(eps):
    b = make_batch(7, [3, 1, 4], 6, process=True)
    adv, _ = _otb(b, eps=eps)
    A, _ = naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], eps=eps)
    _close(adv, A)


@SETTINGS
@given(args=batch_args, kind=st.sampled_from(["reinforce", "group_mean", "grpo", "rloo"]))
def test_sequence_estimators_match_naive_loop(args, kind):
    b = make_batch(**args)
    adv, ret = getattr(otb, kind)(torch.tensor(b["r"]), torch.tensor(b["m"]), b["gid"])
    A, R = naive_scores(b["r"], b["m"], b["gid"], kind)
    _close(adv, A, atol=1e-7)
    _close(ret, R)


def test_estimators_dict_contract():
    assert set(otb.ESTIMATORS) == {"reinforce", "group_mean", "grpo", "rloo", "otb", "otb_loo", "otb_zero_tail",
                                   "otb_tir", "otb_tir_zero_tail", "opo", "opo_loo"}
    b = make_batch(3, [4, 2, 1, 5], 7, process=True)
    kw = dict(token_rewards=torch.tensor(b["r"]), response_mask=torch.tensor(b["m"]),
              group_index=b["gid"], log_probs=torch.tensor(b["lp"]), sum_pi_sq=torch.tensor(b["spi"]))
    for name, fn in otb.ESTIMATORS.items():
        adv, ret = fn(**kw)
        assert adv.shape == ret.shape == kw["token_rewards"].shape, name
    _close(otb.ESTIMATORS["otb"](**kw)[0], naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"])[0])
    _close(otb.ESTIMATORS["otb_loo"](**kw)[0],
           naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], leave_one_out=True)[0])
    _close(otb.ESTIMATORS["otb_zero_tail"](**kw)[0],
           naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], zero_tail=True)[0])
    _close(otb.ESTIMATORS["otb_tir"](**kw)[0],
           naive_otb_by_action(b["r"], b["m"], b["gid"], b["lp"], b["spi"])[0])
    _close(otb.ESTIMATORS["otb_tir_zero_tail"](**kw)[0],
           naive_otb_by_action(b["r"], b["m"], b["gid"], b["lp"], b["spi"], zero_tail=True)[0])
    for name in ["reinforce", "group_mean", "grpo", "rloo"]:
        _close(otb.ESTIMATORS[name](**kw)[0], naive_scores(b["r"], b["m"], b["gid"], name)[0], atol=1e-7)


def test_float32_inputs_match_naive_loop():
    b = make_batch(11, [4, 4, 3, 8, 1], 12, process=True, with_isw=True)
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    adv, ret = otb.optimal_token_baseline(f(b["r"]), f(b["m"]), b["gid"], f(b["lp"]), f(b["spi"]),
                                          is_weights=f(b["isw"]), zero_tail=True)
    A, G = naive_otb(b["r"], b["m"], b["gid"], f(b["lp"]).double().numpy(), f(b["spi"]).double().numpy(),
                     f(b["isw"]).double().numpy(), zero_tail=True)
    _close(ret, G, atol=1e-5)
    _close(adv, A, atol=1e-5)


def test_float32_leave_one_out_is_as_accurate_as_the_plain_baseline():
    # One uncertain row (w = 0.5 per token) and two confident rows (w ~ 2e-5 per token): the
    # other rows' energies are ~1e-4 of the row's own. Leave-one-out sums computed as
    # "group total minus own term" in float32 lose ~eps * own / others of relative accuracy
    # (here ~1e-3 on B_t); the float32 result should stay as close to the float64 naive loop
    # as the plain (own-row-included) baseline does.
    T, d = 200, 3e-3
    r = np.zeros((3, T))
    r[:, -1] = [2.0, 1.0, 0.0]
    m = np.ones((3, T))
    lp = np.full((3, T), math.log(0.5))
    spi = np.full((3, T), 0.5)
    lp[1:], spi[1:] = math.log(1 - d), (1 - d) ** 2 + d ** 2  # w = 2 d^2
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    lp32, spi32 = f(lp).double().numpy(), f(spi).double().numpy()  # the same rounded inputs
    for loo in [False, True]:
        adv, _ = otb.optimal_token_baseline(f(r), f(m), [0, 0, 0], f(lp), f(spi), leave_one_out=loo)
        A, _ = naive_otb(r, m, [0, 0, 0], lp32, spi32, leave_one_out=loo)
        err = np.abs(adv.double().numpy() - A).max()
        assert err <= 1e-5, f"leave_one_out={loo}: float32 advantage off by {err:.2e}"


# =====================================================================================
# The benchmark's per-group loop
# =====================================================================================

def test_loop_reference_agrees_with_naive_loop():
    # The per-group loop bench_estimators.py times against must itself be right.
    b = make_batch(17, [4, 1, 3, 4, 2], 9, process=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    gid = torch.tensor([int(g.split("-")[1]) for g in b["gid"]])
    adv, ret = loop_reference(t(b["r"]), t(b["m"]), gid, t(b["lp"]), t(b["spi"]))
    A, G = naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"])
    _close(adv, A)
    _close(ret, G)
