"""Parity with the reference vectors computed with the widely used (verl) formulas.

``tests/data/verl_reference_vectors.json.gz`` (the shared reference file, gzipped byte for byte) holds five cases (outcome rewards, interleaved groups of
sizes 1 to 8, sparse process rewards, importance weights, a larger batch). Each case stores the
inputs and, computed independently in float64, the expected OTB advantages/returns (zero tail off
and on), the GRPO / Dr.GRPO (group mean) / RLOO advantages and sum_k pi_k^2 from the stored logits.
Every (case, estimator) pair is its own test, so a failure names both.
"""
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import otb

DATA = json.loads(gzip.decompress((Path(__file__).parent / "data" / "verl_reference_vectors.json.gz").read_bytes()))
CASES = DATA["cases"]
TOL = 1e-6


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _inputs(case, dtype=torch.float64):
    return dict(
        token_rewards=_t(case["token_level_rewards"], dtype),
        response_mask=_t(case["response_mask"], dtype),
        group_index=list(case["group_index"]),
    )


def _assert_close(actual, expected, what):
    actual = actual.detach().to(torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual - expected).abs().max().item()
    assert err <= TOL, f"{what}: max abs error {err:.3e} > {TOL:g}"


def test_reference_file_has_the_documented_cases():
    # Guards against silently testing nothing if the data file is truncated.
    assert set(CASES) >= {"outcome_small", "outcome_mixed_groups", "process_rewards",
                          "with_is_weights", "outcome_large"}
    assert "rollout_is_weights" in CASES["with_is_weights"]
    # at least one case contains a singleton group, so the singleton rules are exercised
    assert any(min(Counter(c["group_index"]).values()) == 1 for c in CASES.values())


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("variant,zero_tail", [("otb", False), ("otb_zero_tail", True)])
def test_otb_matches_reference(case_name, variant, zero_tail):
    case = CASES[case_name]
    kwargs = _inputs(case)
    is_w = case.get("rollout_is_weights")
    adv, ret = otb.optimal_token_baseline(
        **kwargs,
        log_probs=_t(case["old_log_probs"]),
        sum_pi_sq=_t(case["sum_pi_squared"]),
        is_weights=None if is_w is None else _t(is_w),
        zero_tail=zero_tail,
    )
    exp = case["expected"][variant]
    _assert_close(adv, _t(exp["advantages"]), f"{case_name}/{variant} advantages")
    _assert_close(ret, _t(exp["returns"]), f"{case_name}/{variant} returns")


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_otb_float32_inputs_match_reference(case_name):
    # The same check with float32 tensors (what a training loop passes); looser tolerance.
    case = CASES[case_name]
    is_w = case.get("rollout_is_weights")
    adv, ret = otb.optimal_token_baseline(
        **_inputs(case, torch.float32),
        log_probs=_t(case["old_log_probs"], torch.float32),
        sum_pi_sq=_t(case["sum_pi_squared"], torch.float32),
        is_weights=None if is_w is None else _t(is_w, torch.float32),
    )
    exp = case["expected"]["otb"]
    scale = 1.0 + _t(exp["returns"]).abs().max().item()
    assert (adv.double() - _t(exp["advantages"])).abs().max().item() <= 1e-5 * scale
    assert (ret.double() - _t(exp["returns"])).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("name", ["grpo", "group_mean", "rloo"])
def test_group_estimators_match_reference(case_name, name):
    case = CASES[case_name]
    adv, _ = getattr(otb, name)(**_inputs(case))
    _assert_close(adv, _t(case["expected"][name]["advantages"]), f"{case_name}/{name} advantages")


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("name", ["otb", "grpo", "group_mean", "rloo"])
def test_estimators_dict_matches_reference(case_name, name):
    # ESTIMATORS[name] called the way train.py calls it gives the reference advantages.
    case = CASES[case_name]
    extra = {}
    if name == "otb" and "rollout_is_weights" in case:  # OTB's reference used the IS weights
        extra["is_weights"] = _t(case["rollout_is_weights"])
    adv, _ = otb.ESTIMATORS[name](
        **_inputs(case),
        log_probs=_t(case["old_log_probs"]),
        sum_pi_sq=_t(case["sum_pi_squared"]),
        **extra,
    )
    _assert_close(adv, _t(case["expected"][name]["advantages"]), f"ESTIMATORS[{name!r}] on {case_name}")


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_sum_pi_squared_matches_reference(case_name):
    case = CASES[case_name]
    spi = otb.sum_pi_squared(_t(case["logits"]))  # (B, T) from (B, T, V) float64 logits
    assert spi.dtype == torch.float64
    _assert_close(spi, _t(case["sum_pi_squared"]), f"{case_name} sum_pi_squared")


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_sum_pi_squared_float32_logits(case_name):
    # float32 logits are already rounded (|z| * 6e-8), which alone moves sum pi^2 by ~1e-6; so the
    # float32 result is compared with the exact softmax of the *same rounded* logits.
    case = CASES[case_name]
    logits = _t(case["logits"], torch.float32)
    spi = otb.sum_pi_squared(logits)
    assert spi.dtype == torch.float32
    exact = torch.softmax(logits.double(), -1).pow(2).sum(-1)
    err = (spi.double() - exact).abs().max().item()
    assert err <= 2e-6, f"{case_name}: float32 sum_pi_squared off by {err:.2e}"  # see test_naive_otb.py shift test
    assert (spi.double() - _t(case["sum_pi_squared"])).abs().max().item() <= 1e-5


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_stored_log_probs_are_the_sampled_tokens_log_softmax(case_name):
    # The OTB inputs are consistent with the logits: w_t computed from the logits through
    # token_energy agrees with the stored log-probs / sum pi^2 pair.
    case = CASES[case_name]
    logits = _t(case["logits"])
    tokens = torch.tensor(case["tokens"])
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    w_from_logits = otb.token_energy(lp, otb.sum_pi_squared(logits))
    w_from_store = otb.token_energy(_t(case["old_log_probs"]), _t(case["sum_pi_squared"]))
    _assert_close(w_from_logits, w_from_store.double(), f"{case_name} token energy")
