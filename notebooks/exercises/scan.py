"""Flag, before a notebook runs, the code that only tampering needs and the functions copied from otb.py.

    import scan
    scan.flags(nb, "01_sum_pi_squared")   # [(code cell number, line number, the line, why)], [] if none

grade.py decides every verdict in its own process, on inputs drawn when it grades, from the results the
student's functions return in the kernel; but those functions run there, where they could reach for the
reference (call otb.py, switch off the watch on such calls, read the check's frames) or change what the
kernel hands back. An honest answer to these exercises computes tensors from tensors: it never
needs to reach outside its function. This scan reads the syntax tree of every code cell but the two
Colab cells (the teacher's, matched whatever URL they hold) and flags:

* reading frames, profiles and traces (``sys._getframe``, ``inspect``, ``f_back``, ``sys.setprofile``,
  ``settrace``): how a cell finds the grader's token or the check's own answer, or switches off the
  watch on calls into otb.py;
* threads and processes (``threading``, ``_thread``, ``concurrent``, ``multiprocessing``): code the
  watch does not follow;
* assigning to, or deleting, an attribute of a module (``torch.Tensor.any = ...``, ``json.dumps = ...``,
  ``sys.stdout = ...``, ``builtins.print = ...``), ``setattr``/``delattr``, and rebinding ``print``;
* IPython's history and shell (``In``, ``Out``, ``_ih``, ``get_ipython``, and every magic or ``!`` line,
  which the kernel turns into a call of it: code behind a magic is not read), ``importlib``,
  ``__import__``, ``exec``, ``eval``, ``compile``, ``globals``, ``vars``, ``gc``, ``ctypes``,
  ``__dict__``, ``__globals__``, ``__code__``, and exits (``exit``, ``quit``, ``sys.exit``,
  ``os._exit``, ``raise SystemExit``); writing or deleting files (``open(..., 'w')``, ``write_text``,
  ``shutil``) and running programs (``subprocess``, ``os.system``): a cell could rewrite check.py;
* a name of otb.py, toy_harness.py, check.py, the tests or the benchmarks that the notebook's
  exercises do not hand out (``check.ALLOWED``), used inside a function or class, bound to a name a
  check is handed (``sum_pi_squared = functools.partial(otb.sum_pi_squared)``), or imported from
  them; top-level cells that call otb.py to show a number (as the handed-out cells do) are not flagged;
* a function whose syntax tree equals one of otb.py's once its docstring, its names and its
  argument names are left out (a copy with the variables renamed), if it has at least COPY_NODES nodes:
  short formulas are written the same way by everyone.

What no scan sees: a student who understands otb.py's function well enough to rewrite it in their own
structure has learned it; and a table of a check's fixed inputs and their answers, built at the top of
the notebook (where otb.py may be called, as the handed-out cells do to show numbers), is not flagged:
the checks' examples are fixed and documented, for learning, and grade.py draws other inputs for marks.
"""
import ast
import functools
import re
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

from check import ALLOWED, NOTEBOOKS  # noqa: E402

COPY_NODES = 40  # syntax-tree nodes a function needs before being the same as otb.py's counts as a copy
PROJECT = ("otb", "toy_harness", "check", "naive", "tests", "benchmarks")  # the modules that compute answers
# otb.ESTIMATORS in 4c: the solution looks up the group mean and RLOO there, the two estimators the check allows
EXTRA = {"04_bias_variance_toy": ("otb.ESTIMATORS",)}
MODULES = {"inspect": "reads frames", "importlib": "imports past the notebook's own imports",
           "threading": "runs code in a thread", "_thread": "runs code in a thread",
           "concurrent": "runs code in a thread or process", "multiprocessing": "runs code in a process",
           "gc": "reaches objects through the garbage collector", "ctypes": "reaches the interpreter's memory",
           "builtins": "reaches the built-in functions", "signal": "handles signals", "trace": "traces calls",
           "subprocess": "runs programs", "shutil": "moves and deletes files"}
NAMES = {"In": "reads IPython's history", "Out": "reads IPython's history", "_ih": "reads IPython's history",
         "_oh": "reads IPython's history", "get_ipython": "reaches IPython's shell",
         "__builtins__": "reaches the built-in functions", "__import__": "imports past the notebook's own imports",
         "exec": "runs code built as text", "eval": "runs code built as text", "compile": "runs code built as text",
         "globals": "reaches a namespace as a dict", "vars": "reaches a namespace as a dict",
         "locals": "reaches a namespace as a dict", "setattr": "sets an attribute by name",
         "delattr": "deletes an attribute by name", "exit": "exits", "quit": "exits"}
ATTRIBUTES = {"_getframe": "reads frames", "f_back": "reads frames", "f_locals": "reads frames",
              "f_globals": "reads frames", "tb_frame": "reads frames", "gi_frame": "reads frames",
              "setprofile": "switches the profile hook (the watch on calls into otb.py)",
              "settrace": "switches the trace hook", "__dict__": "reaches a namespace as a dict",
              "__globals__": "reaches a function's namespace", "__code__": "reaches a function's code",
              "__closure__": "reaches a function's closure", "__builtins__": "reaches the built-in functions",
              "_exit": "exits", "__subclasses__": "reaches classes by walking the type tree",
              "write_text": "writes a file (check.py, say)", "write_bytes": "writes a file (check.py, say)",
              "unlink": "deletes a file", "system": "runs programs", "popen": "runs programs"}
_HISTORY = re.compile(r"^_i+\d*$")  # IPython's _i, _ii, _i3 ...


_REPO = re.compile(r'^(OTB_REPO = os\.environ\.get\("OTB_REPO", )"[^"\n]*"', re.MULTILINE)  # the URL handout writes


def _code(source):
    """The cell's syntax tree with the Colab setup cell's OTB_REPO URL left out, or None if it is not Python."""
    try:
        return ast.dump(ast.parse(_REPO.sub(r'\1"URL"', source)))
    except (SyntaxError, ValueError):
        return None


def _python(source):
    """The cell as the kernel runs it: IPython's magics and shell lines (``%time ...``, ``!pip ...``) turned into
    the calls they are (``get_ipython().run_line_magic(...)``), so no code hides behind a magic."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


@functools.lru_cache(maxsize=1)  # read once per grading run
def _colab_cells():
    """The syntax trees of the two Colab cells that handout.py writes into a class copy's notebooks (they
    install packages and hand the notebook to the grader): the teacher's code, never scanned. Every other
    cell is, the handed-out ones included (they flag nothing); the blank notebooks cannot say which cells
    are handed out, since a student may fill them in where they lie."""
    return {_code((HERE / name).read_text()) for name in ("colab_setup.py", "colab_grade.py")}


def _root(node):
    """The name an attribute chain starts from (``torch`` of ``torch.Tensor.any``), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node):
    """'otb.group_ids' of an attribute ``otb.group_ids`` on a name; None for anything else."""
    return f"{node.value.id}.{node.attr}" if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
        else None


class _Normal(ast.NodeTransformer):
    """A function with its docstring left out and every name and argument numbered by first appearance."""

    def __init__(self):
        self.names = {}

    def _name(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_FunctionDef(self, node):
        body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and \
            isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str) else node.body
        node.name, node.body, node.returns, node.decorator_list = "f", body or [ast.Pass()], None, []
        return self.generic_visit(node)

    def visit_arg(self, node):
        node.arg, node.annotation = self._name(node.arg), None
        return node

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node


def normal(function):
    """The normalised syntax tree of a FunctionDef (``_Normal``) and its number of nodes."""
    import copy
    tree = _Normal().visit(copy.deepcopy(function))
    return ast.dump(tree, annotate_fields=False), sum(1 for _ in ast.walk(tree))


@functools.lru_cache(maxsize=1)
def _otb_functions():
    """{normalised tree: 'otb.name'} of otb.py's functions with at least COPY_NODES nodes."""
    tree = ast.parse((ROOT / "otb.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            text, size = normal(node)
            if size >= COPY_NODES:
                out.setdefault(text, f"otb.{node.name}")
    return out


def _allowed(kind):
    """The project names the exercises of notebook ``kind`` hand out ('otb.group_ids', ...)."""
    checks = [ast.parse(src).body[0].value.func.attr for src in NOTEBOOKS.get(kind, ())]
    return {name for check in checks for name in ALLOWED.get(check, ())} | set(EXTRA.get(kind, ()))


def _checked_names(kind):
    """The names the check cells of notebook ``kind`` are handed (the answers: sum_pi_squared, ...)."""
    return {a.id for src in NOTEBOOKS.get(kind, ()) for a in ast.walk(ast.parse(src).body[0].value)
            if isinstance(a, ast.Name) and a.id != "check"}


def _why(node, allowed, inside, modules):
    """Why ``node`` is flagged, or None. ``inside``: the node is in a function or class body or in the
    value bound to an answer's name; ``modules``: the names the notebook imported as modules."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top in MODULES:
                return f"imports {name}, which {MODULES[top]}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT:
            beyond = [a.name for a in node.names if f"{node.module}.{a.name}" not in allowed]
            if beyond:
                return f"imports {node.module}.{beyond[0]}, which this notebook's exercises do not hand out"
        if any((a.asname or a.name) == "print" for a in node.names):
            return "rebinds print"
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and (node.id in NAMES or _HISTORY.match(node.id)):
        return f"uses {node.id}, which {NAMES.get(node.id, 'reads IPython history')}"
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and node.id == "print":
        return "rebinds print"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == "print":
        return "rebinds print"
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
        return f"uses .{node.attr}, which {ATTRIBUTES[node.attr]}"
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _root(node) in modules:
        return f"{'assigns to' if isinstance(node.ctx, ast.Store) else 'deletes'} {ast.unparse(node)}, an " \
               f"attribute of the imported {_root(node)}"
    if isinstance(node, ast.Attribute) and _dotted(node) in ("sys.exit", "os.kill"):
        return f"uses {_dotted(node)}, which exits"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open" and any(
            isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+")
            for m in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]):
        return "opens a file for writing (check.py, say)"
    raised = _root(getattr(node.exc, "func", node.exc)) if isinstance(node, ast.Raise) and node.exc else None
    if raised in ("SystemExit", "KeyboardInterrupt"):
        return f"raises {raised}, which stops the run"
    name = _dotted(node)
    if inside and name and name.split(".")[0] in PROJECT and name not in allowed:
        return f"uses {name}, which this notebook's exercises do not hand out (check.ALLOWED)"
    return None


def flags(nb, kind):
    """[(code cell number, line number, the line, why)] of everything in the notebook's own code cells that
    only tampering needs, or that copies a function of otb.py; [] for an honest notebook."""
    handed, copies = _colab_cells(), _otb_functions()
    allowed, answers = _allowed(kind), _checked_names(kind)
    cells = [(k + 1, _python(c.source)) for k, c in enumerate(c for c in nb.cells if c.cell_type == "code")]
    trees = [(number, source, ast.parse(source)) for number, source in cells
             if _code(source) not in handed and _code(source) is not None]  # a syntax error runs nowhere
    modules = {"torch", "otb", "check", "builtins", "sys", "json", "importlib", "io", "contextlib", "os",
               "functools", "numpy", "np", "math", "toy_harness", "toy_env", "train"}
    for _, _, tree in trees:
        modules |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}  # a module, class or function
    found = []
    for number, source, tree in trees:
        lines = source.splitlines()
        inside = set()  # the nodes in a function or class body, or in the value bound to an answer's name
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) or (
                    isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                        isinstance(t, ast.Name) and t.id in answers
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                inside |= {id(n) for n in ast.walk(node)}
            if isinstance(node, ast.FunctionDef) and normal(node)[0] in copies:
                found.append((number, node.lineno, lines[node.lineno - 1].strip(),
                              f"{node.name} is a copy of {copies[normal(node)[0]]} (the same syntax tree once names "
                              f"and docstrings are left out)"))
        for node in ast.walk(tree):
            why = _why(node, allowed, id(node) in inside, modules)
            if why and hasattr(node, "lineno"):
                found.append((number, node.lineno, lines[node.lineno - 1].strip(), why))
    return sorted(set(found))
