"""Write the teaching assistants' table: every hint the grader can print, and the slips that lead there.

    python notebooks/exercises/ta_table.py          # rewrite notebooks/exercises/ta_table.md
    python notebooks/exercises/ta_table.py --check  # exit 1 if the stored table is out of date or a row
                                                    # lists neither a slip nor a 'when:'

Every hint that check.py and grade.py can print is written ``H("...")`` in their source; this script
reads them all from there (a field of an f-string is shown as <field>), in the order of the files, under
the exercise whose section of check.py holds them. Then it runs every slip of the catalogue
(solutions/slips.py: a right answer with one change) through its check and writes each slip, with the
case that failed, next to the hint its verdict printed. A teaching assistant reads the table from the
hint a student quotes to the slips that lead there.

Some hints no slip reaches, by design: grade.py's own lines (a check cell deleted, a loop that never
ends), each check's fallback for a result that none of its named slips explains, and the guards on the
project's own code. A comment ``# when: ...`` on the line above such an H(...) call, or at the end of one
of its lines, says what prints it, and the table lists that instead. Every row lists one or the other: a
row that lists neither is a hint for a mistake the catalogue does not hold, and both commands name it and
exit 1 (add the slip to solutions/slips.py, or merge the hint into one that a slip reaches). The test
suite regenerates the table and compares it with the stored one; a hint that a slip's verdict prints but
no ``H(...)`` matches stops the generation.

A slip's case can quote what the check printed, a float32 mean among it, whose later digits are the
CPU's: slip 3e's ``adv_mean is -0.00710393``, as the machine that first made this table printed it, is
-0.00710392 on an Intel Xeon with AVX-512 and -0.00710394 under ATen's unvectorised kernels. A teaching
assistant needs the sign and the size, not the eighth digit: where a slip's verdict names no case, the column quotes what the check
printed with three significant digits of each longer number (``-0.0071``). And ``--check`` and the test compare the words and integers exactly and each number to one
unit of its last printed digit (``lab.machine.rounding_moves``), for a value that sits on a rounding
boundary; a changed hint or slip is a changed word.

The catalogue gives the answers away, so a class copy (handout.py) leaves out this script, the
catalogue and the table.
"""
import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "solutions"))

import slips  # noqa: E402  (it puts the project and check.py on the path)
from lab.machine import rounding_moves  # noqa: E402

TABLE = HERE / "ta_table.md"
SOURCES = (HERE / "check.py", HERE / "grade.py")
_CASE = re.compile(r"on the case '([^']*)'")
_FRACTION = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")  # a number the check printed with a fraction


def _three_digits(text):
    """``text`` with each number printed with a fraction and more than three significant digits rounded to
    three (-0.00710393 -> -0.0071); shorter ones (a case's junk 7.0) and integers as they are."""
    def short(m):
        digits = m.group().lstrip("-").split("e")[0].split("E")[0].replace(".", "").lstrip("0")
        return f"{float(m.group()):.3g}" if len(digits) > 3 else m.group()
    return _FRACTION.sub(short, text)
_SECTION = re.compile(r"^# (Exercise \w+)")
_WHEN = re.compile(r"#\s*when:\s*(.+)")


def _template(node):
    """The text of the argument of an H(...) call, an f-string's fields written <field>."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else f"<{ast.unparse(v.value)}>" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _template(node.left) + _template(node.right)
    raise ValueError(f"H() needs a string literal or f-string, got {ast.unparse(node)}")


def hints(sources=SOURCES):
    """[(section, template)] of every H(...) in ``sources``, in order, each template once; section: the
    'Exercise N' header of check.py above it, 'every exercise' before the first, 'grade.py' there."""
    out, seen = [], set()
    for path in sources:
        text = path.read_text()
        headers = [(k + 1, m.group(1)) for k, line in enumerate(text.splitlines()) if (m := _SECTION.match(line))]
        calls = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Name) and node.func.id == "H"]
        for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
            template = _template(node.args[0])
            if template in seen:
                continue
            seen.add(template)
            section = path.name if path.name != "check.py" else \
                next((name for line, name in reversed(headers) if line < node.lineno), "every exercise")
            out.append((section, template))
    return out


def situations(sources=SOURCES):
    """{template: [situation]}: the ``# when: ...`` comments of each H(...) call, on the line above it or
    at the end of one of its lines, in order (an H(...) written twice gathers both)."""
    out = {}
    for path in sources:
        text = path.read_text()
        comments = {tok.start[0]: m.group(1).strip() for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                    if tok.type == tokenize.COMMENT and (m := _WHEN.match(tok.string))}
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "H":
                above = node.lineno - 1 if lines[node.lineno - 2].lstrip().startswith("#") else None
                found = [comments[k] for k in (above, *range(node.lineno, node.end_lineno + 1)) if k in comments]
                out.setdefault(_template(node.args[0]), []).extend(found)
    return out


def _matcher(template):
    """A regex matching what a template prints: its text, and any text for each <field>."""
    parts = re.split(r"(<[^<>]+>)", template)
    return re.compile("".join(".+?" if p.startswith("<") and p.endswith(">") else re.escape(p) for p in parts) + r"\Z",
                      re.DOTALL)


def slip_rows(en=None):
    """[(exercise, slip, case, hint)] for every slip, in the catalogue's order."""
    if en is None and any(s.toy for s in slips.SLIPS):
        import toy_env
        en = toy_env.enumerate_toy(toy_env.ToyConfig())
    out = []
    for slip in slips.SLIPS:
        _, text = slips.run(slip, en)
        lines = text.splitlines()
        problem = next((ln.split("problem:", 1)[1].strip() for ln in lines if "problem:" in ln), "")
        hint = next((ln.split("hint:", 1)[1].strip() for ln in lines if "hint:" in ln), "")
        case = _CASE.search(problem)
        # a named case is check.py's own words; otherwise what the check printed, measured numbers among it
        out.append((slip.exercise, slip.what, case.group(1) if case else _three_digits(problem)[:80], hint))
    return out


def rows(en=None):
    """[(section, hint template, [(exercise, slip, case)])]: every hint, with the slips whose verdict
    prints it. SystemExit if a slip prints a hint that no H(...) matches (it would be missing here)."""
    table = [(section, template, []) for section, template in hints()]
    matchers = [_matcher(template) for _, template, _ in table]
    for exercise, what, case, hint in slip_rows(en):
        # The most literal template that matches: a hint with fields yields to one without.
        found = [k for k, m in enumerate(matchers) if m.match(hint)]
        if not found:
            raise SystemExit(f"ta_table.py: the hint of slip {exercise} '{what}' is not written H(...) in "
                             f"check.py: {hint}")
        k = max(found, key=lambda j: len(re.sub(r"<[^<>]+>", "", table[j][1])))
        table[k][2].append((exercise, what, case))
    return table


def unlisted(table, when=None):
    """The hints of ``table`` (from rows) that list neither a slip nor a '# when:' situation."""
    when = situations() if when is None else when
    return [template for _, template, found in table if not found and not when.get(template)]


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def render(table, when=None):
    """ta_table.md's text for ``table`` (from rows), with ``when``, the '# when:' situations (situations())."""
    when = situations() if when is None else when
    n_slips = sum(len(s) for _, _, s in table)
    lines = ["# Hint -> slips: what the grader says, for teaching assistants", "",
             "Generated by `python notebooks/exercises/ta_table.py` from `check.py`, `grade.py` and the slips in",
             "`solutions/slips.py` (do not edit by hand; the test suite compares). Every hint a student can see",
             "is a row, in the order of `check.py`; `<...>` stands for what the grader fills in. The last column",
             "lists the slips of the catalogue whose verdict prints that hint, with the case that fails first.",
             "No slip reaches grade.py's own lines, a check's fallback for a result that none of its named slips",
             "explains, or a guard on the project's own code: their rows say, after 'when:', what prints them.",
             "Not for students: the slips are right answers with one change.", "",
             f"{len(table)} hints, {n_slips} slips.", "",
             "| where | hint the student sees | slips that lead there (case that fails) |", "|---|---|---|"]
    for section, template, found in table:
        leads = "; ".join([f"{ex}: {what} ({case})" for ex, what, case in found] +
                          [f"when: {situation}" for situation in when.get(template, [])]) or "none in the catalogue"
        lines.append(f"| {_cell(section)} | {_cell(template)} | {_cell(leads)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if ta_table.md is out of date or a row lists neither a slip nor a when:")
    args = parser.parse_args(argv)
    table, when = rows(), situations()
    text = render(table, when)
    if args.check:
        stale = not TABLE.exists() or rounding_moves(TABLE.read_text(), text) is None
        print("out of date: run python notebooks/exercises/ta_table.py" if stale else "ta_table.md is up to date")
    else:
        stale = False
        TABLE.write_text(text)
        print(f"wrote {TABLE.relative_to(HERE.parent.parent)} ({len(table)} hints, "
              f"{sum(len(s) for _, _, s in table)} slips)")
    missing = unlisted(table, when)
    if missing:
        print(f"rows that list no slip and no 'when:' ({len(missing)}): add a slip to solutions/slips.py that "
              f"prints the hint, merge the hint into one that a slip reaches, or, if no slip can reach it, say "
              f"when it is printed in a '# when: ...' comment:")
        print("\n".join(f"  {template}" for template in missing))
    return int(stale or bool(missing))


if __name__ == "__main__":
    sys.exit(main())
