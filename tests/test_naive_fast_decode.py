"""fast_decode.py against the plain loop: the static cache (eager and compiled) gives its rollouts.

The plain loop (``rollout.sample``: ``rollout.decode_step``, a cache that grows by one column per token,
and torch.multinomial) is the reference; ``fast_decode.sample`` runs the static decoders. On the same
generator seed the static cache must give the same tokens, masks and finished flags,
and the log-probs to float32 rounding (attention over L slots sums in another order), with and
without a tool, with rows that end early and with a batch that fills the cache to its last slot.

torch.compile is checked in two ways. In the suite, dynamo traces the whole step (``fullgraph``)
with the ``aot_eager`` backend, a few seconds: the graph has no breaks and computes the same
rollout. Inductor's code generation (the backend ``--compile-decode`` uses) takes 30-45 s on a
2-core CPU for this model, so that test runs under CI (CI=true, as .ci/run sets) or with
``OTB_SLOW_TESTS=1``, and is skipped in a plain local run. Both count the recompiles: none after the
first call of a shape.

What a decode step asks of the host (``fast_decode.count_step``, torch.profiler): the static and
compiled steps read nothing on the host, the plain loop's reads the padding mask once; compiled, the
step is one operator from Python whatever the depth. What a CUDA graph of the step needs, checked
on the CPU: every tensor the step writes has a static address.
"""
import os

import pytest
import torch

from lab import fast_decode
from lab import models
import rollout
import tasks
import tool_use

pytestmark = pytest.mark.compile_path  # .ci/run: again under the lowest torch (conftest.py)

TOK = models.char_tokenizer()
EOS, PAD = TOK.eos_token_id, TOK.pad_token_id


def tiny(layers=2, seed=0):
    """The model train.py trains, untrained (hidden 32): its draws are spread over the vocabulary."""
    return models.tiny_model(TOK, hidden=32, layers=layers, seed=seed).eval()


def prompts(n=5, horizon=8):
    """Reverse-task prompts of different lengths (3 to 10 tokens): left padding matters."""
    return tasks.prompt_batch(tasks.ReverseTask(horizon=horizon), TOK, seed=0, step=1, n_prompts=n)[0]


def draw(model, decode, *, seed, tool=None, eos_id=EOS, max_new=18, group_size=3, temperature=1.0,
         batch=None):
    """rollout.sample ("plain"), or fast_decode.sample on the decoder named ``decode``."""
    kw = dict(group_size=group_size, max_new_tokens=max_new, temperature=temperature, eos_id=eos_id, pad_id=PAD,
              tool=tool, generator=torch.Generator().manual_seed(seed))
    if decode == "plain":
        return rollout.sample(model, batch or prompts(), **kw)
    return fast_decode.sample(model, batch or prompts(), decoder=fast_decode.decoder(model, decode), **kw)


def assert_same_rollout(a, b):
    """Tokens, masks and finished flags exactly; log-probs to float32 rounding."""
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)
    assert torch.equal(a.response, b.response)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.finished, b.finished)
    torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=1e-5)


def calls_on(char):
    """A tool called by every sampled ``char``: it forces 1 to 3 tokens that depend on the row so far."""
    close, x = TOK.convert_tokens_to_ids(char), TOK.convert_tokens_to_ids("x")
    return tool_use.Tool(close_id=close, respond=lambda ids: [x] * (1 + len(ids) % 3), max_calls=2)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_static_cache_gives_the_plain_loops_rollouts(temperature):
    model = tiny(seed=1)
    ended = 0
    for seed in (0, 1, 2):  # the static cache is kept between calls and reset: every call agrees
        plain = draw(model, "plain", seed=seed, temperature=temperature)
        assert_same_rollout(plain, draw(model, "static", seed=seed, temperature=temperature))
        ended += int(plain.finished.sum())
    assert 0 < ended < 3 * 15, "some rows end early, some run to the limit"


def test_static_cache_with_a_tool_gives_the_plain_loops_rollout():
    model, tool = tiny(seed=2), calls_on("a")
    plain = draw(model, "plain", seed=3, tool=tool, max_new=24)
    assert int((plain.response_mask == 0).logical_and(plain.response != PAD).sum()) > 0, "tool output forced"
    assert_same_rollout(plain, draw(model, "static", seed=3, tool=tool, max_new=24))


def test_a_batch_that_fills_the_static_cache_to_its_last_slot():
    """No row ends (EOS id -1), and prompt + fed tokens = P + max_new = 64 = the cache length (the
    loop feeds the last sampled token too)."""
    batch = prompts()
    P = max(map(len, batch))
    max_new = fast_decode.BUCKET - P
    model = tiny()
    plain = draw(model, "plain", seed=4, eos_id=-1, max_new=max_new, batch=batch)
    assert plain.response.shape[1] == max_new and not plain.finished.any()
    assert_same_rollout(plain, draw(model, "static", seed=4, eos_id=-1, max_new=max_new, batch=batch))


def graphs(monkeypatch):
    """The graphs (and their example inputs) dynamo hands the backend from now on; aot_eager runs them."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(list(example_inputs))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    monkeypatch.setattr(fast_decode, "BACKEND", backend)
    monkeypatch.setattr(fast_decode, "_compiled", {})
    return seen


def recompiles():
    """Compiled variants of the decode step so far (dynamo's cache entries on it): a recompile adds one.
    (torch's counters["recompiles"] does not move when a new shape recompiles.)"""
    return fast_decode.compile_counts()["decode_step_graphs"]


def test_the_traced_compiled_step_gives_the_plain_loops_rollout(monkeypatch, capsys):
    """torch.compile(fullgraph=True) traces the whole decode step (a graph break would raise);
    the aot_eager backend runs the traced graph without generating code. Compiling a shape says
    so in one line, once, and later calls of that shape compile nothing."""
    seen, before = graphs(monkeypatch), recompiles()
    model, tool = tiny(layers=1, seed=2), calls_on("a")
    for seed in (5, 6, 7):  # later calls reuse the compiled graph and the cache
        assert_same_rollout(draw(model, "plain", seed=seed, tool=tool, max_new=24),
                            draw(model, "compiled", seed=seed, tool=tool, max_new=24))
    assert len(seen) == 1 and recompiles() == before + 1  # the shape's one graph: no recompile after it
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("compiling")]
    assert len(said) == 1 and "once per shape" in said[0] and "minute" in said[0], said


def test_a_cuda_graph_of_the_step_copies_in_only_its_token_position_and_mask(monkeypatch):
    """What recording the compiled step as a CUDA graph needs, checked on the CPU: every tensor the
    step writes in place (the cache's keys, values and length) has a static address, as the weights
    do, so a replay reads and writes them where they are; the only inputs a replay copies in are the
    token (B, 1), its position (B, 1) and the padding mask (B, L)."""
    seen = graphs(monkeypatch)
    model, B, max_new = tiny(layers=2, seed=2), 15, 10
    dec = fast_decode.decoder(model, "compiled")
    fast_decode.sample(model, prompts(), group_size=3, max_new_tokens=max_new, temperature=1.0, eos_id=-1,
                       pad_id=PAD, decoder=dec, generator=torch.Generator().manual_seed(0))
    inputs = [x for x in seen[0] if isinstance(x, torch.Tensor)]
    static = [hasattr(x, "_dynamo_static_input_type") for x in inputs]
    versions = [x._version for x in inputs]
    dec.step(torch.zeros(B, dtype=torch.long), torch.full((B, 1), 30))  # one more step on the same cache
    written = [x._version != v for x, v in zip(inputs, versions)]
    cache = {id(t) for layer in dec.cache.layers for t in (layer.keys, layer.values)}
    assert sum(id(x) in cache for x, w in zip(inputs, written) if w) == 2 * 2  # keys and values of 2 layers
    assert all(s for s, w in zip(static, written) if w)
    L = dec.attn.shape[1]
    assert sorted(tuple(x.shape) for x, s in zip(inputs, static) if not s) == [(B, 1), (B, 1), (B, L)]


def test_the_static_and_compiled_steps_never_wait_for_the_device(monkeypatch):
    """fast_decode.count_step: the plain loop's step reads the padding mask on the host once (whether
    transformers may skip it), the static step never; compiled, the step is one operator from Python
    (the copy of its output) whatever the depth, the model's work inside it. The sampler's draw reads
    nothing (torch.multinomial's input checks would read two values a token)."""
    graphs(monkeypatch)
    counts = {(layers, d): fast_decode.count_step(tiny(layers=layers), d, steps=(3, 5))
              for layers in (1, 3) for d in ("plain", "static", "compiled")}
    for layers in (1, 3):
        plain, static, compiled = (counts[layers, d] for d in ("plain", "static", "compiled"))
        assert plain["decoder_syncs"] == 1 and static["decoder_syncs"] == 0 == compiled["decoder_syncs"]
        assert compiled["decoder_ops"] == 1 and compiled["compiled_kernels"] > 20 * layers
        assert plain["compiled_kernels"] == 0 == static["compiled_kernels"]
        assert plain["sampler_ops"] == static["sampler_ops"] == compiled["sampler_ops"] > 0  # the same loop
        assert plain["sampler_syncs"] == 0 == compiled["sampler_syncs"]  # the draw reads nothing on the host
    assert counts[3, "plain"]["decoder_ops"] > counts[1, "plain"]["decoder_ops"] + 40  # Python launches each layer


@pytest.mark.skipif(not (os.environ.get("OTB_SLOW_TESTS") or os.environ.get("CI")),
                    reason="inductor compiles for 30-45 s on a 2-core CPU; CI runs it, and OTB_SLOW_TESTS=1")
def test_the_inductor_compiled_step_gives_the_plain_loops_rollout():
    model, tool = tiny(layers=1, seed=2), calls_on("a")
    before = recompiles()
    for seed in (5, 6, 7):
        assert_same_rollout(draw(model, "plain", seed=seed, tool=tool, max_new=24),
                            draw(model, "compiled", seed=seed, tool=tool, max_new=24))
    assert recompiles() == before + 1  # the shape's one graph: no recompile after it


def test_an_unknown_decode_names_the_choices():
    with pytest.raises(ValueError, match="'fast'.*plain, static, compiled|plain, static, compiled.*'fast'"):
        draw(tiny(layers=1), "fast", seed=0)


def test_train_py_compile_decode_changes_only_the_sampler_rounding(tmp_path, monkeypatch):
    """Two steps of the tiny train.py run, plain and with --compile-decode (traced, aot_eager): the
    same metrics (tokens, rewards, advantages, loss, gradient norms) except the sampler / trainer
    mismatch, which measures float32 rounding of the sampler's log-probs, and the wall times."""
    import tiny_runs
    monkeypatch.setattr(fast_decode, "BACKEND", "aot_eager")
    tiny_runs.run(tmp_path, "plain", "--estimator", "otb", "--steps", "2")
    tiny_runs.run(tmp_path, "compiled", "--estimator", "otb", "--steps", "2", "--compile-decode")
    rounding = {"mismatch_mean_abs", "mismatch_max_abs", "mismatch_k3"}
    plain, compiled = (tiny_runs.without_times(tiny_runs.metrics(tmp_path / name))
                       for name in ("plain", "compiled"))
    assert [{k: v for k, v in r.items() if k not in rounding} for r in plain] == \
        [{k: v for k, v in r.items() if k not in rounding} for r in compiled]
    assert all(abs(a["mismatch_max_abs"] - b["mismatch_max_abs"]) < 1e-5 for a, b in zip(plain, compiled))
