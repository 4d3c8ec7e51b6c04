"""The project's layout as the design card draws it: the learner's files at the root, the apparatus
in lab/, imports that run one way, a traced reading path that the guide reports, and docs whose links hold.

- the root holds at most 8 modules: the concepts (otb, toy_env, rollout, tasks, tool_use) and the
  commands (train, toy_harness, otb_trl); everything else that is imported lives in lab/;
- the project's own imports (read with ast, not by running them) have no cycle, and no concept
  module imports lab/ (a command may); every task inherits tasks.Task; ``import train`` leaves the toy
  (toy_env.py) out;
- no line of a root file is over 120 characters, and train.py's are at most 100 but for its help strings;
- rollout.sample calls what runs the tool and applies the stop rule by a verb, makes its forward passes
  through two functions, and no task carries the warm-up's settings;
- docs/reading_guide.md is what ``python benchmarks/reading_guide.py`` writes from a trace of one default
  training step, with a sentence for every function and class on the path; its total is a report, not a
  ceiling (a longer path shows in the guide's diff);
- every relative link in README.md and docs/*.md points at a file that exists, and the README's
  file tree names every module at the root and in lab/, as lab/__init__.py's map does for lab/.
"""
import ast
import re
from pathlib import Path

import pytest

from benchmarks import reading_guide
from saved import same_text

ROOT = Path(__file__).resolve().parent.parent
CONCEPTS = {"otb", "toy_env", "rollout", "tasks", "tool_use"}
COMMANDS = {"train", "toy_harness", "otb_trl"}


def modules():
    """{module name as imported: path} of the project's own modules (the root's, lab/'s and lab/analysis/'s)."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for package in ("lab", "lab/analysis"):
        name = package.replace("/", ".")
        found.update({f"{name}.{p.stem}": p for p in (ROOT / package).glob("*.py") if p.stem != "__init__"})
    return found


def imports(path, known):
    """The project modules that ``path`` imports anywhere in it (module level or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("lab", "lab.analysis"):  # from lab import x, y
                out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            elif node.module in known:  # from lab.x import y, or from otb import y
                out.add(node.module)
    return out


def graph():
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycle(g):
    """One import cycle of graph g as a list of modules, or None (depth-first search)."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(g[n]):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_root_holds_the_concepts_and_the_commands_only():
    root = {p.stem for p in ROOT.glob("*.py")}
    assert root == CONCEPTS | COMMANDS, root ^ (CONCEPTS | COMMANDS)
    assert len(root) <= 8


def test_the_project_imports_have_no_cycle_and_concepts_never_import_lab():
    g = graph()
    assert cycle(g) is None, " -> ".join(cycle(g))
    for concept in CONCEPTS:
        assert not any(m.startswith("lab.") or m in COMMANDS for m in g[concept]), (concept, g[concept])
    assert not any(m in COMMANDS for n, deps in g.items() if n.startswith("lab.") for m in deps)


def test_every_task_is_a_task_and_tasks_names_none():
    """One Task interface: every task of --task inherits tasks.Task (the tool tasks add their tool), and
    tasks.py names no task but its own: lab/options.py's TASKS lists them all, so tool_use.py can import
    tasks.py without a cycle."""
    import tasks
    import tool_use
    from lab import options
    assert all(issubclass(task, tasks.Task) for task in options.TASKS.values())
    for task in (tool_use.CalculatorTask, tool_use.FactorsTask, tool_use.ChatCalculatorTask):
        assert task.tool is not tasks.Task.tool
    assert "tool_use" not in graph()["tasks"] and not hasattr(tasks, "TASKS")


def test_the_sampler_shows_what_changes_state_and_the_tasks_hold_no_warm_up():
    """rollout.sample calls, by a verb, what runs the tool and what applies the stop rule (Turns.run_tool,
    Turns.apply_stop_rule), and no query of Turns does either; its two forward passes are functions
    (rollout.prefill, rollout.decode_step), not a class; the warm-up's settings live with the warm-up
    (lab/models.py's WARM_UP_SETTINGS), not in the tasks."""
    import inspect
    import rollout
    import tasks
    import tool_use
    loop = inspect.getsource(rollout.sample)
    assert "turns.run_tool(" in loop and "turns.apply_stop_rule(" in loop
    assert "prefill(model" in loop and "decode_step(model" in loop
    assert not hasattr(tool_use.Turns, "ends") and not hasattr(tool_use.Turns, "stopped")
    assert not [name for name, x in vars(rollout).items() if inspect.isclass(x) and name.endswith("Decoder")]
    assert not [name for task in (tasks.Task, tool_use.CalculatorTask) for name in vars(task) if "warmup" in name]


def test_the_response_limit_is_read_one_way_and_the_concept_files_take_no_config():
    """--max-new-tokens or the task's own limit: one function of the task and a number
    (tasks.response_limit), which train_step calls like every other caller; no function of the
    concept files takes train.py's Config."""
    import inspect
    import tasks
    import train
    step = inspect.getsource(train.train_step)
    assert "tasks.response_limit(task, cfg.max_new_tokens)" in step and "cfg.max_new_tokens or" not in step
    assert tasks.response_limit(tasks.ReverseTask(), 5) == 5
    assert tasks.response_limit(tasks.ReverseTask()) == tasks.ReverseTask().max_new_tokens() != 5
    callers = [name for name, f in vars(tasks).items() if inspect.isfunction(f) and "cfg" in inspect.signature(f).parameters]
    assert not callers, callers


def test_importing_train_leaves_the_toy_out():
    """train.py's step, options and apparatus do not need the toy bandit: ``import train`` (in a fresh
    process) does not import toy_env.py."""
    import subprocess
    import sys
    code = "import sys, train; assert 'toy_env' not in sys.modules, 'import train imported toy_env'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


STATISTICS_STACK = ("scipy", "statsmodels", "pandas")


def test_importing_train_leaves_the_statistics_stack_out():
    """A training step computes no statistic: ``import train`` (in a fresh process) loads none of scipy,
    statsmodels and pandas, seconds of a learner's first command on a small machine (docs/cost.md). The
    comparison's statistics import them where they compute one; computing one in that fresh process
    loads them, so the check can fail."""
    import subprocess
    import sys
    code = ("import sys, train; print(' '.join(m for m in %r if m in sys.modules)); "
            "from lab import compare; compare.final_difference([dict(success=1.0)] * 3, [dict(success=0.5)] * 3); "
            "print(' '.join(m for m in %r if m in sys.modules))") % (STATISTICS_STACK, STATISTICS_STACK)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after_import, after_a_statistic = done.stdout.splitlines()
    assert after_import == "", f"import train loaded {after_import}"
    assert {"scipy", "statsmodels"} <= set(after_a_statistic.split()), after_a_statistic


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a graph with a cycle two modules long is reported."""
    assert cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_train_py_reads_like_one_file_per_algorithm():
    """"One concept per file, readable top to bottom, roughly 150-400 lines" (the house style's first
    principle, after CleanRL's ppo.py of about 300), the step near its top. The bound is the style's, not
    the file's current length: a ceiling just above it asks for packed lines."""
    lines = (ROOT / "train.py").read_text().splitlines()
    assert len(lines) <= 400
    assert next(i for i, ln in enumerate(lines, 1) if ln.startswith("def train_step(")) < 120


def test_the_learners_files_keep_their_lines_short():
    """The files at the root are read as a tutorial: no line over 120 characters. train.py, read first,
    wraps at 100, but for its Config's help strings (a sentence of --help each, one per option)."""
    for path in sorted(ROOT.glob("*.py")):
        long = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if len(ln) > 120]
        assert not long, f"{path.name}: lines over 120 characters: {long}"
    text = (ROOT / "train.py").read_text()
    config = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "Config")
    long = [i for i, ln in enumerate(text.splitlines(), 1) if len(ln) > 100
            and not config.lineno <= i <= config.end_lineno]
    assert not long, f"train.py: lines over 100 characters outside Config: {long}"


@pytest.mark.saved_results
def test_the_reading_guide_is_the_traced_path_and_train_py_declares_what_the_step_reads():
    entered, traced_classes, fields_read = reading_guide.trace_step()
    total, per_file, path, classes = reading_guide.measure(entered, traced_classes, fields_read)
    same_text(reading_guide.render(total, per_file, path, classes), (ROOT / "docs/reading_guide.md").read_text(),
              "docs/reading_guide.md (stale? python benchmarks/reading_guide.py)")  # line counts: exact
    assert all(summary for *_, summary in path), [name for _, name, *_, summary in path if not summary]  # a sentence each
    assert all(row[3] for row in classes), [row[1] for row in classes if not row[3]]
    names = {name for _, name, *_ in path}
    assert {"train_step", "sample", "score", "optimal_token_baseline", "policy_update"} <= names
    assert {"Config", "StepResult", "Rollout"} <= {row[1] for row in classes}
    assert not any(Path(f).parts[0] == "lab" for f in per_file)  # no apparatus on the path
    import train
    assert {"seed", "group_size", "micro_batch_rows", "chunk_size", "compile_decode"} <= fields_read
    assert fields_read <= set(train.Config.__annotations__), fields_read - set(train.Config.__annotations__)


def test_the_measure_counts_the_union_of_spans_plus_docstrings(tmp_path, monkeypatch):
    """A file with a 3-line docstring, a 4-line function and a 2-line one nested in it: 7 lines."""
    monkeypatch.setattr(reading_guide, "ROOT", tmp_path)
    (tmp_path / "m.py").write_text('"""Doc\n\nstring."""\n\n\ndef f():\n    def g():\n        return 1\n'
                                   '    return g()\n')
    entered = [(Path("m.py"), 6, "f", False), (Path("m.py"), 7, "f.<locals>.g", False)]  # (file, line, name, check)
    total, per_file, path, _ = reading_guide.measure(entered)
    assert total == 3 + 4 and per_file == {"m.py": 7} and [p[1] for p in path] == ["f"]  # g: inside f


def test_the_measure_counts_class_bodies(tmp_path, monkeypatch):
    """An own class counts its body less the methods not entered; a base class its header, its
    docstring and the fields read from it."""
    monkeypatch.setattr(reading_guide, "ROOT", tmp_path)
    (tmp_path / "m.py").write_text(
        'class Base:\n    """Base."""\n    a = 1\n    b = 2\n\n    def unused(self):\n        return 0\n\n\n'
        'class Own(Base):\n    """Own."""\n    c = 3\n\n    def used(self):\n        return 1\n\n'
        '    def unused_too(self):\n        return 2\n')
    total, per_file, _, rows = reading_guide.measure([(Path("m.py"), 14, "Own.used", False)],
                                                     {(Path("m.py"), "Own"): True, (Path("m.py"), "Base"): False},
                                                     {"b"})
    # Own: lines 10-16 (17-18, a method not entered, left out); Base: its class line, docstring and b
    assert per_file == {"m.py": 7 + 3} and total == 10
    assert [(name, n, own) for _, name, n, _, own in rows] == [("Own", 7, True), ("Base", 3, False)]


LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_every_relative_link_of_the_docs_points_at_a_file(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{doc}: link to {target} points at nothing"


def test_the_readme_file_tree_names_every_module():
    readme = (ROOT / "README.md").read_text()
    lab_modules = [p.relative_to(ROOT) for p in (ROOT / "lab").rglob("*.py") if p.name != "__init__.py"]
    for name in sorted({p.name for p in ROOT.glob("*.py")} | {p.name for p in lab_modules} | {"analysis/"}):
        assert re.search(rf"(^|\s){re.escape(name)}\s", readme, re.M), name


def test_the_package_maps_name_every_module_of_lab():
    """lab/__init__.py names each module of lab/ and the analysis/ sub-package, whose own map names its
    modules; lab/ holds no other package (one apparatus package, with one sub-package)."""
    import lab
    import lab.analysis
    assert sorted(p.parent.name for p in (ROOT / "lab").glob("*/__init__.py")) == ["analysis"]
    assert re.search(r"^    analysis/\s", lab.__doc__, re.M)
    for package, doc in (("lab", lab.__doc__), ("lab/analysis", lab.analysis.__doc__)):
        for path in sorted((ROOT / package).glob("*.py")):
            if path.name != "__init__.py":
                assert re.search(rf"^    {re.escape(path.stem)}\s", doc, re.M), path.name


def test_the_readme_quick_command_runs_the_exact_tests_of_otb_and_toy_env():
    """The README's command for a student who changed a concept file: each of its patterns names test
    files, and together they are the estimators' exact, naive-loop and input tests, the verl vectors' and
    the toy's."""
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("python -m pytest -q tests/test_*otb*"))
    named = set()
    for pattern in line.split()[4:]:
        matches = {p.name for p in ROOT.glob(pattern)}
        assert matches, pattern
        named |= matches
    assert {"test_exact_otb_properties.py", "test_naive_otb.py", "test_inputs_otb.py", "test_exact_verl_parity.py",
            "test_exact_verl_tir_parity.py", "test_exact_toy.py", "test_naive_holes.py"} == named


def test_the_readme_test_command_runs_in_parallel_processes_capped_by_the_conftest(monkeypatch):
    """The README's test command asks pytest-xdist for one process per core, each test file in one
    process (its module fixtures load once); requirements.txt installs pytest-xdist, and the conftest's
    hook caps ``-n auto`` at MAX_PROCESSES cores, or leaves PYTEST_XDIST_AUTO_NUM_WORKERS to decide."""
    import conftest
    block = (ROOT / "README.md").read_text().split("<!-- test-command -->")[1].split("<!-- /test-command -->")[0]
    assert block.rstrip().rstrip("`").rstrip().endswith("python -m pytest -q -n auto --dist loadfile")
    assert re.search(r"^pytest-xdist>=", (ROOT / "requirements.txt").read_text(), re.M)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    for cores, processes in ((1, 1), (2, 2), (4, 4), (64, conftest.MAX_PROCESSES)):
        monkeypatch.setattr(conftest, "usable_cpus", lambda: cores)
        assert conftest.pytest_xdist_auto_num_workers(None) == processes
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(None) is None  # xdist's own hook reads the variable


def test_the_tracked_tree_leaves_room_for_the_weights_in_two_gpu_calls():
    """docs/training.md carries SmolLM2's GGUF (98,362,432 bytes) to a GPU machine in two pieces of 48 MiB
    (split -b 48M), each beside the tracked tree in one call of at most 64 MiB: the tree must stay at most
    15 MiB. The saved sweeps' statistics are the large files (lab/analysis/compact.py keeps them small). A
    sweep still measuring also holds its prompts' records (benchmarks/results/*/prompts/), removed when its
    cell finishes: with them the tree may reach 16 MiB, where a 48 MiB piece still fits a call."""
    import subprocess
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    sizes = {f.decode(): (ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file()}
    records = sum(size for f, size in sizes.items() if re.fullmatch(r"benchmarks/results/[^/]+/prompts/.+\.npz", f))
    tree = sum(sizes.values())
    assert tree - records <= 15 * 2 ** 20, f"tracked files: {(tree - records) / 2 ** 20:.1f} MiB besides records"
    piece, gguf = 48 * 2 ** 20, 98_362_432
    assert gguf <= 2 * piece and piece + tree <= 64 * 2 ** 20 and tree <= 16 * 2 ** 20
    assert 'split -b 48M -d -a 1 "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"' in (ROOT / "docs" / "training.md").read_text()
