"""Build the student notebooks from the solution notebooks, so the two cannot drift.

The solution notebooks in ``solutions/`` are the single source. A teacher edits a solution
notebook (in Jupyter or any editor), then runs

    python notebooks/exercises/build.py          # rewrite the blank notebooks, strip outputs
    python notebooks/exercises/build.py --check  # exit 1 if a blank notebook is out of date
    python notebooks/exercises/build.py --force  # also overwrite blanks that someone filled in

Students never need this script: they check their answers with ``grade.py``, which changes
nothing. build.py refuses to overwrite a blank notebook whose cells were edited since it was built
(a student's answers), unless given ``--force``; forced, it first copies the edited notebook to
``backups/`` with the time in its name. It tells the two apart by a fingerprint of the cells that it
stores in each blank notebook's metadata (``otb_exercise.built``) when it writes it.

Markers inside the solution notebooks (the convention nbgrader made familiar):

* code cells::

      # TODO(student): what to compute, with a hint      <- kept in both versions
      ### BEGIN SOLUTION
      ... the answer ...                                  <- removed from the blank version
      ### END SOLUTION

  The block becomes ``return None  # TODO(student): fill in the lines above`` at the marker's
  indentation. ``### BEGIN SOLUTION (blank: answer = None)`` picks another placeholder, for
  blanks that are not function bodies. Returning ``None`` (not raising) is deliberate: the check
  cell then says "not yet correct" with a hint instead of the notebook crashing.
* markdown cells: ``<!-- BEGIN SOLUTION -->`` ... ``<!-- END SOLUTION -->`` becomes
  ``*Your answer here.*``.

Both versions are written without outputs; the test suite executes them.
"""
import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

_BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?: \(blank: (?P<blank>.*)\))?\s*$")
_END = re.compile(r"^\s*### END SOLUTION\s*$")
_MD_BLOCK = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->", re.DOTALL)


def blank_code(source: str) -> str:
    """Replace every BEGIN/END SOLUTION block of a code cell by its placeholder line."""
    out, inside = [], False
    for line in source.split("\n"):
        begin = _BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
            placeholder = begin.group("blank") or "return None"
            out.append(f"{begin.group('indent')}{placeholder}  # TODO(student): fill in the lines above")
        elif _END.match(line):
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "\n".join(out)


def clean(nb):
    """Drop outputs, execution counts and editor metadata so the stored files are stable."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        tags = cell.get("metadata", {}).get("tags")
        cell.metadata = {"tags": tags} if tags else {}
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def fingerprint(nb):
    """A hash of what a student edits: the type and source of every cell (not outputs or metadata)."""
    cells = [[c.cell_type, c.source] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def make_blank(solution_nb):
    """The student version of a (cleaned) solution notebook, carrying the fingerprint of its cells."""
    nb = nbformat.from_dict(clean(nbformat.from_dict(solution_nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = blank_code(cell.source)
        elif cell.cell_type == "markdown":
            cell.source = _MD_BLOCK.sub("*Your answer here.*", cell.source)
    nb.metadata["otb_exercise"] = {"built": fingerprint(nb)}
    return nb


def edited_since_built(path, built):
    """True if the blank notebook at ``path`` has cells that are neither those of ``built`` (the blank
    about to be written) nor those build.py stored it with (its fingerprint): someone's answers. A
    notebook without a fingerprint counts as edited unless its cells are those of ``built``."""
    nb = nbformat.read(str(path), as_version=4)
    now = fingerprint(nb)
    return now not in (nb.metadata.get("otb_exercise", {}).get("built"), fingerprint(built))


def _dumps(nb) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def expected_files(folder=HERE):
    """{path: text} for every notebook this script owns (cleaned solutions and blanks) in ``folder``."""
    files = {}
    for sol_path in sorted((folder / "solutions").glob("*.ipynb")):
        sol = clean(nbformat.read(str(sol_path), as_version=4))
        files[sol_path] = _dumps(sol)
        files[folder / sol_path.name] = _dumps(make_blank(sol))
    return files


def backup(path):
    """Copy ``path`` to backups/<name>.<UTC time>.ipynb next to it; returns the copy's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.parent / "backups" / f"{path.stem}.{stamp}{path.suffix}"
    k = 1
    while target.exists():  # two backups within one second
        target, k = path.parent / "backups" / f"{path.stem}.{stamp}-{k}{path.suffix}", k + 1
    target.parent.mkdir(exist_ok=True)
    shutil.copy2(path, target)
    return target


def main(argv=None, folder=HERE):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if a stored notebook differs from what would be built")
    parser.add_argument("--force", action="store_true",
                        help="also overwrite blank notebooks whose cells were edited (a copy of each goes to "
                             "backups/ first)")
    args = parser.parse_args(argv)
    files = expected_files(folder)
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print("out of date: " + str(path.relative_to(folder)))
        if stale:
            print("run: python notebooks/exercises/build.py")
        return 1 if stale else 0
    blanks = {folder / p.name for p in (folder / "solutions").glob("*.ipynb")}
    edited = [p for p in stale if p in blanks and p.exists() and edited_since_built(p, nbformat.reads(files[p], 4))]
    if edited and not args.force:
        for path in edited:
            print(f"refusing to overwrite {path.relative_to(folder)}: its cells were edited since it was built "
                  f"(answers filled in?)", file=sys.stderr)
        print("students: check answers with `python notebooks/exercises/grade.py`, which changes nothing. "
              "Teachers: `build.py --force` overwrites them and keeps a copy in backups/.", file=sys.stderr)
        return 1
    for path in stale:
        if path in edited:
            print(f"backed up {path.relative_to(folder)} to {backup(path).relative_to(folder)}")
        path.write_text(files[path])
        print("wrote " + str(path.relative_to(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
