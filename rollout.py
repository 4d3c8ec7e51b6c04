"""Rollouts for RL on a causal language model: prompts in, scored responses out.

Two jobs, in the order a training step needs them (the prompts and rewards come from tasks.py):

1. ``sample``: draw N responses per prompt from any ``transformers`` causal LM, one token at a
   time with the KV cache, recording log pi_tau(y_t), the log-prob *of the distribution actually
   sampled from* (temperature applied). A row stops at EOS, which is part of the response and of
   the mask (ending is an action the model must learn); after it the row is padded and masked.
   A task's tool or stop rule takes part in the loop through ``tool_use.Turns`` (mask 0 on tool output).
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
from tool_use import Turns


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
    loop (``tool_use.Turns``). lab/fast_decode.py's ``sample`` is this loop with a compiled decode step
    and fewer reads on the host, for a GPU (train.py --compile-decode): the same tokens.
    """
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(group_size)]  # each prompt group_size times, in order
    ids, mask = (x.to(device) for x in left_pad(rows, pad_id))  # (B, P) each
    pos = positions(mask)  # (B, P)
    logits, cache = prefill(model, ids, mask, pos)  # z_t of the last prompt position (B, V), and the KV cache
    attn = mask  # the columns each row attends to, (B, P); one more for every token fed
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
        logp_y = logprobs.gather(-1, y[:, None]).squeeze(-1)  # log pi_tau(y_t), (B,)
        logps.append(logp_y.masked_fill(~action, 0.0))  # 0 where the policy did not choose
        ends = action & (y == eos_id)  # rows that end at this token, (B,)
        if turns is not None:
            ends = ends & ~turns.run_tool(action, y, tokens)  # a row that closed a call goes on with the reply
            ends = ends | turns.apply_stop_rule(tokens)  # a row whose graded part is complete ends
        done = done | ends
        if done.all() or t == max_new_tokens - 1:  # no forward pass for a token that is never drawn
            break
        attn = torch.cat([attn, attn.new_ones((len(y), 1))], dim=1)  # (B, P + t + 1)
        logits, cache = decode_step(model, y, pos[:, -1:] + 1 + t, attn=attn, cache=cache)  # y at its position, (B, V)
    group_index = torch.arange(len(prompts), device=device).repeat_interleave(group_size)  # (B,)
    ro = Rollout(prompt_ids=ids, prompt_mask=mask, response=torch.stack(tokens, 1),  # (B, T) each from here
                 response_mask=torch.stack(actions, 1).float(), logp=torch.stack(logps, 1),
                 finished=done, group_index=group_index)
    return ro if turns is None else turns.finish(ro, pad_id)


def prefill(model, ids, mask, pos):
    """The forward pass over the prompts (B, P) that fills a new KV cache -> the last position's logits
    z_t (B, V), and the cache."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], getattr(out, cache_name(model))


def decode_step(model, y, pos, *, attn, cache):
    """The forward pass of one token y (B,) at positions pos (B, 1), attending to the columns of attn
    (B, P + t + 1) -> the next logits (B, V), and the cache one column longer."""
    arg = cache_name(model)
    out = model(input_ids=y[:, None], attention_mask=attn, position_ids=pos, use_cache=True, **{arg: cache})
    return out.logits[:, -1], getattr(out, arg)


def cache_name(model):
    """What the model's forward calls its KV cache: ``cache`` in recent transformers (which warn
    that ``past_key_values`` goes away), ``past_key_values`` in earlier 5.x."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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
    if chunk_size is None:
        run = _score_chunk
    else:  # the backward recomputes each chunk's logits from h instead of keeping them
        run = partial(torch.utils.checkpoint.checkpoint, _score_chunk, use_reentrant=False)
    chunks = [run(h[:, s:s + step], response[:, s:s + step], head.weight, head.bias, temperature)
              for s in range(0, T, step)]  # a loop over memory chunks only
    m = response_mask.float()
    return tuple(torch.cat(x, 1) * m for x in zip(*chunks))  # (logp, sum_pi_sq, entropy), (B, T) each


def _score_chunk(h, y, weight, bias, temperature):
    """One chunk of c positions: hidden states h (B, c, H) and tokens y (B, c) -> log pi_tau(y_t)
    with its graph, and the detached sum_k pi_k^2 and entropy, all (B, c) float32."""
    with torch.autocast(h.device.type, enabled=False):  # the head in float32, whatever autocast says
        bias = None if bias is None else bias.float()
        z = torch.nn.functional.linear(h.float(), weight.float(), bias) / temperature  # z / tau, (B, c, V)
        lse = torch.logsumexp(z, dim=-1)  # (B, c)
        logp = z.gather(-1, y[..., None]).squeeze(-1) - lse  # log pi_tau(y_t), (B, c)
        with torch.no_grad():
            spp = otb.sum_pi_squared(z)  # sum_k pi_k^2, (B, c)
            ent = lse - (torch.softmax(z, -1) * z).sum(-1)  # H = lse - E_pi[z], (B, c)
    return logp, spp, ent
