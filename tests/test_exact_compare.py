"""compare.py's equal-token analysis on histories whose endpoints are computed by hand, and what one
seed's comparison concludes (compare.conclusion, summary_text) on histories made by hand."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

from lab import compare
from lab.analysis import stats
from saved import same_text
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


# ---- what one seed's comparison concludes (compare.conclusion), on histories made by hand

T9 = 2.262157162740992  # t(0.975, 9), the tables' 2.262: the 95% t interval over 10 paired steps


def steps(successes, first=1):
    return [dict(step=first + i, success=s) for i, s in enumerate(successes)]


def interval(d, t):
    """Mean and t interval of a list, written out: mean +- t sd / sqrt(n)."""
    n = len(d)
    mean = sum(d) / n
    half = t * math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def test_the_conclusion_names_the_resolved_and_the_unresolved_difference():
    """Reference a; b is 0.2 lower at every one of the last 10 steps, give or take 0.05 (resolved); c
    is 0.1 above and 0.1 below a in turn (mean 0: not resolved). Earlier steps, where c is far below
    a, do not count: only the last 10 steps, the window of final_success."""
    a = [0.9] * 5 + [0.5, 0.6] * 5
    b = [0.9] * 5 + [x - 0.2 + e for x, e in zip([0.5, 0.6] * 5, [0.05, -0.05] * 5)]
    c = [0.0] * 5 + [x + e for x, e in zip([0.5, 0.6] * 5, [0.1, -0.1] * 5)]
    first, second, third = compare.conclusion(["a", "b", "c"], {"a": steps(a), "b": steps(b), "c": steps(c)})
    db = interval([x - y for x, y in zip(a[5:], b[5:])], T9)  # 0.2 -+ 0.05: mean 0.2, sd 0.0527
    dc = interval([x - y for x, y in zip(a[5:], c[5:])], T9)  # -0.1, +0.1: mean 0
    assert db[1] > 0 and dc[1] < 0 < dc[2]
    assert first == ("Final success of a minus each other run, paired by step over the last 10 steps (the same "
                     "prompts at each step; mean and 95% t interval over the steps): "
                     f"b {db[0]:+.3f} [{db[1]:+.3f}, {db[2]:+.3f}]; c {dc[0]:+.3f} [{dc[1]:+.3f}, {dc[2]:+.3f}].")
    assert "b +0.200 [+0.162, +0.238]; c +0.000 [-0.075, +0.075]" in first  # the same, as printed
    assert second == "In these runs the interval excludes 0 for b and contains 0 for c."
    assert third.startswith("Each interval is about these runs, not about the methods:")
    assert "docs/reproduction.md" in third and "docs/stability.md" in third and "not the spread between seeds" in third
    only_c = compare.conclusion(["a", "c"], {"a": steps(a), "c": steps(c)})
    assert only_c[1] == "In these runs every interval contains 0."
    only_b = compare.conclusion(["a", "b"], {"a": steps(a), "b": steps(b)})
    assert only_b[1] == "In these runs every interval excludes 0."


def budget_steps(tokens, successes):
    """A history whose steps sample the given tokens, with the given successes."""
    total = [sum(tokens[:i + 1]) for i in range(len(tokens))]
    return [dict(step=i + 1, tokens=c, success=x) for i, (c, x) in enumerate(zip(total, successes))]


def test_runs_a_budget_ends_at_different_steps_are_compared_on_the_last_quarter_of_the_budget():
    """B = 400 tokens. a samples 20 tokens a step, then 10, 30, 20, 40: 19 steps, its last quarter (300, 400]
    holds 4 steps of weights 10, 30, 20, 40; b samples 50 a step, then 40, 60, 50: 8 steps, 2 in the last
    quarter (weights 60, 50). The difference is the equal-token endpoint's (compare.endpoints' primary) and
    its interval Welch's for the two token-weighted means: b's earlier steps, which its own last 10 steps
    would include, do not count."""
    B = 400
    a = budget_steps([20] * 15 + [10, 30, 20, 40], [0.9] * 15 + [0.5, 0.6, 0.55, 0.7])
    b = budget_steps([50] * 5 + [40, 60, 50], [0.0] * 6 + [0.3, 0.45])
    got = compare.budget_difference(a, b, B)
    ends = [compare.endpoints(h, budget=B, window=40, target=1.0)["primary"] for h in (a, b)]
    assert got["mean"] == pytest.approx(ends[0] - ends[1], rel=1e-12) and got["steps"] == 2
    assert ends[1] == pytest.approx((60 * 0.3 + 50 * 0.45) / 110)  # by hand: the token-weighted last quarter
    want = stats.welch_interval([0.5, 0.6, 0.55, 0.7], [0.3, 0.45], wx=[10, 30, 20, 40], wy=[60, 50])
    assert (got["mean"], got["lo"], got["hi"]) == pytest.approx(want, rel=1e-12)
    b_early = budget_steps([50] * 5 + [40, 60, 50], [0.8] * 6 + [0.3, 0.45])  # steps before 0.75 B changed
    assert compare.budget_difference(a, b_early, B) == pytest.approx(got)
    first, second, third = compare.conclusion(["a", "b"], {"a": a, "b": b}, budget=B)
    assert first.startswith("Success of a minus each other run over the last quarter of the token budget B = 400 ")
    assert f"b {want[0]:+.3f} [{want[1]:+.3f}, {want[2]:+.3f}]." in first and "Welch" in first
    assert compare.conclusion(["a", "b"], {"a": a, "b": b}) == [first, second, third]  # B: the fewest tokens
    same_end = compare.final_difference(steps([0.5] * 12), steps([0.4] * 12))  # ended together: paired by step
    assert same_end["mean"] == pytest.approx(0.1) and same_end["steps"] == 10
    assert compare.conclusion(["a"], {"a": a}) == ["One configuration (a): nothing to compare."]
    one = compare.conclusion(["a", "b"], {"a": steps([0.5]), "b": steps([0.9])})  # one step: no interval
    assert one[0] == "Success of a minus each other run at their last step: b -0.400." and "seeds" in one[1]


def rows_of(*reached):
    return [dict(run=f"r{i}", estimator="otb", group_size=4, steps=10, tokens=100, initial_success=0.1,
                 final_success=0.2, tokens_to_target=t, grad_norm_mean=0.5, seconds=1.0) for i, t in enumerate(reached)]


def test_tokens_to_target_is_a_column_only_where_some_run_reached_the_target():
    histories = {f"r{i}": steps([0.2] * 10) for i in range(2)}
    none = compare.summary_text(rows_of(None, None), histories, 0.35)
    assert none.splitlines()[0] == "| run | tokens | initial_success | final_success | grad_norm_mean | seconds |"
    assert "No run's 10-step moving average of success reached the target 0.35, so the table has no " \
           "tokens_to_target column." in none
    some = compare.summary_text(rows_of(None, 640), histories, 0.35)
    assert "| tokens_to_target |" in some.splitlines()[0] and "| r0 | 100 | 0.100 | 0.200 | - |" in some
    for text in (none, some):  # both end with the conclusion
        assert text.rstrip("\n").splitlines()[-1] == " ".join(compare.conclusion(["r0", "r1"], histories))


@pytest.mark.saved_results
def test_the_saved_default_run_summary_is_what_the_code_writes_from_its_saved_metrics(tmp_path):
    """benchmarks/results/default_run/summary.md is made again from its summary.json and the runs'
    metrics.jsonl (compare.rewrite_summary): its words and integers exactly, its numbers (rounded to 3
    digits) as printed or one unit of the last digit away on another CPU (tests/saved.py)."""
    import shutil
    saved = Path(compare.__file__).resolve().parent.parent / "benchmarks" / "results" / "default_run"
    shutil.copytree(saved, tmp_path / "run")
    compare.rewrite_summary(tmp_path / "run")
    same_text((tmp_path / "run" / "summary.md").read_text(), (saved / "summary.md").read_text(), "summary.md")
