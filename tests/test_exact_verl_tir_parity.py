"""Parity with verl 0.9.1's own OTB functions on responses with holes (tool output, mask 0 inside).

``tests/data/verl_tir_reference_vectors.json`` holds what verl's
``compute_optimal_token_baseline_advantage`` (stored as ``otb``, ``otb_zero_tail``) and
``compute_multi_turn_optimal_token_baseline_advantage`` (``otb_tir``, ``otb_tir_zero_tail``) return
on six batches, computed by running verl's own code (``tests/data/make_verl_tir_vectors.py`` has
the commands; the tests only read the JSON). Checked to 1e-6:

- ``otb_tir`` (otb.action_aligned_otb) equals verl's multi-turn function, zero tail off and on,
  with importance weights, process rewards (some inside the holes), empty rows and singletons; the
  one departure, a group in which only one row has valid tokens (zero tail off), is checked to be
  exactly that and nothing else;
- ``otb`` equals verl's position-aligned function with zero tail off, holes included. With zero
  tail on, verl's rule (the row with the most valid tokens loses its baseline from the position
  equal to the runner-up's count of valid tokens) is "only one row left" for right-padded rows
  only; with holes the two rules differ, and the outputs are equal everywhere outside both rules;
- returns at valid positions (verl's returns at a hole hold the rewards after it; ours are 0 at
  every masked position).
"""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import otb

DATA = json.loads((Path(__file__).parent / "data" / "verl_tir_reference_vectors.json").read_text())
CASES = DATA["cases"]
TOL = 1e-6
FUNCTIONS = {"otb": otb.optimal_token_baseline, "otb_tir": otb.action_aligned_otb}


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _run(case, fn, dtype=torch.float64, **kw):
    isw = case.get("rollout_is_weights")
    return fn(_t(case["token_level_rewards"], dtype), _t(case["response_mask"], dtype),
              list(case["group_index"]), _t(case["old_log_probs"], dtype), _t(case["sum_pi_squared"], dtype),
              is_weights=None if isw is None else _t(isw, dtype), **kw)


def _max_err(actual, expected, where):
    """max |actual - expected| over the positions where ``where`` holds (0 if there are none)."""
    d = (actual.double() - _t(expected)).abs()[torch.as_tensor(where)]
    return d.max().item() if d.numel() else 0.0


def _holes(m):
    """Masked positions before a row's last valid token, (B, T) bool."""
    m = np.asarray(m) > 0
    return ~m & (np.cumsum(m[:, ::-1], 1)[:, ::-1] > 0)


def _groups(case):
    """{prompt id: its rows}."""
    rows = {}
    for i, g in enumerate(case["group_index"]):
        rows.setdefault(g, []).append(i)
    return rows


def lonely_rows(case):
    """Rows that are the only row with a valid token in a group of two or more rows."""
    count = np.asarray(case["response_mask"]).sum(1)
    return [i for rows in _groups(case).values() if len(rows) > 1
            for i in rows if count[i] > 0 and sum(count[j] > 0 for j in rows) == 1]


def test_reference_file_is_verl_0_9_1_and_has_the_documented_cases():
    assert DATA["verl"]["version"] == "0.9.1" and len(DATA["verl"]["wheel_sha256"]) == 64
    assert set(CASES) == {"tool_holes", "tool_holes_process_rewards", "tool_holes_is_weights",
                          "tool_holes_large", "right_padded", "one_row_with_actions"}
    for name, case in CASES.items():
        assert set(case["expected"]) == {"otb", "otb_zero_tail", "otb_tir", "otb_tir_zero_tail"}
        assert _holes(case["response_mask"]).any() == (name != "right_padded"), name
    assert "rollout_is_weights" in CASES["tool_holes_is_weights"]
    masks = [np.asarray(c["response_mask"]) for c in CASES.values()]
    assert sum(int((m.sum(1) == 0).sum()) for m in masks) >= 3  # rows with no valid token at all
    assert any(min(Counter(c["group_index"]).values()) == 1 for c in CASES.values())  # a singleton group
    # the two verl functions really differ on these batches: alignment matters
    for name in set(CASES) - {"right_padded"}:
        e = CASES[name]["expected"]
        assert np.abs(np.subtract(e["otb"]["advantages"], e["otb_tir"]["advantages"])).max() > 0.1, name


# =====================================================================================
# otb_tir: verl's compute_multi_turn_optimal_token_baseline_advantage
# =====================================================================================

@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("zero_tail", [False, True])
def test_otb_tir_matches_verl_multi_turn(case_name, zero_tail):
    case = CASES[case_name]
    exp = case["expected"]["otb_tir_zero_tail" if zero_tail else "otb_tir"]
    adv, ret = _run(case, otb.ESTIMATORS["otb_tir"], zero_tail=zero_tail)
    m = _t(case["response_mask"]) > 0
    others = torch.ones_like(m)
    if not zero_tail:
        others[lonely_rows(case)] = False  # the departure, next test
    assert _max_err(adv, exp["advantages"], others) <= TOL, f"{case_name}: advantages"
    assert _max_err(ret, exp["returns"], m) <= TOL, f"{case_name}: returns at valid tokens"
    assert (ret[~m] == 0).all() and (adv[~m] == 0).all()


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_the_zero_tail_estimators_by_name_are_verls_default(case_name):
    """verl 0.9.1 runs its two OTB functions with handle_zero_tail=True (their default; the trainer never
    passes it): otb_tir_zero_tail equals verl's multi-turn function so run, everywhere, and
    otb_zero_tail its position-aligned one wherever there are no holes."""
    case = CASES[case_name]
    exp = case["expected"]
    adv, ret = _run(case, otb.ESTIMATORS["otb_tir_zero_tail"])
    assert _max_err(adv, exp["otb_tir_zero_tail"]["advantages"], torch.ones_like(adv, dtype=torch.bool)) <= TOL
    if not _holes(case["response_mask"]).any():
        adv, _ = _run(case, otb.ESTIMATORS["otb_zero_tail"])
        assert _max_err(adv, exp["otb_zero_tail"]["advantages"], torch.ones_like(adv, dtype=torch.bool)) <= TOL


def test_otb_tir_departs_from_verl_only_for_a_groups_one_row_with_actions():
    # verl's multi-turn function leaves rows without a valid token out of their group, so the one
    # row of actions in a group of two is a singleton there: B = 0, A = G. Here the group has two
    # rows, as in position-aligned OTB (verl's too): B_k = G_k W_k / (W_k + eps), so
    # A_k = G_k eps / (W_k + eps).
    assert all(lonely_rows(CASES[name]) == [] for name in CASES if name != "one_row_with_actions")
    case = CASES["one_row_with_actions"]
    assert len(lonely_rows(case)) == 1
    i = lonely_rows(case)[0]
    m = _t(case["response_mask"])[i] > 0  # the row's actions, (T,)
    verl_adv, verl_ret = (_t(case["expected"]["otb_tir"][k])[i][m] for k in ("advantages", "returns"))
    assert (verl_adv - verl_ret).abs().max() <= TOL  # verl: A = G
    adv, ret = _run(case, otb.action_aligned_otb)
    G = ret[i][m]  # = verl's returns (test above)
    w = (1 - 2 * _t(case["old_log_probs"])[i][m].exp() + _t(case["sum_pi_squared"])[i][m]).clamp(0, 2)
    W = w.cumsum(0)  # W_k over the row's actions
    assert (adv[i][m] - G * 1e-8 / (W + 1e-8)).abs().max() <= 1e-12  # here: A ~ 0
    assert G.abs().max() > 0.1  # so the departure is real


# =====================================================================================
# otb: verl's compute_optimal_token_baseline_advantage, aligned by position
# =====================================================================================

@pytest.mark.parametrize("case_name", sorted(CASES))
def test_otb_matches_verl_position_aligned_with_holes(case_name):
    case = CASES[case_name]
    exp = case["expected"]["otb"]
    adv, ret = _run(case, otb.ESTIMATORS["otb"])
    m = _t(case["response_mask"]) > 0
    assert _max_err(adv, exp["advantages"], torch.ones_like(m)) <= TOL, f"{case_name}: advantages"
    assert _max_err(ret, exp["returns"], m) <= TOL, f"{case_name}: returns at valid tokens"


def zero_tail_rules(case):
    """(ours, verl's): the valid positions whose baseline each zero-tail rule sets to 0, (B, T) bool.

    ours: only one row of a group of two or more is active at t. verl's: in a group of two or more,
    the one row with the most valid tokens, from position (runner-up's count of valid tokens) on."""
    m = np.asarray(case["response_mask"]) > 0
    count = m.sum(1)
    ours, theirs = np.zeros_like(m), np.zeros_like(m)
    for rows in _groups(case).values():
        if len(rows) < 2:
            continue
        ours[rows] = m[rows] & (m[rows].sum(0) == 1)
        top = sorted(count[rows])
        longest = [i for i in rows if count[i] == top[-1]]
        if len(longest) == 1 and top[-1] > top[-2]:
            theirs[longest[0], top[-2]:] = m[longest[0], top[-2]:]
    return ours, theirs


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_otb_zero_tail_matches_verl_outside_the_two_rules(case_name):
    case = CASES[case_name]
    exp = case["expected"]["otb_zero_tail"]
    adv, ret = _run(case, otb.optimal_token_baseline, zero_tail=True)
    ours, theirs = zero_tail_rules(case)
    assert _max_err(adv, exp["advantages"], ~(ours | theirs)) <= TOL
    assert _max_err(adv, ret.tolist(), ours) == 0.0  # our rule: B = 0, A = G
    assert _max_err(_t(exp["advantages"]), exp["returns"], theirs) <= TOL  # verl's rule: B = 0 there
    if not _holes(case["response_mask"]).any():
        assert (ours == theirs).all()  # right-padded: the same rule


def test_the_two_zero_tail_rules_differ_with_holes():
    # so the previous test's exception is needed, and is exercised
    assert sum(int((np.not_equal(*zero_tail_rules(c))).sum()) for c in CASES.values()) > 0


# =====================================================================================
# Without holes the two are one; float32 inputs
# =====================================================================================

def test_without_holes_otb_tir_is_otb_and_verls_two_functions_agree():
    case = CASES["right_padded"]
    for zt in ("", "_zero_tail"):
        a, b = case["expected"]["otb" + zt], case["expected"]["otb_tir" + zt]
        assert np.abs(np.subtract(a["advantages"], b["advantages"])).max() <= 1e-12
        ours = [_run(case, fn, zero_tail=bool(zt)) for fn in FUNCTIONS.values()]
        assert torch.equal(ours[0][0], ours[1][0]) and torch.equal(ours[0][1], ours[1][1])


@pytest.mark.parametrize("case_name", sorted(set(CASES) - {"one_row_with_actions"}))
def test_otb_tir_float32_inputs_match_verl(case_name):
    case = CASES[case_name]
    exp = case["expected"]["otb_tir"]
    adv, _ = _run(case, otb.action_aligned_otb, torch.float32)
    assert adv.dtype == torch.float32
    scale = 1.0 + np.abs(exp["returns"]).max()
    assert _max_err(adv, exp["advantages"], torch.ones(adv.shape, dtype=torch.bool)) <= 1e-5 * scale
