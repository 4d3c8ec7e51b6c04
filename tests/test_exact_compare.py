"""compare.py's equal-token analysis on histories whose endpoints are computed by hand."""
import dataclasses
import json
import math

import pytest

from lab import compare
import train


def test_paired_seeds_endpoints_and_differences_on_known_histories(tmp_path):
    """Budget B = 100; every run samples 40 tokens a step, so steps 1-2 (40, 80 tokens) lie within B.
    final = success of step 2 (the only one in (75, 100]); auc = (40 s1 + 40 s2) / 100."""
    cfg = train.Config(model="smollm2", task="count", compare="otb:4,group_mean:16", seeds="0,1,2",
                       token_budget=100, steps=3)
    success = {"otb:4": [(0.5, 1.0), (0.25, 0.75), (0.0, 0.5)],  # per seed: (step 1, step 2); step 3 is 1.0
               "group_mean:16": [(0.5, 0.5), (0.5, 0.25), (0.0, 0.0)]}
    for c, by_seed in success.items():
        est, n = c.split(":")
        for s, (s1, s2) in enumerate(by_seed):
            run = tmp_path / f"seed{s}" / f"{est}-n{n}"
            run.mkdir(parents=True)
            rows = [dict(step=i + 1, tokens=40 * (i + 1), success=x) for i, x in enumerate((s1, s2, 1.0))]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    compare.analyse_seeds(cfg, tmp_path)
    out = json.loads((tmp_path / "summary.json").read_text())
    final = {p["endpoint"]: p for p in out["paired"]}
    assert final["primary"]["per_seed"] == pytest.approx([0.5, 0.5, 0.5])  # 1 - .5, .75 - .25, .5 - 0
    assert final["primary"]["ci_low"] == pytest.approx(0.5)
    assert final["primary"]["verdict"].startswith("otb:4 is better")
    d_auc = [0.4 * (1.0 + 0.5 - 0.5 - 0.5), 0.4 * (0.75 + 0.25 - 0.5 - 0.25), 0.4 * (0.5 - 0.0)]  # .2, .1, .2
    mu, sd = sum(d_auc) / 3, math.sqrt(sum((d - sum(d_auc) / 3) ** 2 for d in d_auc) / 2)
    assert final["auc"]["per_seed"] == pytest.approx(d_auc)
    assert final["auc"]["mean_diff"] == pytest.approx(mu)
    assert final["auc"]["ci_high"] - mu == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)  # t(.975, 2)
    assert (tmp_path / "compare.png").exists()
    assert "| group_mean:16 | AUC" in (tmp_path / "summary.md").read_text()
    with pytest.raises(SystemExit, match="--token-budget 30 is smaller than one step"):  # 40 tokens > B
        compare.analyse_seeds(dataclasses.replace(cfg, token_budget=30), tmp_path)
