"""The tasks: prompts with verifiable 0/1 rewards, drawn from a seeded generator.

A training step (train.py) asks this file for three things:

    prompts, answers = prompt_batch(task, tokenizer, seed, step, n)   # a function of (seed, step) only
    ... rollout.sample(model, prompts, ..., tool=task.tool(tokenizer), stop=task.stop_rule(...)) ...
    R, token_rewards, texts = rewards(task, tokenizer, ro, answers, group_size)

The prompts come from a ``random.Random`` seeded by (seed, step) (``step_seed``), independent of
the model's random numbers, so every configuration of a comparison sees the same prompts. The
outcome reward R of a response is placed on its last valid token: r_t = R at that t, else 0.

Seven tasks, each owning its defaults (``horizon``, and ``max_new_tokens()``, the response limit;
``train.py --task NAME --horizon H``, named in lab/options.py's ``TASKS``). This file holds what
they share, ``Task``, and the single-turn ones: ``ReverseTask`` (the default, for the tiny model),
``PeriodicTask`` (the long horizon), ``ArithmeticTask`` and ``CountTask`` (for a pretrained chat
model; counting ends a row with a stop rule). The three tasks with a tool (``calculator``,
``factors``, ``chat_calculator``) inherit ``Task`` in tool_use.py, with the tool, the sampler's
turns and eq. (8).
"""
import random
import re
from dataclasses import dataclass

import torch


# =====================================================================================
# The tasks
# =====================================================================================

class Task:
    """What the tasks share: a batch of prompts is n independent draws, and the warm-up's target
    is the answer itself. A task adds ``draw``, ``prompt_text``, ``reward`` and ``max_new_tokens``."""

    def sample(self, rng, n):
        """n (question, answer) pairs drawn from ``rng`` (a random.Random), one ``draw`` each."""
        return [self.draw(rng) for _ in range(n)]

    def target_text(self, answer):
        """The supervised target for the warm-up (the tokenizer appends nothing; EOS is added)."""
        return answer

    def tool(self, tokenizer):
        """The task's ``tool_use.Tool`` bound to the tokenizer; None: single-turn (the tasks of
        tool_use.py have one)."""
        return None

    def stop_rule(self, tokenizer, answers, group_size):
        """The sampler's stop rule for this batch; None: a response ends at EOS only."""
        return None


@dataclass
class ReverseTask(Task):
    """Reverse a random string: prompt ``<bos>cabd=``, correct response ``dbac<eos>``.

    The string length is uniform in [horizon // 2, horizon] (at least 1), so responses have
    variable length and ``horizon`` makes them longer. The reward checks the whole response:
    1 if the row ended with EOS and its text is exactly the reversed string, else 0.
    """
    horizon: int = 8
    alphabet: str = "abcdefgh"

    def draw(self, rng):  # (question, answer): a random string and its reverse
        length = rng.randint(max(1, self.horizon // 2), self.horizon)
        s = "".join(rng.choice(self.alphabet) for _ in range(length))
        return s, s[::-1]

    def prompt_text(self, tokenizer, question):  # the BOS token, the string, then "="
        return f"{tokenizer.bos_token}{question}="

    def reward(self, text, answer, finished):  # 1 if the row ended (EOS) on exactly the answer, else 0
        return float(bool(finished) and text == answer)

    def max_new_tokens(self):  # the response limit: the answer, EOS, and as much again of mistakes
        return 2 * self.horizon + 2


@dataclass
class PeriodicTask(Task):
    """Copy a pattern periodically: prompt ``<bos>cabhd:``, correct response the pattern repeated
    to exactly ``horizon`` characters (``cabhdcabhdcabhdc<eos>`` for horizon 16).

    The long-horizon task: every response of a success has exactly ``horizon`` + 1 tokens, the
    model must keep its place for all of them, and one slip anywhere fails the whole response
    (reward 1 on an exact match after EOS, else 0). An early mistake makes everything after it
    less certain, so the energy W_t accumulated by a response says something about its return:
    the situation a per-token baseline is built for.
    """
    horizon: int = 32
    period: int = 5
    alphabet: str = "abcdefgh"

    def draw(self, rng):
        pattern = "".join(rng.choice(self.alphabet) for _ in range(self.period))
        return pattern, (pattern * (self.horizon // self.period + 1))[:self.horizon]

    def prompt_text(self, tokenizer, question):
        return f"{tokenizer.bos_token}{question}:"

    def reward(self, text, answer, finished):  # 1 if the row ended (EOS) on exactly the answer, else 0
        return float(bool(finished) and text == answer)

    def max_new_tokens(self):
        """The answer, EOS, and a few tokens of slack to overshoot (cut off = failure)."""
        return self.horizon + 4


@dataclass
class ArithmeticTask(Task):
    """Add two random numbers with ``horizon`` digits each; the chat template frames the question.

    The reward is 1 if the last integer in the response equals the sum exactly.
    """
    horizon: int = 2

    def draw(self, rng):
        lo, hi = 10 ** (self.horizon - 1) if self.horizon > 1 else 0, 10 ** self.horizon - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"What is {a} + {b}? Reply with the number only.", str(a + b)

    def prompt_text(self, tokenizer, question):
        return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True, tokenize=False)

    def reward(self, text, answer, finished):
        numbers = re.findall(r"-?\d+", text.replace(",", ""))
        return float(bool(numbers) and numbers[-1] == answer)

    def max_new_tokens(self):
        return 32


@dataclass
class CountTask(Task):
    """Count: list the ``horizon`` whole numbers from a to b = a + horizon - 1, through the chat
    template. The long-horizon task for a pretrained instruct model (SmolLM2-135M-Instruct)::

        prompt    (chat template) List the numbers from 7 to 76, separated by commas.
        response  7, 8, 9, ..., 75, 76<|im_end|>

    The start a is uniform in [1, ``start_max``]. SmolLM2's tokenizer writes every digit, comma
    and space as its own token, so the correct response has as many tokens as characters (plus
    EOS): 270 to 279 for the default horizon 70 (tests/test_e2e_smollm2.py measures it). The
    reward is 1 if the integers of the text begin with exactly a, a+1, ..., b, optionally after
    one restatement of the range (a and b, as in "The numbers from a to b are: ..."); one skipped,
    repeated or extra number before b fails the whole response.

    Every sampled token is graded: a stop rule (``graded_end``, applied by the sampler as vLLM
    applies a stop string) ends a row as soon as its reward is decided, at the character after b
    (success) or after the first number that breaks the list (failure). SmolLM2 rarely stops at b
    by itself (docs/training.md); without the rule, the tokens it writes after b would share the
    response's advantage without being graded.
    """
    horizon: int = 70
    start_max: int = 15

    def draw(self, rng):
        a = rng.randint(1, self.start_max)
        b = a + self.horizon - 1
        numbers = ", ".join(map(str, range(a, b + 1)))
        return f"List the numbers from {a} to {b}, separated by commas.", numbers

    def prompt_text(self, tokenizer, question):  # the chat template, generation prompt opened
        return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True, tokenize=False)

    def reward(self, text, answer, finished):
        numbers, want = re.findall(r"\d+", text), answer.split(", ")
        if numbers[:2] == [want[0], want[-1]] and numbers[2:2 + len(want)] == want:
            return 1.0  # "from a to b: a, ..., b"
        return float(numbers[:len(want)] == want)  # ``finished`` is not used: after b nothing counts

    def stop_rule(self, tokenizer, answers, group_size):
        """A row ends once its reward is decided (``graded_end``): ``graded_stop_rule``."""
        return graded_stop_rule(self, tokenizer, answers, group_size)

    def graded_end(self, text, answer):
        """Characters of ``text`` that decide its reward: up to and including the character after the
        number that decides it (b, or the first number off the list); None while undecided."""
        want = answer.split(", ")
        patterns = (want, [want[0], want[-1]] + want)  # the list, or the restatement then the list
        numbers = []
        for match in re.finditer(r"\d+", text):
            if match.end() == len(text):
                return None  # a number still being written
            numbers.append(match.group())
            if any(numbers == p for p in patterns):
                return match.end() + 1  # success: b and the character that ends it
            if not any(numbers == p[:len(numbers)] for p in patterns):
                return match.end() + 1  # failure: a number off both patterns
        return None

    def max_new_tokens(self):
        """The longest correct list (start ``start_max``), EOS, and 48 tokens for a preamble."""
        a = self.start_max
        return len(", ".join(map(str, range(a, a + self.horizon)))) + 1 + 48


def step_seed(seed, step):
    """The seed of training step ``step`` of a run with ``seed``: the prompts (``prompt_batch``) and
    the sampler's generator (train.py) come from it, so every configuration of a comparison sees
    the same prompts and the same random draws at the same step."""
    return seed * 1_000_003 + step


def prompt_batch(task, tokenizer, seed, step, n_prompts):
    """The prompts of one training step, (token-id lists, answers): a function of (seed, step) only."""
    rng = random.Random(step_seed(seed, step))
    pairs = task.sample(rng, n_prompts)  # (question, answer) pairs
    texts = [task.prompt_text(tokenizer, question) for question, _ in pairs]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    answers = [answer for _, answer in pairs]
    return ids, answers


# =====================================================================================
# From sampled tokens to rewards
# =====================================================================================

def last_valid(response_mask):
    """Index of each row's last valid token, (B,); 0 for a row without one. With tool output
    inside a response this is not ``sum(m) - 1``."""
    t = torch.arange(response_mask.shape[-1], device=response_mask.device)  # positions, (T,)
    valid_t = torch.where(response_mask > 0, t, 0)  # t at valid tokens, 0 elsewhere, (B, T)
    return valid_t.max(dim=-1).values  # the last valid t of each row


def response_texts(tokenizer, response, response_mask):
    """Decode each row up to its last valid token, a tool's output included, dropping special
    tokens (EOS, padding)."""
    lengths = last_valid(response_mask) + 1  # tokens up to the last valid one, (B,)
    lengths[response_mask.sum(-1) == 0] = 0  # a row without a valid token decodes to ""
    return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=True)
            for row, n in zip(response.cpu(), lengths.tolist())]


def rewards(task, tokenizer, rollout, answers, group_size):
    """Outcome reward per row R (B,), and as token rewards r_t (B, T): R at the last valid token."""
    texts = response_texts(tokenizer, rollout.response, rollout.response_mask)
    row_answers = [a for a in answers for _ in range(group_size)]
    finished = rollout.finished.tolist()
    per_row = [task.reward(text, answer, f) for text, answer, f in zip(texts, row_answers, finished)]
    R = torch.tensor(per_row, dtype=torch.float32)  # (B,)
    if not torch.isfinite(R).all():  # checked where rewards are made: the error names the task and the row
        raise _reward_error(task, R, texts)
    m = rollout.response_mask.cpu()  # (B, T)
    token_rewards = torch.zeros_like(m)  # r_t, (B, T)
    token_rewards[torch.arange(len(R)), last_valid(m)] = R  # R at each row's last valid token
    return R, token_rewards * m, texts


def _reward_error(task, R, texts):
    """The ValueError for rewards that are not finite, naming the first such row, its reward and text."""
    bad = (~torch.isfinite(R)).nonzero().flatten().tolist()
    first, name = bad[0], type(task).__name__
    return ValueError(f"{name}.reward gave {R[first].item()} for {len(bad)} of {len(R)} responses "
                      f"(first: row {first}, text {texts[first]!r}); a reward must be a finite number")


def graded_stop_rule(task, tokenizer, answers, group_size):
    """The sampler's stop rule of a task with ``graded_end``: row i's tokens -> how many it keeps
    once its graded part is complete (None: not yet)."""
    row_answers = [a for a in answers for _ in range(group_size)]

    def stop(i, ids):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        end = task.graded_end(text, row_answers[i])  # characters
        if end is None:
            return None
        lo, hi = 1, len(ids)  # the fewest tokens whose text reaches ``end`` characters
        while lo < hi:
            mid = (lo + hi) // 2
            if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= end:
                hi = mid
            else:
                lo = mid + 1
        return lo
    return stop


def response_limit(task, max_new_tokens=None):
    """Most tokens a response may have: ``max_new_tokens`` where one is given (train.py's
    --max-new-tokens), else the task's own limit."""
    return max_new_tokens or task.max_new_tokens()
