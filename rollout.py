"""Rollouts for RL on a causal language model: prompts in, scored responses out.

Two jobs, in the order a training step needs them (the prompts and rewards come from tasks.py):

1. ``sample``: draw N responses per prompt from any ``transformers`` causal LM, one token at a
   time with the KV cache. Each step samples y_t ~ softmax(z_t / tau) and records
   log pi_tau(y_t), the log-prob *of the distribution actually sampled from* (temperature
   applied). A row stops at EOS (the EOS token is part of the response and of the mask: ending
   is an action the model must learn); after that it is padded and masked out. With a task's
   ``Tool`` the responses are multi-turn: when a row closes a call, the tool's output is forced
   into it over the next positions (a per-row queue, in the same loop), with mask 0: holes inside
   the response that are context for the policy but not its actions. The forward passes are the
   plain loop's (a cache that grows by a column per token); ``decode="static"`` or
   ``"compiled"`` (train.py ``--compile-decode``) runs them on fast_decode.py's static cache.
2. ``score``: one forward pass over prompt + response that returns, for every response token,
   log pi_tau(y_t), sum_k pi_k^2 (through ``otb.sum_pi_squared``) and the entropy, all at the
   same temperature as sampling. The LM head runs in float32 on ``chunk_size`` positions at a
   time, and each chunk's logits are recomputed in the backward: the graph holds the last hidden
   states (B, T, H), never the (B, T, V) logits.

Layout: prompts are left-padded (so every row's last prompt token sits in the same column),
responses are right-padded; ``position_ids`` are computed from the attention mask, so left
padding does not shift positions.
"""
import inspect
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from lab import fast_decode
import otb


# =====================================================================================
# Padding helpers
# =====================================================================================

def left_pad(seqs, pad_id):
    """List of token-id lists -> (ids, mask), both (B, P), padding on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


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
           generator=None, tool=None, decode="plain", stop=None, sync_every=None):
    """Sample ``group_size`` responses to every prompt (a list of token-id lists).

    Returns a ``Rollout`` on the model's device. ``generator`` (a torch.Generator) makes the
    draws reproducible, and the draws happen on its device: a CPU generator with a model on a GPU
    would copy the (B, V) probabilities to the CPU at every token (a copy and a wait per token; not
    timed here), so train.py gives the sampler a generator on the GPU there (and a CPU one, the
    default, everywhere else).

    ``tool`` (a ``tasks.Tool``: close_id, respond, max_calls; or None) makes the responses
    multi-turn. Each row keeps a queue of forced tokens: while it is not empty, the row's next
    token is taken from it instead of the draw (every row is still drawn for, so the random stream
    does not depend on the tool), and the position gets mask 0 and log-prob 0. A forced token is context like any other: it goes
    through the same batched decode step into the KV cache, and the policy's next token sees it.
    Without a tool, or before a row's first call, sampling is exactly the single-turn sampler.

    ``stop`` (or None) is the environment's stop rule, as a stop string is in vLLM: ``stop(i, ids)``
    gets row i's response tokens so far (a list) and returns how many of them the row keeps once
    the part its reward grades is complete, or None while it is not. The row then ends there: the
    tokens after that point are cut (padding, mask 0, log-prob 0) and the row is ``finished``.

    ``sync_every``: decode steps between the checks that need the tokens on the host (whether
    every row has ended, the stop rule). Without a tool the loop otherwise never waits for the
    device, so on a GPU the checks come every 8 steps (rows that ended earlier only pad, and a stop
    rule cuts back to where it would have stopped: the same rollout, up to 7 columns of padding);
    on the CPU, where nothing waits, every step (default None: 1 on the CPU, 8 elsewhere). A tool
    needs the tokens at every step, so with a tool the loop waits every step anyway.

    ``decode`` picks how the forward passes run: "plain" (the default, a cache that grows by one
    column per token), or fast_decode.py's "static" (a static cache of fixed shape) or "compiled"
    (the static cache with a ``torch.compile``'d step; CUDA graphs on a GPU). The loop around
    them is the same, so the three give the same tokens unless float32 rounding of the logits (which
    differs: attention sums over another number of slots) flips a draw.
    """
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(group_size)]  # each prompt repeated N times
    ids, mask = left_pad(rows, pad_id)  # (B, P)
    ids, mask = ids.to(device), mask.to(device)
    B = ids.shape[0]
    group_index = torch.arange(len(prompts), device=device).repeat_interleave(group_size)  # (B,)

    # Prefill: one pass over the prompts fills the cache; keep only the last position's logits.
    pos = positions(mask)  # (B, P)
    if decode == "plain":  # a cache that grows by one column per token
        decoder, cache_arg = None, cache_name(model)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache, attn, logits = getattr(out, cache_arg), mask, out.logits[:, -1]  # logits z_t: (B, V)
    else:  # a static cache, its decode step compiled or not (fast_decode.py)
        decoder = fast_decode.decoder(model, decode)
        logits = decoder.prefill(ids, mask, pos, max_new_tokens)  # logits z_t: (B, V)
    next_pos = pos[:, -1:] + 1  # (B, 1)

    tokens, logps, actions = [], [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    queue = [[] for _ in range(B)]  # per row: the tool's output tokens still to be forced
    calls, errors, forced_in = [0] * B, [0] * B, [0] * B  # per row: tool calls, error replies, reply tokens
    keep = [None] * B  # per row: the tokens a stop rule keeps (None: not stopped)
    if sync_every is None:
        sync_every = 1 if device.type == "cpu" else 8
    for t in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # log pi_tau, (B, V)
        draw_on = generator.device if generator is not None else device
        y = torch.multinomial(logprobs.exp().to(draw_on), 1, generator=generator).to(device)  # (B, 1)
        y = y.squeeze(-1)  # (B,)
        action = ~done  # (B,) positions the policy chooses
        if tool is not None and any(queue):  # the environment's tokens replace the draws of those rows
            forced = torch.tensor([len(q) > 0 for q in queue], device=device)  # (B,) bool
            y[forced] = torch.tensor([q.pop(0) for q in queue if q], device=device)
            action = action & ~forced
        y = y.masked_fill(done, pad_id)  # finished rows only pad
        actions.append(action)
        tokens.append(y)
        logps.append(logprobs.gather(-1, y[:, None]).squeeze(-1).masked_fill(~action, 0.0))
        if tool is None:
            done = done | (action & (y == eos_id))
        else:  # a row that just closed a call receives the tool's output next
            goes_on = torch.zeros_like(done)  # (B,) rows whose closing token was a call (a chat's turn end too)
            for i in torch.nonzero(action & (y == tool.close_id)).flatten().tolist():
                output = tool.respond(torch.stack(tokens, 1)[i].tolist()) if calls[i] < tool.max_calls else None
                if output is not None:  # None: not a call, an ordinary token
                    calls[i] += 1
                    queue[i] = list(output)
                    errors[i] += bool(tool.is_error and tool.is_error(queue[i]))
                    forced_in[i] += len(queue[i])
                    goes_on[i] = True
            done = done | (action & (y == eos_id) & ~goes_on)
        if (t + 1) % sync_every == 0 or t + 1 == max_new_tokens:  # the host looks at the tokens
            if stop is not None:
                done = apply_stop(stop, tokens, keep, done)
            if bool(done.all()) or t + 1 == max_new_tokens:  # no decode pass for a token never drawn
                break
        # Decode one token: the cache holds every earlier key/value, so the pass costs O(1) tokens.
        if decoder is None:
            attn = torch.cat([attn, attn.new_ones((B, 1))], dim=1)  # (B, P + t)
            out = model(input_ids=y[:, None], attention_mask=attn, position_ids=next_pos,
                        **{cache_arg: cache}, use_cache=True)
            cache, logits = getattr(out, cache_arg), out.logits[:, -1]  # (B, V)
        else:
            logits = decoder.step(y, next_pos)  # (B, V)
        next_pos = next_pos + 1

    response, m, logp = torch.stack(tokens, 1), torch.stack(actions, 1).float(), torch.stack(logps, 1)  # (B, T)
    if stop is not None:  # cut each stopped row after the tokens it keeps (the last check asked the rule)
        kept = torch.tensor([response.shape[1] if n is None else n for n in keep], device=device)  # (B,)
        cut = torch.arange(response.shape[1], device=device)[None] >= kept[:, None]  # (B, T)
        response, m, logp = response.masked_fill(cut, pad_id), m.masked_fill(cut, 0.0), logp.masked_fill(cut, 0.0)
    per_row = (lambda xs: torch.tensor(xs, device=device)) if tool is not None else (lambda xs: None)
    return Rollout(prompt_ids=ids, prompt_mask=mask, response=response, response_mask=m,
                   group_index=group_index, logp=logp, finished=done,
                   tool_calls=per_row(calls), tool_errors=per_row(errors),
                   tool_tokens=per_row([n - len(q) for n, q in zip(forced_in, queue)]),  # the cut part never came
                   tool_cut=per_row([len(q) > 0 for q in queue]))


def apply_stop(stop, tokens, keep, done):
    """Ask the stop rule about every row not stopped yet (one copy of the tokens to the host);
    records in ``keep`` how many tokens a newly stopped row keeps; returns ``done`` with those rows."""
    so_far = torch.stack(tokens, 1).tolist()  # (B, t) on the host
    for i, row in enumerate(so_far):
        if keep[i] is None:
            keep[i] = stop(i, row)
    stopped = torch.tensor([n is not None for n in keep], device=done.device)  # (B,)
    return done | stopped


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
    """log pi_tau(y_t), sum_k pi_k^2 and entropy of every response token, from one forward pass.

    Returns (logp, sum_pi_sq, entropy), each (B, T) float32 and 0 on padding. ``logp`` keeps
    the autograd graph (it is what the policy-gradient loss differentiates); ``sum_pi_sq`` and
    ``entropy`` are detached diagnostics. ``chunk_size`` = response positions per chunk
    (None: all at once).

    The pass runs the decoder (``model.base_model``) to its last hidden states h, then the LM head
    z = W h (+ b) in float32 (autocast off), ``chunk_size`` positions at a time. A chunk's logits are
    recomputed from h in the backward (``torch.utils.checkpoint``), so the graph keeps h, (B, T, H),
    and never more than one chunk's (B, c, V) logits: the full float32 (B, T, V) tensor is never held,
    not even for the backward of logsumexp. Without ``chunk_size`` it is one chunk, not recomputed.

    Every response position is attended to, whatever its mask: a tool's output (mask 0) is part
    of the context of the tokens after it, as it was for the sampler. Padding after a row's end
    is attended to as well, which changes nothing: attention is causal, so a position only ever
    sees the ones before it, and the outputs at padding are multiplied by the mask.
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
    logp, spp, ent = [], [], []
    for s in range(0, T, step):  # a loop over memory chunks only
        args = (h[:, s:s + step], response[:, s:s + step], head.weight, head.bias, temperature)
        if chunk_size is None:
            out = _score_chunk(*args)
        else:  # the backward recomputes this chunk's logits from h instead of keeping them
            out = torch.utils.checkpoint.checkpoint(_score_chunk, *args, use_reentrant=False)
        for lst, x in zip((logp, spp, ent), out):
            lst.append(x)
    m = response_mask.float()
    return torch.cat(logp, 1) * m, torch.cat(spp, 1) * m, torch.cat(ent, 1) * m


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
