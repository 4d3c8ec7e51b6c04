"""rollout.py: sampling shapes / masks / EOS, score against a naive per-sequence loop, tasks."""
import math
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import rollout
import tasks
import tool_use

PAD, BOS, EOS, V = 0, 1, 2, 12


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    return LlamaForCausalLM(cfg).eval()


def fixed_distribution_model(bias):
    """A model whose next-token logits are ``bias`` whatever the context (lm_head: W = 0, b)."""
    model = tiny_llama()
    head = torch.nn.Linear(32, V, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(bias)
    model.lm_head = head
    return model


PROMPTS = [[BOS, 3, 4, 5, 6], [BOS, 7], [BOS, 8, 9]]  # different lengths: left padding matters


def draw(model, group_size=3, max_new_tokens=10, temperature=1.0, seed=0):
    return rollout.sample(model, PROMPTS, group_size=group_size, max_new_tokens=max_new_tokens,
                          temperature=temperature, eos_id=EOS, pad_id=PAD,
                          generator=torch.Generator().manual_seed(seed))


def test_sample_shapes_masks_and_eos():
    ro = draw(tiny_llama(), seed=3)
    B, T = ro.response.shape
    assert B == 9 and T <= 10
    assert ro.group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ro.prompt_ids.shape == ro.prompt_mask.shape == (9, 5)
    assert ro.prompt_mask[3].tolist() == [0, 0, 0, 1, 1]  # left padded
    assert ro.response_mask.shape == ro.logp.shape == (B, T)
    m = ro.response_mask
    assert (m[:, 1:] <= m[:, :-1]).all(), "mask must be 1s then 0s"
    assert set(ro.finished.tolist()) == {True, False}, "this seed gives both endings"
    for i in range(B):
        n = int(m[i].sum())
        row = ro.response[i].tolist()
        if ro.finished[i]:
            assert row[n - 1] == EOS and EOS not in row[:n - 1]  # stops at the first EOS, keeps it
        else:
            assert n == 10 and EOS not in row  # truncated at max_new_tokens
        assert all(t == PAD for t in row[n:])
    assert (ro.logp[m == 0] == 0).all() and (ro.logp[m == 1] < 0).all()


def test_sampler_log_probs_are_those_of_the_tempered_distribution():
    bias = torch.linspace(-1.0, 1.0, V)
    bias[EOS] = -2.0
    for tau in (1.0, 0.5):
        ro = draw(fixed_distribution_model(bias), temperature=tau)
        expected = torch.log_softmax(bias / tau, -1)[ro.response]  # closed form, (B, T)
        m = ro.response_mask.bool()
        torch.testing.assert_close(ro.logp[m], expected[m], atol=1e-5, rtol=0)


def test_certain_eos_gives_one_token_responses():
    bias = torch.zeros(V)
    bias[EOS] = 50.0
    ro = draw(fixed_distribution_model(bias))
    assert ro.response.shape == (9, 1) and (ro.response == EOS).all() and ro.finished.all()


def test_same_generator_seed_gives_the_same_rollout():
    a, b = draw(tiny_llama(), seed=5), draw(tiny_llama(), seed=5)
    assert torch.equal(a.response, b.response) and torch.equal(a.logp, b.logp)


def test_without_a_generator_the_draws_follow_the_global_seed_of_the_model_device():
    model = tiny_llama()

    def run(seed):
        torch.manual_seed(seed)  # the global generator of the model's device (the CPU here)
        return rollout.sample(model, PROMPTS, group_size=3, max_new_tokens=10, temperature=1.0,
                              eos_id=EOS, pad_id=PAD).response
    assert torch.equal(run(11), run(11))
    assert any(not torch.equal(run(11), run(s)) for s in (12, 13, 14))


def naive_scores(model, prompt, response, tau):
    """One sequence at a time, no padding: log pi_tau(y_t), sum pi^2 and entropy by definition."""
    ids = torch.tensor([prompt + response])
    z = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double() / tau  # (T, V)
    pi = torch.softmax(z, -1)
    logp = torch.log_softmax(z, -1)[torch.arange(len(response)), response]
    return logp, (pi ** 2).sum(-1), -(pi * torch.log(pi)).sum(-1)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_score_equals_naive_per_sequence_recomputation(tau):
    model = tiny_llama(seed=1)
    ro = draw(model, temperature=tau, seed=2)
    logp, spp, ent = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response,
                                   ro.response_mask, tau)
    m = ro.response_mask
    for i in range(len(m)):
        n = int(m[i].sum())
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist()
        ref_logp, ref_spp, ref_ent = naive_scores(model, prompt, ro.response[i, :n].tolist(), tau)
        torch.testing.assert_close(logp[i, :n].double(), ref_logp, atol=2e-5, rtol=0)
        torch.testing.assert_close(spp[i, :n].double(), ref_spp, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ent[i, :n].double(), ref_ent, atol=2e-5, rtol=0)
        assert (logp[i, n:] == 0).all() and (spp[i, n:] == 0).all()
    # the KV-cache sampler and the full forward pass agree on the same tokens
    torch.testing.assert_close(ro.logp, logp.detach(), atol=2e-5, rtol=0)
    assert logp.requires_grad and not spp.requires_grad


def test_chunked_and_unchunked_scores_agree():
    model = tiny_llama(seed=4)
    ro = draw(model, seed=6)
    args = (model, ro.prompt_ids, ro.prompt_mask, ro.response, ro.response_mask, 1.0)
    full = rollout.score(*args, chunk_size=None)
    for chunk in (1, 3, 100):
        for a, b in zip(rollout.score(*args, chunk_size=chunk), full):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_rewards_sit_at_the_last_valid_token():
    class CharTok:  # decode ids 3.. as letters; 0-2 are special
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i - 3) for i in ids if i > 2)
    task = tasks.ReverseTask(horizon=2)
    ro = rollout.Rollout(prompt_ids=None, prompt_mask=None,
                         response=torch.tensor([[4, 3, EOS], [4, 3, 5], [3, EOS, PAD]]),
                         response_mask=torch.tensor([[1., 1, 1], [1, 1, 1], [1, 1, 0]]),
                         group_index=torch.tensor([0, 0, 0]), logp=None,
                         finished=torch.tensor([True, False, True]))
    R, token_rewards, texts = tasks.rewards(task, CharTok(), ro, ["ba"], group_size=3)
    assert texts == ["ba", "bac", "a"]
    assert R.tolist() == [1.0, 0.0, 0.0]
    assert token_rewards.tolist() == [[0, 0, 1], [0, 0, 0], [0, 0, 0]]


def test_reverse_task_prompts_rewards_and_horizon():
    task = tasks.ReverseTask(horizon=6)
    pairs = task.sample(random.Random(0), 200)
    assert all(3 <= len(q) <= 6 and a == q[::-1] for q, a in pairs)
    assert {len(q) for q, _ in pairs} == {3, 4, 5, 6}
    assert task.reward("cba", "cba", finished=True) == 1.0
    assert task.reward("cba", "cba", finished=False) == 0.0  # no EOS: truncated, not an answer
    assert task.reward("cb", "cba", finished=True) == 0.0


def test_prompt_stream_depends_only_on_seed_and_step():
    class Tok:
        bos_token = "<bos>"
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}
    task = tasks.ReverseTask()
    a = tasks.prompt_batch(task, Tok(), seed=0, step=3, n_prompts=5)
    assert a == tasks.prompt_batch(task, Tok(), seed=0, step=3, n_prompts=5)
    assert a != tasks.prompt_batch(task, Tok(), seed=0, step=4, n_prompts=5)
    assert a != tasks.prompt_batch(task, Tok(), seed=1, step=3, n_prompts=5)


def test_arithmetic_reward_checks_the_exact_number():
    task = tasks.ArithmeticTask(horizon=2)
    q, a = task.sample(random.Random(1), 1)[0]
    x, y = [int(t) for t in q.split("?")[0].split() if t.isdigit()]
    assert a == str(x + y) and 10 <= x <= 99 and 10 <= y <= 99
    assert task.reward(f"The answer is {a}.", a, True) == 1.0
    assert task.reward(f"{int(a) + 1}", a, True) == 0.0
    assert task.reward("no idea", a, True) == 0.0


def test_periodic_task_answers_have_exactly_horizon_characters():
    import random
    for n in (1, 5, 16, 64, 257):
        task = tasks.PeriodicTask(horizon=n)
        for pattern, answer in task.sample(random.Random(n), 20):
            assert len(pattern) == 5 and len(answer) == n
            assert all(answer[i] == pattern[i % 5] for i in range(n))  # the pattern, repeated
        assert task.max_new_tokens() == n + 4  # the answer, EOS, and slack
    task = tasks.PeriodicTask(horizon=7)
    assert task.reward("abcdeab", "abcdeab", True) == 1.0
    assert task.reward("abcdeab", "abcdeab", False) == 0.0  # cut off before EOS
    assert task.reward("abcdeabc", "abcdeab", True) == 0.0  # one character too many


# ----------------------------------------------------------------------------- multi-turn sampling

def test_sampling_without_a_tool_is_unchanged():
    """Tokens, masks and log-probs equal, exactly, those of the sampler before tools existed
    (made by tests/data/make_sampler_reference.py on that sampler); a tool whose closing token
    is never sampled (max_calls = 0) changes nothing either."""
    import json
    from pathlib import Path
    saved = json.loads((Path(__file__).parent / "data/sampler_before_tools.json").read_text())
    model = tiny_llama()
    never = tool_use.Tool(close_id=5, respond=lambda ids: [6, 7], max_calls=0)
    for case in saved["cases"]:
        for tool in (None, never):
            ro = rollout.sample(model, PROMPTS, group_size=case["group_size"], tool=tool,
                                max_new_tokens=case["max_new_tokens"], temperature=case["temperature"],
                                eos_id=EOS, pad_id=PAD, generator=torch.Generator().manual_seed(case["seed"]))
            assert ro.response.tolist() == case["response"]
            assert ro.response_mask.tolist() == case["response_mask"]
            # log-probs to float32 rounding: the thread count changes the order of a matmul's sums
            torch.testing.assert_close(ro.logp, torch.tensor(case["logp"], dtype=torch.float32), rtol=0, atol=1e-5)
            assert ro.finished.tolist() == case["finished"]


class Bigram(torch.nn.Module):
    """A scripted model: the next-token logits are a fixed row of ``table`` chosen by the last
    input token, z_t = table[y_{t-1}], with the call signature rollout.sample uses."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)  # (V, V)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, logits_to_keep=0):
        from types import SimpleNamespace
        return SimpleNamespace(logits=self.table[input_ids], past_key_values=None)  # (B, L, V)


CLOSE = 4  # the scripted tool's closing token


def scripted():
    """After 5: 3; after 3: CLOSE; after CLOSE (an ordinary token past the cap): EOS; after 8
    (the tool output's last token): 9; after 9: CLOSE; after 6: EOS. Every choice is certain."""
    table = torch.full((V, V), -50.0)
    for before, after in {5: 3, 3: CLOSE, CLOSE: EOS, 8: 9, 9: CLOSE, 6: EOS}.items():
        table[before, after] = 50.0
    seen = []

    def respond(ids):  # the output depends on the row so far: 7 8 at the first call, 10 8 later
        seen.append(list(ids))
        return [7, 8] if ids.count(CLOSE) == 1 else [10, 8]
    tool = tool_use.Tool(close_id=CLOSE, respond=respond, max_calls=2, is_error=lambda out: out[0] == 10)
    return Bigram(table), tool, seen


@pytest.mark.parametrize("max_new", [20, 3])
def test_tool_output_is_forced_with_mask_zero_at_known_positions(max_new):
    """Prompt ending in 5: 3, CLOSE -> [7 8] forced, 9, CLOSE -> [10 8] forced, 9, CLOSE (third
    call, over the cap of 2: an ordinary token), EOS. Prompt ending in 6: EOS at once. With
    max_new_tokens = 3 the first row is cut inside the tool's output and is not finished."""
    model, tool, seen = scripted()
    ro = rollout.sample(model, [[BOS, 5], [BOS, 6]], group_size=1, max_new_tokens=max_new,
                        temperature=1.0, eos_id=EOS, pad_id=PAD, tool=tool,
                        generator=torch.Generator().manual_seed(0))
    row = [3, CLOSE, 7, 8, 9, CLOSE, 10, 8, 9, CLOSE, EOS]
    mask = [1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    T = min(max_new, len(row))
    assert ro.response.tolist() == [row[:T], ([EOS] + [PAD] * T)[:T]]
    assert ro.response_mask.tolist() == [mask[:T], ([1] + [0] * T)[:T]]
    assert ro.finished.tolist() == [max_new >= len(row), True]
    assert (ro.logp[ro.response_mask == 0] == 0).all()
    assert seen == ([[3, CLOSE], [3, CLOSE, 7, 8, 9, CLOSE]] if max_new > 3 else [[3, CLOSE]])
    assert tool_use.action_mask(tool, row) == mask  # the single-row replay agrees
    assert tasks.last_valid(ro.response_mask).tolist() == [T - 1 - (max_new == 3), 0]
    # the tool's counts per row: calls answered, error replies ([10 8] is one), tokens forced in, cut
    if max_new > 3:
        assert (ro.tool_calls.tolist(), ro.tool_errors.tolist(), ro.tool_tokens.tolist(),
                ro.tool_cut.tolist()) == ([2, 0], [1, 0], [4, 0], [False, False])
    else:  # cut after the 7 of [7 8]
        assert (ro.tool_calls.tolist(), ro.tool_errors.tolist(), ro.tool_tokens.tolist(),
                ro.tool_cut.tolist()) == ([1, 0], [0, 0], [1, 0], [True, False])


def test_a_turn_end_that_holds_a_call_goes_on_with_the_tools_turn():
    """EOS as the closing token, as in a chat: a turn that holds a call (token 3) ends with EOS, the
    tool's turn [7 8] is forced in (mask 0) and the row goes on; a turn end without a call ends the
    row (the tool answers None). Script: after 5: 3; after 3: EOS; after 8: 9; after 9: EOS."""
    table = torch.full((V, V), -50.0)
    for before, after in {5: 3, 3: EOS, 8: 9, 9: EOS, 6: EOS}.items():
        table[before, after] = 50.0

    def respond(ids):  # the turn: the tokens after the tool's last turn (which ends in 8)
        turn = ids[len(ids) - ids[::-1].index(8):] if 8 in ids else ids
        return [7, 8] if 3 in turn else None
    tool = tool_use.Tool(close_id=EOS, respond=respond, max_calls=4)
    ro = rollout.sample(Bigram(table), [[BOS, 5], [BOS, 6]], group_size=1, max_new_tokens=20, temperature=1.0,
                        eos_id=EOS, pad_id=PAD, tool=tool, generator=torch.Generator().manual_seed(0))
    row, mask = [3, EOS, 7, 8, 9, EOS], [1, 1, 0, 0, 1, 1]
    assert ro.response.tolist() == [row, [EOS] + [PAD] * 5]
    assert ro.response_mask.tolist() == [mask, [1] + [0] * 5]
    assert ro.finished.tolist() == [True, True] and ro.tool_calls.tolist() == [1, 0]
    assert tool_use.action_mask(tool, row) == mask


def test_a_random_model_with_a_tool_agrees_with_the_replay_and_the_scoring_pass():
    """A random tiny Llama and a tool that answers every token 5 with tokens that depend on the
    row so far. Row by row: the mask is the single-row replay's, the forced tokens are the tool's
    output, their log-prob is 0; the sampler's log-probs of the policy's tokens equal the scoring
    pass's (so the forced tokens were in the KV cache as context, as the scoring pass sees them)."""
    model = tiny_llama(seed=2)
    tool = tool_use.Tool(close_id=5, respond=lambda ids: [6 + len(ids) % 4, 11], max_calls=3)
    ro = rollout.sample(model, PROMPTS, group_size=4, max_new_tokens=16, temperature=1.0,
                        eos_id=EOS, pad_id=PAD, tool=tool, generator=torch.Generator().manual_seed(1))
    m = ro.response_mask
    holes = 0
    for i in range(len(m)):
        n = int(tasks.last_valid(m[i:i + 1])) + 1
        row = ro.response[i, :n].tolist()
        assert m[i, :n].tolist() == tool_use.action_mask(tool, row)
        assert (m[i, n:] == 0).all()
        for t in range(n):
            if row[t] == 5 and m[i, t] == 1 and t + 1 < n and m[i, t + 1] == 0:
                assert row[t + 1:t + 3] == tool.respond(row[:t + 1])[:n - t - 1]
        holes += int((m[i, :n] == 0).sum())
    assert holes > 0, "this seed must make calls"
    assert (ro.logp[m == 0] == 0).all()
    logp, _, _ = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response, m, 1.0)
    torch.testing.assert_close(ro.logp, logp.detach(), atol=2e-5, rtol=0)


def test_calculator_task_transcript_tool_reward_and_masks():
    """k = 3 numbers of 2 digits: the transcript chains the calls through the previous result, the
    tool adds two numbers or answers error, only the final answer is rewarded, and the warm-up's
    mask (the tool replayed over the transcript) is 0 exactly on the tool's output."""
    from lab import models
    tok = models.char_tokenizer()
    task = tool_use.CalculatorTask(horizon=3, digits=2)
    assert task.transcript([12, 34, 56]) == "12+34=46,46+56=102,102"
    assert task.prompt_text(tok, "12+34+56") == "<bos>12+34+56?"
    for q, a in task.sample(random.Random(0), 50):
        numbers = [int(x) for x in q.split("+")]
        assert len(numbers) == 3 and all(10 <= x <= 99 for x in numbers)
        assert a == task.transcript(numbers) and a.endswith("," + str(sum(numbers)))
        assert len(a) + 1 <= task.max_new_tokens()  # room for the longest answer and EOS
    assert task.calculator("46+56=") == "102," and task.calculator("46+56+1=") == "error,"
    assert task.calculator("+5=") == task.calculator("4a+5=") == "error,"
    answer = task.transcript([12, 34, 56])
    assert task.reward(answer, answer, True) == 1.0
    assert task.reward("12+34=46,102", answer, True) == 1.0  # the answer is what counts
    assert task.reward("12+34=46,46+56=102,103", answer, True) == 0.0
    assert task.reward(answer, answer, False) == 0.0  # cut off before EOS
    tool = task.tool(tok)
    assert tool.close_id == tok.convert_tokens_to_ids("=") and tool.max_calls == 6
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    flags = tool_use.action_mask(tool, ids)
    assert "".join(c if f else "_" for c, f in zip(answer, flags)) == "12+34=___46+56=____102"
    assert tok.decode(tool.respond(tok("7+x=", add_special_tokens=False)["input_ids"])) == "error,"
    # every character of the task is in the tokenizer (no <unk>)
    assert tok.unk_token_id not in tok(task.prompt_text(tok, "12+34+56") + answer,
                                       add_special_tokens=False)["input_ids"]


def test_factors_task_replies_with_the_sum_and_its_prime_factors():
    """The tool's reply is the sum and its prime factors (their product is the sum, each one prime),
    so replies differ in length; an error reply is long; the warm-up's mask is 0 exactly on them;
    the length limit holds the longest transcript with the longest reply at every call."""
    from lab import models
    tok = models.char_tokenizer()
    task = tool_use.FactorsTask(horizon=3, digits=2)
    assert task.transcript([12, 34, 56]) == "12+34=46:2*23,46+56=102:2*3*17,102"
    assert task.calculator("46+55=") == "101:101," and task.calculator("40+56=") == "96:2*2*2*2*2*3,"
    for n in range(2, 300):
        factors = tool_use.prime_factors(n)
        assert math.prod(factors) == n and factors == sorted(factors)
        assert all(all(p % d for d in range(2, p)) for p in factors)  # each one prime
    # a sampled call may hold long numbers: the Mersenne prime 2^89 - 1 (27 digits) and a product of
    # two known 9- and 10-digit primes are answered at once (trial division would never end on the first)
    m89, two_primes = 2 ** 89 - 1, 998244353 * 1000000007
    assert task.calculator(f"{m89 - 5}+5=") == f"{m89}:{m89},"
    assert task.calculator(f"{two_primes}+0=") == f"{two_primes}:998244353*1000000007,"
    tool = task.tool(tok)
    error = tool.respond(tok("7+x=", add_special_tokens=False)["input_ids"])
    assert tool.is_error(error) and len(error) > 40 and not tool.is_error(tok("101:101,")["input_ids"])
    answer = task.transcript([12, 34, 56])
    flags = tool_use.action_mask(tool, tok(answer, add_special_tokens=False)["input_ids"])
    assert "".join(c if f else "_" for c, f in zip(answer, flags)) == "12+34=________46+56=___________102"
    assert task.reward(answer, answer, True) == 1.0 and task.reward("12+34=46:2*23,101", answer, True) == 0.0
    longest = max(len(task.reply(n)) for n in range(2, 3 * 99 + 1))  # 256 = 2^8: 20 characters
    assert task.max_new_tokens() == len(task.transcript([99, 99, 99])) + 2 * longest + 1 + 8
    for q, a in task.sample(random.Random(0), 50):
        assert len(a) + 1 <= task.max_new_tokens()
    assert tok.unk_token_id not in tok(task.error + answer, add_special_tokens=False)["input_ids"]


def test_every_task_defines_the_methods_in_its_body_and_the_plain_ones_keep_their_answers():
    """A task's class body holds only methods written there (none assigned from a sibling class, such
    as ``reward = ReverseTask.reward``); the periodic task's reward is the exact match after EOS, and
    counting frames its question with the chat template, as arithmetic does."""
    import inspect
    classes = [c for module in (tasks, tool_use) for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, tasks.Task) and c.__module__ == module.__name__]
    assert {"ReverseTask", "PeriodicTask", "ArithmeticTask", "CountTask"} <= {c.__name__ for c in classes}
    for cls in classes:
        for name, value in vars(cls).items():
            if inspect.isfunction(value):
                assert value.__qualname__ == f"{cls.__qualname__}.{name}", (cls.__name__, name, value.__qualname__)
    periodic = tasks.PeriodicTask()
    assert [periodic.reward("abcab", "abcab", True), periodic.reward("abcab", "abcab", False),
            periodic.reward("abcaa", "abcab", True)] == [1.0, 0.0, 0.0]

    class Chat:  # a tokenizer's chat template, recording what it is asked
        def apply_chat_template(self, conversation, add_generation_prompt, tokenize):
            return conversation, add_generation_prompt, tokenize
    want = ([{"role": "user", "content": "List the numbers"}], True, False)
    assert tasks.CountTask().prompt_text(Chat(), "List the numbers") == want
    assert tasks.ArithmeticTask().prompt_text(Chat(), "List the numbers") == want
