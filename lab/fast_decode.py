"""A decode step that is not bound by Python: a static KV cache and a compiled forward pass.

``rollout.sample`` runs one small forward pass per new token. With its plain loop (a
``DynamicCache`` that grows by one column per token) each pass is a fresh sequence of small
kernels per layer launched from Python, with new tensor shapes every time; for a model of many
layers that launch cost, not the arithmetic, can set the time of a step. This file holds the two
optional decoders that ``rollout.sample(decoder=decoder(model, "static" | "compiled"))``
(train.py ``--compile-decode``) uses instead of its ``PlainDecoder``. The remedy that transformers
and torch provide is in two parts:

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
L = P + max_new_tokens rounded up to a multiple of ``BUCKET``, so prompts of nearby lengths
share one compiled graph; one graph is compiled per (B, L, dtype, device). The cache is kept per
model and shape (``reset`` between calls) so that its tensors keep their addresses, which a CUDA
graph needs; it holds B x L slots for as long as the model lives.

Only the model's forward pass changes. The sampler's loop (the draws from its generator, EOS,
a tool's forced tokens) is the same code for every decoder, so the tokens are the plain loop's
whenever the logits are; attention over L slots instead of the grown cache sums in another
order, so the logits agree to float32 rounding, not bit for bit (tested: tests/test_naive_fast_decode.py).

What this buys on a CPU, and what is not yet measured on a GPU: docs/cost.md.
"""
import weakref

import torch
from tqdm.auto import tqdm

import rollout  # cache_name

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


DECODERS = {"plain": rollout.PlainDecoder, "static": StaticDecoder,
            "compiled": lambda model: StaticDecoder(model, compile=True)}


def decoder(model, decode):
    """The decoder named by ``decode``, for ``rollout.sample(decoder=...)``: "plain" (rollout's own,
    a cache that grows), "static" (a static cache) or "compiled" (and a compiled step)."""
    if decode not in DECODERS:
        raise ValueError(f"decode must be one of {', '.join(DECODERS)}; got {decode!r}")
    return DECODERS[decode](model)
