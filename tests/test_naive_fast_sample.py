"""The learner's sampler and the fast one draw the same tokens from the same generator.

rollout.sample draws with ``torch.multinomial(probs, 1, generator=gen)``; lab/fast_decode.py's
``sample`` writes out what ATen's multinomial does for one sample without replacement, the
exponential race ``argmax(probs / E)`` with E ~ Exp(1) from the same generator, which spares the two
host reads of multinomial's input checks, and looks at the tokens on the host only every
``sync_every`` steps. Checked here: the race equals torch.multinomial draw for draw (and leaves the
generator in the same state), and on the same generator seed the two samplers give the same
rollouts, bit for bit on the same decoder, over several rollouts with a tool and with a stop rule.
"""
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


def test_the_exponential_race_is_torch_multinomial():
    """For one sample, argmax(p / E), E ~ Exp(1) drawn from the generator, is torch.multinomial's draw,
    on distributions with zeros and near-one-hot ones too, and both use the generator alike."""
    g = torch.Generator().manual_seed(0)
    for seed in range(50):
        logits = torch.randn(7, 40, generator=g) * (0.3 + seed / 5)  # flat to nearly one-hot
        logits[:, :3] = -torch.inf  # tokens that cannot be drawn
        probs = torch.softmax(logits, dim=-1)  # (B, V)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(5):
            want = torch.multinomial(probs, 1, generator=a).squeeze(-1)
            got = (probs / torch.empty_like(probs).exponential_(1, generator=b)).argmax(-1)
            assert torch.equal(got, want)
        assert torch.equal(a.get_state(), b.get_state())


def model(seed):
    """The tiny model train.py trains, untrained: its draws are spread over the vocabulary."""
    return models.tiny_model(TOK, hidden=32, layers=1, seed=seed).eval()


def prompts(n=4):
    return tasks.prompt_batch(tasks.ReverseTask(horizon=8), TOK, seed=0, step=3, n_prompts=n)[0]


def calls_on(char):
    """A tool called by every sampled ``char``: it forces 1 to 3 tokens that depend on the row so far."""
    close, x = TOK.convert_tokens_to_ids(char), TOK.convert_tokens_to_ids("x")
    return tool_use.Tool(close_id=close, respond=lambda ids: [x] * (1 + len(ids) % 3), max_calls=2)


def stop_after(char):
    """A stop rule: a row keeps its tokens up to and including its first ``char``."""
    y = TOK.convert_tokens_to_ids(char)
    return lambda i, ids: ids.index(y) + 1 if y in ids else None


def assert_same(plain, fast):
    """The same rollout: the fast one may run on to its next look at the host, in columns of padding."""
    T = plain.response.shape[1]
    assert fast.response.shape[1] >= T
    assert torch.equal(fast.response[:, :T], plain.response)
    assert torch.equal(fast.response_mask[:, :T], plain.response_mask)
    assert torch.equal(fast.logp[:, :T], plain.logp)
    assert torch.equal(fast.finished, plain.finished)
    assert (fast.response[:, T:] == PAD).all() and not fast.response_mask[:, T:].any()
    for name in ("tool_calls", "tool_errors", "tool_tokens", "tool_cut"):
        a, b = getattr(plain, name), getattr(fast, name)
        assert (a is None and b is None) or torch.equal(a, b), name


@pytest.mark.parametrize("sync_every", [1, 8])
@pytest.mark.parametrize("env", ["none", "tool", "stop", "tool and stop"])
def test_both_samplers_give_the_same_rollouts_on_the_same_generator(env, sync_every):
    tool = calls_on("a") if "tool" in env else None
    stop = stop_after("c") if "stop" in env else None
    seen = {"tool output": 0, "stopped": 0, "eos": 0}
    for seed in range(4):
        m = model(seed)
        kw = dict(group_size=3, max_new_tokens=20, temperature=1.0 if seed % 2 else 0.7, eos_id=EOS, pad_id=PAD,
                  tool=tool, stop=stop)
        plain = rollout.sample(m, prompts(), generator=torch.Generator().manual_seed(seed), **kw)
        fast = fast_decode.sample(m, prompts(), generator=torch.Generator().manual_seed(seed),
                                  decoder=fast_decode.decoder(m, "plain"), sync_every=sync_every, **kw)
        assert_same(plain, fast)
        seen["tool output"] += int(((plain.response_mask == 0) & (plain.response != PAD)).sum())
        seen["eos"] += int((plain.response == EOS).sum())
        if stop is not None:
            ended = plain.finished & ~(plain.response == EOS).any(-1)  # ended by the rule, not by EOS
            seen["stopped"] += int(ended.sum())
    assert seen["eos"] > 0
    assert (seen["tool output"] > 0) == (tool is not None) and (seen["stopped"] > 0) == (stop is not None), seen


def test_the_static_decoder_gives_the_learners_tokens_too():
    """On the static cache (what the compiled step runs) the logits agree to float32 rounding only, and
    the tokens are rollout.sample's all the same, here with a tool and a stop rule."""
    for seed in range(3):
        m = model(seed)
        kw = dict(group_size=3, max_new_tokens=20, temperature=1.0, eos_id=EOS, pad_id=PAD, tool=calls_on("a"),
                  stop=stop_after("c"))
        plain = rollout.sample(m, prompts(), generator=torch.Generator().manual_seed(seed), **kw)
        fast = fast_decode.sample(m, prompts(), generator=torch.Generator().manual_seed(seed),
                                  decoder=fast_decode.decoder(m, "static"), sync_every=8, **kw)
        T = plain.response.shape[1]
        assert torch.equal(fast.response[:, :T], plain.response) and torch.equal(fast.finished, plain.finished)
        torch.testing.assert_close(fast.logp[:, :T], plain.logp, rtol=0, atol=1e-5)
