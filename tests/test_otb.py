"""otb.py against naive loops: every vectorised estimator re-written as plain Python.

Tier 2 of the house testing ladder: every estimator in ``otb.py`` is vectorised, so here each one
is re-written as the plainest possible float64 Python loop over rows and positions, straight from
the formulas, and the two are compared on random batches drawn by hypothesis (varied lengths,
interleaved groups of sizes 1-8, process rewards at several positions, importance weights, zero
tail, leave-one-out). The formulas the loops implement:

    G_t = sum_{u>=t} r_u                      returns (reward-to-go)
    w_t = clamp(1 - 2 pi(y_t) + sum_k pi_k^2, 0, 2) * rho_t^2
    W_t = sum_{j<=t} w_j
    B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + eps)     over the rows i of the group
    A_t = G_t - B_t

The properties (closed forms, invariances, sum pi^2 precision, the autograd check of the proxy)
are in ``test_otb_properties.py``, which reuses the naive loops and batch generator defined here.
"""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otb

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# =====================================================================================
# Naive references: plain Python loops over rows and positions, float64, from the formulas
# =====================================================================================

def naive_otb(r, m, gid, lp, spi, isw=None, leave_one_out=False, zero_tail=False, eps=1e-8):
    """Returns (A, G) as float64 numpy arrays. Inputs: nested sequences / arrays (B, T)."""
    n_rows, n_pos = len(r), len(r[0])
    G = np.zeros((n_rows, n_pos))
    W = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        acc = 0.0
        for t in reversed(range(n_pos)):  # G_t = sum_{u >= t} r_u over valid u
            if m[i][t]:
                acc += float(r[i][t])
                G[i, t] = acc
        acc = 0.0
        for t in range(n_pos):  # W_t = sum_{j <= t} w_j
            if m[i][t]:
                w = 1.0 - 2.0 * math.exp(float(lp[i][t])) + float(spi[i][t])
                w = min(max(w, 0.0), 2.0)
                if isw is not None:
                    w *= float(isw[i][t]) ** 2
                acc += w
                W[i, t] = acc
    A = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        group = [j for j in range(n_rows) if gid[j] == gid[i]]
        for t in range(n_pos):
            if not m[i][t]:
                continue
            active = [j for j in group if m[j][t]]
            used = [j for j in active if not (leave_one_out and j == i)]
            if len(group) == 1 or not used or (zero_tail and len(active) == 1):
                b = 0.0
            else:
                b = sum(G[j, t] * W[j, t] for j in used) / (sum(W[j, t] for j in used) + eps)
            A[i, t] = G[i, t] - b
    return A, G


def naive_scores(r, m, gid, kind):
    """Per-sequence estimators, broadcast over valid tokens. Returns (A, R broadcast)."""
    n_rows, n_pos = len(r), len(r[0])
    score = [sum(float(r[i][t]) for t in range(n_pos) if m[i][t]) for i in range(n_rows)]
    A = np.zeros((n_rows, n_pos))
    R = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        others = [score[j] for j in range(n_rows) if gid[j] == gid[i] and j != i]
        group = others + [score[i]]
        n = len(group)
        if kind == "reinforce":
            a = score[i]
        elif kind == "group_mean":
            a = score[i] - (sum(group) / n if n > 1 else 0.0)
        elif kind == "grpo":
            if n == 1:
                mean, std = 0.0, 1.0
            else:
                mean = sum(group) / n
                std = math.sqrt(sum((s - mean) ** 2 for s in group) / (n - 1))
            a = (score[i] - mean) / (std + 1e-6)
        elif kind == "rloo":
            a = score[i] - (sum(others) / len(others) if others else 0.0)
        for t in range(n_pos):
            if m[i][t]:
                A[i, t] = a
                R[i, t] = score[i]
    return A, R


# =====================================================================================
# Random batches
# =====================================================================================

# (log pi_y, sum pi^2) pairs for which the raw 1 - 2 pi + sum pi^2 is either clearly negative
# (clamped to 0) or >= 0.1: exercises the clamp without creating near-zero denominators.
_LP_CHOICES = np.log([0.9, 0.5, 0.1, 1.0])
_SPI_CHOICES = np.array([0.1, 0.5, 0.9])


def make_batch(seed, sizes, n_pos, *, process=False, consistent=True, with_isw=False,
               equal_lengths=False, reward_scale=1.0):
    """A right-padded batch of interleaved groups; numpy float64 arrays plus a list of ids."""
    rng = np.random.default_rng(seed)
    gid = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(gid)  # interleave the groups
    n_rows = len(gid)
    lengths = np.full(n_rows, n_pos) if equal_lengths else rng.integers(1, n_pos + 1, n_rows)
    m = (np.arange(n_pos)[None, :] < lengths[:, None]).astype(np.float64)  # (B, T)
    r = np.zeros((n_rows, n_pos))
    r[np.arange(n_rows), lengths - 1] = reward_scale * rng.choice([0.0, 1.0, -0.5, 2.0], n_rows)
    if process:  # sparse per-token rewards at a few valid positions
        extra = (rng.random((n_rows, n_pos)) < 0.3) * rng.normal(size=(n_rows, n_pos))
        r += extra * m
    if consistent:  # from real softmaxes of random logits
        logits = rng.normal(size=(n_rows, n_pos, 5)) * rng.choice([0.3, 1.0, 3.0])
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        tok = rng.integers(0, 5, (n_rows, n_pos))
        lp = np.take_along_axis(logp, tok[..., None], -1)[..., 0]
        spi = (np.exp(logp) ** 2).sum(-1)
    else:
        lp = rng.choice(_LP_CHOICES, (n_rows, n_pos))
        spi = rng.choice(_SPI_CHOICES, (n_rows, n_pos))
    isw = rng.uniform(0.5, 1.5, (n_rows, n_pos)) if with_isw else None
    return dict(r=r, m=m, gid=[f"prompt-{g}" for g in gid], lp=lp, spi=spi, isw=isw)


batch_args = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    n_pos=st.integers(1, 9),
    process=st.booleans(),
    consistent=st.booleans(),
    with_isw=st.booleans(),
))


def _otb(b, **kw):
    t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float64)  # noqa: E731
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
    assert set(otb.ESTIMATORS) == {"reinforce", "group_mean", "grpo", "rloo", "otb", "otb_loo"}
    b = make_batch(3, [4, 2, 1, 5], 7, process=True)
    kw = dict(token_rewards=torch.tensor(b["r"]), response_mask=torch.tensor(b["m"]),
              group_index=b["gid"], log_probs=torch.tensor(b["lp"]), sum_pi_sq=torch.tensor(b["spi"]))
    for name, fn in otb.ESTIMATORS.items():
        adv, ret = fn(**kw)
        assert adv.shape == ret.shape == kw["token_rewards"].shape, name
    _close(otb.ESTIMATORS["otb"](**kw)[0], naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"])[0])
    _close(otb.ESTIMATORS["otb_loo"](**kw)[0],
           naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], leave_one_out=True)[0])
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
# gradient_power and the benchmark's per-group loop
# =====================================================================================

def test_gradient_power_is_sum_of_w_times_squared_advantage():
    b = make_batch(8, [3, 4], 6, process=True)
    adv, _ = _otb(b)
    P = otb.gradient_power(adv, torch.tensor(b["m"]), torch.tensor(b["lp"]), torch.tensor(b["spi"]))
    w = np.clip(1 - 2 * np.exp(b["lp"]) + b["spi"], 0, 2)
    expected = [sum(w[i, t] * adv[i, t].item() ** 2 for t in range(6) if b["m"][i, t]) for i in range(7)]
    _close(P, np.array(expected))
    # constant advantage over the response: P = W(tau) A^2
    const = torch.tensor(b["m"]) * 2.0
    P_const = otb.gradient_power(const, torch.tensor(b["m"]), torch.tensor(b["lp"]), torch.tensor(b["spi"]))
    _close(P_const, 4.0 * (w * b["m"]).sum(1))


def _load_benchmark():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_estimators.py"
    spec = importlib.util.spec_from_file_location("bench_estimators", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_loop_reference_agrees_with_naive_loop():
    # The per-group loop the benchmark times against must itself be right.
    bench = _load_benchmark()
    b = make_batch(17, [4, 1, 3, 4, 2], 9, process=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    gid = torch.tensor([int(g.split("-")[1]) for g in b["gid"]])
    adv, ret = bench.loop_reference(t(b["r"]), t(b["m"]), gid, t(b["lp"]), t(b["spi"]))
    A, G = naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"])
    _close(adv, A)
    _close(ret, G)
