"""The stability replication (benchmarks/stability_replication.py) against answers computed another
way: the sign-flip P by enumerating every sign pattern, the power where every simulated study is the
same, the planning values against the first study's saved results, the protocol's power table
against the function that computes it, Holm's correction, the sensitivity analysis and the post hoc
contrasts on hand-made runs, a two-seed end-to-end run on tiny shapes, and the committed tables
regenerated from the saved runs up to another CPU's rounding (tests/saved.py)."""
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from benchmarks import grid
from benchmarks import stability as st
from benchmarks import stability_replication as rp
from code_repo import commit, project, touch
from lab import machine
from saved import same_record, same_text

ROOT = Path(__file__).resolve().parent.parent
FIRST = ROOT / "benchmarks" / "results" / "stability"
RESULTS = ROOT / "benchmarks" / "results" / "stability_replication"


def enumerated_p(d):
    """Two-sided sign-flip P by listing all 2^n sign patterns."""
    obs = abs(sum(d))
    pats = list(itertools.product((-1, 1), repeat=len(d)))
    return sum(abs(sum(e * abs(x) for e, x in zip(signs, d))) >= obs for signs in pats) / len(pats)


def test_signflip_p_equals_enumeration_of_sign_patterns():
    rng = random.Random(0)
    cases = [[1, 2, 3], [5, 0, 0, 0, 0, 0], [10] * 6, [10] * 5, [-3, 7, 0, 2, -1]]
    cases += [[rng.randint(-110, 110) for _ in range(rng.randint(1, 11))] for _ in range(30)]
    for d in cases:
        assert rp.signflip_p(d) == pytest.approx(enumerated_p(d), abs=1e-15), d
    assert rp.signflip_p([10] * 6) == 2 / 64 and rp.signflip_p([10] * 5) == 2 / 32  # 6 seeds: the fewest that can reach 0.05


def test_power_where_every_simulated_study_is_the_same():
    # base without spread: every d_s equals the effect, so P is fixed and the power is 0 or 1
    assert rp.power(6, 10, base=[4, 4, 4], sims=50) == 1.0  # P = 2/64
    assert rp.power(5, 10, base=[4, 4, 4], sims=50) == 0.0  # P = 2/32
    assert rp.power(6, 0, base=[4, 4, 4], sims=50) == 0.0  # all d_s = 0: P = 1


@pytest.mark.saved_results
def test_planning_values_are_the_first_studys_saved_differences():
    per_run = json.loads((FIRST / "results.json").read_text())["per_run"]
    o, g = per_run["otb lr 0.0007"], per_run["group_mean lr 0.0007"]
    assert [o[str(s)]["time_steps"] - g[str(s)]["time_steps"] for s in range(12)] == rp.FIRST_STUDY_D
    assert not set(rp.SEEDS) & (set(range(12)) | {100, 101})  # fresh seeds


def test_the_protocols_power_table_is_what_the_function_prints():
    doc = (ROOT / "docs" / "stability_replication_protocol.md").read_text().splitlines()
    for line in rp.power_table(ns=(12, 24)):
        assert line in doc, line


def test_the_bootstrap_interval_is_the_percentiles_of_every_resample_of_the_seeds():
    """The secondary interval (scipy.stats.bootstrap, percentile, 10,000 draws) against the exact bootstrap
    distribution: the means of all 5^5 resamples of five seeds' differences, enumerated, and their 2.5% and
    97.5% quantiles; within 0.4 steps (the means step by 0.2). The same draws each time (seed 0)."""
    d = [1, 2, 3, 4, 10]
    per_run = {("otb", 7e-4): {s: dict(time_steps=20 + x, final_success=0.0) for s, x in enumerate(d)},
               ("group_mean", 7e-4): {s: dict(time_steps=20, final_success=0.0) for s in range(5)}}
    c = rp.contrast(per_run, ("otb", 7e-4), ("group_mean", 7e-4))
    means = [sum(d[i] for i in pick) / 5 for pick in itertools.product(range(5), repeat=5)]
    lo, hi = np.quantile(means, [0.025, 0.975])
    assert c["d"] == d
    assert abs(c["boot_lo"] - lo) <= 0.4 and abs(c["boot_hi"] - hi) <= 0.4, (c["boot_lo"], c["boot_hi"], lo, hi)
    again = rp.contrast(per_run, ("otb", 7e-4), ("group_mean", 7e-4))
    assert (again["boot_lo"], again["boot_hi"]) == (c["boot_lo"], c["boot_hi"])


def test_contrast_and_failure_by_hand():
    def run(t, final):
        return dict(time_steps=t, final_success=final)
    per_run = {("otb", 7e-4): {0: run(50, 0.2), 1: run(120, 0.3), 2: run(10, 0.0)},
               ("group_mean", 7e-4): {0: run(10, 0.0), 1: run(20, 0.1), 2: run(10, 0.0), 3: run(10, 0.0)}}
    c = rp.contrast(per_run, ("otb", 7e-4), ("group_mean", 7e-4), boot=200)
    assert c["seeds"] == [0, 1, 2] and c["d"] == [40, 100, 0] and c["delta"] == pytest.approx(140 / 3)
    assert (c["later"], c["earlier"]) == (2, 0) and c["p_value"] == pytest.approx(enumerated_p([40, 100, 0]))
    assert c["verdict"] == "no difference shown"  # three seeds cannot reach 0.05
    assert c["final_delta"] == pytest.approx(0.4 / 3) and c["boot_lo"] >= 0 and c["boot_hi"] <= 100
    assert rp.failed([{"success": 1.0}] + [{"success": 0.02}] * 20)  # only the last 20 steps count
    assert not rp.failed([{"success": 0.0}] * 19 + [{"success": 0.5}])


def test_plan_runs_the_primary_block_for_every_seed_first():
    order = rp.plan([200, 201, 202])
    assert [name for name, _ in order[:3]] == ["R1"] * 3 and order[0][1] == [("otb", 200, 7e-4), ("group_mean", 200, 7e-4)]
    assert [name for name, _ in order] == ["R1"] * 3 + ["R2"] * 3 + ["R3"] * 3 + ["R4"] * 3
    assert order[-1][1] == [("otb", 202, 1e-3), ("group_mean", 202, 1e-3)]


def test_runner_end_to_end_two_tiny_seeds(tmp_path, monkeypatch):
    """Two sittings, as a study resumed on another day, in a copy of the project (tests/code_repo.py):
    seed 0 from a clean commit A, then (after commit B and an uncommitted edit) seeds 0 and 1 with
    --allow-dirty: seed 0 is kept, seed 1 runs. Each run records the sitting that ran it and, in its
    own record, the code it ran (the edit's patch saved beside it); results.json every commit the
    study ran under."""
    tiny = ("--tiny-hidden 32 --tiny-layers 1 --warmup-max-steps 0 --horizon 4 --prompts-per-step 2 "
            "--checkpoint-minutes 1000")
    out, repo = tmp_path / "out", tmp_path / "repo"
    first = project(repo, monkeypatch, st, grid)
    common = ["--runs", str(tmp_path / "runs"), "--out", str(out), "--blocks", "R1", "--steps", "2",
              "--train-args", tiny]
    rp.main(common + ["--seeds", "0"])
    touch(repo, "tasks.py")
    second = commit(repo, "second")
    touch(repo)
    args = common + ["--seeds", "0,1", "--allow-dirty"]
    record = rp.main(args)
    names = {s: [st.run_name(e, s, 7e-4) for e in ("otb", "group_mean")] for s in (0, 1)}
    assert sorted(p.name for p in (out / "runs").glob("*.jsonl")) == sorted(f"{n}.jsonl" for n in names[0] + names[1])
    code = record["code"]
    assert code["commits"] == [first, second] and code["not_recorded"] == 0
    assert code["allow_dirty"] == sorted(names[1]) and code["machines"] == [machine.fingerprint()]
    for seed, commit_, dirty, changes in ((0, first, False, []), (1, second, True, ["train.py"])):
        for name in names[seed]:
            saved = json.loads((out / "runs" / f"{name}.code.json").read_text())
            assert saved == code["runs"][name]
            assert (saved["commit"], saved["allow_dirty"], saved["code_changes"]) == (commit_, dirty, changes), name
            own = saved["run"]  # the run's own record, as it started
            assert own == json.loads((tmp_path / "runs" / name / "provenance.json").read_text())
            assert (own["commit"], own["code_changes"], own["diff_sha256"] is None) == (commit_, changes, not dirty)
            assert (out / "runs" / f"{name}.code.diff").exists() == dirty
    patch = (out / "runs" / f"{names[1][0]}.code.diff").read_text()
    assert "+# an edit made while a study runs" in patch and "train.py" in patch
    assert json.loads((out / "results.json").read_text())["code"] == code
    diff = code["runs"][names[1][0]]["run"]["diff_sha256"][:12]
    assert (f"Code: commit {first[:12]} (2 runs), commit {second[:12]} (2 runs); 2 runs started with --allow-dirty, "
            "from uncommitted changes to train.py (of 4 saved runs; each run's record: runs/<name>.code.json). "
            f"As the runs recorded it when they started: commit {first[:12]} (2 runs), commit {second[:12]} with "
            f"uncommitted changes to train.py (diff {diff}) (2 runs); each run's uncommitted changes: "
            "runs/<name>.code.diff.") \
        in (out / "summary.md").read_text()
    loads = [json.loads(x) for x in (out / "load.jsonl").read_text().splitlines()]
    assert [(r["block"], r["seed"], r["event"]) for r in loads] == [("R1", 0, "start"), ("R1", 0, "end"),
                                                                    ("R1", 1, "start"), ("R1", 1, "end")]
    assert all(len(r["load"]) == 3 for r in loads)
    summary = (out / "summary.md").read_text()
    assert "| otb lr 0.0007 vs group_mean lr 0.0007 | 2 |" in summary
    assert "Interim: 2 of the 2 planned" not in summary and "Verdict (as pre-registered)" in summary
    assert (out / "survival.png").stat().st_size > 0
    rp.main(args)  # resumes: nothing runs again, no new load lines
    assert len((out / "load.jsonl").read_text().splitlines()) == 4
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "runs").symlink_to(out / "runs")
    rp.main(["--from-saved", str(tmp_path / "saved"), "--out", str(tmp_path / "again")])
    again = (tmp_path / "again" / "summary.md").read_text()
    assert "Interim: 2 of the 24 planned paired seeds" in again  # --from-saved reads against the protocol's 24


@pytest.mark.saved_results
@pytest.mark.skipif(not (RESULTS / "runs").is_dir(), reason="no saved replication runs yet")
def test_the_committed_tables_are_what_the_script_writes_from_the_saved_runs(tmp_path):
    """summary.md by its words and integers, each rounded number as printed or one unit of its last digit
    away (tests/saved.py: a value at a rounding boundary prints either way on two CPUs); results.json as the same record
    (tests/saved.py: everything exact but floats, those to rel 1e-9). Not byte for byte: the bootstrap
    interval's 10,000 means of 24 float64 differences and the t intervals' sums are added in another order
    on another CPU (with the earlier bootstrap the same saved runs gave boot_lo 2.5416666666666665 on one
    machine and 2.541666666666666 on another)."""
    rp.main(["--from-saved", str(RESULTS), "--out", str(tmp_path)])
    same_text((tmp_path / "summary.md").read_text(), (RESULTS / "summary.md").read_text(), "summary.md")
    same_record(json.loads((tmp_path / "results.json").read_text()), json.loads((RESULTS / "results.json").read_text()))


def test_holm_within_each_rate_and_the_verdict_from_the_adjusted_p():
    def c(b, lr, p, delta=5.0):
        return dict(a=f"otb lr {lr:g}", b=f"{b} lr {lr:g}", seeds=list(range(24)), delta=delta, p_value=p)
    got = rp.with_holm([c("rloo", 7e-4, 0.034), c("grpo", 7e-4, 0.026), c("otb_loo", 7e-4, 0.0458),
                        c("reinforce", 7e-4, 0.6088, -4.5), c("group_mean", 1e-3, 0.02)])
    # at 7e-4, by hand: sorted 0.026 x 4 = 0.104, 0.034 x 3 = 0.102, 0.0458 x 2 = 0.0916, 0.6088 x 1,
    # each raised to the running maximum; at 1e-3 one test, unadjusted
    assert [g["p_holm"] for g in got] == pytest.approx([0.104, 0.104, 0.104, 0.6088, 0.02])
    assert [g["holm_family"] for g in got] == [4, 4, 4, 4, 1]
    # one family of five: 0.02 x 5 = 0.1, 0.026 x 4 = 0.104, 0.034 x 3 = 0.102, 0.0458 x 2, 0.6088
    assert [g["p_holm_all"] for g in got] == pytest.approx([0.104, 0.104, 0.104, 0.6088, 0.1])
    assert [g["verdict"] for g in got] == ["no difference shown"] * 4 + ["otb collapses later than group_mean"]
    assert [g["p_value"] for g in got] == [0.034, 0.026, 0.0458, 0.6088, 0.02]  # the raw P is kept


def per_run_of(rows):
    """{(est, 7e-4): {seed: endpoints}} from {seed: (otb step, group_mean step)}, None: no collapse."""
    def run(t):
        return dict(collapse_step=t, time_steps=t or 120, final_success=0.0, failed=False, collapsed=t is not None,
                    max_grad_norm=1.0)
    return {("otb", 7e-4): {s: run(a) for s, (a, _) in rows.items()},
            ("group_mean", 7e-4): {s: run(b) for s, (_, b) in rows.items()}}


def test_sensitivity_by_hand():
    # d = 0 (both at step 10), 0 (neither collapsed), +30, +20, -10, +5
    rows = {0: (10, 10), 1: (None, None), 2: (40, 10), 3: (30, 10), 4: (10, 20), 5: (15, 10)}
    per_run = per_run_of(rows)
    primary = rp.contrast(per_run, ("otb", 7e-4), ("group_mean", 7e-4), boot=100)
    sens = rp.sensitivity(primary, per_run, largest=2)
    assert sens["ties"] == {"step 10": [0], "censored": [1]} and sens["untied"] == 4
    d = [0, 0, 30, 20, -10, 5]
    assert sens["leave_one_out"] == {str(s): pytest.approx(enumerated_p(d[:s] + d[s + 1:])) for s in range(6)}
    assert sens["loo_max"] == max(sens["leave_one_out"].values())
    # Wilcoxon on 30, 20, -10, 5: ranks 4, 3, 2, 1, W+ = 8; P(W+ >= 8 or W+ <= 2) = (3 + 3) / 16
    assert sens["signed_rank"] == dict(n=4, w_plus=8.0, p=6 / 16)
    # sign test 3 later, 1 earlier: 2 (1 + 4) / 16
    assert sens["sign_test"] == dict(later=3, earlier=1, p=10 / 16)
    assert sens["largest"] == [dict(seed=2, d=30), dict(seed=3, d=20)]
    assert (sens["largest_sum"], sens["total"], sens["rest"]) == (50, 45, 4)
    assert sens["rest_mean"] == pytest.approx(-5 / 4) and sens["rest_p"] == enumerated_p([0, 0, -10, 5])
    lines = rp.sensitivity_lines(sens, primary)
    assert lines[0] == ("- Ties: d = 0 on 2 of the 6 seeds: both runs collapsed at step 10 on 1 (0); neither run "
                        "collapsed (both censored at 120) on 1 (1). The test rests on the other 4 (3 later, "
                        "1 earlier).")
    assert "(seed 2: +30, seed 3: +20) sum to +50 of the total +45 steps (111%)" in lines[3]


def test_post_hoc_reinforce_and_the_first_studys_endpoint():
    per_run = per_run_of({0: (10, 10), 1: (None, 10), 2: (50, None), 3: (None, None)})
    per_run[("reinforce", 7e-4)] = per_run_of({0: (20, 0), 1: (None, 0), 2: (60, 0), 3: (None, 0)})[("otb", 7e-4)]
    hoc = rp.post_hoc(per_run)
    first = hoc["first_endpoint"]  # collapsed: otb on 0, 2; group_mean on 0, 1
    assert (first["a_only"], first["b_only"], first["both"], first["neither"]) == (1, 1, 1, 1)
    assert first["p_value"] == 1.0
    r = hoc["reinforce_vs_group_mean"]
    assert r["d"] == [10, 110, -60, 0] and r["verdict"] == "post hoc: descriptive"
