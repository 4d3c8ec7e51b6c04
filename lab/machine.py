"""The machine a saved result was made on, as far as its float32 numbers depend on it.

On one machine a CPU run of train.py is deterministic: the same command gives the same numbers bit
for bit. On another CPU it need not. The kernels there add float32 numbers in another order (AVX-512
registers hold 16 of them, AVX2 registers 8; MKL picks its matrix-multiply code by CPU), the last
bit of a logit moves, and over a warm-up of a few hundred steps and the sampling after it such bits
decide which character a sample draws. From then on the run is another draw of the same process.

So a saved result that a test repeats bit for bit records the fingerprint of its machine:

    cpu             the CPU's model name (/proc/cpuinfo; a virtual machine may show only the family)
    cpu_capability  the instruction set torch's kernels run with: torch.backends.cpu.get_cpu_capability(),
                    which also reflects ATEN_CPU_CAPABILITY=default / avx2 when it is set
    torch, mkl, transformers
                    the versions that compute the numbers (MKL is built into torch's CPU wheels); the
                    mkl field also names MKL_CBWR when it is set ('2024.2, MKL_CBWR=COMPATIBLE'), which
                    makes MKL take another code path than the CPU's own

A test compares a fresh run with the saved one bit for bit only where ``matches`` says the machine
is the same; elsewhere it checks what the numbers show (docs/training.md, "Which numbers depend on
the machine"). A field that was not recorded with a result is ``UNKNOWN``, and an unknown field
never matches: a result whose machine is not fully known is never pinned bit for bit.

The two settings above are how one machine plays another CPU: with ``ATEN_CPU_CAPABILITY=default
MKL_CBWR=COMPATIBLE`` (or ``ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2`` on an AVX-512 machine) the
float32 sums round as on a CPU with another instruction set, and the fingerprint differs, so the
bit-for-bit branch is not taken under them (.ci/run runs the tests that read saved results again
each way).

A benchmark records more of its machine with its timings (``info``: the fingerprint, cores, torch
threads, Python, the GPU) and prints it in one line (``describe_info``).

Saved results also record the code that made them (``provenance``): the commit of the checkout and
whether the code it runs had uncommitted changes (``code_changes``). Each training process writes its own
record into its run folder as it starts (``record_code``: provenance.json, with the sha256 of the
uncommitted changes, and the changes themselves in code.diff), so a study that runs for days can say
which of its runs ran which code (``recorded_code``, ``same_code``, ``describe_code``).

git's word on the files is not taken alone. An edit hidden from ``git status`` by ``git update-index
--assume-unchanged`` (or ``--skip-worktree``) is found by reading each code file and comparing its git
blob id with the one git's index holds (``hidden_changes``); it counts as an uncommitted change and its
patch is in code.diff. And what the process imported is recorded from the modules themselves
(``what_ran``, in provenance.json under "ran"): the sha256 of each project module's file, PYTHONPATH, a
project module loaded from outside the checkout, a sitecustomize or usercustomize module (Python runs it
before any project code), and each function or class of a project module that now comes from another
file (a monkeypatch).
"""
import ast
import hashlib
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
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
    """The MKL version torch was built with ('2024.2'), 'none' without MKL, UNKNOWN if not stated; with
    MKL_CBWR set, its value too ('2024.2, MKL_CBWR=COMPATIBLE': MKL's code path is then not the CPU's)."""
    if not torch.backends.mkl.is_available():
        return "none"
    found = re.search(r"Math Kernel Library Version ([\w.]+)", torch.__config__.show())
    version = found.group(1) if found else UNKNOWN
    cbwr = os.environ.get("MKL_CBWR")
    return f"{version}, MKL_CBWR={cbwr}" if cbwr and version != UNKNOWN else version


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


# =====================================================================================
# What a benchmark records of its machine
# =====================================================================================

def info():
    """What a benchmark records of its machine, a small JSON-able dict: the fingerprint (CPU model and
    capability, torch, MKL and transformers versions), cores, torch threads, Python and the GPU if any."""
    return dict(**fingerprint(), logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS", "unset"),
                python=platform.python_version(), platform=platform.platform(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def describe_info(info):
    """One line for a results file: CPU (and its capability), torch threads and version (and the GPU
    if there is one)."""
    cpu = info["cpu"] + (f" ({info['cpu_capability']})" if info.get("cpu_capability") else "")
    return (f"{cpu}, {info['torch_threads']} torch thread(s), torch {info['torch']}"
            + (f", {info['cuda']}" if info.get("cuda") else ""))


# =====================================================================================
# The code a result was made with
# =====================================================================================

ROOT = Path(__file__).resolve().parent.parent
CODE = (":(glob)*.py", ":(glob)lab/**/*.py", ":(glob)benchmarks/*.py")  # the root modules, lab/, benchmarks/


def _git(*args, ok=(0,), env=None):
    """git's output in the repository, or None where there is no git or no checkout (or its exit status is not
    one of ``ok``). ``env``: variables set for this call (GIT_INDEX_FILE)."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **env} if env else None)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.rstrip() if done.returncode in ok else None  # rstrip: status lines start with a space


def commit():
    """The commit checked out (40 hex digits), or UNKNOWN outside a git checkout."""
    return _git("rev-parse", "HEAD") or UNKNOWN


def _listed():
    """The code files ``git status`` lists as changed or new, as paths from the root; None where git cannot tell."""
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *CODE)
    if status is None:
        return None
    return {line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip()}


def blob_id(data):
    """git's object id of a file's content (what ``git hash-object`` prints): sha1 of b"blob <length>\\0" + data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hidden_changes():
    """The tracked code files whose content on disk is not the blob git's index holds for them (``git ls-files
    -s``), as paths from the root, read from the files whatever git status says: an edit hidden by ``git
    update-index --assume-unchanged`` or ``--skip-worktree`` is found here. None where git cannot tell."""
    staged = _git("ls-files", "-s", "-z", "--", *CODE)
    if staged is None:
        return None
    changed = []
    for entry in filter(None, staged.split("\0")):
        meta, path = entry.split("\t", 1)  # '<mode> <blob> <stage>', path
        mode, blob = meta.split()[:2]
        file = ROOT / path
        if mode == "120000":  # a symbolic link: git stores its target
            data = os.readlink(file).encode() if file.is_symlink() else None
        else:
            data = file.read_bytes() if file.is_file() else None
        if data is None or blob_id(data) != blob:
            changed.append(path)
    return changed


def code_changes():
    """The code files (``CODE``) with uncommitted changes, new files and edits git's index hides included
    (``hidden_changes``), as paths from the root; [] when the code is the commit's. None where git cannot
    tell (no checkout)."""
    listed, hidden = _listed(), hidden_changes()
    if listed is None or hidden is None:
        return None
    return sorted(listed | set(hidden))


def provenance():
    """What a saved result records of the code that made it: {"commit", "code_changes"}
    (code_changes: the files that differed from that commit; None: unknown)."""
    return {"commit": commit(), "code_changes": code_changes()}


def code_diff():
    """The uncommitted changes to the code (``CODE``) as one patch: ``git diff HEAD`` of the tracked files, then
    the edits git's index hides (``unhidden_diff``), then each new file as an addition; '' when the code is
    the commit's, None where git cannot tell."""
    tracked = _git("diff", "HEAD", "--binary", "--", *CODE)
    new = _git("ls-files", "--others", "--exclude-standard", "--", *CODE)
    listed, hidden = _listed(), hidden_changes()
    if tracked is None or new is None or listed is None or hidden is None:
        return None
    unseen = [path for path in hidden if path not in listed]
    added = [_git("diff", "--no-index", "--binary", "--", "/dev/null", path, ok=(0, 1))  # 1: they differ
             for path in new.splitlines()]
    return "".join(part + "\n" for part in (tracked, unhidden_diff(unseen) if unseen else "", *added) if part)


def unhidden_diff(paths):
    """``git diff HEAD`` of ``paths``, edits that git's index hides (assume-unchanged, skip-worktree), made
    through a copy of the index with those marks cleared: the repository's own index is left as it is."""
    index = _git("rev-parse", "--git-path", "index")
    if index is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "index"
        shutil.copyfile(Path(ROOT, index), copy)  # --git-path: from the root, or absolute in a worktree
        env = {"GIT_INDEX_FILE": str(copy)}
        for mark in ("--no-assume-unchanged", "--no-skip-worktree"):  # one call each: git keeps only the last
            _git("update-index", mark, "--", *paths, env=env)
        return _git("diff", "HEAD", "--binary", "--", *paths, env=env)


def code_record():
    """(record, diff) of the code this process runs from: record = provenance() and ``diff_sha256``, the
    sha256 of the patch (None where the code is the commit's or git cannot tell), which tells two sets of
    uncommitted changes to the same files apart; diff = the patch (``code_diff``)."""
    diff = code_diff()
    return dict(provenance(), diff_sha256=hashlib.sha256(diff.encode()).hexdigest() if diff else None), diff


CUSTOMIZE = ("sitecustomize", "usercustomize")  # modules Python's site runs before any project code


def project_modules():
    """{module name: path from the root} of the code files (``CODE``) of the checkout: 'otb' -> 'otb.py',
    'lab.compare' -> 'lab/compare.py', 'lab' -> 'lab/__init__.py'."""
    names = {}
    for file in (*ROOT.glob("*.py"), *ROOT.glob("lab/**/*.py"), *ROOT.glob("benchmarks/*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file.relative_to(ROOT).as_posix()
    return names


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _defined_elsewhere(module, path):
    """'module.name (from file)' for each function or class that ``path``, the module's source, defines at its
    top level but whose object in the module now comes from another file (replaced after the import)."""
    out = []
    for node in ast.parse(Path(path).read_text()).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        obj = getattr(module, node.name, None)
        if obj is None:
            continue
        code = getattr(inspect.unwrap(obj), "__code__", None)  # under functools.wraps-style decorators
        where = code.co_filename if code is not None else getattr(sys.modules.get(getattr(obj, "__module__", "")),
                                                                   "__file__", None)
        if where is not None and Path(where).resolve() != Path(path).resolve():
            out.append(f"{module.__name__}.{node.name} (from {where})")
    return out


def what_ran():
    """What this process has imported of the project, read from the modules and their files (git is not
    asked): {"modules": {path from the root: sha256 of the file}, "pythonpath": PYTHONPATH or None,
    "outside_checkout": {module: file} of project modules imported from elsewhere (another copy of otb.py
    earlier on sys.path), "customize": {module: {"file", "sha256"}} of a sitecustomize or usercustomize
    module, "patched": functions and classes of project modules that now come from another file}."""
    names, modules, outside, patched = project_modules(), {}, {}, []
    files = {(ROOT / path).resolve(): path for path in names.values()}
    for name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file is None:
            continue
        path = files.get(Path(file).resolve())  # by its file: `python train.py` runs train.py as __main__
        if path is not None:
            modules[path] = _sha256(ROOT / path)
            patched += _defined_elsewhere(module, ROOT / path)
        elif name in names:
            outside[name] = str(file)
    customize = {name: dict(file=str(sys.modules[name].__file__), sha256=_sha256(sys.modules[name].__file__))
                 for name in CUSTOMIZE if getattr(sys.modules.get(name), "__file__", None)}
    return dict(modules=modules, pythonpath=os.environ.get("PYTHONPATH"), outside_checkout=outside,
                customize=customize, patched=patched)


RUN_RECORD, RUN_DIFF = "provenance.json", "code.diff"  # what a run folder holds of its code


def record_code(folder, code, ran=None):
    """Write ``code`` (``code_record``, taken as the process started) into a run folder: provenance.json
    (the record, the time, the name of the patch file and ``ran``, what the process imported: ``what_ran``)
    and code.diff (the patch, where there is one). A folder that holds a record already (a resumed run) keeps
    it in "earlier", its patch renamed code-<first 12 hex digits of its sha256>.diff, so every start of the
    run stays on record."""
    folder, (record, diff) = Path(folder), code
    record = dict(record, utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), diff=RUN_DIFF if diff else None)
    if ran is not None:
        record["ran"] = ran
    before = recorded_code(folder)
    if before is not None:
        if before.get("diff") == RUN_DIFF:
            before["diff"] = f"code-{before['diff_sha256'][:12]}.diff"
            (folder / RUN_DIFF).rename(folder / before["diff"])
        record["earlier"] = before.pop("earlier", []) + [before]
    folder.mkdir(parents=True, exist_ok=True)
    if diff:
        (folder / RUN_DIFF).write_text(diff)
    (folder / RUN_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def recorded_code(folder):
    """The record a run folder holds of the code it ran (``record_code``); None where it holds none (a run
    made before runs recorded it)."""
    path = Path(folder) / RUN_RECORD
    return json.loads(path.read_text()) if path.exists() else None


def same_code(a, b):
    """True when two records (``code_record``, ``record_code``) name the same code: the same commit, the same
    changed files and the same patch. Code that git could not see is never the same as anything."""
    return a["code_changes"] is not None and all(a.get(k) == b.get(k) for k in ("commit", "code_changes",
                                                                                   "diff_sha256"))


def describe_code(record):
    """'commit 1a2b3c4d5e6f', or '... with uncommitted changes to train.py (diff 9f8e7d6c5b4a)', or '... with
    code changes unknown (no git checkout)'."""
    text = f"commit {record['commit'][:12]}"
    if record["code_changes"] is None:
        return text + " with code changes unknown (no git checkout)"
    if record["code_changes"]:
        text += f" with uncommitted changes to {', '.join(record['code_changes'])}"
        text += f" (diff {record['diff_sha256'][:12]})" if record.get("diff_sha256") else ""
    return text


NOT_RECORDED = "not recorded"  # a result saved before its machine or commit was recorded


def kept_provenance(saved):
    """The provenance a re-analysis of a saved record keeps: the measurement's (``saved["provenance"]``),
    or, for a result saved before commits were recorded, {"commit": NOT_RECORDED, "code_changes": None}."""
    return saved.get("provenance") or {"commit": NOT_RECORDED, "code_changes": None}


# =====================================================================================
# Rounded text made on another machine
# =====================================================================================

NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?([eE][-+]?\d+)?")  # 90, 116,424, -0.375, 1.2e-17


def _last_digit_unit(text):
    """The value of one unit in the last printed digit of a number as printed: '0.375' -> 0.001,
    '1.20e-05' -> 1e-07; None for an integer ('24', '116,424': counts, compared exactly)."""
    mantissa, _, exponent = text.lower().partition("e")
    if "." not in mantissa and not exponent:
        return None
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def rounding_moves(want, got):
    """What separates two rounded texts (a table, a summary, a notebook's output) when rounding alone can
    explain it, as ['0.375 -> 0.376', ...] ([] when equal); None when it cannot.

    Rounding alone: the words, the spacing and the integers are the same, and each number with a fraction
    or an exponent is printed with as many digits and is at most one unit of its last digit away. A value
    that sits at a rounding boundary (within the last bits of a float of one) prints one way on one CPU
    and the other way on another; a change of code moves the words, the integers or a number further."""
    if NUMBER.sub("#", want) != NUMBER.sub("#", got):
        return None
    moves = []
    for a, b in zip(NUMBER.finditer(want), NUMBER.finditer(got)):
        a, b = a.group(), b.group()
        if a == b:
            continue
        unit = _last_digit_unit(a)
        if unit is None or unit != _last_digit_unit(b):
            return None
        if abs(float(a.replace(",", "")) - float(b.replace(",", ""))) > unit * (1 + 1e-6):
            return None
        moves.append(f"{a} -> {b}")
    return moves
