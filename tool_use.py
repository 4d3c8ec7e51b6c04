"""Tool use: responses with a tool's output inside them, and the advantage aligned by action, eq. (8).

In tool-integrated reasoning a response interleaves the policy's tokens with a tool's replies, which
the environment inserts. For the tiny model's calculator task (k = 3 numbers, the tool's output in
brackets)::

    prompt    <bos>12+34+56?
    response  12+34=[46,]46+56=[102,]102<eos>
    m_t       111111 000 111111 0000 111 1      1 on the policy's tokens, 0 on the tool's

The tool's tokens are not actions: they carry m_t = 0 *inside* the response (holes, not only right
padding), so they get no reward, no energy w_t, no advantage and no loss, while they stay context for
the tokens after them. Who makes such responses, and who reads them:

1. ``Tool``: a task's tool bound to a tokenizer: the token that closes a call, and ``respond``, which
   turns the row's tokens so far into the tokens of the tool's reply.
2. ``Turns``: the environment's part in ``rollout.sample``. When a row samples the closing token,
   the reply is forced into that row over the next positions, in the same batched KV-cache loop,
   with mask 0 and log-prob 0. (Turns also applies a task's stop rule, the environment ending a row
   once its graded part is complete, as a stop string does in vLLM.)
3. ``action_mask``: the same tool replayed over one given response, which tokens the policy wrote;
   the supervised warm-up masks its targets with it, and the tests compare the sampler with it.
4. The advantage. With holes, the rows of a group reach their k-th action at different positions t,
   so pooling them by position (``otb``, eqs. (1)-(6) of otb.py) compares tokens that play different
   parts. ``otb.action_aligned_otb`` (``otb_tir``) pools them by the index of each token among its
   row's actions,

       k_t = sum_{j<=t} m_j - 1                    (8)

   applies (1)-(6) over k and gives token t the advantage A_{k_t} (verl's multi-turn estimator).
   Without holes it is ``otb``. What it changes, measured: docs/tool_use.md.

The tasks with a tool: ``CalculatorTask`` (the tiny model adds k numbers with a calculator that adds
two), ``FactorsTask`` (the same calculator replying with the sum's prime factors, so replies vary in
length: where ``otb_tir`` and ``otb`` pool different tokens) and ``ChatCalculatorTask`` (a pretrained
chat model calls the calculator through its chat template). They are tasks like tasks.py's: each
inherits ``tasks.Task`` and adds its ``tool``.
"""
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import tasks


# =====================================================================================
# The tool, the sampler's turns, the mask of one response
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


class Turns:
    """The environment's part in ``rollout.sample``: a tool's output forced into the responses, and a
    task's stop rule. Not used on the default path (a single-turn task that ends at EOS).

    With a ``tool`` the responses are multi-turn: when a row closes a call, the tool's output is
    forced into it over the next positions (a per-row queue), with mask 0 and log-prob 0: holes
    inside the response that are context for the policy but not its actions. Every row is still
    drawn for, so the random stream does not depend on the tool, and a forced token goes through the
    same batched decode step into the KV cache. Before a row's first call, sampling is exactly the
    single-turn sampler.

    ``stop`` is the environment's stop rule, as a stop string is in vLLM: ``stop(i, ids)`` gets row
    i's response tokens so far (a list) and returns how many of them the row keeps once the part its
    reward grades is complete, or None while it is not. The row then ends: the tokens after that
    point are cut (padding, mask 0, log-prob 0) and the row is ``finished``. A sampler that asks less
    often (lab/fast_decode.py) gets the same rollout: the rule cuts back to where it would have stopped.
    """

    def __init__(self, B, tool, stop, device):
        self.tool, self.stop, self.device = tool, stop, device
        self.queue = [[] for _ in range(B)]  # per row: the tool's output tokens still to be forced
        self.calls = [0] * B  # per row: calls answered
        self.errors = [0] * B  # per row: error replies among them
        self.forced_in = [0] * B  # per row: reply tokens queued
        self.keep = [None] * B  # per row: the tokens the stop rule keeps (None: not stopped)

    def force(self, y, action):
        """The queued tool tokens replace the draws of their rows, which are then not actions: each
        such row's queue gives up its next token."""
        if not any(self.queue):
            return y, action
        forced = torch.tensor([len(q) > 0 for q in self.queue], device=self.device)  # (B,) bool
        y = y.clone()
        y[forced] = torch.tensor([q.pop(0) for q in self.queue if q], device=self.device)
        return y, action & ~forced

    def run_tool(self, action, y, tokens):
        """Answer the calls that this token closes -> the rows that called, (B,) bool. A row whose
        action is the closing token, with calls left, has ``tool.respond`` turned on its tokens so far;
        a reply (not None) is queued for ``force`` and counted, and that row goes on past the token even
        where it is EOS (a chat's turn end can close a call)."""
        called = torch.zeros_like(action)  # (B,)
        if self.tool is None:
            return called
        for i in torch.nonzero(action & (y == self.tool.close_id)).flatten().tolist():
            call = torch.stack(tokens, 1)[i].tolist()
            output = self.tool.respond(call) if self.calls[i] < self.tool.max_calls else None
            if output is not None:  # None: not a call, an ordinary token
                self.calls[i] += 1
                self.queue[i] = list(output)
                self.errors[i] += bool(self.tool.is_error and self.tool.is_error(self.queue[i]))
                self.forced_in[i] += len(self.queue[i])
                called[i] = True
        return called

    def apply_stop_rule(self, tokens):
        """Ask the stop rule about every row it has not stopped yet (one copy of the tokens to the host)
        and record where each newly stopped row is cut -> the rows stopped so far, (B,) bool; none
        without a rule."""
        if self.stop is not None:
            so_far = torch.stack(tokens, 1).tolist()  # (B, t) on the host
            for i, row in enumerate(so_far):
                if self.keep[i] is None:
                    self.keep[i] = self.stop(i, row)
        return torch.tensor([n is not None for n in self.keep], device=self.device)

    def finish(self, ro, pad_id):
        """Cut each stopped row after the tokens it keeps, and count the tool's work per row."""
        T = ro.response.shape[1]
        if self.stop is not None:
            kept = torch.tensor([T if n is None else n for n in self.keep], device=self.device)  # (B,)
            cut = torch.arange(T, device=self.device)[None] >= kept[:, None]  # (B, T)
            ro.response = ro.response.masked_fill(cut, pad_id)
            ro.response_mask = ro.response_mask.masked_fill(cut, 0.0)
            ro.logp = ro.logp.masked_fill(cut, 0.0)
        if self.tool is not None:
            per_row = lambda xs: torch.tensor(xs, device=self.device)  # noqa: E731
            ro.tool_calls, ro.tool_errors = per_row(self.calls), per_row(self.errors)
            # the tokens forced in, less the part of a reply the length limit cut off
            ro.tool_tokens = per_row([n - len(q) for n, q in zip(self.forced_in, self.queue)])
            ro.tool_cut = per_row([len(q) > 0 for q in self.queue])
        return ro


def action_mask(tool, response):
    """Which tokens of one given response (a list of ids) the policy wrote: 1, or the tool: 0.

    The tool is replayed over the response as the sampler would have run it (a call closes on
    ``close_id`` while fewer than ``max_calls`` calls were made; the next ``len(output)`` tokens
    are the tool's). The supervised warm-up masks its targets with it, and the tests use it as
    the plain single-row loop the batched sampler must agree with.
    """
    flags, pending, calls = [], 0, 0
    for t, y in enumerate(response):
        if pending:
            flags.append(0)
            pending -= 1
            continue
        flags.append(1)
        if tool is not None and y == tool.close_id and calls < tool.max_calls:
            output = tool.respond(response[:t + 1])
            if output is not None:  # None: not a call
                calls += 1
                pending = len(output)
    return flags


# =====================================================================================
# The tasks with a tool
# =====================================================================================

@dataclass
class CalculatorTask(tasks.Task):
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

    def transcript(self, numbers):
        """The correct response to ``numbers``, tool output included (EOS excluded)."""
        text, total = "", numbers[0]
        for x in numbers[1:]:
            text += f"{total}+{x}=" + self.calculator(f"{total}+{x}=")
            total += x
        return text + str(total)

    def draw(self, rng):
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        numbers = [rng.randint(lo, hi) for _ in range(self.horizon)]
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
class ChatCalculatorTask(tasks.Task):
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
        messages = [{"role": "user", "content": self.question(*demo_numbers)}]
        messages += self.messages(self.calls(demo_numbers))
        messages += [{"role": "assistant", "content": str(sum(demo_numbers))}]
        messages += [{"role": "user", "content": question}]
        return messages + self.messages(calls)

    @staticmethod
    def messages(calls):
        """(call, reply) turns as chat messages: the assistant's call, then the tool's reply."""
        out = []
        for call, reply in calls:
            out += [{"role": "assistant", "content": call}, {"role": "tool", "content": reply}]
        return out

    def prompt_text(self, tokenizer, question):
        return tokenizer.apply_chat_template(self.conversation(question), add_generation_prompt=True,
                                             tokenize=False)

    def calculator(self, turn):
        """The tool: ``"calc: 487 + 356"`` -> ``"843"``; ``calc:`` in another form -> the error."""
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
        """1 if the last integer of the last assistant turn is the sum, else 0 (``text`` is decoded without
        special tokens, so the turns are joined by ``\ntool\n`` and ``\nassistant\n``)."""
        last_turn = text.rsplit("\nassistant\n", 1)[-1]
        numbers = re.findall(r"-?\d+", last_turn.replace(",", ""))
        return float(bool(numbers) and numbers[-1] == answer)

    def max_new_tokens(self):
        return 32 * self.horizon
