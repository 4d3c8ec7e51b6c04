"""The stability study's statistics (benchmarks/stability.py) against answers computed another way:
closed forms of the Wilson interval, McNemar's test by enumerating every sign pattern, Kaplan-Meier
by hand, the power by enumerating every joint outcome of the pairs; the collapse rule on hand-made
histories; the committed tables regenerated up to another CPU's rounding (tests/saved.py) and the
docs checked against them; and a two-run end-to-end smoke of the runner."""
import datetime
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from statsmodels.duration.survfunc import SurvfuncRight

from benchmarks import grid
from benchmarks import stability as st
from code_repo import project
from lab import machine
from saved import same_record, same_text

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "stability"
Z = 1.959963984540054  # the normal 0.975 quantile


# ---- Wilson interval, eq. (4)

@pytest.mark.parametrize("n", [1, 8, 12, 30])
def test_wilson_closed_forms_at_zero_all_and_half(n):
    z2 = Z * Z
    assert st.wilson(0, n)[1:] == pytest.approx((0.0, z2 / (n + z2)), abs=1e-12)  # k = 0: [0, z^2/(n+z^2)]
    assert st.wilson(n, n)[1:] == pytest.approx((n / (n + z2), 1.0), abs=1e-12)  # k = n: mirror image
    if n % 2 == 0:  # k = n/2: 1/2 -+ z / (2 sqrt(n + z^2))
        half = Z / (2 * math.sqrt(n + z2))
        assert st.wilson(n // 2, n) == pytest.approx((0.5, 0.5 - half, 0.5 + half), abs=1e-12)


def test_wilson_textbook_value_and_bad_input():
    assert st.wilson(3, 10) == pytest.approx((0.3, 0.1078, 0.6032), abs=5e-5)  # the usual worked example
    with pytest.raises(ValueError, match="k=9, n=8"):
        st.wilson(9, 8)


# ---- exact McNemar, eq. (5)

def enumerated_p(b, c):
    """Two-sided P by enumeration: under H0 each of the m discordant pairs goes either way with
    probability 1/2; P = share of the 2^m patterns at least as far from m/2 as the observed b."""
    m = b + c
    far = sum(abs(sum(signs) - m / 2) >= abs(b - m / 2) for signs in itertools.product((0, 1), repeat=m))
    return far / 2 ** m


@pytest.mark.parametrize("b, c", [(b, c) for b in range(8) for c in range(8)])
def test_mcnemar_equals_enumeration_of_sign_patterns(b, c):
    assert st.mcnemar_exact(b, c) == pytest.approx(enumerated_p(b, c), abs=1e-15)


def test_mcnemar_hand_values():
    assert st.mcnemar_exact(6, 0) == 2 / 64  # the fewest discordant pairs that reach P < 0.05
    assert st.mcnemar_exact(0, 5) == 2 / 32  # five are not enough
    assert st.mcnemar_exact(0, 0) == 1.0


# ---- Kaplan-Meier, eq. (6)

def test_kaplan_meier_by_hand():
    # units: events at 2, 3, 5; censored at 3 (still at risk at 3) and 7
    curve = st.kaplan_meier([2, 3, 3, 5, 7], [True, True, False, True, False])
    assert [(t, n, d) for t, n, d, *_ in curve] == [(2, 5, 1), (3, 4, 1), (5, 2, 1)]
    assert [s for *_, s, _, _ in curve] == pytest.approx([4 / 5, 4 / 5 * 3 / 4, 4 / 5 * 3 / 4 * 1 / 2])
    # Greenwood at t = 2: 1/(5*4); log-log interval 0.8^exp(+-z sqrt(0.05)/|ln 0.8|)
    sigma = math.sqrt(1 / 20) / -math.log(0.8)
    assert curve[0][4:] == pytest.approx((0.8 ** math.exp(Z * sigma), 0.8 ** math.exp(-Z * sigma)))
    assert st.km_median(curve) == 5  # S(3) = 0.6 > 1/2, S(5) = 0.3
    assert st.survival_at(curve, 1)[0] == 1.0 and math.isnan(st.survival_at(curve, 1)[1]) and st.survival_at(curve, 4)[0] == pytest.approx(0.6)


def test_kaplan_meier_agrees_with_statsmodels_and_its_median_is_reached_at_one_half():
    """scipy's estimate (what kaplan_meier uses) against statsmodels' SurvfuncRight, another implementation:
    the same times, numbers at risk and S, and the log-log interval formed by hand from statsmodels'
    Greenwood error, sigma = se / (S |log S|). The study's otb cell at 7e-4 has S(68) = 1/2 exactly (10
    collapses, 2 censored at 120), which a float product can give as 0.5000000000000001: the median is
    still 68, the first t with S(t) <= 1/2."""
    times = [51, 105, 40, 10, 87, 120, 114, 114, 12, 10, 68, 120]
    events = [t != 120 for t in times]
    fit = SurvfuncRight(np.array(times, dtype=float), np.array(events, dtype=float))
    curve = st.kaplan_meier(times, events)
    assert [t for t, *_ in curve] == list(fit.surv_times) and [n for _, n, *_ in curve] == list(fit.n_risk)
    assert [d for _, _, d, *_ in curve] == list(fit.n_events)
    assert [s for *_, s, _, _ in curve] == pytest.approx(list(fit.surv_prob), rel=1e-12)
    for row, s0, se in zip(curve, fit.surv_prob, fit.surv_prob_se):
        sigma = se / (s0 * -math.log(s0))  # the log-log interval's
        assert row[4:] == pytest.approx((s0 ** math.exp(Z * sigma), s0 ** math.exp(-Z * sigma)), rel=1e-9), row
    assert st.survival_at(curve, 68)[0] == pytest.approx(0.5) and st.km_median(curve) == 68


def test_kaplan_meier_without_censoring_is_the_empirical_survival():
    times = [4, 9, 9, 12, 20, 20, 20, 31]
    curve = st.kaplan_meier(times, [True] * 8)
    for t, _, _, s, _, _ in curve:
        assert s == pytest.approx(sum(u > t for u in times) / 8)
    assert math.isnan(curve[-1][4])  # S = 0: no log-log interval


# ---- power, eq. (7)

def enumerated_power(n, p_a, p_b):
    """Every joint outcome of n pairs (each pair: A fails or not, B fails or not), its probability,
    and whether the exact test rejects on it."""
    total = 0.0
    for outcome in itertools.product([(1, 1), (1, 0), (0, 1), (0, 0)], repeat=n):
        prob = math.prod((p_a if a else 1 - p_a) * (p_b if b else 1 - p_b) for a, b in outcome)
        b_ = sum(a and not b for a, b in outcome)
        c_ = sum(b and not a for a, b in outcome)
        total += prob * (st.mcnemar_exact(b_, c_) <= 0.05)
    return total


@pytest.mark.parametrize("n, p_a, p_b", [(4, 0.1, 0.8), (6, 0.0, 0.9), (7, 0.3, 0.6), (6, 0.5, 0.5)])
def test_power_equals_enumeration_of_joint_outcomes(n, p_a, p_b):
    assert st.mcnemar_power(n, p_a, p_b) == pytest.approx(enumerated_power(n, p_a, p_b), abs=1e-12)


def test_power_hand_values():
    assert st.mcnemar_power(6, 0.0, 1.0) == pytest.approx(1.0)  # six discordant pairs one way: P = 1/32
    assert st.mcnemar_power(5, 0.0, 1.0) == 0.0  # five: P = 1/16 > 0.05
    assert st.mcnemar_power(10, 0.4, 0.4) < 0.05  # no difference: at most the test's size


# ---- the collapse rule, eqs. (1)-(3)

def test_collapse_step_on_hand_made_histories():
    # S(t) = (0.5 (20 - t) + 0.125 (t - 10)) / 10 for 10 <= t <= 20 falls below 0.25 first at t = 17
    assert st.collapse_step([0.5] * 10 + [0.125] * 20) == 17
    assert st.collapse_step([0.25] * 40) is None
    # a collapse at step 2: the best level is step 1's success (0.5); detected at the first full window
    assert st.collapse_step([0.5] + [0.0] * 30) == 10
    # growth first: the maximum is the best window (0.75), so a fall to 0.25 is a collapse
    assert st.collapse_step([0.25] * 10 + [0.75] * 20 + [0.25] * 20) == 38  # S(37) = 0.4, S(38) = 0.35 < 0.375
    assert st.collapse_step([0.0] * 20) is None  # never any success: nothing to lose
    # a dip that recovers: S(16) = 0.2 < 0.25, but S(30) = 0.5; a dip, not a collapse
    dip = [0.5] * 10 + [0.0] * 10 + [0.5] * 20
    assert st.collapse_step(dip) is None and st.collapse_step(dip, persist=False) == 16


def test_summarize_run_reads_the_collapse_the_tokens_and_the_power_before_it():
    # success 0.5 for 15 steps, then 0: S(t) = 0.5 (25 - t) / 10 < 0.25 first at t = 21, and stays
    # total_power 1 except 11 at step 5: P(10..14) = 2 (window holds step 5), P(15..) = 1
    rows = [dict(step=i + 1, success=0.5 if i < 15 else 0.0, tokens=100 * (i + 1), grad_norm=float(i),
                 total_power=11.0 if i == 4 else 1.0) for i in range(40)]
    r = st.summarize_run(rows)
    assert r["collapsed"] and r["collapse_step"] == 21 and r["time_tokens"] == 2100 and r["dip_step"] == 21
    assert r["max_grad_norm_before"] == 20.0 and r["max_grad_norm"] == 39.0
    assert r["power_rise"] == 1.0  # only P(10) = 2 lies before the fall (t <= 21 - 10 = 11: P(10), P(11))
    assert st.power_rise([1.0] * 9 + [1.0] * 5 + [21.0] + [1.0] * 10, None) == 3.0  # P(15..24) = 3, P(10) = 1
    assert st.power_rise([1.0] * 30, 15) is None  # collapse before 2k: nothing before the fall


def test_around_collapse_takes_the_window_before_the_fall_and_the_last_window():
    rows = [dict(grad_norm=float(u), response_len=2.0 * u) for u in range(1, 41)]  # step u: grad u, length 2u
    got = st.around_collapse(rows, 25)  # before: steps 6..15 (mean 10.5); last: steps 31..40 (mean 35.5)
    assert got == dict(grad_before=10.5, grad_last=35.5, len_before=21.0, len_last=71.0)
    assert st.around_collapse(rows, 19)["grad_before"] is None  # a fall inside the first 2k steps


# ---- names, order, the committed tables

def test_run_names_round_trip_and_the_primary_pair_runs_first():
    assert st.parse_name(st.run_name("otb_loo", 7, 5e-4)) == ("otb_loo", 7, 5e-4)
    with pytest.raises(ValueError, match="not a run name"):
        st.parse_name("otb-seed1")
    order = [job for block in st.blocks(st.ESTIMATORS, list(range(10)), st.LADDER, st.PRIMARY_LR) for job in block]
    primary_pair = [(e, s, st.PRIMARY_LR) for s in range(10) for e in ("otb", "group_mean")]
    assert order[:20] == primary_pair  # the primary comparison first, seed by seed
    below = min(st.LADDER)
    assert order[20:22] == [("otb", 0, below), ("group_mean", 0, below)]  # then the rung below, seeds 0-7
    assert order[36] == ("otb_loo", 0, st.PRIMARY_LR)  # then the other estimators at the primary rate
    planned = {(e, s, lr) for s in range(10) for lr in st.LADDER for e in ("otb", "group_mean")} | {
        (e, s, st.PRIMARY_LR) for s in range(10) for e in st.ESTIMATORS}
    assert len(order) == len(set(order)) and set(order) == planned


@pytest.mark.saved_results
@pytest.mark.skipif(not (RESULTS / "runs").is_dir(), reason="no saved results yet")
def test_the_committed_tables_are_what_the_script_writes_from_the_saved_runs(tmp_path):
    """summary.md by its words and integers, each rounded number as printed or one unit of its last digit
    away (tests/saved.py: a value at a rounding boundary prints either way on two CPUs); results.json as the same record
    (tests/saved.py: floats to rel 1e-9, everything else exact), since its floats (Kaplan-Meier
    products, Greenwood sums, geometric means) keep their last bits, which another CPU's libm and
    summation order may move."""
    st.main(["--from-saved", str(RESULTS), "--out", str(tmp_path)])
    same_text((tmp_path / "summary.md").read_text(), (RESULTS / "summary.md").read_text(), "summary.md")
    same_record(json.loads((tmp_path / "results.json").read_text()), json.loads((RESULTS / "results.json").read_text()))


def test_runner_end_to_end_two_tiny_runs(tmp_path, monkeypatch):
    """Two runs from a clean checkout of the project (tests/code_repo.py): each run folder holds its
    own record of its code (provenance.json), and each run's commit and machine are saved beside its
    metrics and in results.json."""
    tiny = ("--tiny-hidden 32 --tiny-layers 1 --warmup-max-steps 0 --horizon 4 --prompts-per-step 2 "
            "--checkpoint-minutes 1000")
    args = ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--estimators", "otb",
            "--seeds", "0,1", "--lrs", "1e-3", "--primary-lr", "1e-3", "--steps", "2", "--train-args", tiny]
    head = project(tmp_path / "repo", monkeypatch, st, grid)
    record = st.main(args)
    names = [st.run_name("otb", seed, 1e-3) for seed in (0, 1)]
    assert record["code"]["commits"] == [head] and record["code"]["not_recorded"] == 0
    for name in names:
        own = json.loads((tmp_path / "runs" / name / "provenance.json").read_text())  # written by the run
        assert (own["commit"], own["code_changes"], own["diff_sha256"], own["diff"]) == (head, [], None, None)
        saved = json.loads((tmp_path / "out" / "runs" / f"{name}.code.json").read_text())
        assert saved == record["code"]["runs"][name] and saved["run"] == own
        assert (saved["commit"], saved["code_changes"], saved["allow_dirty"]) == (head, [], False)
        assert saved["machine"] == machine.fingerprint()
    for seed in (0, 1):
        name = st.run_name("otb", seed, 1e-3)
        full = [json.loads(x) for x in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        saved = [json.loads(x) for x in (tmp_path / "out" / "runs" / f"{name}.jsonl").read_text().splitlines()]
        assert [list(r) for r in saved] == [st.KEEP] * 2
        assert [r["tokens"] for r in saved] == [r["tokens"] for r in full]
        assert [r["grad_norm"] for r in saved] == pytest.approx([r["grad_norm"] for r in full], rel=1e-5)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| otb | 0.001 | 2 | 0 |" in summary  # two seeds, no collapse possible in 2 steps
    assert "| otb lr 0.001 vs group_mean lr 0.001 | 0 |" in summary  # no group_mean runs: no pairs
    st.main(["--from-saved", str(tmp_path / "out"), "--out", str(tmp_path / "again"), "--primary-lr", "1e-3"])
    assert (tmp_path / "again" / "summary.md").read_text() == summary
    assert f"Code: commit {head[:12]} (2 runs) (of 2 saved runs;" in summary
    assert f"As the runs recorded it when they started: commit {head[:12]} (2 runs)." in summary


REPLICATION = RESULTS.parent / "stability_replication"
DOC = RESULTS.parent.parent.parent / "docs" / "stability.md"


def blocks_copied(doc):
    """The lines of every ``<!-- from: ... -->`` ... ``<!-- end -->`` block of a page, blank lines left out."""
    lines, inside = [], False
    for line in doc.splitlines():
        if line.startswith("<!-- from:"):
            inside = True
        elif line.startswith("<!-- end -->"):
            inside = False
        elif inside and line.strip():
            lines.append(line)
    return lines


@pytest.mark.saved_results
@pytest.mark.skipif(not (REPLICATION / "summary.md").is_file(), reason="no saved results yet")
def test_the_docs_tables_and_copied_lines_are_lines_of_the_committed_summaries():
    """Every table row of docs/stability.md, and every line of its ``<!-- from: -->`` blocks (the
    sensitivity paragraph, the Code lines), is a line of the first study's summary.md or of the
    replication's, never typed by hand; the corrected reading has no "does as well"."""
    doc = DOC.read_text()
    summary = (RESULTS / "summary.md").read_text().splitlines() + (REPLICATION / "summary.md").read_text().splitlines()
    rows = [line for line in doc.splitlines() if line.startswith("|")]
    assert len(rows) >= 12 and [r for r in rows if r not in summary] == []
    copied = blocks_copied(doc)
    assert len(copied) >= 6 and [line for line in copied if line not in summary] == []
    assert any(line.startswith("- Ties: d = 0 on") for line in copied)  # the sensitivity paragraph is there
    readme = (DOC.parent.parent / "README.md").read_text()
    assert not [w for w in ("does as well", "did as well", "do as well") if w in doc or w in readme]


HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")  # a commit: hex with a digit and a letter


@pytest.mark.saved_results
@pytest.mark.skipif(not (REPLICATION / "results.json").is_file(), reason="no saved results yet")
def test_what_the_docs_say_about_the_code_that_ran_is_what_the_runs_record():
    """For each study, the Code line written from its runs' records (runs/<name>.code.json, gathered
    in results.json) is in docs/stability.md; and every commit the page names in its prose is either
    one the records hold or sits in a paragraph that says the commit is not recorded (a procedure is
    not a record)."""
    doc = DOC.read_text()
    recorded = []
    for folder in (RESULTS, REPLICATION):
        code = json.loads((folder / "results.json").read_text())["code"]
        assert len(code["runs"]) == len(list((folder / "runs").glob("*.jsonl")))
        assert code["not_recorded"] == sum(r == st.NOT_RECORDED for r in code["runs"].values())
        assert st.code_line(code) in blocks_copied(doc)
        recorded += code["commits"]
    prose = re.sub(r"```.*?```", "", doc, flags=re.S)  # commands are instructions, not claims
    for paragraph in prose.split("\n\n"):
        for named in HASH.findall(paragraph):
            assert any(c.startswith(named) for c in recorded) or "not recorded" in paragraph, (named, paragraph)


@pytest.mark.saved_results
def test_the_replications_times_are_those_of_its_load_record():
    """The block end times and the R1 seed durations that docs/stability.md states, from load.jsonl."""
    rows = [json.loads(x) for x in (REPLICATION / "load.jsonl").read_text().splitlines()]
    when = lambda r: datetime.datetime.strptime(r["utc"], "%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    doc = " ".join(DOC.read_text().split())  # one line: the page wraps its sentences anywhere
    for block in ("R1", "R2", "R3", "R4"):
        end = max(when(r) for r in rows if r["block"] == block and r["event"] == "end")
        assert end.strftime("%H:%M:%S") in doc, block
    start = {r["seed"]: when(r) for r in rows if r["block"] == "R1" and r["event"] == "start"}
    minutes = [(when(r) - start[r["seed"]]).total_seconds() / 60 for r in rows
               if r["block"] == "R1" and r["event"] == "end"]
    assert len(minutes) == 24
    assert f"took {min(minutes):.1f}-{max(minutes):.1f} minutes, {sum(m < 3 for m in minutes)} of the 24 under 3" in doc
    last = max(when(r) for r in rows if r["block"] == "R1")
    assert f"R1 from {min(start.values()):%H:%M:%S} to {last:%H:%M:%S}" in doc
