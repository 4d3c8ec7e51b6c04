"""Bad input gets a ValueError that names the argument and the problem.

One test per case. Each asserts the argument's name through ``pytest.raises(..., match=name)`` and
the problem through a second, loose pattern on the same message (so either can fail). The last
tests check the opposite: NaN at padded positions and log-probs a rounding error above 0 are fine.
"""
import math
import re

import pytest
import torch

import otb

ROWS, POS = 4, 5
SEQUENCE_ESTIMATORS = ["reinforce", "group_mean", "grpo", "rloo"]


def good():
    """A valid batch: two groups of two, lengths 5, 3, 1, 4."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 1, 4])
    mask = (torch.arange(POS)[None, :] < lengths[:, None]).float()  # (B, T)
    rewards = torch.zeros(ROWS, POS)
    rewards[torch.arange(ROWS), lengths - 1] = torch.tensor([1.0, 0.0, 1.0, 0.5])
    return dict(
        token_rewards=rewards,
        response_mask=mask,
        group_index=["a", "b", "a", "b"],
        log_probs=-torch.rand(ROWS, POS, generator=g) - 0.1,
        sum_pi_sq=torch.rand(ROWS, POS, generator=g) * 0.5 + 0.2,
        is_weights=torch.rand(ROWS, POS, generator=g) + 0.5,
    )


def call_otb(**changes):
    kw = good()
    kw.update(changes)
    return otb.optimal_token_baseline(**kw)


def call_seq(name, **changes):
    kw = good()
    kw.update(changes)
    return getattr(otb, name)(kw["token_rewards"], kw["response_mask"], kw["group_index"])


def raises(arg, problem):
    """Context manager: ValueError whose message names `arg` and matches `problem`."""
    class _Check:
        def __enter__(self):
            self.cm = pytest.raises(ValueError, match=re.escape(arg))
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self.cm.__exit__(*exc)
            message = str(self.info.value)
            assert re.search(problem, message, re.IGNORECASE), f"{message!r} does not say {problem!r}"
            return suppressed
    return _Check()


SHAPE = r"shape|size"
FINITE = r"nan|inf|finite"

# ------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("arg", ["response_mask", "log_probs", "sum_pi_sq", "is_weights"])
def test_otb_shape_mismatch_names_the_argument(arg):
    with raises(arg, SHAPE):
        call_otb(**{arg: good()[arg][:, :-1]})


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_shape_mismatch(name):
    with raises("response_mask", SHAPE):
        call_seq(name, response_mask=good()["response_mask"][:-1])


def test_inputs_not_2d():
    kw = good()
    flat = {k: kw[k][0] for k in ["token_rewards", "response_mask", "log_probs", "sum_pi_sq", "is_weights"]}
    with raises("token_rewards", r"2-?d|dim"):
        call_otb(**flat, group_index=["a"])


def test_log_probs_3d_is_rejected():
    with raises("log_probs", r"2-?d|dim|shape"):
        call_otb(log_probs=good()["log_probs"][..., None])


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_inputs_not_2d(name):
    kw = good()
    with raises("token_rewards", r"2-?d|dim"):
        call_seq(name, token_rewards=kw["token_rewards"][None], response_mask=kw["response_mask"][None])


# ------------------------------------------------------------------------------ group_index


@pytest.mark.parametrize("ids", [["a", "b", "a"], ["a"] * 5, torch.tensor([0, 1, 0]), []],
                         ids=["short list", "long list", "short tensor", "empty list"])
def test_group_index_length_differs_from_batch(ids):
    with raises("group_index", r"length|len|rows|batch|\b4\b"):
        call_otb(group_index=ids)


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_group_index_length(name):
    with raises("group_index", r"length|len|rows|batch|\b4\b"):
        call_seq(name, group_index=["a", "b"])


# ------------------------------------------------------------------------------ mask


@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0])
def test_mask_values_other_than_0_1(bad):
    mask = good()["response_mask"].clone()
    mask[0, 0] = bad
    with raises("response_mask", r"0/1|0 or 1|0 and 1|binary|\{0, ?1\}|bool"):
        call_otb(response_mask=mask)


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_mask_values(name):
    mask = good()["response_mask"].clone()
    mask[1, 0] = 0.3
    with raises("response_mask", r"0/1|0 or 1|0 and 1|binary|\{0, ?1\}|bool"):
        call_seq(name, response_mask=mask)


# ------------------------------------------------------------------------------ non-finite values


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("arg", ["token_rewards", "log_probs", "sum_pi_sq", "is_weights"])
def test_non_finite_at_valid_position(arg, bad):
    x = good()[arg].clone()
    x[2, 0] = bad  # row 2 has length 1: position 0 is its only valid token
    with raises(arg, FINITE):
        call_otb(**{arg: x})


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_nan_reward_at_valid_position(name):
    x = good()["token_rewards"].clone()
    x[0, 4] = math.nan
    with raises("token_rewards", FINITE):
        call_seq(name, token_rewards=x)


# ------------------------------------------------------------------------------ log-probs


@pytest.mark.parametrize("bad", [1e-3, 0.5, 30.0])
def test_log_probs_above_zero(bad):
    lp = good()["log_probs"].clone()
    lp[3, 1] = bad
    with raises("log_probs", r"> ?0|above|positive|<= ?0|not exceed"):
        call_otb(log_probs=lp)


def test_log_probs_a_rounding_error_above_zero_are_accepted():
    lp = good()["log_probs"].clone()
    lp[:, 0] = 1e-7  # exp(logit - logsumexp) rounding can land here for a certain token
    adv, _ = call_otb(log_probs=lp)
    assert torch.isfinite(adv).all()


# ------------------------------------------------------------------------------ empty batch, chunk_size


def test_empty_batch_otb():
    kw = good()
    empty = {k: kw[k][:0] for k in ["token_rewards", "response_mask", "log_probs", "sum_pi_sq", "is_weights"]}
    with pytest.raises(ValueError, match=r"(?i)empty|no rows|batch"):
        call_otb(**empty, group_index=[])


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_empty_batch_sequence_estimators(name):
    kw = good()
    with pytest.raises(ValueError, match=r"(?i)empty|no rows|batch"):
        call_seq(name, token_rewards=kw["token_rewards"][:0], response_mask=kw["response_mask"][:0],
                 group_index=[])


@pytest.mark.parametrize("chunk_size", [0, -1, -100])
def test_chunk_size_below_one(chunk_size):
    with raises("chunk_size", r">= ?1|positive|at least|< ?1"):
        otb.sum_pi_squared(torch.randn(3, 4, 5), chunk_size=chunk_size)


# ------------------------------------------------------------------------------ accepted inputs


@pytest.mark.parametrize("arg", ["token_rewards", "log_probs", "sum_pi_sq", "is_weights"])
def test_nan_and_inf_at_masked_positions_are_accepted(arg):
    x = good()[arg].clone()
    x[2, 1:] = math.nan  # row 2 is valid only at position 0
    x[1, 3:] = math.inf
    adv, ret = call_otb(**{arg: x})
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    pad = good()["response_mask"] == 0
    assert (adv[pad] == 0).all() and (ret[pad] == 0).all()


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimators_accept_nan_rewards_at_masked_positions(name):
    x = good()["token_rewards"].clone()
    x[2, 1:] = math.nan
    adv, ret = call_seq(name, token_rewards=x)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
