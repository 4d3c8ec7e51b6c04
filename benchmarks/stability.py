"""The stability study: does OTB keep long-horizon training from collapsing? (docs/stability_protocol.md)

Runs the pre-registered protocol (read it first; its addenda change it): train.py on the periodic
copy task at a long horizon, six estimators at N = 4 on a ladder of learning rates, seeds paired
across estimators, through benchmarks/grid.py (a run folder with DONE is kept, so a study resumes
across sittings). Each finished run's metrics.jsonl is copied, reduced to the columns the analysis
reads, into <out>/runs/, and the analysis reads only those copies, so ``--from-saved`` remakes every
table and the figure from committed data alone. Runs start only from committed code (``--allow-dirty``
overrides, and says so in the record), and only while the code is the study's at its start (each run
records its own as it starts; benchmarks/grid.py stops the study at the first run of other code): each
saved run records the commit and machine that made it in <out>/runs/<name>.code.json (with the run's
own record, and <name>.code.diff where it ran uncommitted changes), and results.json and summary.md
list every commit the study ran under and which runs ran which code.

A run *collapses* when its trailing success mean falls below a fraction of its best level and stays
there to the end of the run (success = the step's fraction of responses with reward 1, from
metrics.jsonl; T = the run's last step):

    S(t) = mean(success_u, t - k < u <= t)                     trailing mean, k = 10 steps   (1)
    M(t) = max(success_1, S(k), ..., S(t))                     best level (step 1: the start) (2)
    collapse step = min{t >= k : S(u) < rho M(t) for all t <= u <= T}        rho = 0.5   (3)

A run where (3) never holds is censored at its last step (and its last step's sampled tokens). A
*dip* (reported beside it, not an endpoint) is the first t >= k with S(t) < rho M(t), recovered
from or not. The statistics (tested against exact answers in tests/test_exact_stability.py): (4) and
(5) are lab/analysis/stats.py's (statsmodels' Wilson interval, scipy's binomial test), (6) is
scipy's Kaplan-Meier estimate with its pointwise log-log interval (``scipy.stats.ecdf``), and (7) is
enumerated here, since no library gives the exact test's power:

    Wilson interval  (p + z^2/2n +- z sqrt(p (1 - p)/n + z^2/4n^2)) / (1 + z^2/n)           (4)
    exact McNemar    P = min(1, 2 P(Bin(b + c, 1/2) <= min(b, c)))  b, c discordant pairs   (5)
    Kaplan-Meier     F(t) = prod_{t_i <= t} (1 - d_i / n_i),  interval F^exp(+-z sigma)     (6)
                     sigma^2 = sum d_i / (n_i (n_i - d_i)) / log(F)^2  (Greenwood, log-log)
    power            P(P <= alpha) of (5), enumerating the pairs' outcomes (b, c, rest)     (7)

    python benchmarks/stability.py --out benchmarks/results/stability          # the study (resumes)
    python benchmarks/stability.py --no-train --out benchmarks/results/stability  # collect + analyse
    python benchmarks/stability.py --from-saved benchmarks/results/stability --out runs/stability/check
"""
import json
import math
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from statistics import fmean, median

import numpy as np
from scipy.stats import CensoredData, ecdf, multinomial

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import grid  # noqa: E402
from benchmarks.cli import (at_least, choice_list, code_to_run, int_list, out_folder, parse_study_args,  # noqa: E402
                            parser, positive_float_list, write_results)
import otb  # noqa: E402
from lab import machine  # noqa: E402
from lab.analysis import stats  # noqa: E402
from lab.runs import read_jsonl  # noqa: E402

# ---- the protocol (docs/stability_protocol.md); change only by an addendum there
HORIZON = 64
GROUP_SIZE = 4
PROMPTS_PER_STEP = 8
STEPS = 120
WARMUP_TARGET = 0.25
ESTIMATORS = ["otb", "group_mean", "otb_loo", "rloo", "grpo", "reinforce"]
PRIMARY_LR = 7e-4
LADDER = [5e-4, 7e-4, 1e-3]  # below, at and above the rate where group_mean began to collapse (pilot)
SEEDS = list(range(12))
WINDOW, RATIO = 10, 0.5  # k, rho of eqs. (1)-(3)
RISE = 2.0  # "total_power rose before the collapse": power_rise > RISE
ALPHA = 0.05
LEVEL = 0.95  # the intervals' two-sided coverage
KEEP = ["step", "success", "tokens", "grad_norm", "total_power", "response_len"]  # columns saved
SURVIVAL_AT = [10, 25, 50, 100, 120]  # steps at which the survival table reads S(t)


# =====================================================================================
# Statistics, eqs. (4)-(7): pure functions
# =====================================================================================

wilson = stats.wilson  # eq. (4): (k / n, lo, hi), the Wilson score interval of a binomial proportion
mcnemar_exact = stats.sign_test  # eq. (5): (b, c) discordant pairs -> the exact two-sided P


def kaplan_meier(times, events, level=LEVEL):
    """Eq. (6): [(t, at risk n_t, events d_t, S(t), lo, hi)] at each distinct event time, from
    ``times`` (event or censoring time of each unit) and ``events`` (True: event, False: censored).
    A unit censored at t is still at risk at t. S(t) and its pointwise log-log interval (Greenwood's
    variance) are scipy's: ``scipy.stats.ecdf`` of the right-censored times, whose ``sf`` also steps at
    the censoring times (read here only at the event times); n_t and d_t are counted. lo, hi: nan where S
    is 0 (no log-log interval)."""
    if len(times) != len(events) or not times:
        raise ValueError(f"need as many times as events (> 0), got {len(times)} and {len(events)}")
    t, e = np.asarray(times, dtype=float), np.asarray(events, dtype=bool)
    sf = ecdf(CensoredData(uncensored=t[e], right=t[~e])).sf
    with warnings.catch_warnings():  # "undefined at some observations": where S is 0, which gives nan
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = sf.confidence_interval(level, method="log-log")
    at = sorted({u for u, event in zip(times, events) if event})  # as given (whole steps stay whole)
    k = np.searchsorted(sf.quantiles, at)  # each event time's place on scipy's step function
    return [(u, int((t >= u).sum()), int(((t == u) & e).sum()), float(sf.probabilities[i]),
             float(ci.low.probabilities[i]), float(ci.high.probabilities[i])) for u, i in zip(at, k)]


def survival_at(curve, t):
    """F(t) and its interval read off a Kaplan-Meier curve (1 and no interval before the first event)."""
    last = (1.0, math.nan, math.nan)
    for u, _, _, s, lo, hi in curve:
        if u > t:
            break
        last = (s, lo, hi)
    return last


def km_median(curve):
    """The first time where S(t) <= 1/2, or None (not reached). A product of float factors can give an
    S of exactly 1/2 as 1 + 2e-16 times it: the comparison allows 1e-12, and S(t) = 1/2 counts as
    reached, as the protocol's rule says."""
    return next((t for t, _, _, s, _, _ in curve if s <= 0.5 + 1e-12), None)


def mcnemar_power(n, p_a, p_b, alpha=ALPHA):
    """Eq. (7): the probability that the exact McNemar test (5) on n pairs gives P <= alpha, when
    unit A fails with probability p_a and B with p_b, independently within a pair: the multinomial
    probability of each outcome (b, c, rest) (``scipy.stats.multinomial``) summed over those the test
    rejects. Enumerated here: statsmodels' and scipy's power functions are for the normal-theory tests,
    not for this exact one."""
    p10, p01 = p_a * (1 - p_b), p_b * (1 - p_a)  # discordant: A only, B only
    pairs = multinomial(n, [p10, p01, 1 - p10 - p01])
    return float(sum(pairs.pmf([b, c, n - b - c]) for b in range(n + 1) for c in range(n - b + 1)
                     if mcnemar_exact(b, c) <= alpha))


# =====================================================================================
# Per run: the collapse rule, eqs. (1)-(3), and what the secondary endpoints read
# =====================================================================================

def trailing_means(success, k=WINDOW):
    """Eq. (1): [S(k), ..., S(T)]."""
    return [fmean(success[t - k:t]) for t in range(k, len(success) + 1)]


def collapse_step(success, k=WINDOW, rho=RATIO, persist=True):
    """Eq. (3): the first step t >= k (1-based) with S(u) < rho M(t) for every u from t to the end,
    or None; with ``persist=False`` the first dip, S(t) < rho M(t)."""
    means = trailing_means(success, k)  # means[i] = S(k + i)
    best = success[0] if success else 0.0  # M(t), eq. (2): starts at step 1's success
    for i, s in enumerate(means):
        best = max(best, s)
        if s < rho * best and (not persist or all(u < rho * best for u in means[i:])):
            return k + i
    return None


def power_rise(power, t_c, k=WINDOW):
    """How far total_power rose before a collapse: max P(t) / P(k) over k <= t <= t_c - k, where P is
    the k-step trailing mean of total_power (eq. (1) applied to it) and steps t_c - k < u <= t_c are
    the window in which success fell; over the whole run when t_c is None. None when t_c < 2k (no
    window before the fall) or P(k) = 0."""
    means = trailing_means(power, k)  # means[i] = P(k + i)
    before = means if t_c is None else means[:max(0, t_c - 2 * k + 1)]
    return max(before) / means[0] if before and means[0] > 0 else None


def summarize_run(rows):
    """One run's endpoints from its metrics rows (dicts with the KEEP columns)."""
    success = [r["success"] for r in rows]
    t_c = collapse_step(success)
    upto = rows if t_c is None else rows[:t_c]  # steps 1..collapse step (all steps if none)
    return dict(steps=len(rows), collapsed=t_c is not None, collapse_step=t_c,
                dip_step=collapse_step(success, persist=False),
                time_steps=t_c if t_c is not None else len(rows),  # event or censoring time
                time_tokens=rows[(t_c or len(rows)) - 1]["tokens"],
                max_grad_norm=max(r["grad_norm"] for r in rows),
                max_grad_norm_before=max(r["grad_norm"] for r in upto),
                power_rise=power_rise([r["total_power"] for r in rows], t_c), final_success=fmean(success[-WINDOW:]))


# =====================================================================================
# The grid: names, commands, order
# =====================================================================================

def run_name(est, seed, lr):
    return f"{est}-n{GROUP_SIZE}-seed{seed}-lr{lr:g}"


NAME = re.compile(r"(?P<est>.+)-n(?P<n>\d+)-seed(?P<seed>\d+)-lr(?P<lr>[0-9.e+-]+)$")


def parse_name(name):
    """(estimator, seed, lr) of a run name; ValueError naming it when it is not one."""
    m = NAME.match(name)
    if not m:
        raise ValueError(f"not a run name of this study: {name!r}")
    return m["est"], int(m["seed"]), float(m["lr"])


def command(est, seed, lr, runs, steps=STEPS, extra=()):
    return [sys.executable, str(ROOT / "train.py"), "--task", "periodic", "--horizon", str(HORIZON),
            "--estimator", est, "--group-size", str(GROUP_SIZE), "--prompts-per-step", str(PROMPTS_PER_STEP),
            "--steps", str(steps), "--lr", f"{lr:g}", "--seed", str(seed), "--warmup-target", str(WARMUP_TARGET),
            "--out", str(runs), "--name", run_name(est, seed, lr), "--log-every", "1000", *extra]


def blocks(estimators, seeds, ladder, primary, first=8):
    """The protocol's order, as blocks run one after the other, each block one seed's runs:
    (A) otb and group_mean at the primary rate, every seed; then, on the first ``first`` seeds,
    (B) otb and group_mean at the first other rung, (C) the other estimators at the primary rate,
    (D) otb and group_mean at the remaining rungs; (E) B, C and D on the remaining seeds."""
    pair = [e for e in ("otb", "group_mean") if e in estimators]
    others = [e for e in estimators if e not in pair]
    rungs = [lr for lr in ladder if lr != primary]
    early, late = seeds[:first], seeds[first:]
    later = [(pair, rungs[:1]), (others, [primary]), (pair, rungs[1:])]
    plan = [(pair, [primary], seeds)] + [(e, lrs, early) for e, lrs in later] + [(e, lrs, late) for e, lrs in later]
    return [b for ests, lrs, ss in plan for b in ([(e, s, lr) for lr in lrs for e in ests] for s in ss) if b]


def collect(runs, saved, finished_only=True):
    """Copy each finished run's metrics.jsonl (DONE), reduced to KEEP, to saved/<name>.jsonl, and the
    code it ran to saved/<name>.code.json: its sitting's record (``started``'s ledger) with the run's
    own under "run" (provenance.json; null for a run made before runs recorded it), and the run's
    uncommitted changes, where it ran any, to saved/<name>.code.diff."""
    saved.mkdir(parents=True, exist_ok=True)
    ledger = code_ledger(runs)
    for folder in sorted(Path(runs).iterdir()):
        if not (folder / "metrics.jsonl").exists() or not NAME.match(folder.name):
            continue
        if finished_only and not (folder / "DONE").exists():
            continue
        lines = [json.dumps({k: float(f"{r[k]:.6g}") if isinstance(r[k], float) else r[k] for k in KEEP})
                 for r in read_jsonl(folder / "metrics.jsonl")]
        (saved / f"{folder.name}.jsonl").write_text("\n".join(lines) + "\n")
        if folder.name in ledger:
            own = machine.recorded_code(folder)
            record = dict(ledger[folder.name], run=own)
            (saved / f"{folder.name}.code.json").write_text(json.dumps(record, indent=1) + "\n")
            if own and own["diff"]:
                shutil.copy(folder / own["diff"], saved / f"{folder.name}.code.diff")


# =====================================================================================
# The code each run ran: recorded when it starts, saved beside its metrics
# =====================================================================================
# benchmarks/cli.code_to_run refuses uncommitted code (unless --allow-dirty) and says what a sitting
# starts from; ``started`` appends it, with the names of the runs about to start, to <runs>/code.jsonl
# before they start, so a run that is stopped and started again in a later sitting (grid.py runs it
# again from step 0) is credited to the sitting that finished it. A study resumed over several
# sittings lists every commit its runs ran under. Each run also records its own code as it starts
# (provenance.json, lab/machine.py), which grid.py holds to the sitting's and ``collect`` keeps: the
# summary says which runs ran which code by the runs' own records.

NOT_RECORDED = "commit not recorded"


def started(runs, names, code):
    """Append ``code`` (cli.code_to_run) and the run names about to start to <runs>/code.jsonl."""
    Path(runs).mkdir(parents=True, exist_ok=True)
    with open(Path(runs) / "code.jsonl", "a") as f:
        f.write(json.dumps(dict(code, runs=list(names))) + "\n")


def code_ledger(runs):
    """{run name: the code of the last sitting that started it} from <runs>/code.jsonl ({} without one)."""
    path = Path(runs) / "code.jsonl"
    out = {}
    for entry in read_jsonl(path) if path.exists() else []:
        out.update({name: {k: v for k, v in entry.items() if k != "runs"} for name in entry["runs"]})
    return out


def saved_code(saved, names):
    """The code record of each saved run: {"runs": {name: record or NOT_RECORDED}, "commits": every
    commit the runs ran under, in order of first use, "not_recorded": how many runs record none,
    "allow_dirty": the runs started with --allow-dirty, "machines": the distinct fingerprints}."""
    runs = {}
    for name in sorted(names):
        path = Path(saved) / f"{name}.code.json"
        runs[name] = json.loads(path.read_text()) if path.exists() else NOT_RECORDED
    recorded = [r for r in runs.values() if r != NOT_RECORDED]
    return dict(commits=list(dict.fromkeys(r["commit"] for r in recorded)),
                not_recorded=len(runs) - len(recorded),
                allow_dirty=[n for n, r in runs.items() if r != NOT_RECORDED and r["allow_dirty"]],
                machines=[dict(t) for t in dict.fromkeys(tuple(r["machine"].items()) for r in recorded)], runs=runs)


def code_line(code):
    """One line for summary.md: which commits made the saved runs, and how many record none; then which
    runs ran which code by their own records (``ran_line``)."""
    n = len(code["runs"])
    if not code["commits"]:
        return f"Code: {NOT_RECORDED} for any of the {n} saved runs."
    count = lambda c: sum(r != NOT_RECORDED and r["commit"] == c for r in code["runs"].values())  # noqa: E731
    text = "Code: " + ", ".join(f"commit {c[:12]} ({count(c)} runs)" for c in code["commits"])
    if code["not_recorded"]:
        text += f"; {NOT_RECORDED}: {code['not_recorded']} runs"
    if code["allow_dirty"]:  # the files changed as their sitting started ("?": git could not tell)
        changed = sorted({f for name in code["allow_dirty"] for f in code["runs"][name]["code_changes"] or ["?"]
                          if code["runs"][name]["code_changes"] != []})
        text += f"; {len(code['allow_dirty'])} runs started with --allow-dirty" + (
            ", from uncommitted changes to " + ", ".join(changed) if changed else "")
    return text + f" (of {n} saved runs; each run's record: runs/<name>.code.json). " + ran_line(code["runs"])


def ran_line(runs):
    """Which runs ran which code, by each run's own record (its "run" record, written as it started:
    grid.which_code), where its patch is saved, and the runs whose code was not their sitting's (under
    --allow-dirty)."""
    own = {name: r.get("run") if r != NOT_RECORDED else None for name, r in runs.items()}
    if not any(own.values()):
        return "The runs' own record of their code (provenance.json, written as each starts): not recorded."
    text = "As the runs recorded it when they started: " + grid.which_code(own)
    diffs = any(r and r["diff"] for r in own.values())
    text += "; each run's uncommitted changes: runs/<name>.code.diff." if diffs else "."
    other = [name for name, r in own.items() if r and not machine.same_code(r, runs[name])]
    return text + (f" Not their sitting's code (--allow-dirty): {', '.join(other)}." if other else "")


def load_saved(saved):
    """{(est, lr): {seed: rows}} of every saved run."""
    out = {}
    for path in sorted(Path(saved).glob("*.jsonl")):
        est, seed, lr = parse_name(path.stem)
        out.setdefault((est, lr), {})[seed] = read_jsonl(path)
    return out


# =====================================================================================
# Analysis: the endpoints as the protocol defines them
# =====================================================================================

def paired(per_run, a, b):
    """A against B on the seeds both ran: discordant counts, McNemar, the verdict of the protocol."""
    seeds = sorted(set(per_run.get(a, {})) & set(per_run.get(b, {})))
    ca = {s: per_run[a][s]["collapsed"] for s in seeds}
    cb = {s: per_run[b][s]["collapsed"] for s in seeds}
    n10 = sum(ca[s] and not cb[s] for s in seeds)  # A collapsed, B did not
    n01 = sum(cb[s] and not ca[s] for s in seeds)
    both = sum(ca[s] and cb[s] for s in seeds)
    p = mcnemar_exact(n10, n01)
    rate_a, rate_b = (sum(c.values()) / len(seeds) if seeds else math.nan for c in (ca, cb))
    if seeds and p <= ALPHA and rate_a < rate_b:
        verdict = f"{a[0]} collapses less often than {b[0]} (P <= {ALPHA})"
    elif seeds and p <= ALPHA and rate_a > rate_b:
        verdict = f"{a[0]} collapses more often than {b[0]} (P <= {ALPHA})"
    else:
        verdict = "no difference shown"
    ratios = [per_run[a][s]["max_grad_norm"] / per_run[b][s]["max_grad_norm"] for s in seeds
              if per_run[b][s]["max_grad_norm"] > 0]
    gm = stats.geometric_mean(ratios) if len(ratios) >= 2 else (math.nan,) * 3
    return dict(a=f"{a[0]} lr {a[1]:g}", b=f"{b[0]} lr {b[1]:g}", seeds=seeds, pairs=len(seeds),
                a_only=n10, b_only=n01, both=both, neither=len(seeds) - n10 - n01 - both,
                rate_a=rate_a, rate_b=rate_b, p_value=p, verdict=verdict,
                max_grad_norm_ratio=gm[0], max_grad_norm_ratio_lo=gm[1], max_grad_norm_ratio_hi=gm[2])


def cell_summary(runs):
    """One (estimator, lr) cell over its seeds."""
    seeds = sorted(runs)
    k = sum(runs[s]["collapsed"] for s in seeds)
    rate = wilson(k, len(seeds))
    km_steps = kaplan_meier([runs[s]["time_steps"] for s in seeds], [runs[s]["collapsed"] for s in seeds])
    km_tokens = kaplan_meier([runs[s]["time_tokens"] for s in seeds], [runs[s]["collapsed"] for s in seeds]) \
        if k else []
    judged = [s for s in seeds if runs[s]["power_rise"] is not None]
    rises = [runs[s]["power_rise"] for s in judged if runs[s]["collapsed"]]
    rises_ok = [runs[s]["power_rise"] for s in judged if not runs[s]["collapsed"]]
    gn = [runs[s]["max_grad_norm"] for s in seeds]
    return dict(seeds=seeds, collapsed=k, rate=rate[0], rate_lo=rate[1], rate_hi=rate[2],
                last_step=max(runs[s]["time_steps"] for s in seeds),
                last_tokens=max(runs[s]["time_tokens"] for s in seeds),
                median_steps=km_median(km_steps), median_tokens=km_median(km_tokens) if k else None,
                survival={t: survival_at(km_steps, t) for t in SURVIVAL_AT},
                km_steps=km_steps, km_tokens=km_tokens,
                max_grad_norm_median=median(gn), max_grad_norm_min=min(gn), max_grad_norm_max=max(gn),
                power_rose=sum(r > RISE for r in rises), power_evaluable=len(rises),
                power_rise_median=median(rises) if rises else None,
                power_rose_no_collapse=sum(r > RISE for r in rises_ok), power_evaluable_no_collapse=len(rises_ok),
                power_rise_median_no_collapse=median(rises_ok) if rises_ok else None,
                final_success_mean=fmean(runs[s]["final_success"] for s in seeds))


def analyse(histories, primary=PRIMARY_LR):
    """Per run, per cell, the primary test and the secondary ones; a cell with fewer than 2 seeds is
    left out (the protocol's stopping rule; ``too_few`` names them)."""
    too_few = sorted(f"{e} lr {lr:g}" for (e, lr), by_seed in histories.items() if len(by_seed) < 2)
    per_run = {cell: {s: summarize_run(h) for s, h in by_seed.items()} for cell, by_seed in histories.items()
               if len(by_seed) >= 2}
    cells = {cell: cell_summary(runs) for cell, runs in sorted(per_run.items(), key=lambda kv: (kv[0][1], kv[0][0]))}
    primary_test = paired(per_run, ("otb", primary), ("group_mean", primary))
    secondary = [paired(per_run, ("otb", primary), (e, primary)) for e in ESTIMATORS
                 if e not in ("otb", "group_mean") and (e, primary) in per_run]
    secondary += [paired(per_run, ("otb", lr), ("group_mean", lr)) for lr in sorted({lr for _, lr in per_run})
                  if lr != primary and ("otb", lr) in per_run and ("group_mean", lr) in per_run]
    return per_run, cells, primary_test, secondary, too_few


# =====================================================================================
# Tables and figure
# =====================================================================================

def num(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def interval(v, lo, hi, spec=".2f"):
    """'v [lo, hi]', or 'v' alone where the interval does not exist."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return num(v, spec)
    return f"{num(v, spec)} [{num(lo, spec)}, {num(hi, spec)}]"


def pair_line(p):
    return (f"| {p['a']} vs {p['b']} | {p['pairs']} | {p['rate_a']:.2f} vs {p['rate_b']:.2f} | {p['a_only']} | "
            f"{p['b_only']} | {p['both']} | {p['neither']} | {p['p_value']:.3f} | {p['verdict']} | "
            f"{interval(p['max_grad_norm_ratio'], p['max_grad_norm_ratio_lo'], p['max_grad_norm_ratio_hi'])} |")


PAIR_HEAD = ["| A vs B | paired seeds | collapse rate A vs B | A only | B only | both | neither | exact McNemar P "
             "| verdict | max grad norm A / B (geometric mean, 95% t interval over seeds) |",
             "|---|---|---|---|---|---|---|---|---|---|"]


def later(per_run, a, b):
    """Post hoc: on the seeds both ran, how many times A's collapse step (censored runs: their last
    step) is later than B's, earlier, or equal; the exact sign test (5) on later vs earlier."""
    seeds = sorted(set(per_run.get(a, {})) & set(per_run.get(b, {})))
    ta = [per_run[a][s]["time_steps"] for s in seeds]
    tb = [per_run[b][s]["time_steps"] for s in seeds]
    n_later = sum(x > y for x, y in zip(ta, tb))
    n_earlier = sum(x < y for x, y in zip(ta, tb))
    return dict(seeds=seeds, later=n_later, earlier=n_earlier, ties=len(seeds) - n_later - n_earlier,
                p_value=mcnemar_exact(n_later, n_earlier))


def around_collapse(rows, t_c, k=WINDOW):
    """Post hoc: mean grad_norm and response_len over the k steps before the window in which success
    fell (steps t_c - 2k < u <= t_c - k) and over the run's last k steps; None before when t_c < 2k."""
    def mean_of(key, part):
        return fmean(r[key] for r in part) if part else None
    before = rows[t_c - 2 * k:t_c - k] if t_c >= 2 * k else []
    return dict(grad_before=mean_of("grad_norm", before), grad_last=mean_of("grad_norm", rows[-k:]),
                len_before=mean_of("response_len", before), len_last=mean_of("response_len", rows[-k:]))


def around_table(histories, per_run, primary=PRIMARY_LR):
    """Post hoc, per estimator at the primary rate: medians over its collapsed runs of around_collapse."""
    lines = ["| estimator | collapsed runs (judged: collapse at step >= 20) | grad norm before the fall | grad norm, "
             "last 10 steps | response length before the fall | response length, last 10 steps |",
             "|---|---|---|---|---|---|"]
    for (est, lr), runs in sorted(per_run.items()):
        if lr != primary:
            continue
        got = [around_collapse(histories[(est, lr)][s], r["collapse_step"]) for s, r in sorted(runs.items())
               if r["collapsed"]]
        judged = [g for g in got if g["grad_before"] is not None]
        med = lambda key: median(g[key] for g in judged) if judged else None  # noqa: E731
        lines.append(f"| {est} | {len(got)} ({len(judged)}) | {num(med('grad_before'), '.3f')} | "
                     f"{num(med('grad_last'), '.3f')} | {num(med('len_before'), '.1f')} | "
                     f"{num(med('len_last'), '.1f')} |")
    return lines


def seed_table(per_run, primary=PRIMARY_LR):
    """Per seed, the two primary runs side by side."""
    a, b = per_run.get(("otb", primary), {}), per_run.get(("group_mean", primary), {})
    lines = ["| seed | otb: collapse step (dip) | group_mean: collapse step (dip) | otb: max grad norm | "
             "group_mean: max grad norm | otb: final success | group_mean: final success |",
             "|---|---|---|---|---|---|---|"]
    for s in sorted(set(a) & set(b)):
        step = lambda r: f"{r['collapse_step'] or '-'} ({r['dip_step'] or '-'})"  # noqa: E731
        lines.append(f"| {s} | {step(a[s])} | {step(b[s])} | {a[s]['max_grad_norm']:.3f} | "
                     f"{b[s]['max_grad_norm']:.3f} | {a[s]['final_success']:.3f} | {b[s]['final_success']:.3f} |")
    return lines


def report(cells, primary_test, secondary, source, primary=PRIMARY_LR, per_run=None, histories=None, too_few=()):
    lines = ["# Stability study: results", "",
             f"Protocol: docs/stability_protocol.md (pre-registered, with its dated addenda). Written by `{source}`.",
             "", f"Collapse: the first step t >= {WINDOW} from which the {WINDOW}-step trailing success mean stays "
             f"below {RATIO} x the run's best level so far (step 1's success or a trailing mean) to the end of "
             f"the run; otherwise censored at the last step. Dip: the first such t, recovered from or not.", "",
             "## Collapse rate per cell (95% Wilson interval)", "",
             "| estimator | lr | seeds | collapsed | rate [95% CI] | median steps to collapse (KM) | "
             "median tokens to collapse (KM) | max grad norm, median [min, max] | final success (mean of "
             "last 10 steps, seed mean) |", "|---|---|---|---|---|---|---|---|---|"]
    for (est, lr), c in cells.items():
        lines.append(f"| {est} | {lr:g} | {len(c['seeds'])} | {c['collapsed']} | "
                     f"{interval(c['rate'], c['rate_lo'], c['rate_hi'])} | "
                     f"{num(c['median_steps'], 'd') if c['median_steps'] else 'not reached'} | "
                     f"{num(c['median_tokens'], ',d') if c['median_tokens'] else 'not reached'} | "
                     f"{interval(c['max_grad_norm_median'], c['max_grad_norm_min'], c['max_grad_norm_max'])} | "
                     f"{c['final_success_mean']:.3f} |")
    lines += ["", f"## Primary endpoint: otb vs group_mean at lr {primary:g}", ""] + PAIR_HEAD + [
        pair_line(primary_test), "", f"Verdict (as pre-registered): **{primary_test['verdict']}**.", ""]
    if too_few:
        lines += ["Cells with fewer than 2 seeds, not analysed (the protocol's stopping rule): "
                  + ", ".join(too_few) + ".", ""]
    if primary_test["pairs"] < 8:
        lines += [f"Shortfall: {primary_test['pairs']} paired seeds, fewer than the 8 the protocol requires.", ""]
    lines += [f"Per seed at lr {primary:g} (- : none; dip: the first fall below half the best level, "
              "recovered from or not):", ""] + seed_table(per_run or {}, primary) + [""]
    lines += ["## Secondary: otb against the other estimators, and at the other rungs (no multiplicity "
              "correction)", ""] + PAIR_HEAD + [pair_line(p) for p in secondary]
    lines += ["", f"## Secondary: survival F(t) over steps (Kaplan-Meier, 95% log-log interval), lr {primary:g}", "",
              "The fraction of seeds not collapsed by step t; the log-log interval does not exist where F is 0 or 1.",
              "", "| estimator | " + " | ".join(f"F({t})" for t in SURVIVAL_AT) + " |",
              "|---|" + "---|" * len(SURVIVAL_AT)]
    for (est, lr), c in cells.items():
        if lr == primary:
            lines.append(f"| {est} | " + " | ".join(interval(*c["survival"][t]) for t in SURVIVAL_AT) + " |")
    lines += ["", f"## Secondary: did total_power rise before the collapse? (its {WINDOW}-step trailing mean, "
              f"at its highest before the window in which success fell, above {RISE:g} x its first full window; "
              f"collapses before step {2 * WINDOW} cannot be judged)", "",
              "| estimator | lr | collapsed runs where it rose | median rise (collapsed) | runs without collapse "
              "where it rose (whole run) | median rise (no collapse) |", "|---|---|---|---|---|---|"]
    for (est, lr), c in cells.items():
        lines.append(f"| {est} | {lr:g} | {c['power_rose']}/{c['power_evaluable']} (of {c['collapsed']}) | "
                     f"{num(c['power_rise_median'])} | "
                     f"{c['power_rose_no_collapse']}/{c['power_evaluable_no_collapse']} | "
                     f"{num(c['power_rise_median_no_collapse'])} |")
    t = later(per_run or {}, ("otb", primary), ("group_mean", primary))
    if t["seeds"]:
        lines += ["", "## Post hoc (not pre-registered): does OTB collapse later?", "",
                  f"At lr {primary:g}, over the {len(t['seeds'])} paired seeds, otb's collapse step (a run that did "
                  f"not collapse: its last step) is later than group_mean's in {t['later']}, earlier in "
                  f"{t['earlier']}, equal in {t['ties']}; exact sign test P = {t['p_value']:.3f}. A question asked "
                  "after the first results, not a test the protocol planned."]
        lines += ["", "Post hoc: is a collapse a surge of the gradient? Medians over each estimator's collapsed runs "
                  f"at lr {primary:g} of the mean gradient norm (before clipping at 1.0) and response length over "
                  "the 10 steps before the window in which success fell, and over the run's last 10 steps:", ""]
        lines += around_table(histories or {}, per_run or {}, primary)
    return "\n".join(lines) + "\n"


COLORS = dict(zip(ESTIMATORS, ["tab:blue", "tab:orange", "tab:cyan", "tab:green", "tab:red", "tab:gray"]))


def km_line(curve, last):
    """The step function of a Kaplan-Meier curve from (0, 1) to ``last``: (xs, ys)."""
    xs, ys = [0], [1.0]
    for t, _, _, f, _, _ in curve:
        xs += [t, t]
        ys += [ys[-1], f]
    return xs + [max(last, xs[-1])], ys + [ys[-1]]


def plot(cells, path=None, primary=PRIMARY_LR):
    """Survival by estimator over steps and over sampled tokens at the primary rate; collapse rate
    against the learning rate for otb and group_mean. Saved to ``path`` unless it is None."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for (est, lr), c in cells.items():
        if lr != primary:
            continue
        style = dict(color=COLORS.get(est), lw=2.5 if est in ("otb", "group_mean") else 1.2)
        axes[0].plot(*km_line(c["km_steps"], c["last_step"]), label=f"{est} ({c['collapsed']}/{len(c['seeds'])})",
                     **style)
        axes[1].plot(*km_line(c["km_tokens"], c["last_tokens"]), label=est, **style)
    for shift, est in zip((0.98, 1.02), ("otb", "group_mean")):
        pts = sorted((lr, c) for (e, lr), c in cells.items() if e == est)
        if pts:
            axes[2].errorbar([lr * shift for lr, _ in pts], [c["rate"] for _, c in pts],
                             yerr=[[c["rate"] - c["rate_lo"] for _, c in pts],
                                   [c["rate_hi"] - c["rate"] for _, c in pts]],
                             marker="o", capsize=3, color=COLORS[est],
                             label=f"{est} ({', '.join(str(len(c['seeds'])) for _, c in pts)} seeds)")
    axes[0].set(xlabel="step", ylabel="fraction of seeds not collapsed (KM)", title=f"lr {primary:g}",
                ylim=(-0.03, 1.03))
    axes[1].set(xlabel="sampled response tokens", ylabel="fraction not collapsed (KM)", title=f"lr {primary:g}",
                ylim=(-0.03, 1.03))
    axes[2].set(xscale="log", xlabel="learning rate", ylabel="collapse rate (95% Wilson)", ylim=(-0.03, 1.03),
                title="the ladder")
    rates = sorted({lr for _, lr in cells})
    axes[2].set_xticks(rates, [f"{lr:g}" for lr in rates])  # the rates run, not a log axis's minor ticks
    axes[2].minorticks_off()
    if len(rates) == 1:
        axes[2].set_xlim(rates[0] / 1.5, rates[0] * 1.5)
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=80)
    return fig


# =====================================================================================
# Command line
# =====================================================================================

def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--runs", type=out_folder, default=str(ROOT / "runs" / "stability"),
                   help="folder of the training runs (and their warm-up cache)")
    p.add_argument("--out", type=out_folder, default=str(ROOT / "runs" / "stability" / "results"),
                   help="folder for summary.md, results.json, survival.png and the saved metrics (runs/); "
                   "benchmarks/results/stability updates the committed results")
    p.add_argument("--no-train", action="store_true", help="collect the finished runs of --runs, then analyse")
    p.add_argument("--jobs", type=at_least(1), default=1, help="training runs at a time (one thread each)")
    p.add_argument("--estimators", type=choice_list(list(otb.ESTIMATORS)), default=",".join(ESTIMATORS),
                   help="estimators to run (the protocol's by default)")
    p.add_argument("--seeds", type=int_list(0), default=",".join(map(str, SEEDS)),
                   help="comma-separated seeds (paired)")
    p.add_argument("--lrs", type=positive_float_list, default=",".join(f"{x:g}" for x in LADDER),
                   help="the learning-rate ladder")
    p.add_argument("--primary-lr", type=float, default=PRIMARY_LR, help="the rate of the primary endpoint")
    return parse_study_args(p, argv, steps=STEPS)


def main(argv=None):
    args = parse_args(argv)
    out, t0 = Path(args.out), time.time()
    saved = Path(args.from_saved or args.out) / "runs"
    if not args.from_saved:
        if not args.no_train:
            code = code_to_run("benchmarks/stability.py", args.allow_dirty)  # refuses uncommitted code
            extra = args.train_args.split()
            todo = blocks(args.estimators, args.seeds, args.lrs, args.primary_lr)
            print(f"{sum(map(len, todo))} runs in {len(todo)} blocks into {args.runs}", flush=True)
            for block in todo:
                jobs = [(command(e, s, lr, args.runs, args.steps, extra), Path(args.runs) / run_name(e, s, lr), s)
                        for e, s, lr in block]
                started(args.runs, [folder.name for _, folder, _ in jobs if not (folder / "DONE").exists()], code)
                grid.run(jobs, args.jobs, code)  # stops at a run of other code than the study's
                collect(args.runs, saved)  # each finished block is saved at once
        else:
            collect(args.runs, saved)
    histories = load_saved(saved)
    if not histories:
        sys.exit(f"no saved runs in {saved}")
    per_run, cells, primary_test, secondary, too_few = analyse(histories, args.primary_lr)
    source = "python benchmarks/stability.py --from-saved benchmarks/results/stability"
    text = report(cells, primary_test, secondary, source, args.primary_lr, per_run, histories, too_few)
    key = lambda cell: f"{cell[0]} lr {cell[1]:g}"  # noqa: E731
    code = saved_code(saved, [run_name(e, s, lr) for (e, lr), by_seed in histories.items() for s in by_seed])
    text += "\n" + code_line(code) + "\n"
    record = dict(protocol="docs/stability_protocol.md", command=source, primary_lr=args.primary_lr,
                  code=code, collapse_rule=dict(window=WINDOW, ratio=RATIO), rise=RISE,
                  per_run={key(c): {str(s): r for s, r in runs.items()} for c, runs in per_run.items()},
                  cells={key(c): v for c, v in cells.items()}, primary=primary_test, secondary=secondary,
                  post_hoc_later=later(per_run, ("otb", args.primary_lr), ("group_mean", args.primary_lr)))
    out.mkdir(parents=True, exist_ok=True)
    write_results(out, "results", json.loads(json.dumps(record)), text, md_stem="summary")
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(cells, out / "survival.png", args.primary_lr))
    print(f"{time.time() - t0:.0f} s")
    return record


if __name__ == "__main__":
    main()
