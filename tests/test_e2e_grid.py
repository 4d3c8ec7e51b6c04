"""benchmarks/grid.py, the runner of train.py grids, on stand-in commands: its restart rule (DONE:
skip; any other folder: start again), one warm-up per seed before the seed's other runs, failures."""
import sys

import pytest

from benchmarks import grid


def job(folder, seed, fail=False, log=None):
    """A stand-in for a train.py run: notes when it starts and ends, then writes DONE (or fails)."""
    code = (f"import pathlib, time; p = pathlib.Path({str(folder)!r}); p.mkdir(); "
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
