"""The long experiment scripts (benchmarks/stability.py, benchmarks/stability_replication.py) refuse
to start runs from code with uncommitted changes, or where git cannot tell, with one message naming
the changed files and --allow-dirty, before anything is written; --from-saved, which starts no run,
is not refused. The checkout is a throwaway git repository (tests/code_repo.py) that lab.machine
reads in place of this one, so the refusal runs on real ``git status`` output.

Each run records its own code as it starts (lab/machine.py's ``record_code``: provenance.json, and
code.diff, a patch that gives the code back from the commit), so a code file edited while a study
runs is seen at the next run: the study stops there, or with --allow-dirty goes on and says which
runs ran which code."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from benchmarks import grid
from benchmarks import stability as st
from benchmarks import stability_replication as rp
from lab import machine
from code_repo import checkout, edit, git, project, touch

RESULTS = st.ROOT / "benchmarks" / "results" / "stability_replication"
SCRIPTS = [(st, "benchmarks/stability.py", ["--estimators", "otb", "--seeds", "0", "--lrs", "1e-3",
                                              "--primary-lr", "1e-3", "--steps", "1"]),
           (rp, "benchmarks/stability_replication.py", ["--seeds", "0", "--blocks", "R1", "--steps", "1"])]


@pytest.mark.parametrize("module, script, argv", SCRIPTS)
def test_uncommitted_code_is_refused_before_anything_is_written(module, script, argv, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    checkout(repo, monkeypatch)
    edit(repo)
    assert machine.code_changes() == ["train.py"]  # git itself sees the change
    runs, out = tmp_path / "runs", tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        module.main(argv + ["--runs", str(runs), "--out", str(out)])
    message = str(e.value.code)
    assert message.startswith(f"{script}: not starting any run: the code has uncommitted changes (train.py)")
    assert "--allow-dirty" in message
    assert not runs.exists() and not out.exists()  # nothing written


@pytest.mark.parametrize("module, script, argv", SCRIPTS)
def test_code_that_git_cannot_see_is_refused(module, script, argv, tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "ROOT", tmp_path)  # not a git checkout
    assert machine.code_changes() is None
    with pytest.raises(SystemExit, match="git cannot tell which code would run"):
        module.main(argv + ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not (RESULTS / "runs").is_dir(), reason="no saved replication runs")
def test_analysing_saved_runs_is_not_refused(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    checkout(repo, monkeypatch)
    edit(repo)
    record = rp.main(["--from-saved", str(RESULTS), "--out", str(tmp_path / "again")])
    assert record["code"]["not_recorded"] == len(record["code"]["runs"])  # and the saved runs keep their record


def test_a_run_folder_records_the_code_and_a_patch_that_gives_it_back(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    head = checkout(repo, monkeypatch)
    folder = tmp_path / "run"
    machine.record_code(folder, machine.code_record())  # the committed code: no patch
    clean = machine.recorded_code(folder)
    assert (clean["commit"], clean["code_changes"], clean["diff_sha256"], clean["diff"]) == (head, [], None, None)
    edit(repo)
    (repo / "lab").mkdir()
    (repo / "lab" / "new.py").write_text("x = 1\n")  # a new file is part of the code too
    record, patch = machine.code_record()
    assert record["code_changes"] == ["lab/new.py", "train.py"] and len(record["diff_sha256"]) == 64
    machine.record_code(folder, (record, patch))  # started again (--resume) from the edited code
    again = machine.recorded_code(folder)
    assert (again["code_changes"], again["diff"], again["earlier"]) == (record["code_changes"], "code.diff", [clean])
    assert not machine.same_code(again, clean) and machine.same_code(again, record)
    copy = tmp_path / "copy"  # the commit plus the patch is the code the run ran
    subprocess.run(["git", "clone", "-q", str(repo), str(copy)], check=True)
    git(copy, "apply", str(folder / "code.diff"))
    for name in ("train.py", "lab/new.py"):
        assert (copy / name).read_text() == (repo / name).read_text()


TINY = ["--estimators", "otb", "--seeds", "0,1", "--lrs", "1e-3", "--primary-lr", "1e-3", "--steps", "2",
        "--train-args", "--tiny-hidden 32 --tiny-layers 1 --warmup-max-steps 0 --horizon 4 --prompts-per-step 2"]


def edit_after_first_block(repo, monkeypatch):
    """grid.run as the study calls it, with train.py of the checkout edited after the first block of runs."""
    run, calls = grid.run, []

    def run_then_edit(*args, **kwargs):
        run(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            touch(repo)
    monkeypatch.setattr(grid, "run", run_then_edit)


def test_a_code_file_edited_while_a_study_runs_stops_it_at_the_next_run(tmp_path, monkeypatch):
    """A tiny study (two seeds, one run each) from a clean copy of the project; train.py is edited after
    the first run: the second run is not started, and the first is saved with its own record."""
    repo = tmp_path / "repo"
    head = project(repo, monkeypatch, st, grid)
    edit_after_first_block(repo, monkeypatch)
    runs, out = tmp_path / "runs", tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        st.main(TINY + ["--runs", str(runs), "--out", str(out)])
    first, second = (st.run_name("otb", s, 1e-3) for s in (0, 1))
    assert str(e.value.code).startswith(f"the code changed while the study ran (it started from commit {head[:12]}): "
                                        f"{second}: not started: the code here is now commit {head[:12]} with "
                                        "uncommitted changes to train.py (diff ")
    assert "--allow-dirty" in str(e.value.code) and not (runs / second).exists()
    saved = json.loads((out / "runs" / f"{first}.code.json").read_text())
    assert saved["run"] == machine.recorded_code(runs / first) and saved["run"]["code_changes"] == []


def test_with_allow_dirty_the_study_goes_on_and_says_which_runs_ran_which_code(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    head = project(repo, monkeypatch, st, grid)
    edit_after_first_block(repo, monkeypatch)
    runs, out = tmp_path / "runs", tmp_path / "out"
    record = st.main(TINY + ["--runs", str(runs), "--out", str(out), "--allow-dirty"])
    first, second = (st.run_name("otb", s, 1e-3) for s in (0, 1))
    own = machine.recorded_code(runs / second)  # the run saw the edit as it started
    assert (own["commit"], own["code_changes"], own["diff"]) == (head, ["train.py"], "code.diff")
    assert record["code"]["runs"][second]["run"] == own and record["code"]["runs"][second]["code_changes"] == []
    patch = (out / "runs" / f"{second}.code.diff").read_text()
    assert patch == (runs / second / "code.diff").read_text() and "+# an edit made while a study runs" in patch
    assert not (out / "runs" / f"{first}.code.diff").exists()
    summary = (out / "summary.md").read_text()
    assert (f"As the runs recorded it when they started: commit {head[:12]} (1 run), commit {head[:12]} with "
            f"uncommitted changes to train.py (diff {own['diff_sha256'][:12]}) (1 run); each run's uncommitted "
            f"changes: runs/<name>.code.diff. Not their sitting's code (--allow-dirty): {second}.") in summary


# ----------------------------------------------------------------------------- what git does not say

def test_blob_id_is_what_git_hash_object_prints(tmp_path):
    for data in (b"", b"x = 1\n", bytes(range(256)) * 3):
        (tmp_path / "f").write_bytes(data)
        assert machine.blob_id(data) == subprocess.run(["git", "hash-object", str(tmp_path / "f")], check=True,
                                                       capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("flag, mark", [("--assume-unchanged", "h"), ("--skip-worktree", "S")])
def test_an_edit_that_gits_index_hides_is_a_change_with_its_patch_and_a_study_refuses_it(flag, mark, tmp_path,
                                                                                        monkeypatch):
    """train.py marked with ``git update-index --assume-unchanged`` (or --skip-worktree) and then edited: git
    status lists nothing, but the file read from disk is not the index's blob, so it is an uncommitted change,
    code.diff gives it back, a study refuses to start, and the repository's index keeps its mark."""
    repo = tmp_path / "repo"
    checkout(repo, monkeypatch)
    git(repo, "update-index", flag, "train.py")
    edit(repo)
    assert git(repo, "status", "--porcelain") == "" and git(repo, "diff", "HEAD") == ""  # hidden from git
    assert machine.hidden_changes() == ["train.py"] and machine.code_changes() == ["train.py"]
    record, patch = machine.code_record()
    assert record["code_changes"] == ["train.py"] and "+print('changed')" in patch
    copy = tmp_path / "copy"  # the commit plus the patch is the code on disk
    subprocess.run(["git", "clone", "-q", str(repo), str(copy)], check=True)
    (tmp_path / "code.diff").write_text(patch)
    git(copy, "apply", str(tmp_path / "code.diff"))
    assert (copy / "train.py").read_text() == (repo / "train.py").read_text()
    assert git(repo, "ls-files", "-v", "train.py") == f"{mark} train.py"  # the index is left as it was
    with pytest.raises(SystemExit, match=r"the code has uncommitted changes \(train.py\)"):
        st.main(SCRIPTS[0][2] + ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])


def test_a_sitecustomize_that_patches_otb_is_recorded_in_the_run_folder(tmp_path):
    """A sitecustomize.py on PYTHONPATH replaces otb.optimal_token_baseline before train.py starts (the
    file otb.py and git see nothing): the run's provenance.json names the patch, the sitecustomize module
    with its sha256 and PYTHONPATH, and the sha256 of each project module read from its file."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(st.ROOT)!r})\nimport otb\n_real = otb.optimal_token_baseline\n\n\n"
        "def optimal_token_baseline(*args, **kwargs):\n    return _real(*args, **kwargs)\n\n\n"
        "otb.optimal_token_baseline = optimal_token_baseline\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    argv = ["--estimator", "otb", "--steps", "1", "--tiny-hidden", "16", "--tiny-layers", "1", "--horizon", "2",
            "--warmup-max-steps", "0", "--prompts-per-step", "2", "--out", str(tmp_path / "out"), "--name", "r"]
    done = subprocess.run([sys.executable, "train.py", *argv], cwd=st.ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ran = machine.recorded_code(tmp_path / "out" / "r")["ran"]
    assert ran["pythonpath"] == str(site)
    assert ran["customize"] == {"sitecustomize": dict(file=str(site / "sitecustomize.py"), sha256=hashlib.sha256(
        (site / "sitecustomize.py").read_bytes()).hexdigest())}
    assert ran["patched"] == [f"otb.optimal_token_baseline (from {site / 'sitecustomize.py'})"]
    assert ran["outside_checkout"] == {}
    for name in ("train.py", "otb.py", "rollout.py", "lab/machine.py"):
        assert ran["modules"][name] == hashlib.sha256((st.ROOT / name).read_bytes()).hexdigest(), name
    here = machine.what_ran()  # this process: nothing patched, nothing customised
    assert here["patched"] == [] and "sitecustomize" not in here["customize"]


def test_a_project_module_imported_from_another_copy_is_named(tmp_path, monkeypatch):
    """otb imported from a copy outside the checkout (earlier on sys.path): named with its file, and not
    among the checkout's modules."""
    import importlib.util
    copy = tmp_path / "otb.py"
    copy.write_text((st.ROOT / "otb.py").read_text() + "# another copy\n")
    spec = importlib.util.spec_from_file_location("otb", copy)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    monkeypatch.setitem(sys.modules, "otb", other)
    ran = machine.what_ran()
    assert ran["outside_checkout"] == {"otb": str(copy)} and "otb.py" not in ran["modules"]
