"""What a benchmark ran on, and how it times: shared by every script in benchmarks/.

Timings mean little without the machine, so every benchmark prints ``machine()`` and stores it with
its results. The timing benchmarks (bench_estimators, bench_score, bench_step_cost, bench_decode)
compare variants with ``interleaved_rounds``: one call of each variant per round, in turns, so a
change in a shared machine's load hits all of them alike; round 0 warms up and is not in medians.
"""
import os
import platform
import time

import torch
from tqdm.auto import tqdm

from lab.machine import fingerprint


def machine():
    """A small JSON-able dict: the machine's fingerprint (CPU model and capability, torch, MKL and
    transformers versions: lab/machine.py), cores, torch threads, Python and the GPU if there is one."""
    return dict(**fingerprint(), logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS", "unset"),
                python=platform.python_version(), platform=platform.platform(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def describe(info):
    """One line for a results file: CPU (and its capability), torch threads and version (and the GPU
    if there is one)."""
    cpu = info["cpu"] + (f" ({info['cpu_capability']})" if info.get("cpu_capability") else "")
    return (f"{cpu}, {info['torch_threads']} torch thread(s), torch {info['torch']}"
            + (f", {info['cuda']}" if info.get("cuda") else ""))


def interleaved_rounds(fns, repeats, rotate=False, device=None, setup=None, desc=None, keep=False):
    """Call each of ``fns`` once per round, for 1 + ``repeats`` rounds, in turns (a, b, c, a, b, c,
    ...; with ``rotate`` the order turns by one each round: a, b, c, then b, c, a, ...). Each fn takes
    the round number r. Untimed before each call: ``setup()`` if given, and waiting for a CUDA
    ``device`` (waited for again at the end of the call). ``desc``: a progress bar over the rounds.
    Returns (seconds, values): per fn, in every round, its wall time and, with ``keep``, what it
    returned (else None: an output is freed at once, as in a training loop); round 0 (the warm-up:
    allocator, kernels, compiling; left out of the medians) first."""
    cuda = device is not None and device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    seconds, values = [[] for _ in fns], [[] for _ in fns]
    for r in tqdm(range(repeats + 1), desc=desc, disable=desc is None):
        start = r % len(fns) if rotate else 0
        for i in [*range(start, len(fns)), *range(start)]:
            if setup is not None:
                setup()
            sync()
            t0 = time.perf_counter()
            out = fns[i](r)
            sync()
            seconds[i].append(time.perf_counter() - t0)
            values[i].append(out if keep else None)
            del out
    return seconds, values
