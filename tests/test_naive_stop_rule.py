"""The count task's stop rule (every sampled token is graded) and the sampler's host checks.

A row ends as soon as its reward is decided (tasks.CountTask.graded_end): checked against the plain
per-row cut of the same rollout sampled without the rule, and against the reward of the uncut text,
for rollout.sample (the host looks every step) and fast_decode.sample (every ``sync_every`` steps).
Without a tool fast_decode.sample looks at the tokens on the host only every ``sync_every`` steps: the
same tokens, and a count of the host reads."""
import random
import sys
from types import SimpleNamespace

import pytest
import torch

from lab import fast_decode
from lab import models
import otb
import rollout
import tasks

TOK = models.char_tokenizer()
TASK = tasks.CountTask(horizon=5, start_max=1)  # the answer "1, 2, 3, 4, 5"
ANSWER = "1, 2, 3, 4, 5"


def test_graded_end_on_known_strings():
    end = lambda text: TASK.graded_end(text, ANSWER)  # noqa: E731
    assert end("1, 2, 3, 4, 5, 6, 7") == len("1, 2, 3, 4, 5,")  # b and the character that ends it
    assert end("1, 2, 3, 4, 5") is None  # b may still grow (55 would fail)
    assert end("1, 2, 3, 4, 55, 6") == len("1, 2, 3, 4, 55,")  # a number off the list: decided, failed
    assert end("1, 2, 4, 5, 6") == len("1, 2, 4,")
    assert end("The numbers from 1 to 5 are 1, 2, 3, 4, 5. Done") == len("The numbers from 1 to 5 are 1, 2, 3, 4, 5.")
    assert end("Sure! 1, 2") is None and end("") is None and end("no numbers yet ") is None
    assert end("7 ") == 2


def test_cutting_at_graded_end_never_changes_the_reward():
    rng = random.Random(0)
    pieces = ["1", "2", "3", "4", "5", "6", "55", "from", " to ", ", ", ",", " ", ".", "are"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        end = TASK.graded_end(text, ANSWER)
        if end is not None:
            assert TASK.reward(text[:end], ANSWER, False) == TASK.reward(text, ANSWER, False), text
            assert TASK.graded_end(text[:end], ANSWER) == end  # decided by its own graded part


class Script(torch.nn.Module):
    """A scripted model: the response token at step j is ``script[row][j]`` for sure, whatever came before
    (its logits depend on the position only), with the call signature rollout.sample uses."""

    def __init__(self, scripts, prompt_len):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        V = len(TOK)
        width = max(map(len, scripts))
        table = torch.full((len(scripts), width + 1, V), -50.0)
        for i, s in enumerate(scripts):
            for j, y in enumerate(s):
                table[i, j, y] = 50.0
        self.table, self.P = table, prompt_len

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0):
        j = (position_ids - self.P + 1).clamp(0, self.table.shape[1] - 1)  # response step predicted, (B, L)
        rows = torch.arange(len(self.table))[:, None].expand_as(j) % len(self.table)
        return SimpleNamespace(logits=self.table[rows, j], past_key_values=None)  # (B, L, V)


def ids(text, eos=True):
    return TOK(text, add_special_tokens=False)["input_ids"] + ([TOK.eos_token_id] if eos else [])


def sample(model, answers, stop, sync_every=None, seed=0):
    """rollout.sample, or with ``sync_every`` fast_decode.sample (on the plain decoder)."""
    prompts = [ids("go:", eos=False)] * len(answers)
    kw = dict(group_size=1, max_new_tokens=60, temperature=1.0, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id,
              generator=torch.Generator().manual_seed(seed), stop=TASK.stop_rule(TOK, answers, 1) if stop else None)
    return fast_sample(model, prompts, sync_every, **kw) if sync_every else rollout.sample(model, prompts, **kw)


def fast_sample(model, prompts, sync_every, **kw):
    return fast_decode.sample(model, prompts, decoder=fast_decode.decoder(model, "plain"), sync_every=sync_every, **kw)


SCRIPTS = ["1, 2, 3, 4, 5, 6, 7, 8", "1, 2, 4, 5, 6", "the numbers from 1 to 5: 1, 2, 3, 4, 5, 6", "1, 2"]


@pytest.mark.parametrize("sync_every", [None, 1, 8])
def test_no_token_after_the_graded_part_is_sampled_or_gets_an_advantage(sync_every):
    model = Script([ids(s) for s in SCRIPTS], prompt_len=3)
    answers = [ANSWER] * len(SCRIPTS)
    full, cut = sample(model, answers, False), sample(model, answers, True, sync_every)
    texts = tasks.response_texts(TOK, cut.response, cut.response_mask)
    assert texts == ["1, 2, 3, 4, 5,", "1, 2, 4,", "the numbers from 1 to 5: 1, 2, 3, 4, 5,", "1, 2"]
    assert cut.finished.tolist() == [True] * 4  # three stopped, one ended by EOS
    # the plain per-row cut of the rollout sampled without the rule
    for i in range(len(SCRIPTS)):
        n = int(cut.response_mask[i].sum())
        assert torch.equal(cut.response[i, :n], full.response[i, :n])
        assert (cut.response[i, n:] == TOK.pad_token_id).all() and (cut.logp[i, n:] == 0).all()
    R, token_rewards, _ = tasks.rewards(TASK, TOK, cut, answers, 1)
    R_full, _, _ = tasks.rewards(TASK, TOK, full, answers, 1)
    assert R.tolist() == R_full.tolist() == [1.0, 0.0, 1.0, 0.0]  # the same grades
    for name in ("group_mean", "otb", "reinforce"):
        adv, _ = otb.ESTIMATORS[name](token_rewards=token_rewards, response_mask=cut.response_mask,
                                      group_index=torch.zeros(len(SCRIPTS), dtype=torch.long),
                                      log_probs=cut.logp, sum_pi_sq=torch.ones_like(cut.logp))
        assert (adv[cut.response_mask == 0] == 0).all()  # nothing after a row's graded part
    assert cut.response_mask.sum() < full.response_mask.sum()  # fewer tokens sampled and paid for


def test_without_a_tool_the_host_reads_the_tokens_every_sync_every_steps(monkeypatch):
    """A model with EOS likely (rows end after a few tokens): fast_decode.sample's tokens with sync_every 8
    equal rollout.sample's (up to padding columns), and without a tool its loop converts a tensor to a
    host value once per 8 steps at most (the model's forward pass may read on its own: transformers' mask
    code does). On a GPU each such read waits for the device."""
    from test_naive_rollout import EOS, PAD, PROMPTS, V, fixed_distribution_model
    bias = torch.zeros(V)
    bias[EOS] = 1.5
    model = fixed_distribution_model(bias)
    kw = dict(group_size=3, max_new_tokens=24, temperature=1.0, eos_id=EOS, pad_id=PAD)
    every = rollout.sample(model, PROMPTS, generator=torch.Generator().manual_seed(2), **kw)
    reads = []  # the sampler's own reads (the model's forward pass may make its own)

    def counted(real):
        def read(self, *a):
            if sys._getframe(1).f_code.co_filename == fast_decode.__file__:
                reads.append(real.__name__)
            return real(self, *a)
        return read
    for name in ("__bool__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    lazy = fast_sample(model, PROMPTS, 8, generator=torch.Generator().manual_seed(2), **kw)
    monkeypatch.undo()
    T = every.response.shape[1]
    assert T < 24 and lazy.response.shape[1] == min(24, -(-T // 8) * 8)  # stopped at the next check
    assert torch.equal(lazy.response[:, :T], every.response) and (lazy.response_mask[:, T:] == 0).all()
    assert torch.equal(lazy.logp[:, :T], every.logp) and torch.equal(lazy.finished, every.finished)
    assert len(reads) <= -(-lazy.response.shape[1] // 8), reads  # one done.all() per check


@pytest.mark.parametrize("sync_every", [None, 1, 8])
def test_a_rollout_that_reaches_the_length_limit_runs_one_forward_pass_per_token(sync_every):
    # The prefill gives the first token's logits and each decode pass the next one's: 5 tokens, 5 passes
    # (no decode pass after the last token), with the stop rule asked and the rows cut as before.
    model = Script([ids("1, 2, 3", eos=False)] * 2, prompt_len=3)
    passes = []
    model.register_forward_hook(lambda *a: passes.append(1))
    kw = dict(group_size=1, max_new_tokens=5, temperature=1.0, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id,
              generator=torch.Generator().manual_seed(0), stop=TASK.stop_rule(TOK, [ANSWER] * 2, 1))
    prompts = [ids("go:", eos=False)] * 2
    ro = fast_sample(model, prompts, sync_every, **kw) if sync_every else rollout.sample(model, prompts, **kw)
    assert len(passes) == 5 and ro.response.shape[1] == 5
    assert tasks.response_texts(TOK, ro.response, ro.response_mask) == ["1, 2, 3"[:5]] * 2 and not ro.finished.any()
