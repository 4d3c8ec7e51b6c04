"""Memory options change what is held, never the gradient: the chunked float32 head with its chunks
recomputed in the backward, activation checkpointing and micro-batches with gradient accumulation
give the one-pass gradient to float32 rounding, on the tiny model and on a small Llama with a large
vocabulary (and grouped-query attention, as SmolLM2 has)."""
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lab import models
import rollout
import train

PAD = 0


def tiny():
    return models.tiny_model(models.char_tokenizer(), hidden=32, layers=2, seed=0).eval()


def large_vocab():
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=50_000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def fabricated_batch(V, B=6, P=4, T=9, seed=0):
    """Left-padded prompts, right-padded responses of different lengths, one with a hole (tool
    output, mask 0 inside the response); advantages drawn at random on the valid tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, V, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = prompt_mask[4, :1] = 0
    prompt[prompt_mask == 0] = PAD
    lengths = torch.tensor([9, 3, 7, 1, 9, 5])[:B]
    m = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    m[0, 3:5] = 0  # a hole
    response = torch.where(m.bool() | (torch.arange(T)[None] < lengths[:, None]),
                           torch.randint(3, V, (B, T), generator=g), PAD)
    ro = rollout.Rollout(prompt_ids=prompt, prompt_mask=prompt_mask, response=response, response_mask=m,
                         group_index=torch.arange(B) // 3, logp=torch.zeros(B, T), finished=lengths < T)
    adv = torch.randn(B, T, generator=g) * m  # A_t, (B, T)
    return ro, adv


def checkpointing(model, on):
    """Activation checkpointing on (as models.load_model enables it) or off."""
    if on:
        models.checkpoint_layers(model)
    else:
        model.activation_checkpointing_disable()


def gradient(model, cfg, ro, adv):
    """The update's gradient (lr 0, no clipping) as train_step computes it (train mode; with
    --activation-checkpointing, the layers checkpointed), and the scoring outputs."""
    checkpointing(model, cfg.activation_checkpointing)
    model.train()  # as train_step switches it
    for p in model.parameters():
        p.grad = None
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with torch.set_grad_enabled(train.keep_scoring_graph(cfg, len(adv))):  # micro-batch by micro-batch
        logp, spp, ent = train.score_rows(model, cfg, ro, torch.arange(len(adv)))
    _, _, loss = train.policy_update(model, opt, cfg, ro, logp, adv, torch.Generator())
    assert model.is_activation_checkpointing == cfg.activation_checkpointing
    return {n: p.grad.clone() for n, p in model.named_parameters()}, (logp.detach(), spp, ent), loss


@pytest.mark.compile_path  # checkpointing: .ci/run runs it under the lowest torch too
@pytest.mark.parametrize("build", [tiny, large_vocab], ids=["tiny", "large-vocab"])
def test_chunked_checkpointed_micro_batched_gradient_equals_the_one_pass_gradient(build):
    model = build()
    ro, adv = fabricated_batch(model.config.vocab_size)
    base = dataclasses.replace(train.Config(), temperature=0.7, max_grad_norm=1e9)
    want, want_scores, want_loss = gradient(model, base, ro, adv)
    assert sum(g.norm() for g in want.values()) > 0
    for options in (dict(chunk_size=2), dict(activation_checkpointing=True), dict(micro_batch_rows=4),
                    dict(chunk_size=4, activation_checkpointing=True, micro_batch_rows=1),
                    dict(chunk_size=3, activation_checkpointing=True, micro_batch_rows=4)):
        got, scores, loss = gradient(model, dataclasses.replace(base, **options), ro, adv)
        for a, b in zip(scores, want_scores):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7), options
        for name, g in want.items():
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-7, msg=lambda m: f"{options} {name}: {m}")


def test_micro_batches_are_normalised_by_the_whole_batch_token_count():
    """Micro-batches of 2 rows hold 10, 8 and 14 tokens: each part divided by the whole batch's 32
    tokens, the logged loss (the sum of the parts) is the whole batch's token mean."""
    model = tiny()
    ro, adv = fabricated_batch(model.config.vocab_size)
    cfg = dataclasses.replace(train.Config(), max_grad_norm=1e9)
    _, _, whole = gradient(model, cfg, ro, adv)
    _, _, parts = gradient(model, dataclasses.replace(cfg, micro_batch_rows=2), ro, adv)
    assert parts == pytest.approx(whole, rel=1e-5)


def test_the_chunked_head_keeps_no_logits_for_the_backward():
    """What autograd saves for the backward, in bytes: without chunks the (B, T, V) float32 logits
    (kept by logsumexp) are saved; with chunks recomputed in the backward, no tensor of V columns is."""
    model = large_vocab()
    ro, _ = fabricated_batch(model.config.vocab_size)
    V = model.config.vocab_size

    def saved_with_vocab_columns(chunk_size):
        widths = []

        def pack(t):
            if t.dim() >= 2 and t.shape[-1] == V and t.dtype == torch.float32 and t.shape[0] != V:
                widths.append(t.numel())  # an activation of V columns (the head's weight is (V, H))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response, ro.response_mask, 1.0, chunk_size)
        return widths
    B, T = ro.response.shape
    assert max(saved_with_vocab_columns(None)) >= B * T * V
    assert saved_with_vocab_columns(3) == []


@pytest.mark.compile_path  # checkpointing: .ci/run runs it under the lowest torch too
def test_activation_checkpointing_keeps_only_the_layer_inputs():
    """With --activation-checkpointing the update's graph (train mode) saves far fewer activations (each
    layer's input; the rest is recomputed in the backward)."""
    model = large_vocab()
    ro, _ = fabricated_batch(model.config.vocab_size)
    params = {p.data_ptr() for p in model.parameters()}

    def saved(cfg):
        """Elements of the distinct activations the graph saves (the weights are held anyway)."""
        sizes = {}

        def pack(t):
            if t.data_ptr() not in params:
                sizes[t.data_ptr()] = t.numel()
            return t
        checkpointing(model, cfg.activation_checkpointing)
        model.train()  # as train_step switches it
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            cfg = dataclasses.replace(cfg, temperature=1.0, chunk_size=3)
            train.score_rows(model, cfg, ro, torch.arange(len(ro.response)))
        return sum(sizes.values())
    plain = saved(train.Config())
    assert saved(dataclasses.replace(train.Config(), activation_checkpointing=True)) < plain / 3
