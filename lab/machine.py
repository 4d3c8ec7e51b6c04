"""The machine a saved result was made on, as far as its float32 numbers depend on it.

On one machine a CPU run of train.py is deterministic: the same command gives the same numbers bit
for bit. On another CPU it need not. The kernels there add float32 numbers in another order (AVX-512
registers hold 16 of them, AVX2 registers 8; MKL picks its matrix-multiply code by CPU), the last
bit of a logit moves, and over a warm-up of a few hundred steps and the sampling after it such bits
decide which character a sample draws. From then on the run is another draw of the same process.

So a saved result that a test repeats bit for bit records the fingerprint of its machine:

    cpu             the CPU's model name (/proc/cpuinfo; a virtual machine may show only the family)
    cpu_capability  the instruction set torch's kernels run with: torch.backends.cpu.get_cpu_capability()
    torch, mkl, transformers
                    the versions that compute the numbers (MKL is built into torch's CPU wheels)

A test compares a fresh run with the saved one bit for bit only where ``matches`` says the machine
is the same; elsewhere it checks what the numbers show (docs/training.md, "Which numbers depend on
the machine"). A field that was not recorded with a result is ``UNKNOWN``, and an unknown field
never matches: a result whose machine is not fully known is never pinned bit for bit.
"""
import platform
import re
from pathlib import Path

import torch

FIELDS = ("cpu", "cpu_capability", "torch", "mkl", "transformers")
UNKNOWN = "unknown"


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown CPU"


def mkl_version():
    """The MKL version torch was built with ('2024.2'), 'none' without MKL, UNKNOWN if not stated."""
    if not torch.backends.mkl.is_available():
        return "none"
    found = re.search(r"Math Kernel Library Version ([\w.]+)", torch.__config__.show())
    return found.group(1) if found else UNKNOWN


def fingerprint():
    """This machine's fingerprint: {field: value} for every field in FIELDS."""
    import transformers
    return dict(cpu=cpu_model(), cpu_capability=torch.backends.cpu.get_cpu_capability(),
                torch=torch.__version__, mkl=mkl_version(), transformers=transformers.__version__)


def differences(recorded, here=None):
    """The fields in which a recorded fingerprint and this machine's (or ``here``) differ, as
    'field: recorded value, here value'. A field missing from ``recorded`` or UNKNOWN counts as a
    difference: nobody can say that it is the same."""
    here = fingerprint() if here is None else here
    return [f"{k}: {recorded.get(k, UNKNOWN)}, here {here[k]}" for k in FIELDS
            if recorded.get(k, UNKNOWN) in (UNKNOWN, None) or recorded[k] != here[k]]


def matches(recorded, here=None):
    """True when every field of ``recorded`` is known and equal to this machine's (or ``here``)."""
    return not differences(recorded, here)


def describe(fp):
    """One line: 'AMD EPYC (AVX2), torch 2.13.0+cpu, MKL unknown, transformers unknown'."""
    return (f"{fp.get('cpu', UNKNOWN)} ({fp.get('cpu_capability', UNKNOWN)}), torch {fp.get('torch', UNKNOWN)}, "
            f"MKL {fp.get('mkl', UNKNOWN)}, transformers {fp.get('transformers', UNKNOWN)}")
