"""How a command line becomes train.py's options, parsed and checked before anything is created, and
how train.py starts from them.

lab/options.py says what the options are (``Options``, ``PRESETS``) and what they mean; this file
turns argv into a checked Config. train.py's ``main`` begins with ``start``: the options parsed and
checked, then the device, the header, the model loaded (``options.load``) and the run folder made
(lab/runs.py). Its first line is

    cfg = parse_options.parse(argv, Config, PRESETS, epilog=LOG_COLUMNS)

1. ``parse_config``: HfArgumentParser turns the dataclass's fields into ``--options``; --preset is
   read first and its defaults set under the options given (``--lr -1e-3`` is taken as
   ``--lr=-1e-3``, so a negative value is checked rather than misread as an option);
2. with --resume, ``resume_config``: the folder's stored config.json, with only the options a resume
   may change (``RESUMABLE``) taken from the command line;
3. otherwise ``check_mode``, so that no option is silently ignored (a single run's option given to a
   comparison, or the reverse), and ``check``: what argparse's types and choices cannot check (ranges,
   a comparison's entries and seeds, the pilot, the schedule, a horizon the task can draw and the model
   can hold, folders that can be written).

Whatever a user can get wrong is a ``UsageError`` naming the option, raised before a model is loaded
or a folder made; lab/runs.py's ``errors_exit`` prints it as one line with exit status 2.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path

import torch
from transformers import HfArgumentParser

from lab import lr_schedule, machine, models, progress
from lab.options import (LOG_COLUMNS, PRESETS, RESUMABLE, TASKS, UsageError, check_device, flag, for_device, load,
                         make_task, pick_device, pilot_rates, plain_loop_attention, schedule_kwargs, tiny_settings)
from lab.runs import (checkpoint_step, errors_exit, finished, resume_plan, run_folder, runs_of, seed_list,
                      write_config)
import otb
import tasks

NEEDS_A_GROUP = tuple(name for name in otb.ESTIMATORS if name != "reinforce")  # a baseline from the group: N >= 2
AT_LEAST_1 = ("steps", "prompts_per_step", "group_size", "ppo_epochs", "tiny_layers", "log_every",
              "horizon", "max_new_tokens", "minibatch_size", "micro_batch_rows", "chunk_size", "lr_warmup_window",
              "token_budget", "lr_pilot_budget")
POSITIVE = ("lr", "temperature", "clip_eps", "max_grad_norm", "memory_limit")
NOT_NEGATIVE = ("weight_decay", "warmup_max_steps", "checkpoint_minutes")


# =====================================================================================
# Starting train.py: the options, the header, the model, the run folder
# =====================================================================================

def start(argv, config):
    """(cfg, model, tokenizer, folder, command, source) of train.py's command line: the options parsed
    and checked (a bad one: one line, exit status 2, nothing created), the header printed first, the
    model loaded (lab/models.py builds, warms up or reads it), and the run folder with its config.json and
    provenance.json (the code, recorded before anything slow, as the process has imported it).
    Resuming a finished comparison says so and exits (status 0) without touching it."""
    command = ("python train.py " + shlex.join(argv)).strip()
    code = machine.code_record()  # the code this process imported: its commit and uncommitted changes
    ran = machine.what_ran()  # and the modules themselves: their files' sha256, PYTHONPATH, patches
    with errors_exit(command):
        cfg = parse(argv, config, PRESETS, epilog=LOG_COLUMNS)  # --resume: the stored options
        if cfg.resume and finished(cfg, Path(cfg.resume)):
            print(f"train.py: {cfg.resume} is finished: all its configurations ran (table: "
                  f"{Path(cfg.resume) / 'summary.md'}, plot: {Path(cfg.resume) / 'compare.png'}); nothing to resume")
            sys.exit(0)
        plan = resume_plan(cfg, cfg.resume) if cfg.resume else ""  # what is kept, continued, redone
        device = pick_device(cfg.device)
        check_device(cfg, device)  # a GPU preset without a GPU stops here, before the header
        cfg = for_device(cfg, device, given_options(argv))
        plain_loop_attention(cfg, device)  # CUDA without --compile-decode: no cuDNN attention
        folder, stored = run_folder(cfg, command)  # a new folder, or --resume's (and its first command)
        print(header(cfg, folder, command, device), flush=True)
        cache = tiny_cache_folder(cfg)
        warms_up = cache is not None and not (cache / "warmup.json").exists()
        model, tok, source = load(cfg, device)
        if warms_up:  # where it stopped (its bar is gone where stderr is no terminal)
            info = json.loads((cache / "warmup.json").read_text())
            stop = (f"stopped at step {info['history'][-1][0]} with sampled success {info['history'][-1][1]:.2f}"
                    if info["history"] else "none asked (--warmup-max-steps 0)")
            print(f"warm-up: {stop} in {info['seconds']:.0f} s; cached in {cache}", flush=True)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: {n_params / 1e6:.2f}M parameters\n{plan}\n{LOG_COLUMNS}".replace("\n\n", "\n"),
              flush=True)  # what each column of the log line means
        write_config(folder, cfg, stored, source)
        machine.record_code(folder, code, ran)  # provenance.json (and code.diff): what a study checks its runs by
    return cfg, model, tok, folder, stored, source


def header(cfg, folder, command, device):
    """What a run or comparison is about to do, printed before anything slow: the command, the output
    folder, the model (and whether its warm-up comes from the cache), the task, the runs, the steps, the
    learning rate and the device."""
    task = make_task(cfg)
    task_name = next(k for k, v in TASKS.items() if type(task) is v)
    runs = ", ".join(f"{est} N={n}" for est, n in runs_of(cfg))
    if cfg.seeds:
        runs += f", on seeds {cfg.seeds} (token budget {cfg.token_budget:,} each)"
    lr = (f"chosen by the learning-rate pilot among {cfg.lr_pilot}" if cfg.lr_pilot
          else f"{cfg.lr:g}") + f" ({cfg.lr_schedule} schedule)"
    budget = f", or until {cfg.token_budget:,} response tokens" if cfg.token_budget and not cfg.seeds else ""
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    folder_of_cache = tiny_cache_folder(cfg)
    warm_up_runs = folder_of_cache is not None and not (folder_of_cache / "warmup.json").exists()
    took = progress.estimate(cfg, runs_of(cfg), tasks.response_limit(task, cfg.max_new_tokens), warm_up_runs) \
        if device.type == "cpu" else None
    return "\n".join([
        command,
        f"  output  {folder}" + ("  (resumed)" if cfg.resume else ""),
        f"  model   {cfg.model}" + warm_up_state(cfg),
        f"  task    {task_name} (horizon {task.horizon})",
        f"  runs    {runs}" + ("" if cfg.estimator else f"  ({len(runs_of(cfg))} configurations, one after another)"),
        f"  steps   {cfg.steps}{budget}, {cfg.prompts_per_step} prompts x N responses each; seed {cfg.seed}",
        f"  lr      {lr}",
        f"  device  {device}{threads}"] + ([f"  time    {took}; the bar (in a log: a line every 30 s) "
                                            "gives the time left"] if took else []))


def warm_up_state(cfg):
    """'' for a pretrained model; for the tiny one, whether its warm-up comes from the cache, goes on from
    an interrupted one, or runs now (and where it is cached)."""
    folder = tiny_cache_folder(cfg)
    if folder is None:
        return ""
    if (folder / "warmup.json").exists():
        return f"; warm-up: from the cache ({folder})"
    if folder.with_name(folder.name + ".warm-up.pt").exists():
        return f"; warm-up: goes on from its last saved check, then cached in {folder}"
    return (f"; warm-up: runs now (to sampled success {cfg.warmup_target}, at most {cfg.warmup_max_steps} steps), "
            f"then cached in {folder}")


def tiny_cache_folder(cfg):
    """Where the tiny model of cfg is cached (models.tiny_cache); None for a pretrained model."""
    if cfg.model != "tiny":
        return None
    task = make_task(cfg)
    return models.tiny_cache(Path(cfg.out) / "_cache", task, max_new=tasks.response_limit(task, cfg.max_new_tokens),
                             **tiny_settings(cfg))[0]


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
        n = cfg.group_size if cfg.group_size >= 2 else 4  # the example must itself be valid
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
        limit = tasks.response_limit(make_task(cfg), cfg.max_new_tokens)
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
        raise UsageError("--lr-pilot needs --lr-pilot-budget or --token-budget (the pilot's default is a "
                         "quarter of it)")
    if cfg.seeds and cfg.lr_pilot_seed in seed_list(cfg):
        raise UsageError(f"--lr-pilot-seed {cfg.lr_pilot_seed} is one of --seeds {cfg.seeds}: the rate would be "
                         "chosen on a seed the comparison then reports")


def check_folder(name, path):
    """A folder we may create files in: it is one, or its first existing parent is a writable folder."""
    if path is None:
        return
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{flag(name)} {path}: is not a folder")
    why = unwritable(path)
    if why:
        raise UsageError(f"{flag(name)} {path}: cannot create a folder there ({why})")


def unwritable(path):
    """None if ``path`` can be created here (or, if it exists, written), else why not. Leaves nothing behind:
    besides the permission bits, which root passes everywhere, it tries a temporary folder in the nearest
    folder that exists (a read-only mount, or /proc, refuses it even to root) and removes it."""
    path = Path(path).expanduser().absolute()
    parent = path.parent
    while not parent.exists():  # the nearest folder that already exists
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if path.exists() and not path.is_dir():  # a file to be written over
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        return f"{target} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=target))
    except OSError as e:
        return f"{target} refuses a new folder ({e.strerror})"
    return None
