"""The runs around train.py's training: which runs a command makes, where each writes, how it stops
and how it resumes.

train.py's ``main`` starts with lab/parse_options.py's ``start`` (the options parsed and checked, the
header printed, the model loaded), which makes the run folder here (``run_folder``; ``write_config``:
config.json with the settings applied, ``applied``); the loop and lab/compare.py use the rest:

- which runs: a single run or a comparison's configurations (``runs_of``, the seeds of ``seed_list``),
  each in a folder named by ``run_name``, in the order ``configurations`` lists them;
- checkpoint.pt: everything --resume needs (``save_checkpoint`` / ``load_checkpoint``; the step it was
  saved after, ``checkpoint_step``; a full disk or a damaged file, ``read_checkpoint``, is one line
  saying what to do), and metrics.jsonl rewritten on resume;
- Ctrl-C: the first one stops after the step and saves (``StopOnCtrlC``), a second one at once; either
  way the message says how to resume, and so does resume.txt in the run folder (``ctrl_c_exits``);
  SIGTERM, which `timeout` or a cluster sends, and SIGHUP, which a closed terminal sends, are a Ctrl-C
  (``STOP_SIGNALS``); ``errors_exit`` turns a bad option into one line and exit status 2;
- the plan that --resume prints (``resume_plan``; a finished comparison has none: ``finished``).

The progress bars the loop advances are in lab/progress.py.
"""
import errno
import io
import json
import os
import shlex
import shutil
import signal
import stat
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lab import models
from lab.models import DiskFull
from lab.options import COMPARISON_ONLY, DEFAULT_COMPARE, RUN_ONLY, UsageError, estimator_name
import otb

# Signals that stop a run as Ctrl-C does: SIGTERM (`timeout`, a cluster's preemption) and SIGHUP (the
# terminal was closed; Windows has none). One that is ignored when train.py starts (nohup) stays ignored.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


# =====================================================================================
# The run folder: a bad option or a full disk, config.json, checkpoints, Ctrl-C and SIGTERM
# =====================================================================================

@contextmanager
def errors_exit(command="the same command"):
    """A UsageError, or a file the system refuses, inside the block: one line and exit status 2; a full
    disk: exit status 1; Ctrl-C
    (and from here on SIGTERM, which a `timeout` or a cluster sends, is a Ctrl-C): exit status 130,
    saying how to continue an interrupted warm-up (``command``: the command line to run again)."""
    sigterm_is_ctrl_c()
    try:
        with closing_bars():
            yield
    except UsageError as e:
        exit_with(f"error: {e}", 2)
    except (DiskFull, OSError) as e:  # in the warm-up, or writing the run folder's config.json
        if not isinstance(e, DiskFull) and e.errno != errno.ENOSPC:
            if e.filename is None:
                raise
            exit_with(f"error: {e.filename}: {e.strerror}; nothing was started", 2)  # a folder it cannot write
        where = e if isinstance(e, DiskFull) else f"no space left in {Path(e.filename or '.').parent}"
        exit_with(f"error: {where}; what was saved is kept (a warm-up goes on from its last check): free some "
                  f"space, then run the same command again: {command}", 1)
    except models.WarmUpInterrupted as e:
        saved = f"it is saved at step {e.step}" if e.step else "nothing was saved yet (the first check saves it)"
        exit_with(f"interrupted during the warm-up; {saved}; to continue it, run the same command again: {command}",
                  130)
    except KeyboardInterrupt:
        exit_with("interrupted before training started; nothing to resume", 130)


def exit_with(message, status):
    """The one line a stopped train.py leaves (on stderr), then its exit status: 2 a usage error, 1 a
    full disk, 130 an interruption."""
    print(f"train.py: {message}", file=sys.stderr)
    sys.exit(status)


def sigterm_is_ctrl_c():
    """SIGTERM and SIGHUP call whatever Ctrl-C calls at that moment (a KeyboardInterrupt, or
    StopOnCtrlC's stop after the step), so a `timeout`, a preempted cluster job or a closed terminal
    leaves a run that --resume continues (``outlive_the_terminal``: output it cannot write is dropped)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup: keep ignoring the hang-up
            signal.signal(sig, lambda signum, frame: ctrl_c_handler()(signum, frame))
    outlive_the_terminal()


def outlive_the_terminal():
    """stdout and stderr, where they are a terminal or a pipe, drop what they cannot write: once the
    terminal is closed (or the reader of the pipe, `tee`, is gone) every write fails (EIO, EPIPE), the
    first maybe before the SIGHUP is handled, and the run must still finish its step and save."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            shared = os.isatty(fd) or stat.S_ISFIFO(os.fstat(fd).st_mode)
        except (OSError, ValueError, AttributeError):  # no file descriptor (a notebook, pytest's capture)
            shared = False
        if shared and not isinstance(stream, Dropping):
            setattr(sys, name, Dropping(stream))


class Dropping(io.TextIOBase):
    """A text stream that writes to ``stream`` and drops what it cannot write (a closed terminal)."""

    def __init__(self, stream):
        self.stream = stream

    @property
    def encoding(self):
        return self.stream.encoding

    def fileno(self):
        return self.stream.fileno()

    def write(self, text):
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # EIO, or a stream already closed
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def isatty(self):  # bars are drawn on a terminal (tqdm's disable=None asks)
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False


def ctrl_c_handler():
    handler = signal.getsignal(signal.SIGINT)
    return handler if callable(handler) else signal.default_int_handler  # ignored (nohup): still stops


def run_folder(cfg, command):
    """(folder, command to store): --resume's folder and its first command, or a new folder under --out."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if cfg.resume:
        folder = Path(cfg.resume)
        return folder, json.loads((folder / "config.json").read_text())["command"] + f"  # resumed: {command}"
    name = cfg.name or (f"{run_name(cfg.estimator, cfg.group_size, cfg.zero_tail)}-{stamp}" if cfg.estimator
                        else f"compare-{stamp}")
    return Path(cfg.out) / name, command


RESUME_NOTE = "resume.txt"  # a stopped run's folder: why it stopped and the command that continues it


def write_config(run_dir, cfg, command, source):
    """config.json: the command line, every setting applied (``applied``), the model's source, the versions.
    A resumed run's folder loses its resume.txt here: it is running again."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESUME_NOTE).unlink(missing_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dict(
        command=command, config=applied(cfg), model_source=source, **versions()), indent=1))


def versions():
    """The versions of the libraries a result depends on (config.json, summary.json)."""
    import transformers
    return dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__)


def copy_results(folder, dest):
    """--results-dir: the comparison's config.json, plot and tables, and every run's metrics.jsonl
    (dest/<run>/, or dest/seed<s>/<run>/ with --seeds)."""
    metrics = sorted(str(p.relative_to(folder)) for p in folder.glob("**/metrics.jsonl"))
    for f in ("config.json", "compare.png", "summary.md", "summary.json", *metrics):
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / f, dest / f)


def save_checkpoint(run_dir, model, opt, step, tokens, lengths):
    """Everything a resume needs. opt=None: weights only (a finished configuration of a comparison)."""
    state = dict(model=model.state_dict(), optimizer=opt.state_dict() if opt else None, step=step,
                 tokens=tokens, lengths=lengths)
    models.save_atomic(state, run_dir / "checkpoint.pt")  # a full disk: DiskFull, one line


def load_checkpoint(run_dir, model, opt):
    """Restore model and optimizer; returns (step, tokens, lengths, metrics up to that step)."""
    ckpt = read_checkpoint(run_dir / "checkpoint.pt")
    if ckpt["optimizer"] is None:
        raise UsageError(f"--resume: {run_dir / 'checkpoint.pt'} has no optimizer state (a finished "
                         "configuration of a comparison keeps its weights only), so it cannot be continued")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return ckpt["step"], ckpt["tokens"], ckpt["lengths"], [r for r in rows if r["step"] <= ckpt["step"]]


def write_metrics(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


class Stopped(Exception):
    """Ctrl-C: the run stopped after a step and saved its checkpoint."""


def close_bars():
    """Close the progress bars still open (they stay on screen, the cursor goes to the next line)."""
    for bar in list(tqdm._instances):
        bar.close()


@contextmanager
def closing_bars():
    """An exception leaving the block first closes the open bars, so its message starts a line."""
    try:
        yield
    except (Stopped, KeyboardInterrupt, UsageError, DiskFull, OSError):
        close_bars()  # the message goes under the bar, not at the end of its line
        raise


@contextmanager
def ctrl_c_exits(folder, checkpoint_minutes):
    """Ctrl-C inside the block (Stopped, or a second Ctrl-C): say how to resume, exit status 130."""
    try:
        with closing_bars():
            yield
    except (Stopped, KeyboardInterrupt) as e:
        what = f"{e}; checkpoint saved" if isinstance(e, Stopped) else (
            f"interrupted; the last checkpoint is kept (at most {checkpoint_minutes:g} minutes old)")
        resume = f"python train.py --resume {shlex.quote(str(folder))}"
        (Path(folder) / RESUME_NOTE).write_text(f"{what}\nresume with: {resume}\n")  # kept after the terminal is gone
        exit_with(f"{what}; resume with: {resume} (also in {Path(folder) / RESUME_NOTE})", 130)
    except UsageError as e:  # e.g. an unreadable checkpoint met during the comparison
        exit_with(f"error: {e}", 2)
    except (DiskFull, OSError) as e:
        if not isinstance(e, DiskFull) and e.errno != errno.ENOSPC:
            raise
        where = e if isinstance(e, DiskFull) else f"no space left in {Path(e.filename or folder).parent}"
        exit_with(f"error: {where}; any earlier checkpoint is kept: free some space, then resume with: "
                  f"python train.py --resume {shlex.quote(str(folder))}", 1)


class StopOnCtrlC:
    """Within the block, the first Ctrl-C (or SIGTERM) asks the loop to stop after the current step
    (which then saves a checkpoint); a second one stops at once (KeyboardInterrupt, the last
    checkpoint kept)."""

    def __enter__(self):
        self.requested, self.previous = False, {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, *STOP_SIGNALS):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # e.g. a background job: keep ignoring Ctrl-C
                    self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"{name}: stopping after this step and saving a checkpoint (Ctrl-C again: stop at once)")

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# =====================================================================================
# The runs of a command: its configurations and seeds, their names and settings, their checkpoints
# =====================================================================================

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


def applied(cfg):
    """The settings a run or a comparison uses (config.json, summary.json): a comparison has no
    estimator or group size of its own (--compare gives them), a run no comparison options."""
    return {k: v for k, v in asdict(cfg).items() if k not in (COMPARISON_ONLY if cfg.estimator else RUN_ONLY)}


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


def configurations(cfg, folder):
    """[(label, seed, estimator, N, run folder)] of a run or a comparison, in the order they run;
    the label is what the bar shows: "[2/5] grpo N=4" (with --seeds: "[7/15] seed 1 grpo N=4")."""
    if cfg.estimator:
        return [(f"{cfg.estimator} N={cfg.group_size}", cfg.seed, cfg.estimator, cfg.group_size, Path(folder))]
    seeds = seed_list(cfg) if cfg.seeds else [cfg.seed]
    runs = [(s, est, n) for s in seeds for est, n in runs_of(cfg)]
    return [(f"[{k}/{len(runs)}] " + (f"seed {s} " if cfg.seeds else "") + f"{est} N={n}", s, est, n,
             (Path(folder) / f"seed{s}" if cfg.seeds else Path(folder)) / run_name(est, n, cfg.zero_tail))
            for k, (s, est, n) in enumerate(runs, start=1)]


def progress_of(run_dir, single=False):
    """(finished, step of the checkpoint or None, last step logged) of a run folder; a finished run
    of a comparison (DONE) is kept, a single run's DONE is only a run that --steps may extend."""
    logged = max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    saved = checkpoint_step(run_dir / "checkpoint.pt", single) if (run_dir / "checkpoint.pt").exists() else None
    return (not single and (run_dir / "DONE").exists()), saved, logged


def resume_plan(cfg, folder):
    """What --resume does, one line per configuration: kept (finished), continued after the step of
    its checkpoint (where steps were logged after it, those are run again: a second Ctrl-C stops
    at once and keeps the last checkpoint), or started. An unreadable checkpoint is a UsageError."""
    lines = [f"resuming {folder}, up to step {cfg.steps}:"]
    for label, _, _, _, run_dir in configurations(cfg, folder):
        finished, saved, logged = progress_of(run_dir, single=bool(cfg.estimator))
        if finished:
            what = f"finished ({logged} steps), kept"
        elif saved is not None:
            what = f"continues after step {saved} (its checkpoint)" + (
                f"; {steps_phrase(saved + 1, logged)} run again (logged after the checkpoint)"
                if logged > saved else "")
        elif logged:
            what = f"starts again: {steps_phrase(1, logged)} run again (no checkpoint was saved)"
        else:
            what = "starts (not run yet)"
        lines.append(f"  {label}: {what}")
    return "\n".join(lines)


def steps_phrase(first, last):
    """'step 3 is' or 'steps 3-5 are': the steps a resume runs again, as the plan says them."""
    return f"step {first} is" if first == last else f"steps {first}-{last} are"


def steps_left(cfg, folder):
    """{(seed, estimator, N): steps still to run} of a comparison, for its TimeLeft."""
    left = {}
    for _, s, est, n, run_dir in configurations(cfg, folder):
        finished, saved, _ = progress_of(run_dir)
        left[(s, est, n)] = 0 if finished else cfg.steps - (saved or 0)
    return left


def finished(cfg, folder):
    """A comparison whose configurations are all finished (DONE) and whose table is written."""
    return not cfg.estimator and (folder / "summary.md").exists() and all(
        progress_of(run_dir)[0] for *_, run_dir in configurations(cfg, folder))


def read_jsonl(path):
    """The rows of a JSON-lines file (blank lines skipped); [] if the file does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
