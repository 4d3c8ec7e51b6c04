"""Grade exercise notebooks without changing them.

    python notebooks/exercises/grade.py                        # the five notebooks in this folder
    python notebooks/exercises/grade.py ~/my_01.ipynb ...      # any exercise notebooks, anywhere
    python notebooks/exercises/grade.py --timeout 120 ...      # allow a cell 120 s (default 60)

Each notebook is read from disk once and run *in memory*, top to bottom, as Jupyter's "Run All"
would (its own folder as the working directory, the project found through ``OTB_ROOT``, which this
script sets); the file itself is never written, so grading can never lose an answer. A cell that
raises does not stop the run: the next cells still run, as they would for a student who skips one.
A cell that runs longer than the time limit (60 s by default: every cell of the exercises takes a few
seconds, so only a loop that never ends gets there) is interrupted, reported, and the run goes on.

For every check cell (tagged ``check``, or any cell that calls one of check.py's checks: an editor
may drop the tags) it prints one line, CORRECT or NOT YET, titled by its exercise, with the check's
problem and hint under a NOT YET, and an error of the notebook's own cells (a syntax error in an
answer, say) where there is one:

    01_sum_pi_squared.ipynb
      CORRECT   Exercise 1a (sum_k pi_k^2 from logits)
      NOT YET   Exercise 1b (the Logit-Gradient Proxy w_t)
                problem: ...
                hint:    ...
    02_group_baselines.ipynb
      NOT YET   Exercise 2b (group-mean baseline): timed out after 60 s (a loop that never ends?)
    03_mine.ipynb: cannot be read as a notebook (not valid JSON: ...); open it in Jupyter and save it again

A notebook that cannot be read is one line, and the notebooks after it are still graded.

Exit status: 0 if every check of every notebook is CORRECT, 1 if any is not (so an autograder can
use it), 2 for bad usage (a path that is not a notebook).
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the project: otb.py lives here
for _path in (ROOT, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from check import TITLES, H  # noqa: E402  (the title of every exercise; the marker of what a student reads)

TIMEOUT = 60  # seconds a cell may run: each exercise cell takes a few, so only a loop that never ends gets here
_VERDICT = re.compile(r"^(?P<title>Exercise .*?): (?P<verdict>CORRECT|NOT YET CORRECT)\b")
_CHECK_CALL = re.compile(r"\bcheck\.(?P<name>ex\w+)\(")
_TIMED_OUT = "OTBCellTimeout"  # the error name of a cell interrupted at the time limit (never a student's)


class Unreadable(Exception):
    """The file is not a notebook that can be run; the message is one line saying why."""


def read(path):
    """The notebook at ``path`` (never written to); Unreadable with a one-line reason if it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise Unreadable(f"{type(e).__name__}: {e}") from None
    try:
        json.loads(text)
    except ValueError as e:
        raise Unreadable(f"not valid JSON: {e}") from None
    try:
        nb = nbformat.reads(text, as_version=4)
        if not all(isinstance(c, dict) and "cell_type" in c and "source" in c for c in nb.cells):
            raise ValueError("a cell without cell_type or source")
    except Exception as e:  # any other way of not being a notebook (nbformat raises several)
        raise Unreadable(f"not a Jupyter notebook: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return nb


def run_copy(path, timeout=TIMEOUT):
    """The notebook at ``path``, executed in memory (the file is only read); returns the executed copy.

    A cell interrupted at ``timeout`` seconds gets ``metadata.timed_out`` (in the copy only); if the run
    stops early (the kernel died), the copy's ``metadata.run_stopped`` says why. Unreadable if the file
    is not a notebook."""
    nb = read(path)

    def mark(cell, execute_reply, **_):  # nbclient's hook, after each code cell
        if (execute_reply or {}).get("content", {}).get("ename") == _TIMED_OUT:
            cell.metadata["timed_out"] = timeout
    saved = {k: os.environ.get(k) for k in ("OTB_ROOT", "OTB_GRADING")}
    os.environ["OTB_ROOT"] = saved["OTB_ROOT"] or str(ROOT)  # the kernel inherits it: notebooks anywhere work
    os.environ["OTB_GRADING"] = "1"  # a cell that runs the grader (colab_grade.py) skips itself in here
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                       error_on_timeout={"ename": _TIMED_OUT, "evalue": f"{timeout} s", "traceback": []},
                       on_cell_executed=mark,
                       extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no kernel chatter on the screen
                       resources={"metadata": {"path": str(Path(path).resolve().parent)}}).execute()
    except Exception as e:  # the kernel died (os._exit, out of memory): grade what ran
        nb.metadata["run_stopped"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip(": ")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb


def _error(cell):
    """'ErrorName: message' of the first error a code cell raised, or None."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def _title(cell):
    """The exercise a check cell grades, from the check it calls (its source line if none is known)."""
    call = _CHECK_CALL.search(cell.source)
    name = call.group("name") if call else None
    if name == "ex3c_optimal_token_baseline" and re.search(r"leave_one_out\s*=\s*True", cell.source):
        name = "ex3d_leave_one_out"  # the form notebooks built before ex3d_leave_one_out existed use
    return TITLES.get(name) or f"the check cell `{cell.source.strip().splitlines()[-1]}`"


def _timed_out(seconds):
    return H(f"timed out after {seconds} s (a loop that never ends?)")


def results(nb):
    """[(title, ok, detail lines)] for every check cell of an executed notebook, in order. A check cell
    that timed out is one verdict whose title carries the reason."""
    found, earlier, number = [], [], 0  # earlier: problems of non-check cells since the last check
    stopped = nb.metadata.get("run_stopped")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1  # code cells counted from 1, as a student counts them; markdown cells not counted
        tags = cell.get("metadata", {}).get("tags", [])
        error = _error(cell)
        timed_out = cell.get("metadata", {}).get("timed_out")
        if "check" not in tags and not _CHECK_CALL.search(cell.source):
            where = f"code cell {number} (`{cell.source.strip().splitlines()[0][:60]}`)" if cell.source.strip() \
                else f"code cell {number}"
            if timed_out:
                earlier.append(f"{where} {_timed_out(timed_out)}")
            elif error:
                earlier.append(H(f"{where} raised {error}"))
            continue
        title = _title(cell)
        if timed_out:
            found.append((f"{title}: {_timed_out(timed_out)}", False, earlier))
            earlier = []
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
                       and o.get("name") == "stdout")
        lines = text.splitlines()
        verdicts = [(k, _VERDICT.match(line)) for k, line in enumerate(lines) if _VERDICT.match(line)]
        if not verdicts:
            detail = [H(f"this check cell raised {error}") if error else
                      H(f"this check cell did not run: the run stopped ({stopped})") if stopped and not cell.outputs
                      else H("this check cell printed no verdict")]
            found.append((title, False, earlier + detail))
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
        print(f"  NOT YET   {H('no check cells found (is this an exercise notebook?)')}", file=out)
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
    parser.add_argument("--timeout", type=int, default=TIMEOUT,
                        help=f"seconds one cell may run before it is interrupted and reported as timed out "
                             f"(default {TIMEOUT}: every exercise cell takes seconds, so a class of 30 with a loop "
                             f"that never ends each costs minutes, not hours)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(HERE.glob("0*.ipynb"))
    for path in paths:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path}: not a notebook file (expected an existing .ipynb)")
    if args.timeout < 1:
        parser.error(f"--timeout must be at least 1 second, got {args.timeout}")
    bad = total = 0
    for path in paths:
        try:
            found = results(run_copy(path, args.timeout))
        except Unreadable as why:
            print(f"{path.name}: {H(f'cannot be read as a notebook ({why}); open it in Jupyter and save it again')}")
            bad, total = bad + 1, total + 1
            continue
        bad += report(path, found)
        total += max(len(found), 1)
    print(f"{total - bad} of {total} checks correct in {len(paths)} notebook(s)"
          + ("" if bad else ": all done"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
