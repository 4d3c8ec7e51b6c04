"""Activation checkpointing: enabled once where a model is loaded, with no hook left on the input embeddings.

Hugging Face's ``activation_checkpointing_enable`` adds a forward hook to the input embeddings each
time it is called (making their output require grad, which only reentrant checkpointing needs) and
never removes the old ones. Enabled on every checkpointed pass, a run would carry one hook per pass:
every embedding call, decode steps included, runs all of them, and a compiled decode step (whose
guards include the hooks) is compiled again on every rollout; and on torch 2.11 dynamo cannot trace
the hook at all (``Tensor.requires_grad_()``), so a compiled decode step with checkpointing on stops
there. lab/models.py's load_model enables checkpointing once, as it loads the model (checkpoint_layers),
and removes the hook. These
tests run real training steps (train.train_step: rollout, score, update) of an untrained tiny model
with --activation-checkpointing and count what would grow, and trace the compiled decode step with
checkpointing on.
"""
import dataclasses

import pytest
import torch

from lab import fast_decode
from lab import models
import rollout
import tasks
import train
from lab import parse_options, options

pytestmark = pytest.mark.compile_path  # .ci/run: again under the lowest torch (conftest.py)

STEPS = 20
TOK = models.char_tokenizer()
# small and quick: 2 prompts x N = 2, strings of length 2 (at most a few new tokens each)
ARGS = ["--estimator", "otb", "--group-size", "2", "--prompts-per-step", "2", "--horizon", "2",
        "--activation-checkpointing", "--tiny-hidden", "32", "--tiny-layers", "1"]


def setup(*extra):
    """What train.main sets up: the options, the model with checkpointing enabled (as load_model enables
    it), an optimizer."""
    cfg = parse_options.parse(ARGS + list(extra), train.Config, options.PRESETS)
    model = models.checkpoint_layers(models.tiny_model(TOK, hidden=32, layers=1, seed=0).eval())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return cfg, model, opt, options.make_task(cfg), train.make_estimator(cfg.estimator, cfg.zero_tail)


def hooks(model):
    """Forward hooks (with and without kwargs) on the input embeddings, where enabling adds one."""
    emb = model.get_input_embeddings()
    return len(emb._forward_hooks) + len(emb._forward_pre_hooks)


def test_no_hook_is_left_on_the_embeddings_over_20_checkpointed_steps():
    cfg, model, opt, task, estimator = setup()
    assert model.is_activation_checkpointing and hooks(model) == 0  # enabled, and the hook removed
    counts = []
    for step in range(STEPS):
        train.train_step(cfg, model, model, opt, task, TOK, estimator, step)
        counts.append(hooks(model))
    assert counts == [0] * STEPS, counts


def test_every_model_a_run_loads_comes_checkpointed(tmp_path):
    """train.main's model, a comparison's later seeds' and the pilot's all come from options.load
    (compare.run_seeds loads fresh ones): with --activation-checkpointing each is loaded with its layers
    checkpointed, once, and no hook on the embeddings; without it, plain. Training then keeps the
    checkpointing function it was loaded with (a compiled decode step is not retraced)."""
    folder = tmp_path / "model"
    models.tiny_model(TOK, hidden=32, layers=1, seed=1).save_pretrained(folder)
    TOK.save_pretrained(folder)
    cfg, *_ = setup("--steps", "2", "--model", str(folder), "--task", "reverse", "--out", str(tmp_path))
    fresh, tok, _ = options.load(cfg, torch.device("cpu"))
    installed = fresh.model.layers[0]._gradient_checkpointing_func
    assert fresh.is_activation_checkpointing and hooks(fresh) == 0
    (tmp_path / "run").mkdir()
    train.train(cfg, tmp_path / "run", fresh, tok)
    assert fresh.model.layers[0]._gradient_checkpointing_func is installed and hooks(fresh) == 0
    plain, _, _ = options.load(dataclasses.replace(cfg, activation_checkpointing=False), torch.device("cpu"))
    assert not plain.is_activation_checkpointing


def test_the_hook_count_test_can_fail():
    """The failure it guards against: enabling adds a hook each time, and the hooks stay."""
    model = models.tiny_model(TOK, hidden=32, layers=1, seed=0)
    before = hooks(model)
    for _ in range(3):
        model.activation_checkpointing_enable({"use_reentrant": False})
    assert hooks(model) == before + 3


def test_checkpointed_layers_compute_the_update_and_the_rollout_keeps_its_cache():
    """With checkpointing on, the update's forward (train mode) saves far fewer activations than without
    it, and the rollout (eval mode) still samples through the KV cache: the same tokens as without."""
    cfg, model, opt, task, estimator = setup()
    plain = models.tiny_model(TOK, hidden=32, layers=1, seed=0).eval()
    prompts, _ = tasks.prompt_batch(task, TOK, 0, 0, 2)
    kw = dict(group_size=2, max_new_tokens=6, temperature=1.0, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)
    a = rollout.sample(model.eval(), prompts, generator=torch.Generator().manual_seed(0), **kw)
    b = rollout.sample(plain, prompts, generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(a.response, b.response)
    saved = {}
    for name, m in (("checkpointed", model), ("plain", plain)):
        sizes = {}

        def pack(t):
            sizes[t.data_ptr()] = t.numel()
            return t
        m.train()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            rollout.score(m, a.prompt_ids, a.prompt_mask, a.response, a.response_mask, 1.0)
        saved[name] = sum(sizes.values())
    assert saved["checkpointed"] < saved["plain"], saved


def compiled_graphs(monkeypatch):
    """The graphs dynamo hands the decode step's backend from here on (aot_eager runs them, as the other
    compile tests do): one per compile, so a recompile is a second graph."""
    compiled = []

    def counting(gm, example_inputs):
        compiled.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    monkeypatch.setattr(fast_decode, "BACKEND", counting)
    monkeypatch.setattr(fast_decode, "_compiled", {})
    return compiled


def test_the_compiled_decode_step_traces_with_checkpointing_on(monkeypatch):
    """fullgraph: the whole decode step traced by dynamo (a graph break would raise), with checkpointing
    enabled as load_model enables it: one graph, no hook inside it, and the plain sampler's tokens."""
    compiled = compiled_graphs(monkeypatch)
    cfg, model, _, task, _ = setup()
    model.eval()
    prompts, _ = tasks.prompt_batch(task, TOK, 0, 1, 2)
    kw = dict(group_size=2, max_new_tokens=6, temperature=1.0, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)
    for seed in (0, 1):
        fast = fast_decode.sample(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)
        plain = rollout.sample(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)
        T = plain.response.shape[1]
        assert torch.equal(fast.response[:, :T], plain.response)
    assert len(compiled) == 1 and hooks(model) == 0
    assert "requires_grad_" not in compiled[0].code  # the input-gradient hook is not in the traced step


def test_compiled_decoding_with_checkpointing_compiles_once_over_20_rollouts(monkeypatch, tmp_path):
    """--compile-decode --activation-checkpointing: a 20-step run of train.py's loop (train.train),
    each step one rollout of the same shape (4 rows, one cache length), compiles the decode step once.
    The backend counts the graphs dynamo hands it (aot_eager underneath, as the other compile tests
    use): a recompile, on a changed hook count or on checkpointing switched on after the first
    rollout, is a second graph."""
    compiled = compiled_graphs(monkeypatch)
    cfg, model, _, _, _ = setup("--compile-decode", "--steps", str(STEPS), "--log-every", "100")
    variants = fast_decode.compile_counts()["decode_step_graphs"]  # dynamo's cache entries on the decode step
    (tmp_path / "run").mkdir()
    history = train.train(cfg, tmp_path / "run", model, TOK)
    assert len(history) == STEPS
    assert len(compiled) == 1, f"{len(compiled)} graphs compiled over {STEPS} rollouts"
    assert fast_decode.compile_counts()["decode_step_graphs"] == variants + 1  # its one graph, no recompile
    assert hooks(model) == 0
