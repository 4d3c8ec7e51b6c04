"""Run a grid of train.py runs, a few at a time, with one restart rule (equal_tokens.py,
lr_schedule_experiment.py): ``grid.run([(command, folder, seed), ...], workers)``.

- A job whose folder holds train.py's DONE marker is not run again; any other folder of a job is
  an interrupted attempt, removed and run again from step 0 (a stopped grid resumes; added seeds
  run only the new runs).
- The first job of each seed runs before that seed's other jobs start, so two processes never
  warm up the same cached model; first jobs of different seeds overlap.
- Each run is a single-threaded ``python train.py ...`` in the repository root, its output in
  ``<folder>.log``. A failed run does not stop the others; the grid ends with SystemExit naming them.
- Given the study's code at its start (``code``: benchmarks/cli.py's ``study_code``), a run starts only
  while the code here is still that, and a finished run counts only where its own record
  (provenance.json, written by train.py as it starts: lab/machine.py) names that code. Either check
  failing stops the grid: no further run starts, a finished run of other code loses its DONE (a later
  sitting runs it again), and SystemExit names them. With --allow-dirty (``code["allow_dirty"]``) each
  is a line and the grid goes on; every run keeps the record of the code it ran.
"""
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab import machine

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def run(jobs, workers, code=None):
    """Run every (command, folder, seed) job without DONE in its folder, ``workers`` at a time; with
    ``code``, only while the code is the study's (the module docstring)."""
    jobs = [(cmd, Path(folder), seed) for cmd, folder, seed in jobs if not (Path(folder) / "DONE").exists()]
    firsts = {}
    for job in jobs:
        firsts.setdefault(job[2], job)  # the first job of each seed warms its model up
    warmed = {seed: threading.Event() for seed in firsts}
    other_code, stop = [], threading.Event()
    if code is not None and code["code_changes"] is None and not code["allow_dirty"]:
        raise SystemExit("git cannot tell which code the runs would run (no git checkout), so a change while the "
                         "study runs could not be seen; pass --allow-dirty to run anyway")

    def refused(name, what):
        """True where ``what`` (a run's code, or None) is not the study's code and --allow-dirty is not given."""
        if code is None or not what:
            return False
        print(f"  {name}: {what}" + ("; going on (--allow-dirty)" if code["allow_dirty"] else ""), flush=True)
        if not code["allow_dirty"]:
            other_code.append(f"{name}: {what}")
            stop.set()
        return not code["allow_dirty"]

    def one(job):
        cmd, folder, seed = job
        if firsts[seed] is not job:
            warmed[seed].wait()
        try:
            if stop.is_set() or refused(folder.name, changed_since(code, "not started: the code here is now")):
                return None
            if folder.exists():  # an interrupted attempt: start again from scratch
                shutil.rmtree(folder)
            folder.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            with open(folder.parent / f"{folder.name}.log", "w") as log:
                rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV}, stdout=log,
                                    stderr=subprocess.STDOUT).returncode
        finally:
            warmed[seed].set()
        print(f"  {folder.name}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.0f} s",
              flush=True)
        if rc == 0 and refused(folder.name, ran_other_code(code, folder)):
            (folder / "DONE").unlink(missing_ok=True)  # not the study's run: a later sitting runs it again
        return folder.name if rc else None

    order = list(firsts.values()) + [job for job in jobs if firsts[job[2]] is not job]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        failed = [name for name in pool.map(one, order) if name]
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed, see their .log files: {', '.join(failed)}")
    if other_code:
        raise SystemExit(f"the code changed while the study ran (it started from "
                         f"{machine.describe_code(code)}): " + "; ".join(other_code) + ". No further run was started, "
                         "and a run of other code is not kept (its DONE is removed). Commit the change and start the "
                         "study again, or pass --allow-dirty (each run then keeps the record of the code it ran).")


def which_code(records):
    """Which runs ran which code, from {run name: its own record (provenance.json) or None}: 'commit ...
    (2 runs), commit ... with uncommitted changes to train.py (diff ...) (1 run); not recorded: 1 run'."""
    groups, missing = {}, 0
    for name, record in records.items():
        if record is None:
            missing += 1
        else:
            groups.setdefault(machine.describe_code(record), []).append(name)
    if not groups:
        return f"not recorded for any of the {missing} runs"
    plural = lambda k: f"{k} run" + ("s" if k != 1 else "")  # noqa: E731
    return ", ".join(f"{what} ({plural(len(names))})" for what, names in groups.items()) + (
        f"; not recorded: {plural(missing)}" if missing else "")


def changed_since(code, what):
    """'<what> <the code here>' where the code here is not ``code`` (the study's at its start); None where
    it is, or where there is no study code to check against."""
    if code is None:
        return None
    here = machine.code_record()[0]
    return None if machine.same_code(here, code) else f"{what} {machine.describe_code(here)}"


def ran_other_code(code, folder):
    """What a finished run's own record (provenance.json) says of its code where that is not ``code``,
    every start of a resumed run included; None where it ran the study's code (or there is none to check)."""
    if code is None:
        return None
    record = machine.recorded_code(folder)
    if record is None:
        return "finished without a record of its code (no provenance.json)"
    other = [r for r in (record, *record.get("earlier", [])) if not machine.same_code(r, code)]
    return f"ran {machine.describe_code(other[0])}" if other else None
