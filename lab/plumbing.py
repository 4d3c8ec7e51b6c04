"""The small helpers that every command line of the project shares, written once.

- ``pick_device("auto")``: cuda, then mps, then cpu; a named device must exist on this machine.
- ``unwritable(path)``: why a file or folder cannot be created at ``path`` (None if it can), checked
  before a slow run starts, so that a typo in an output path fails in the first second (by any user:
  a temporary folder is tried and removed, since root passes every permission check).
- ``read_jsonl(path)``: the rows of a JSON-lines file such as a run's ``metrics.jsonl``.
- ``save_atomic(state, path)``: torch.save through a temporary file; a full disk is ``DiskFull``,
  one line saying where and how much, with the temporary file removed.
- ``weights(model)``: a copy of the model's weights, to start every run of a comparison from (or to
  restore after the preflight).

train.py (through lab/), toy_harness.py and the scripts in benchmarks/ import these; a bad
value raises ``UsageError``, which each command line prints as one line.
"""
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch


class UsageError(Exception):
    """Something the user can fix on the command line; the message names the option."""


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
    target = path if path.is_dir() else parent
    if not os.access(target, os.W_OK):
        return f"{target} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=target))
    except OSError as e:
        return f"{target} refuses a new folder ({e.strerror})"
    return None


def read_jsonl(path):
    """The rows of a JSON-lines file (blank lines skipped); [] if the file does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class DiskFull(Exception):
    """A file could not be written for lack of space; the message says where and how much."""


def save_atomic(state, path):
    """torch.save to path.tmp, then rename: a crash never leaves half a file. A full disk (torch
    reports it as "unexpected pos", or as ENOSPC) removes the temporary file and raises DiskFull."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        tmp.replace(path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        need, free = tensor_bytes(state), shutil.disk_usage(path.parent).free
        if getattr(e, "errno", None) == errno.ENOSPC or free < need:
            raise DiskFull(f"no space left in {path.parent}: at least {need / 1e6:.3g} MB needed, "
                           f"{free / 1e6:.3g} MB free") from None
        raise


def tensor_bytes(obj, seen=None):
    """Bytes of the tensors inside obj (dicts and lists of them), each storage counted once (tied
    weights share one): about the size torch.save writes."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return sum(tensor_bytes(x, seen) for x in items)


def weights(model):
    """A copy of the model's weights: its state_dict's tensors, detached and cloned."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
