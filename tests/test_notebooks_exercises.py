"""The classroom exercises: grading never touches a notebook, and every check names the slip it sees.

Four kinds of test:
1. build.py: the committed blanks are what it makes from the committed solutions, the blanks hide
   every answer, it refuses to overwrite a blank someone filled in (a backup when forced), and every
   exercise cell is followed by a graded check;
2. running the notebooks that build.py makes (never the ones in a student's folder): every solution
   check prints CORRECT, every blank runs top to bottom and fails its checks with a hint, and
   grade.py grades a filled-in notebook without changing a byte of it, titles every verdict by its
   exercise, and reports a cell that never ends and a file that is not a notebook in one line each;
3. every notebook, copied out of the project, stops at its first cell with a one-line message;
4. the checks: plain right answers pass, the reference (and the loops of tests/naive.py and the
   benchmarks) passes only when calling it is allowed, and the values a check prints are the same on
   every run (each usual slip and the hint that names it: tests/test_notebooks_teaching_slips.py, over
   the catalogue in solutions/slips.py).
"""
import ast
import contextlib
import functools
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "notebooks" / "exercises"
sys.path.insert(0, str(EXERCISES))
sys.path.insert(0, str(EXERCISES / "solutions"))

import build  # noqa: E402
import check  # noqa: E402
import grade  # noqa: E402
import otb  # noqa: E402
import slips  # noqa: E402

NAMES = sorted(p.name for p in (EXERCISES / "solutions").glob("*.ipynb"))
TUTORIALS = ["01_toy_bandit.ipynb", "02_training_comparison.ipynb", "03_saved_results.ipynb"]


def _built(name):
    """(solution, blank) notebooks as build.py makes them from the solution in the repository."""
    sol = build.clean(nbformat.read(str(EXERCISES / "solutions" / name), as_version=4))
    return sol, build.make_blank(sol)


def _exercise(title):
    """'3e' from 'Exercise 3e (your OTB trains the model)'."""
    return re.match(r"Exercise (\w+)", title).group(1)


def _headings(nb):
    """The exercises of a notebook that a check grades: its headings '## 1a. ...', '## 3d. ...', except a
    part answered in words only (a written question such as 4d)."""
    parts, current = {}, None
    for cell in nb.cells:
        if cell.cell_type == "code":
            if current:
                parts[current].append("code")
            continue
        for line in cell.source.splitlines():
            if line.startswith("## "):
                heading = re.match(r"## (\d[a-z])\.", line)
                current = heading.group(1) if heading else None
                if current:
                    parts[current] = []
            elif current and "<!-- BEGIN SOLUTION -->" in line:
                parts[current].append("words")
    return {k for k, kinds in parts.items() if "code" in kinds or "words" not in kinds}


def _git_show(path):
    out = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


# =====================================================================================
# 1. build.py
# =====================================================================================

def test_five_exercises_in_order():
    assert [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_"]


def test_committed_blanks_are_built_from_the_committed_solutions():
    """Compares what git holds (a fresh clone's files), never the working copies a student edits."""
    if _git_show("notebooks/exercises/build.py") is None:
        pytest.skip("not a git checkout: nothing committed to compare")
    stale = []
    for name in NAMES:
        sol = _git_show(f"notebooks/exercises/solutions/{name}")
        blank = _git_show(f"notebooks/exercises/{name}")
        want = build._dumps(build.make_blank(build.clean(nbformat.reads(sol, as_version=4))))
        stale += [] if blank == want else [name]
    assert not stale, (f"the committed blanks {stale} differ from what build.py makes from the committed "
                       f"solutions: a maintainer runs `python notebooks/exercises/build.py` and commits")


@pytest.mark.parametrize("name", NAMES)
def test_blanks_hide_every_solution_and_are_marked(name):
    sol, blank = _built(name)
    text = "\n".join(c.source for c in blank.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "TODO(student)" in text
    solution_text = "\n".join(c.source for c in sol.cells)
    assert solution_text.count("### BEGIN SOLUTION") == text.count("TODO(student): fill in the lines above")
    assert blank.metadata["otb_exercise"]["built"] == build.fingerprint(blank)


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_cell_has_a_graded_check_after_it(name):
    """A cell with a blank is followed, before the next blank, by a cell tagged `check` (what grade.py
    grades); every cell that calls a check is tagged; every exercise heading gets a graded verdict."""
    cells = [c for c in _built(name)[1].cells if c.cell_type == "code"]
    graded = [c for c in cells if "check" in c.metadata.get("tags", [])]
    calls = [c for c in cells if re.search(r"\bcheck\.ex\w+\(", c.source)]
    assert calls == graded, [c.source for c in calls if c not in graded] or [c.source for c in graded]
    blanks = [k for k, c in enumerate(cells) if "TODO(student): fill in the lines above" in c.source]
    assert blanks
    for k, end in zip(blanks, blanks[1:] + [len(cells)]):
        assert any(c in graded for c in cells[k + 1:end]), f"no graded check after the blank of {cells[k].source[:80]}"
    titles = {_exercise(check.TITLES[grade._call_of(c.source)[0]]) for c in graded}
    assert titles == _headings(_built(name)[0]), titles


def test_every_check_in_check_py_is_graded_in_a_notebook():
    """check.TITLES names every check function of check.py, and each is called from a graded cell."""
    defined = {n for n in dir(check) if re.match(r"ex\d[a-z]_", n) and callable(getattr(check, n))}
    called = {m for name in NAMES for c in _built(name)[1].cells if "check" in c.metadata.get("tags", [])
              for m in re.findall(r"\bcheck\.(ex\w+)\(", c.source)}
    assert defined == set(check.TITLES) == called, (defined, called)


def test_the_graders_check_cells_are_the_notebooks():
    """check.NOTEBOOKS (what grade.py runs) holds each built notebook's check cells, in order, and grade.py
    recognises each notebook by its content."""
    assert list(check.NOTEBOOKS) == [Path(n).stem for n in NAMES]
    for name in NAMES:
        for nb in _built(name):
            assert [c.source for c in nb.cells if "check" in c.metadata.get("tags", [])] == \
                check.NOTEBOOKS[Path(name).stem]
            assert grade.kind_of(nb) == Path(name).stem


def test_builder_replaces_blocks_and_keeps_indentation():
    src = "def f(x):\n    # TODO(student): double it\n    ### BEGIN SOLUTION\n    y = 2 * x\n    return y\n" \
          "    ### END SOLUTION\n\nz = 1\n### BEGIN SOLUTION (blank: answer = None)\nanswer = 42\n### END SOLUTION"
    assert build.blank_code(src) == ("def f(x):\n    # TODO(student): double it\n"
                                     "    return None  # TODO(student): fill in the lines above\n\nz = 1\n"
                                     "answer = None  # TODO(student): fill in the lines above")
    with pytest.raises(ValueError):
        build.blank_code("### BEGIN SOLUTION\nx = 1\n")


@pytest.fixture
def exercise_copy(tmp_path):
    """A copy of notebooks/exercises/ (solutions and freshly built blanks) to run build.py on."""
    (tmp_path / "solutions").mkdir()
    for name in NAMES:
        sol, blank = _built(name)
        (tmp_path / "solutions" / name).write_text(build._dumps(sol))
        (tmp_path / name).write_text(build._dumps(blank))
    return tmp_path


def _fill(path, answer="    return 42  # my answer"):
    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if "TODO(student): fill in the lines above" in c.source)
    cell.source = cell.source.replace("    return None  # TODO(student): fill in the lines above", answer)
    nbformat.write(nb, str(path))


def test_build_refuses_to_overwrite_a_filled_blank_and_keeps_a_backup_when_forced(exercise_copy, capsys):
    name = NAMES[0]
    sol_path, blank_path = exercise_copy / "solutions" / name, exercise_copy / name
    sol = nbformat.read(str(sol_path), as_version=4)
    sol.cells[0].source += "\n\nA sentence the teacher added."  # the blank is now out of date ...
    nbformat.write(sol, str(sol_path))
    _fill(blank_path)  # ... and a student has filled it in
    filled = blank_path.read_bytes()
    assert build.main([], folder=exercise_copy) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert blank_path.read_bytes() == filled and not (exercise_copy / "backups").exists()
    assert build.main(["--force"], folder=exercise_copy) == 0
    backups = list((exercise_copy / "backups").glob("*.ipynb"))
    assert len(backups) == 1 and backups[0].read_bytes() == filled
    assert "A sentence the teacher added." in blank_path.read_text()
    assert build.main(["--check"], folder=exercise_copy) == 0


def test_build_rewrites_an_untouched_blank_after_a_solution_edit(exercise_copy):
    name = NAMES[1]
    sol = nbformat.read(str(exercise_copy / "solutions" / name), as_version=4)
    sol.cells[0].source += "\n\nAnother sentence."
    nbformat.write(sol, str(exercise_copy / "solutions" / name))
    assert build.main(["--check"], folder=exercise_copy) == 1
    assert build.main([], folder=exercise_copy) == 0  # nobody edited the blank: no refusal, no backup
    assert "Another sentence." in (exercise_copy / name).read_text()
    assert not (exercise_copy / "backups").exists()


# =====================================================================================
# 2. Running the notebooks build.py makes, and grading
# =====================================================================================

@pytest.fixture
def no_ipywidgets(tmp_path, monkeypatch):
    """Kernels started by the test see no ipywidgets (as on a machine without it): tqdm.auto then warns
    "IProgress not found" if a bar is made or tqdm.notebook imported."""
    fake = tmp_path / "no_ipywidgets"
    (fake / "ipywidgets").mkdir(parents=True)
    (fake / "ipywidgets" / "__init__.py").write_text("raise ImportError('no ipywidgets here (a test)')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("name", NAMES)
def test_solution_notebook_passes_every_check(name, no_ipywidgets):
    """Every exercise of the notebook gets a verdict titled by it (3e included), all CORRECT, and nothing
    prints a warning (3e runs train.py, whose bars are tqdm.auto's)."""
    nb = grade.run_copy(EXERCISES / "solutions" / name, budget=240)
    found = grade.results(nb)
    assert len(found) >= 2, "each exercise has at least two checks"
    assert all(ok for _, ok, _ in found), found
    assert [_exercise(t) for t, _, _ in found] == sorted(_headings(nb)), found
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    warned = [line for line in printed.splitlines() if "IProgress" in line or "Warning" in line]
    assert not warned, warned


@pytest.mark.skipif(not os.environ.get("OTB_GRADE_SOAK"),
                    reason="slow (about a minute a round): OTB_GRADE_SOAK=20 grades the five solution notebooks 20 times")
def test_the_solution_notebooks_graded_again_and_again_lose_no_verdict(no_ipywidgets):
    """Graded OTB_GRADE_SOAK times in a row, every check of the five solution notebooks is CORRECT every time
    (a verdict line the kernel splits across stream messages is still read); prints how many of the
    grader's lines came split, which the reader of a single message would have lost."""
    rounds, graded, split, lost = int(os.environ["OTB_GRADE_SOAK"]), 0, 0, []
    for r in range(rounds):
        for name in NAMES:
            nb = grade.run_copy(EXERCISES / "solutions" / name, budget=240)
            token = nb.metadata["otb_grading"]["token"]
            for cell in (c for c in nb.cells if "otb_check" in c.get("metadata", {})):
                split += not any(token + " {" in o.get("text", "") and o["text"].rstrip().endswith("}")
                                 for o in cell.outputs if o.get("name") == "stdout")
            found = grade.results(nb)
            graded += len(found)
            lost += [(r, name, title, detail) for title, ok, detail in found if not ok]
    print(f"\n{rounds} round(s): {graded} verdicts, {len(lost)} lost, {split} grader line(s) split across messages")
    assert graded == rounds * sum(len(cells) for cells in check.NOTEBOOKS.values()) and not lost, lost


def _solution_namespace(name, monkeypatch):
    """The names a solution notebook defines, its code cells but the check cells run in this process (in
    the notebook's folder, as a kernel runs them)."""
    monkeypatch.chdir(EXERCISES / "solutions")
    checks = {c.strip() for c in check.NOTEBOOKS[Path(name).stem]}
    space = {}
    for cell in nbformat.read(EXERCISES / "solutions" / name, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.strip() not in checks:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(cell.source, name, "exec"), space)
    return space


@pytest.mark.parametrize("name", NAMES)
def test_the_solutions_pass_every_check_at_many_drawn_seeds(name, monkeypatch, tmp_path):
    """Graded for marks as grade.py grades (the check recorded at a drawn seed with the solution's functions,
    then replayed on the saved results), every check of a solution notebook is CORRECT at each of 25 drawn
    seeds (3e, which trains, at 2): no draw of the inputs may cost a right answer its verdict, through a
    tolerance tighter than the taught formula's float32 rounding or a slip recognised where the slip and
    the right answer give the same values. Each failure names its seed."""
    space, built, lost = _solution_namespace(name, monkeypatch), {}, []
    for source in check.NOTEBOOKS[Path(name).stem]:
        fn, _, _ = grade._call_of(source)
        call = ast.parse(source).body[0].value
        args = [space[a.id] for a in call.args]
        kwargs = {k.arg: space[k.value.id] for k in call.keywords}
        stand_ins = [check.argument(a.id, built) for a in call.args]
        kw_stand_ins = {k.arg: check.argument(k.value.id, built) for k in call.keywords}
        for _ in range(2 if fn == "ex3e_trains" else 25):
            seed, tape = grade.draw_seed(), tmp_path / "tape.pt"
            with contextlib.redirect_stdout(io.StringIO()):
                check.record(getattr(check, fn), seed, tape, *args, **kwargs)
            ok, out = check.replay(fn, seed, tape.read_bytes(), *stand_ins, **kw_stand_ins)
            lost += [] if ok else [(fn, seed, out)]
    assert not lost, lost


@pytest.mark.parametrize("name", NAMES)
def test_blank_notebook_runs_and_fails_its_checks_helpfully(tmp_path, name):
    path = tmp_path / name  # outside the project: grade.py finds it through OTB_ROOT
    path.write_text(build._dumps(_built(name)[1]))
    nb = grade.run_copy(path, budget=240)
    errors = [grade._error(c) for c in nb.cells if c.cell_type == "code" and grade._error(c)]
    assert not errors, errors  # a blank runs top to bottom
    found = grade.results(nb)
    assert found and not any(ok for _, ok, _ in found)
    first = "\n".join(found[0][2])
    assert "problem:" in first and "hint:" in first and "TODO(student)" in first, first


def test_grading_a_filled_notebook_reports_each_exercise_and_changes_no_byte(tmp_path, capsys):
    """The lecturer's scenario: 1a right, 1b without its clamp; exercise 2 all right."""
    ex1 = _built(NAMES[0])[0]
    cell = next(c for c in ex1.cells if "def token_energy" in c.source)
    cell.source = cell.source.replace(".clamp(0.0, 2.0)", "")
    (tmp_path / "mine_01.ipynb").write_text(build._dumps(ex1))
    (tmp_path / "mine_02.ipynb").write_text(build._dumps(_built(NAMES[1])[0]))
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    assert grade.main([str(tmp_path / "mine_01.ipynb"), str(tmp_path / "mine_02.ipynb")]) == 1
    out = capsys.readouterr().out
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written, nothing added
    assert "CORRECT   Exercise 1a" in out and "NOT YET   Exercise 1b" in out and "clamp" in out
    assert "CORRECT   Exercise 2c" in out and "4 of 5 checks correct" in out
    assert grade.main([str(tmp_path / "mine_02.ipynb")]) == 0
    with pytest.raises(SystemExit) as e:
        grade.main([str(tmp_path / "missing.ipynb")])
    assert e.value.code == 2


def test_grading_reports_a_cell_that_raises(tmp_path, capsys):
    """The check after a syntax error is titled by its exercise, and the cell is named by its number among
    the code cells (as a student counts them) and its first line."""
    nb = _built(NAMES[0])[1]
    cell = next(c for c in nb.cells if "def sum_pi_squared" in c.source)
    cell.source = cell.source.replace("return None  # TODO", "return (  # a syntax error\n    # TODO")
    (tmp_path / "broken.ipynb").write_text(build._dumps(nb))
    assert grade.main([str(tmp_path / "broken.ipynb")]) == 1
    out = capsys.readouterr().out
    number = [c for c in nb.cells if c.cell_type == "code"].index(cell) + 1
    assert f"NOT YET   {check.TITLES['ex1a_sum_pi_squared']}\n" in out, out
    assert f"code cell {number} (`def sum_pi_squared(logits):`) raised SyntaxError" in out, out
    assert "this check cell raised NameError" in out and "`ok_1a" not in out


def test_one_loop_that_never_ends_costs_one_budget_and_a_file_that_is_not_a_notebook_is_one_line(
        tmp_path, capsys):
    """The cell running when the notebook's budget runs out is interrupted and reported on its exercise's
    line; the cells after it are not run (a second call of the looping function costs nothing), so their
    checks "did not run". A file that is not a notebook is one line, and the notebook after it is still
    graded; nbclient's log and the kernel's stderr (an interrupt's traceback) stay off the terminal."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
    loop = new_notebook(cells=[
        new_markdown_cell("## 1a. stand-in"),
        new_code_cell("import torch"),
        new_code_cell("def sum_pi_squared(logits):\n    while True:  # a loop that never ends\n        pass"),
        new_code_cell("ok_1a = check.ex1a_sum_pi_squared(sum_pi_squared)", metadata={"tags": ["check"]}),
        new_code_cell("def token_energy(log_probs, sum_pi_sq):\n    return (1 - 2 * log_probs.exp() + sum_pi_sq).clamp(0, 2)"),
        new_code_cell("sum_pi_squared(torch.zeros(3))  # the loop again"),
        new_code_cell("ok_1b = check.ex1b_token_energy(token_energy)", metadata={"tags": ["check"]})])
    (tmp_path / "b_loop.ipynb").write_text(nbformat.writes(loop))
    (tmp_path / "a_cut.ipynb").write_text('{"cells": [{"cell_type": "code", "sou')  # a copy cut short
    (tmp_path / "a_list.ipynb").write_text("[1, 2]")  # JSON, but not a notebook
    paths = [str(tmp_path / n) for n in ("a_cut.ipynb", "a_list.ipynb", "b_loop.ipynb")]
    start = time.monotonic()
    assert grade.main(paths + ["--budget", "15"]) == 1
    assert time.monotonic() - start < 2 * 15  # one budget, not one for each cell that calls the loop
    out, err = capsys.readouterr()
    lines = out.splitlines()
    for name, why in (("a_cut.ipynb", "not valid JSON"), ("a_list.ipynb", "not a Jupyter notebook")):
        mine = [line for line in lines if name in line]
        assert len(mine) == 1 and why in mine[0] and "cannot be read" in mine[0], lines
    k = lines.index("b_loop.ipynb")
    assert lines[k:k + 4] == ["b_loop.ipynb",
                              f"  NOT YET   {check.TITLES['ex1a_sum_pi_squared']}: the notebook's time budget of 15 s "
                              f"ran out in this cell (a loop that never ends?)",
                              f"  NOT YET   {check.TITLES['ex1b_token_energy']}",
                              "            this check cell did not run: the notebook's time budget ran out in an "
                              "earlier cell"], lines
    assert lines[-1] == "0 of 4 checks correct in 3 notebook(s)"
    assert "Traceback" not in err and "Timeout" not in err and "Interrupt" not in err, err
    assert grade.BUDGET <= 60  # the default: a class of 30 with one such loop each waits minutes, not hours


def test_a_kernel_that_dies_leaves_the_checks_after_it_not_run(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook
    nb = new_notebook(cells=[
        new_code_cell("import torch"),
        new_code_cell("def sum_pi_squared(logits):\n    return logits.float().softmax(-1).pow(2).sum(-1)"),
        new_code_cell("import os\nos._exit(1)  # the kernel dies"),
        new_code_cell("ok_1a = check.ex1a_sum_pi_squared(sum_pi_squared)")])
    (tmp_path / "dies.ipynb").write_text(nbformat.writes(nb))
    found = grade.results(grade.run_copy(tmp_path / "dies.ipynb", budget=60))
    assert not found[0][1] and found[0][2][0].startswith("this check cell did not run: the run stopped (DeadKernel")


def test_a_cell_that_raises_or_times_out_is_reported_even_when_every_check_passes(tmp_path, capsys):
    """A top-level loop after a right answer, or an error in a cell of its own, is a PROBLEM line and the
    notebook is not 'all done' (exit status 1), though both checks are CORRECT."""
    nb = _built(NAMES[0])[0]
    nb.cells.append(nbformat.v4.new_code_cell("while True:  # a top-level loop after the answers\n    pass"))
    nb.cells.insert(1, nbformat.v4.new_code_cell("1 / 0"))
    (tmp_path / "mine.ipynb").write_text(build._dumps(nb))
    assert grade.main([str(tmp_path / "mine.ipynb"), "--budget", "40"]) == 1
    out = capsys.readouterr().out
    number = len([c for c in nb.cells if c.cell_type == "code"])
    assert "  PROBLEM   code cell 1 (`1 / 0`) raised ZeroDivisionError: division by zero" in out, out
    assert f"  PROBLEM   code cell {number} (`while True:  # a top-level loop after the answers`): the notebook's " \
           f"time budget of 40 s ran out in this cell" in out, out
    assert "CORRECT   Exercise 1a" in out and "CORRECT   Exercise 1b" in out, out
    assert out.splitlines()[-1] == "2 of 2 checks correct in 1 notebook(s); 2 other cell(s) raised an error or timed out"


def test_no_printed_line_is_longer_than_the_width_and_the_full_text_is_in_a_file(tmp_path):
    """A problem of any length is cut to grade.WIDTH characters, naming the file that holds it whole."""
    import io
    out, log = io.StringIO(), tmp_path / "full.txt"
    long = "problem: " + "x" * 25_000
    bad = grade.report("mine.ipynb", [("Exercise 3e (title)", False, [long, "hint:    short"])], out=out,
                       cells=["code cell 2 (`f()`) raised ValueError: " + "y" * 1000], log=log, stderr="Traceback ...")
    lines = out.getvalue().splitlines()
    assert bad == 2 and max(map(len, lines)) <= grade.WIDTH, [len(line) for line in lines]
    assert f"the full text is in {log}" in lines[1] and lines[-1] == "            hint:    short", lines
    assert long in log.read_text() and "Traceback ..." in log.read_text()


def test_a_class_is_graded_student_by_student_into_a_gradebook(tmp_path, capsys, monkeypatch):
    """grade.py --class DIR: three students hand in notebooks of the same name (and one a second notebook
    that cannot be read); every block is titled student/notebook, each student's full texts are in a file
    of their own, and the gradebook CSV holds one row per check with its verdict, flag and hint, and one
    per problem of the other cells."""
    import csv
    monkeypatch.setattr(grade, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(grade, "WIDTH", 120)  # the hints are cut, so each student's full texts are written
    right = _built(NAMES[0])[0]
    slip = _built(NAMES[0])[0]
    cell = next(c for c in slip.cells if "def token_energy" in c.source)
    cell.source = cell.source.replace(".clamp(0.0, 2.0)", "")
    moved = _built(NAMES[0])[0]
    moved.cells = [c for c in moved.cells if "check.ex1a_" not in c.source]
    moved.cells.insert(1, nbformat.v4.new_code_cell("1 / 0"))
    klass = tmp_path / "class"
    for student, nb in (("ada", right), ("bo", slip), ("cy", moved)):
        (klass / student).mkdir(parents=True)
        (klass / student / "01_sum_pi_squared.ipynb").write_text(build._dumps(nb))
    (klass / "cy" / "old.ipynb").write_text('{"cells": [')
    (klass / "cy" / ".ipynb_checkpoints").mkdir()
    (klass / "cy" / ".ipynb_checkpoints" / "01_sum_pi_squared-checkpoint.ipynb").write_text("{}")
    (klass / "dee").mkdir()  # a student who handed in nothing
    (klass / "loose.ipynb").write_text("{}")  # a notebook that names no student
    assert grade.main(["--class", str(klass)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    titles = [line for line in lines if not line.startswith(" ")]
    assert titles[0].startswith("loose.ipynb: not in a student's folder, so not graded"), lines
    assert titles[1:4] == ["ada/01_sum_pi_squared.ipynb", "bo/01_sum_pi_squared.ipynb",
                           "cy/01_sum_pi_squared.ipynb"], lines
    assert titles[4].startswith("cy/old.ipynb: cannot be read as a notebook"), lines
    assert titles[5] == "dee: no notebook (.ipynb) found in this student's folder", lines
    assert lines[-1] == f"4 of 9 checks correct for 4 student(s); the gradebook is {klass / 'gradebook.csv'}"
    with open(klass / "gradebook.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(grade.GRADEBOOK)
    got = [(r[0], r[1], r[2][:12], r[3], r[4]) for r in rows[1:]]
    assert got == [("", "loose.ipynb", "", "NOT YET", "no student"),
                   ("ada", "01_sum_pi_squared.ipynb", "Exercise 1a ", "CORRECT", ""),
                   ("ada", "01_sum_pi_squared.ipynb", "Exercise 1b ", "CORRECT", ""),
                   ("bo", "01_sum_pi_squared.ipynb", "Exercise 1a ", "CORRECT", ""),
                   ("bo", "01_sum_pi_squared.ipynb", "Exercise 1b ", "NOT YET", ""),
                   ("cy", "01_sum_pi_squared.ipynb", "Exercise 1a ", "NOT YET", "check cell missing"),
                   ("cy", "01_sum_pi_squared.ipynb", "Exercise 1b ", "CORRECT", ""),
                   ("cy", "01_sum_pi_squared.ipynb", "code cell 1", "PROBLEM", ""),
                   ("cy", "old.ipynb", "", "NOT YET", "unreadable"),
                   ("dee", "", "", "NOT YET", "no notebook")], got
    assert rows[2][2] == check.TITLES["ex1a_sum_pi_squared"] and rows[2][5] == ""
    assert rows[5][5].startswith("problem: ") and " | hint: " in rows[5][5] and "clamp" in rows[5][5]
    assert len(rows[5][5]) > 120  # the hint in full, not cut at the screen's width
    assert rows[8][5].startswith("code cell 1 (`1 / 0`) raised ZeroDivisionError")
    logs = {p.relative_to(tmp_path / "logs").as_posix(): p.read_text() for p in (tmp_path / "logs").rglob("*.txt")}
    assert set(logs) == {"bo/01_sum_pi_squared.txt", "cy/01_sum_pi_squared.txt"}, set(logs)
    assert "clamp" in logs["bo/01_sum_pi_squared.txt"] and "clamp" not in logs["cy/01_sum_pi_squared.txt"]
    assert "its check cell is missing" in logs["cy/01_sum_pi_squared.txt"]
    with pytest.raises(SystemExit):
        grade.main(["--class", str(klass), str(klass / "ada" / "01_sum_pi_squared.ipynb")])  # one or the other


# Each way of forging a pass, as the cell a student adds below the answers of notebook 01, and the words
# of the reason the scan gives.
FORGES = {
    "torch.Tensor.any patched": ("torch.Tensor.any = lambda self, *a: torch.tensor(True)",
                                 "assigns to torch.Tensor.any, an attribute of the imported torch"),
    "setattr on torch": ("setattr(torch.Tensor, 'any', lambda self: True)", "uses setattr"),
    "functools.partial around otb": ("import functools\nsum_pi_squared = functools.partial(otb.sum_pi_squared)",
                                     "uses otb.sum_pi_squared, which this notebook's exercises do not hand out"),
    "an object around otb": ("class Answer:\n    def __call__(self, z):\n        return otb.sum_pi_squared(z)\n"
                             "sum_pi_squared = Answer()", "uses otb.sum_pi_squared"),
    "otb imported under another name": ("from otb import sum_pi_squared as mine", "imports otb.sum_pi_squared"),
    "builtins.print replaced": ("import builtins\nbuiltins.print = lambda *a, **k: None", "imports builtins"),
    "the notebook's print replaced": ("print = lambda *a, **k: None", "rebinds print"),
    "sys.stdout wrapped": ("import io\nsys.stdout = io.StringIO()", "assigns to sys.stdout"),
    "json.dumps patched": ("import json\njson.dumps = lambda *a, **k: '{}'", "assigns to json.dumps"),
    "importlib.util patched": ("import importlib.util\nimportlib.util.module_from_spec = None", "imports importlib"),
    "the grader's frame read": ("def token_energy(log_probs, sum_pi_sq):\n    f = sys._getframe(1)\n"
                                "    return f.f_back.f_locals['want']", "uses ._getframe, which reads frames"),
    "inspect for frames": ("import inspect\nwant = inspect.currentframe()", "imports inspect"),
    "IPython's In": ("token = In[-1]", "uses In, which reads IPython's history"),
    "IPython's shell": ("get_ipython().run_line_magic('who', '')", "uses get_ipython"),
    "code behind a magic": ("%time torch.Tensor.any = None", "uses get_ipython"),
    "the profile switched off": ("def token_energy(log_probs, sum_pi_sq):\n    sys.setprofile(None)\n"
                                 "    return otb.token_energy(log_probs, sum_pi_sq)", "uses .setprofile"),
    "a thread": ("import threading\nthreading.Thread(target=print).start()", "imports threading"),
    "exec": ("exec('torch.Tensor.any = None')", "uses exec"),
    "an exit": ("sys.exit(0)", "uses sys.exit, which exits"),
    "os._exit": ("os._exit(0)", "uses ._exit"),
    "SystemExit": ("raise SystemExit", "raises SystemExit"),
    "check.py rewritten": ("open(os.path.join(os.environ['OTB_ROOT'], 'notebooks/exercises/check.py'), 'w')",
                           "opens a file for writing"),
    "a file written": ("from pathlib import Path\nPath('check.py').write_text('')", "uses .write_text"),
    "a program run": ("import subprocess\nsubprocess.run(['true'])", "imports subprocess"),
    "an imported class patched": ("from torch import Tensor\nTensor.allclose = lambda *a, **k: True",
                                   "assigns to Tensor.allclose, an attribute of the imported Tensor"),
    "check's internals": ("def sum_pi_squared(logits):\n    return check._like(logits, logits)",
                          "uses check._like"),
}


def _copy_of(name):
    """otb.py's function ``name`` as a student copies it: every name and argument changed (x0, x1, ...), its
    docstring left out, a comment added, under the answer's own name."""
    import ast
    tree = next(n for n in ast.parse((ROOT / "otb.py").read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    names = {}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = names.setdefault(node.id, f"x{len(names)}") if node.id != "torch" else node.id
            return node

        def visit_arg(self, node):
            node.arg = names.setdefault(node.arg, f"x{len(names)}")
            return node
    tree = Rename().visit(tree)
    tree.body = tree.body[1:]  # the docstring
    return "# my own answer\n" + ast.unparse(tree)


def _scanned(*sources, kind=None):
    nb = _built(NAMES[0])[0]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in sources]
    return grade.scan.flags(nb, kind or Path(NAMES[0]).stem)


@pytest.mark.parametrize("what", sorted(FORGES))
def test_the_scan_flags_every_forge_construct(what):
    source, why = FORGES[what]
    found = _scanned(source)
    assert found and any(why in reason for *_, reason in found), found
    number = len([c for c in _built(NAMES[0])[0].cells if c.cell_type == "code"]) + 1
    assert all(f[0] == number for f in found), found  # the cell added, and no other


@pytest.mark.parametrize("name", ["sum_pi_squared", "optimal_token_baseline", "rloo", "action_aligned_otb"])
def test_the_scan_flags_a_copy_of_otb_with_its_names_changed_and_its_docstring_left_out(name):
    """otb.py's functions with every name changed, a comment added and no docstring are still the same
    syntax tree; a short right answer written as otb.py would write it is not a copy."""
    found = _scanned(_copy_of(name))
    assert any(f"is a copy of otb.{name}" in why for *_, why in found), found
    short = "def token_energy(a, b):\n    return (1.0 - 2.0 * a.exp() + b).clamp(0.0, 2.0)"
    assert _scanned(short) == []


@pytest.mark.parametrize("name", NAMES)
def test_the_scan_flags_no_solution_no_blank_and_no_honest_variation(name):
    """The solutions and blanks as built and as committed, and honest edits: a demo cell changed (it calls
    otb.py at the top, as the handed-out cells do), numpy, a class of the student's own, print used."""
    kind = Path(name).stem
    for nb in (*_built(name), nbformat.read(str(EXERCISES / "solutions" / name), as_version=4),
               nbformat.read(str(EXERCISES / name), as_version=4)):
        assert grade.scan.flags(nb, kind) == [], name
    honest = ["print(otb.sum_pi_squared(torch.zeros(3, 4)), otb.token_energy(torch.zeros(2), torch.ones(2)))",
              "import numpy as np\nx = np.zeros(3)\nprint(x, file=sys.stderr)",
              "class Table:\n    def __init__(self):\n        self.rows = {}\n    def add(self, k, v):\n"
              "        self.rows[k] = v\n        return self",
              "def sum_pi_squared(logits):\n    p = logits.float().softmax(-1)\n    return (p * p).sum(-1)",
              "import math\nfrom functools import reduce\nresult = reduce(lambda a, b: a * b, [1, 2, 3])"]
    nb = _built(name)[0]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in honest]
    assert grade.scan.flags(nb, kind) == []


@functools.lru_cache(maxsize=1)
def _slip_functions():
    """{name: source} of the top-level functions of slips.py."""
    import ast
    lines = (EXERCISES / "solutions" / "slips.py").read_text().splitlines()
    return {n.name: "\n".join(lines[n.lineno - 1:n.end_lineno]) for n in ast.parse("\n".join(lines)).body
            if isinstance(n, ast.FunctionDef)}


def _slip_cells(slip):
    """The source of a slip's answer(s) as cells: the top-level function of slips.py that makes it, or, for a
    lambda written in the catalogue, the lambda bound to a name."""
    import ast
    import inspect
    tops = _slip_functions()
    cells = []
    for answer in slip.answer if isinstance(slip.answer, tuple) else (slip.answer,):
        top = answer.__qualname__.split(".")[0]
        if top in tops:
            cells.append(tops[top])
            continue
        text = inspect.getsource(answer)
        text = "f = " + text[text.index("lambda"):]
        while True:  # the lambda's own text ends where the shortest cut of the line parses
            try:
                ast.parse(text)
                break
            except SyntaxError:
                text = text[:-1]
        cells.append(text)
    return cells


def test_the_scan_flags_no_slip_but_those_that_call_code_the_exercise_does_not_hand_out():
    """Every slip of the catalogue, added to its solution notebook, is not flagged, except the three whose
    check says they call the project's code (the scan says so before anything runs)."""
    import copy
    solutions = {p.stem[:2]: (p.stem, _built(p.name)[0]) for p in EXERCISES.glob("0*.ipynb")}
    flagged = []
    for slip in slips.SLIPS:
        kind, nb = solutions["0" + slip.exercise[0]]
        nb = copy.deepcopy(nb)
        nb.cells += [nbformat.v4.new_code_cell(src) for src in _slip_cells(slip)]
        flagged += [slip.what for _ in grade.scan.flags(nb, kind)[:1]]
    assert flagged == ["calls the reference through train.py's table, otb.ESTIMATORS['otb']",
                       "calls toy_harness.measure", "calls otb.action_aligned_otb"], flagged
    assert len(slips.SLIPS) > 170


def test_a_flagged_notebook_is_not_run_and_never_correct(tmp_path, capsys):
    """A notebook of right answers with one forge is FLAGGED on every check with the line and the reason,
    exits 1 and is not run (its cell that writes a file never ran); in a class it is FLAGGED in the
    gradebook with the flag 'tampering' (or 'copy')."""
    import csv
    nb = _built(NAMES[0])[0]
    nb.cells.insert(1, nbformat.v4.new_code_cell(f"open({str(tmp_path / 'ran')!r}, 'w').close()"))
    nb.cells.append(nbformat.v4.new_code_cell(FORGES["torch.Tensor.any patched"][0]))
    (tmp_path / "class" / "eve").mkdir(parents=True)
    (tmp_path / "class" / "eve" / "mine.ipynb").write_text(build._dumps(nb))
    copy = _built(NAMES[0])[0]
    copy.cells.append(nbformat.v4.new_code_cell(_copy_of("sum_pi_squared")))
    (tmp_path / "class" / "fay").mkdir()
    (tmp_path / "class" / "fay" / "mine.ipynb").write_text(build._dumps(copy))
    assert grade.main([str(tmp_path / "class" / "eve" / "mine.ipynb")]) == 1
    out = capsys.readouterr().out.splitlines()
    number = len([c for c in nb.cells if c.cell_type == "code"])
    assert out[1].startswith("  FLAGGED   code cell 1, line 1 (`open(") and "opens a file for writing" in out[1], out
    assert out[2] == f"  FLAGGED   code cell {number}, line 1 (`torch.Tensor.any = lambda self, *a: torch.tensor(True)`): " \
                     f"assigns to torch.Tensor.any, an attribute of the imported torch", out
    assert out[3:5] == [f"  FLAGGED   {check.TITLES['ex1a_sum_pi_squared']}",
                        f"  FLAGGED   {check.TITLES['ex1b_token_energy']}"], out
    assert out[-1] == "0 of 2 checks correct in 1 notebook(s)" and not (tmp_path / "ran").exists()
    assert grade.main(["--class", str(tmp_path / "class")]) == 1
    with open(tmp_path / "class" / "gradebook.csv", newline="") as f:
        rows = [(r[0], r[3], r[4]) for r in csv.reader(f)][1:]
    assert rows == [("eve", "FLAGGED", "tampering")] * 2 + [("fay", "FLAGGED", "copy")] * 2, rows


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


@pytest.mark.parametrize("error", [None, "NameError: name 'sum_pi_squared' is not defined"])
def test_the_graders_line_split_anywhere_across_two_messages_is_read(error):
    """The kernel may deliver the grader's one printed line as two stream messages split at any character
    (the line is ASCII: json.dumps escapes the rest), with stderr between them: every split reads the
    same line (and an error in it is the check's line), and a line cut short (the kernel died while
    printing it) reads as no verdict, never a JSON error."""
    import json
    token = "0123456789abcdef"
    printed = "a line the notebook printed\n" + token + " " + json.dumps({"error": error}) + "\n"
    assert printed.isascii()
    for k in range(len(printed) + 1):
        for between in ([], [_stream("a warning\n", "stderr")]):
            cell = nbformat.v4.new_code_cell(outputs=[_stream(printed[:k])] + between + [_stream(printed[k:])])
            assert grade._line_of(cell, token) == {"error": error}, k
            if error:
                assert grade._verdict_of(cell, None, token) == (False, [f"this check cell raised {error}"]), k
    for k in range(printed.index(token), len(printed) - 2):  # cut inside the grader's line
        cell = nbformat.v4.new_code_cell(outputs=[_stream(printed[:k])])
        assert grade._verdict_of(cell, None, token) == (False, ["this check cell printed no verdict"]), k


def _cells(nb, text):
    """The index of the first cell whose source contains ``text``."""
    return next(k for k, c in enumerate(nb.cells) if text in c.source)


def test_the_grader_decides_not_the_notebook(tmp_path, capsys):
    """Only the grader's own runs of the check cells count (check.NOTEBOOKS, never the notebook's text): a
    check cell deleted, edited, forged (a line printing CORRECT) or moved above its answer is NOT YET with
    one line saying so, and never exit status 0; a patched check module does not count either. A check cell
    with a comment added or its spacing changed is unchanged. The files are named as no notebook is."""
    forged = _built(NAMES[0])[1]  # the blank: wrong answers
    forged.cells.insert(2, nbformat.v4.new_code_cell(
        "import check\ncheck.ex1b_token_energy = lambda f: print('Exercise 1b (the Logit-Gradient Proxy w_t): "
        "CORRECT.') or True"))
    forged.cells[_cells(forged, "check.ex1a_")].source = 'print("Exercise 1a (sum_k pi_k^2 from logits): CORRECT.")'
    moved = _built(NAMES[0])[0]  # the solution: right answers
    cell = moved.cells.pop(_cells(moved, "check.ex1a_"))
    moved.cells.insert(_cells(moved, "def sum_pi_squared"), cell)  # above its answer
    moved.cells[_cells(moved, "check.ex1b_")].source = "ok_1b = check.ex1b_token_energy(otb.token_energy)"
    deleted = _built(NAMES[1])[0]  # the solution, two check cells deleted, one with a comment and new spacing
    deleted.cells = [c for c in deleted.cells if not re.search(r"check\.ex2[bc]_", c.source)]
    deleted.cells[_cells(deleted, "check.ex2a_")].source = \
        "# my check\nok_2a = check.ex2a_sequence_scores( sequence_scores )  # as handed out"
    for name, nb in (("x.ipynb", forged), ("y.ipynb", moved), ("z.ipynb", deleted)):
        (tmp_path / name).write_text(build._dumps(nb))
    assert grade.main([str(tmp_path / n) for n in ("x.ipynb", "y.ipynb", "z.ipynb")]) == 1
    out = capsys.readouterr().out
    blocks = dict(zip(("x", "y", "z"), out.split(".ipynb\n")[1:]))
    assert "CORRECT   " not in blocks["x"] and "FLAGGED   Exercise 1a" in blocks["x"], out  # the scan: not run
    assert "assigns to check.ex1b_token_energy, an attribute of the imported check" in blocks["x"], out
    x = grade.results(grade.run_copy(tmp_path / "x.ipynb"))  # run all the same, the patch changes nothing
    assert not any(ok for _, ok, _ in x) and "its check cell is missing" in x[0][2][0], x
    assert "returned None" in "\n".join(x[1][2]), x  # 1b: the real check
    assert "NOT YET   Exercise 1a" in blocks["y"] and "comes before the cell that defines `sum_pi_squared`" in out
    assert "NOT YET   Exercise 1b" in blocks["y"] and "its check cell was edited" in blocks["y"], out
    assert "CORRECT   Exercise 2a" in blocks["z"] and blocks["z"].count("its check cell is missing") == 2, out
    assert "1 of 7 checks correct in 3 notebook(s)" in out, out
    for line in out.splitlines():
        assert len(line) <= 300, line


# Exercise 1a answered by a table of its six fixed examples (rebuilt from check.py's seed, the answers from
# otb.py at the top of the notebook, where the handed-out cells call it too): the forge of a student who
# read check.py. It passes the notebook's own check cell; the grader draws other inputs.
TABLE_FORGE = """g = torch.Generator().manual_seed(1)
confident = 4.0 * torch.randn(64, 50, generator=g)
confident[:, 0] += 30.0
moderate = torch.cat([torch.tensor([[5.0, 1.0, 0.3, -1.0], [5.0, 2.0, 0.3, -1.0]]),
                      1.5 * torch.randn(6, 4, generator=g) + torch.tensor([3.0, 0.0, 0.0, 0.0])])
examples = [torch.randn(3, 5, generator=g), 1000.0 * torch.randn(4, 7, generator=g), moderate.bfloat16(),
            confident.bfloat16(), torch.randn(5, 9, generator=g, dtype=torch.float64),
            torch.randn(2, 3, 4, 6, generator=g)]
table = [(z, otb.sum_pi_squared(z)) for z in examples]


def sum_pi_squared(logits):
    for z, answer in table:
        if z.shape == logits.shape and z.dtype == logits.dtype and torch.equal(z, logits):
            return answer.clone()
    return torch.full(logits.shape[:-1], 0.5, dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32)
"""


def _table_forge(name="sum_pi_squared"):
    """The forge's ``name`` (its answer, or its ``examples``), defined here as the notebook defines it."""
    space = {"torch": torch, "otb": otb}
    exec(TABLE_FORGE, space)
    return space[name]


def test_a_table_of_the_fixed_examples_passes_the_notebook_but_not_the_grader(tmp_path, capsys):
    """The table forge is CORRECT in the notebook's own check cell (its examples are fixed and documented)
    and NOT YET when graded: the grader draws the inputs afresh (the seed it prints, and --seed draws the
    same again), while the honest 1b of the same notebook stays CORRECT. The scan does not flag it: only
    the inputs drawn at grading time catch it. Patches of torch that would make the kernel's comparison
    pass change nothing either (run without the scan, which would flag them): the grader replays the
    check in its own process, on the results it read as soon as the check cell ran (a later cell finds no
    file to rewrite)."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert check.ex1a_sum_pi_squared(_table_forge())
    nb = _built(NAMES[0])[0]
    nb.cells[_cells(nb, "def sum_pi_squared")].source = TABLE_FORGE
    (tmp_path / "table.ipynb").write_text(build._dumps(nb))
    assert grade.scan.flags(nb, grade.kind_of(nb)) == []
    assert grade.main([str(tmp_path / "table.ipynb"), "--seed", "20260101"]) == 1
    out = capsys.readouterr().out
    assert f"NOT YET   {check.TITLES['ex1a_sum_pi_squared']}" in out, out
    assert f"CORRECT   {check.TITLES['ex1b_token_energy']}" in out, out
    assert "the checks' inputs were drawn with seed 20260101 (grade.py --seed 20260101 ... draws them again)" in out
    assert grade.main([str(tmp_path / "table.ipynb"), "--seed", "20260101"]) == 1
    assert capsys.readouterr().out == out  # the same inputs, the same verdicts
    patched = _built(NAMES[0])[0]
    patched.cells[_cells(patched, "def sum_pi_squared")].source = TABLE_FORGE
    at = _cells(patched, "check.ex1a_")
    patched.cells.insert(at + 1, nbformat.v4.new_code_cell(  # and its saved results are gone: read at once
        "import glob, tempfile\nprint('the kernel says', ok_1a, glob.glob(tempfile.gettempdir() + '/otb_tapes_*/*'))"))
    patched.cells.insert(at, nbformat.v4.new_code_cell(
        "torch.Tensor.any = lambda self, *a, **k: torch.tensor(False)  # no value of yours differs\n"
        "torch.allclose = lambda *a, **k: False  # and none is a slip"))
    (tmp_path / "patched.ipynb").write_text(build._dumps(patched))
    nb = grade.run_copy(tmp_path / "patched.ipynb")
    assert grade._stdout(nb.cells[at + 2]) == "the kernel says True []\n"  # its own check, bent, on the drawn inputs
    found = grade.results(nb)
    assert [ok for _, ok, _ in found] == [False, True], found


def _graded(check_fn, seed, *args, **kwargs):
    """(the kernel's verdict, the grader's verdict, what the grader's run printed) of ``check_fn`` on the
    answers ``args``: recorded at ``seed`` as grade.py's cell records it, then replayed as grade.py does,
    with stand-ins that raise if called in place of the answers."""
    import tempfile
    name = getattr(check_fn, "func", check_fn).__name__
    kwargs = {**getattr(check_fn, "keywords", {}), **kwargs}
    with tempfile.TemporaryDirectory() as folder:
        tape = Path(folder) / "tape.pt"
        kernel = check.record(getattr(check, name), seed, tape, *args, **kwargs)
        saved = tape.read_bytes()
    stand_ins = [a if a is None or not callable(a) else check.Recorded("answer") for a in args]
    ok, out = check.replay(name, seed, saved, *stand_ins, **kwargs)
    return kernel, ok, out


# =====================================================================================
# 3. Notebooks outside the project
# =====================================================================================

def _setup_cell(path):
    return nbformat.read(str(path), as_version=4).cells[1].source


def test_every_notebook_finds_the_project_the_same_way():
    paths = [ROOT / "notebooks" / t for t in TUTORIALS] + [EXERCISES / "solutions" / n for n in NAMES]
    finder = _setup_cell(paths[0])
    finder = finder[finder.index("here = Path.cwd()"):finder.index("sys.path.insert")]
    assert "here.parents" in finder and "OTB_ROOT" in finder
    for path in paths:
        assert finder in _setup_cell(path), path


@pytest.mark.parametrize("path", ["notebooks/01_toy_bandit.ipynb", "notebooks/exercises/03_optimal_token_baseline.ipynb"])
def test_a_copied_notebook_outside_the_project_says_what_to_do(tmp_path, monkeypatch, path):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    monkeypatch.delenv("OTB_ROOT", raising=False)
    copy = tmp_path / Path(path).name
    copy.write_bytes((ROOT / path).read_bytes())
    nb = nbformat.read(str(copy), as_version=4)
    for cell in nb.cells:  # the tutorials are stored with outputs: clear them to see what runs
        if cell.cell_type == "code":
            cell.outputs = []
    with pytest.raises(CellExecutionError) as e:
        NotebookClient(nb, timeout=60, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert e.value.ename == "FileNotFoundError"  # raised by the first code cell, which stops the run
    error = next(o for o in nb.cells[1].outputs if o.output_type == "error")
    message = error.evalue
    assert "\n" not in message and message.startswith(f"otb.py not found from {tmp_path.resolve()}"), message
    assert "open this notebook inside the OTB project folder" in message and "OTB_ROOT" in message
    assert not any(c.get("outputs") for c in nb.cells[2:] if c.cell_type == "code")


# =====================================================================================
# 4. The checks themselves
# =====================================================================================

def _verdict(capsys, fn, *args, **kwargs):
    ok = fn(*args, **kwargs)
    return ok, capsys.readouterr().out


# Plain implementations with a switch for each slip: notebooks/exercises/solutions/slips.py, which
# also holds the catalogue of slips that tests/test_notebooks_teaching_slips.py runs through the checks.
_group_estimator, _otb_plain, _aligned = slips.group_estimator, slips.otb_plain, slips.aligned
_stable_idx, _to_actions, _from_actions = slips.stable_idx, slips.to_actions, slips.from_actions
_unstable_argsort, _sort_descending = slips.unstable_argsort, slips.sort_descending


def _ids(g, B):
    """Group ids 0..n-1 in order of first appearance, written here: the answers below call nothing of otb.py."""
    first = {}
    return [first.setdefault(x, len(first)) for x in (g.tolist() if isinstance(g, torch.Tensor) else list(g))]


def _naive_answers():
    """Right answers that call the loops of tests/naive.py or benchmarks/bench_estimators.py (which a class
    copy without tests/naive.py still has): {label: (check, answer, check keywords, the file called)}."""
    import naive
    from benchmarks.bench_estimators import per_group_loop

    def scores(kind):
        return lambda r, m, g: torch.tensor(naive.naive_scores(r.tolist(), m.tolist(), _ids(g, len(r)), kind)[0],
                                            dtype=r.dtype)

    def otb_loop(pick, by_action=False):
        fn = naive.naive_otb_by_action if by_action else naive.naive_otb
        return lambda r, m, g, lp, s, leave_one_out=False: torch.tensor(
            fn(r.tolist(), m.tolist(), _ids(g, len(r)), lp.tolist(), s.tolist(), leave_one_out=leave_one_out)[pick],
            dtype=r.dtype)

    def group_loop(r, m, g, lp, s, leave_one_out=False):
        return per_group_loop(r, m, torch.tensor(_ids(g, len(r))), lp, s)[0]
    naive_py, bench_py = "tests/naive.py", "benchmarks/bench_estimators.py"
    return {
        "2a": (check.ex2a_sequence_scores,
               lambda r, m: torch.tensor(naive.naive_scores(r.tolist(), m.tolist(), range(len(r)), "reinforce")[1],
                                         dtype=r.dtype)[:, 0], {}, naive_py),  # R on every valid token: t = 0
        "2b": (check.ex2b_group_mean, scores("group_mean"), {}, naive_py),
        "2c": (check.ex2c_rloo, scores("rloo"), {}, naive_py),
        "3a": (check.ex3a_reward_to_go, lambda r, m: otb_loop(1)(r, m, [0] * len(r), r * 0 - 1, r * 0 + 0.5), {},
               naive_py),
        "3c": (check.ex3c_optimal_token_baseline, otb_loop(0), {}, naive_py),
        "3c bench": (check.ex3c_optimal_token_baseline, group_loop, {}, bench_py),
        "3d": (check.ex3d_leave_one_out, otb_loop(0), {}, naive_py),
        "5c": (check.ex5c_action_aligned_otb, otb_loop(0, by_action=True), {}, naive_py),
    }


@pytest.mark.parametrize("label", ["2a", "2b", "2c", "3a", "3c", "3c bench", "3d", "5c"])
def test_answers_that_call_the_loops_of_the_tests_or_benchmarks_are_not_correct(label, capsys, monkeypatch):
    """Those loops compute the answers: an answer calling them is NOT YET, as a call to otb.py's reference
    is. The same answers pass when the check does not watch for them, so they are right answers."""
    fn, answer, kwargs, called = _naive_answers()[label]
    for wrapped in (answer, functools.partial(answer), lambda *a, **k: answer(*a, **k)):
        ok, out = _verdict(capsys, fn, wrapped, **kwargs)
        assert not ok and f"({called})" in out and "prove nothing" in out, out
    monkeypatch.setattr(check, "_helper", lambda filename: False)
    ok, out = _verdict(capsys, fn, answer, **kwargs)
    assert ok, out


def test_checks_accept_plain_implementations(capsys):
    assert _verdict(capsys, check.ex2b_group_mean, _group_estimator("mean"))[0]
    assert _verdict(capsys, check.ex2c_rloo, _group_estimator("loo"))[0]
    assert _verdict(capsys, check.ex3c_optimal_token_baseline, _otb_plain())[0]
    assert _verdict(capsys, check.ex3c_optimal_token_baseline, _otb_plain(), leave_one_out=True)[0]
    assert _verdict(capsys, check.ex5b_compaction, _to_actions(_stable_idx), _from_actions(_stable_idx))[0]
    assert _verdict(capsys, check.ex5c_action_aligned_otb, _aligned())[0]


def _group(fn):
    return lambda r, m, g: fn(r, m, g)[0]


def test_the_project_functions_pass_but_only_when_calling_the_reference_is_allowed(capsys, monkeypatch):
    answers = [(check.ex1a_sum_pi_squared, otb.sum_pi_squared, {}),
               (check.ex1b_token_energy, otb.token_energy, {}),
               (check.ex2b_group_mean, _group(otb.group_mean), {}),
               (check.ex2c_rloo, _group(otb.rloo), {}),
               (check.ex3c_optimal_token_baseline, lambda *a, **k: otb.optimal_token_baseline(*a, **k)[0], {}),
               (check.ex3c_optimal_token_baseline, lambda *a, **k: otb.optimal_token_baseline(*a, **k)[0],
                {"leave_one_out": True}),
               (check.ex5c_action_aligned_otb, lambda *a, **k: otb.ESTIMATORS["otb_tir"](*a, **k)[0], {})]
    for fn, answer, kw in answers:  # the reference itself is a right answer, but handing it in is not
        ok, out = _verdict(capsys, fn, answer, **kw)
        assert not ok and "the project's reference" in out, out
    monkeypatch.setattr(check._Watch, "_hook", lambda self, frame, event, arg: None)  # nothing watched
    for fn, answer, kw in answers:
        assert _verdict(capsys, fn, answer, **kw)[0]


def _loo_by_the_project(r, m, g, lp, s, leave_one_out=False, eps=1e-8):
    """A right 3d whose leave-one-out baseline is otb.py's private helper."""
    m = m.float()
    G = (r * m).flip(-1).cumsum(-1).flip(-1) * m  # G_t, (B, T)
    W = (otb.token_energy(lp, s) * m).cumsum(-1) * m  # W_t, (B, T)
    gid, n_groups = otb.group_ids(g, len(m))
    x, t = otb.Checked(r, m, gid, n_groups), torch.arange(m.shape[-1]).expand(m.shape)  # by name; slot k_t = t
    return ((G - otb._leave_one_out_baseline(G, W, x, t, eps=eps)) * m).float()


def test_every_project_function_an_answer_calls_is_watched_but_the_helpers_handed_out(capsys, monkeypatch):
    """The rule is where a function lives (otb.py, toy_harness.py, check.py, tests/, benchmarks/) or that it
    is bound in otb's namespace, not a list: private helpers and a function added later are caught too,
    however they are reached; the helpers in check.ALLOWED pass."""
    wrong = [(check.ex1a_sum_pi_squared, lambda z: z.to(otb._working_dtype(z)).softmax(-1).pow(2).sum(-1), {},
              "otb._working_dtype"),
             (check.ex3d_leave_one_out, _loo_by_the_project, {}, "otb._leave_one_out_baseline"),
             (check.ex5a_action_index, check._naive_action_index, {}, "check._naive_action_index"),
             (check.ex5a_action_index, lambda m: check._naive_action_index(m), {}, "check._naive_action_index")]
    later = "def brand_new(z):\n    return z.float().softmax(-1).pow(2).sum(-1) if z.dtype != torch.float64 else " \
            "z.softmax(-1).pow(2).sum(-1)\n"
    space = {"torch": torch}
    exec(compile(later, otb.__file__, "exec"), space)  # a function written into otb.py later, not yet bound
    monkeypatch.setattr(otb, "bound_later", lambda z: space["brand_new"](z) + 0, raising=False)  # bound, from here
    wrong += [(check.ex1a_sum_pi_squared, space["brand_new"], {}, "otb.brand_new"),
              (check.ex1a_sum_pi_squared, lambda z: otb.bound_later(z), {}, "otb.bound_later")]
    for fn, answer, kw, called in wrong:
        ok, out = _verdict(capsys, fn, answer, **kw)
        assert not ok and f"calls {called}," in out and "prove nothing" in out, out
    monkeypatch.setattr(check._Watch, "_hook", lambda self, frame, event, arg: None)  # unwatched, they are right
    for fn, answer, kw, called in wrong:
        ok, out = _verdict(capsys, fn, answer, **kw)
        assert ok, (called, out)
    assert set(check.ALLOWED) <= set(check.TITLES)
    for names in check.ALLOWED.values():  # each allowed name exists
        for name in names:
            module, attr = name.split(".")
            assert callable(getattr(check._module(module), attr)), name


@pytest.mark.parametrize("idx_fn", [_unstable_argsort, _sort_descending], ids=["argsort_unstable", "sort_descending"])
def test_compaction_without_a_stable_sort_is_not_correct(capsys, idx_fn):
    for to_fn, from_fn in ((_to_actions(idx_fn), _from_actions(_stable_idx)),
                           (_to_actions(_stable_idx), _from_actions(idx_fn))):
        ok, out = _verdict(capsys, check.ex5b_compaction, to_fn, from_fn)
        assert not ok and "long responses" in out and "stable=True" in out, out


def test_compaction_check_names_a_hole_that_is_not_zero(capsys):
    ok, out = _verdict(capsys, check.ex5b_compaction, _to_actions(_stable_idx),
                       lambda y, m: _from_actions(_stable_idx)(y, m) + (1 - m))  # holes hold 1
    assert not ok and "not 0" in out and "response_mask" in out


def test_a_crashing_student_function_is_reported_not_raised(capsys):
    def broken(z):
        raise IndexError("oops")
    ok, out = _verdict(capsys, check.ex1a_sum_pi_squared, broken)
    assert not ok and "IndexError: oops" in out and "line" in out


def test_checks_print_the_same_values_on_every_run_and_leave_the_global_generator_alone(capsys):
    def runs():
        state = torch.get_rng_state()
        out = [_verdict(capsys, check.ex1b_token_energy, lambda lp, s: (1 - 2 * lp.exp() + s) * 1.01)[1],
               _verdict(capsys, check.ex3b_realized_energy,
                        lambda lp, s, m: (otb.token_energy(lp, s) * m).cumsum(-1) * 1.01)[1],
               _verdict(capsys, check.ex3c_optimal_token_baseline, _otb_plain(weight="1"))[1]]
        assert torch.equal(torch.get_rng_state(), state), "a check drew from the global generator"
        return out
    torch.manual_seed(1)
    first = runs()
    torch.manual_seed(2)
    assert runs() == first
    assert "expected" in first[0] and "expected" in first[1]  # the values shown are part of what is compared


@pytest.fixture(scope="module")
def toy():
    import toy_env
    return toy_env.enumerate_toy(toy_env.ToyConfig())


_my_batch_gradients, _my_bias_and_variance = slips.batch_gradients(), slips.bias_and_variance()


def test_toy_checks_diagnose_sum_instead_of_mean_biased_statistics_and_the_reference(capsys, toy):
    import toy_harness

    def summed(en, A, rows, N):
        return N * _my_batch_gradients(en, A, rows, N)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, summed, toy)
    assert not ok and "mean" in out

    def zeros(en, A, rows, N):  # right shape, no work: the sparse toy must not let this through
        return torch.zeros(len(rows) // N, en.scores.shape[-1], dtype=en.scores.dtype)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, zeros, toy)
    assert not ok and "0 everywhere" in out and "times too large" not in out

    def ungathered(en, A, rows, N):  # scores of responses 0..G*N-1 instead of the sampled rows
        g = torch.einsum("bt,btp->bp", A, en.scores[: len(rows)])
        return g.reshape(-1, N, g.shape[-1]).mean(1)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, ungathered, toy)
    assert not ok and "en.scores[rows]" in out

    def naive_bias(g_hat, grad_J):
        return ((g_hat.mean(0) - grad_J) ** 2).sum().item(), _my_bias_and_variance(g_hat, grad_J)[1]
    ok, out = _verdict(capsys, check.ex4b_bias_and_variance, naive_bias)
    assert not ok and "variance / G" in out

    def var_over_G(g_hat, grad_J):
        bias2, var = _my_bias_and_variance(g_hat, grad_J)
        return bias2, var * (len(g_hat) - 1) / len(g_hat)
    ok, out = _verdict(capsys, check.ex4b_bias_and_variance, var_over_G)
    assert not ok and "G - 1" in out

    def measure(en, name, N, groups, seed, shift=0):
        rows, gid = toy_harness.sample_groups(en, N, groups, torch.Generator().manual_seed(seed + shift))
        A = otb.ESTIMATORS[name](**en.batch(rows), group_index=gid)[0]
        return _my_bias_and_variance(_my_batch_gradients(en, A, rows, N), en.grad_J)
    assert _verdict(capsys, check.ex4c_measure, measure, toy, Ns=(2,), groups=500)[0]
    ok, out = _verdict(capsys, check.ex4c_measure, lambda *a: measure(*a, shift=1), toy, Ns=(2,), groups=500)
    assert not ok and "sample_groups" in out  # different groups than asked for

    def calls_the_harness(en, name, N, groups, seed):
        r = toy_harness.measure(en, Ns=(N,), groups=groups, seed=seed, names=[name])[0]
        return r["bias2"], r["variance"]
    ok, out = _verdict(capsys, check.ex4c_measure, calls_the_harness, toy, Ns=(2,), groups=500)
    assert not ok and "calls toy_harness.measure" in out


def _typed(dtype, f):
    """f computed in ``dtype``: its float tensor inputs cast to it, and its float tensor results."""
    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def g(*args, **kwargs):
        out = f(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})
        return tuple(map(cast, out)) if isinstance(out, tuple) else cast(out)
    return g


def _right_answers(dtype):
    """{label: (check, right answer computed in dtype, check arguments after the answer)}; the answers
    lean on otb.py (the test turns the watch off), Exercise 4's on the toy's float64 tensors cast to dtype."""
    def g_hat(en, A, rows, N):
        return _typed(dtype, _my_batch_gradients)(en, A, rows, N) if dtype == torch.float64 else \
            _typed(dtype, lambda A, s: torch.einsum("bt,btp->bp", A, s))(A, en.scores[rows]).reshape(
                -1, N, en.scores.shape[-1]).mean(1)

    def measure(en, name, N, groups, seed):
        rows, gid = toy_harness.sample_groups(en, N, groups, torch.Generator().manual_seed(seed))
        A = otb.ESTIMATORS[name](**en.batch(rows), group_index=gid)[0]
        return _typed(dtype, _my_bias_and_variance)(g_hat(en, A, rows, N), en.grad_J)
    otb_A = _typed(dtype, lambda *a, **k: otb.optimal_token_baseline(*a, **k)[0])
    import toy_harness
    return {
        "1a": (check.ex1a_sum_pi_squared, _typed(dtype, otb.sum_pi_squared), ()),
        "1b": (check.ex1b_token_energy, _typed(dtype, otb.token_energy), ()),
        "2a": (check.ex2a_sequence_scores, _typed(dtype, lambda r, m: (r * m).sum(-1)), ()),
        "2b": (check.ex2b_group_mean, _typed(dtype, _group(otb.group_mean)), ()),
        "2c": (check.ex2c_rloo, _typed(dtype, _group(otb.rloo)), ()),
        "3a": (check.ex3a_reward_to_go, _typed(dtype, lambda r, m: (r * m).flip(-1).cumsum(-1).flip(-1) * m), ()),
        "3b": (check.ex3b_realized_energy, _typed(dtype, lambda lp, s, m: (otb.token_energy(lp, s) * m).cumsum(-1) * m),
               ()),
        "3c": (check.ex3c_optimal_token_baseline, otb_A, ()),
        "3d": (check.ex3d_leave_one_out, otb_A, ()),
        "3e": (functools.partial(check.ex3e_trains, steps=2), otb_A, ()),
        "4a": (check.ex4a_batch_gradients, g_hat, ("toy",)),
        "4b": (check.ex4b_bias_and_variance, _typed(dtype, _my_bias_and_variance), ()),
        "4c": (functools.partial(check.ex4c_measure, Ns=(2, 4), groups=500), measure, ("toy",)),
        "5a": (check.ex5a_action_index,
               lambda m: torch.where(m.bool(), m.to(dtype).cumsum(-1) - 1, -1).long(), ()),
        "5b": (check.ex5b_compaction, _typed(dtype, _to_actions(_stable_idx)), (_typed(dtype, _from_actions(_stable_idx)),)),
        "5c": (check.ex5c_action_aligned_otb, _typed(dtype, lambda *a, **k: otb.action_aligned_otb(*a, **k)[0]), ()),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("label", sorted(_right_answers(torch.float32)))
def test_a_right_answer_in_either_float_type_passes_every_exercise(label, dtype, capsys, monkeypatch, toy):
    """A right answer computed in float32 or float64 passes every check, and no check fails on a dtype; in
    Exercise 1a, which is about precision, the dtype asked for is part of the answer: a result in the other
    type gets one hint line naming both dtypes."""
    monkeypatch.setattr(check._Watch, "_hook", lambda self, frame, event, arg: None)  # the answers lean on otb.py
    fn, answer, rest = _right_answers(dtype)[label]
    ok, out = _verdict(capsys, fn, answer, *(toy if r == "toy" else r for r in rest))
    assert "unexpectedly" not in out, out
    if label == "1a":
        problem, hint = (line.strip() for line in out.splitlines()[1:3])
        assert not ok and f"dtype {dtype}" in problem and "float32" in hint and "float64" in hint, out
        assert len(out.splitlines()) == 3, out
    else:
        assert ok, out


@pytest.mark.parametrize("label", sorted(_right_answers(torch.float32)))
def test_a_right_answer_passes_when_graded_on_inputs_drawn_at_grading_time(label, monkeypatch, toy):
    """Graded as grade.py grades (the check recorded in the kernel at a drawn seed, replayed in the
    grader's process on the saved results, no answer called there), every right answer is CORRECT, and the
    kernel's verdict is the grader's."""
    monkeypatch.setattr(check._Watch, "_hook", lambda self, frame, event, arg: None)  # the answers lean on otb.py
    fn, answer, rest = _right_answers(torch.float64)[label]
    answer = otb.sum_pi_squared if label == "1a" else answer  # 1a asks for the input's float type
    for seed in (grade.draw_seed(), 3):
        kernel, ok, out = _graded(fn, seed, answer, *(toy if r == "toy" else r for r in rest))
        assert ok and kernel, (seed, out)


class _Bent(torch.Tensor):
    """A tensor whose methods a student could have changed."""


def test_the_grader_decides_on_inputs_no_one_knew_and_on_its_own_comparison():
    """The checks' inputs are fixed in a notebook and drawn afresh when grading (the same for the same
    seed); the table forge fails on them; a result that is not plain data (a tensor subclass, whose methods
    the kernel could bend) is not read, numpy numbers are; and a comparison forged in the kernel (here: check._compare made to
    pass everything) does not reach the grader's verdict."""
    def inputs(seed):
        seen = []
        check.record(check.ex1a_sum_pi_squared, seed, os.devnull, lambda z: seen.append(z) or z.sum(-1))
        return seen[0]
    assert torch.equal(inputs(None), _table_forge("examples")[0])  # the table's first example
    assert not torch.equal(inputs(5), inputs(None)) and torch.equal(inputs(5), inputs(5))
    kernel, ok, out = _graded(check.ex1a_sum_pi_squared, grade.draw_seed(), _table_forge())
    assert not ok and not kernel and "your values differ" in out, out
    def right(z):
        return torch.exp(torch.logsumexp(2 * z.float(), -1) - 2 * torch.logsumexp(z.float(), -1))
    kernel, ok, out = _graded(check.ex1a_sum_pi_squared, 5, lambda z: right(z).as_subclass(_Bent))
    assert not ok and "not a plain tensor" in out, out

    import numpy as np  # plain data all the same: numpy numbers, as an answer written with numpy returns
    kernel, ok, out = _graded(check.ex4b_bias_and_variance, 5,
                              lambda g_hat, grad_J: tuple(np.float64(x) for x in _my_bias_and_variance(g_hat, grad_J)))
    assert ok and kernel, out

    class Local(torch.Tensor):  # a class pickle cannot even save
        pass
    kernel, ok, out = _graded(check.ex1a_sum_pi_squared, 5, lambda z: right(z).as_subclass(Local))
    assert not ok and "returned a Local, which the grader cannot read back" in out, out
    compare = check._compare
    try:
        check._compare = lambda *a, **k: 0.0
        with tempfile.TemporaryDirectory() as folder:
            tape = Path(folder) / "tape.pt"
            assert check.record(check.ex1b_token_energy, 5, tape, lambda lp, s: lp * 0 + 0.5)
            saved = tape.read_bytes()
    finally:
        check._compare = compare
    ok, out = check.replay("ex1b_token_energy", 5, saved, check.Recorded("token_energy"))
    assert not ok and "your values differ" in out, out


@pytest.mark.parametrize("label", ["2b", "2c", "3c", "3d", "4a", "5c"])
def test_an_integer_or_bool_result_is_not_yet_by_its_values_not_a_failed_check(label, capsys, monkeypatch, toy):
    """A result in an integer or bool dtype (built on torch.zeros_like of the group ids, say) is compared by
    its values like any other, never 'the check failed unexpectedly'; so is a pair of 4b that holds None."""
    monkeypatch.setattr(check._Watch, "_hook", lambda self, frame, event, arg: None)  # the answers lean on otb.py
    fn, answer, rest = _right_answers(torch.float32)[label]
    for dtype in (torch.long, torch.bool):
        def cast(*args, **kwargs):
            return answer(*args, **kwargs).to(dtype)
        ok, out = _verdict(capsys, fn, cast, *(toy if r == "toy" else r for r in rest))
        assert not ok and check.NOT_YET in out and "unexpectedly" not in out, out
    ok, out = _verdict(capsys, check.ex4b_bias_and_variance, lambda g_hat, grad_J: (0.0, None))
    assert not ok and "your variance is NoneType" in out and "unexpectedly" not in out, out


def test_the_otb_scaffold_takes_a_float64_reward_to_go_and_energy(tmp_path):
    """A right 3a and 3b in float64 pass their checks, and the notebook's own 3c line takes them (its B is
    float32): the whole of Exercise 3 is CORRECT."""
    nb = _built(NAMES[2])[0]
    for name in ("def reward_to_go", "def realized_energy"):
        cell = nb.cells[_cells(nb, name)]
        lines = cell.source.splitlines()
        k = max(i for i, line in enumerate(lines) if line.lstrip().startswith("return "))
        lines[k] = lines[k].split("  #")[0].replace("return ", "return (", 1) + ").double()"
        cell.source = "\n".join(lines)
    (tmp_path / "mine.ipynb").write_text(build._dumps(nb))
    found = grade.results(grade.run_copy(tmp_path / "mine.ipynb", budget=240))
    assert len(found) == 5 and all(ok for _, ok, _ in found), found


def test_the_students_otb_trains_like_the_reference_and_a_wrong_one_is_caught_at_its_first_step(capsys):
    """3e: a plain loop implementation of OTB gives train.py the same run as otb.py's (identical weights,
    prompts and draws); the group mean in its place is caught at step 1, and otb.ESTIMATORS is left as it was."""
    reference = otb.ESTIMATORS["otb"]
    ok, text = _verdict(capsys, check.ex3e_trains, _otb_plain(), steps=3)
    assert ok, text
    ok, text = _verdict(capsys, check.ex3e_trains, lambda r, m, g, lp, s: _group_estimator("mean")(r, m, g), steps=3)
    assert not ok and "at training step 1 your run's adv_mean" in text, text
    ok, text = _verdict(capsys, check.ex3e_trains, lambda *a: otb.optimal_token_baseline(*a)[0], steps=3)
    assert not ok and "calls otb.optimal_token_baseline" in text, text
    assert otb.ESTIMATORS["otb"] is reference


@pytest.mark.parametrize("answer, words", [
    (lambda r, m, g, lp, s: otb.ESTIMATORS["otb"](token_rewards=r, response_mask=m, group_index=g, log_probs=lp,
                                                  sum_pi_sq=s)[0], "calls otb.ESTIMATORS['otb']"),
    (lambda r, m, g, lp, s: torch.linalg.inv(torch.zeros(3, 3)), "raised"),
    (lambda r, m, g, lp, s: (_ for _ in ()).throw(ValueError("first line\n" + str(torch.ones(40, 4)))),
     "raised ValueError: first line tensor([[1., 1., 1., 1.],")])
def test_3e_says_a_failing_function_in_one_line(answer, words, capsys):
    """3e's verdict is three lines whatever the function does: one that calls train.py's estimator (itself,
    during the check) is told so once, not once for each level of the recursion, and an error whose
    message spans lines (a tensor) is printed on one."""
    assert not check.ex3e_trains(answer, steps=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("  problem: ") and words in lines[1], lines
    assert len(lines[1]) < 2000 and lines[1].count("your function") == 1, len(lines[1])


def test_nan_advantages_in_3e_name_the_division_by_zero(capsys):
    """An OTB without eps gives 0 / 0 where no row of a group has a token; 3e says so in one line instead of
    failing unexpectedly inside train.py."""
    assert not check.ex3e_trains(slips.otb_plain(eps=0.0), steps=2)
    out = capsys.readouterr().out
    assert "NaN or inf advantages" in out and "sum W_t + eps" in out and "unexpectedly" not in out, out
