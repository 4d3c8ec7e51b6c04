"""What the benchmark scripts share on their command line: argument types that stop argparse with
one line (`error: argument --steps: must be an integer >= 1, got '0'`, exit status 2) before
anything runs or is written, output paths checked the same way, the parser and the command line
stored with the results. By default the benchmarks write under ``runs/`` (git-ignored); the
committed ``benchmarks/results/`` change only when ``--out``/``--json`` names them.

A long experiment records the code it runs: ``code_to_run`` refuses to start runs from code with
uncommitted changes (``--allow-dirty``, from ``allow_dirty_option``, overrides it, and the runs then
record the changed files and the flag), and returns the study's code at its start (``study_code``):
the commit, the changed files, the sha256 of the changes, the flag, this machine's fingerprint and the
time (lab/machine.py). benchmarks/grid.py holds every run to that code: each run records its own
(provenance.json), and a run of other code stops the study unless --allow-dirty is given.
"""
import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab.options import UsageError, pick_device  # noqa: E402  (train.py's, written once)
from lab.parse_options import unwritable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs"  # the default home of every benchmark's output (git-ignored)


def parser(doc):
    """A parser described by the first paragraph of a script's docstring, defaults shown in --help."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def command(script, argv=None):
    """The command line that ran benchmarks/<script> (argv: main's, else the process's), shell-quoted."""
    return f"python benchmarks/{script} {shlex.join(sys.argv[1:] if argv is None else argv)}".strip()


def allow_dirty_option(p):
    """--allow-dirty on parser p (for a script that starts runs with ``code_to_run`` or ``study_code``)."""
    p.add_argument("--allow-dirty", action="store_true",
                   help="go on where the code (*.py, lab/, benchmarks/) has uncommitted changes or git cannot tell, "
                   "as the study starts (where the script refuses that) or when the code changes while it runs; each "
                   "run records the code it ran (its folder's provenance.json and code.diff) and that this flag was "
                   "given")


def parse_study_args(p, argv, *, steps):
    """The command line's tail of a study that trains with train.py and saves each run's metrics under
    <folder>/runs/ (benchmarks/stability.py, benchmarks/stability_replication.py): --from-saved, --steps
    (per run, default ``steps``), --train-args and --allow-dirty added to parser p after its own options,
    then argv parsed; a --from-saved folder without runs/ stops argparse with one line."""
    p.add_argument("--from-saved", default=None, metavar="FOLDER",
                   help="no training: analyse the metrics saved in FOLDER/runs/*.jsonl")
    p.add_argument("--steps", type=at_least(1), default=steps, help="training steps per run")
    p.add_argument("--train-args", default="", help="extra train.py arguments (smoke tests only)")
    allow_dirty_option(p)
    args = p.parse_args(argv)
    if args.from_saved is not None and not (Path(args.from_saved) / "runs").is_dir():
        p.error(f"--from-saved {args.from_saved}: no runs/ folder of saved metrics in it")
    return args


def code_to_run(script, allow_dirty):
    """``study_code``, after a SystemExit (status 1, before anything is written) naming the changed files
    where the code has uncommitted changes, or git cannot tell, and ``allow_dirty`` is not set."""
    code = study_code(allow_dirty)
    changes = code["code_changes"]
    if changes != [] and not allow_dirty:
        why = ("git cannot tell which code would run (no git checkout)" if changes is None else
               f"the code has uncommitted changes ({', '.join(changes[:8])}{', ...' if len(changes) > 8 else ''})")
        raise SystemExit(f"{script}: not starting any run: {why}, so the runs could not record the code they ran. "
                         "Commit the changes first, or pass --allow-dirty (the runs then record the changed files "
                         "and the flag).")
    return code


def study_code(allow_dirty):
    """The study's code at its start, which benchmarks/grid.py holds each run to: {commit, code_changes,
    diff_sha256, allow_dirty, machine, utc} (lab/machine.py's ``code_record`` and ``fingerprint``)."""
    from lab import machine  # imports torch: only where runs start
    return dict(machine.code_record()[0], allow_dirty=bool(allow_dirty), machine=machine.fingerprint(),
                utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def write_json(out, name, record):
    """``record`` as JSON in ``out/name``, the folder made if needed; returns the path."""
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def write_results(out, stem, record, text, md_stem=None):
    """<out>/<stem>.json (the record) and <out>/<md_stem or stem>.md (the text, also printed), the
    folder made if needed."""
    out, md_stem = Path(out), md_stem or stem
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (out / f"{md_stem}.md").write_text(text)
    print(text + f"wrote {out / md_stem}.md and {stem}.json")


def _checked(name, convert, ok, message):
    """An argparse type: convert(text), accepted when ok(value), else "<message>, got '<text>'"."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}")
        return value
    parse.__name__ = name
    return parse


def at_least(low):
    """An int option that must be >= low."""
    return _checked(f"integer >= {low}", int, lambda v: v >= low, f"must be an integer >= {low}")


def multiple_of(k, low):
    """An int option that must be a multiple of k and >= low."""
    return _checked(f"multiple of {k}", int, lambda v: v >= low and v % k == 0,
                    f"must be a multiple of {k} (>= {low})")


positive_float = _checked("number > 0", float, lambda v: v > 0, "must be a number > 0")
positive_float_list = _checked("list of numbers > 0", lambda t: [float(x) for x in t.split(",")],
                               lambda v: all(0 < x < float("inf") for x in v), "must be comma-separated numbers > 0")


def int_list(low):
    """A comma-separated list of ints, each >= low: the list."""
    return _checked(f"list of integers >= {low}", lambda t: [int(x) for x in t.split(",")],
                    lambda v: min(v) >= low, f"must be comma-separated integers >= {low}")


def choice_list(choices):
    """A comma-separated, non-empty list of names, each one of ``choices``: the list."""
    return _checked("list of " + "/".join(choices), lambda t: t.split(","), lambda v: set(v) <= set(choices),
                    f"must be comma-separated names from {', '.join(choices)}")


def device_option(text):
    """auto, cpu or cuda; cuda only where torch can see a CUDA device (lab/options.py's pick_device decides)."""
    if text not in ("auto", "cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be auto, cpu or cuda, got {text!r}")
    try:
        pick_device(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--device {text}: ")) from None
    return text


def _creatable(path):
    """None if ``path`` can be created (or written) here, else why not. Creates nothing."""
    why = unwritable(path)
    return None if why is None else why.replace("is a file, not a folder", f"is a file, so {path} cannot be created")


def out_folder(text):
    """A folder to write results into: it may not exist yet, but must not be a file and must be creatable."""
    path = Path(text)
    why = f"{text} is a file, not a folder" if path.exists() and not path.is_dir() else _creatable(path)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def out_json(text):
    """A .json file to write: not a folder, its folder creatable."""
    path = Path(text)
    why = (f"must be a path ending in .json, got {text!r}" if path.suffix != ".json" else
           f"{text} is a folder, not a file" if path.is_dir() else _creatable(path))
    if why:
        raise argparse.ArgumentTypeError(why)
    return text
