"""What a benchmark ran on: one description shared by every script in benchmarks/.

Timings mean little without the machine, so every benchmark prints this and stores it with its
results.
"""
import os
import platform
from pathlib import Path

import torch


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown CPU"


def machine():
    """A small JSON-able dict: CPU, cores, torch threads, versions and the GPU if there is one."""
    return dict(cpu=cpu_model(), logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS", "unset"), torch=torch.__version__,
                python=platform.python_version(), platform=platform.platform(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def describe(info):
    """One line for a results file: CPU, torch threads and version (and the GPU if there is one)."""
    return (f"{info['cpu']}, {info['torch_threads']} torch thread(s), torch {info['torch']}"
            + (f", {info['cuda']}" if info.get("cuda") else ""))
