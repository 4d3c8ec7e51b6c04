"""Argument types shared by the benchmark scripts: a bad value stops argparse with one line
(`error: argument --steps: must be an integer >= 1, got '0'`, exit status 2) before anything
is run or written.

Output paths are checked the same way (a folder must not be a file, a file must not be a folder,
and either must be creatable and writable), and by default the benchmarks write under ``runs/``
(git-ignored): the committed ``benchmarks/results/`` change only when ``--out``/``--json`` names
them.
"""
import argparse
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs"  # the default home of every benchmark's output (git-ignored)


def at_least(low):
    """An int option that must be >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def int_list(low):
    """A comma-separated list of ints, each >= low; the text is returned unchanged."""
    def parse(text):
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {low}, got {text!r}")
        return text
    parse.__name__ = f"list of integers >= {low}"
    return parse


def device_option(text):
    """auto, cpu or cuda; cuda only where torch can see a CUDA device."""
    import torch
    if text not in ("auto", "cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be auto, cpu or cuda, got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"cuda is not available on this machine (torch {torch.__version__})")
    return text


def choice_list(choices):
    """A comma-separated, non-empty list of names, each one of ``choices``; the text is returned unchanged."""
    def parse(text):
        names = text.split(",")
        bad = [n for n in names if n not in choices]
        if bad or not text:
            raise argparse.ArgumentTypeError(f"must be comma-separated names from {', '.join(choices)}, "
                                             f"got {text!r}")
        return text
    parse.__name__ = "list of " + "/".join(choices)
    return parse


def _creatable(path):
    """None if ``path`` can be created (or written) here, else why not. Creates nothing."""
    parent = path.parent
    while not parent.exists():  # the nearest folder that already exists
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, so {path} cannot be created"
    if not os.access(parent if not path.exists() else path, os.W_OK):
        return f"{parent if not path.exists() else path} is not writable"
    return None


def out_folder(text):
    """A folder to write results into: it may not exist yet, but must not be a file and must be creatable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    why = _creatable(path)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def out_json(text):
    """A .json file to write: not a folder, its folder creatable."""
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"must be a path ending in .json, got {text!r}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    why = _creatable(path)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def multiple_of(k, low):
    """An int option that must be a multiple of k and >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or value % k:
            raise argparse.ArgumentTypeError(f"must be a multiple of {k} (>= {low}), got {text!r}")
        return value
    parse.__name__ = f"multiple of {k}"
    return parse
