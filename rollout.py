"""Rollouts for RL on a causal language model: prompts in, scored responses out.

Two jobs, in the order a training step needs them (the prompts and rewards come from tasks.py):

1. ``sample``: draw N responses per prompt from any ``transformers`` causal LM, one token at a
   time with the KV cache, recording log pi_tau(y_t), the log-prob *of the distribution actually
   sampled from* (temperature applied). A row stops at EOS, which is part of the response and of
   the mask (ending is an action the model must learn); after it the row is padded and masked.
   A task's tool or stop rule takes part in the loop through ``Turns`` (mask 0 on tool output).
2. ``score``: one forward pass over prompt + response that returns, for every response token,
   log pi_tau(y_t), sum_k pi_k^2 (``otb.sum_pi_squared``) and the entropy at the same temperature.
   The LM head runs in float32 on ``chunk_size`` positions at a time, each chunk's logits
   recomputed in the backward: the graph holds the last hidden states (B, T, H), never (B, T, V).

Layout: prompts are left-padded (every row's last prompt token in the same column), responses
right-padded; position ids come from the attention mask, so left padding shifts nothing.
"""
import inspect
from dataclasses import dataclass
from functools import partial

import torch
import torch.utils.checkpoint

import otb


# =====================================================================================
# Padding helpers
# =====================================================================================

def left_pad(seqs, pad_id):
    """List of token-id lists -> (ids, mask), both (B, P), padding on the left."""
    rows = [torch.tensor(s, dtype=torch.long) for s in seqs]
    pad = partial(torch.nn.utils.rnn.pad_sequence, batch_first=True, padding_side="left")
    return pad(rows, padding_value=pad_id), pad([torch.ones_like(r) for r in rows], padding_value=0)


def positions(attention_mask):
    """Position ids that ignore left padding: 0 at each row's first real token. (B, L)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# =====================================================================================
# Sampling with the KV cache
# =====================================================================================

@dataclass
class Rollout:
    """A batch of B = n_prompts * group_size responses; rows of one group are consecutive."""
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P) 1 on real prompt tokens
    response: torch.Tensor  # (B, T) right-padded with pad_id; a tool's output sits inside it
    response_mask: torch.Tensor  # (B, T) float, 1 on sampled tokens (EOS included), 0 on tool output
    group_index: torch.Tensor  # (B,) prompt id of each row
    logp: torch.Tensor  # (B, T) sampler's log pi_tau(y_t), 0 on padding and tool output
    finished: torch.Tensor  # (B,) bool, True where the row emitted EOS or a stop rule ended it
    # With a tool (None without one), per row: calls answered, error replies among them (Tool.is_error),
    # tool tokens forced in, and whether the limit cut a reply short (B,) each
    tool_calls: torch.Tensor = None
    tool_errors: torch.Tensor = None
    tool_tokens: torch.Tensor = None
    tool_cut: torch.Tensor = None


@torch.no_grad()
def sample(model, prompts, *, group_size, max_new_tokens, temperature, eos_id, pad_id,
           generator=None, tool=None, stop=None):
    """Sample ``group_size`` responses to every prompt (a list of token-id lists) -> a ``Rollout``.

    Each step draws y_t ~ softmax(z_t / tau) with ``torch.multinomial`` from ``generator`` (on the
    model's device) and records log pi_tau(y_t). ``tool`` and ``stop`` bring the environment into the
    loop (``Turns``). lab/fast_decode.py's ``sample`` is this loop with a compiled decode step and
    fewer reads on the host, for a GPU (train.py --compile-decode): the same tokens.
    """
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(group_size)]  # each prompt group_size times, in order
    ids, mask = (x.to(device) for x in left_pad(rows, pad_id))  # (B, P) each
    pos = positions(mask)  # (B, P)
    decoder = PlainDecoder(model)
    logits = decoder.prefill(ids, mask, pos)  # z_t of the last prompt position, (B, V)
    turns = Turns(len(ids), tool, stop, device) if tool is not None or stop is not None else None
    tokens, logps, actions = [], [], []
    done = torch.zeros(len(ids), dtype=torch.bool, device=device)  # rows that have ended, (B,)
    for t in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # log pi_tau, (B, V)
        y = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)  # y_t ~ pi_tau, (B,)
        action = ~done  # (B,) the positions the policy chooses
        if turns is not None:
            y, action = turns.force(y, action)  # a tool's output replaces the draws of its rows
        y = y.masked_fill(done, pad_id)  # ended rows only pad
        tokens.append(y)
        actions.append(action)
        logps.append(logprobs.gather(-1, y[:, None]).squeeze(-1).masked_fill(~action, 0.0))  # log pi_tau(y_t)
        ends = action & (y == eos_id)  # rows that end at this token, (B,)
        if turns is not None:
            ends = turns.ends(ends, action, y, tokens) | turns.stopped(tokens)  # a tool call goes on; a stop rule ends
        done = done | ends
        if done.all() or t == max_new_tokens - 1:  # no forward pass for a token that is never drawn
            break
        logits = decoder.step(y, pos[:, -1:] + 1 + t)  # one token through the cache at its position, (B, V)
    ro = Rollout(prompt_ids=ids, prompt_mask=mask, response=torch.stack(tokens, 1),  # (B, T) each from here
                 response_mask=torch.stack(actions, 1).float(), logp=torch.stack(logps, 1), finished=done,
                 group_index=torch.arange(len(prompts), device=device).repeat_interleave(group_size))
    return ro if turns is None else turns.finish(ro, pad_id)


class PlainDecoder:
    """The forward passes of ``sample``: a prefill over the prompts fills the KV cache, then each
    ``step`` feeds one token and the cache grows by one column."""

    def __init__(self, model):  # the model, and what its forward calls the KV cache
        self.model, self.cache_arg = model, cache_name(model)

    def prefill(self, ids, mask, pos, max_new_tokens=None):
        """The prompts (B, P) into the cache; returns the last position's logits z_t, (B, V). (A cache
        that grows needs no ``max_new_tokens``; lab/fast_decode.py's static one sizes itself by it.)"""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache, self.attn = getattr(out, self.cache_arg), mask
        return out.logits[:, -1]

    def step(self, y, pos):
        """Token y (B,) at positions pos (B, 1) -> the next logits, (B, V)."""
        self.attn = torch.cat([self.attn, self.attn.new_ones((len(y), 1))], dim=1)  # (B, P + t)
        out = self.model(input_ids=y[:, None], attention_mask=self.attn, position_ids=pos,
                         **{self.cache_arg: self.cache}, use_cache=True)
        self.cache = getattr(out, self.cache_arg)
        return out.logits[:, -1]


class Turns:
    """The environment's part in ``sample``: a tool's output forced into the responses, and a task's
    stop rule. Not used on the default path (a single-turn task that ends at EOS).

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
        self.calls, self.errors, self.forced_in = [0] * B, [0] * B, [0] * B  # calls, error replies, reply tokens
        self.keep = [None] * B  # per row: the tokens the stop rule keeps (None: not stopped)

    def force(self, y, action):
        """The queued tool tokens replace the draws of their rows, which are then not actions."""
        if not any(self.queue):
            return y, action
        forced = torch.tensor([len(q) > 0 for q in self.queue], device=self.device)  # (B,) bool
        y = y.clone()
        y[forced] = torch.tensor([q.pop(0) for q in self.queue if q], device=self.device)
        return y, action & ~forced

    def ends(self, ends, action, y, tokens):
        """The rows that end at this token: EOS, unless the token closed a tool call (a chat's turn
        end can be both), after which the row receives the tool's output."""
        if self.tool is None:
            return ends
        goes_on = torch.zeros_like(ends)  # (B,)
        for i in torch.nonzero(action & (y == self.tool.close_id)).flatten().tolist():
            call = torch.stack(tokens, 1)[i].tolist()
            output = self.tool.respond(call) if self.calls[i] < self.tool.max_calls else None
            if output is not None:  # None: not a call, an ordinary token
                self.calls[i] += 1
                self.queue[i] = list(output)
                self.errors[i] += bool(self.tool.is_error and self.tool.is_error(self.queue[i]))
                self.forced_in[i] += len(self.queue[i])
                goes_on[i] = True
        return ends & ~goes_on

    def stopped(self, tokens):
        """The rows the stop rule has ended, (B,) bool: it is asked about every row not stopped yet (one
        copy of the tokens to the host); none without a rule."""
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
            ro.response_mask, ro.logp = ro.response_mask.masked_fill(cut, 0.0), ro.logp.masked_fill(cut, 0.0)
        if self.tool is not None:
            per_row = lambda xs: torch.tensor(xs, device=self.device)  # noqa: E731
            ro.tool_calls, ro.tool_errors = per_row(self.calls), per_row(self.errors)
            # the tokens forced in, less the part of a reply the length limit cut off
            ro.tool_tokens = per_row([n - len(q) for n, q in zip(self.forced_in, self.queue)])
            ro.tool_cut = per_row([len(q) > 0 for q in self.queue])
        return ro


def cache_name(model):
    """What the model's forward calls its KV cache: ``cache`` in recent transformers (which warn
    that ``past_key_values`` goes away), ``past_key_values`` in earlier 5.x."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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
# Scoring: the training forward pass
# =====================================================================================

def score(model, prompt_ids, prompt_mask, response, response_mask, temperature, chunk_size=None):
    """log pi_tau(y_t), sum_k pi_k^2 and entropy of every response token, from one forward pass:
    (logp, sum_pi_sq, entropy), each (B, T) float32 and 0 on padding; only ``logp`` keeps its graph.
    ``chunk_size``: positions per run of the float32 LM head (None: all; the module docstring, item 2).
    Every position is attended to, whatever its mask: a tool's output is context, as it was for the
    sampler, and padding after a row's end is never seen by an earlier position (causal attention).
    """
    T = response.shape[1]  # response positions
    ids = torch.cat([prompt_ids, response], dim=1)  # (B, P+T)
    attn = torch.cat([prompt_mask.long(), torch.ones_like(response)], dim=1)  # (B, P+T)
    hidden = model.base_model(input_ids=ids, attention_mask=attn, position_ids=positions(attn),
                              use_cache=False).last_hidden_state  # (B, P+T, H); no KV cache to keep
    # The hidden state at column j predicts token j + 1, so columns P-1 .. P+T-2 score the response.
    h = hidden[:, -T - 1:-1]  # (B, T, H)
    head = model.get_output_embeddings()  # the LM head: z = W h (+ b)
    step = T if chunk_size is None else chunk_size
    # With chunks, the backward recomputes each chunk's logits from h instead of keeping them.
    run = _score_chunk if chunk_size is None else partial(torch.utils.checkpoint.checkpoint, _score_chunk,
                                                          use_reentrant=False)
    chunks = [run(h[:, s:s + step], response[:, s:s + step], head.weight, head.bias, temperature)
              for s in range(0, T, step)]  # a loop over memory chunks only
    m = response_mask.float()
    return tuple(torch.cat(x, 1) * m for x in zip(*chunks))  # (logp, sum_pi_sq, entropy), (B, T) each


def _score_chunk(h, y, weight, bias, temperature):
    """One chunk of c positions: hidden states h (B, c, H) and tokens y (B, c) -> log pi_tau(y_t)
    with its graph, and the detached sum_k pi_k^2 and entropy, all (B, c) float32."""
    with torch.autocast(h.device.type, enabled=False):  # the head in float32, whatever autocast says
        z = torch.nn.functional.linear(h.float(), weight.float(),
                                       None if bias is None else bias.float()) / temperature  # z / tau, (B, c, V)
        lse = torch.logsumexp(z, dim=-1)  # (B, c)
        logp = z.gather(-1, y[..., None]).squeeze(-1) - lse  # log pi_tau(y_t), (B, c)
        with torch.no_grad():
            spp = otb.sum_pi_squared(z)  # sum_k pi_k^2, (B, c)
            ent = lse - (torch.softmax(z, -1) * z).sum(-1)  # H = lse - E_pi[z], (B, c)
    return logp, spp, ent
