"""The tasks: prompts with verifiable 0/1 rewards, drawn from a seeded generator.

A training step (train.py) asks this file for three things:

    prompts, answers = prompt_batch(task, tokenizer, seed, step, n)   # a function of (seed, step) only
    ... rollout.sample(model, prompts, ..., tool=task.tool(tokenizer), stop=task.stop_rule(...)) ...
    R, token_rewards, texts = rewards(task, tokenizer, ro, answers, group_size)

The prompts come from a ``random.Random`` seeded by (seed, step) (``step_seed``), independent of
the model's random numbers, so every configuration of a comparison sees the same prompts. The
outcome reward R of a response is placed on its last valid token: r_t = R at that t, else 0.

Seven tasks, each owning its defaults (``horizon``, and ``max_new_tokens()``, the response limit;
``train.py --task NAME --horizon H``); ``TASKS`` says what each is for. The default is ``ReverseTask``.
"""
import random
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch


# =====================================================================================
# The tasks
# =====================================================================================

class Task:
    """What the tasks share: a batch of prompts is n independent draws, and the warm-up's target
    is the answer itself. A task adds ``draw``, ``prompt_text``, ``reward`` and ``max_new_tokens``."""
    warmup_lr = 3e-3  # the tiny model's supervised warm-up: AdamW's rate (models.warm_up)
    warmup_ceiling = None  # a check above it is replayed step by step (models.warm_up); None: never

    def sample(self, rng, n):
        """n (question, answer) pairs drawn from ``rng`` (a random.Random), one ``draw`` each."""
        return [self.draw(rng) for _ in range(n)]

    def target_text(self, answer):
        """The supervised target for the warm-up (the tokenizer appends nothing; EOS is added)."""
        return answer

    def tool(self, tokenizer):
        """The task's ``Tool`` bound to the tokenizer; None: single-turn (a tool task overrides it)."""
        return None

    def stop_rule(self, tokenizer, answers, group_size):
        """The sampler's stop rule for this batch; None: a response ends at EOS only."""
        return None


# =====================================================================================
# A task's tool (multi-turn responses)
# =====================================================================================

@dataclass
class Tool:
    """The environment's side of a multi-turn response: a task's tool, bound to a tokenizer.

    When a row *samples* ``close_id`` (the token that ends a call) and has made fewer than
    ``max_calls`` calls, ``respond(ids)`` gets the row's response tokens so far (a list, the
    closing token last) and returns the tokens of the tool's output, which the sampler then
    forces into that row over the next positions; or None: no call there, the closing token is an
    ordinary one. So ``close_id`` may be the EOS token (a chat's turn end): a turn that holds a
    call goes on with the tool's turn, any other turn end ends the row. A closing token beyond
    ``max_calls`` is an ordinary token. The total length stays capped by ``max_new_tokens``: a row
    still receiving output when the cap comes is cut there (``Rollout.tool_cut``).
    """
    close_id: int
    respond: Callable[[list], list]
    max_calls: int
    is_error: Optional[Callable[[list], bool]] = None  # is this output (a list of ids) an error reply?


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

    def max_new_tokens(self):  # the response limit: room for the answer, EOS and as much again of mistakes
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

    reward = ReverseTask.reward  # 1 on an exact match after EOS, else 0

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
class CalculatorTask(Task):
    """Add ``horizon`` = k numbers of ``digits`` digits with a calculator that adds two numbers.

    The multi-turn task, for the tiny character-level model. A correct transcript for k = 3::

        prompt    <bos>12+34+56?
        response  12+34=[46,]46+56=[102,]102<eos>

    The policy writes a call ``a+b=``; ``=`` closes it, and the tool's output (in brackets
    above; the brackets are not characters of the response) is forced in: the sum and a comma,
    or ``error,`` for a call that is not two numbers joined by ``+``. The model must call the tool
    k - 1 times, each call's first number being the previous result, then write the sum and EOS.
    The reward is 1 if the row ended with EOS and the text after its last comma (the final
    answer) is the sum, else 0: calls are never checked, only the answer. At most 2 k calls per
    response; the answer is the whole correct transcript, so the warm-up can train on it.
    """
    horizon: int = 3
    digits: int = 2
    warmup_lr: float = 1e-3  # 3e-3, the other tasks' rate, stalls this warm-up (docs/tool_use.md)
    warmup_ceiling: float = 0.4  # success can jump between two checks: replay a check above 40% step by step

    def transcript(self, numbers):
        """The correct response to ``numbers``, tool output included (EOS excluded)."""
        text, total = "", numbers[0]
        for x in numbers[1:]:
            text += f"{total}+{x}=" + self.calculator(f"{total}+{x}=")
            total += x
        return text + str(total)

    def draw(self, rng):
        numbers = [rng.randint(10 ** (self.digits - 1), 10 ** self.digits - 1) for _ in range(self.horizon)]
        return "+".join(map(str, numbers)), self.transcript(numbers)

    def prompt_text(self, tokenizer, question):
        return f"{tokenizer.bos_token}{question}?"

    def reward(self, text, answer, finished):
        return float(bool(finished) and text.rsplit(",", 1)[-1] == answer.rsplit(",", 1)[-1])

    def max_new_tokens(self):
        """The longest correct transcript (all numbers 99..9), EOS, and 8 tokens of slack; the tool's
        output counts towards it."""
        return len(self.transcript([10 ** self.digits - 1] * self.horizon)) + 1 + 8

    error = "error,"  # the tool's reply to a malformed call

    def calculator(self, call):
        """The tool: ``"46+56="`` -> ``"102,"``; anything else -> ``self.error``."""
        match = re.fullmatch(r"(\d+)\+(\d+)=", call)
        return self.reply(int(match[1]) + int(match[2])) if match else self.error

    def reply(self, total):
        """The tool's reply to a well-formed call whose sum is ``total``."""
        return f"{total},"

    def tool(self, tokenizer):
        """The calculator bound to ``tokenizer``: the call is the row's text after the last comma."""
        def respond(ids):
            call = tokenizer.decode(ids, skip_special_tokens=True).rsplit(",", 1)[-1]
            return tokenizer(self.calculator(call), add_special_tokens=False)["input_ids"]
        error = tokenizer(self.error, add_special_tokens=False)["input_ids"]
        return Tool(close_id=tokenizer.convert_tokens_to_ids("="), respond=respond,
                    max_calls=2 * self.horizon, is_error=lambda output: list(output) == error)


def prime_factors(n):
    """The prime factors of n >= 2 in increasing order, with repeats: 102 -> [2, 3, 17].

    sympy's factorint, not trial division: a sampled call may add numbers of as many digits as the
    response limit allows, and trial division of a 30-digit prime would never end."""
    import sympy  # imported here: only the factors task needs it
    return [p for p, k in sorted(sympy.factorint(n).items()) for _ in range(k)]


@dataclass
class FactorsTask(CalculatorTask):
    """The calculator task with a tool whose replies vary in length: the sum and its prime factors.

    Where the calculator's replies are 3-4 tokens in every row, this tool replies with a list, so two
    calls whose sums differ by 1 can get replies of very different lengths (k = 3)::

        prompt    <bos>12+34+56?
        response  12+34=[46:2*23,]46+56=[102:2*3*17,]102<eos>
                                                           (101 would get [101:101,], 96 [96:2*2*2*2*2*3,])

    and a malformed call gets a long error message. The policy needs only the sum, the first item of
    the list. Everything else is the calculator task's: the calls, the reward (the text after the
    last comma is the sum), the warm-up. Rows of a group whose calls differ have holes of different
    lengths before their next actions: the case where aligning by action (``otb_tir``) and by
    position (``otb``) pool different tokens (docs/tool_use.md).
    """
    error = "error: a call is two numbers joined by a plus,"

    def reply(self, total):
        return f"{total}:" + "*".join(map(str, prime_factors(total))) + "," if total > 1 else f"{total},"

    def max_new_tokens(self):
        """The longest correct transcript, EOS, and 8 tokens of slack, where the reply of each call
        may be the longest this tool gives for any sum up to k (10^d - 1)."""
        longest = max(len(self.reply(n)) for n in range(self.horizon * (10 ** self.digits - 1) + 1))
        calls = self.horizon - 1
        return len(self.transcript([10 ** self.digits - 1] * self.horizon)) + calls * longest + 1 + 8


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
        return f"List the numbers from {a} to {b}, separated by commas.", ", ".join(map(str, range(a, b + 1)))

    prompt_text = ArithmeticTask.prompt_text  # the chat template, generation prompt opened

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


@dataclass
class ChatCalculatorTask(ArithmeticTask):
    """Add ``horizon`` = k numbers of ``digits`` digits with a calculator called through the chat
    template; the calculator adds two numbers, so k numbers take k - 1 calls.

    The multi-turn task for a pretrained chat model (SmolLM2-135M-Instruct). The user message says how
    to call the tool, and one worked exchange before it (with k numbers) shows the round trip. A
    correct response for k = 2, the tool's turn (forced in, mask 0) in brackets::

        calc: 487 + 356<|im_end|>[\n<|im_start|>tool\n843<|im_end|>\n<|im_start|>assistant\n]843<|im_end|>

    For k = 3 a second call ``calc: 843 + 125`` follows the first reply. The turn end ``<|im_end|>``
    (the EOS token) closes a call when the assistant's turn holds ``calc:``: the tool's turn follows
    and the next assistant turn goes on in the same rollout. Any other turn end ends the response. A
    call that is not ``calc: a + b`` (three numbers included) gets an error reply. The reward is 1 if
    the last integer of the last assistant turn is the sum (the tool's turn is not the model's answer).
    At most k calls per response.
    """
    horizon: int = 2
    digits: int = 3
    error = "error: write calc: a + b"
    DEMO = (487, 356, 125, 609, 231, 874, 512, 938)  # the worked exchange's numbers

    def __post_init__(self):
        if not 2 <= self.horizon <= len(self.DEMO):
            raise ValueError(f"the chat calculator adds 2 to {len(self.DEMO)} numbers, not {self.horizon}")

    @property
    def max_calls(self):
        return self.horizon  # the k - 1 calls needed and one more

    def question(self, *numbers):
        if len(numbers) == 2:
            a, b = numbers
            return (f"What is {a} + {b}? You have a calculator: to use it, reply with only calc: {a} + {b}. "
                    "When its result comes back, reply with the number only.")
        return (f"What is {' + '.join(map(str, numbers))}? You have a calculator that adds two numbers: to "
                "use it, reply with only calc: x + y. When its result comes back, call it again or reply "
                "with the number only.")

    def draw(self, rng):
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        numbers = [rng.randint(lo, hi) for _ in range(self.horizon)]
        return self.question(*numbers), str(sum(numbers))

    def calls(self, numbers):
        """The correct (call, reply) turns for ``numbers``: the running sum plus the next number."""
        total, turns = numbers[0], []
        for x in numbers[1:]:
            turns.append((f"calc: {total} + {x}", str(total + x)))
            total += x
        return turns

    def conversation(self, question, calls=()):
        """The chat up to the assistant's answer: the worked exchange, the question, and the
        (call, reply) turns of ``calls``."""
        demo_numbers = self.DEMO[:self.horizon]
        turns = lambda pairs: [m for call, reply in pairs for m in (  # noqa: E731
            {"role": "assistant", "content": call}, {"role": "tool", "content": reply})]
        demo = ([{"role": "user", "content": self.question(*demo_numbers)}] + turns(self.calls(demo_numbers))
                + [{"role": "assistant", "content": str(sum(demo_numbers))}])
        return demo + [{"role": "user", "content": question}] + turns(calls)

    def prompt_text(self, tokenizer, question):
        return tokenizer.apply_chat_template(self.conversation(question), add_generation_prompt=True,
                                             tokenize=False)

    def calculator(self, turn):
        """The tool: ``"calc: 487 + 356"`` -> ``"843"``; a turn with ``calc:`` in another form -> the error."""
        match = re.fullmatch(r"\s*calc:\s*(\d+)\s*\+\s*(\d+)\s*", turn)
        return str(int(match[1]) + int(match[2])) if match else self.error

    def tool_turn(self, reply):
        """The text the sampler forces after the assistant's turn end: the tool's turn, then the next
        assistant turn opened (the chat template's layout, ``<|im_start|>role\n ... <|im_end|>\n``)."""
        return f"\n<|im_start|>tool\n{reply}<|im_end|>\n<|im_start|>assistant\n"

    def tool(self, tokenizer):
        """The calculator behind the turn end: the turn is the text since the last assistant turn opened."""
        opener = "<|im_start|>assistant\n"

        def respond(ids):
            turn = tokenizer.decode(ids).rsplit(opener, 1)[-1].removesuffix(tokenizer.eos_token)
            if "calc:" not in turn:
                return None  # an answer, not a call: the turn end ends the response
            return tokenizer(self.tool_turn(self.calculator(turn)), add_special_tokens=False)["input_ids"]
        error = tokenizer(self.tool_turn(self.error), add_special_tokens=False)["input_ids"]
        return Tool(close_id=tokenizer.eos_token_id, respond=respond, max_calls=self.max_calls,
                    is_error=lambda output: list(output) == error)

    def reward(self, text, answer, finished):
        """The last integer of the last assistant turn (``text`` is decoded without special tokens, so
        the turns are joined by ``\ntool\n`` and ``\nassistant\n``)."""
        return ArithmeticTask.reward(self, text.rsplit("\nassistant\n", 1)[-1], answer, finished)

    def max_new_tokens(self):
        return 32 * self.horizon


# The tasks by name: ``reverse`` (the default, for the tiny model), the long-horizon ``periodic``, the tool
# tasks ``calculator`` and ``factors`` (a ``Tool`` whose output the sampler forces into the response with
# mask 0), and, for a pretrained chat model, ``arithmetic``, ``count`` (long horizon, with a stop rule)
# and ``chat_calculator``.
TASKS = {"reverse": ReverseTask, "periodic": PeriodicTask, "arithmetic": ArithmeticTask,
         "calculator": CalculatorTask, "factors": FactorsTask, "count": CountTask,
         "chat_calculator": ChatCalculatorTask}


def step_seed(seed, step):
    """The seed of training step ``step`` of a run with ``seed``: the prompts (``prompt_batch``) and
    the sampler's generator (train.py) come from it, so every configuration of a comparison sees
    the same prompts and the same random draws at the same step."""
    return seed * 1_000_003 + step


def prompt_batch(task, tokenizer, seed, step, n_prompts):
    """The prompts of one training step, (token-id lists, answers): a function of (seed, step) only."""
    pairs = task.sample(random.Random(step_seed(seed, step)), n_prompts)  # (question, answer) pairs
    ids = [tokenizer(task.prompt_text(tokenizer, q), add_special_tokens=False)["input_ids"] for q, _ in pairs]
    return ids, [a for _, a in pairs]


# =====================================================================================
# From sampled tokens to rewards
# =====================================================================================

def last_valid(response_mask):
    """Index of each row's last valid token, (B,); 0 for a row without one. With tool output
    inside a response this is not ``sum(m) - 1``."""
    t1 = torch.arange(1, response_mask.shape[-1] + 1, device=response_mask.device)  # t + 1, (T,)
    return (response_mask.bool() * t1).argmax(-1)  # the largest t + 1 at a valid token; 0 for a row without one


def response_texts(tokenizer, response, response_mask):
    """Decode each row up to its last valid token, a tool's output included, dropping special
    tokens (EOS, padding)."""
    lengths = (last_valid(response_mask) + 1) * response_mask.bool().any(-1)  # (B,), 0 if empty
    return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=True)
            for row, n in zip(response.cpu(), lengths.tolist())]


def rewards(task, tokenizer, rollout, answers, group_size):
    """Outcome reward per row R (B,), and as token rewards r_t (B, T): R at the last valid token."""
    texts = response_texts(tokenizer, rollout.response, rollout.response_mask)
    row_answers = [a for a in answers for _ in range(group_size)]
    R = torch.tensor([task.reward(t, a, f) for t, a, f in
                      zip(texts, row_answers, rollout.finished.tolist())], dtype=torch.float32)  # (B,)
    if not torch.isfinite(R).all():  # checked where the rewards are made: the error names the task and the row
        raise _reward_error(task, R, texts)
    m = rollout.response_mask.cpu()  # (B, T)
    token_rewards = torch.zeros_like(m).index_put_((torch.arange(len(R)), last_valid(m)), R)  # (B, T)
    return R, token_rewards * m, texts


def _reward_error(task, R, texts):
    """The ValueError for rewards that are not finite, naming the first such row, its reward and text."""
    bad = (~torch.isfinite(R)).nonzero().flatten().tolist()
    return ValueError(f"{type(task).__name__}.reward gave {R[bad[0]].item()} for {len(bad)} of {len(R)} responses "
                      f"(first: row {bad[0]}, text {texts[bad[0]]!r}); a reward must be a finite number")


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


def make_task(cfg):
    """The task of a train.py Config: --task (default reverse for the tiny model, arithmetic
    otherwise) at --horizon (default: the task's own)."""
    name = cfg.task or ("reverse" if cfg.model == "tiny" else "arithmetic")
    return TASKS[name]() if cfg.horizon is None else TASKS[name](horizon=cfg.horizon)


def response_limit(cfg, task):
    """Most tokens a response may have: --max-new-tokens, or the task's own limit."""
    return cfg.max_new_tokens or task.max_new_tokens()
