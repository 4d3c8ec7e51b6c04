"""Run a grid of train.py runs, a few at a time, with one restart rule (equal_tokens.py,
lr_schedule_experiment.py): ``grid.run([(command, folder, seed), ...], workers)``.

- A job whose folder holds train.py's DONE marker is not run again; any other folder of a job is
  an interrupted attempt, removed and run again from step 0 (a stopped grid resumes; added seeds
  run only the new runs).
- The first job of each seed runs before that seed's other jobs start, so two processes never
  warm up the same cached model; first jobs of different seeds overlap.
- Each run is a single-threaded ``python train.py ...`` in the repository root, its output in
  ``<folder>.log``. A failed run does not stop the others; the grid ends with SystemExit naming them.
"""
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def run(jobs, workers):
    """Run every (command, folder, seed) job without DONE in its folder, ``workers`` at a time."""
    jobs = [(cmd, Path(folder), seed) for cmd, folder, seed in jobs if not (Path(folder) / "DONE").exists()]
    firsts = {}
    for job in jobs:
        firsts.setdefault(job[2], job)  # the first job of each seed warms its model up
    warmed = {seed: threading.Event() for seed in firsts}

    def one(job):
        cmd, folder, seed = job
        if firsts[seed] is not job:
            warmed[seed].wait()
        if folder.exists():  # an interrupted attempt: start again from scratch
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(folder.parent / f"{folder.name}.log", "w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV}, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        warmed[seed].set()
        print(f"  {folder.name}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.0f} s",
              flush=True)
        return folder.name if rc else None

    order = list(firsts.values()) + [job for job in jobs if firsts[job[2]] is not job]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        failed = [name for name in pool.map(one, order) if name]
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed, see their .log files: {', '.join(failed)}")
