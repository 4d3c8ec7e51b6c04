"""otb_trl.py: OTB inside TRL's GRPOTrainer, on a tiny model (seconds, CPU, offline).

- a few GRPOTrainer steps with OTB move the parameters, and the advantages TRL's loss receives are
  otb.optimal_token_baseline of the rewards, log-probs and sum pi^2 computed here independently
  (rollout.score, a plain forward pass with materialised logits; the rewards re-scored from text);
- with ``group_mean`` the gradient of one step equals plain TRL's ``scale_rewards="none"``,
  ``loss_type="dapo"`` to 1e-4 (relative);
- bad arguments and a missing TRL are one-line errors.

TRL is an optional extra (requirements-trl.txt). These tests skip without it only when the
environment variable CI is unset; under CI (``.ci/run`` sets CI=true) a missing TRL fails.
"""
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import otb
import rollout
import tasks
import train
from lab import parse_options, options

ROOT = Path(__file__).resolve().parent.parent
HAS_TRL = importlib.util.find_spec("trl") is not None
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
needs_trl = pytest.mark.skipif(not HAS_TRL and not IN_CI,
                               reason="trl is not installed: pip install -r requirements-trl.txt")
# A 1-layer, hidden-32 model with a 60-step warm-up on strings of length 1-2 (as in test_e2e_train.py):
# responses end at different lengths, so padding and per-position baselines are exercised.
TINY = ["--tiny-hidden", "32", "--tiny-layers", "1", "--horizon", "2", "--warmup-max-steps", "60",
        "--warmup-target", "0.1", "--group-size", "4"]
PROMPTS, N, MAX_NEW = 4, 4, 6


def test_trl_is_installed_under_ci():
    if IN_CI:
        assert HAS_TRL, "CI is set but trl is missing: pip install -r requirements-trl.txt"


def test_without_trl_the_import_error_says_what_to_install():
    code = "import sys; sys.modules['trl'] = None; import otb_trl"  # None: import trl raises ImportError
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == \
        "ImportError: otb_trl needs TRL: pip install -r requirements-trl.txt"


def test_without_trl_the_benchmark_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['trl'] = None; from benchmarks import bench_vs_trl; "
            f"bench_vs_trl.main(['--out', {str(tmp_path / 'out')!r}])")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith("error: otb_trl needs TRL: pip install -r requirements-trl.txt")
    assert not (tmp_path / "out").exists()  # nothing written


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(model folder, tokenizer, task, cfg, dataset): the warmed-up tiny model, saved once."""
    out = tmp_path_factory.mktemp("runs")
    cfg = parse_options.parse_config(TINY + ["--max-new-tokens", str(MAX_NEW), "--out", str(out)], train.Config,
                                 options.PRESETS)
    task = options.make_task(cfg)
    _, tok, source = options.load(cfg, torch.device("cpu"))
    folder = source["path"]
    # distinct prompts, so a group is exactly "the rows with this prompt"
    rng = random.Random(0)
    strings = rng.sample(["".join(p) for p in (*task.alphabet, *(a + b for a in task.alphabet
                                                                  for b in task.alphabet))], 12)
    from datasets import Dataset
    data = Dataset.from_list([{"prompt": task.prompt_text(tok, s), "answer": s[::-1]} for s in strings])
    return folder, tok, task, cfg, data, out


def letters(completions, **_):
    """A dense second reward: the fraction of characters from the task's alphabet."""
    return [sum(c in "abcdefgh" for c in text) / max(len(text), 1) for text in completions]


def rescore(task, tok, completion_ids, mask, answers):
    """R of each row recomputed from the text: reverse reward + letters, (B,)."""
    R = []
    for ids, m, a in zip(completion_ids.tolist(), mask.tolist(), answers):
        ids = ids[:int(sum(m))]
        text = tok.decode(ids, skip_special_tokens=True)
        finished = len(ids) > 0 and ids[-1] == tok.eos_token_id
        R.append(task.reward(text, a, finished) + letters([text])[0])
    return torch.tensor(R)


def make_trainer(setup, cls, name, steps=1, config=None, **kw):
    import otb_trl
    from transformers import AutoModelForCausalLM
    folder, tok, task, cfg, data, out = setup
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    args = otb_trl.grpo_config(out / name, cfg, steps, PROMPTS, MAX_NEW, max_grad_norm=1e9,  # never clipped
                               **(config or {}))
    return cls(model, reward_funcs=[otb_trl.task_reward(task, tok.eos_token_id), letters], args=args,
               train_dataset=data, processing_class=tok, **kw)


# ----------------------------------------------------------------------------- behaviour

# The three ways the advantages get computed (otb_trl.py's docstring): in the loss's own forward
# pass (one micro-batch per generation batch, the default); from TRL's scoring pass (num_iterations
# > 1: PPO-style reuse of the batch); from one extra pass (the batch split over 2 micro-batches).
WAYS = {"loss pass": {}, "TRL's scoring pass": dict(num_iterations=2),
        "extra pass": dict(gradient_accumulation_steps=2, per_device_train_batch_size=PROMPTS * N // 2)}
NO_GRAD_PASSES = {"loss pass": 0, "TRL's scoring pass": 2, "extra pass": 3}  # in 3 optimizer steps


@needs_trl
@pytest.mark.parametrize("way", list(WAYS))
def test_otb_steps_move_the_parameters_with_otb_advantages(setup, way):
    import otb_trl
    _, tok, task, cfg, data, _ = setup
    answer_of = {row["prompt"]: row["answer"] for row in data}
    seen, no_grad_passes = [], []

    class Spy(otb_trl.OTBGRPOTrainer):
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            no_grad_passes.extend([1] if not torch.is_grad_enabled() else [])
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)  # before any update on it
            ids, mask = batch["completion_ids"], batch["completion_mask"].float()  # (B, T)
            with torch.no_grad():  # log pi and sum pi^2 from rollout.score, independent of TRL's fused head
                logp, spp, _ = rollout.score(self.model, batch["prompt_ids"], batch["prompt_mask"], ids, mask,
                                             cfg.temperature)
            prompts = [tok.decode(r[m.bool()]) for r, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
            R = rescore(task, tok, ids, mask, [answer_of[p] for p in prompts])  # (B,)
            _, group = torch.unique(batch["prompt_ids"], dim=0, return_inverse=True)  # one id per prompt
            token_rewards = torch.zeros_like(mask)
            token_rewards[torch.arange(len(R)), mask.sum(-1).long() - 1] = R  # R at the last token
            batch["expected"], _ = otb.optimal_token_baseline(token_rewards, mask, group, logp, spp)  # (B, T)
            return batch  # TRL shuffles and splits "expected" with the rest of the batch

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            seen.append(inputs)
            return loss

    trainer = make_trainer(setup, Spy, "otb-" + way.replace(" ", "-"), steps=3, estimator="otb",
                           config=WAYS[way])
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert len(seen) == 3 * trainer.args.gradient_accumulation_steps
    assert len(no_grad_passes) == NO_GRAD_PASSES[way]  # forward passes besides the loss's own
    moved = sum((p.detach() - b).abs().sum().item() for p, b in zip(trainer.model.parameters(), before))
    assert moved > 0
    varies_along_a_row = False
    for batch in seen:
        A, mask = batch["advantages"], batch["completion_mask"].bool()
        assert A.shape == mask.shape  # token-level, (B, T)
        torch.testing.assert_close(A, batch["expected"], rtol=1e-4, atol=1e-5)
        spread = torch.where(mask, A, -1e9).amax(-1) - torch.where(mask, A, 1e9).amin(-1)
        varies_along_a_row |= bool((spread > 1e-4).any())
    assert varies_along_a_row  # per-token baselines: a group baseline is constant along a row


def one_step_gradient(trainer):
    """The gradient of TRL's first optimizer step (before the step), and the batch it came from."""
    from transformers import TrainerCallback
    out = {}

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            out["grad"] = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])

    generate = trainer._generate_and_score_completions

    def recording(inputs):
        out["batch"] = generate(inputs)
        return out["batch"]

    trainer._generate_and_score_completions = recording
    trainer.add_callback(Grab())
    trainer.train()
    return out["grad"], out["batch"]


@needs_trl
def test_a_trl_run_prints_no_future_warning(setup):
    """TRL 1.16 sets transformers' deprecated gradient_checkpointing and calls its deprecated methods at
    every generation batch (4 FutureWarnings in `python otb_trl.py`); grpo_config names the setting as
    transformers now does, and OTBGRPOTrainer drops the warnings of TRL's own calls."""
    import warnings

    import otb_trl
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(setup, otb_trl.OTBGRPOTrainer, "quiet").train()
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


@needs_trl
def test_group_mean_gradient_equals_trl_none_dapo(setup):
    import otb_trl
    from trl import GRPOTrainer
    ours, batch = one_step_gradient(make_trainer(setup, otb_trl.OTBGRPOTrainer, "gm", estimator="group_mean"))
    trl_grad, trl_batch = one_step_gradient(make_trainer(setup, GRPOTrainer, "trl",
                                                        config=dict(scale_rewards="none")))
    assert torch.equal(batch["completion_ids"], trl_batch["completion_ids"])  # the same rollout
    assert trl_grad.norm() > 1e-6  # a gradient that is not trivially zero
    assert ((ours - trl_grad).norm() / trl_grad.norm()).item() < 1e-4


@needs_trl
def test_train_update_gradient_equals_trl_none_dapo(setup):
    """train.py's own loss (train.policy_update with group_mean) has the gradient of TRL's
    scale_rewards="none", loss_type="dapo" on TRL's rollout: benchmarks/bench_vs_trl.py times the
    same computation on both sides."""
    import dataclasses
    import otb_trl
    from trl import GRPOTrainer
    from transformers import AutoModelForCausalLM
    folder, tok, task, cfg, data, out = setup
    answer_of = {row["prompt"]: row["answer"] for row in data}
    args = otb_trl.grpo_config(out / "update", cfg, 1, PROMPTS, MAX_NEW, max_grad_norm=1e9, scale_rewards="none")
    trainer = GRPOTrainer(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                          reward_funcs=otb_trl.task_reward(task, tok.eos_token_id), args=args, train_dataset=data,
                          processing_class=tok)
    g_trl, batch = one_step_gradient(trainer)
    m = batch["completion_mask"].float()  # (B, T), the rows of a prompt consecutive
    ro = rollout.Rollout(prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"],
                         response=batch["completion_ids"], response_mask=m, group_index=torch.arange(len(m)) // N,
                         logp=torch.zeros_like(m), finished=(batch["completion_ids"] == tok.eos_token_id).any(-1))
    prompts = [tok.decode(r[k.bool()]) for r, k in zip(batch["prompt_ids"][::N], batch["prompt_mask"][::N])]
    _, token_rewards, _ = tasks.rewards(task, tok, ro, [answer_of[q] for q in prompts], N)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        old_logp, spp, _ = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response, m, cfg.temperature)
    adv, _ = otb.ESTIMATORS["group_mean"](token_rewards=token_rewards, response_mask=m, group_index=ro.group_index,
                                          log_probs=old_logp, sum_pi_sq=spp)
    train.policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), dataclasses.replace(cfg, max_grad_norm=1e9),
                 ro, old_logp, adv, torch.Generator().manual_seed(0))
    ours = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    assert (adv * m).abs().sum() > 0 and g_trl.norm() > 1e-6  # rewards that differ within a group
    assert ((ours - g_trl).norm() / g_trl.norm()).item() < 1e-4


@needs_trl
def test_bad_arguments_are_one_line_errors(setup):
    import otb_trl
    with pytest.raises(ValueError, match=r"^estimator must be one of \[.*'otb'.*\], got 'otp'$"):
        make_trainer(setup, otb_trl.OTBGRPOTrainer, "bad", estimator="otp")
    with pytest.raises(ValueError, match=r"^multi_objective_aggregation must be 'sum_then_normalize'"):
        make_trainer(setup, otb_trl.OTBGRPOTrainer, "bad2", estimator="otb",
                     config=dict(multi_objective_aggregation="normalize_then_sum"))


def tool_batch():
    """A fabricated batch as GRPOTrainer builds it when it runs tools: completion_mask (1 up to the end
    of each completion) and tool_mask (0 on the tool results, padded with 1); with the log-probs and
    sum pi^2, and the estimator's keyword arguments on the product mask, R at the last action."""
    g = torch.Generator().manual_seed(0)
    B, T = 8, 14
    lengths = torch.randint(6, T + 1, (B,), generator=g)
    completion_mask = (torch.arange(T) < lengths[:, None]).long()  # (B, T)
    tool_mask = torch.ones(B, T, dtype=torch.long)
    for i in range(B):  # one tool result of 1-3 tokens inside each completion, somewhere after its start
        start = int(torch.randint(1, int(lengths[i]) - 3, (1,), generator=g))
        tool_mask[i, start:start + int(torch.randint(1, 4, (1,), generator=g))] = 0
    logits = torch.randn(B, T, 5, generator=g)
    log_probs = torch.log_softmax(logits, -1)[..., 0]  # log pi(y_t), (B, T)
    sum_pi_sq = torch.softmax(logits, -1).square().sum(-1)
    batch = {"completion_mask": completion_mask, "tool_mask": tool_mask, "otb_group": torch.arange(B) // 4,
             "otb_rewards": torch.randint(0, 2, (B,), generator=g).float()}
    m = (completion_mask * tool_mask).float()  # the policy's own tokens
    rewards = torch.zeros(B, T)
    for i in range(B):
        rewards[i, max(t for t in range(T) if m[i, t])] = batch["otb_rewards"][i]  # R at the last action
    kw = dict(token_rewards=rewards, response_mask=m, group_index=batch["otb_group"], log_probs=log_probs,
              sum_pi_sq=sum_pi_sq)
    return batch, log_probs, sum_pi_sq, kw


@needs_trl
def test_otb_tir_with_trls_tool_mask_is_otb_tir_of_the_same_tensors(setup):
    # The advantages the trainer writes are otb.ESTIMATORS["otb_tir"] of the product mask.
    import otb_trl
    trainer = make_trainer(setup, otb_trl.OTBGRPOTrainer, "tir", estimator="otb_tir")
    batch, log_probs, sum_pi_sq, kw = tool_batch()
    trainer._set_advantages(batch, log_probs, sum_pi_sq)
    expected, _ = otb.ESTIMATORS["otb_tir"](**kw)
    torch.testing.assert_close(batch["advantages"], expected, rtol=0, atol=1e-7)
    assert (batch["advantages"][kw["response_mask"] == 0] == 0).all()  # nothing on tool results or padding
    assert (expected - otb.ESTIMATORS["otb"](**kw)[0]).abs().max() > 1e-3  # the alignment mattered


@needs_trl
def test_without_an_estimator_a_tool_mask_switches_to_otb_tir_and_says_so_once(setup, caplog):
    import logging
    import warnings
    import otb_trl
    trainer = make_trainer(setup, otb_trl.OTBGRPOTrainer, "auto")  # no estimator=
    batch, log_probs, sum_pi_sq, kw = tool_batch()
    plain = {k: v for k, v in batch.items() if k != "tool_mask"}  # a batch without tools first: otb
    plain["completion_mask"] = kw["response_mask"].long()
    with caplog.at_level(logging.WARNING, logger="otb_trl"), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was chosen explicitly
        trainer._set_advantages(plain, log_probs, sum_pi_sq)
        assert trainer.estimator == "otb" and not caplog.records
        torch.testing.assert_close(plain["advantages"], otb.ESTIMATORS["otb"](**kw)[0], rtol=0, atol=1e-7)
        for _ in range(2):
            trainer._set_advantages(batch, log_probs, sum_pi_sq)
    assert trainer.estimator == "otb_tir"
    assert [r.getMessage() for r in caplog.records] == [
        "OTBGRPOTrainer: the completions hold tool results (tool_mask): estimator otb_tir, OTB aligned by the "
        "policy's own tokens (pass estimator= to choose another)"]  # once
    torch.testing.assert_close(batch["advantages"], otb.ESTIMATORS["otb_tir"](**kw)[0], rtol=0, atol=1e-7)


@needs_trl
@pytest.mark.parametrize("estimator", ["otb", "otb_zero_tail", "group_mean"])
def test_an_explicit_estimator_is_kept_and_a_position_aligned_otb_warned_about_once(setup, estimator):
    import warnings
    import otb_trl
    trainer = make_trainer(setup, otb_trl.OTBGRPOTrainer, "explicit-" + estimator, estimator=estimator)
    batch, log_probs, sum_pi_sq, kw = tool_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            trainer._set_advantages(batch, log_probs, sum_pi_sq)
    ours = [str(w.message) for w in caught if "OTBGRPOTrainer" in str(w.message)]
    if estimator == "group_mean":  # one number per completion: holes change nothing
        assert ours == []
    else:
        assert ours == [f"OTBGRPOTrainer: estimator {estimator!r} pools a group's rows by position, but the "
                        "completions hold tool results of different lengths (tool_mask); otb_tir pools them by "
                        "action (docs/tool_use.md)"]
    assert trainer.estimator == estimator
    torch.testing.assert_close(batch["advantages"], otb.ESTIMATORS[estimator](**kw)[0], rtol=0, atol=1e-7)
