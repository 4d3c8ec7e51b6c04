"""What a saved result records of where it was made, and how a fresh result is held against it on
another CPU (lab/machine.py).

- Every results file that a test regenerates records the machine that measured it and the commit of
  the code that did ("not recorded" for results saved before commits were: never a guess).
- ``provenance`` reads the commit and the uncommitted changes to the code from git.
- ``rounding_moves`` lets a rounded number move by one unit of its last printed digit and nothing else.
- The settings under which .ci/run repeats the saved-result tests really change a float, and the
  fingerprint sees them, so those passes cannot pass by running the first one again.
"""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from code_repo import checkout, commit
from lab import machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# the results files a test regenerates from saved statistics or runs, and the tests that do
REGENERATED = {
    "equal_tokens/results.json": "test_exact_equal_tokens.py",
    "factors_meta/results.json": "test_exact_factors_meta.py",
    "horizon_sweep/results.json": "test_exact_horizon_sweep.py",
    "calculator_sweep/results.json": "test_exact_horizon_sweep.py",
    "factors_sweep/results.json": "test_exact_horizon_sweep.py",
    "factors_sweep_128/results.json": "test_exact_horizon_sweep.py",
    "factors_replication/results.json": "test_exact_horizon_sweep.py",
    "smollm2_variance/results.json": "test_exact_horizon_sweep.py",
    "grad_variance/results.json": "test_naive_grad_variance.py",
    "default_run/summary.json": "test_e2e_default_run.py",
    "stability/results.json": "test_exact_stability.py",
    "stability_replication/results.json": "test_exact_stability_replication.py",
}
# .ci/run's other CPUs: ATen's unvectorised kernels with MKL's compatible path, and (where the CPU has
# AVX-512) ATen's and MKL's AVX2 code, which is how a CPU without AVX-512 computes
OTHER_CPUS = {"DEFAULT": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
              "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}}


def check_made_on(record, where):
    """A machine record (a dict naming the CPU, or NOT_RECORDED) and a provenance record (a commit of 40
    hex digits or NOT_RECORDED, and the changed code files: a list, or None where unknown)."""
    made = record["machine"]
    assert made == machine.NOT_RECORDED or (isinstance(made, dict) and made.get("cpu")), where
    provenance = record["provenance"]
    for p in provenance if isinstance(provenance, list) else [provenance]:  # a list: one per commit it ran under
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) or p["commit"] == machine.NOT_RECORDED, where
        assert p["code_changes"] is None or isinstance(p["code_changes"], list), where


@pytest.mark.parametrize("name", sorted(REGENERATED))
def test_every_regenerated_result_records_its_machine_and_commit(name):
    record = json.loads((RESULTS / name).read_text())
    assert (ROOT / "tests" / REGENERATED[name]).read_text().count(name.split("/")[0]) >= 1  # a test reads it
    if "sources" in record:  # an analysis across saved sweeps: each sweep's record
        assert record["sources"]
        for folder, made_on in record["sources"].items():
            check_made_on(made_on, f"{name}: {folder}")
    elif "code" in record:  # a study of many runs (benchmarks/stability.py): each run's commit and machine
        code = record["code"]
        recorded = [c for c in code["runs"].values() if c != "commit not recorded"]
        assert code["runs"] and len(recorded) + code["not_recorded"] == len(code["runs"]), name
        assert all(re.fullmatch(r"[0-9a-f]{40}", c) for c in code["commits"]), name
        assert len(code["machines"]) >= (1 if recorded else 0), name
    else:
        check_made_on(record, name)


def test_provenance_names_the_commit_and_the_code_changed_since(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    first = checkout(repo, monkeypatch)  # a committed train.py, lab.machine pointed at it
    (repo / "lab").mkdir()
    (repo / "notes.md").write_text("notes\n")
    second = commit(repo)
    assert machine.provenance() == {"commit": second, "code_changes": []} and first != second
    (repo / "train.py").write_text("x = 2\n")  # a change to the code
    (repo / "lab" / "new.py").write_text("y = 1\n")  # a new module
    (repo / "lab" / "analysis").mkdir()
    (repo / "lab" / "analysis" / "stats.py").write_text("z = 1\n")  # in lab's sub-package
    (repo / "notes.md").write_text("more notes\n")  # not code: not listed
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("t = 1\n")  # a test is not the code an experiment runs
    assert machine.code_changes() == ["lab/analysis/stats.py", "lab/new.py", "train.py"]
    monkeypatch.setattr(machine, "ROOT", tmp_path / "not-a-checkout")
    (tmp_path / "not-a-checkout").mkdir()
    assert machine.provenance()["commit"] == machine.UNKNOWN and machine.code_changes() is None


def test_rounding_moves_allows_one_unit_of_the_last_digit_and_nothing_else():
    table = "| otb | 0.375 [0.120, 0.631] | 24 seeds | 1.20e-05 |"
    assert machine.rounding_moves(table, table) == []
    assert machine.rounding_moves(table, table.replace("0.375", "0.376").replace("1.20e-05", "1.19e-05")) == [
        "0.375 -> 0.376", "1.20e-05 -> 1.19e-05"]
    assert machine.rounding_moves("| -0.000 |", "| 0.000 |") == ["-0.000 -> 0.000"]
    for changed in (table.replace("0.375", "0.377"),  # two units
                    table.replace("24 seeds", "25 seeds"),  # an integer: a count, exact
                    table.replace("0.375", "0.38"),  # printed with another number of digits
                    table.replace("otb", "rloo"),  # a word
                    table.replace("1.20e-05", "1.20e-04"),  # another exponent
                    table + " |"):  # the layout
        assert machine.rounding_moves(table, changed) is None, changed


PROBE = ("import json, torch\nfrom lab import machine\ntorch.manual_seed(0)\nx = torch.randn(1_000_003)\n"
         "a, b = torch.randn(64, 257), torch.randn(257, 129)\n"
         "print(json.dumps(dict(sum=x.sum().item(), matmul=torch.nn.functional.linear(a, b.T).double().sum().item(), "
         "log_softmax=torch.log_softmax(a, -1).double().sum().item(), fingerprint=machine.fingerprint())))")


def probe(env):
    """A float32 sum (ATen's reduction), a float32 matrix product (MKL's GEMM), a float32 log-softmax
    (ATen's vectorised exp and sum) and the fingerprint, computed in a fresh process with ``env``."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.saved_results
@pytest.mark.parametrize("capability", sorted(OTHER_CPUS))
def test_the_other_cpu_settings_change_a_float_and_the_fingerprint(capability):
    """Each setting under which .ci/run repeats the saved-result tests moves the last bits of a float32
    sum, matrix product or log-softmax (as another CPU does), and the fingerprint sees it, so no
    bit-for-bit branch runs under it. In that pass this process itself runs under the setting."""
    settings = OTHER_CPUS[capability]
    native_env = {k: v for k, v in os.environ.items() if k not in settings}
    native, other = probe(native_env), probe({**native_env, **settings})
    here = native["fingerprint"]["cpu_capability"]
    plays_another_cpu = {"DEFAULT": here != "DEFAULT", "AVX2": here == "AVX512"}[capability]
    if not plays_another_cpu:  # the unvectorised kernels differ from any vectorised ones; AVX2 only from AVX-512
        pytest.skip(f"ATen runs its {here} kernels here: {capability} cannot play another CPU")
    floats = ("sum", "matmul", "log_softmax")
    assert [native[k] for k in floats] != [other[k] for k in floats]
    assert not machine.matches(native["fingerprint"], other["fingerprint"])
    assert other["fingerprint"]["cpu_capability"] == capability
    assert f"MKL_CBWR={settings['MKL_CBWR']}" in other["fingerprint"]["mkl"]
    if all(os.environ.get(k) == v for k, v in settings.items()):  # that pass of .ci/run
        assert machine.fingerprint() == other["fingerprint"]


# ------------------------------------------------------------------ no committed text compared with ==
# A committed file that a script generated (a table, a guide, a summary, the TA table) holds numbers that
# were computed in floats; compared with == against text computed at test time, a test passes only on
# CPUs that round as the one that wrote the file. Such a comparison goes through tests/saved.py
# (same_text: words and integers exactly, each number to one unit of its last digit; same_record: JSON
# floats to 1e-9). A comparison of committed text that can hold no float says so on its line with a
# comment '# exact: <why>'.

FRESH = {"tmp_path", "tmp_path_factory", "out", "tmp"}  # fixtures holding what the test itself wrote
EXACT = re.compile(r"#\s*exact:\s*\S")


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _literal(node):
    try:
        ast.literal_eval(node)
        return True
    except ValueError:
        return False


def _bindings(fn):
    """(target, value) of each assignment, loop and comprehension in ``fn``."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            yield from ((t, n.value) for t in n.targets)
        elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
            yield n.target, n.value
        elif isinstance(n, (ast.For, ast.comprehension)):
            yield n.target, n.iter


def exact_text_comparisons(source):
    """[(line, comparison)] of each == or != in a test module's ``source`` between the text of a committed
    file and anything but a literal, without an '# exact:' comment on its lines.

    The text of a committed file: ``<path>.read_text()`` of a path not built from a fixture that holds the
    test's own output (FRESH) and not a .py source, and what is derived from it, through names, loops,
    comprehensions and the module's functions that return it. json.loads ends it: a record's floats are
    floats, compared by same_record or pytest.approx."""
    tree, lines = ast.parse(source), source.splitlines()
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    returns_text, found = set(), {}
    for _ in range(3):  # a helper that returns committed text may be defined below its caller
        for fn in functions:
            fresh, text = {a.arg for a in fn.args.args if a.arg in FRESH}, set()

            def committed(e):
                if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "loads":
                    return False
                if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "read_text":
                    path = e.func.value
                    source_file = any(isinstance(c, ast.Constant) and str(c.value).endswith(".py")
                                      for c in ast.walk(path))
                    return not (_names(path) & fresh) and not source_file or committed(path)
                if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in returns_text:
                    return True
                if isinstance(e, ast.Name):
                    return e.id in text
                if isinstance(e, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
                    return committed(e.elt)
                if isinstance(e, ast.DictComp):
                    return committed(e.key) or committed(e.value)
                return any(committed(c) for c in ast.iter_child_nodes(e))

            bindings, grown = list(_bindings(fn)), True
            while grown:
                grown = False
                for target, value in bindings:
                    named = _names(target)
                    if _names(value) & fresh and not named <= fresh:
                        fresh |= named
                        grown = True
                    if committed(value) and not named <= text:
                        text |= named
                        grown = True
            if any(isinstance(r, ast.Return) and r.value is not None and committed(r.value) for r in ast.walk(fn)):
                returns_text.add(fn.name)
            for c in ast.walk(fn):
                if not (isinstance(c, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in c.ops)):
                    continue
                sides = [c.left, *c.comparators]
                said = any(EXACT.search(line) for line in lines[c.lineno - 1:c.end_lineno])
                if not said and not any(_literal(s) for s in sides) and any(committed(s) for s in sides):
                    found[c.lineno] = ast.unparse(c)
    return sorted(found.items())


PLANTED = '''
def test_the_table_is_what_the_script_writes():
    assert (ROOT / "table.md").read_text() == render(rows())

def test_a_line_of_the_guide():
    lines = (ROOT / "docs" / "guide.md").read_text().splitlines()
    for line in lines[2:]:
        cell = line.split("|")[1]
        assert cell.strip() != f"{power():.2f}"

def saved_cells():
    return [ln.split("|") for ln in (RESULTS / "summary.md").read_text().splitlines()]

def test_a_cell_of_the_summary():
    assert saved_cells()[2][1] == f"{mean():.3f}"

def test_what_is_allowed(tmp_path):
    same_text(render(rows()), (ROOT / "table.md").read_text())
    assert (tmp_path / "again.md").read_text() == (tmp_path / "first.md").read_text()
    table = (tmp_path / "table.md").read_text()
    assert table == render(rows())
    assert (ROOT / "table.md").read_text().splitlines()[0] == "# Results"
    assert json.loads((ROOT / "results.json").read_text())["n"] == n()
    assert (ROOT / "colab.py").read_text() == source()
    assert list(saved_cells()) == names()  # exact: run names, no number
'''


def test_the_guard_finds_committed_text_compared_with_eq_and_passes_the_tools():
    """The planted module: the three comparisons of committed text (whole, a line reached through a loop,
    a cell reached through a helper) are found; the same text through same_text, the test's own outputs
    compared with each other, a literal, a JSON record, a .py source and a comparison that says why it is
    exact are not."""
    found = exact_text_comparisons(PLANTED)
    assert [line for line, _ in found] == [3, 9, 15], found


def test_no_test_compares_committed_text_with_eq():
    """Every test module (and its helpers) passes the guard: a committed table, guide or summary is held
    against a fresh one by tests/saved.py's tools, never by ==."""
    offending = [f"{path.name}:{line}: {comparison}" for path in sorted((ROOT / "tests").glob("*.py"))
                 if path.name != "saved.py" for line, comparison in exact_text_comparisons(path.read_text())]
    assert not offending, "\n".join(offending)
