"""How many lines does a reader follow through one training step? Measured, not guessed.

    python benchmarks/reading_guide.py            # trace one default step, write docs/reading_guide.md
    python benchmarks/reading_guide.py --check    # exit 1 if docs/reading_guide.md is not what a trace writes

The measure (the one the design card keeps small): run one default ``train.train_step``
(``--estimator otb``, the tiny model, the reversal task, plain decoding) under ``sys.setprofile``,
collect every function of the project that is entered while it runs (the root modules and lab/,
not tests/ or benchmarks/), and add up

    lines = sum over entered files f of | union of the line spans of f's entered functions |
                                        + the lines of f's module docstring

A function's span runs from its first line (a decorator's, if any) to its last; a function nested
in another one, a lambda or a comprehension falls inside its parent's span and adds nothing more.
The guide lists the path in reading order (the order in which each function is first entered), with
the first sentence of each docstring (of a short function without one, the comment on its def line),
so a reader can follow the step with the guide beside them.
"""
import argparse
import ast
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GUIDE = ROOT / "docs" / "reading_guide.md"
GOAL = 420  # lines: the most the traced path may take (the design goal; tests/test_e2e_layout.py)
# The smallest settings that keep the default path (model class, task, estimator, decode): the tiny
# model is smaller and its warm-up shorter, which changes the numbers but not one function entered.
TRACE_ARGS = ["--estimator", "otb", "--steps", "1", "--tiny-hidden", "32", "--tiny-layers", "1",
              "--warmup-max-steps", "20", "--checkpoint-minutes", "1000"]


def project_file(filename):
    """The project's source file, relative to the root, if ``filename`` is one that counts; else None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.suffix != ".py" or rel.parts[0] in ("tests", "benchmarks", "notebooks"):
        return None
    return rel if len(rel.parts) == 1 or rel.parts[0] == "lab" else None


def trace_step(argv=TRACE_ARGS):
    """[(file, first line, name)] of every project function entered during one train_step, in
    the order each was first entered."""
    import train

    entered, seen = [], set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        rel = project_file(code.co_filename)
        key = (rel, code.co_firstlineno)
        if rel is not None and key not in seen:
            seen.add(key)
            entered.append((rel, code.co_firstlineno, code.co_qualname))

    step = train.train_step

    def traced_step(*args, **kwargs):
        sys.setprofile(profile)
        try:
            return step(*args, **kwargs)
        finally:
            sys.setprofile(None)

    train.train_step = traced_step
    try:
        with tempfile.TemporaryDirectory() as out:
            train.main([*argv, "--out", out])
    finally:
        train.train_step = step
    return entered


def spans(rel):
    """{first line: (last line, node)} of every function of a file (its first line: a decorator's)."""
    tree = ast.parse((ROOT / rel).read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            found[first] = (node.end_lineno, node)
            found.setdefault(node.lineno, (node.end_lineno, node))  # a code object's own first line
    return found, tree


def docstring_lines(node):
    """The line numbers of a parsed module's or function's docstring (none without one)."""
    body = node.body if isinstance(getattr(node, "body", None), list) else []  # a lambda's body is one expression
    doc = body[0] if body and isinstance(body[0], ast.Expr) else None
    is_doc = doc is not None and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    return set(range(doc.lineno, doc.end_lineno + 1)) if is_doc else set()


def measure(entered):
    """(total lines, per-file lines, path): the path is [(file, name, first, last, summary)]."""
    lines, path, parsed = {}, [], {}
    for rel, first, name in entered:
        if rel not in parsed:  # each file read and parsed once
            parsed[rel] = (*spans(rel), (ROOT / rel).read_text().splitlines())
            lines[rel] = docstring_lines(parsed[rel][1])
        found, _, source = parsed[rel]
        if first not in found:  # a module body or class body: not a function on the path
            continue
        last, node = found[first]
        covered = set(range(first, last + 1))
        if covered <= lines[rel] and "<" in name:
            continue  # a comprehension or lambda inside a function already on the path
        lines[rel] |= covered
        summary = ""
        if not isinstance(node, ast.Lambda):
            summary = (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
            summary = re.split(r"(?<!\beq)\.\s+(?=[A-Z])", summary)[0].rstrip(".")  # "eq. (5)" ends nothing
            if not summary:  # a short function without a docstring says what it does in a comment on its def line
                summary = source[node.lineno - 1].partition("  # ")[2].strip()
        path.append((rel, name, first, last, summary))
    per_file = {str(rel): len(ls) for rel, ls in lines.items()}
    return sum(per_file.values()), per_file, path


def function_docstring_lines(path):
    """How many of the path's lines are the docstrings of its functions."""
    found = {rel: spans(rel)[0] for rel in {p[0] for p in path}}  # each file parsed once
    return sum(len(docstring_lines(found[rel][first][1])) for rel, _, first, _, _ in path)


def render(total, per_file, path):
    """The text of docs/reading_guide.md."""
    docs = sum(len(docstring_lines(ast.parse((ROOT / f).read_text()))) for f in per_file)
    function_docs = function_docstring_lines(path)
    out = ["# Reading guide: one training step, in the order it runs", "",
           "Written by `python benchmarks/reading_guide.py` from a trace of one default `train.train_step`",
           "(`--estimator otb`, the tiny model, the reversal task, plain decoding): every function of the",
           "project entered while the step runs, in the order it is first entered. Read them in this order;",
           "nothing else in the project is on the path. `tests/test_e2e_layout.py` keeps this page true.",
           "", f"**{total} lines in {len(per_file)} files** (the design goal: at most {GOAL}), counted as the union of the",
           f"entered functions' lines plus each file's module docstring. Of the {total} lines, {docs} are the four",
           f"module docstrings, which tell the story and name the equations, {function_docs} are the docstrings of",
           f"the functions, and {total - docs - function_docs} are code and its comments.", "",
           "| file | lines |", "|---|---|"]
    out += [f"| {f} | {n} |" for f, n in per_file.items()]
    out += ["", "| # | file | function | lines | what it does |", "|---|---|---|---|---|"]
    for i, (rel, name, first, last, summary) in enumerate(path, 1):
        out.append(f"| {i} | {rel} | `{name}` | {last - first + 1} | {summary.replace('|', '/')} |")
    out += ["", "What is not on the path, and where it lives: the command line (lab/train_cli.py,",
            "lab/parse_options.py), the run folder and checkpoints (lab/runs.py), comparisons (lab/compare.py),",
            "the preflight, the optional decoders, the learning-rate schedules and the statistics (lab/). See",
            "lab/__init__.py for the map. otb's input checks are off the path too: the step calls the estimator",
            "with `check=False`, since its tensors come from rollout.score (otb.py, \"Input checks\"), and",
            "tasks.rewards checks the task's rewards.", ""]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="do not write: exit 1 if docs/reading_guide.md differs from what a trace writes")
    args = p.parse_args(argv)
    total, per_file, path = measure(trace_step())
    text = render(total, per_file, path)
    if args.check:
        same = GUIDE.is_file() and GUIDE.read_text() == text
        print(f"{GUIDE.relative_to(ROOT)}: {'up to date' if same else 'STALE: run python benchmarks/reading_guide.py'}"
              f" ({total} lines traced)")
        return 0 if same else 1
    GUIDE.write_text(text)
    print(f"{total} lines in {len(per_file)} files -> {GUIDE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
