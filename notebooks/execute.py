"""Run the tutorial notebooks and store them *with* their outputs, so a reader on the web sees the
numbers and figures without running anything.

    python notebooks/execute.py            # re-run 01, 02 and 03 in place (about two minutes)
    python notebooks/execute.py --check    # exit 1 if a stored output differs from a fresh run

The stored outputs are compared as text (printed numbers, tables); figures are compared by count
only (their bytes depend on the matplotlib build), anything that looks like a wall-clock time is
masked, and stderr (warnings) is neither stored nor compared. The test suite runs the check, so a
change to a module that moves a number in a notebook fails until the notebook is re-run with this
command. The exercise notebooks are not touched: they stay blank (see exercises/build.py).
"""
import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ["notebooks/01_toy_bandit.ipynb", "notebooks/02_training_comparison.ipynb",
             "notebooks/03_saved_results.ipynb"]
TIME = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|sec|seconds|min)\b")  # wall-clock times vary between runs


def execute(path, timeout=600):
    """The notebook at ``path`` (relative to the repo root), executed top to bottom from the root.

    What depends on the machine rather than the code is left out: stderr (warnings that name the
    virtual environment's path) and the execution timestamps in each cell's metadata."""
    nb = nbformat.read(str(ROOT / path), as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    return nb


def fingerprint(nb):
    """Per code cell: its text outputs (times masked) and the number of images."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts, images = [], 0
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") != "stderr":
                texts.append(out.get("text", ""))
            data = out.get("data", {})
            images += sum(1 for k in data if k.startswith("image/"))
            for kind in ("text/markdown", "text/plain"):
                if kind in data and not any(k.startswith("image/") for k in data):
                    texts.append(data[kind] if isinstance(data[kind], str) else "".join(data[kind]))
                    break
        cells.append((TIME.sub("<time>", "".join(texts)), images))
    return cells


def stale_cells(stored, fresh):
    """Indices (among code cells) whose outputs differ, with a short reason each."""
    a, b = fingerprint(stored), fingerprint(fresh)
    if len(a) != len(b):
        return [f"{len(a)} code cells stored, {len(b)} in the fresh run"]
    return [f"code cell {i}: " + ("text differs" if x[0] != y[0] else f"{x[1]} figure(s) stored, {y[1]} fresh")
            for i, (x, y) in enumerate(zip(a, b)) if x != y]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with a fresh run instead of rewriting")
    p.add_argument("notebooks", nargs="*", default=TUTORIALS, help="which notebooks (default: every tutorial)")
    args = p.parse_args(argv)
    for path in args.notebooks:
        if not (ROOT / path).is_file():
            p.error(f"{path}: no such notebook (paths are relative to the repository root)")
    bad = 0
    for path in args.notebooks:
        fresh = execute(path)
        if args.check:
            problems = stale_cells(nbformat.read(str(ROOT / path), as_version=4), fresh)
            bad += bool(problems)
            print(f"{path}: " + ("up to date" if not problems else "STALE: " + "; ".join(problems)))
        else:
            nbformat.write(fresh, str(ROOT / path))
            print(f"wrote {path} with its outputs")
    if bad:
        print("re-run `python notebooks/execute.py` and commit the notebooks", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
