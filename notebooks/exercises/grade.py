"""Grade exercise notebooks without changing them.

    python notebooks/exercises/grade.py                        # the five notebooks in this folder
    python notebooks/exercises/grade.py ~/my_01.ipynb ...      # any exercise notebooks, anywhere

Each notebook is read from disk once and run *in memory*, top to bottom, as Jupyter's "Run All"
would (its own folder as the working directory, the project found through ``OTB_ROOT``, which this
script sets); the file itself is never written, so grading can never lose an answer. A cell that
raises does not stop the run: the next cells still run, as they would for a student who skips one.

For every check cell (the cells tagged ``check``) it prints one line, CORRECT or NOT YET, with the
check's problem and hint under a NOT YET, and an error of the notebook's own cells (a syntax error in
an answer, say) where there is one:

    01_sum_pi_squared.ipynb
      CORRECT   Exercise 1a (sum_k pi_k^2 from logits)
      NOT YET   Exercise 1b (the Logit-Gradient Proxy w_t)
                problem: ...
                hint:    ...

Exit status: 0 if every check of every notebook is CORRECT, 1 if any is not (so an autograder can
use it), 2 for bad usage (a path that is not a notebook).
"""
import argparse
import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the project: otb.py lives here
_VERDICT = re.compile(r"^(?P<title>Exercise .*?): (?P<verdict>CORRECT|NOT YET CORRECT)\b")


def run_copy(path, timeout=300):
    """The notebook at ``path``, executed in memory (the file is only read); returns the executed copy."""
    nb = nbformat.reads(Path(path).read_text(encoding="utf-8"), as_version=4)
    before = os.environ.get("OTB_ROOT")
    os.environ["OTB_ROOT"] = before or str(ROOT)  # the kernel inherits it: notebooks outside the project work
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                       extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no kernel chatter on the screen
                       resources={"metadata": {"path": str(Path(path).resolve().parent)}}).execute()
    finally:
        if before is None:
            del os.environ["OTB_ROOT"]
    return nb


def _error(cell):
    """'ErrorName: message' of the first error a code cell raised, or None."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def results(nb):
    """[(title, ok, detail lines)] for every check cell of an executed notebook, in order."""
    found, earlier = [], []  # earlier: errors of non-check cells since the last check
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        error = _error(cell)
        if "check" not in tags:
            if error:
                earlier.append(f"code cell {index} raised {error}")
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
                       and o.get("name") == "stdout")
        lines = text.splitlines()
        verdicts = [(k, _VERDICT.match(line)) for k, line in enumerate(lines) if _VERDICT.match(line)]
        if not verdicts:
            detail = [f"this check cell raised {error}" if error else "this check cell printed no verdict"]
            found.append((cell.source.strip().splitlines()[-1], False, earlier + detail))
        for k, match in verdicts:
            ok = match.group("verdict") == "CORRECT"
            detail = [] if ok else [line.strip() for line in lines[k + 1:] if line.startswith("  ")]
            found.append((match.group("title"), ok, [] if ok else earlier + detail))
        earlier = []
    return found


def report(path, found, out=None):
    """Print one notebook's verdicts; returns the number of checks that are not CORRECT."""
    out = out or sys.stdout
    print(Path(path).name, file=out)
    if not found:
        print("  NOT YET   no check cells found (is this an exercise notebook?)", file=out)
        return 1
    for title, ok, detail in found:
        print(f"  {'CORRECT' if ok else 'NOT YET':9s} {title}", file=out)
        for line in detail:
            print(f"            {line}", file=out)
    return sum(not ok for _, ok, _ in found)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\nEach")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The notebooks are never modified: they are run in memory.")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="exercise notebooks to grade (default: the five in notebooks/exercises/)")
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds one cell may run before it is interrupted and counted as not correct "
                             "(default 300)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(HERE.glob("0*.ipynb"))
    for path in paths:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path}: not a notebook file (expected an existing .ipynb)")
    if args.timeout < 1:
        parser.error(f"--timeout must be at least 1 second, got {args.timeout}")
    bad = total = 0
    for path in paths:
        found = results(run_copy(path, args.timeout))
        bad += report(path, found)
        total += max(len(found), 1)
    print(f"{total - bad} of {total} checks correct in {len(paths)} notebook(s)"
          + ("" if bad else ": all done"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
