"""Build the student notebooks from the solution notebooks, so the two cannot drift.

The solution notebooks in ``solutions/`` are the single source. A teacher edits a solution
notebook (in Jupyter or any editor), then runs

    python notebooks/exercises/build.py          # rewrite the blank notebooks, strip outputs
    python notebooks/exercises/build.py --check  # exit 1 if a blank notebook is out of date

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
import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE / "solutions"

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


def make_blank(solution_nb):
    """The student version of a (cleaned) solution notebook."""
    nb = nbformat.from_dict(clean(nbformat.from_dict(solution_nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = blank_code(cell.source)
        elif cell.cell_type == "markdown":
            cell.source = _MD_BLOCK.sub("*Your answer here.*", cell.source)
    return nb


def _dumps(nb) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def expected_files():
    """{path: text} for every notebook this script owns (cleaned solutions and blanks)."""
    files = {}
    for sol_path in sorted(SOLUTIONS.glob("*.ipynb")):
        sol = clean(nbformat.read(str(sol_path), as_version=4))
        files[sol_path] = _dumps(sol)
        files[HERE / sol_path.name] = _dumps(make_blank(sol))
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if a stored notebook differs from what would be built")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(HERE)))
    if args.check and stale:
        print("run: python notebooks/exercises/build.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
