"""The equal-token study's endpoints on hand-made histories (benchmarks/equal_tokens.py)."""
import math

import pytest

from benchmarks import equal_tokens as et


def make_history(step_tokens, successes):
    out, total = [], 0
    for i, (d, s) in enumerate(zip(step_tokens, successes)):
        total += d
        out.append(dict(step=i + 1, tokens=total, success=s))
    return out


def test_endpoints_cut_at_the_budget_and_weight_steps_by_tokens():
    B = et.BUDGET
    # 8 steps of B/8 tokens: success 0 in the first 6, then 0.5 and 1.0; two more steps past the budget
    h = make_history([B // 8] * 10, [0, 0, 0, 0, 0, 0, 0.5, 1.0, 1.0, 1.0])
    e = et.endpoints(h)
    assert e["steps"] == 8 and e["tokens_used"] == B and e["reached_budget"]
    assert e["primary"] == pytest.approx(0.75)  # steps 7 and 8 lie in (0.75 B, B]
    assert e["auc"] == pytest.approx(1.5 / 8)
    # trailing window of 25,000 tokens < B/8 = 31,200: it holds one step; 0.5 reached at step 7
    assert e["tokens_to_target"] == 7 * (B // 8)


def test_unequal_steps_are_weighted_by_their_tokens():
    B = et.BUDGET
    h = make_history([B // 2, B // 4, B // 8, B // 8], [0.0, 0.0, 1.0, 0.0])
    e = et.endpoints(h)
    assert e["auc"] == pytest.approx((B // 8) / B)
    assert e["primary"] == pytest.approx(0.5)  # last two steps, equal tokens, success 1 and 0


def test_a_target_never_reached_is_none_and_paired_intervals_follow_t():
    h = make_history([10_000] * 5, [0.1] * 5)
    assert et.endpoints(h)["tokens_to_target"] is None
    mu, se = et.mean_se([1.0, 2.0, 3.0])
    assert mu == 2.0 and se == pytest.approx(1 / math.sqrt(3))
