"""Activation checkpointing over many steps: enabled once per model, so nothing piles up.

Hugging Face's ``activation_checkpointing_enable`` adds a forward hook to the input embeddings each
time it is called and never removes the old ones. Enabled on every checkpointed pass, a run would
carry one hook per pass: every embedding call, decode steps included, runs all of them, and a
compiled decode step (whose guards include the hooks) is compiled again on every rollout.
train.RecomputeLayers enables it once per model. These tests run 20 real training steps
(train.train_step: rollout, score, update) of an untrained tiny model with
--activation-checkpointing and count what would grow.
"""
import pytest
import torch

from lab import fast_decode
from lab import models
import tasks
import train
from lab import parse_options, train_cli

STEPS = 20
TOK = models.char_tokenizer()
# small and quick: 2 prompts x N = 2, strings of length 2 (at most a few new tokens each)
ARGS = ["--estimator", "otb", "--group-size", "2", "--prompts-per-step", "2", "--horizon", "2",
        "--activation-checkpointing", "--tiny-hidden", "32", "--tiny-layers", "1"]


def setup(*extra):
    cfg = parse_options.parse(ARGS + list(extra), train.Config, train_cli.PRESETS)
    model = models.tiny_model(TOK, hidden=32, layers=1, seed=0).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return cfg, model, opt, tasks.make_task(cfg), train.make_estimator(cfg.estimator, cfg.zero_tail)


def hooks(model):
    """Forward hooks (with and without kwargs) on the input embeddings, where enabling adds one."""
    emb = model.get_input_embeddings()
    return len(emb._forward_hooks) + len(emb._forward_pre_hooks)


def test_the_hook_count_is_constant_over_20_checkpointed_steps():
    cfg, model, opt, task, estimator = setup()
    counts = []
    for step in range(STEPS):
        train.train_step(cfg, model, model, opt, task, TOK, estimator, step)
        counts.append(hooks(model))
    assert model.is_activation_checkpointing  # the option did enable it
    assert counts == [counts[0]] * STEPS and counts[0] >= 1, counts


def test_the_hook_count_test_can_fail():
    """The failure it guards against: enabling on every pass adds a hook each time."""
    model = models.tiny_model(TOK, hidden=32, layers=1, seed=0)
    before = hooks(model)
    for _ in range(3):
        model.activation_checkpointing_enable({"use_reentrant": False})
    assert hooks(model) == before + 3


def test_compiled_decoding_with_checkpointing_compiles_once_over_20_rollouts(monkeypatch, tmp_path):
    """--compile-decode --activation-checkpointing: a 20-step run of train.py's loop (train.train),
    each step one rollout of the same shape (4 rows, one cache length), compiles the decode step once.
    The backend counts the graphs dynamo hands it (aot_eager underneath, as the other compile tests
    use): a recompile, on a changed hook count or on checkpointing switched on after the first
    rollout, is a second graph."""
    compiled = []

    def counting(gm, example_inputs):
        compiled.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    monkeypatch.setattr(fast_decode, "BACKEND", counting)
    monkeypatch.setattr(fast_decode, "_compiled", {})
    cfg, model, _, _, _ = setup("--compile-decode", "--steps", str(STEPS), "--log-every", "100")
    recompiles = sum(torch._dynamo.utils.counters["recompiles"].values())
    (tmp_path / "run").mkdir()
    history = train.train(cfg, tmp_path / "run", model, TOK)
    assert len(history) == STEPS
    assert len(compiled) == 1, f"{len(compiled)} graphs compiled over {STEPS} rollouts"
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == recompiles
    assert hooks(model) == 1
