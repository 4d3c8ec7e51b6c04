"""Run the tutorial notebooks and store them *with* their outputs, so a reader on the web sees the
numbers and figures without running anything.

    python notebooks/execute.py            # re-run 01, 02 and 03 in place (about two minutes)
    python notebooks/execute.py --check    # exit 1 if a stored output differs from a fresh run

The stored outputs are compared as text (printed numbers, tables); figures are compared by count
only (their bytes depend on the matplotlib build), anything that looks like a wall-clock time is
masked, a number below 1e-10 printed in e-notation is a rounding residue (``max |a - b| = 1.2e-17``:
the CPU's float64 rounding decides its digits) and is compared as ``<1e-10``, and stderr (warnings)
is neither stored nor compared. Progress bars are not outputs: tqdm writes them to stderr, or, where
ipywidgets is installed (the README's notebook extras), as widgets, which are left out too, so a
notebook stores the same outputs with or without ipywidgets. The test suite runs the check, so a
change to a module that moves a number in a notebook fails until the notebook is re-run with this
command. The exercise notebooks are not touched: they stay blank (see exercises/build.py).

Numbers the CPU decides. Notebook 02 trains a float32 model; on another CPU its sums round in
another order and its warm-up, table and curves come out a little different (docs/training.md,
"Which numbers depend on the machine"). Writing a notebook stores this machine's fingerprint in its
metadata (``machine``: CPU model and capability, torch, MKL and transformers versions; see
lab/machine.py). A code cell tagged ``machine-dependent`` is compared as text only where the
fingerprint matches; on any other machine its numbers are masked and the rest (the words, the rows
and columns of a table) is compared, and the numbers that differ are listed, not counted as stale.
Any other cell is compared as text on the machine that stored it; elsewhere a number may also move by
one unit of its last printed digit (a value at a rounding boundary: ``machine.rounding_moves``).
"""
import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from lab import machine  # noqa: E402

TUTORIALS = ["notebooks/01_toy_bandit.ipynb", "notebooks/02_training_comparison.ipynb",
             "notebooks/03_saved_results.ipynb"]
TIME = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|sec|seconds|min)\b")  # wall-clock times vary between runs
NUMBER = machine.NUMBER  # a printed number: 90, 0.375, 116,424, -1.2e-17
TAG = "machine-dependent"  # a cell whose numbers the CPU decides
E_NOTATION = re.compile(r"[-+]?\d+(\.\d+)?[eE][-+]?\d+")


def residues_masked(text):
    """``text`` with every e-notation number below 1e-10 in size (rounding: 1.2e-17, 0.0e+00) as '<1e-10'."""
    return E_NOTATION.sub(lambda m: "<1e-10" if abs(float(m.group())) < 1e-10 else m.group(), text)


WIDGET = "application/vnd.jupyter.widget-view+json"  # a widget's output (tqdm's bar where ipywidgets is installed)


def execute(path, timeout=600):
    """The notebook at ``path`` (relative to the repo root), executed top to bottom from the root.

    What depends on the machine rather than the code is left out: stderr (warnings that name the
    virtual environment's path; tqdm's bars without ipywidgets), widgets (tqdm's bars with it) and the
    execution timestamps in each cell's metadata."""
    nb = nbformat.read(str(ROOT / path), as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
                            and WIDGET not in o.get("data", {})]
    return nb


def cell_outputs(nb):
    """Per code cell: its text outputs (times and rounding residues masked), the number of images, and
    whether it is tagged machine-dependent."""
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
        text = residues_masked(TIME.sub("<time>", "".join(texts)))
        cells.append((text, images, TAG in cell.metadata.get("tags", [])))
    return cells


def first_difference(stored, fresh, width=100):
    """'line 3: stored '...', here '...'': the first line where two texts differ."""
    a, b = stored.splitlines(), fresh.splitlines()
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    line = lambda lines: repr(lines[k][:width]) if k < len(lines) else "(no such line)"  # noqa: E731
    return f"line {k + 1}: stored {line(a)}, here {line(b)}"


def compare(stored, fresh, same_machine=True):
    """(stale, cpu): what differs between the stored and the fresh outputs, per code cell. ``stale``:
    differences a change of code or notebook explains. ``cpu``: on another machine than the one that
    stored the outputs (``same_machine`` False), cells whose numbers alone moved as another CPU moves them
    (``cpu_moves``), with the numbers that moved."""
    a, b = cell_outputs(stored), cell_outputs(fresh)
    if len(a) != len(b):
        return [f"{len(a)} code cells stored, {len(b)} in the fresh run"], []
    stale, cpu = [], []
    for i, ((text, images, tagged), (new_text, new_images, _)) in enumerate(zip(a, b)):
        if images != new_images:
            stale.append(f"code cell {i}: {images} figure(s) stored, {new_images} here")
        elif text == new_text:
            continue
        elif not same_machine and (moved := cpu_moves(text, new_text, tagged)) is not None:
            more = f" and {len(moved) - 6} more" if len(moved) > 6 else ""
            cpu.append(f"code cell {i}: {', '.join(moved[:6])}{more}")
        else:
            stale.append(f"code cell {i}: text differs, {first_difference(text, new_text)}")
    return stale, cpu


def cpu_moves(text, new_text, tagged):
    """The numbers that another CPU moved in a cell's text (['0.375 -> 0.376', ...]), or None when the texts
    differ in more than that: in any cell, numbers one unit of their last digit away; in a cell tagged
    machine-dependent, any numbers, the words and layout the same."""
    rounded = machine.rounding_moves(text, new_text)
    if rounded is not None or not tagged or NUMBER.sub("#", text) != NUMBER.sub("#", new_text):
        return rounded
    return [f"{x.group()} -> {y.group()}" for x, y in zip(NUMBER.finditer(text), NUMBER.finditer(new_text))
            if x.group() != y.group()]


def how_to_check(paths, recorded):
    """What to do about a STALE notebook: how to see whether a change moved its outputs, and on which
    machine they were stored (``recorded``: {path: the fingerprint in its metadata})."""
    here = machine.fingerprint()
    lines = ["A stored output differs from a fresh run (what differs is above). To see whether your change "
             "moved it, run the same check without it: for changes not yet committed,",
             f"    git stash && python notebooks/execute.py --check {' '.join(paths)}; git stash pop",
             "and for committed ones, the same check in a checkout of the commit you started from. If the "
             "notebook is STALE there too, the difference is not your change's: it was there before, or it "
             "comes from this machine.",
             f"This machine: {machine.describe(here)}."]
    for path in paths:
        fp = recorded[path]
        differs = [d.split(":")[0] for d in machine.differences(fp, here)]
        lines.append(f"{path}: outputs stored on {machine.describe(fp)}"
                     + (f"; not the same machine ({', '.join(differs)})." if differs else "; the same machine."))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with a fresh run instead of rewriting")
    p.add_argument("notebooks", nargs="*", default=TUTORIALS, help="which notebooks (default: every tutorial)")
    args = p.parse_args(argv)
    for path in args.notebooks:
        if not (ROOT / path).is_file():
            p.error(f"{path}: no such notebook (paths are relative to the repository root)")
    bad = {}
    for path in args.notebooks:
        fresh = execute(path)
        if args.check:
            stored = nbformat.read(str(ROOT / path), as_version=4)
            recorded = stored.metadata.get("machine", {})
            stale, cpu = compare(stored, fresh, machine.matches(recorded))
            if stale:
                bad[path] = recorded
            print(f"{path}: " + ("STALE: " + "; ".join(stale) if stale else "up to date") + (
                f" (numbers that the CPU decides, from another machine than the stored ones: {'; '.join(cpu)})"
                if cpu else ""))
        else:
            fresh.metadata["machine"] = machine.fingerprint()  # the outputs' numbers depend on it
            fresh.metadata["provenance"] = machine.provenance()  # and the code that made them
            nbformat.write(fresh, str(ROOT / path))
            print(f"wrote {path} with its outputs")
    if bad:
        print(how_to_check(list(bad), bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
