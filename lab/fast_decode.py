"""A decode step that is not bound by Python: a static KV cache, a compiled forward pass, and a
sampler that rarely waits for the device.

``rollout.sample`` runs one small forward pass per new token. With its plain loop (a
``DynamicCache`` that grows by one column per token) each pass is a fresh sequence of small
kernels per layer launched from Python, with new tensor shapes every time; for a model of many
layers that launch cost, not the arithmetic, can set the time of a step. This file holds the two
optional decoders, ``decoder(model, "static" | "compiled")`` (and "plain", rollout.sample's own, to
compare them with), and ``sample``, rollout.sample's loop on such a decoder (the compiled one by
default; train.py ``--compile-decode``). The remedy that
transformers and torch provide is in two parts:

1. **A static cache** (``transformers.StaticCache``): keys and values live in tensors of a fixed
   shape (B, heads, L, head_dim), allocated once and written in place at the next column
   (``StaticLayer.update``: ``index_copy_`` at ``cumulative_length``, a 0-d tensor, so the
   position is data, not a Python int). Every decode step then has the same shapes: the token
   y (B, 1), its position (B, 1), the padding mask (B, L), and the cache.
2. **A compiled step**: ``torch.compile`` of that step (``fullgraph=True, dynamic=False``):
   inductor fuses the kernels; on a GPU ``mode="reduce-overhead"`` also records the step as a CUDA
   graph and replays it with one launch, which removes the Python cost per layer.

The padding mask is the prompt's (left padding) followed by ones: slots past the current token
hold zeros or stale values, and the causal mask (key index <= query index, the query index
counting from ``cumulative_length``) hides them, so the mask needs no update between steps.
Nor does building it wait for the device: with a cache of fixed size transformers always builds the
full mask, where with the plain loop's growing cache it first reads the padding mask on the host to
ask whether the mask can be skipped (a sync every step). The step itself reads nothing on the host.
L = P + max_new_tokens rounded up to a multiple of ``BUCKET``, so prompts of nearby lengths
share one compiled graph; one graph is compiled per (B, L, dtype, device). The cache is kept per
model and shape (``reset`` between calls) so that its tensors keep their addresses, which a CUDA
graph needs; it holds B x L slots for as long as the model lives. Every tensor the step writes (the
cache) has a static address, so a replay copies in only the step's token, position and mask.

``sample`` is rollout.sample's loop (the same Turns for a tool or a stop rule, the same Rollout)
with two changes for a GPU, where every read of a value on the host waits for the device:

- **The draw.** ``torch.multinomial`` reads two values of its input on the host every call (its
  checks: finite, not negative, rows not all zero). For one sample without replacement it draws
  ``argmax(pi / E)`` with E ~ Exp(1) from the generator (the exponential race); ``sample`` writes that
  out, so it draws the very tokens rollout.sample draws from the same generator, without the reads.
  The draws happen on the generator's device (train.py makes it on the model's).
- **``sync_every``.** The host looks at the tokens (``done.all()``, a stop rule) every ``sync_every``
  steps (default: 1 on the CPU, else 8) instead of every step; a stop rule cuts a row back to where
  it would have stopped, so the rollout is the same (up to padding columns at the end).

So the tokens are rollout.sample's whenever the logits are: with the plain decoder, bit for bit;
attention over L slots instead of the grown cache sums in another order, so with the static and
compiled decoders the logits agree to float32 rounding (tested: tests/test_naive_fast_decode.py).

``count_step`` counts what a decode step asks of the host (operators launched, kernels inside the
compiled step, syncs); ``compile_counts`` and ``compiled_since`` what compiling did (graphs, recompiles,
CUDA-graph skips, and whether inductor's kernels were built or read from this machine's cache). What
this buys on a CPU: docs/cost.md; on a GPU: docs/training.md, "Time".
"""
import collections
import weakref

import torch
from tqdm.auto import tqdm

import rollout  # left_pad, positions, prefill, decode_step, cache_name, Rollout
import tool_use

BUCKET = 64  # cache length granularity: prompts of nearby lengths reuse one compiled graph


def _forward(model, y, attn, pos, cache, cache_arg="cache"):
    """One decode step on the static cache: token y (B, 1) -> logits (B, V). What gets compiled.
    cache_arg: the forward's name for the cache (rollout.cache_name)."""
    return model(input_ids=y, attention_mask=attn, position_ids=pos, use_cache=True,
                 **{cache_arg: cache}).logits[:, -1]


BACKEND = "inductor"  # torch.compile's backend; the fast tests trace with "aot_eager" instead
_compiled = {}  # (backend, mode) -> the compiled _forward (dynamo keeps a graph per shape, model)
_caches = weakref.WeakKeyDictionary()  # model -> {(B, L, dtypes, device): StaticCache}


def compiled_forward(cuda):
    """``_forward`` compiled once per process: CUDA graphs on a GPU, inductor's kernels on a CPU."""
    key = (BACKEND, "reduce-overhead" if cuda and BACKEND == "inductor" else None)
    if key not in _compiled:
        _compiled[key] = torch.compile(_forward, backend=key[0], mode=key[1], fullgraph=True,
                                       dynamic=False)
    return _compiled[key]


class PlainDecoder:
    """rollout.sample's own forward passes (``rollout.prefill``, ``rollout.decode_step``: a cache that grows
    by one column per token) as a decoder of ``sample``, which holds the cache and the columns attended to."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids, mask, pos, max_new_tokens):
        """The prompts (B, P) into a new cache -> the last position's logits z_t, (B, V). ``max_new_tokens``
        goes unread: every decoder takes it, and only a cache of fixed size (``StaticDecoder``) needs it."""
        logits, self.cache = rollout.prefill(self.model, ids, mask, pos)
        self.attn = mask  # (B, P)
        return logits

    def step(self, y, pos):
        """Feed token y (B,) at positions pos (B, 1); returns the next logits, (B, V)."""
        self.attn = torch.cat([self.attn, self.attn.new_ones((len(y), 1))], dim=1)  # (B, P + t + 1)
        logits, self.cache = rollout.decode_step(self.model, y, pos, attn=self.attn, cache=self.cache)
        return logits


class StaticDecoder:
    """Decode steps of fixed shapes over a ``StaticCache``; with ``compile``, a compiled step."""

    def __init__(self, model, compile=False):
        self.model, self.compile, self.cache_arg = model, compile, rollout.cache_name(model)
        self.forward = compiled_forward(next(model.parameters()).is_cuda) if compile else _forward

    def prefill(self, ids, mask, pos, max_new_tokens):
        """One pass over the prompts (B, P) into the model's static cache of L slots (reset);
        returns the last position's logits z_t, (B, V)."""
        from transformers import StaticCache
        B, P = ids.shape
        # slots: the prompt and every sampled token (the loop feeds the last one too, unused)
        L = -(-(P + max_new_tokens) // BUCKET) * BUCKET
        device = ids.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        key = (B, L, next(self.model.parameters()).dtype, autocast, ids.device)
        caches = _caches.setdefault(self.model, {})  # kept: the cache tensors keep their addresses
        if key not in caches:
            caches[key] = StaticCache(config=self.model.config, max_cache_len=L)
            if self.compile:  # the first call of a shape compiles it: say so, not a silent minute
                tqdm.write(f"compiling the decode step for {B} sequences of {L} positions (once per shape; "
                           "about a minute on a CPU, less on a GPU)")
        self.cache = caches[key]
        self.cache.reset()  # zeros and cumulative_length 0 (allocated at its first prefill)
        self.attn = torch.cat([mask, mask.new_ones((B, L - P))], dim=1)  # (B, L), fixed for the call
        # the prefill is not compiled: its shape (B, P) changes with every batch of prompts
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: self.cache})
        return out.logits[:, -1]

    def step(self, y, pos):
        """Feed token y (B,) at positions pos (B, 1); returns the next logits, (B, V)."""
        if self.compile:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        logits = self.forward(self.model, y[:, None], self.attn, pos, self.cache, self.cache_arg)  # (B, V)
        return logits.clone() if self.compile else logits  # a CUDA graph reuses its output buffer


DECODERS = {"plain": PlainDecoder, "static": StaticDecoder,
            "compiled": lambda model: StaticDecoder(model, compile=True)}


def decoder(model, decode):
    """The decoder named by ``decode``, for ``sample(decoder=...)``: "plain" (rollout.sample's own, a
    cache that grows), "static" (a static cache) or "compiled" (and a compiled step)."""
    if decode not in DECODERS:
        raise ValueError(f"decode must be one of {', '.join(DECODERS)}; got {decode!r}")
    return DECODERS[decode](model)


@torch.no_grad()
def sample(model, prompts, *, group_size, max_new_tokens, temperature, eos_id, pad_id,
           generator=None, tool=None, stop=None, decoder=None, sync_every=None):
    """rollout.sample on ``decoder`` (default: the compiled step; any of ``decoder(model, name)``) with
    the draw written out and the host's reads every ``sync_every`` steps (the module docstring): the
    same arguments, the same Rollout, the same tokens whenever the decoder's logits are the same."""
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(group_size)]
    ids, mask = (x.to(device) for x in rollout.left_pad(rows, pad_id))  # (B, P) each
    pos = rollout.positions(mask)  # (B, P)
    decoder = decoder or StaticDecoder(model, compile=True)
    logits = decoder.prefill(ids, mask, pos, max_new_tokens)  # (B, V)
    turns = tool_use.Turns(len(ids), tool, stop, device) if tool is not None or stop is not None else None
    sync_every = sync_every or (1 if device.type == "cpu" else 8)
    draw_on = device if generator is None else generator.device  # where the draws happen
    tokens, logps, actions = [], [], []
    done = torch.zeros(len(ids), dtype=torch.bool, device=device)  # (B,)
    for t in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # log pi_tau, (B, V)
        probs = logprobs.exp().to(draw_on)  # pi_tau, (B, V)
        race = torch.empty_like(probs).exponential_(1, generator=generator)  # E ~ Exp(1), (B, V)
        y = (probs / race).argmax(-1).to(device)  # y_t ~ pi_tau as torch.multinomial draws it, (B,)
        action = ~done
        if turns is not None:
            y, action = turns.force(y, action)
        y = y.masked_fill(done, pad_id)
        tokens.append(y)
        actions.append(action)
        logps.append(logprobs.gather(-1, y[:, None]).squeeze(-1).masked_fill(~action, 0.0))
        ends = action & (y == eos_id)
        if turns is not None:
            ends = ends & ~turns.run_tool(action, y, tokens)
        done = done | ends
        if (t + 1) % sync_every == 0 or t + 1 == max_new_tokens:  # the host looks at the tokens
            if turns is not None:
                done = done | turns.apply_stop_rule(tokens)
            if bool(done.all()) or t + 1 == max_new_tokens:  # no decode pass for a token never drawn
                break
        logits = decoder.step(y, pos[:, -1:] + 1 + t)  # (B, V)
    ro = rollout.Rollout(prompt_ids=ids, prompt_mask=mask, response=torch.stack(tokens, 1),
                         response_mask=torch.stack(actions, 1).float(), logp=torch.stack(logps, 1), finished=done,
                         group_index=torch.arange(len(prompts), device=device).repeat_interleave(group_size))
    return ro if turns is None else turns.finish(ro, pad_id)


# =====================================================================================
# What a decode step asks of the host (docs/cost.md)
# =====================================================================================

# Operators that launch no work of their own: views, allocations, dtype queries, and the read of a
# value (counted apart, as a sync). A profiler event is counted when it launches work and no operator
# around it does (so linear counts once, not again for the mm inside it).
NO_WORK = {"view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "slice", "select", "unsqueeze", "squeeze",
           "transpose", "t", "permute", "as_strided", "alias", "detach", "unbind", "split", "chunk", "narrow",
           "flatten", "lift_fresh", "contiguous", "to", "empty", "empty_like", "empty_strided", "new_empty",
           "resize_", "result_type", "resolve_conj", "resolve_neg", "item", "_local_scalar_dense", "is_nonzero"}


def count_step(model, decode, batch=4, prompt=47, steps=(9, 17)):
    """What one decode step of ``sample`` asks of the host, counted with torch.profiler on
    ``batch`` random prompts of ``prompt`` - 2 to ``prompt`` tokens (left padding), no row ending:

    - ``decoder_ops`` and ``sampler_ops``: operators dispatched from Python that launch work (each a
      kernel launch on a GPU), in the decoder's step and in the sampler's own per-token work;
    - ``compiled_kernels``: the kernels inside a compiled step (inductor's on a CPU, counted only
      where the step was compiled in this call; one CUDA-graph replay on a GPU launches them all);
    - ``decoder_syncs`` and ``sampler_syncs``: reads of a value on the host (aten::_local_scalar_dense:
      an .item() or a bool() of a tensor, also inside native operators), each a wait for the device on
      a GPU. The host reads the tokens every 8 steps, as on a GPU.

    Per decode step: the difference of two calls of steps[0] and steps[1] decode steps (the prefill and
    the loop's ends cancel), after a call that compiles."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (prompt - i % 3,), generator=g).tolist() for i in range(batch)]

    class Labelled:  # the decoder, its steps marked in the profile
        def __init__(self, inner):
            self.inner = inner

        def prefill(self, *args):
            return self.inner.prefill(*args)

        def step(self, y, pos):
            with torch.profiler.record_function("decode step"):
                return self.inner.step(y, pos)

    def counts(n):
        with torch.profiler.profile() as prof:
            sample(model, prompts, group_size=1, max_new_tokens=n, temperature=1.0, eos_id=-1, pad_id=0,
                   generator=torch.Generator().manual_seed(0), decoder=Labelled(decoder(model, decode)), sync_every=8)
        found = collections.Counter()
        for e in prof.events():
            around, p = [], e.cpu_parent
            while p is not None:
                around.append(p.name)
                p = p.cpu_parent
            where = "decoder" if "decode step" in around else "sampler"
            compiled = any("Compiled" in name for name in around)
            op = e.name.removeprefix("aten::") if e.name.startswith("aten::") else None
            outermost = op and op not in NO_WORK and not any(  # no operator that works around it
                a.startswith("aten::") and a.removeprefix("aten::") not in NO_WORK for a in around)
            if op == "_local_scalar_dense":
                found[f"{where}_syncs"] += 1
            elif compiled and (outermost or "cpp_fused" in e.name):
                found["compiled_kernels"] += 1
            elif outermost:
                found[f"{where}_ops"] += 1
        return found

    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):  # inductor's CPU kernels in the profile
        sample(model, prompts, group_size=1, max_new_tokens=2, temperature=1.0, eos_id=-1, pad_id=0,
               decoder=decoder(model, decode))
    a, b = counts(steps[0]), counts(steps[1])
    keys = ("decoder_ops", "sampler_ops", "compiled_kernels", "decoder_syncs", "sampler_syncs")
    return {k: (b[k] - a[k]) / (steps[1] - steps[0]) for k in keys}


# =====================================================================================
# What compiling did (the preflight and benchmarks/gpu_probe.py report it)
# =====================================================================================

def compile_counts():
    """What this process has compiled so far, read from ``torch._dynamo.utils.counters`` and from
    dynamo's cache on the decode step:

    - ``graphs``: graphs dynamo handed to a backend (counters stats.unique_graphs), any function's;
    - ``decode_step_graphs``: compiled variants of the decode step (``_forward``'s cache entries: one
      per batch size; in dynamo's terms each after the first is a recompile, a guard that failed);
    - ``cudagraph_skips``: compiled functions inductor declined to record as a CUDA graph
      (counters inductor.cudagraph_skips; it logs why);
    - ``fx_cache_hits``, ``fx_cache_misses``: inductor's FX-graph cache (counters inductor.fxgraph_cache_hit
      and fxgraph_cache_miss): a miss generates and builds the kernels, a hit reads them from this
      machine's cache folder (TORCHINDUCTOR_CACHE_DIR, by default under the system's temporary folder).

    (torch's counters.recompiles is not used: it does not move when a new shape recompiles.)"""
    from torch._dynamo import eval_frame
    from torch._dynamo.utils import counters
    return dict(graphs=counters["stats"]["unique_graphs"],
                decode_step_graphs=len(eval_frame._debug_get_cache_entry_list(_forward.__code__)),
                cudagraph_skips=counters["inductor"]["cudagraph_skips"],
                fx_cache_hits=counters["inductor"]["fxgraph_cache_hit"],
                fx_cache_misses=counters["inductor"]["fxgraph_cache_miss"])


def compiled_since(before):
    """``compile_counts()`` less ``before`` (an earlier ``compile_counts()``), plus ``recompiles``, the
    decode step's variants added beyond its first, and ``cache``: "cold" where inductor's FX-graph cache
    missed (it built kernels, as a machine that never compiled this graph does), "warm" where it only hit
    (kernels read from this machine's cache), "none" where inductor compiled nothing (no new graph, or
    another backend)."""
    now = compile_counts()
    added = {k: now[k] - before[k] for k in now}
    first = before["decode_step_graphs"] == 0 and added["decode_step_graphs"] > 0  # the step's first compile
    added["recompiles"] = added["decode_step_graphs"] - int(first)
    added["cache"] = "cold" if added["fx_cache_misses"] else "warm" if added["fx_cache_hits"] else "none"
    return added

