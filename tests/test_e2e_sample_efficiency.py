"""benchmarks/sample_efficiency.py: the aggregation on hand-made metric lists whose answers are known,
and a tiny end-to-end run through train.main."""
import json
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import sample_efficiency as se  # noqa: E402



def history(success, tokens_per_step=10, grad=None):
    """A train.py-like metric list: cumulative tokens, the given success rates."""
    grad = grad or [0.1] * len(success)
    return [dict(step=i + 1, tokens=tokens_per_step * (i + 1), success=s, grad_norm=g, response_len=5.0)
            for i, (s, g) in enumerate(zip(success, grad))]


# ---------------------------------------------------------------- moving average and tokens to target

def test_moving_average_matches_a_convolution_and_waits_for_a_full_window():
    xs = [random.Random(0).random() for _ in range(30)]
    for k in (1, 3, 10):
        got = se.moving_average(xs, k)
        assert got[:k - 1] == [None] * (k - 1)  # no full window yet
        want = np.convolve(xs, np.ones(k) / k, mode="valid")  # independent reference
        np.testing.assert_allclose(got[k - 1:], want, rtol=1e-12)


def test_tokens_to_target_hand_made():
    h = history([0.0, 0.0, 1.0, 1.0, 0.0, 1.0], tokens_per_step=10)
    # k = 2 windows: [0,0] [0,1] [1,1] -> first mean >= 1 ends at step 4 (40 tokens)
    assert se.tokens_to_target(h, 1.0, 2) == 40
    assert se.tokens_to_target(h, 0.5, 2) == 30  # window [0, 1] ends at step 3
    assert se.tokens_to_target(h, 1.01, 2) is None  # never
    # an early lucky step must not count before the window is full
    lucky = history([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert se.tokens_to_target(lucky, 0.9, 3) == 70
    assert se.tokens_to_target(lucky, 0.9, 1) == 10


def test_tokens_to_target_against_a_naive_loop():
    rng = random.Random(1)
    for _ in range(200):
        n, k, target = rng.randint(1, 25), rng.randint(1, 6), rng.choice([0.2, 0.5, 0.7])
        h = [dict(tokens=t, success=rng.random()) for t in sorted(rng.sample(range(1, 1000), n))]
        want = None
        for i in range(k - 1, n):  # naive: recompute every window from scratch
            if sum(h[j]["success"] for j in range(i - k + 1, i + 1)) / k >= target:
                want = h[i]["tokens"]
                break
        assert se.tokens_to_target(h, target, k) == want


def test_initial_and_final_success_are_means_of_the_first_and_last_k_steps():
    h = history([0.1, 0.2, 0.3, 0.4, 0.9])
    assert se.initial_success(h, 2) == pytest.approx(0.15)
    assert se.final_success(h, 2) == pytest.approx(0.65)
    assert se.final_success(h, 50) == pytest.approx(statistics.mean([0.1, 0.2, 0.3, 0.4, 0.9]))


# ---------------------------------------------------------------- mean and spread over seeds

def test_mean_spread_agrees_with_statistics_and_counts_missing_seeds():
    xs = [3.0, 5.0, 10.0]
    ms = se.mean_spread(xs + [None])
    assert ms["mean"] == pytest.approx(statistics.mean(xs))
    assert ms["std"] == pytest.approx(statistics.stdev(xs))  # sample std (n - 1)
    assert (ms["min"], ms["max"], ms["n"], ms["missing"]) == (3.0, 10.0, 3, 1)
    assert se.mean_spread([7.0])["std"] == 0.0
    none = se.mean_spread([None, None])
    assert none["mean"] is None and none["n"] == 0 and none["missing"] == 2


def test_interp_matches_numpy():
    xs, ys = [1.0, 2.0, 4.0, 8.0], [0.0, 1.0, 0.0, 2.0]
    for x in [0.0, 1.0, 1.5, 3.0, 5.0, 8.0, 9.0]:
        assert se.interp(x, xs, ys) == pytest.approx(np.interp(x, xs, ys))


def test_curve_is_the_mean_and_std_over_seeds_on_a_common_grid():
    a = history([0.0, 0.2, 0.4, 0.6], tokens_per_step=10)
    b = history([0.2, 0.4, 0.6, 0.8], tokens_per_step=10)
    c = se.curve([a, b], k=1, points=4)
    assert c["tokens"] == pytest.approx([10, 20, 30, 40])
    assert c["mean"] == pytest.approx([0.1, 0.3, 0.5, 0.7])
    assert c["std"] == pytest.approx([statistics.stdev([0.0, 0.2])] * 4)
    gain = se.curve([a, b], k=1, points=4, offsets=[0.0, 0.2])  # both seeds gain 0.6 by the end
    assert gain["mean"] == pytest.approx([0.0, 0.2, 0.4, 0.6]) and gain["std"] == pytest.approx([0.0] * 4)


# ---------------------------------------------------------------- targets, verdict, token saving

def fake_runs(curves):
    return [dict(estimator=e, group_size=n, seed=s, history=h) for (e, n, s), h in curves.items()]


ARGS = dict(window=2, target_margin=0.1, target_success=0.0, otb_estimator="otb", otb_group_sizes="4",
            estimators="grpo", group_sizes="4,32", reference_group_size=0, match_tolerance=0.02)


def test_targets_saving_and_verdict_on_hand_made_runs():
    curves = {  # OTB N=4 reaches 0.4 at step 3; grpo N=32 (8x tokens per step) at step 2
        ("otb", 4, 0): history([0.2, 0.2, 0.6, 0.6], tokens_per_step=10),
        ("grpo", 4, 0): history([0.2, 0.2, 0.2, 0.2], tokens_per_step=10),
        ("grpo", 32, 0): history([0.2, 0.6, 0.6, 0.6], tokens_per_step=80),
        ("otb", 4, 1): history([0.0, 0.0, 0.0, 0.0], tokens_per_step=10),
        ("grpo", 4, 1): history([0.0, 0.0, 0.0, 0.0], tokens_per_step=10),
        ("grpo", 32, 1): history([0.0, 0.0, 0.0, 0.0], tokens_per_step=80),
    }
    runs = fake_runs(curves)
    agg = se.aggregate(runs, ARGS)
    # seed 0: initial success (first 2 steps) 0.2, 0.2, 0.4 pooled -> 0.2667; + 0.1 margin
    assert agg["targets"]["0"] == pytest.approx((0.2 + 0.2 + 0.4) / 3 + 0.1)
    assert agg["targets"]["1"] == pytest.approx(0.1)
    v = agg["verdicts"][0]
    assert (v["otb"], v["reference"]) == ("otb-n4", "grpo-n32")
    assert (v["reached_otb"], v["reached_reference"]) == (1, 1)
    # OTB: window [0.2, 0.6] = 0.4 >= 0.367 at step 3 -> 30 tokens; grpo N=32: [0.2, 0.6] at step 2 -> 160
    assert v["token_saving"]["mean"] == pytest.approx(1 - 30 / 160)
    # final success, paired: seed 0: 0.6 - 0.6, seed 1: 0 - 0
    assert v["final_success_gap"]["mean"] == pytest.approx(0.0)
    assert v["matches"] is True
    table = {c["name"]: c for c in agg["configs"]}
    assert table["otb-n4"]["tokens_to_target"]["mean"] == 30 and table["otb-n4"]["tokens_to_target"]["missing"] == 1
    assert table["grpo-n32"]["grad_norm_max"]["mean"] == pytest.approx(0.1)


def test_verdict_says_no_when_otb_falls_short_and_none_when_the_reference_never_arrives():
    short = {("otb", 4, 0): history([0.2, 0.2, 0.2, 0.3], tokens_per_step=10),
             ("grpo", 4, 0): history([0.2, 0.2, 0.2, 0.2], tokens_per_step=10),
             ("grpo", 32, 0): history([0.2, 0.2, 0.6, 0.6], tokens_per_step=80)}
    v = se.aggregate(fake_runs(short), ARGS)["verdicts"][0]
    assert v["matches"] is False and "NOT" in v["text"]
    assert v["final_success_gap"]["mean"] == pytest.approx(0.25 - 0.6)
    flat = {key: history([0.2] * 4) for key in short}
    v = se.aggregate(fake_runs(flat), ARGS)["verdicts"][0]
    assert v["matches"] is None and "No verdict" in v["text"]


# ---------------------------------------------------------------- end to end and the notebook

def test_tiny_end_to_end_run_through_train_main(tmp_path):
    """Two seeds x (otb, grpo) at N = 2, 3 steps, no warm-up: the runs share prompts and start."""
    summary = se.main(["--seeds", "0,1", "--steps", "3", "--horizon", "3", "--estimators", "grpo",
                       "--group-sizes", "2", "--otb-group-sizes", "2", "--window", "2", "--jobs", "1",
                       "--train-args", "--prompts-per-step 2 --tiny-hidden 16 --tiny-layers 1 --warmup-max-steps 0",
                       "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out/summary.md").exists() and (tmp_path / "out/sample_efficiency.png").exists()
    saved = json.loads((tmp_path / "out/summary.json").read_text())
    assert [c["name"] for c in summary["configs"]] == [c["name"] for c in saved["configs"]]  # returned = written
    assert len(saved["runs"]) == 4 and [c["name"] for c in saved["configs"]] == ["otb-n2", "grpo-n2"]
    for seed in (0, 1):
        otb_run, grpo_run = (next(r for r in saved["runs"] if r["estimator"] == e and r["seed"] == seed)
                             for e in ("otb", "grpo"))
        assert len(otb_run["history"]) == 3
        # same weights, prompts and sampler seed: the first rollout is identical for both estimators
        assert otb_run["history"][0]["tokens"] == grpo_run["history"][0]["tokens"]
        assert otb_run["history"][0]["success"] == grpo_run["history"][0]["success"]
        metrics = [json.loads(l) for l in (tmp_path / f"runs/h3-k3/otb-n2-s{seed}/metrics.jsonl").read_text().splitlines()]
        assert [r["tokens"] for r in otb_run["history"]] == [m["tokens"] for m in metrics]
    assert saved["command"].startswith("python benchmarks/sample_efficiency.py --seeds 0,1")
