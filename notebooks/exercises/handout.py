"""Write a class copy of the project: everything a student needs, no answers.

    python notebooks/exercises/handout.py /tmp/otb-class          # then share /tmp/otb-class
    python notebooks/exercises/handout.py /tmp/otb-class --force  # replace an earlier copy
    python notebooks/exercises/handout.py /tmp/otb-class --colab https://github.com/YOUR-ORG/otb-class.git

The copy holds the project's files (those git tracks, plus new files it does not ignore; without git,
every file except caches and runs) minus:

* ``notebooks/exercises/solutions/`` (the answer keys and the catalogue of slips),
* the teaching assistants' table and its generator (``ta_table.md``, ``ta_table.py``),
* every test that holds working answers to the exercises (``tests/test_notebooks_exercises.py``, the
  ``tests/test_notebooks_teaching_*.py`` files, and any other test that imports the solutions or slips),
* ``tests/naive.py``, whose plain loops compute the group mean, RLOO, OTB and OTB by action (the answers
  to Exercises 2, 3 and 5), and every test that imports it, directly or through another test,
* in ``docs/teaching.md``, the text between ``<!-- BEGIN ANSWERS -->`` and ``<!-- END ANSWERS -->``
  (the answers to the quiz and to the discussion questions).

With ``--colab URL`` (the git URL the copy will be pushed to), each exercise notebook of the copy gets
the Colab cells itself: the setup cell (``colab_setup.py``, its ``OTB_REPO`` set to URL) before its first
code cell and the grade cell (``colab_grade.py``) at its end, so the lecturer edits no notebook by hand.

The blank notebooks, ``check.py`` and ``grade.py`` stay, so the copy grades: ``python
notebooks/exercises/grade.py`` inside it works as in the full project. The project's own functions stay
too (``otb.py``, the benchmarks' loops): an answer that calls one of them is graded NOT YET.
"""
import ast
import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

LEFT_OUT = ("notebooks/exercises/solutions/", "notebooks/exercises/ta_table.md", "notebooks/exercises/ta_table.py",
            "notebooks/exercises/backups/", "tests/test_notebooks_exercises.py", "tests/test_notebooks_teaching_")
ANSWER_MODULES = ("naive",)  # modules of tests/ that compute the exercises' answers
_ANSWERS = re.compile(r"<!-- BEGIN ANSWERS -->.*?<!-- END ANSWERS -->", re.DOTALL)
_PLACEHOLDER = "https://github.com/YOUR-ORG/otb-class.git"  # the OTB_REPO that colab_setup.py ships with
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "runs", ".venv", "venv"}


def project_files(root=ROOT):
    """Relative paths of the project's files: git's tracked and unignored files, or a walk of the tree."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        return sorted({p for p in out.split("\0") if p and (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(root).parts))


def _imports(path):
    """The top-level module names a Python file imports (empty if it does not parse)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def answer_tests(root=ROOT):
    """The modules of tests/ that hold or import the answers: ANSWER_MODULES, and every test module that
    imports one of them, directly or through another (test_naive_holes imports test_naive_otb, which
    imports naive)."""
    modules = {p.stem: _imports(p) for p in (root / "tests").glob("*.py")}
    out = set(ANSWER_MODULES) & set(modules)
    while True:
        more = {name for name, imported in modules.items() if name not in out and imported & out}
        if not more:
            return out
        out |= more


def holds_answers(rel, root=ROOT, answers=None):
    """True for a file the class copy leaves out; ``answers``: answer_tests(root), if computed already."""
    if rel.startswith(LEFT_OUT):
        return True
    if rel.startswith("tests/") and rel.endswith(".py"):
        if rel.count("/") == 1 and Path(rel).stem in (answer_tests(root) if answers is None else answers):
            return True
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        return "solutions" in text and "exercises" in text or "import slips" in text
    return False


def add_colab_cells(path, url, root=ROOT):
    """Put the Colab setup cell (OTB_REPO = ``url``) before the first code cell of the notebook at ``path``
    and the grade cell at its end, both from ``root``'s notebooks/exercises/ (the notebook is rewritten)."""
    import nbformat
    setup = (root / "notebooks" / "exercises" / "colab_setup.py").read_text(encoding="utf-8")
    if _PLACEHOLDER not in setup:
        raise SystemExit(f"handout.py: colab_setup.py no longer holds {_PLACEHOLDER} to replace with {url}")
    nb = nbformat.read(str(path), as_version=4)
    first = next(k for k, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first, nbformat.v4.new_code_cell(setup.replace(_PLACEHOLDER, url)))
    nb.cells.append(nbformat.v4.new_code_cell(
        (root / "notebooks" / "exercises" / "colab_grade.py").read_text(encoding="utf-8")))
    nbformat.write(nb, str(path))


def write(out, root=ROOT, force=False, colab=None):
    """Write the class copy into ``out``; returns the relative paths written. ``colab``: the git URL the
    copy will be pushed to, to write the Colab cells into its exercise notebooks (add_colab_cells)."""
    out = Path(out).resolve()
    if out == root.resolve() or root.resolve() in out.parents:
        raise SystemExit(f"handout.py: {out} is inside the project; choose a folder outside it")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise SystemExit(f"handout.py: {out} is not empty (use --force to replace it)")
        shutil.rmtree(out)
    written, answers = [], answer_tests(root)
    for rel in project_files(root):
        if holds_answers(rel, root, answers):
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel == "docs/teaching.md":
            text = (root / rel).read_text(encoding="utf-8")
            target.write_text(_ANSWERS.sub("*The answers are in the lecturer's copy of the project.*", text),
                              encoding="utf-8")
        else:
            shutil.copy2(root / rel, target)
        if colab and re.fullmatch(r"notebooks/exercises/0\w*\.ipynb", rel):
            add_colab_cells(target, colab, root)
        written.append(rel)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write the class copy into (outside the project)")
    parser.add_argument("--force", action="store_true", help="replace the folder if it is not empty")
    parser.add_argument("--colab", metavar="URL",
                        help="the git URL the copy will be pushed to: write the Colab setup cell (cloning URL) and "
                             "the grade cell into each exercise notebook of the copy")
    args = parser.parse_args(argv)
    written = write(args.out, force=args.force, colab=args.colab)
    print(f"wrote {len(written)} files to {args.out.resolve()}: no solutions, no tests that hold answers. "
          f"Students grade with: python notebooks/exercises/grade.py. "
          + (f"The exercise notebooks hold the Colab cells, cloning {args.colab}: push the copy there"
             if args.colab else "For Colab, write it again with --colab URL, the git repository of the class "
                                "it will be pushed to (docs/teaching.md)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
