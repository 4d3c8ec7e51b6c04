"""The teaching material says what the project measures: the answer keys take the project's position,
docs/teaching.md quotes the numbers the notebooks print, the class copy leaks no answer, and the Colab
cells run a tutorial from outside the project, say in one line when the clone fails, and grade a
notebook of the class copy."""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "notebooks" / "exercises"
TEACHING = (ROOT / "docs" / "teaching.md").read_text()
sys.path.insert(0, str(EXERCISES))

import build  # noqa: E402
import check  # noqa: E402
import grade  # noqa: E402
import handout  # noqa: E402


def _cells(name, folder=EXERCISES / "solutions"):
    return nbformat.read(str(folder / name), as_version=4).cells


def _solution_text(name, heading):
    """The <!-- BEGIN SOLUTION --> block of the markdown cell that contains ``heading``."""
    cell = next(c for c in _cells(name) if c.cell_type == "markdown" and heading in c.source)
    return re.search(r"<!-- BEGIN SOLUTION -->(.*?)<!-- END SOLUTION -->", cell.source, re.DOTALL).group(1)


def _flat(text):
    return " ".join(text.split())


# =====================================================================================
# 1. The keys carry the project's position (notebook 01 section 7, Exercise 4, docs/toy_bandit.md)
# =====================================================================================

def test_the_4d_and_2c_keys_say_the_two_estimators_have_the_same_normalised_variance():
    for name, heading in (("04_bias_variance_toy.ipynb", "## 4d."), ("02_group_baselines.ipynb", "**Question.**")):
        key = _flat(_solution_text(name, heading))
        assert "same normalised variance" in key, name
        assert "rewards shrink" in key or "shrinkage" in key or "shrunk" in key, name
        assert "what matters is the error of the update" not in key and "so it is *smaller*" not in key, name


def test_exercise_3_no_longer_says_otb_is_biased_like_the_group_mean():
    text = _flat("\n".join(c.source for c in _cells("03_optimal_token_baseline.ipynb")))
    assert "exactly as in the group mean" not in text and "O(1/N)" not in text
    assert "falls much more slowly than the group mean's 1/N" in text


def test_otb_docstring_after_the_proposed_fix_says_the_bias_falls_more_slowly():
    """Passes once otb.py's sentence "biased by O(1/N), like GRPO's mean" is replaced as proposed in #42."""
    import otb
    doc = _flat(otb.__doc__)
    assert "biased by O(1/N), like GRPO's mean" not in doc
    assert "more slowly than 1/N" in doc


def test_exercise_4s_going_further_quotes_what_its_cell_prints():
    """The numbers of 'What you should see' against the output of the cell under it, run here."""
    import toy_env
    import toy_harness
    cells = _cells("04_bias_variance_toy.ipynb")
    k = next(i for i, c in enumerate(cells) if "**What you should see**" in c.source)
    text, code = _flat(cells[k].source), cells[k + 1].source
    en = toy_env.enumerate_toy(toy_env.ToyConfig())
    printed = []
    exec(code, {"en": en, "toy_harness": toy_harness, "print": lambda *a, **kw: printed.append(" ".join(map(str, a)))})
    rows = {}
    for line in printed:
        n, est, b2, nvar = re.match(r"N = (\d+)\s+(\w+)\s+bias\^2 / \|\|grad J\|\|\^2 =\s+(\S+) .* nvar =\s+(\S+)",
                                    line).groups()
        rows[int(n), est] = float(b2), float(nvar)
    quoted = ", ".join(f"{rows[n, 'otb'][0]:.2f}" for n in (2, 4, 8))
    assert f"about {quoted}" in text, (quoted, text)
    assert f"nvar about {rows[2, 'otb'][1]:.0f} against {rows[2, 'group_mean'][1]:.0f}" in text, rows


# =====================================================================================
# 2. teaching.md and notebook 01 quote what the notebook prints and what the committed run holds
# =====================================================================================

def _notebook_01_outputs():
    nb = nbformat.read(str(ROOT / "notebooks" / "01_toy_bandit.ipynb"), as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _class_rows():
    """{step number: 'what you should see' cell} of teaching.md's table of the two-hour class."""
    rows = {}
    for line in TEACHING.splitlines():
        cells = [c.strip() for c in re.split(r" \| ", line.strip().strip("|"))]  # not the | of ||grad J||
        if len(cells) == 5 and cells[0].isdigit():
            rows[int(cells[0])] = cells[4]
    return rows


_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+(?:e[+-]\d+)?|\d+e-\d+)")


@pytest.mark.parametrize("step", [1, 2, 7])
def test_teaching_md_quotes_what_notebook_01_prints(step):
    cell = _class_rows()[step]
    notebook_part = re.sub(r"\(2,000 groups per point; the committed run[^)]*\)", "", cell)
    numbers = _NUMBER.findall(notebook_part)
    assert len(numbers) >= 3, cell
    outputs = _notebook_01_outputs()
    missing = [x for x in numbers if not re.search(rf"(?<![\d.]){re.escape(x)}(?!\d)", outputs)]
    assert not missing, (missing, cell)


def _toy_table():
    rows = json.loads((ROOT / "benchmarks" / "results" / "toy_table.json").read_text())["rows"]
    return {(r["estimator"], r["N"]): r for r in rows}


def _interval(r, key):
    return f"{r[key]:.2f} [{r[key + '_lo']:.2f}, {r[key + '_hi']:.2f}]"


def test_the_committed_run_numbers_in_teaching_md_and_notebook_01_are_toy_table_json():
    t = _toy_table()
    committed = f"the committed run with 10,000: {t['otb', 2]['alpha']:.2f}, {t['otb', 2]['gain']:.2f}, " \
                f"{t['otb', 32]['gain']:.2f})"
    assert committed in _class_rows()[7]
    nb = nbformat.read(str(ROOT / "notebooks" / "01_toy_bandit.ipynb"), as_version=4)
    text = _flat("\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))
    for quoted in (f"{_interval(t['otb', 2], 'gain')} at $N=2$", f"{_interval(t['otb', 4], 'gain')} at $N=4$",
                   f"{_interval(t['otb', 32], 'gain')} at $N=32$",
                   f"$\\alpha \\approx {t['otb', 2]['alpha']:.2f}$ at $N=2$, ${t['otb', 4]['alpha']:.2f}$ at $N=4$, "
                   f"${t['otb', 32]['alpha']:.2f}$ at $N=32$"):
        assert quoted in text, quoted
    zt = [t['otb_zero_tail', n]['alpha'] for n in (2, 4, 8, 16, 32)]
    assert f"$\\alpha$ {min(zt):.2f}-{max(zt):.2f} in the committed run" in text
    for n in (8, 16):  # "not resolved at N = 8 and 16 (the intervals contain 1)"
        assert t['otb', n]['gain_lo'] < 1 < t['otb', n]['gain_hi']


def test_notebook_01_section_5_calls_a_variance_a_variance():
    nb = nbformat.read(str(ROOT / "notebooks" / "01_toy_bandit.ipynb"), as_version=4)
    k = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "OTB's population baseline" in c.source
             and "one-sample" in c.source)
    text, printed = _flat(nb.cells[k].source), "".join(o.get("text", "") for o in nb.cells[k - 1].outputs)
    assert "baseline lands close to the exact optimum" not in text
    for x in re.findall(r"\d+\.\d+", text):
        assert x in printed, x  # every number of the sentence is printed by the cell above it
    otb6, opt6 = re.search(r"\(OTB, population\): \[.* (\S+)\]\n.*\(exact optimum\)\s+: \[.* (\S+)\]", printed).groups()
    assert 2.5 < float(otb6) / float(opt6) < 3.5 and "about 3x" in text


def test_the_path_of_the_two_hour_class_has_no_rough_edges():
    ex1 = _flat(_cells("01_sum_pi_squared.ipynb")[-1].source)
    assert "straight to Exercise 3" in ex1
    ex3 = _flat(_cells("03_optimal_token_baseline.ipynb")[0].source)
    assert "five minutes of lecture" in ex3
    assert "Exercises 1 and 3 in class" in TEACHING and "which Exercise 3 assumes" in TEACHING


def test_the_quiz_key_says_when_nvar_is_the_same_and_counts_bf16_bits_right():
    """Q4's 'exactly the same normalised variance' holds for groups of one size only; bf16 keeps 7 bits of
    mantissa plus the implicit leading 1. Nowhere (teaching.md, check.py, the notebooks) says '8 bits of
    mantissa'."""
    answers = TEACHING[TEACHING.index("Answers, for the lecturer"):]
    q4 = _flat(answers[answers.index("\n4. "):answers.index("\n5. ")])
    assert "every group has N responses" in q4 and "different sizes" in q4, q4
    q8 = _flat(answers[answers.index("\n8. "):])
    assert "7 stored" in q8 and "implicit" in q8, q8
    texts = [TEACHING, (EXERCISES / "check.py").read_text()] + \
        ["\n".join(c.source for c in _cells(p.name)) for p in (EXERCISES / "solutions").glob("*.ipynb")]
    assert not any(re.search(r"8 bits of\s+mantissa", t) for t in texts)
    assert "every group has the same size" in _flat(_solution_text("02_group_baselines.ipynb", "**Question.**"))


def test_teaching_md_states_the_graders_time_budget_its_measured_cost_and_how_to_change_it():
    """The budget is the grader's, the line quoted is the one it prints, and the class-time figure is a
    measurement with one endless loop among the notebooks (6 notebooks: the five solutions and a looping
    03), consistent with the budget: at least one budget, at most one budget plus 15 s per notebook."""
    text = _flat(TEACHING[TEACHING.index("### For students: checking your answers"):TEACHING.index("## A two-hour")])
    assert f"**{grade.BUDGET} seconds**" in text
    assert f"the notebook's time budget of {grade.BUDGET} s ran out in this cell" in text
    assert "--budget" in text and "grade.py --budget" in grade.__doc__ and f"{grade.WIDTH} characters" in text
    n, seconds = map(int, re.search(r"(\d+) notebooks in (\d+) seconds", text).groups())
    assert "never returns" in text and grade.BUDGET <= seconds <= grade.BUDGET + 15 * n


def test_teaching_md_names_the_gradebooks_columns_and_every_flag_the_grader_writes():
    """The class command, the gradebook's columns as grade.py writes them, and every flag it can write (read
    from grade.py's source: the flags of results()' own lines and the literal flags of the rows)."""
    text = _flat(TEACHING[TEACHING.index("**A whole class in one command.**"):TEACHING.index("## A two-hour")])
    assert "grade.py --class submissions/" in text and "grade.py --class submissions/" in grade.__doc__
    assert f"`{', '.join(grade.GRADEBOOK)}`" in text
    source = (EXERCISES / "grade.py").read_text()
    flags = set(grade._FLAGS.values()) | set(re.findall(r'"NOT YET", "([a-z ]+)"', source)) | \
        {"timed out", "copy", "tampering"}
    assert len(flags) == 11 and all(f'"{f}"' in source for f in ("timed out", "copy", "tampering")), flags
    for flag in flags:
        assert f"`{flag}`" in text, flag


def test_the_two_hour_plan_fills_120_minutes_with_the_quiz_in_it():
    """The plan's steps follow each other from 0 to 120 minutes, and the ten-minute quiz is one of them."""
    plan = TEACHING[TEACHING.index("## A two-hour"):TEACHING.index("## A short quiz")]
    steps = [(int(a), int(b), part.strip()) for a, b, part in
             re.findall(r"^\| \d+ \| (\d+)-(\d+) \| ([^|]*) \|", plan, re.MULTILINE)]
    assert steps[0][0] == 0 and steps[-1][1] == 120
    assert all(a[1] == b[0] for a, b in zip(steps, steps[1:])), steps
    quiz = [(start, end) for start, end, part in steps if "quiz" in part]
    assert len(quiz) == 1 and quiz[0][1] - quiz[0][0] == 10, steps
    assert "A short quiz (10 minutes" in TEACHING


def test_teaching_md_has_a_quiz_with_answers_an_answer_key_policy_and_the_ta_table():
    quiz = TEACHING[TEACHING.index("## A short quiz"):]
    questions = re.findall(r"^(\d)\. .*\?$", quiz[:quiz.index("<!-- BEGIN ANSWERS -->")], re.MULTILINE)
    answers = re.findall(r"^(\d)\. ", quiz[quiz.index("<!-- BEGIN ANSWERS -->"):quiz.index("<!-- END ANSWERS -->")],
                         re.MULTILINE)
    assert 5 <= len(questions) <= 8 and answers == questions
    assert "**Answer-key policy.**" in TEACHING and "ta_table.md" in TEACHING


# =====================================================================================
# 3. The class copy: no answers, and it grades
# =====================================================================================

def _solution_lines():
    """Every line of code in the answer blocks of the solution notebooks (its comment cut, 20 characters or
    more), except those the exercise itself hands out (the line, or what it assigns): in a blank notebook
    (the TODO comments, the code around a blank) or in check.py (the hints)."""
    given = "\n".join(c.source for p in sorted(EXERCISES.glob("0*.ipynb")) for c in _cells(p.name, EXERCISES))
    given += (EXERCISES / "check.py").read_text()
    lines = set()
    for path in sorted((EXERCISES / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(str(path), as_version=4).cells:
            for block in re.findall(r"### BEGIN SOLUTION[^\n]*\n(.*?)### END SOLUTION", cell.source, re.DOTALL):
                lines |= {code for line in block.splitlines() if len(code := line.split("  #")[0].strip()) >= 20}
    return sorted(line for line in lines if line not in given and line.split(" = ", 1)[-1] not in given)


def _answer_functions():
    """{name: its body, flattened, without the docstring} of every function of tests/naive.py, the loops
    that compute the answers of Exercises 2, 3 and 5."""
    source, out = (ROOT / "tests" / "naive.py").read_text(), {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            out[node.name] = _flat("\n".join(ast.get_source_segment(source, stmt) for stmt in body))
    return out


def _solution_blocks():
    """Every answer block of every solution notebook, whitespace-flattened."""
    blocks = []
    for path in sorted((EXERCISES / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(str(path), as_version=4).cells:
            blocks += re.findall(r"### BEGIN SOLUTION[^\n]*\n(.*?)### END SOLUTION", cell.source, re.DOTALL)
            blocks += re.findall(r"<!-- BEGIN SOLUTION -->(.*?)<!-- END SOLUTION -->", cell.source, re.DOTALL)
    return [_flat(b) for b in blocks if len(_flat(b)) > 40]


@pytest.fixture(scope="module")
def class_copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("otb-class")
    assert handout.main([str(out), "--force"]) == 0
    return out


def test_the_class_copy_holds_no_solution_and_no_test_with_answers(class_copy):
    """No answer block or line of the solutions, no test with answers, and no function of tests/naive.py
    (loops that compute Exercises 2, 3 and 5), nor a test that imports it, is in the class copy."""
    files = [p for p in class_copy.rglob("*") if p.is_file()]
    rel = {str(p.relative_to(class_copy)) for p in files}
    assert "otb.py" in rel and "notebooks/exercises/check.py" in rel and "notebooks/exercises/grade.py" in rel
    assert {f"notebooks/exercises/{p.name}" for p in (EXERCISES / "solutions").glob("*.ipynb")} <= rel
    assert not any(r.startswith("notebooks/exercises/solutions") for r in rel)
    assert not any(r.startswith(("tests/test_notebooks_exercises", "tests/test_notebooks_teaching_")) for r in rel)
    assert not any("ta_table" in r for r in rel)
    answer_tests = handout.answer_tests(ROOT)
    assert {"naive", "test_naive_otb", "test_naive_holes"} <= answer_tests
    assert not {f"tests/{name}.py" for name in answer_tests} & rel
    blocks, lines, functions = _solution_blocks(), _solution_lines(), _answer_functions()
    assert len(blocks) >= 15 and len(lines) >= 20
    assert {"naive_otb", "naive_scores", "naive_otb_by_action"} <= set(functions)
    for path in files:
        raw = path.read_text(errors="replace") if path.suffix in (".py", ".md", ".ipynb", ".json", ".txt") else ""
        if path.suffix == ".ipynb":
            raw = "\n".join(c.source for c in nbformat.reads(raw, as_version=4).cells)
        text = _flat(raw)
        leaked = [b[:60] for b in blocks if b in text] + [line for line in lines if line in raw]
        leaked += [f"the body of naive.{name}" for name, body in functions.items() if body in text]
        assert not leaked, (path, leaked)
    teaching = (class_copy / "docs" / "teaching.md").read_text()
    assert "BEGIN ANSWERS" not in teaching and "A short quiz" in teaching
    assert "Answers, for the lecturer" not in teaching and "1.19 against 0.15" not in teaching


def _colab(tmp_path, monkeypatch, repo):
    """The environment of a notebook in Colab, for kernels started by the test: a fresh HOME, OTB_REPO =
    ``repo``, no OTB_ROOT, pip without an index (it only confirms that requirements.txt is satisfied)."""
    monkeypatch.delenv("OTB_ROOT", raising=False)
    monkeypatch.delenv("OTB_GRADING", raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OTB_REPO", str(repo))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    work = tmp_path / "upload"
    work.mkdir()
    return work


def test_the_setup_cell_says_in_one_line_when_the_clone_fails(tmp_path, monkeypatch):
    from nbclient import NotebookClient
    work = _colab(tmp_path, monkeypatch, tmp_path / "no-such-repository")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell((EXERCISES / "colab_setup.py").read_text())])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(work)}}).execute()
    error = next(o for o in nb.cells[0].outputs if o.output_type == "error")
    assert error.ename == "SetupError" and "\n" not in error.evalue and len(error.traceback) == 1, error
    assert error.evalue.startswith(f"git could not clone OTB_REPO = {tmp_path / 'no-such-repository'} (")
    assert "set OTB_REPO" in error.evalue and not (tmp_path / "home" / "otb").exists()


def test_the_setup_cell_says_in_one_line_which_torch_and_transformers_pip_will_install(tmp_path, monkeypatch,
                                                                                          capsys):
    """A torch or transformers older than requirements.txt allows (Colab's may be) is named with the
    version it will get, on one line, before pip runs (here without an index, so it then fails in one line)."""
    (tmp_path / "otb.py").write_text("")
    (tmp_path / "requirements.txt").write_text("torch>=99  # newer than any\ntransformers>=1.0\nnumpy>=1.0\n")
    monkeypatch.setenv("OTB_ROOT", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(Exception, match="pip could not install"):
        exec(compile((EXERCISES / "colab_setup.py").read_text(), "colab_setup.py", "exec"), {"__name__": "cell"})
    out = capsys.readouterr().out.splitlines()
    import torch
    assert out == [f"pip will install torch {torch.__version__} -> torch>=99 (requirements.txt; a new torch takes "
                   f"minutes), then the rest"], out


@pytest.mark.parametrize("fake", [None, "\x1b[33mWARNING: a warning\x1b[0m\n\x1b[31mERROR: No matching distribution "
                                  "found for torch>=99\x1b[0m\n\x1b[0m\n"])
def test_a_failed_pip_is_told_by_its_error_line_without_colour_codes(fake, tmp_path, monkeypatch):
    """Colab's kernel sets FORCE_COLOR=1, so pip colours its stderr and may end it with a colour code alone:
    the setup cell names pip's first ERROR line, colour codes stripped. Run with the real pip (no index,
    colour forced) and with a stand-in pip whose last line is a lone reset code."""
    import subprocess
    (tmp_path / "otb.py").write_text("")
    (tmp_path / "requirements.txt").write_text("torch>=99  # newer than any\n")
    monkeypatch.setenv("OTB_ROOT", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("FORCE_COLOR", "1")
    if fake is not None:
        monkeypatch.setattr(subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 1, "", fake))
    with pytest.raises(Exception, match="pip could not install") as e:
        exec(compile((EXERCISES / "colab_setup.py").read_text(), "colab_setup.py", "exec"), {"__name__": "cell"})
    why = str(e.value).split(" (", 1)[1]
    assert why.startswith("ERROR: ") and "torch>=99" in why and "\x1b" not in why and "[0m" not in why, why
    assert fake is None or why == "ERROR: No matching distribution found for torch>=99)", why


def test_a_colab_student_grades_a_notebook_of_the_class_copy_pushed_to_git(class_copy, tmp_path, monkeypatch):
    """The recipe of teaching.md: the class copy pushed to a git repository (here a local one), the setup
    cell at the top of a student's notebook (correct answers to Exercise 1), the grade cell at its end.
    Colab's front end, which hands the grade cell the notebook, is played by a stand-in google.colab."""
    from nbclient import NotebookClient
    repo = tmp_path / "otb-class.git"
    shutil.copytree(class_copy, repo)
    git = ["git", "-c", "user.name=teacher", "-c", "user.email=teacher@example.org", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the class copy"]):
        subprocess.run(git + args, check=True, capture_output=True)
    work = _colab(tmp_path, monkeypatch, repo)
    monkeypatch.delenv("OTB_REPO")  # the setup cell clones the URL that handout.py wrote into it
    sol = build.clean(nbformat.read(str(EXERCISES / "solutions" / "01_sum_pi_squared.ipynb"), as_version=4))
    notebook = work / "mine_01.ipynb"
    notebook.write_text(build._dumps(sol))
    handout.add_colab_cells(notebook, str(repo))  # as handout.py --colab writes them into the class copy
    sol = nbformat.read(str(notebook), as_version=4)
    fake = tmp_path / "fake_colab" / "google" / "colab"  # google stays a namespace package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_message.py").write_text(
        "import json, os\n\n\ndef blocking_request(kind, timeout_sec=None, **kwargs):  # the front end's answer\n"
        "    assert kind == 'get_ipynb'\n"
        "    return {'ipynb': json.load(open(os.environ['FAKE_COLAB_NOTEBOOK']))}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "fake_colab"),
                                                                 os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FAKE_COLAB_NOTEBOOK", str(notebook))
    NotebookClient(sol, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    printed = ["".join(o.get("text", "") for o in c.outputs) for c in sol.cells if c.cell_type == "code"]
    assert printed[0].splitlines()[0].endswith("meet requirements.txt; pip installs only the rest of it"), printed[0]
    assert printed[0].splitlines()[-1].startswith(f"the OTB project is in {tmp_path / 'home' / 'otb'}"), printed[0]
    graded = printed[-1]
    for name in ("ex1a_sum_pi_squared", "ex1b_token_energy"):
        assert f"CORRECT   {check.TITLES[name]}" in graded, graded
    assert "2 of 2 checks correct in 1 notebook(s): all done" in graded, graded
    clone = tmp_path / "home" / "otb"
    assert (clone / "notebooks" / "exercises" / "grade.py").is_file()
    assert not (clone / "notebooks" / "exercises" / "solutions").exists()
    assert not (clone / "tests" / "naive.py").exists()


def test_handout_writes_the_colab_cells_into_each_exercise_notebook(tmp_path, capsys):
    """With --colab URL, each exercise notebook of the copy has the setup cell (OTB_REPO = URL) before its
    first code cell and the grade cell last; the grader still recognises it; the other notebooks are as
    they are in the project."""
    url = "https://example.org/our-class/otb.git"
    assert handout.main([str(tmp_path / "copy"), "--colab", url]) == 0
    assert f"cloning {url}" in capsys.readouterr().out
    setup = (EXERCISES / "colab_setup.py").read_text().replace(handout._PLACEHOLDER, url)
    for original in sorted(EXERCISES.glob("0*.ipynb")):
        nb = nbformat.read(str(tmp_path / "copy" / "notebooks" / "exercises" / original.name), as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        blank = [c.source for c in nbformat.read(str(original), as_version=4).cells if c.cell_type == "code"]
        assert code == [setup] + blank + [(EXERCISES / "colab_grade.py").read_text()], original.name
        assert grade.kind_of(nb) == original.stem
    assert (tmp_path / "copy" / "notebooks" / "01_toy_bandit.ipynb").read_bytes() == \
        (ROOT / "notebooks" / "01_toy_bandit.ipynb").read_bytes()


def test_handout_refuses_a_folder_inside_the_project_or_one_that_is_not_empty(tmp_path):
    with pytest.raises(SystemExit):
        handout.write(ROOT / "notebooks" / "class_copy")
    (tmp_path / "something").write_text("x")
    with pytest.raises(SystemExit):
        handout.write(tmp_path)


# =====================================================================================
# 4. The Colab / JupyterHub setup cell, run from outside the project
# =====================================================================================

def test_teaching_md_shows_the_colab_cells_as_they_are_stored_and_says_where_the_class_copy_lives():
    assert (EXERCISES / "colab_setup.py").read_text() in TEACHING
    assert (EXERCISES / "colab_grade.py").read_text() in TEACHING
    colab = _flat(TEACHING[TEACHING.index("### Colab or JupyterHub"):TEACHING.index("## Tutorials")])
    assert "must clone the class copy, not the public project" in colab and "git push" in colab


def test_the_setup_cell_runs_a_tutorial_from_a_copy_outside_the_project(tmp_path, monkeypatch):
    """As in Colab: the notebook alone in a folder, the setup cell first. OTB_REPO is this repository
    (a local clone: nothing is downloaded) and pip is told not to use an index, so it only confirms
    that requirements.txt is satisfied."""
    from nbclient import NotebookClient
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: nothing to clone")
    work = _colab(tmp_path, monkeypatch, ROOT)
    nb = nbformat.read(str(ROOT / "notebooks" / "01_toy_bandit.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        c.outputs = []
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = nb.cells[:first] + [nbformat.v4.new_code_cell((EXERCISES / "colab_setup.py").read_text())] + \
        nb.cells[first:first + 4]  # the setup cell, the tutorial's first cell and section 1
    (work / "01_toy_bandit.ipynb").write_text(nbformat.writes(nb))
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "the OTB project is in" in out and str(tmp_path / "home" / "otb") in out
    assert "meet requirements.txt; pip installs only the rest of it" in out
    assert "255 responses" in out and "max |autograd grad J - E[R S]|" in out
    assert (tmp_path / "home" / "otb" / "otb.py").is_file()
