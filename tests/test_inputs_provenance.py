"""The long experiment scripts (benchmarks/stability.py, benchmarks/stability_replication.py) refuse
to start runs from code with uncommitted changes, or where git cannot tell, with one message naming
the changed files and --allow-dirty, before anything is written; --from-saved, which starts no run,
is not refused. The checkout is a throwaway git repository (tests/code_repo.py) that lab.machine
reads in place of this one, so the refusal runs on real ``git status`` output."""
import pytest

from benchmarks import stability as st
from benchmarks import stability_replication as rp
from lab import machine
from code_repo import checkout, edit

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
