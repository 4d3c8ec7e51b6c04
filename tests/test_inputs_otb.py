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


# ------------------------------------------------------------------------------ empty batch


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


# ------------------------------------------------------------------------------ accepted inputs


@pytest.mark.parametrize("junk", [math.nan, math.inf, -math.inf, 1e30, -1e30, 3e38],
                         ids=["nan", "inf", "-inf", "1e30", "-1e30", "3e38"])
@pytest.mark.parametrize("arg", ["token_rewards", "log_probs", "sum_pi_sq", "is_weights"])
def test_anything_at_masked_positions_changes_nothing(arg, junk):
    # otb.py masks by multiplying with m, so padding must first be made harmless: NaN * 0 is NaN,
    # and exp(1e30) or (1e30)^2 would overflow. The result must equal the clean batch's exactly.
    x = good()[arg].clone()
    x[2, 1:] = junk  # row 2 is valid only at position 0
    x[1, 3:] = junk
    clean = call_otb()
    for loo in (False, True):
        adv, ret = call_otb(**{arg: x}, leave_one_out=loo)
        assert torch.equal(adv, call_otb(leave_one_out=loo)[0]) and torch.equal(ret, clean[1])
    pad = good()["response_mask"] == 0
    assert (adv[pad] == 0).all() and (ret[pad] == 0).all()


def test_is_weights_whose_square_overflows_are_rejected():
    isw = good()["is_weights"].clone()
    isw[0, 1] = 1e19  # finite in float32, but rho^2 = 1e38 * 100 is not
    with raises("is_weights", r"1e\+?18"):
        call_otb(is_weights=isw)


@pytest.mark.parametrize("junk", [math.nan, math.inf, 3e38], ids=["nan", "inf", "3e38"])
@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimators_ignore_anything_in_masked_rewards(name, junk):
    x = good()["token_rewards"].clone()
    x[2, 1:] = junk
    adv, ret = call_seq(name, token_rewards=x)
    clean_adv, clean_ret = call_seq(name)
    assert torch.equal(adv, clean_adv) and torch.equal(ret, clean_ret)


# ------------------------------------------------------------------------------------- nonsense values


@pytest.mark.parametrize("bad", [5.0, 1.01, -0.5, -1e-3], ids=["5", "1.01", "-0.5", "-1e-3"])
def test_sum_pi_sq_outside_0_1(bad):
    spp = good()["sum_pi_sq"].clone()
    spp[3, 2] = bad
    with raises("sum_pi_sq", r"\[0, 1\]"):
        call_otb(sum_pi_sq=spp)


def test_sum_pi_sq_a_rounding_error_outside_0_1_is_accepted():
    spp = good()["sum_pi_sq"].clone()
    spp[0, :2] = 1 + 1e-6  # a float32 softmax of a certain token
    spp[1, :2] = -1e-7
    adv, _ = call_otb(sum_pi_sq=spp)
    assert torch.isfinite(adv).all()


def test_sum_pi_sq_out_of_range_on_padding_is_accepted():
    spp = good()["sum_pi_sq"].clone()
    spp[2, 1:] = 5.0  # row 2 is valid only at position 0
    adv, _ = call_otb(sum_pi_sq=spp)
    assert torch.equal(adv, call_otb()[0])


@pytest.mark.parametrize("eps", [-1.0, -1e-12, math.nan, math.inf, "1e-8", None])
def test_eps_negative_or_not_finite(eps):
    with raises("eps", r">= ?0|finite|number"):
        call_otb(eps=eps)


@pytest.mark.parametrize("ids", ["abcd", b"abcd"], ids=["str", "bytes"])
def test_group_index_string_is_rejected(ids):
    # "abcd" has 4 characters for 4 rows: it must not become four one-row groups
    with raises("group_index", r"string|one prompt id per row"):
        call_otb(group_index=ids)


@pytest.mark.parametrize("name", SEQUENCE_ESTIMATORS)
def test_sequence_estimator_group_index_string(name):
    with raises("group_index", r"string|one prompt id per row"):
        call_seq(name, group_index="abcd")


@pytest.mark.parametrize("ids", [5, [[0], [1], [0], [1]]], ids=["int", "unhashable ids"])
def test_group_index_not_a_sequence_of_ids(ids):
    with raises("group_index", r"sequence|hashable"):
        call_otb(group_index=ids)


def test_lists_are_accepted_where_tensors_are():
    kw = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in good().items()}
    adv, ret = otb.optimal_token_baseline(**kw)
    adv_t, ret_t = call_otb()
    torch.testing.assert_close(adv, adv_t)
    torch.testing.assert_close(ret, ret_t)
    for name in SEQUENCE_ESTIMATORS:
        torch.testing.assert_close(getattr(otb, name)(kw["token_rewards"], kw["response_mask"], kw["group_index"])[0],
                                   call_seq(name)[0])


def test_ragged_list_names_the_argument():
    with raises("log_probs", r"tensor|list"):
        call_otb(log_probs=[[-1.0, -2.0], [-1.0]])


@pytest.mark.parametrize("order", [("log_probs", "sum_pi_sq", "is_weights"), ("sum_pi_sq", "log_probs", "is_weights"),
                                   ("is_weights", "sum_pi_sq", "log_probs")], ids=["as-declared", "swapped", "reversed"])
def test_the_checker_gives_each_input_back_under_its_own_name_whatever_the_keyword_order(order):
    """The checked inputs are read by name: calling the checker with its keywords in another order
    changes nothing (a result in the order of the call's keywords would hand sum pi^2 over as log-probs)."""
    kw = good()
    x = otb._checked_inputs(kw["token_rewards"], kw["response_mask"], kw["group_index"],
                            **{name: kw[name] for name in order})
    for name in ("token_rewards", "log_probs", "sum_pi_sq", "is_weights"):
        assert torch.equal(getattr(x, name), kw[name]), name  # every value of good() is in range: unchanged
    assert torch.equal(x.response_mask, kw["response_mask"]) and x.gid.tolist() == [0, 1, 0, 1] and x.n_groups == 2

# sum_pi_squared


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "+inf"])
def test_sum_pi_squared_non_finite_logits(bad):
    z = torch.randn(2, 3, 5)
    z[1, 2, 4] = bad
    with raises("logits", r"finite") as info:
        otb.sum_pi_squared(z)
    assert "(1, 2)" in str(info.value)  # the index of the offending logit vector


def test_sum_pi_squared_row_of_only_minus_inf():
    z = torch.randn(3, 4)
    z[1] = -math.inf
    with raises("logits", r"finite|-inf"):
        otb.sum_pi_squared(z)


def test_sum_pi_squared_minus_inf_masked_tokens_are_fine():
    # -inf marks a token removed from the vocabulary: pi_k = 0 there, the rest renormalised
    z = torch.randn(4, 6, dtype=torch.float64)
    masked = z.clone()
    masked[:, :2] = -math.inf
    expected = torch.softmax(z[:, 2:], -1).pow(2).sum(-1)
    torch.testing.assert_close(otb.sum_pi_squared(masked), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("logits", [torch.tensor(1.0), torch.zeros(3, 0)], ids=["0-d", "V=0"])
def test_sum_pi_squared_without_a_vocabulary(logits):
    with raises("logits", r"vocabulary|last"):
        otb.sum_pi_squared(logits)


def test_sum_pi_squared_accepts_lists():
    z = [[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]]
    torch.testing.assert_close(otb.sum_pi_squared(z), torch.softmax(torch.tensor(z), -1).pow(2).sum(-1))


# token_energy


@pytest.mark.parametrize("spp_shape", [(4, 1), (1, 5), (5,), (4, 5, 1)])
def test_token_energy_does_not_broadcast(spp_shape):
    with raises("sum_pi_sq", SHAPE):
        otb.token_energy(-torch.rand(4, 5), torch.full(spp_shape, 0.5))


def test_token_energy_accepts_lists():
    lp, spp = [[-0.1, -2.0], [-0.7, -5.0]], [[0.9, 0.3], [0.5, 0.2]]
    w = otb.token_energy(lp, spp)
    torch.testing.assert_close(w, (1 - 2 * torch.tensor(lp).exp() + torch.tensor(spp)).clamp(0, 2))


# ------------------------------------------------------------------------------ each input checked once

CHECKERS = ("_checked_inputs", "_checked_logits", "_checked_pair")


def count_checks(monkeypatch, recording=lambda: True):
    """[(checker, the tensors handed to it)] of the calls of otb.py's checkers from here on, while
    ``recording()``. The tensors are kept, so two tensors checked are two objects (no id reused)."""
    calls = []
    for name in CHECKERS:
        def counted(*args, _real=getattr(otb, name), _name=name, **kwargs):
            if recording():
                calls.append((_name, [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]))
            return _real(*args, **kwargs)
        monkeypatch.setattr(otb, name, counted)
    return calls


@pytest.mark.parametrize("name", list(otb.ESTIMATORS))
def test_every_estimator_checks_its_inputs_once(name, monkeypatch):
    calls = count_checks(monkeypatch)
    kw = good()
    otb.ESTIMATORS[name](**{k: kw[k] for k in ("token_rewards", "response_mask", "group_index", "log_probs",
                                               "sum_pi_sq")})
    assert [c for c, _ in calls] == ["_checked_inputs"]


def test_one_training_step_checks_each_input_once(out, monkeypatch):
    """One default train_step (otb): the estimator's inputs pass its checker once, and nothing the step
    checks is checked again (otb's internal calls are unchecked). sum_pi_squared checks each logit
    block the scoring pass hands it, one call per block."""
    import train
    from tiny_runs import run

    inside, step = [], train.train_step
    calls = count_checks(monkeypatch, recording=lambda: inside)  # not the warm-up's, not the logging's

    def one_step(*args, **kwargs):
        inside.append(True)
        try:
            return step(*args, **kwargs)
        finally:
            inside.clear()
    monkeypatch.setattr(train, "train_step", one_step)
    run(out, "checks", "--estimator", "otb", "--steps", "1")
    names = [name for name, _ in calls]
    assert names.count("_checked_inputs") == 1 and set(names) == {"_checked_inputs", "_checked_logits"}, names
    tensors = [t for _, ts in calls for t in ts]
    assert len({id(t) for t in tensors}) == len(tensors)  # no tensor handed to a checker twice
