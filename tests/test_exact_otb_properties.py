"""Properties of otb.py that must hold whatever the implementation.

Checked without re-deriving the vectorised code: closed forms (equal lengths -> the baseline is the
W-weighted mean of returns; equal rewards -> zero advantage), invariances (leave-one-out ignores the
row's own data, row permutations, the form of ``group_index``, a constant importance weight), exact
zeros on padding, and the numerics of the logit-gradient proxy

    w_t = ||d log softmax(z)_y / dz||^2 = 1 - 2 pi_y + sum_k pi_k^2    (checked with autograd)

including why sum_k pi_k^2 must be computed in float32 when the logits are bf16.
The naive loops and the random batch generator come from ``tests/naive.py``.
"""
import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import otb
from naive import make_batch, naive_otb
from test_naive_otb import SETTINGS, _close, _otb, batch_args

# =====================================================================================
# Properties of the OTB baseline
# =====================================================================================

def _energy(b):
    w = np.clip(1 - 2 * np.exp(b["lp"]) + b["spi"], 0, 2)
    if b["isw"] is not None:
        w = w * b["isw"] ** 2
    return np.cumsum(w * b["m"], -1) * b["m"]  # W_t, (B, T)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(2, 8), min_size=1, max_size=3),
       n_pos=st.integers(1, 8), with_isw=st.booleans())
def test_equal_lengths_baseline_is_energy_weighted_mean_of_returns(seed, sizes, n_pos, with_isw):
    b = make_batch(seed, sizes, n_pos, process=True, with_isw=with_isw, equal_lengths=True)
    adv, ret = _otb(b)
    baseline = (ret - adv).numpy()  # B_t
    G, W = b["r"][:, ::-1].cumsum(-1)[:, ::-1], _energy(b)
    gid = np.array(b["gid"])
    for g in set(b["gid"]):
        rows = gid == g
        expected = (G[rows] * W[rows]).sum(0) / (W[rows].sum(0) + 1e-8)  # (T,)
        np.testing.assert_allclose(baseline[rows], np.broadcast_to(expected, baseline[rows].shape),
                                   rtol=0, atol=1e-9)


@SETTINGS
@given(args=batch_args)
def test_baseline_lies_between_the_groups_returns(args):
    # B_t is a W-weighted average of the active rows' returns (shrunk towards 0 by eps only).
    b = make_batch(**args)
    adv, ret = _otb(b)
    baseline, G, m = (ret - adv).numpy(), b["r"][:, ::-1].cumsum(-1)[:, ::-1], b["m"]
    gid = np.array(b["gid"])
    for i in range(len(gid)):
        rows = gid == gid[i]
        if rows.sum() == 1:
            continue
        for t in np.flatnonzero(m[i]):
            active = G[rows & (m[:, t] > 0), t]
            lo, hi = min(active.min(), 0.0), max(active.max(), 0.0)
            assert lo - 1e-9 <= baseline[i, t] <= hi + 1e-9


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
       n_pos=st.integers(1, 9), reward=st.sampled_from([-1.0, 0.5, 1.0, 3.0]))
def test_equal_rewards_in_group_give_zero_advantage(seed, sizes, n_pos, reward):
    b = make_batch(seed, sizes, n_pos, consistent=False)
    b["r"] = np.zeros_like(b["r"])
    last = b["m"].sum(1).astype(int) - 1
    b["r"][np.arange(len(last)), last] = reward  # same outcome reward for every row
    b["lp"] = np.full_like(b["lp"], math.log(0.5))  # w_t = 1 - 1 + 0.5 = 0.5: no tiny W
    b["spi"] = np.full_like(b["spi"], 0.5)
    adv, ret = _otb(b)
    gid = np.array(b["gid"])
    multi = np.array([(gid == g).sum() > 1 for g in gid])
    # groups of >= 2: A = R eps / (W + eps) ~ 0 everywhere, tail included (zero tail off)
    np.testing.assert_allclose(adv.numpy()[multi], 0.0, atol=1e-7)
    # singletons keep their return
    np.testing.assert_array_equal(adv.numpy()[~multi], ret.numpy()[~multi])
    # zero tail on: where a single row of the group is active, B = 0 so A = G = R
    adv_zt, _ = _otb(b, zero_tail=True)
    active = np.array([[b["m"][(gid == gid[i]), t].sum() for t in range(n_pos)] for i in range(len(gid))])
    tail = (active == 1) & (b["m"] > 0)
    np.testing.assert_array_equal(adv_zt.numpy()[tail], ret.numpy()[tail])
    np.testing.assert_allclose(adv_zt.numpy()[multi[:, None] & ~tail & (b["m"] > 0)], 0.0, atol=1e-7)


@pytest.mark.parametrize("name", sorted(otb.ESTIMATORS))
def test_padded_positions_are_exactly_zero_even_with_nan_there(name):
    b = make_batch(5, [3, 4, 1, 2], 10, process=True)
    pad = b["m"] == 0
    assert pad.any()
    for key in ["r", "lp", "spi"]:
        b[key] = np.where(pad, np.nan, b[key])
    adv, ret = otb.ESTIMATORS[name](
        token_rewards=torch.tensor(b["r"]), response_mask=torch.tensor(b["m"]), group_index=b["gid"],
        log_probs=torch.tensor(b["lp"]), sum_pi_sq=torch.tensor(b["spi"]))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[torch.tensor(pad)] == 0).all() and (ret[torch.tensor(pad)] == 0).all()
    assert (adv[torch.tensor(~pad)] != 0).any()


def test_padded_is_weights_may_be_nan_and_bool_mask_is_accepted():
    b = make_batch(6, [3, 5], 8, with_isw=True)
    pad = b["m"] == 0
    b["isw"] = np.where(pad, np.nan, b["isw"])
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    adv, ret = otb.optimal_token_baseline(t(b["r"]), torch.tensor(b["m"] > 0), b["gid"], t(b["lp"]),
                                          t(b["spi"]), is_weights=t(b["isw"]))
    A, G = naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"], np.nan_to_num(b["isw"]))
    _close(adv, A)
    _close(ret, G)


@SETTINGS
@given(args=batch_args, zero_tail=st.booleans(), row=st.integers(0, 1000),
       shift=st.sampled_from([-2.0, 0.7, 5.0]))
def test_leave_one_out_baseline_ignores_the_rows_own_data(args, zero_tail, row, shift):
    b = make_batch(**args)
    i = row % len(b["gid"])
    adv, ret = _otb(b, leave_one_out=True, zero_tail=zero_tail)
    changed = dict(b, r=b["r"].copy(), lp=b["lp"].copy())
    changed["r"][i] += shift * b["m"][i]  # the row's own return changes at every position
    changed["lp"][i] = np.log(0.05)  # and so does its energy
    adv2, ret2 = _otb(changed, leave_one_out=True, zero_tail=zero_tail)
    assert not torch.allclose(ret[i], ret2[i])
    np.testing.assert_allclose((ret2 - adv2)[i].numpy(), (ret - adv)[i].numpy(), rtol=0, atol=1e-9)


def test_leave_one_out_test_has_power_without_leave_one_out():
    # The same perturbation moves the row's own baseline when its own term is included.
    b = make_batch(2, [4], 6, equal_lengths=True)
    adv, ret = _otb(b)
    changed = dict(b, r=b["r"].copy())
    changed["r"][0, -1] += 3.0
    adv2, ret2 = _otb(changed)
    assert not np.allclose((ret2 - adv2)[0].numpy(), (ret - adv)[0].numpy())


def test_is_weights_of_one_change_nothing_and_a_constant_scale_cancels():
    b = make_batch(9, [3, 5, 2], 9, process=True)
    adv, _ = _otb(b)
    adv_ones, _ = _otb(dict(b, isw=np.ones_like(b["r"])))
    adv_scaled, _ = _otb(dict(b, isw=np.full_like(b["r"], 3.0)), eps=0.0)
    adv_plain, _ = _otb(b, eps=0.0)
    _close(adv_ones, adv.numpy())
    _close(adv_scaled, adv_plain.numpy(), atol=1e-12)


def test_rows_permutation_permutes_outputs():
    b = make_batch(13, [2, 6, 1, 3], 8, process=True, with_isw=True)
    perm = np.random.default_rng(0).permutation(len(b["gid"]))
    pb = dict(b, r=b["r"][perm], m=b["m"][perm], lp=b["lp"][perm], spi=b["spi"][perm],
              isw=b["isw"][perm], gid=[b["gid"][k] for k in perm])
    for kw in [{}, dict(zero_tail=True), dict(leave_one_out=True)]:
        adv, _ = _otb(b, **kw)
        padv, _ = _otb(pb, **kw)
        _close(padv, adv.numpy()[perm], atol=1e-12)


# =====================================================================================
# group_index forms
# =====================================================================================

def test_group_index_forms_give_identical_results():
    b = make_batch(21, [3, 1, 4, 2, 6], 7, process=True)
    codes = [int(g.split("-")[1]) for g in b["gid"]]
    labels = {0: 17, 1: -3, 2: 1000, 3: 5, 4: 0}  # arbitrary, non-contiguous ids
    forms = {
        "list of str": b["gid"],
        "list of int": [labels[c] for c in codes],
        "numpy object array": np.array(b["gid"], dtype=object),
        "numpy str array": np.array(b["gid"]),
        "tuple of str": tuple(b["gid"]),
        "numpy int array": np.array([labels[c] for c in codes]),
        "integer tensor": torch.tensor([labels[c] for c in codes]),
        "list of tuples": [("prompt", c) for c in codes],
    }
    r, m, lp, spi = (torch.tensor(b[k]) for k in ["r", "m", "lp", "spi"])
    reference = {name: fn(token_rewards=r, response_mask=m, group_index=b["gid"], log_probs=lp, sum_pi_sq=spi)[0]
                 for name, fn in otb.ESTIMATORS.items()}
    for form, ids in forms.items():
        for name, fn in otb.ESTIMATORS.items():
            adv, _ = fn(token_rewards=r, response_mask=m, group_index=ids, log_probs=lp, sum_pi_sq=spi)
            assert torch.equal(adv, reference[name]), f"{name} with group_index as {form}"


def test_every_estimator_checks_its_inputs_on_every_call():
    """One code path: no estimator takes a switch that skips its checks, and a NaN reward at a valid
    position raises in every one of them when the inputs come as train.py passes them (tensors, an
    integer tensor of group ids)."""
    b = make_batch(3, [2, 2], 4, process=True)
    kw = dict(token_rewards=torch.tensor(b["r"]), response_mask=torch.tensor(b["m"]),
              group_index=torch.tensor([0, 0, 1, 1]), log_probs=torch.tensor(b["lp"]), sum_pi_sq=torch.tensor(b["spi"]))
    for fn in (otb.optimal_token_baseline, otb.action_aligned_otb, otb.reinforce, otb.group_mean, otb.grpo, otb.rloo,
               otb.sum_pi_squared, otb.token_energy):
        assert "check" not in inspect.signature(fn).parameters, fn.__name__
    kw["token_rewards"][0, 0] = math.nan
    for name, fn in otb.ESTIMATORS.items():
        with pytest.raises(ValueError, match="token_rewards must be finite"):
            fn(**kw)


@pytest.mark.parametrize("name", ["otb", "otb_loo", "otb_zero_tail", "otb_tir", "otb_tir_zero_tail"])
def test_the_token_estimators_share_one_body_whose_helpers_take_at_most_four_positional_arguments(name):
    """Every OTB variant runs optimal_token_baseline's own lines (eqs. (1)-(6) are written once), and each
    private helper it enters takes at most four positional arguments (options beyond are by keyword)."""
    import sys
    b = make_batch(3, [2, 2], 4, process=True)
    entered = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == otb.__file__:
            entered.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        otb.ESTIMATORS[name](torch.tensor(b["r"]), torch.tensor(b["m"]), [0, 0, 1, 1], torch.tensor(b["lp"]),
                             torch.tensor(b["spi"]))
    finally:
        sys.setprofile(None)
    assert entered.count("optimal_token_baseline") == 1, entered
    helpers = {n for n in entered if n.startswith("_") and not n.startswith("__")}
    assert helpers >= {"_checked_inputs", "_token_energy"}, helpers
    for helper in helpers:
        params = inspect.signature(getattr(otb, helper)).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(positional) <= 4, (helper, [p.name for p in positional])


# =====================================================================================
# sum_k pi_k^2 and the token energy w_t
# =====================================================================================

def test_token_energy_is_clamped_to_0_2():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(2000, generator=g, dtype=torch.float64) * 30
    lp[:10] = 0.0
    spi = torch.rand(2000, generator=g, dtype=torch.float64) * 1.5  # inconsistent pairs on purpose
    w = otb.token_energy(lp, spi)
    raw = 1 - 2 * lp.exp() + spi
    assert ((w >= 0) & (w <= 2)).all()
    assert (raw < 0).any() and (raw > 2).any()  # the clamp was exercised both ways
    torch.testing.assert_close(w, raw.clamp(0, 2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [0.0, 0.1, 1.0, 10.0, 100.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_pi_squared_lies_in_1_over_V_to_1(scale, dtype):
    V = 50
    z = torch.randn(64, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * scale
    spi = otb.sum_pi_squared(z.to(dtype))
    assert spi.shape == (64,) and spi.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert (spi >= 1 / V - tol).all() and (spi <= 1 + tol).all()
    exact = torch.softmax(z.to(dtype).double(), -1).pow(2).sum(-1)
    torch.testing.assert_close(spi.double(), exact, rtol=0, atol=tol * 10)
    if scale == 0.0:
        torch.testing.assert_close(spi.double(), torch.full_like(exact, 1 / V), rtol=0, atol=tol)


@pytest.mark.parametrize("offset", [0.0, 20.0, 40.0])
def test_sum_pi_squared_float32_accuracy_does_not_degrade_with_logit_offset(offset):
    # softmax is shift invariant. Real LM logits sit at |z| ~ 10-40; in float32, logsumexp(z) ~ |z|
    # has an absolute rounding error ~|z| * 6e-8, so exp(lse(2z) - 2 lse(z)) computed *without*
    # subtracting max(z) first loses ~|z| * 1e-7 of absolute accuracy. The exact value of the
    # same (already rounded) float32 logits is the reference.
    g = torch.Generator().manual_seed(2)
    z = (torch.randn(256, 32, generator=g) * 3 + offset).float()  # (N, V)
    exact = torch.softmax(z.double(), -1).pow(2).sum(-1)
    err = (otb.sum_pi_squared(z).double() - exact).abs().max().item()
    assert err <= 1e-6, f"offset {offset}: float32 sum pi^2 off by {err:.2e}"


def test_sum_pi_squared_takes_each_logit_vector_on_its_own():
    """(..., V) -> (...): any leading shape, each vector's value that of the vector alone."""
    g = torch.Generator().manual_seed(3)
    for shape in [(5, 7, 11), (5, 11), (1, 3, 4), (11,)]:
        z = torch.randn(*shape, generator=g) * 4
        spp = otb.sum_pi_squared(z)
        assert spp.shape == shape[:-1]
        one_by_one = torch.stack([otb.sum_pi_squared(v) for v in z.reshape(-1, shape[-1])])
        torch.testing.assert_close(spp.reshape(-1), one_by_one, rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype,expected", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                            (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
def test_sum_pi_squared_output_dtype(dtype, expected):
    z = torch.randn(4, 3, 9).to(dtype)
    assert otb.sum_pi_squared(z).dtype == expected


def _confident_bf16_logits(n=4096, V=64, seed=4):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=g) * 2
    y = torch.randint(0, V, (n,), generator=g)
    z[torch.arange(n), y] += torch.linspace(0, 14, n)  # from unsure to very confident on token y
    return z.to(torch.bfloat16), y


def test_bf16_logits_are_computed_in_float32():
    zb, y = _confident_bf16_logits()
    z32 = zb.float()  # the same logits, upcast exactly
    spi = otb.sum_pi_squared(zb)
    assert spi.dtype == torch.float32
    torch.testing.assert_close(spi, otb.sum_pi_squared(z32), rtol=0, atol=1e-6)
    lp = torch.log_softmax(z32, -1).gather(-1, y[:, None])[:, 0]
    w = otb.token_energy(lp, spi)
    assert (w >= 0).all()
    pd = torch.softmax(z32.double(), -1)
    exact_w = 1 - 2 * pd.gather(-1, y[:, None])[:, 0] + pd.pow(2).sum(-1)
    # float32-level accuracy (the exact 1e-6 bound on sum pi^2 is the offset test's job)
    assert (w.double() - exact_w).abs().max().item() <= 1e-5


def test_naive_bf16_energy_goes_wrong_for_confident_tokens():
    # The failure otb.py avoids: softmax, square and sum all in bf16 (8 mantissa bits).
    zb, y = _confident_bf16_logits()
    p = torch.softmax(zb, -1)  # bf16
    w_naive = 1 - 2 * p.gather(-1, y[:, None])[:, 0] + (p * p).sum(-1)  # bf16 throughout
    pd = torch.softmax(zb.double(), -1)
    exact_w = 1 - 2 * pd.gather(-1, y[:, None])[:, 0] + pd.pow(2).sum(-1)
    err = (w_naive.double() - exact_w).abs()
    confident = exact_w < 0.01
    assert confident.sum() > 100
    assert (w_naive < 0).any() or (err[confident] / exact_w[confident] > 0.5).any()
    assert err.max().item() > 1e-3  # 1000x the float32 path's error bound above


@pytest.mark.parametrize("V", [2, 7, 50])
@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])
def test_logit_gradient_proxy_equals_autograd_norm(V, scale):
    g = torch.Generator().manual_seed(V)
    z = (torch.randn(32, V, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
    y = torch.randint(0, V, (32,), generator=g)
    lp = torch.log_softmax(z, -1).gather(-1, y[:, None])[:, 0]  # log pi(y), (N,)
    (grad,) = torch.autograd.grad(lp.sum(), z)  # row n: d lp_n / d z_n (rows independent)
    sq_norm = grad.pow(2).sum(-1)  # ||e_y - pi||^2
    w = otb.token_energy(lp.detach(), otb.sum_pi_squared(z.detach()))
    torch.testing.assert_close(w, sq_norm, rtol=0, atol=1e-12)
    w32 = otb.token_energy(lp.detach().float(), otb.sum_pi_squared(z.detach().float()))
    torch.testing.assert_close(w32.double(), sq_norm, rtol=0, atol=1e-5)
