"""Every benchmark script rejects a bad option value with one argparse line (exit status 2)
before it runs or writes anything -- so a typo never overwrites the saved results."""
import importlib
from pathlib import Path

import pytest
import torch

CASES = [
    ("bench_estimators", ["--shapes", "3x"], "--shapes: must look like ROWSxTOKENS:GROUP"),
    ("bench_estimators", ["--repeats", "0"], "--repeats: must be an integer >= 1"),
    ("bench_score", ["--batch", "0"], "--batch: must be an integer >= 1"),
    ("bench_score", ["--chunk-sizes", "0,-1"], "--chunk-sizes: must be comma-separated integers >= 0"),
    ("bench_step_cost", ["--group-size", "1"], "--group-size: must be an integer >= 2"),
    ("bench_decode", ["--batch", "0"], "--batch: must be comma-separated integers >= 1"),
    ("bench_decode", ["--hidden", "64"], "--hidden: must be a multiple of 18"),
    ("bench_decode", ["--json", "out.txt"], "--json: must be a path ending in .json"),
    ("bench_score", ["--hidden", "100"], "--hidden: must be a multiple of 18"),
    ("bench_step_cost", ["--models", "bogus"], "--models: must be comma-separated names from tiny, v49k"),
    ("bench_step_cost", ["--models", "tiny,"], "--models: must be comma-separated names from tiny, v49k"),
    ("bench_decode", ["--decode", "fast"], "--decode: must be comma-separated names from plain, static"),
    ("bench_decode", ["--device", "tpu"], "--device: must be auto, cpu or cuda"),
    ("bench_score", ["--device", "gpu"], "--device: must be auto, cpu or cuda"),
    ("bench_estimators", ["--device", "mps"], "--device: must be auto, cpu or cuda"),
    ("grad_variance", ["--pool", "1"], "--pool: must be an integer >= 2"),
    ("grad_variance", ["--ref-pool", "6"], "--ref-pool: must be a multiple of 4 (>= 8)"),
    ("grad_variance", ["--group-sizes", "2,3"], "--group-sizes: every N must divide --pool 32"),
    ("grad_variance", ["--estimators", "otb,ppo"], "--estimators: must be comma-separated names from"),
    ("lr_schedule_experiment", ["--steps", "0"], "--steps: must be an integer >= 1"),
    ("bench_memory", ["--rows", "4,0"], "--rows: must be comma-separated integers >= 1"),
    ("bench_memory", ["--chunk-size", "0"], "--chunk-size: must be an integer >= 1"),
    ("lr_schedule_experiment", ["--lr", "-1"], "--lr: must be a number > 0"),
    ("bench_vs_trl", ["--steps", "0"], "--steps: must be an integer >= 1"),
    ("bench_vs_trl", ["--steps", "5", "--skip", "5"], "--skip: must be smaller than --steps (5), got 5"),
    ("bench_vs_trl", ["--estimator", "otb"], "--estimator: invalid choice: 'otb'"),
    ("stability", ["--seeds", "0,x"], "--seeds: must be comma-separated integers >= 0, got '0,x'"),
    ("stability", ["--lrs", "1e-3,-1"], "--lrs: must be comma-separated numbers > 0, got '1e-3,-1'"),
    ("stability", ["--lrs", "inf"], "--lrs: must be comma-separated numbers > 0"),
    ("horizon_sweep", ["--stop-after", "-5"], "--stop-after -5: seconds must be 0 (no limit) or more"),
    ("horizon_sweep", ["--decode", "fast"], "--decode: invalid choice: 'fast'"),
    ("bench_sweep_cost", ["--pool", "2"], "--pool: must be an integer >= 4"),
    ("gpu_variance", ["--budget", "10", "--out", "x"], "--budget: must be an integer >= 60"),
]

if not torch.cuda.is_available():  # asking for a GPU that is not there is a bad option too
    CASES += [(script, ["--device", "cuda"], "--device: CUDA is not available on this machine")
              for script in ("bench_decode", "bench_score", "bench_estimators")]


@pytest.mark.parametrize("script, argv, message", CASES)
def test_bad_option_is_one_line_and_exit_2(script, argv, message, capsys):
    module = importlib.import_module(f"benchmarks.{script}")
    with pytest.raises(SystemExit) as e:
        module.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1], err


def test_good_values_parse():
    import benchmarks.bench_estimators as be
    assert be.parse_args(["--shapes", "8x4:2", "--repeats", "3"]).shapes == [(8, 4, 2)]
    import benchmarks.stability as st
    args = st.parse_args(["--seeds", "3,1", "--lrs", "5e-4,1e-3"])
    assert (args.seeds, args.lrs) == ([3, 1], [5e-4, 1e-3])
    assert (st.parse_args([]).seeds, st.parse_args([]).lrs) == (st.SEEDS, st.LADDER)  # the protocol's defaults


def test_bench_decode_times_every_batch_size(tmp_path):
    import json
    import benchmarks.bench_decode as bd
    out = tmp_path / "decode.json"
    rows = bd.main(["--hidden", "18", "--layers", "1", "--prompt", "3", "--batch", "1,3", "--tokens", "2",
                    "--repeats", "1", "--json", str(out)])
    assert [(r["batch"], r["decode"]) for r in rows] == [(1, "plain"), (3, "plain")]
    assert all(r["ms_per_position"] > 0 for r in rows)
    assert json.loads(out.read_text())["results"] == rows


# ---- output paths: committed results are written only when named, and a bad path stops main()
# before any model is built (so each of these takes milliseconds, and nothing is written)

@pytest.mark.parametrize("script, option", [("bench_score", "--out"), ("bench_step_cost", "--out")])
def test_default_output_is_under_runs_not_the_committed_results(script, option):
    from benchmarks.cli import RUNS
    module = importlib.import_module(f"benchmarks.{script}")
    out = Path(getattr(module.parse_args([]), option.lstrip("-")))
    assert out.is_relative_to(RUNS) and "results" not in out.parts, out
    assert module.parse_args([option, "benchmarks/results/cost"]).out == "benchmarks/results/cost"  # when named


def test_bench_decode_writes_nothing_by_default():
    import benchmarks.bench_decode as bd
    assert bd.parse_args([]).json is None


def bad_paths(tmp_path):
    """(path text, expected message) pairs, built inside tmp_path."""
    a_file = tmp_path / "results.md"
    a_file.write_text("committed results\n")
    return a_file, [(str(a_file), "is a file, not a folder"),
                    (str(a_file / "sub"), "is a file, so"),
                    (str(tmp_path / "x" / "y"), None)]  # a folder that does not exist yet: accepted


@pytest.mark.parametrize("script", ["bench_score", "bench_step_cost"])
def test_bad_out_folder_stops_main_before_any_work(script, tmp_path, capsys, monkeypatch):
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr(module, "machine", lambda: pytest.fail("main() went past the option checks"))
    a_file, cases = bad_paths(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for text, message in cases:
        if message is None:
            assert module.parse_args(["--out", text]).out == text
            continue
        with pytest.raises(SystemExit) as e:
            module.main(["--out", text])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and "--out" in err[-1] and message in err[-1], err
    assert sorted(tmp_path.rglob("*")) == before and a_file.read_text() == "committed results\n"


def test_bench_step_cost_bogus_model_stops_main_before_any_work(capsys, monkeypatch):
    import benchmarks.bench_step_cost as bs
    monkeypatch.setattr(bs, "machine", lambda: pytest.fail("main() went past the option checks"))
    monkeypatch.setattr(bs, "time_model", lambda *a: pytest.fail("main() timed a model"))
    with pytest.raises(SystemExit) as e:
        bs.main(["--models", "bogus", "--steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith("got 'bogus'"), err


def test_bench_score_bad_hidden_is_one_line_from_main(capsys, monkeypatch):
    import benchmarks.bench_score as bsc
    monkeypatch.setattr(bsc, "build", lambda *a: pytest.fail("main() built a model"))
    with pytest.raises(SystemExit) as e:
        bsc.main(["--hidden", "100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "argument --hidden: must be a multiple of 18" in err[-1], err
    assert sum("error" in line for line in err) == 1 and not any("Traceback" in line for line in err), err


def test_bench_decode_json_path_checked_before_any_work(tmp_path, capsys, monkeypatch):
    import benchmarks.bench_decode as bd
    monkeypatch.setattr(bd, "smollm2_shaped", lambda *a: pytest.fail("main() built a model"))
    a_file, _ = bad_paths(tmp_path)
    for text, message in [(str(tmp_path), "must be a path ending in .json"),
                          (str(tmp_path / "d.json"), None),
                          (str(a_file / "x.json"), "is a file, so")]:
        if message is None:
            (tmp_path / "d.json").mkdir()
            message = "is a folder, not a file"
        with pytest.raises(SystemExit) as e:
            bd.main(["--json", text])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and "--json" in err[-1] and message in err[-1], (text, err)


def test_interleaved_rounds_takes_turns_and_keeps_the_warm_up_apart():
    from benchmarks.common import interleaved_rounds
    calls, setups = [], []
    fns = [lambda r, name=name: calls.append((r, name)) or f"{name}{r}" for name in "abc"]
    seconds, values = interleaved_rounds(fns, 2, rotate=True, setup=lambda: setups.append(1), keep=True)
    assert calls == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b")]
    assert values == [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]]  # round 0 first
    assert len(setups) == 9 and all(len(s) == 3 and min(s) >= 0 for s in seconds)
    calls.clear()
    _, values = interleaved_rounds(fns[:2], repeats=1)
    assert calls == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]  # without rotate: the same order every round
    assert values == [[None, None], [None, None]]  # without keep, every output is dropped at once
