"""Responses with holes: tool output (mask 0) inside a response, for every estimator and diagnostic.

In tool-integrated reasoning the environment inserts a tool's output into a response; those tokens
are not the policy's actions and carry mask 0 *inside* the response, not only as right padding.
``naive.insert_holes`` makes such a batch from a right-padded one (garbage in the holes: NaN
log-probs and sum pi^2, reward 7), so every batch comes with its compacted twin: the same responses
without the tool output.

- ``otb_tir`` (otb.action_aligned_otb) against the plain loop over k, ``naive_otb_by_action``, with
  every option, and position-aligned OTB against its own loop (which never assumed right padding);
- on a batch with holes otb_tir gives each action what OTB gives it on the compacted twin; without
  holes it is OTB bit for bit; with holes it differs from position-aligned OTB;
- the group baselines: each row's advantages are those of its compacted twin, 0 on masked positions.

The diagnostics with holes are tested in ``test_naive_diagnostics.py``.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import otb
from naive import insert_holes, make_batch, naive_otb, naive_otb_by_action
from test_naive_otb import SETTINGS, _close, batch_args


def _t(x, dtype=torch.float64):
    return None if x is None else torch.tensor(x, dtype=dtype)


def _kw(b, dtype=torch.float64):
    return dict(token_rewards=_t(b["r"], dtype), response_mask=_t(b["m"], dtype), group_index=b["gid"],
                log_probs=_t(b["lp"], dtype), sum_pi_sq=_t(b["spi"], dtype))


def _at_actions(x, where):
    """x (B, T') of the batch with holes read at the positions of the twin's tokens: (B, T)."""
    return torch.as_tensor(x).gather(-1, torch.as_tensor(where))


# =====================================================================================
# OTB aligned by the policy's own tokens
# =====================================================================================

@pytest.mark.parametrize("name, naive", [("otb_tir", naive_otb_by_action), ("otb", naive_otb)])
@SETTINGS
@given(args=batch_args, hole_seed=st.integers(0, 2**16), leave_one_out=st.booleans(), zero_tail=st.booleans())
def test_otb_with_holes_matches_its_naive_loop(name, naive, args, hole_seed, leave_one_out, zero_tail):
    # otb_tir against the loop over k; position-aligned otb against its loop over t
    b, _ = insert_holes(make_batch(**args), hole_seed)
    adv, ret = otb.ESTIMATORS[name](**_kw(b), is_weights=_t(b["isw"]), leave_one_out=leave_one_out,
                                    zero_tail=zero_tail)
    A, G = naive(b["r"], b["m"], b["gid"], b["lp"], b["spi"], b["isw"], leave_one_out=leave_one_out,
                 zero_tail=zero_tail)
    _close(adv, A)
    _close(ret, G)


@SETTINGS
@given(args=batch_args, hole_seed=st.integers(0, 2**16), zero_tail=st.booleans())
def test_otb_tir_with_holes_is_otb_of_the_compacted_twin(args, hole_seed, zero_tail):
    twin = make_batch(**args)
    b, where = insert_holes(twin, hole_seed)
    adv, ret = otb.ESTIMATORS["otb_tir"](**_kw(b), is_weights=_t(b["isw"]), zero_tail=zero_tail)
    A, G = otb.optimal_token_baseline(**_kw(twin), is_weights=_t(twin["isw"]), zero_tail=zero_tail)
    _close(_at_actions(adv, where), A.numpy(), atol=1e-12)
    _close(_at_actions(ret, where), G.numpy(), atol=1e-12)
    masked = torch.tensor(b["m"]) == 0
    assert (adv[masked] == 0).all() and (ret[masked] == 0).all()


@SETTINGS
@given(args=batch_args, leave_one_out=st.booleans(), zero_tail=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_otb_tir_without_holes_is_otb_bit_for_bit(args, leave_one_out, zero_tail, dtype):
    b = make_batch(**args)
    opts = dict(is_weights=_t(b["isw"], dtype), leave_one_out=leave_one_out, zero_tail=zero_tail)
    adv, ret = otb.ESTIMATORS["otb_tir"](**_kw(b, dtype), **opts)
    A, G = otb.optimal_token_baseline(**_kw(b, dtype), **opts)
    assert adv.dtype == A.dtype and torch.equal(adv, A) and torch.equal(ret, G)


def test_otb_tir_with_holes_differs_from_position_aligned_otb():
    # The alignment matters: the same batch with holes, aligned by position and by action.
    b, _ = insert_holes(make_batch(5, [4, 3, 4], 8, process=True), seed=0)
    by_action = otb.action_aligned_otb(**_kw(b))[0]
    by_position = otb.optimal_token_baseline(**_kw(b))[0]
    assert (by_action - by_position).abs().max() > 0.05
    _close(by_position, naive_otb(b["r"], b["m"], b["gid"], b["lp"], b["spi"])[0])


def test_otb_tir_checks_its_inputs_like_otb():
    # Errors name the position in the caller's batch (with holes), not in the compacted one.
    b, _ = insert_holes(make_batch(1, [3, 2], 5), seed=1)
    kw = _kw(b)
    m = kw["response_mask"]
    i, t = next((i, t) for i, t in m.nonzero().tolist() if m[i, :t].sum() < t)  # a valid token after a hole
    kw["log_probs"][i, t] = 0.5
    with pytest.raises(ValueError, match=rf"^log_probs must be finite and <= 0, found 0.5 at valid position "
                                         rf"\({i}, {t}\)$"):
        otb.action_aligned_otb(**kw)
    with pytest.raises(ValueError, match=r"^response_mask has shape"):
        otb.action_aligned_otb(**{**kw, "response_mask": m[:, :-1]})


# =====================================================================================
# Group baselines: one number per response, over its valid tokens only
# =====================================================================================

@SETTINGS
@given(args=batch_args, hole_seed=st.integers(0, 2**16),
       name=st.sampled_from(["reinforce", "group_mean", "grpo", "rloo"]))
def test_group_baselines_with_holes_equal_the_compacted_twin(args, hole_seed, name):
    twin = make_batch(**args)
    b, where = insert_holes(twin, hole_seed)
    adv, ret = otb.ESTIMATORS[name](**_kw(b))
    A, R = otb.ESTIMATORS[name](**_kw(twin))
    _close(_at_actions(adv, where), A.numpy(), atol=1e-12)
    _close(_at_actions(ret, where), R.numpy(), atol=1e-12)
    masked = torch.tensor(b["m"]) == 0
    assert (adv[masked] == 0).all() and (ret[masked] == 0).all()  # the reward 7 in the holes never counts


@pytest.mark.saved_results
def test_the_alignment_figures_baselines_are_the_hand_computed_ones():
    """benchmarks/alignment_figure.py (docs/tool_use.md's teaching figure): with w = 0.5 on every action
    and R = 1, 0, by action the shared k get (1 W + 0 W) / (2 W) = 1/2; by position a row alone is its
    own return and at t = 8..10 the weights are the rows' action counts so far, 7:4, 8:5, 9:6. The
    committed baselines.json is what the script computes."""
    import json
    from pathlib import Path
    from benchmarks import alignment_figure
    out, m = alignment_figure.baselines()
    nan = float("nan")
    by_position = [[.5, .5, .5, nan, nan, 1, 1, 1, 7 / 11, 8 / 13, 9 / 15, nan],
                   [.5, .5, .5, nan, nan, nan, nan, nan, 7 / 11, 8 / 13, 9 / 15, 0]]
    by_action = [[.5, .5, .5, nan, nan, .5, .5, .5, .5, 1, 1, nan],
                 [.5, .5, .5, nan, nan, nan, nan, nan, .5, .5, .5, .5]]
    torch.testing.assert_close(out["otb"], torch.tensor(by_position), equal_nan=True, rtol=0, atol=1e-6)
    torch.testing.assert_close(out["otb_tir"], torch.tensor(by_action), equal_nan=True, rtol=0, atol=1e-6)
    saved = json.loads((Path(__file__).parent.parent / "benchmarks/results/alignment/baselines.json").read_text())
    for name, rows in saved["baselines"].items():
        torch.testing.assert_close(torch.tensor([[nan if v is None else v for v in r] for r in rows]), out[name],
                                   equal_nan=True, rtol=0, atol=1e-6)


def test_alignment_gaps_alone_counts_the_actions_without_a_partner():
    """benchmarks/alignment_gap.alone on the teaching figure's group: by position, row 0's actions at
    t = 5..7 (row 1's tool reply) and row 1's at t = 11 (row 0's padding) are alone; by action, only
    row 0's 8th and 9th actions (row 1 has 7)."""
    from benchmarks import alignment_figure, alignment_gap
    m = alignment_figure.group()["response_mask"]
    gid = torch.zeros(2, dtype=torch.long)
    by_position = alignment_gap.alone(m, gid)
    assert by_position.nonzero().tolist() == [[0, 5], [0, 6], [0, 7], [1, 11]]
    at_k = torch.argsort(m == 0, dim=-1, stable=True)
    assert alignment_gap.alone(m.gather(-1, at_k), gid).nonzero().tolist() == [[0, 7], [0, 8]]  # k = 8, 9
