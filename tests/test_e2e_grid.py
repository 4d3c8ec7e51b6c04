"""benchmarks/grid.py, the runner of train.py grids, on stand-in commands: its restart rule (DONE:
skip; any other folder: start again), one warm-up per seed before the seed's other runs, failures,
and the study's code: a run starts only while the code is the study's, and counts only where its own
record (provenance.json) names that code (--allow-dirty: each is a line and the grid goes on)."""
import json
import sys

import pytest

from benchmarks import grid
from lab import machine

START = dict(commit="a" * 40, code_changes=[], diff_sha256=None)  # the study's code at its start
EDITED = dict(commit="a" * 40, code_changes=["train.py"], diff_sha256="b" * 64)


def job(folder, seed, fail=False, log=None, code=None):
    """A stand-in for a train.py run: notes when it starts and ends, records ``code`` as train.py records
    its own (provenance.json, where given), then writes DONE (or fails)."""
    record = f"(p / 'provenance.json').write_text({json.dumps(dict(code, diff=None))!r}); " if code else ""
    code = (f"import pathlib, time; p = pathlib.Path({str(folder)!r}); p.mkdir(); {record}"
            f"open({str(log)!r}, 'a').write(f'start {folder.name} {{time.time()}}\\n'); time.sleep(0.2); "
            f"open({str(log)!r}, 'a').write(f'end {folder.name} {{time.time()}}\\n'); "
            + ("raise SystemExit(3)" if fail else "(p / 'DONE').write_text('')"))
    return [sys.executable, "-c", code], folder, seed


def test_done_runs_are_kept_others_start_again_and_each_seed_warms_up_first(tmp_path):
    log = tmp_path / "events.txt"
    done, stale = tmp_path / "done-seed0", tmp_path / "stale-seed0"
    done.mkdir(), stale.mkdir()
    (done / "DONE").write_text("")
    (stale / "half.txt").write_text("an interrupted attempt")
    jobs = [job(done, 0, log=log), job(stale, 0, log=log), job(tmp_path / "b-seed0", 0, log=log),
            job(tmp_path / "a-seed1", 1, log=log), job(tmp_path / "b-seed1", 1, log=log)]
    grid.run(jobs, workers=3)
    events = [line.split() for line in log.read_text().splitlines()]
    ran = {name for kind, name, _ in events if kind == "start"}
    assert ran == {"stale-seed0", "b-seed0", "a-seed1", "b-seed1"}  # DONE was not run again
    assert not (stale / "half.txt").exists() and (stale / "DONE").exists()  # started from scratch
    at = {(kind, name): float(t) for kind, name, t in events}
    assert at[("start", "b-seed0")] >= at[("end", "stale-seed0")]  # the seed's first run warmed up
    assert at[("start", "b-seed1")] >= at[("end", "a-seed1")]
    assert (tmp_path / "b-seed1.log").exists()  # each run's output beside its folder


def test_a_failed_run_does_not_stop_the_others_and_is_named(tmp_path):
    log = tmp_path / "events.txt"
    with pytest.raises(SystemExit, match="1 run\\(s\\) failed.*bad-seed0"):
        grid.run([job(tmp_path / "bad-seed0", 0, fail=True, log=log),
                  job(tmp_path / "ok-seed1", 1, log=log)], workers=2)
    assert (tmp_path / "ok-seed1" / "DONE").exists() and not (tmp_path / "bad-seed0" / "DONE").exists()


def started(log):
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("start")]


@pytest.mark.parametrize("allow_dirty", [False, True])
def test_a_run_whose_own_record_names_other_code_stops_the_grid(tmp_path, monkeypatch, capsys, allow_dirty):
    """The code here stays the study's, but the second run records other code (an edit made while it
    started): without --allow-dirty the third run never starts and the second loses its DONE."""
    monkeypatch.setattr(machine, "code_record", lambda: (START, ""))
    log, code = tmp_path / "events.txt", dict(START, allow_dirty=allow_dirty)
    jobs = [job(tmp_path / "a-seed0", 0, log=log, code=START), job(tmp_path / "b-seed0", 0, log=log, code=EDITED),
            job(tmp_path / "c-seed0", 0, log=log, code=START)]
    if allow_dirty:
        grid.run(jobs, workers=1, code=code)
        assert started(log) == ["a-seed0", "b-seed0", "c-seed0"] and (tmp_path / "b-seed0" / "DONE").exists()
        assert "b-seed0: ran commit aaaaaaaaaaaa with uncommitted changes to train.py (diff bbbbbbbbbbbb); going on " \
            "(--allow-dirty)" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as e:
        grid.run(jobs, workers=1, code=code)
    assert str(e.value.code).startswith("the code changed while the study ran (it started from commit aaaaaaaaaaaa): "
                                        "b-seed0: ran commit aaaaaaaaaaaa with uncommitted changes to train.py "
                                        "(diff bbbbbbbbbbbb). No further run was started")
    assert started(log) == ["a-seed0", "b-seed0"]
    assert (tmp_path / "a-seed0" / "DONE").exists() and not (tmp_path / "b-seed0" / "DONE").exists()


def test_code_changed_here_stops_the_next_run_before_it_starts(tmp_path, monkeypatch):
    """A code file edited after the first run: the next run is not started, and says why."""
    here = iter([START, EDITED])
    monkeypatch.setattr(machine, "code_record", lambda: (next(here), ""))
    log = tmp_path / "events.txt"
    with pytest.raises(SystemExit, match="b-seed0: not started: the code here is now commit aaaaaaaaaaaa with "
                       "uncommitted changes to train.py \\(diff bbbbbbbbbbbb\\)"):
        grid.run([job(tmp_path / "a-seed0", 0, log=log, code=START), job(tmp_path / "b-seed0", 0, log=log,
                                                                        code=START)],
                 workers=1, code=dict(START, allow_dirty=False))
    assert started(log) == ["a-seed0"] and not (tmp_path / "b-seed0").exists()


def test_a_run_that_records_no_code_is_not_the_studys(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "code_record", lambda: (START, ""))
    with pytest.raises(SystemExit, match="a-seed0: finished without a record of its code"):
        grid.run([job(tmp_path / "a-seed0", 0, log=tmp_path / "events.txt")], workers=1,
                 code=dict(START, allow_dirty=False))


def test_a_study_whose_code_git_cannot_see_starts_no_run_without_allow_dirty(tmp_path):
    unknown = dict(commit=machine.UNKNOWN, code_changes=None, diff_sha256=None, allow_dirty=False)
    with pytest.raises(SystemExit, match="git cannot tell which code the runs would run"):
        grid.run([job(tmp_path / "a-seed0", 0, log=tmp_path / "events.txt")], workers=1, code=unknown)
    assert not (tmp_path / "a-seed0").exists()


def test_which_code_groups_the_runs_by_their_own_records():
    records = {"a": START, "b": dict(EDITED, diff="code.diff"), "c": START, "d": None}
    assert grid.which_code(records) == ("commit aaaaaaaaaaaa (2 runs), commit aaaaaaaaaaaa with uncommitted changes "
                                        "to train.py (diff bbbbbbbbbbbb) (1 run); not recorded: 1 run")
    assert grid.which_code({"a": None, "b": None}) == "not recorded for any of the 2 runs"
