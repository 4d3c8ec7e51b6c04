"""Every benchmark script rejects a bad option value with one argparse line (exit status 2)
before it runs or writes anything -- so a typo never overwrites the saved results."""
import importlib

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
    ("bench_decode", ["--draws", "gpu"], "--draws: must be device and/or cpu"),
    ("bench_decode", ["--device", "tpu"], "--device: must be auto, cpu or cuda"),
    ("bench_score", ["--device", "gpu"], "--device: must be auto, cpu or cuda"),
    ("bench_estimators", ["--device", "mps"], "--device: must be auto, cpu or cuda"),
    ("grad_variance", ["--pool", "1"], "--pool: must be an integer >= 2"),
    ("lr_schedule_experiment", ["--steps", "0"], "--steps: must be an integer >= 1"),
    ("lr_schedule_experiment", ["--lr", "-1"], "--lr: must be a number > 0"),
    ("sample_efficiency", ["--seeds", "x"], "--seeds: must be comma-separated integers >= 0"),
    ("sample_efficiency", ["--group-sizes", "1,4"], "--group-sizes: must be comma-separated integers >= 2"),
    ("bench_vs_trl", ["--steps", "0"], "--steps: must be an integer >= 1"),
    ("bench_vs_trl", ["--steps", "5", "--skip", "5"], "--skip: must be smaller than --steps (5), got 5"),
    ("bench_vs_trl", ["--estimator", "otb"], "--estimator: invalid choice: 'otb'"),
]

if not torch.cuda.is_available():  # asking for a GPU that is not there is a bad option too
    CASES += [(script, ["--device", "cuda"], "--device: cuda is not available on this machine")
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


def test_bench_decode_times_every_batch_size(tmp_path):
    import json
    import benchmarks.bench_decode as bd
    out = tmp_path / "decode.json"
    rows = bd.main(["--hidden", "18", "--layers", "1", "--prompt", "3", "--batch", "1,3", "--tokens", "2",
                    "--repeats", "1", "--json", str(out)])
    assert [(r["batch"], r["draws"]) for r in rows] == [(1, "device"), (3, "device")]  # CPU: one variant
    assert all(r["ms_per_position"] > 0 for r in rows)
    assert json.loads(out.read_text())["results"] == rows
