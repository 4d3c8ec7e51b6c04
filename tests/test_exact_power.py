"""How many paired seeds the GPU preset needs, and the learning-rate pilot's near-tie rule, against
exact answers: the paired t test's power (stats.paired_t_power, scipy's noncentral t) at effect 0 (the
level) and against a simulation, and the seeds it asks for against the normal-theory closed form; the
planning values recomputed from the saved CPU study; the pilot's standard error against the binomial
closed form."""
import json
import math
import statistics
from pathlib import Path
from statistics import NormalDist

import pytest
from scipy.stats import t as student_t
import torch

from lab import compare
from lab import preflight
from lab.analysis import stats
from lab import options
from saved import same_text

ROOT = Path(__file__).resolve().parent.parent
Z = NormalDist().inv_cdf


@pytest.mark.parametrize("n", [2, 3, 4, 6, 11, 30])
def test_the_power_at_no_effect_is_the_level(n):
    """At effect 0 the noncentral t is the central t: P(|T| > t(0.975, n - 1)) = 0.05 exactly, both tails
    read (one tail alone would give half the level)."""
    assert stats.paired_t_power(0.0, 1.0, n, 0.05) == pytest.approx(0.05, abs=1e-7)
    assert stats.paired_t_power(0.0, 3.0, n, 0.01) == pytest.approx(0.01, abs=1e-7)


@pytest.mark.parametrize("effect, sd, n", [(0.0935, 0.0627, 6), (0.0935, 0.0627, 3), (-0.5, 1.0, 10)])
def test_the_power_matches_a_simulated_paired_t_test(effect, sd, n):
    """400,000 simulated studies of n normal paired differences: the fraction whose 95% t interval
    excludes 0 is the power, to 4 simulation standard errors."""
    g = torch.Generator().manual_seed(0)
    d = effect + sd * torch.randn(400_000, n, generator=g, dtype=torch.float64)  # (studies, n)
    t = d.mean(1) / (d.std(1) / math.sqrt(n))
    rejected = (t.abs() > student_t.ppf(0.975, n - 1)).double().mean().item()
    power = stats.paired_t_power(effect, sd, n, 0.05)
    assert abs(rejected - power) < 4 * math.sqrt(power * (1 - power) / 400_000), (rejected, power)


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0])
def test_seeds_needed_against_the_normal_closed_form(ratio):
    """n_z = ((z(0.975) + z(0.8)) / (effect / sd))^2 assumes a known sd, so the t test needs at least
    that many; Guenther's n_z + z(0.975)^2 / 2 is within one of the exact answer; and the answer is the
    smallest n with power >= 0.8."""
    n = stats.seeds_needed(ratio, 1.0)
    n_z = ((Z(0.975) + Z(0.8)) / ratio) ** 2
    assert n >= n_z and abs(n - math.ceil(n_z + Z(0.975) ** 2 / 2)) <= 1, (n, n_z)
    assert stats.paired_t_power(ratio, 1.0, n) >= 0.8
    assert n == 2 or stats.paired_t_power(ratio, 1.0, n - 1) < 0.8


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="non-zero"):
        stats.seeds_needed(0.0, 1.0)
    with pytest.raises(ValueError, match="sd must be > 0"):
        stats.paired_t_power(0.1, 0.0, 5)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        stats.paired_t_power(0.1, 1.0, 1)


@pytest.mark.saved_results
def test_the_planning_values_are_the_saved_studys_and_the_preset_has_the_seeds_they_ask_for():
    """effect: mean of otb:4 - group_mean:16 (primary endpoint) over the 6 seeds of the saved CPU study;
    sd: the larger between-seed SD of the paired differences of the two primary contrasts."""
    r = json.loads((ROOT / "benchmarks/results/equal_tokens/results.json").read_text())
    vs16 = next(p for p in r["post_hoc_vs_group_mean16"] if p["comparator"] == "otb:4" and p["endpoint"] == "primary")
    vs4 = next(p for p in r["paired"] if p["comparator"] == "group_mean:4" and p["endpoint"] == "primary")
    assert len(vs16["per_seed"]) == len(vs4["per_seed"]) == 6
    plan = compare.POWER_PLAN
    assert plan["effect"] == round(statistics.mean(vs16["per_seed"]), 4)
    assert plan["sd"] == round(max(statistics.stdev(vs16["per_seed"]), statistics.stdev(vs4["per_seed"])), 4)
    gpu = options.PRESETS["gpu"]
    seeds = [int(s) for s in gpu["seeds"].split(",")]
    assert len(seeds) == stats.seeds_needed(**plan) and options.PRESETS["gpu"]["lr_pilot"]
    assert gpu["compare"].split(",") == ["otb:4", "group_mean:4", "group_mean:16"]
    assert stats.paired_t_power(plan["effect"], plan["sd"], 3) < 0.5  # the old 3 seeds: under even odds


def test_the_preflight_prints_the_seeds_and_their_cost_from_its_projection():
    plan = [dict(run="pilot group_mean:4", runs=4, steps=10, seconds_per_step=2.0, saves=1),
            dict(run="otb:4", runs=6, steps=80, seconds_per_step=3.0, saves=3),
            dict(run="group_mean:16", runs=6, steps=20, seconds_per_step=9.0, saves=2)]
    p = preflight.seeds_plan(plan, 6, t_save=1.5)
    pilot, per_seed = 4 * (10 * 2.0 + 1.5), (80 * 3.0 + 3 * 1.5) + (20 * 9.0 + 2 * 1.5)
    assert p["seconds_per_seed"] == pytest.approx(per_seed)
    assert p["projected_seconds_needed"] == pytest.approx(pilot + p["seeds_needed"] * per_seed)
    assert p["seeds_needed"] == stats.seeds_needed(**compare.POWER_PLAN)


def history(successes, tokens_per_step):
    out, c = [], 0
    for s in successes:
        c += tokens_per_step
        out.append(dict(tokens=c, success=s))
    return out


def test_the_pilots_standard_error_is_the_binomial_one():
    """Equal steps with equal success p over the last quarter: sqrt(p (1 - p) / (k rows)), the binomial
    standard error of k x rows responses."""
    h = history([0.5] * 4 + [0.25] * 4, 10)  # budget 80: the last quarter is steps 7 and 8 (tokens 70, 80)
    assert compare.final_se(h, 80, rows_per_step=32) == pytest.approx(math.sqrt(0.25 * 0.75 / (2 * 32)))
    assert compare.final_se(h[:1], 80, rows_per_step=32) is None  # no step in the last quarter


def test_near_ties_go_to_the_smaller_rate():
    row = lambda lr, final, se: dict(lr=lr, final=final, se=se)  # noqa: E731
    # 0.30 vs 0.34: a difference of 0.04 against sqrt(2) x 0.035 = 0.049: a tie, so the smaller rate
    assert compare.choose_rate([row(1e-6, 0.30, 0.035), row(1e-5, 0.34, 0.035)]) == 1e-6
    # 0.30 vs 0.40: 0.10 > 0.049: the higher one
    assert compare.choose_rate([row(1e-6, 0.30, 0.035), row(1e-5, 0.40, 0.035)]) == 1e-5
    # without standard errors, the original rule: the highest, equal values to the smaller rate
    assert compare.choose_rate([row(1e-6, 0.30, None), row(1e-5, 0.34, None)]) == 1e-5
    assert compare.choose_rate([row(1e-6, 0.34, 0.0), row(1e-5, 0.34, 0.0)]) == 1e-6
    # undefined finals rank last and tie with nothing; none defined: the smallest rate
    assert compare.choose_rate([row(1e-6, None, None), row(1e-5, 0.1, 0.2), row(3e-5, math.nan, None)]) == 1e-5
    assert compare.choose_rate([row(1e-6, None, None), row(1e-5, math.nan, None)]) == 1e-6


@pytest.mark.saved_results
def test_the_docs_power_table_is_the_functions():
    """docs/training.md's power row is stats.paired_t_power at each number of seeds in its header, to the
    two decimals shown, or one unit of the second away (a power on a rounding boundary prints either way
    on another CPU)."""
    text = (ROOT / "docs/training.md").read_text()
    head = next(ln for ln in text.splitlines() if ln.startswith("| paired seeds |"))
    row = next(ln for ln in text.splitlines() if ln.startswith("| power against +0.0935 |"))
    seeds = [int(x.strip(" *")) for x in head.strip("|").split("|")[1:]]
    shown = [x.strip(" *") for x in row.strip("|").split("|")[1:]]  # two decimals
    plan = compare.POWER_PLAN
    assert len(shown) == len(seeds) >= 3
    for n, cell in zip(seeds, shown):
        same_text(f"{stats.paired_t_power(plan['effect'], plan['sd'], n):.2f}", cell, f"power at {n} seeds")
