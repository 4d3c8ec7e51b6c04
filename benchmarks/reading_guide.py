"""How many lines does a reader follow through one training step? Measured, and reported.

    python benchmarks/reading_guide.py            # trace one default step, write docs/reading_guide.md
    python benchmarks/reading_guide.py --check    # exit 1 if docs/reading_guide.md is not what a trace writes

The measure, the way the anchors (tiny-grpo, CleanRL, nanoGPT) are counted: run one default
``train.train_step`` (``--estimator otb``, the tiny model, the reversal task, plain decoding) under
``sys.setprofile`` and collect, in the project's own files (the root modules and lab/, not tests/ or
benchmarks/),

- every function entered while the step runs;
- every class the step builds or reads: the class of an instance that an entered function receives
  or returns (``Config``, ``Rollout``, ``StepResult``, the task, the decoder);
- the fields of the configuration the step reads (``cfg.x``, recorded by a spy on the ``cfg`` it is
  given), and the class that declares each one;

and add up

    lines = sum over files f of | the union of f's counted lines |,   counted lines:
            the span of every entered function (a decorator's line included; a function nested in
              another one, a lambda or a comprehension falls inside its parent's span)
            the body of every class the step builds or reads, less the methods the step does not enter
            of a base class of those (``Task``, the options ``Config`` inherits), if the step enters one
              of its methods or reads one of its fields: its header and docstring, and those fields
            the module docstring of every file on the path

The number is a report, not a target: a change that lengthens the path shows in the guide's diff,
where a reviewer sees it. The guide lists the path in reading order (the order in which each function
is first entered), with the first sentence of each docstring (of a short function without one, the
comment on its def line), so a reader can follow the step with the guide beside them. The input
checks come last, in a section of their own: a checker (a function whose name begins with ``_check``,
such as otb.py's ``_checked_inputs``) and every function the step enters only while a checker runs.
They are on the path and counted; the section only lets the mathematics be read first.
"""
import argparse
import ast
import copy
import re
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GUIDE = ROOT / "docs" / "reading_guide.md"
# The smallest settings that keep the default path (model class, task, estimator, decode): the tiny
# model is smaller and its warm-up shorter, which changes the numbers but not one function entered.
TRACE_ARGS = ["--estimator", "otb", "--steps", "1", "--tiny-hidden", "32", "--tiny-layers", "1",
              "--warmup-max-steps", "20", "--checkpoint-minutes", "1000"]


def project_file(filename):
    """The project's source file, relative to the root, if ``filename`` is one that counts; else None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except (ValueError, TypeError):
        return None
    if rel.suffix != ".py" or rel.parts[0] in ("tests", "benchmarks", "notebooks"):
        return None
    return rel if len(rel.parts) == 1 or rel.parts[0] == "lab" else None


def class_file(cls):
    """The project file that defines ``cls``, relative to the root, or None."""
    module = sys.modules.get(getattr(cls, "__module__", None))
    return project_file(getattr(module, "__file__", None))


def project_classes(value):
    """[(file, qualname)] of the project classes in the method order of ``value``'s type: its own
    class first, then its bases (tuples and lists: of each item)."""
    if isinstance(value, (tuple, list)):
        return [c for v in value for c in project_classes(v)]
    return [(rel, cls.__qualname__) for cls in type(value).__mro__ if (rel := class_file(cls)) is not None]


def is_checker(code):
    """Whether a code object is one of the project's input checkers (its name begins with ``_check``)."""
    return code.co_name.startswith("_check") and project_file(code.co_filename) is not None


def in_a_check(frame):
    """Whether ``frame`` runs a checker or runs inside one (a checker further up its stack)."""
    while frame is not None:
        if is_checker(frame.f_code):
            return True
        frame = frame.f_back
    return False


def trace_step(argv=TRACE_ARGS):
    """(entered, classes, fields_read) of one train_step: entered, [(file, first line, name, check)] of
    every project function entered, in the order each was first entered, check True for one entered only
    while a checker ran (``in_a_check``); classes, {(file, qualname): own}
    of every project class the step builds or reads (own: the class of such an instance, not only a
    base of it); fields_read, the names of the configuration's fields the step reads."""
    import train

    entered, outside, classes, reads = [], {}, {}, set()  # outside: key -> entered outside a checker

    def note(value):
        for i, key in enumerate(project_classes(value)):
            classes[key] = classes.get(key, False) or i == 0

    def profile(frame, event, arg):
        code = frame.f_code
        rel = project_file(code.co_filename)
        if rel is None:
            return
        if event == "call":
            key = (rel, code.co_firstlineno)
            if key not in outside:
                entered.append((rel, code.co_firstlineno, code.co_qualname))
            outside[key] = outside.get(key, False) or not in_a_check(frame)
            for value in list(frame.f_locals.values()):  # the arguments, at the call
                note(value)
        elif event == "return":
            note(arg)

    step = train.train_step

    def traced_step(cfg, *args, **kwargs):
        names = {f.name for f in fields(cfg)}

        class Spy(type(cfg)):  # the same configuration, recording the fields read
            def __getattribute__(self, name):
                if name in names:
                    reads.add(name)
                return super().__getattribute__(name)

        spy = copy.copy(cfg)
        spy.__class__ = Spy
        sys.setprofile(profile)
        try:
            return step(spy, *args, **kwargs)
        finally:
            sys.setprofile(None)

    train.train_step = traced_step
    try:
        with tempfile.TemporaryDirectory() as out:
            train.main([*argv, "--out", out])
    finally:
        train.train_step = step
    classes = {(rel, name): own for (rel, name), own in classes.items() if not name.endswith("Spy")}
    return [(rel, first, name, not outside[(rel, first)]) for rel, first, name in entered], classes, reads


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
    """The line numbers of a parsed module's, class's or function's docstring (none without one)."""
    body = node.body if isinstance(getattr(node, "body", None), list) else []  # a lambda's body is one expression
    doc = body[0] if body and isinstance(body[0], ast.Expr) else None
    is_doc = doc is not None and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    return set(range(doc.lineno, doc.end_lineno + 1)) if is_doc else set()


def find_class(tree, qualname):
    """The ClassDef node of ``qualname`` in a parsed file (a nested class by its dotted name), or None."""
    body = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def first_sentence(node):
    """The first sentence of a node's docstring ("eq. (5)" ends nothing), on one line."""
    summary = (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
    return re.split(r"(?<!\beq)\.\s+(?=[A-Z])", summary)[0].rstrip(".")


def class_lines(node, own, entered_firsts, fields_read):
    """The lines of a class that count: an own class's body less the methods not entered; a base
    class's header (decorators and class line), docstring and the statements declaring fields read."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if own:
        lines = set(range(first, node.end_lineno + 1))
        for m in methods:
            m_first = min([m.lineno, *(d.lineno for d in m.decorator_list)])
            if m_first not in entered_firsts and m.lineno not in entered_firsts:
                lines -= set(range(m_first, m.end_lineno + 1))
        return lines
    lines = set()
    for stmt in node.body:
        targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else getattr(stmt, "targets", [])
        if any(isinstance(t, ast.Name) and t.id in fields_read for t in targets):
            lines |= set(range(stmt.lineno, stmt.end_lineno + 1))
    if lines or any(m.lineno in entered_firsts or m.decorator_list and m.decorator_list[0].lineno in entered_firsts
                    for m in methods):  # a base the step uses: with its header and docstring
        lines |= set(range(first, node.lineno + 1)) | docstring_lines(node)
    return lines


def measure(entered, classes=None, fields_read=()):
    """(total lines, per-file lines, path, class rows): the path is [(file, name, first, last, check,
    summary)] of the functions (``entered``'s items: (file, first line, name, check), as trace_step gives
    them), the class rows [(file, name, lines counted, summary)]."""
    lines, path, parsed, rows = {}, [], {}, []

    def parse(rel):
        if rel not in parsed:  # each file read and parsed once
            parsed[rel] = (*spans(rel), (ROOT / rel).read_text().splitlines())
            lines[rel] = docstring_lines(parsed[rel][1])
        return parsed[rel]

    for rel, first, name, check in entered:
        found, _, source = parse(rel)
        if first not in found:  # a module body or class body: not a function on the path
            continue
        last, node = found[first]
        covered = set(range(first, last + 1))
        if covered <= lines[rel] and "<" in name:
            continue  # a comprehension or lambda inside a function already on the path
        lines[rel] |= covered
        summary = ""
        if not isinstance(node, ast.Lambda):
            summary = first_sentence(node)
            if not summary:  # a short function without a docstring says what it does in a comment on its def line
                summary = source[node.lineno - 1].partition("  # ")[2].strip()
        path.append((rel, name, first, last, check, summary))
    firsts = {}
    for rel, first, *_ in entered:
        firsts.setdefault(rel, set()).add(first)
    for (rel, name), own in sorted((classes or {}).items(), key=lambda kv: (not kv[1], str(kv[0][0]), kv[0][1])):
        node = find_class(ast.parse((ROOT / rel).read_text()), name)
        counted = set() if node is None else class_lines(node, own, firsts.get(rel, set()), set(fields_read))
        if not counted:  # a base class of which the step uses nothing
            continue
        parse(rel)
        lines[rel] |= counted
        rows.append((rel, name, len(counted), first_sentence(node), own))
    per_file = {str(rel): len(ls) for rel, ls in lines.items()}
    return sum(per_file.values()), per_file, path, rows


def split(per_file, path, rows):
    """(module docstrings, other docstrings): how many of the counted lines are docstrings."""
    modules = sum(len(docstring_lines(ast.parse((ROOT / f).read_text()))) for f in per_file)
    found = {rel: spans(rel)[0] for rel in {p[0] for p in path}}  # each file parsed once
    functions = sum(len(docstring_lines(found[rel][first][1])) for rel, _, first, *_ in path)
    class_docs = sum(len(docstring_lines(find_class(ast.parse((ROOT / rel).read_text()), name)))
                     for rel, name, *_ in rows)
    return modules, functions + class_docs


def render(total, per_file, path, rows):
    """The text of docs/reading_guide.md."""
    modules, docs = split(per_file, path, rows)
    out = ["# Reading guide: one training step, in the order it runs", "",
           "Written by `python benchmarks/reading_guide.py` from a trace of one default `train.train_step`",
           "(`--estimator otb`, the tiny model, the reversal task, plain decoding): every function of the",
           "project entered while the step runs, in the order it is first entered, and the classes the step",
           "builds or reads. Read them in this order; nothing else in the project is on the path. The input",
           "checks the step runs are on the path too, listed last in a section of their own.",
           "`tests/test_e2e_layout.py` keeps this page equal to a fresh trace, so a change that lengthens the",
           "path shows in this page's diff.", "",
           f"**{total} lines in {len(per_file)} files**, counted as anchors such as tiny-grpo are counted: the",
           "entered functions, the bodies of the classes the step builds or reads (less the methods it does",
           "not enter; of a base class, its header, docstring and the fields the step reads) and each file's",
           f"module docstring. Of the {total} lines, {modules} are the module docstrings, which tell the story",
           f"and name the equations, {docs} are the docstrings of the functions and classes, and",
           f"{total - modules - docs} are code and its comments.", "",
           "| file | lines |", "|---|---|"]
    out += [f"| {f} | {n} |" for f, n in per_file.items()]
    steps = [p for p in path if not p[4]] + [p for p in path if p[4]]  # the checks last
    checks = sum(last - first + 1 for _, _, first, last, check, _ in path if check)
    table = ["| # | file | function | lines | what it does |", "|---|---|---|---|---|"]
    out += ["", *table]
    for i, (rel, name, first, last, check, summary) in enumerate(steps, 1):
        if check and (i == 1 or not steps[i - 2][4]):  # the first check
            out += ["", "### The input checks", "",
                    "Every public function of otb.py begins by checking its inputs (always on, one code path). These",
                    "are the checkers the step runs (the functions named `_check...`) and the functions it enters",
                    f"only inside them, in the order first entered: {checks} of the {total} lines.", "", *table]
        out.append(f"| {i} | {rel} | `{name}` | {last - first + 1} | {summary.replace('|', '/')} |")
    out += ["", "The classes the step builds or reads (lines counted: an own class's body less the methods the",
            "step does not enter; a base class's header, docstring and the fields read from it):", "",
            "| file | class | lines counted | what it is |", "|---|---|---|---|"]
    for rel, name, n, summary, own in rows:
        out.append(f"| {rel} | `{name}`{'' if own else ' (base)'} | {n} | {summary.replace('|', '/')} |")
    out += ["", "What is not on the path, and where it lives: the command line (lab/options.py,",
            "lab/parse_options.py), the run folder and checkpoints (lab/runs.py), comparisons (lab/compare.py),",
            "the preflight, the GPU sampler, the learning-rate schedules (lab/) and the statistics "
            "(lab/analysis/). See",
            "lab/__init__.py for the map.", ""]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="do not write: exit 1 if docs/reading_guide.md differs from what a trace writes")
    args = p.parse_args(argv)
    total, per_file, path, rows = measure(*trace_step())
    text = render(total, per_file, path, rows)
    counts = ", ".join(f"{f} {n}" for f, n in per_file.items())
    if args.check:
        same = GUIDE.is_file() and GUIDE.read_text() == text
        print(f"{GUIDE.relative_to(ROOT)}: {'up to date' if same else 'STALE: run python benchmarks/reading_guide.py'}"
              f" ({total} lines traced: {counts})")
        return 0 if same else 1
    GUIDE.write_text(text)
    print(f"{total} lines in {len(per_file)} files ({counts}) -> {GUIDE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
