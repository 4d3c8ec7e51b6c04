"""benchmarks/lr_schedule_experiment.py end to end: two real train.py runs, then its summary and plot.

Its analysis alone, on synthetic metrics: test_exact_lr_schedule_experiment.py.
"""
import json

import pytest

from test_exact_lr_schedule_experiment import exp, schedule_lrs


def test_quick_end_to_end_logged_lr_is_the_rule_applied_to_logged_lengths(tmp_path):
    """Two real train.py runs (tiny 1-layer model, no warm-up, 6 steps): the length run's logged
    rates are what lr_schedule gives for its logged lengths, and the constant run's never change."""
    out, results = tmp_path / "runs", tmp_path / "results"
    summary = exp.main(["--quick", "--estimators", "otb", "--out", str(out), "--results", str(results)])
    assert set(summary) == {"constant/otb", "length/otb"}
    args = exp.parse_args(["--quick"])
    for config in summary:
        folder = out / exp.run_name(config, 0)
        assert (folder / "DONE").exists()
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, args.steps + 1))
        lrs = [r["lr"] for r in rows]
        if config.startswith("length"):
            expected = schedule_lrs([r["response_len"] for r in rows], lr0=args.lr,
                                    warmup_window=args.lr_warmup_window, surge_ratio=args.lr_surge_ratio,
                                    decay_factor=args.lr_decay_factor, floor=args.lr_floor,
                                    decay_period_factor=args.lr_decay_period_factor)
            assert lrs == pytest.approx(expected, rel=1e-12)
        else:
            assert lrs == [args.lr] * args.steps
    assert (results / "lr_schedule.png").exists() and (results / "summary.md").exists()
    stored = json.loads((results / "summary.json").read_text())["runs_code"]  # each run's own record of its code
    assert stored == {exp.run_name(c, 0): json.loads((out / exp.run_name(c, 0) / "provenance.json").read_text())
                      for c in summary}
