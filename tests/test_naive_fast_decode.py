"""fast_decode.py against the plain loop: the static cache (eager and compiled) gives its rollouts.

The plain loop (``rollout.PlainDecoder``, a cache that grows by one column per token) is the reference.
On the same generator seed the static cache must give the same tokens, masks and finished flags,
and the log-probs to float32 rounding (attention over L slots sums in another order), with and
without a tool, with rows that end early and with a batch that fills the cache to its last slot.

torch.compile is checked in two ways. In the suite, dynamo traces the whole step (``fullgraph``)
with the ``aot_eager`` backend, a few seconds: the graph has no breaks and computes the same
rollout. Inductor's code generation (the backend ``--compile-decode`` uses) takes 30-45 s on a
2-core CPU for this model, so that test runs under CI (CI=true, as .ci/run sets) or with
``OTB_SLOW_TESTS=1``, and is skipped in a plain local run.
"""
import os

import pytest
import torch

from lab import fast_decode
from lab import models
import rollout
import tasks

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
    return rollout.sample(model, batch or prompts(), group_size=group_size, max_new_tokens=max_new,
                          temperature=temperature, eos_id=eos_id, pad_id=PAD, tool=tool,
                          decoder=fast_decode.decoder(model, decode),
                          generator=torch.Generator().manual_seed(seed))


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
    return tasks.Tool(close_id=close, respond=lambda ids: [x] * (1 + len(ids) % 3), max_calls=2)


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


def test_the_traced_compiled_step_gives_the_plain_loops_rollout(monkeypatch, capsys):
    """torch.compile(fullgraph=True) traces the whole decode step (a graph break would raise);
    the aot_eager backend runs the traced graph without generating code. Compiling a shape says
    so in one line, once."""
    monkeypatch.setattr(fast_decode, "BACKEND", "aot_eager")
    model, tool = tiny(layers=1, seed=2), calls_on("a")
    for seed in (5, 6):  # the second call reuses the compiled graph and the cache
        assert_same_rollout(draw(model, "plain", seed=seed, tool=tool, max_new=24),
                            draw(model, "compiled", seed=seed, tool=tool, max_new=24))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("compiling")]
    assert len(said) == 1 and "once per shape" in said[0] and "minute" in said[0], said


@pytest.mark.skipif(not (os.environ.get("OTB_SLOW_TESTS") or os.environ.get("CI")),
                    reason="inductor compiles for 30-45 s on a 2-core CPU; CI runs it, and OTB_SLOW_TESTS=1")
def test_the_inductor_compiled_step_gives_the_plain_loops_rollout():
    model, tool = tiny(layers=1, seed=2), calls_on("a")
    for seed in (5, 6):
        assert_same_rollout(draw(model, "plain", seed=seed, tool=tool, max_new=24),
                            draw(model, "compiled", seed=seed, tool=tool, max_new=24))


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
