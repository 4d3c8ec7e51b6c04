"""benchmarks/lr_schedule_experiment.py's analysis on synthetic metrics, with no training.

The surge step is checked against lr_schedule.lr_factor itself (the schedule that train.py
runs), collapse and the seed bands against naive recomputations, and the whole aggregate path
(run folders -> plot + summary) on fake run folders. Its two real runs: test_e2e_lr_schedule_experiment.py.
"""
import importlib.util
import json
import random
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from lab.lr_schedule import lr_factor

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lr_schedule_experiment",
                                               ROOT / "benchmarks" / "lr_schedule_experiment.py")
exp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exp)


def schedule_lrs(lengths, lr0=1e-3, **kw):
    """The rates train.py would log (the rate each step uses) for these mean lengths."""
    return [lr0 * lr_factor("length", lengths[:i], len(lengths), **kw) for i in range(len(lengths))]


def fake_history(n, rng, surge_at=None, collapse_at=None, lr0=1e-3):
    """Metrics rows shaped like train.py's: noisy length ~6 that doubles from `surge_at`,
    success ~0.3 that drops to 0 (and finished to 0.2) from `collapse_at`."""
    rows = []
    for i in range(1, n + 1):
        grown = surge_at is not None and i >= surge_at
        dead = collapse_at is not None and i >= collapse_at
        rows.append(dict(step=i, response_len=(12.0 if grown else 6.0) + rng.uniform(-0.5, 0.5),
                         success=0.0 if dead else 0.3 + rng.uniform(-0.1, 0.1),
                         finished=0.2 if dead else 1.0, lr=lr0, grad_norm=rng.uniform(0.1, 1.0),
                         mismatch_mean_abs=rng.uniform(1e-3, 1e-2), mismatch_k3=rng.uniform(1e-6, 1e-5)))
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window,ratio", [(3, 1.5), (10, 1.5), (5, 3.0)])
def test_surge_step_is_where_the_real_schedule_first_decays(seed, window, ratio):
    rng = random.Random(seed)
    lengths = [rng.uniform(4, 8) for _ in range(12)] + [rng.uniform(4, 16) for _ in range(30)]
    lrs = schedule_lrs(lengths, warmup_window=window, surge_ratio=ratio)
    s = exp.surge_step(lengths, window, ratio)
    assert exp.first_lr_drop(lrs) == s  # the first decay is decided at the surge step itself
    if s is not None:
        assert s > window and lengths[s - 1] > ratio * np.mean(lengths[:window])
        assert all(L <= ratio * np.mean(lengths[:window]) for L in lengths[window:s - 1])


def test_no_surge_when_lengths_stay_flat_or_run_is_too_short():
    assert exp.surge_step([5.0] * 30, 10, 1.5) is None
    assert exp.surge_step([5.0] * 10, 10, 1.5) is None
    assert exp.first_lr_drop([1e-3] * 30) is None


@pytest.mark.parametrize("collapse_at", [None, 20, 35])
def test_collapse_matches_a_naive_trailing_mean(collapse_at):
    rng = random.Random(1)
    h = fake_history(40, rng, collapse_at=collapse_at)
    k = 10
    collapsed, step = exp.collapse(h, k, 0.5, 0.5)
    s = np.array([r["success"] for r in h])
    trailing = np.convolve(s, np.ones(k) / k, mode="valid")  # trailing[j] = mean of steps j+1..j+k
    below = np.nonzero(trailing < 0.5 * s[:k].mean())[0]
    assert step == (int(below[0]) + k if len(below) else None)
    fin = np.mean([r["finished"] for r in h[-k:]])
    assert collapsed == bool(s[-k:].mean() < 0.5 * s[:k].mean() or fin < 0.5)
    assert collapsed == (collapse_at is not None)  # a drop to 0 is a collapse, noise is not


def test_finished_fraction_alone_can_mark_a_collapse():
    h = [dict(success=0.3, finished=1.0 if i < 30 else 0.1) for i in range(40)]
    assert exp.collapse(h, 10, 0.5, 0.5) == (True, None)  # success held, but no EOS at the end


def test_band_and_pearson_match_numpy():
    rng = random.Random(2)
    runs = [fake_history(n, rng) for n in (30, 28, 30)]
    mid, lo, hi = exp.band(runs, "grad_norm")
    x = np.array([[r["grad_norm"] for r in h[:28]] for h in runs])  # cut to the shortest run
    np.testing.assert_allclose(mid, x.mean(0))
    np.testing.assert_allclose(lo, x.min(0))
    np.testing.assert_allclose(hi, x.max(0))
    a, b = x[0], x[1]
    assert exp.correlation(list(a), list(b)) == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert exp.correlation([1.0, 1.0], [0.0, 2.0]) is None  # a constant series has no correlation


def test_summarize_counts_surges_and_collapses():
    args = exp.parse_args(["--lr-warmup-window", "10", "--lr-surge-ratio", "1.5"])
    rng = random.Random(3)
    histories = {"constant/group_mean": {0: fake_history(40, rng, surge_at=15, collapse_at=25),
                                         1: fake_history(40, rng, surge_at=18, collapse_at=30)},
                 "length/otb": {0: fake_history(40, rng), 1: fake_history(40, rng)}}
    out = exp.summarize(histories, args)
    bad, good = out["constant/group_mean"], out["length/otb"]
    assert (bad["collapsed"], bad["surged"], good["collapsed"], good["surged"]) == (2, 2, 0, 0)
    assert [r["surge_step"] for r in bad["runs"].values()] == [15, 18]
    for r in bad["runs"].values():  # length rose (step 15 / 18) before success fell (25 / 30 on)
        assert r["len_before_collapse"] is True and r["surge_step"] < r["collapse_step"]
    finals = [np.mean([r["success"] for r in h[-10:]]) for h in histories["length/otb"].values()]
    assert good["final_success_mean"] == pytest.approx(np.mean(finals))
    assert good["final_success_sd"] == pytest.approx(np.std(finals, ddof=1))


def test_aggregate_only_writes_plot_and_summary_from_run_folders(tmp_path, capsys):
    out, results = tmp_path / "runs", tmp_path / "results"
    argv = ["--aggregate-only", "--seeds", "0,1", "--out", str(out), "--results", str(results)]
    args = exp.parse_args(argv)
    rng = random.Random(4)
    for config, _, _ in exp.configs(args):
        for seed in args.seeds:
            folder = out / exp.run_name(config, seed)
            folder.mkdir(parents=True)
            rows = fake_history(30, rng, surge_at=12 if "constant" in config else None)
            folder.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = exp.main(argv)
    assert set(summary) == {"constant/group_mean", "constant/otb", "length/group_mean", "length/otb"}
    md = (results / "summary.md").read_text()
    for config in summary:
        assert md.count(f"| {config} |") == 3  # two seed rows and one aggregate row
    stored = json.loads((results / "summary.json").read_text())
    assert stored["configs"]["constant/otb"]["surged"] == 2 and stored["configs"]["length/otb"]["surged"] == 0
    assert set(stored["runs_code"].values()) == {None}  # folders without provenance.json: not recorded
    assert "(provenance.json): not recorded for any of the 8 runs." in md
    img = matplotlib.image.imread(results / "lr_schedule.png")
    assert img.shape[:2] == (640, 1200)  # 15 x 8 inches at 80 dpi: the 2 x 3 panel figure
    assert (results / "lr_schedule.png").stat().st_size < 1_000_000


def test_train_command_carries_every_schedule_number():
    args = exp.parse_args(["--lr-warmup-window", "7", "--lr-surge-ratio", "2.5", "--lr", "3e-4",
                           "--train-args", "--group-size 8"])
    cmd = exp.train_command(args, "length", "otb", 2)
    pairs = dict(zip(cmd[2::2], cmd[3::2]))
    assert pairs["--lr-schedule"] == "length" and pairs["--estimator"] == "otb" and pairs["--seed"] == "2"
    assert float(pairs["--lr-warmup-window"]) == 7 and float(pairs["--lr-surge-ratio"]) == 2.5
    assert float(pairs["--lr"]) == 3e-4 and cmd[-2:] == ["--group-size", "8"]
    assert exp.train_command(args, "constant", "otb", 2)[2:] != cmd[2:]


@pytest.mark.saved_results
def test_the_docs_count_distinct_runs_and_quote_the_exact_mcnemar_p():
    """The saved study has 24 run rows, 14 of them distinct (a length-schedule run that never fired repeats
    its constant-LR twin); under the constant LR, OTB and group_mean collapsed on discordant seeds 2 to 0,
    exact McNemar P (scipy's binomial test, stats.sign_test) 0.50: docs/lr_schedule.md and the README
    say so."""
    from lab.analysis import stats
    configs = json.loads((ROOT / "benchmarks" / "results" / "lr_schedule" / "summary.json").read_text())["configs"]
    rows = [(cfg.split("/")[1], seed, json.dumps(r, sort_keys=True)) for cfg, c in configs.items()
            for seed, r in c["runs"].items()]
    distinct = len(set(rows))
    otb, gm = (configs[f"constant/{e}"]["runs"] for e in ("otb", "group_mean"))
    b = sum(otb[s]["collapsed"] and not gm[s]["collapsed"] for s in otb)
    c = sum(gm[s]["collapsed"] and not otb[s]["collapsed"] for s in otb)
    p = stats.sign_test(b, c)
    doc = " ".join((ROOT / "docs" / "lr_schedule.md").read_text().split())
    assert (len(rows), distinct, b, c) == (24, 14, 2, 0)
    assert f"{distinct} of them distinct" in doc and f"{distinct} distinct runs" in doc
    assert f"discordant seeds split {b} to {c}, exact McNemar P = {p:.2f}" in doc and "no difference shown" in doc
    assert f"({distinct} distinct runs)" in (ROOT / "README.md").read_text()
