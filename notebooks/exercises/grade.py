"""Grade exercise notebooks without changing them.

    python notebooks/exercises/grade.py                        # the five notebooks in this folder
    python notebooks/exercises/grade.py ~/my_01.ipynb ...      # any exercise notebooks, anywhere
    python notebooks/exercises/grade.py --budget 300 ...       # allow a notebook 300 s (default BUDGET)
    python notebooks/exercises/grade.py --class submissions/   # a folder per student: every student, and
                                                               # submissions/gradebook.csv

Each notebook is read from disk once and run *in memory*, top to bottom, as Jupyter's "Run All"
would (its own folder as the working directory, the project found through ``OTB_ROOT``, which this
script sets); the file itself is never written, so grading can never lose an answer. A cell that
raises does not stop the run: the next cells still run, as they would for a student who skips one.
A cell that runs longer than the time limit (60 s by default: every cell of the exercises takes a few
seconds, so only a loop that never ends gets there) is interrupted, reported, and the run goes on.

The grader decides, not the notebook. It knows each notebook's check cells from check.py
(``check.NOTEBOOKS``, the cells as they are handed out) and recognises the notebook by them and by the
functions it defines, whatever its file is called. Each check cell found unchanged (compared as code:
spacing and comments do not matter) is run in its place by the grader's own code, and decided here, in
this process, on inputs no notebook can know in advance: one seed a run, drawn from os.urandom (or
``--seed``, to grade again on the same inputs), printed at the end and kept in the gradebook. In the
kernel a fresh copy of check.py hands the inputs drawn from it to the student's functions and saves
only what they return (``check.record``); here the same check draws the same inputs, computes its
references and reads the saved results as plain data in place of calling the student's code
(``check.replay``). So a printed verdict, a rebound name, a patched ``check`` module or torch, and a
table of the notebook's fixed examples do not count. A check cell that is missing (deleted, or replaced
by a line printing CORRECT), edited, or placed above the cell that defines the function it checks is NOT
YET with one line saying so.

The student's functions still run in the kernel, where they could reach for the reference (call otb.py,
switch off the watch on such calls, read the check's frames). So before running anything the grader
scans the notebook's own cells (``scan.flags``: the constructs only tampering needs, the project's
functions the exercises do not hand out, copies of otb.py's functions by syntax tree); a notebook it
flags is not run, every check reads FLAGGED with the line and the reason, never CORRECT, and the exit
status is 1: a lecturer reads it. What no scan sees is in scan.py's docstring.

For every check of the notebook it prints one line, CORRECT or NOT YET, titled by its exercise, with
the check's problem and hint under a NOT YET, and an error of the notebook's own cells (a syntax error
in an answer, say) where there is one:

    01_sum_pi_squared.ipynb
      CORRECT   Exercise 1a (sum_k pi_k^2 from logits)
      NOT YET   Exercise 1b (the Logit-Gradient Proxy w_t)
                problem: ...
                hint:    ...
    02_group_baselines.ipynb
      PROBLEM   code cell 4 (`print(1 / 0)`) raised ZeroDivisionError: division by zero
      NOT YET   Exercise 2b (group-mean baseline): the notebook's time budget of 60 s ran out in this cell (a loop that never ends?)
      NOT YET   Exercise 2c (GRPO and RLOO)
                this check cell did not run: the notebook's time budget ran out in an earlier cell
    03_mine.ipynb: cannot be read as a notebook (not valid JSON: ...); open it in Jupyter and save it again

A notebook that cannot be read is one line, and the notebooks after it are still graded. A notebook
the scan flags gets one FLAGGED line per finding and FLAGGED for each check:

    03_forged.ipynb
      FLAGGED   code cell 9, line 1 (`torch.Tensor.any = ...`): assigns to torch.Tensor.any, an attribute of the imported torch
      FLAGGED   Exercise 3a (reward-to-go G_t)

With ``--class DIR`` (one folder per student, named by the student, holding the student's notebooks
under any names) every block is titled ``student/notebook``, each student's full texts go to a folder
of their own (LOGS/student/), and a gradebook CSV is written (``--gradebook``, by default
DIR/gradebook.csv): one row per check, ``student, notebook, exercise, verdict, flag, hint, seed``, the flag
saying why a verdict was not decided by the check as handed out (a check cell missing, edited or moved,
a time budget spent, a file that cannot be read, tampering or a copy of otb.py flagged by the scan:
verdict FLAGGED), and one row per problem of the other cells (verdict PROBLEM).

Exit status: 0 if every check of every notebook is CORRECT and no cell raised or timed out, 1 if not
(a FLAGGED notebook included)
(so an autograder can use it), 2 for bad usage (a path that is not a notebook).
"""
import argparse
import ast
import json
import logging
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the project: otb.py lives here
for _path in (ROOT, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import check  # noqa: E402  (the checks, replayed in this process: check.replay)
import scan  # noqa: E402  (what only tampering needs, flagged before a notebook runs)
from check import NOTEBOOKS, TITLES, H  # noqa: E402  (the check cells; the title of every exercise; the marker of
#                                                  what a student reads)

BUDGET = 60  # seconds a notebook may run: 4x the slowest solution notebooks (03 and 04, 15 s each on a busy 2-core CPU)
WIDTH = 300  # characters a problem line may have; the full text goes to a file (LOGS)
LOGS = Path(tempfile.gettempdir()) / "otb_grade"  # the full problem lines and the kernel's stderr, one file a notebook
_VERDICT = re.compile(r"^(?P<title>Exercise .*?): (?P<verdict>CORRECT|NOT YET CORRECT)\b")
_CHECK_NAME = re.compile(r"\b(ex\d[a-z]_\w+)\b")  # a check named anywhere (an edited cell may rename `check`)
_TIMED_OUT = "OTBCellTimeout"  # the error name of a cell interrupted at the budget's end (never a student's)


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


def _code(source):
    """The cell's code as a tree dump (spacing and comments left out); None if it is not Python."""
    try:
        return ast.dump(ast.parse(source))
    except (SyntaxError, ValueError):
        return None


_EXPECTED = {_code(src): (kind, src) for kind, cells in NOTEBOOKS.items() for src in cells}


def _call_of(source):
    """(check function, assigned name or None, argument source) of a check cell as handed out."""
    stmt = ast.parse(source).body[0]
    call = stmt.value
    target = stmt.targets[0].id if isinstance(stmt, ast.Assign) else None
    args = ", ".join([ast.unparse(a) for a in call.args] + [f"{k.arg}={ast.unparse(k.value)}" for k in call.keywords])
    return call.func.attr, target, args


def _names(source):
    """The argument names of a check cell as handed out (the functions and objects it checks)."""
    call = ast.parse(source).body[0].value
    return [a.id for a in call.args if isinstance(a, ast.Name)] + \
        [k.value.id for k in call.keywords if isinstance(k.value, ast.Name)]


_DEFINES = re.compile(r"^(?:async\s+)?def\s+(?P<def>\w+)|^(?P<name>\w+)\s*(?::[^=\n]*)?=(?!=)", re.MULTILINE)


def kind_of(nb):
    """The exercise notebook (a key of check.NOTEBOOKS) that ``nb`` is a copy of, by the check cells it
    calls and the functions it defines; None if it resembles none."""
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    calls = set(_CHECK_NAME.findall(text))
    defined = {m.group("def") or m.group("name") for m in _DEFINES.finditer(text)}
    score = {kind: sum(_call_of(src)[0] in calls for src in cells) +
             sum(name in defined for src in cells for name in _names(src)[:1])
             for kind, cells in NOTEBOOKS.items()}
    best = max(score, key=score.get)
    return best if score[best] else None


def _grader_cell(source, token, check_path, seed, tape):
    """The code the grader runs in place of the check cell ``source``: the same check from a fresh copy of
    check.py, on inputs drawn from ``seed``, saving the student's results to the file ``tape``
    (check.record); an error (a function not defined) is passed back on one line that starts with
    ``token``. The verdict is not decided here: ``results`` replays the check in the grader's process."""
    name, target, args = _call_of(source)
    module = f"_otb_grade_{token}"
    return (f"def {module}():\n"
            f"    import importlib.util, json, sys\n"
            f"    mod = sys.modules.get({module!r})\n"
            f"    if mod is None:\n"
            f"        sys.path[:0] = [p for p in ({str(ROOT)!r}, {str(HERE)!r}) if p not in sys.path]\n"
            f"        spec = importlib.util.spec_from_file_location({module!r}, {str(check_path)!r})\n"
            f"        mod = sys.modules[{module!r}] = importlib.util.module_from_spec(spec)\n"
            f"        spec.loader.exec_module(mod)\n"
            f"    ok, error = False, None\n"
            f"    try:\n"
            f"        ok = mod.record(mod.{name}, {seed}, {str(tape)!r}, {args})\n"
            f"    except Exception as e:\n"
            f"        error = f'{{type(e).__name__}}: {{e}}'\n"
            f"    print({token!r}, json.dumps({{'error': error}}))\n"
            f"    return ok\n"
            f"{target + ' = ' if target else ''}{module}()\n"
            f"del {module}\n")


class _Budgeted(NotebookClient):
    """nbclient's runner with one time budget for the whole notebook: each cell may run for what is left
    of it; once a cell has been interrupted at the budget's end, the code cells after it are not run.
    ``tapes``: {id(check cell): the file its results are saved to}, read (and removed) as soon as that
    cell has run, so that no later cell can change them."""

    def __init__(self, nb, budget, tapes, **kwargs):
        self.deadline, self.spent, self.tapes = time.monotonic() + budget, False, tapes
        super().__init__(nb, timeout_func=lambda cell: max(1, math.ceil(self.deadline - time.monotonic())),
                         interrupt_on_timeout=True, on_cell_executed=self._mark,
                         error_on_timeout={"ename": _TIMED_OUT, "evalue": f"{budget} s", "traceback": []}, **kwargs)

    def _mark(self, cell, execute_reply, **_):  # nbclient's hook, after each code cell
        if (execute_reply or {}).get("content", {}).get("ename") == _TIMED_OUT:
            cell.metadata["timed_out"], self.spent = True, True
        tape = self.tapes.get(id(cell))
        if tape is not None and tape.is_file():
            cell.metadata["otb_tape"] = tape.read_bytes()
            tape.unlink()

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        if cell.cell_type == "code" and self.spent:
            cell.metadata["not_run"] = True
            return cell
        return await super().async_execute_cell(cell, cell_index, *args, **kwargs)


def draw_seed():
    """A seed for the checks' inputs that no notebook can know in advance (62 bits from os.urandom)."""
    return secrets.randbits(62)


def run_copy(path, budget=BUDGET, seed=None):
    """The notebook at ``path``, executed in memory (the file is only read); returns the executed copy.

    Each check cell of check.NOTEBOOKS found unchanged is run as the grader's own cell (``_grader_cell``)
    on inputs drawn from ``seed`` (``draw_seed()`` if None) and marked ``metadata.otb_check``; the
    student's results it saved are read as soon as it has run and kept in ``metadata.otb_tape`` (bytes,
    for ``results`` to replay). The copy's ``metadata.otb_grading`` holds which notebook it is, the token
    of the grader's lines, the seed, the budget and the kernel's stderr. The cell running when the
    ``budget`` seconds run out gets ``metadata.timed_out``, the code cells after it ``metadata.not_run``
    (in the copy only); if the run stops early (the kernel died), the copy's ``metadata.run_stopped`` says
    why. Unreadable if the file is not a notebook."""
    nb = read(path)
    kind, token, seed = kind_of(nb), secrets.token_hex(8), draw_seed() if seed is None else seed
    nb.metadata["otb_grading"] = {"kind": kind, "token": token, "seed": seed, "budget": budget}
    folder = Path(tempfile.mkdtemp(prefix="otb_tapes_"))  # the kernel's saved results, one file a check cell
    tapes = {}
    for cell in nb.cells:
        expected = _EXPECTED.get(_code(cell.source)) if cell.cell_type == "code" else None
        if kind is not None and expected is not None and expected[0] == kind:
            tapes[id(cell)] = folder / f"{token}_{len(tapes)}.pt"
            cell.metadata["otb_check"] = expected[1]
            cell.source = _grader_cell(expected[1], token, HERE / "check.py", seed, tapes[id(cell)])

    saved = {k: os.environ.get(k) for k in ("OTB_ROOT", "OTB_GRADING")}
    os.environ["OTB_ROOT"] = saved["OTB_ROOT"] or str(ROOT)  # the kernel inherits it: notebooks anywhere work
    os.environ["OTB_GRADING"] = "1"  # a cell that runs the grader (colab_grade.py) skips itself in here
    quiet = logging.getLogger("otb_grade.nbclient")  # nbclient's "Timeout waiting ..." lines: not for the screen
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    try:
        with tempfile.TemporaryFile("w+") as stderr:  # the kernel's stderr (an interrupt's traceback)
            try:
                _Budgeted(nb, budget, tapes, kernel_name="python3", allow_errors=True, log=quiet,
                          extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no kernel chatter on the screen
                          resources={"metadata": {"path": str(Path(path).resolve().parent)}}).execute(stderr=stderr)
            except Exception as e:  # the kernel died (os._exit, out of memory): grade what ran
                nb.metadata["run_stopped"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip(": ")
            stderr.seek(0)
            nb.metadata["otb_grading"]["stderr"] = stderr.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
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


def _timed_out(budget):
    # when: a cell still running when the notebook's budget runs out (a `while True` in 3a, or at the top level)
    return H(f"the notebook's time budget of {budget} s ran out in this cell (a loop that never ends?)")


def _stdout(cell):
    """All that a code cell printed to stdout, its stream messages joined in order: the kernel may deliver
    one printed line as several messages, split anywhere."""
    texts = [out.get("text", "") for out in cell.get("outputs", [])
             if out.get("output_type") == "stream" and out.get("name") == "stdout"]
    return "".join("".join(t) if isinstance(t, list) else t for t in texts)  # a stored notebook may keep a list


def _line_of(cell, token):
    """The dict the grader's cell printed after ``token`` (its last such line); None if there is none or it
    was cut short (the kernel died while printing it)."""
    text = _stdout(cell)
    start = text.rfind(token + " ")
    if start < 0:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(text, start + len(token) + 1)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _verdict_of(cell, stopped, token, seed=None, built=None):
    """(ok, detail lines) of a check cell the grader ran (``run_copy``): an error or a missing line from its
    line under ``token`` in the cell's whole stdout; else the verdict of the check replayed here, in the
    grader's process, on the inputs drawn from ``seed`` and the results the kernel saved (``_replayed``).
    ``built``: the check cells' other arguments built so far (check.BUILT), shared by a notebook's checks."""
    data = _line_of(cell, token)
    error = data.get("error") if data else _error(cell)
    if error:
        # when: the function the check is handed is not defined (its def renamed or its cell deleted: NameError)
        return False, [H(f"this check cell raised {error}")]
    if data is None and stopped:
        # when: the kernel died before this check cell ran (an os._exit(1) or out of memory in a cell above it)
        return False, [H(f"this check cell did not run: the run stopped ({stopped})")]
    if data is None:
        # when: the cell's output never reached the grader (a cell above that sets sys.stdout to something else)
        return False, [H("this check cell printed no verdict")]
    if "otb_tape" not in cell.get("metadata", {}):
        # when: the check cell ran but its results never reached the grader (their file removed by the notebook)
        return False, [H("this check cell saved no results for the grader: run the notebook as handed out")]
    return _replayed(cell, seed, built)


def _replayed(cell, seed, built):
    """(ok, detail lines) of the check cell ``cell``, decided here: check.replay runs the check again in this
    process on the inputs drawn from ``seed``, with the student's results that the kernel saved."""
    name, _, _ = _call_of(cell.metadata["otb_check"])
    call = ast.parse(cell.metadata["otb_check"]).body[0].value
    args = [check.argument(a.id, built) for a in call.args]  # the student's functions: stand-ins
    kwargs = {k.arg: check.argument(k.value.id, built) for k in call.keywords}
    try:
        ok, out = check.replay(name, seed, cell.metadata["otb_tape"], *args, **kwargs)
    except Exception as e:  # a file the kernel wrote that is not check.record's
        # when: the results the kernel saved cannot be read (a file written by something else than check.record)
        return False, [H(f"the results this check cell saved cannot be read ({type(e).__name__}: {e})")]
    lines = out.splitlines()
    verdicts = [k for k, line in enumerate(lines) if _VERDICT.match(line)]
    if ok:
        return True, []
    if not verdicts:
        # when: the check returned False without printing a verdict (check.py's checks always print one: a guard)
        return False, [H("this check cell printed no verdict")]
    return False, [line.strip() for line in lines[verdicts[-1] + 1:] if line.startswith("  ")]


def _defined_at(nb, name):
    """The index of the first code cell that defines ``name`` (a def or an assignment at the top); None."""
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "otb_check" not in cell.get("metadata", {}) and any(
                (m.group("def") or m.group("name")) == name for m in _DEFINES.finditer(cell.source)):
            return k
    return None


def _where(number, cell):
    """How a student finds a code cell: its number among the code cells and its first line."""
    first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
    return f"code cell {number} (`{first}`)" if first else f"code cell {number}"


def problems(nb):
    """[line] for every cell of the executed notebook that is not a check cell and raised or timed out, in
    order; each is reported whatever the checks after it say."""
    found, number = [], 0
    budget = nb.metadata.get("otb_grading", {}).get("budget")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1  # code cells counted from 1, as a student counts them; markdown cells not counted
        if "otb_check" in cell.get("metadata", {}):
            continue
        where, error = _where(number, cell), _error(cell)
        if cell.get("metadata", {}).get("timed_out"):
            found.append(f"{where}: {_timed_out(budget)}")
        elif error:
            # when: a cell that is not a check raised (a `1 / 0` in a cell of its own), whatever the checks say
            found.append(H(f"{where} raised {error}"))
    return found


def results(nb):
    """[(title, ok, detail lines)] for every check of the executed notebook's exercises (check.NOTEBOOKS),
    in order. Only the grader's own runs of the check cells count, each decided in this process (the check
    replayed on the kernel's saved results: ``_verdict_of``); a check cell that is missing, edited,
    above its answer, timed out or not run (the budget ran out before it) is NOT YET with one line saying
    so. The other cells' errors are ``problems(nb)``."""
    grading = nb.metadata.get("otb_grading", {})
    kind, token, budget = grading.get("kind"), grading.get("token", ""), grading.get("budget")
    if kind is None:
        return []
    stopped = nb.metadata.get("run_stopped")
    graded, built = {}, {}
    for k, cell in enumerate(nb.cells):
        source = cell.get("metadata", {}).get("otb_check")
        if cell.cell_type != "code" or source is None:
            continue
        title = TITLES[_call_of(source)[0]]
        late = [name for name in _names(source) if (_defined_at(nb, name) or -1) > k]
        if late:
            # when: a check cell moved above the cell that defines its answer
            graded[source] = (title, False, [H(
                f"this check cell comes before the cell that defines `{late[0]}`: move it back below your answer "
                f"(Run All runs the cells from the top)")])
        elif cell.metadata.get("timed_out"):
            graded[source] = (f"{title}: {_timed_out(budget)}", False, [])
        elif cell.metadata.get("not_run"):
            # when: an earlier cell ran out the notebook's budget (a loop that never ends in 3a: 3c, 3d, 3e not run)
            graded[source] = (title, False, [H(
                "this check cell did not run: the notebook's time budget ran out in an earlier cell")])
        else:
            ok, detail = _verdict_of(cell, stopped, token, grading.get("seed"), built)
            graded[source] = (title, ok, [] if ok else detail)
    found = []
    for source in NOTEBOOKS[kind]:
        if source in graded:
            found.append(graded[source])
            continue
        name = _call_of(source)[0]
        edited = any(c.cell_type == "code" and name in c.source for c in nb.cells)
        cell = " ".join(source.split())
        if edited:
            # when: a check cell edited (its call changed; a comment or new spacing is not an edit)
            line = H(f"its check cell was edited: the grader runs only the check cell as handed out, `{cell}`")
        else:
            # when: a check cell deleted, or replaced by a printed `Exercise 1a (...): CORRECT.` line
            line = H(f"its check cell is missing: put it back below your answer, `{cell}` (printed text never counts)")
        found.append((TITLES[name], False, [line]))
    return found


def _clip(line, log):
    """``line`` if it has at most WIDTH characters; else its start and the file ``log`` that holds it all."""
    if len(line) <= WIDTH:
        return line
    tail = f" ... (cut at {WIDTH} characters; the full text is in {log})"
    return line[:max(WIDTH - len(tail), 40)] + tail


def report(path, found, out=None, cells=(), log=None, stderr="", title=None, flagged=()):
    """Print one notebook's verdicts (``found``, from ``results``) and the problems of its other cells
    (``cells``, from ``problems``) under ``title`` (the file's name by default), each line at most WIDTH
    characters (the full text in ``log``, with the kernel's ``stderr``). A notebook ``flagged`` by the scan
    (scan.flags: its lines) prints them and FLAGGED for every check, never CORRECT.
    Returns the number of checks that are not CORRECT plus the number of those problems."""
    out = out or sys.stdout
    log = Path(log or LOGS / f"{Path(path).stem}.txt")
    print(title or Path(path).name, file=out)
    lines = [f"  FLAGGED   {_flagged(*f)}" for f in flagged]
    lines += [f"  PROBLEM   {line}" for line in cells]
    if not found:
        # when: a notebook with none of the exercise notebooks' check calls or answers (a tutorial notebook)
        lines.append(f"  NOT YET   {H('no check cells found (is this an exercise notebook?)')}")
    for title, ok, detail in found:
        lines.append(f"  {'FLAGGED' if flagged else 'CORRECT' if ok else 'NOT YET':9s} {title}")
        lines += [f"            {line}" for line in detail]
    if any(len(line) > WIDTH for line in lines):
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(lines) + "\n" + (f"\nthe kernel's stderr:\n{stderr}" if stderr else ""))
    for line in lines:
        print(_clip(line, log), file=out)
    return sum(not ok for _, ok, _ in found) + len(cells) + (not found)


def _flagged(number, line, code, why):
    """One finding of the scan as the grader prints it."""
    return f"code cell {number}, line {line} (`{code[:60]}`): {why}"


def students(folder):
    """[(student, [notebook]), ...] of a class folder: one subfolder per student, named by the student,
    holding any number of notebooks under any names (at any depth; hidden folders such as Jupyter's
    .ipynb_checkpoints left out), both sorted; and the notebooks lying loose in ``folder`` itself."""
    def visible(path, top):
        return not any(part.startswith(".") for part in path.relative_to(top).parts)
    found = [(d.name, sorted(p for p in d.rglob("*.ipynb") if p.is_file() and visible(p, d)))
             for d in sorted(folder.iterdir()) if d.is_dir() and not d.name.startswith(".")]
    return found, sorted(folder.glob("*.ipynb"))


# The gradebook's flag: why a verdict was not decided by the check as handed out, which a lecturer looks
# at by hand. Each is read from the start of the line results() writes for it.
_FLAGS = {"its check cell is missing": "check cell missing", "its check cell was edited": "check cell edited",
          "this check cell comes before": "check cell moved", "this check cell did not run": "not run"}
GRADEBOOK = ("student", "notebook", "exercise", "verdict", "flag", "hint", "seed")  # the gradebook's columns


def _rows(student, notebook, found, cells, flagged=()):
    """The gradebook's rows of one graded notebook: one a check, one a problem of its other cells. A
    notebook the scan flagged has every check FLAGGED, its flag 'copy' or 'tampering', the findings as hint."""
    if flagged:
        flag = "copy" if all(" is a copy of " in why for *_, why in flagged) else "tampering"
        why = "; ".join(_flagged(*f) for f in flagged)
        return [(student, notebook, title, "FLAGGED", flag, why) for title in [t for t, _, _ in found] or [""]]
    rows = []
    for title, ok, detail in found:
        title, cut, budget = title.partition(": the notebook's time budget")  # a check that timed out
        hint = " | ".join(re.sub(r"^(\w+):\s+", r"\1: ", line) for line in detail) if detail else \
            (cut[2:] + budget if cut else "")  # 'problem: ... | hint: ...', the padding of the screen left out
        flag = "timed out" if cut else next((f for start, f in _FLAGS.items() if hint.startswith(start)), "")
        rows.append((student, notebook, title, "CORRECT" if ok else "NOT YET", flag, hint))
    rows += [(student, notebook, re.match(r"code cell \d+", line).group(), "PROBLEM", "", line) for line in cells]
    if not found:
        rows.append((student, notebook, "", "NOT YET", "no check cells", "no check cells found"))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\nEach")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The notebooks are never modified: they are run in memory.")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="exercise notebooks to grade (default: the five in notebooks/exercises/)")
    parser.add_argument("--budget", type=int, default=BUDGET,
                        help=f"seconds one notebook may run, all its cells together; the cell running when they run "
                             f"out is interrupted and the cells after it are not run (default {BUDGET}: four times "
                             f"the slowest solution notebook, so a class of 30 with a loop that never ends in each "
                             f"notebook costs one budget a notebook)")
    parser.add_argument("--class", dest="klass", type=Path, metavar="DIR",
                        help="a whole class: DIR holds one folder per student (named by the student) with the "
                             "student's notebooks under any names; every block is titled student/notebook and "
                             "a gradebook CSV is written (--gradebook)")
    parser.add_argument("--seed", type=int,
                        help="the seed of the checks' inputs, to grade again on the inputs of an earlier run "
                             "(printed at the end of every run and in the gradebook); by default drawn afresh "
                             "from os.urandom, so no notebook can know the inputs in advance")
    parser.add_argument("--gradebook", type=Path,
                        help="with --class: the CSV file written, one row per check (student, notebook, exercise, "
                             "verdict, flag, hint, seed) and per problem of the other cells (default DIR/gradebook.csv)")
    args = parser.parse_args(argv)
    seed = draw_seed() if args.seed is None else args.seed
    if args.budget < 1:
        parser.error(f"--budget must be at least 1 second, got {args.budget}")
    if not 0 <= seed < 2 ** 62:
        parser.error(f"--seed must be in 0 .. 2**62 - 1, got {seed}")
    if args.klass is not None:
        if args.notebooks:
            parser.error("give either notebooks or --class DIR, not both")
        if not args.klass.is_dir():
            parser.error(f"--class {args.klass}: not a folder")
        if args.gradebook is not None and args.gradebook.is_dir():
            parser.error(f"--gradebook {args.gradebook}: a folder, not a file")
        return grade_class(args.klass, args.budget, args.gradebook or args.klass / "gradebook.csv", seed)
    if args.gradebook is not None:
        parser.error("--gradebook goes with --class DIR")
    paths = args.notebooks or sorted(HERE.glob("0*.ipynb"))
    for path in paths:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path}: not a notebook file (expected an existing .ipynb)")
    bad = total = broken = 0
    for path in paths:
        found, cells, _, _ = _grade(path, args.budget, seed)
        bad += sum(not ok for _, ok, _ in found) or not found
        total += max(len(found), 1)
        broken += len(cells)
    print(_drawn(seed))
    print(f"{total - bad} of {total} checks correct in {len(paths)} notebook(s)"
          + (f"; {broken} other cell(s) raised an error or timed out" if broken else "")
          + ("" if bad or broken else ": all done"))
    return 1 if bad or broken else 0


def _drawn(seed):
    """The line that says which inputs the checks were given, so a grading can be repeated."""
    return f"the checks' inputs were drawn with seed {seed} (grade.py --seed {seed} ... draws them again)"


def _grade(path, budget, seed, title=None, log=None):
    """Grade one notebook and print its block (``report``); (found, problems, why it cannot be read or None,
    the scan's findings). A notebook the scan flags (scan.flags) is not run: each of its checks is FLAGGED,
    never CORRECT, and a lecturer reads the lines the scan names."""
    try:
        nb = read(path)
        flagged = scan.flags(nb, kind_of(nb))
        if not flagged:
            nb = run_copy(path, budget, seed)
    except Unreadable as why:
        # when: a file cut short, or JSON that is not a notebook
        line = H(f"cannot be read as a notebook ({why}); open it in Jupyter and save it again")
        print(f"{title or path.name}: {line}")
        return [], [], line, []
    if flagged:
        found = [(TITLES[_call_of(src)[0]], False, []) for src in NOTEBOOKS.get(kind_of(nb), ())]
        cells, stderr = [], ""
    else:
        found, cells, stderr = results(nb), problems(nb), nb.metadata["otb_grading"].get("stderr", "")
    report(path, found, cells=cells, stderr=stderr, title=title, log=log, flagged=flagged)
    return found, cells, None, flagged


def grade_class(folder, budget, gradebook, seed):
    """Grade every student's notebooks in ``folder`` (``students``), each block titled student/notebook,
    each student's full texts in a folder of their own under LOGS, every check on inputs drawn from the one
    ``seed``; write the gradebook CSV (the seed in its last column); 0 if every
    check of every student is CORRECT and nothing else went wrong, else 1."""
    import csv
    classes, loose = students(folder)
    rows, bad = [], 0
    for path in loose:
        # when: a notebook lying in the class folder itself, which names no student
        line = H("not in a student's folder, so not graded: put it in a folder named by its student")
        print(f"{path.name}: {line}")
        rows.append(("", path.name, "", "NOT YET", "no student", line))
        bad += 1
    for student, paths in classes:
        if not paths:
            # when: a student's folder with no notebook in it
            line = H("no notebook (.ipynb) found in this student's folder")
            print(f"{student}: {line}")
            rows.append((student, "", "", "NOT YET", "no notebook", line))
            bad += 1
        for path in paths:
            name = path.relative_to(folder / student).as_posix()
            found, cells, unreadable, flagged = _grade(path, budget, seed, title=f"{student}/{name}",
                                                       log=LOGS / student / Path(name).with_suffix(".txt"))
            if unreadable:
                rows.append((student, name, "", "NOT YET", "unreadable", unreadable))
                bad += 1
                continue
            mine = _rows(student, name, found, cells, flagged)
            rows += mine
            bad += sum(row[3] != "CORRECT" for row in mine)
    gradebook.parent.mkdir(parents=True, exist_ok=True)
    with open(gradebook, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(GRADEBOOK)
        writer.writerows(row + (seed,) for row in rows)
    checks = [row for row in rows if row[3] != "PROBLEM"]
    print(_drawn(seed))
    print(f"{sum(row[3] == 'CORRECT' for row in checks)} of {len(checks)} checks correct for {len(classes)} "
          f"student(s); the gradebook is {gradebook}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
