"""The stability study's confirmatory replication (docs/stability_replication_protocol.md).

The first study (benchmarks/stability.py, docs/stability_protocol.md) could not separate OTB from
the group mean by its primary endpoint, the collapse *rate* by step 120; read after the fact, its
data pointed to the *time* to collapse instead. This script tests that hypothesis on fresh seeds,
with the same task, model, collapse rule and runner (it reuses stability.py's functions), and a
primary endpoint fixed before the first run:

    T_s(e)  = collapse step of estimator e on seed s, or T = 120 if it did not collapse        (1)
    d_s     = T_s(otb) - T_s(group_mean)        paired restricted time to collapse, tau = 120   (2)
    Delta   = mean_s d_s                        difference in restricted mean time (RMST)       (3)

Every run is censored at tau = 120 only, so T_s is observed for every run and the RMST is a plain
mean: no Kaplan-Meier area is needed. The test is the exact two-sided sign-flip (permutation) test
of Delta = 0: under the null every d_s is as likely to be +|d_s| as -|d_s|, so

    P = #{signs e in {-1, +1}^n : |sum_s e_s |d_s|| >= |sum_s d_s|} / 2^n                       (4)

counted exactly over integer sums (d_s are whole steps) by convolving the n two-point distributions.
Beside it: the t interval of Delta, and a percentile bootstrap interval over seeds (``scipy.stats.bootstrap``
of the mean of the d_s, 10,000 draws from a fixed seed). The power of (4)
(``power``) is simulated from the first study's differences used only as a planning value: their
spread around their mean, recentred on a smaller effect. Secondary endpoints (protocol): the
absolute failure (success <= 0.02 over the last 20 steps), the final success, and the same contrast
for otb against rloo and grpo. Added after the verdict, and labelled so: Holm's correction of the
secondary contrasts, a sensitivity analysis of the primary and two post hoc contrasts
(``with_holm``, ``sensitivity``, ``post_hoc``). As in stability.py, runs start only from committed
code (``--allow-dirty`` overrides), the study stops at the first run of other code than it started
from, and each saved run records the commit and machine that made it and the run's own record.

    python benchmarks/stability_replication.py --power          # the protocol's power table
    nice -n 10 python benchmarks/stability_replication.py       # the replication (resumes)
    python benchmarks/stability_replication.py --from-saved benchmarks/results/stability_replication \\
        --out benchmarks/results/stability_replication          # the tables again from saved runs
"""
import json
import math
import os
import sys
import time
from pathlib import Path
from statistics import fmean

import numpy as np
from scipy.stats import bootstrap
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import grid  # noqa: E402
from benchmarks import stability as st  # noqa: E402
from benchmarks.cli import (code_to_run, int_list, out_folder, parse_study_args, parser,  # noqa: E402
                            write_results)
from lab.analysis import stats  # noqa: E402

# ---- the protocol (docs/stability_replication_protocol.md); change only by a dated addendum there
SEEDS = list(range(200, 224))  # 24 fresh seeds (the first study used 0-11, its pilot 100-101)
PRIMARY = ("otb", "group_mean")
TAU = st.STEPS  # 120: every run is censored here only
FAIL_WINDOW, FAIL_LEVEL = 20, 0.02  # absolute failure: mean success over the last 20 steps <= 0.02
ALPHA = 0.05
BOOT = 10_000  # bootstrap draws over seeds (secondary interval)
# the blocks, in the order they run, each seed by seed (protocol, "Blocks"):
BLOCKS = [("R1", PRIMARY, st.PRIMARY_LR), ("R2", ("rloo", "grpo"), st.PRIMARY_LR),
          ("R3", ("otb_loo", "reinforce"), st.PRIMARY_LR), ("R4", PRIMARY, 1e-3)]
# the first study's paired differences d_s at lr 7e-4, seeds 0-11 (benchmarks/results/stability);
# planning values only, checked against its saved results.json by a test
FIRST_STUDY_D = [36, 95, 77, 109, 104, 30, 2, 0, 58, 104, 30, 0]


# =====================================================================================
# The test, eq. (4), and its power
# =====================================================================================

signflip_p = stats.signflip_p  # eq. (4): whole-number diffs -> the exact two-sided P


def power(n, effect, base=FIRST_STUDY_D, sims=2000, alpha=ALPHA, seed=0, low=-(TAU - st.WINDOW), high=TAU - st.WINDOW):
    """The power of (4) on n seeds: d_s drawn with replacement from base's deviations from their
    mean, plus ``effect``, rounded and kept in the feasible range [10 - 120, 120 - 10]."""
    gen = torch.Generator().manual_seed(seed)
    dev = torch.tensor(base, dtype=torch.float64) - fmean(base)
    draws = dev[torch.randint(len(base), (sims, n), generator=gen)] + effect  # (sims, n)
    draws = draws.round().clamp(low, high)
    return sum(signflip_p(row.tolist()) <= alpha for row in draws) / sims


def power_table(ns=(12, 16, 20, 24, 32), sims=2000):
    """The protocol's table: the power of (4) for each n at the first study's effect and two smaller ones."""
    mean = fmean(FIRST_STUDY_D)
    lines = ["| seeds | effect = first study's (%.1f steps) | 3/4 of it (%.1f) | 1/2 of it (%.1f) |"
             % (mean, 0.75 * mean, 0.5 * mean), "|---|---|---|---|"]
    for n in ns:
        lines.append(f"| {n} | " + " | ".join(f"{power(n, f * mean, sims=sims):.2f}" for f in (1.0, 0.75, 0.5)) + " |")
    return lines


# =====================================================================================
# The endpoints
# =====================================================================================

def failed(rows):
    """The absolute failure: mean success over the last FAIL_WINDOW steps <= FAIL_LEVEL."""
    return fmean(r["success"] for r in rows[-FAIL_WINDOW:]) <= FAIL_LEVEL


def read_verdict(a, b, n, delta, p):
    """The protocol's decision rule: a later / sooner than b when P <= ALPHA, else no difference shown."""
    if n >= 2 and p <= ALPHA:
        return f"{a} collapses later than {b}" if delta > 0 else f"{a} collapses sooner than {b}"
    return "no difference shown"


def contrast(per_run, a, b, boot=BOOT):
    """Eqs. (2)-(4) for estimator cells a, b on the seeds both finished, and the final-success difference."""
    seeds = sorted(set(per_run.get(a, {})) & set(per_run.get(b, {})))
    d = [per_run[a][s]["time_steps"] - per_run[b][s]["time_steps"] for s in seeds]
    f = [per_run[a][s]["final_success"] - per_run[b][s]["final_success"] for s in seeds]
    mean, lo, hi = stats.mean_interval(d) if len(d) >= 2 else (d[0] if d else math.nan, math.nan, math.nan)
    b_lo = b_hi = math.nan
    if len(d) >= 2:
        ci = bootstrap((np.array(d, dtype=float),), np.mean, n_resamples=boot, method="percentile",
                       rng=np.random.default_rng(0)).confidence_interval
        b_lo, b_hi = float(ci.low), float(ci.high)
    p = signflip_p(d)
    verdict = read_verdict(a[0], b[0], len(d), mean, p)
    fm, flo, fhi = stats.mean_interval(f) if len(f) >= 2 else (math.nan,) * 3
    return dict(a=f"{a[0]} lr {a[1]:g}", b=f"{b[0]} lr {b[1]:g}", seeds=seeds, d=d, mean_a=
                fmean(per_run[a][s]["time_steps"] for s in seeds) if seeds else math.nan,
                mean_b=fmean(per_run[b][s]["time_steps"] for s in seeds) if seeds else math.nan,
                delta=mean, t_lo=lo, t_hi=hi, boot_lo=b_lo, boot_hi=b_hi, p_value=p, verdict=verdict,
                later=sum(x > 0 for x in d), earlier=sum(x < 0 for x in d),
                final_delta=fm, final_lo=flo, final_hi=fhi)


def analyse(histories, lr=st.PRIMARY_LR):
    """Per run (stability.summarize_run plus the failure), the primary contrast and the secondary ones,
    each secondary with its Holm-adjusted P (``with_holm``)."""
    per_run = {cell: {s: dict(st.summarize_run(h), failed=failed(h)) for s, h in by_seed.items()}
               for cell, by_seed in histories.items()}
    primary = contrast(per_run, ("otb", lr), ("group_mean", lr))
    secondary = [contrast(per_run, ("otb", lr), (e, lr)) for e in ("rloo", "grpo", "otb_loo", "reinforce")
                 if (e, lr) in per_run]
    secondary += [contrast(per_run, ("otb", x), ("group_mean", x)) for x in sorted({x for _, x in per_run})
                  if x != lr and ("otb", x) in per_run and ("group_mean", x) in per_run]
    return per_run, primary, with_holm(secondary)


# =====================================================================================
# Added after the verdict (not registered): the correction, the sensitivity, post hoc contrasts
# =====================================================================================

def with_holm(secondary):
    """Each secondary contrast with ``p_holm``: Holm's adjusted P (lab/analysis/stats.py, eq. (10)) within the
    contrasts at its learning rate (at the primary rate: otb against each other estimator; at another
    rate: the primary pair, alone), and its verdict read from that adjusted P. ``p_holm_all``: the
    adjusted P with every secondary contrast in one family, for comparison. The protocol planned no
    correction; this one was added after the results."""
    rate = lambda c: c["a"].split(" lr ")[1]  # noqa: E731  ('otb lr 0.0007' -> '0.0007')
    adjusted = {}
    for x in dict.fromkeys(rate(c) for c in secondary):
        family = [i for i, c in enumerate(secondary) if rate(c) == x]
        adjusted.update(zip(family, stats.holm([secondary[i]["p_value"] for i in family])))
    everything = stats.holm([c["p_value"] for c in secondary])
    return [dict(c, p_holm=adjusted[i], holm_family=sum(rate(o) == rate(c) for o in secondary),
                 p_holm_all=everything[i],
                 verdict=read_verdict(c["a"].split()[0], c["b"].split()[0], len(c["seeds"]), c["delta"], adjusted[i]))
            for i, c in enumerate(secondary)]


def sensitivity(primary, per_run, lr=st.PRIMARY_LR, largest=4):
    """How much the primary's P rests on single seeds (descriptive, not the registered test): the tied
    seeds and why they tie, P with each seed left out, Wilcoxon's signed-rank and the sign test on the
    untied seeds (lab/analysis/stats.py), and the ``largest`` differences in size: their share of the total
    difference, and the mean difference, its t interval and its P without them."""
    seeds, d = primary["seeds"], primary["d"]
    a, b = per_run.get(("otb", lr), {}), per_run.get(("group_mean", lr), {})
    ties = {}  # why each tied seed ties: both collapsed at step t, neither collapsed, or one at step tau
    for s in (s for s, x in zip(seeds, d) if x == 0):
        ta, tb = a[s]["collapse_step"], b[s]["collapse_step"]
        why = f"step {ta}" if ta is not None and tb is not None else "censored" if ta == tb else "mixed"
        ties.setdefault(why, []).append(s)
    loo = [signflip_p(d[:i] + d[i + 1:]) for i in range(len(d))]
    untied = [x for x in d if x != 0]
    ranked = sorted(range(len(d)), key=lambda i: (-abs(d[i]), seeds[i]))[:largest]
    rest = [d[i] for i in range(len(d)) if i not in ranked]
    rest_mean, rest_lo, rest_hi = stats.mean_interval(rest) if len(rest) >= 2 else (math.nan,) * 3
    return dict(ties=ties, leave_one_out={str(s): p for s, p in zip(seeds, loo)},
                loo_min=min(loo, default=math.nan), loo_max=max(loo, default=math.nan),
                loo_above_alpha=[s for s, p in zip(seeds, loo) if p > ALPHA],
                untied=len(untied), signed_rank=stats.signed_rank(untied),
                sign_test=dict(later=primary["later"], earlier=primary["earlier"],
                               p=stats.sign_test(primary["later"], primary["earlier"])),
                largest=[dict(seed=seeds[i], d=d[i]) for i in ranked], largest_sum=sum(d[i] for i in ranked),
                total=sum(d), rest=len(rest), rest_mean=rest_mean, rest_lo=rest_lo, rest_hi=rest_hi,
                rest_p=signflip_p(rest))


def post_hoc(per_run, lr=st.PRIMARY_LR):
    """Questions asked after the results (descriptive): reinforce against group_mean in time to
    collapse (the reading that group baselines speed the collapse), and the first study's primary
    endpoint, the collapse by step 120 (exact McNemar, stability.paired), on this study's seeds."""
    out = dict(first_endpoint=st.paired(per_run, ("otb", lr), ("group_mean", lr)))
    if ("reinforce", lr) in per_run and ("group_mean", lr) in per_run:
        out["reinforce_vs_group_mean"] = dict(contrast(per_run, ("reinforce", lr), ("group_mean", lr)),
                                              verdict="post hoc: descriptive")
    return out


# =====================================================================================
# Tables
# =====================================================================================

def fmt_iv(v, lo, hi, spec=".1f"):
    return st.interval(v, lo, hi, spec)


CONTRAST_HEAD = ["| A vs B | paired seeds | RMST A | RMST B | difference A - B [95% t] | [95% bootstrap] | "
                 "A later / earlier | exact sign-flip P | verdict | final success A - B [95% t] |",
                 "|---|---|---|---|---|---|---|---|---|---|"]


def contrast_line(c):
    return (f"| {c['a']} vs {c['b']} | {len(c['seeds'])} | {st.num(c['mean_a'], '.1f')} | {st.num(c['mean_b'], '.1f')} | "
            f"{fmt_iv(c['delta'], c['t_lo'], c['t_hi'])} | {fmt_iv(c['delta'], c['boot_lo'], c['boot_hi'])} | "
            f"{c['later']} / {c['earlier']} | {c['p_value']:.4f} | {c['verdict']} | "
            f"{fmt_iv(c['final_delta'], c['final_lo'], c['final_hi'], '.3f')} |")


SECONDARY_HEAD = ["| A vs B | paired seeds | RMST A | RMST B | difference A - B [95% t] | [95% bootstrap] | "
                  "A later / earlier | exact sign-flip P | Holm-adjusted P | verdict (adjusted P) | "
                  "final success A - B [95% t] |", "|---|---|---|---|---|---|---|---|---|---|---|"]


def secondary_line(c):
    return (f"| {c['a']} vs {c['b']} | {len(c['seeds'])} | {st.num(c['mean_a'], '.1f')} | "
            f"{st.num(c['mean_b'], '.1f')} | "
            f"{fmt_iv(c['delta'], c['t_lo'], c['t_hi'])} | {fmt_iv(c['delta'], c['boot_lo'], c['boot_hi'])} | "
            f"{c['later']} / {c['earlier']} | {c['p_value']:.4f} | {c['p_holm']:.4f} ({c['holm_family']}) | "
            f"{c['verdict']} | {fmt_iv(c['final_delta'], c['final_lo'], c['final_hi'], '.3f')} |")


def seed_list(seeds):
    return ", ".join(map(str, seeds))


def sensitivity_lines(sens, primary, lr=st.PRIMARY_LR):
    """The sensitivity paragraph, one bullet a line, every number from ``sensitivity``."""
    n, tied = len(primary["seeds"]), sum(map(len, sens["ties"].values()))
    why = {k: (f"both runs collapsed at {k}" if k.startswith("step") else "neither run collapsed (both censored "
               f"at {TAU})" if k == "censored" else f"one run collapsed at step {TAU}, the other was censored there")
           for k in sens["ties"]}
    sr, sg = sens["signed_rank"], sens["sign_test"]
    big = ", ".join(f"seed {x['seed']}: {x['d']:+d}" for x in sens["largest"])
    lines = [f"- Ties: d = 0 on {tied} of the {n} seeds: "
             + "; ".join(f"{why[k]} on {len(v)} ({seed_list(v)})" for k, v in sens["ties"].items())
             + f". The test rests on the other {sens['untied']} ({sg['later']} later, {sg['earlier']} earlier)."
             if tied else f"- Ties: none of the {n} seeds has d = 0.",
             f"- Leaving out one seed at a time, P ranges from {sens['loo_min']:.4f} to {sens['loo_max']:.4f}; "
             f"it is above {ALPHA} when any one of {len(sens['loo_above_alpha'])} seeds is left out"
             + (f" ({seed_list(sens['loo_above_alpha'])})" if sens["loo_above_alpha"] else "")
             + (f"; leaving out a tied seed leaves it at {primary['p_value']:.4f}." if tied else "."),
             f"- On the {sens['untied']} untied seeds: exact Wilcoxon signed-rank P = {sr['p']:.4f} (W+ = "
             f"{sr['w_plus']:g} of {sr['n'] * (sr['n'] + 1) // 2}; tied |d| share their mean rank); exact sign "
             f"test, {sg['later']} later against {sg['earlier']} earlier, P = {sg['p']:.4f}.",
             f"- The {len(sens['largest'])} largest |d| ({big}) sum to {sens['largest_sum']:+d} of the total "
             f"{sens['total']:+d} steps"
             + (f" ({sens['largest_sum'] / sens['total']:.0%})" if sens["total"] else "")
             + f"; without them the mean difference over the other {sens['rest']} seeds is "
             f"{fmt_iv(sens['rest_mean'], sens['rest_lo'], sens['rest_hi'])} steps (95% t), sign-flip "
             f"P = {sens['rest_p']:.4f}."]
    return lines


def report(per_run, primary, secondary, n_planned, source, lr=st.PRIMARY_LR, sens=None, hoc=None):
    lines = ["# Stability replication: results", "",
             f"Protocol: docs/stability_replication_protocol.md (pre-registered). Written by `{source}`.", "",
             f"RMST: the mean over seeds of the collapse step (a run that did not collapse: {TAU}), restricted to "
             f"tau = {TAU}; collapse as in docs/stability_protocol.md.", "",
             f"## Primary endpoint: otb vs group_mean at lr {lr:g}", ""] + CONTRAST_HEAD + [contrast_line(primary), ""]
    n = len(primary["seeds"])
    if n < n_planned:
        lines += [f"Interim: {n} of the {n_planned} planned paired seeds have finished. The protocol's verdict "
                  "is read only when all planned seeds have finished (or at the stopping time); the line above "
                  "is a progress report, not the verdict.", ""]
    else:
        lines += [f"Verdict (as pre-registered): **{primary['verdict']}**.", ""]
        if sens is not None:
            lines += ["### Sensitivity of the primary (added after the verdict; descriptive, not the registered "
                      "test)", ""] + sensitivity_lines(sens, primary, lr) + [""]
    a, b = per_run.get(("otb", lr), {}), per_run.get(("group_mean", lr), {})
    lines += [f"Per seed at lr {lr:g} (- : did not collapse; failed: success <= {FAIL_LEVEL} over the last "
              f"{FAIL_WINDOW} steps):", "",
              "| seed | otb: collapse step | group_mean: collapse step | d | otb: final success | "
              "group_mean: final success | otb failed | group_mean failed |", "|---|---|---|---|---|---|---|---|"]
    for s in sorted(set(a) & set(b)):
        lines.append(f"| {s} | {a[s]['collapse_step'] or '-'} | {b[s]['collapse_step'] or '-'} | "
                     f"{a[s]['time_steps'] - b[s]['time_steps']} | {a[s]['final_success']:.3f} | "
                     f"{b[s]['final_success']:.3f} | {'yes' if a[s]['failed'] else 'no'} | "
                     f"{'yes' if b[s]['failed'] else 'no'} |")
    lines += ["", "## Secondary: absolute failure and collapse per cell (95% Wilson intervals)", "",
              "| estimator | lr | seeds | failed | failure rate | collapsed | collapse rate | final success (seed mean) |",
              "|---|---|---|---|---|---|---|---|"]
    for (est, x), runs in sorted(per_run.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        k = len(runs)
        nf, nc = sum(r["failed"] for r in runs.values()), sum(r["collapsed"] for r in runs.values())
        lines.append(f"| {est} | {x:g} | {k} | {nf} | {fmt_iv(*st.wilson(nf, k), spec='.2f')} | {nc} | "
                     f"{fmt_iv(*st.wilson(nc, k), spec='.2f')} | "
                     f"{fmean(r['final_success'] for r in runs.values()):.3f} |")
    seeds = sorted(set(a) & set(b))
    fa = sum(a[s]["failed"] and not b[s]["failed"] for s in seeds)
    fb = sum(b[s]["failed"] and not a[s]["failed"] for s in seeds)
    lines += ["", f"Failure, paired at lr {lr:g}: otb only {fa}, group_mean only {fb}; exact McNemar "
              f"P = {st.mcnemar_exact(fa, fb):.3f}.", "",
              "## Secondary: otb against the other estimators, and at the other rate", "",
              "Holm-adjusted P (added after the results; the protocol planned no correction): Holm's step-down "
              "correction within the contrasts at each rate, whose number is in parentheses; the verdict reads the "
              "adjusted P with the primary's rule."
              + (f" With all {len(secondary)} rows as one family the smallest adjusted P is "
                 f"{min(c['p_holm_all'] for c in secondary):.4f}." if secondary else ""), ""]
    lines += SECONDARY_HEAD + [secondary_line(c) for c in secondary]
    if hoc:
        lines += ["", "## Post hoc (asked after the results; descriptive, not tested by the protocol)", ""]
        if "reinforce_vs_group_mean" in hoc:
            lines += [f"Time to collapse, reinforce (no baseline) against group_mean at lr {lr:g}:", ""]
            lines += CONTRAST_HEAD + [contrast_line(hoc["reinforce_vs_group_mean"]), ""]
        lines += [f"The first study's primary endpoint (docs/stability_protocol.md), collapse by step {TAU}, "
                  f"on this study's seeds at lr {lr:g} (exact McNemar on the seeds where one collapsed):", ""]
        lines += st.PAIR_HEAD + [st.pair_line(hoc["first_endpoint"])]
    return "\n".join(lines) + "\n"


# =====================================================================================
# Running: the blocks, one run at a time, the machine's load recorded
# =====================================================================================

def plan(seeds, blocks=BLOCKS):
    """[(block name, [(estimator, seed, lr), ...]), ...]: every block seed by seed, in protocol order."""
    return [(name, [(e, s, lr) for e in ests]) for name, ests, lr in blocks for s in seeds]


def record_load(path, **fields):
    """Append the time and the 1/5/15-minute load averages to a JSONL file."""
    with open(path, "a") as f:
        f.write(json.dumps(dict(utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                load=[round(x, 2) for x in os.getloadavg()], cpus=os.cpu_count(), **fields)) + "\n")


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--runs", type=out_folder, default=str(ROOT / "runs" / "stability_replication"),
                   help="folder of the training runs (and their warm-up cache)")
    p.add_argument("--out", type=out_folder, default=str(ROOT / "benchmarks" / "results" / "stability_replication"),
                   help="folder for summary.md, results.json, load.jsonl and the saved metrics (runs/)")
    p.add_argument("--seeds", type=int_list(0), default=",".join(map(str, SEEDS)), help="the paired seeds")
    p.add_argument("--blocks", default=",".join(b[0] for b in BLOCKS), help="blocks to run, of R1-R4")
    p.add_argument("--power", action="store_true", help="print the protocol's power table and stop")
    return parse_study_args(p, argv, steps=TAU)


def main(argv=None):
    args = parse_args(argv)
    if args.power:
        print("\n".join(power_table()))
        return None
    out = Path(args.out)
    saved = Path(args.from_saved or args.out) / "runs"
    if not args.from_saved:
        code = code_to_run("benchmarks/stability_replication.py", args.allow_dirty)  # refuses uncommitted code
        chosen = [b for b in BLOCKS if b[0] in args.blocks.split(",")]
        todo = plan(args.seeds, chosen)
        out.mkdir(parents=True, exist_ok=True)
        print(f"{sum(len(j) for _, j in todo)} runs into {args.runs}", flush=True)
        for name, jobs in todo:
            jobs = [(e, s, lr) for e, s, lr in jobs if not (Path(args.runs) / st.run_name(e, s, lr) / "DONE").exists()]
            if not jobs:
                continue
            st.started(args.runs, [st.run_name(e, s, lr) for e, s, lr in jobs], code)
            record_load(out / "load.jsonl", block=name, seed=jobs[0][1], event="start")
            grid.run([(st.command(e, s, lr, args.runs, args.steps, args.train_args.split()),
                       Path(args.runs) / st.run_name(e, s, lr), s) for e, s, lr in jobs], 1, code)
            record_load(out / "load.jsonl", block=name, seed=jobs[0][1], event="end")
            st.collect(args.runs, saved)  # each finished seed is saved at once
            write(out, saved, len(args.seeds))
    return write(out, saved, len(args.seeds) if not args.from_saved else None)


def write(out, saved, n_planned=None):
    histories = st.load_saved(saved)
    if not histories:
        sys.exit(f"no saved runs in {saved}")
    per_run, primary, secondary = analyse(histories)
    n_planned = n_planned or len(SEEDS)
    sens = sensitivity(primary, per_run) if len(primary["seeds"]) >= n_planned else None  # once the verdict is read
    hoc = post_hoc(per_run)
    source = "python benchmarks/stability_replication.py --from-saved benchmarks/results/stability_replication"
    code = st.saved_code(saved, [st.run_name(e, s, x) for (e, x), by_seed in histories.items() for s in by_seed])
    text = report(per_run, primary, secondary, n_planned, source, sens=sens, hoc=hoc) + "\n" + st.code_line(code) + "\n"
    key = lambda cell: f"{cell[0]} lr {cell[1]:g}"  # noqa: E731
    record = dict(protocol="docs/stability_replication_protocol.md", command=source, tau=TAU,
                  planned_seeds=n_planned, code=code, failure=dict(window=FAIL_WINDOW, level=FAIL_LEVEL),
                  per_run={key(c): {str(s): r for s, r in runs.items()} for c, runs in per_run.items()},
                  primary=primary, secondary=secondary, sensitivity=sens, post_hoc=hoc)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_results(out, "results", json.loads(json.dumps(record)), text, md_stem="summary")
    cells = {cell: st.cell_summary(runs) for cell, runs in sorted(per_run.items(), key=lambda kv: (kv[0][1], kv[0][0]))
             if len(runs) >= 2}
    if cells:  # the first study's figure: survival over steps and tokens at 7e-4, collapse rate per rate
        import matplotlib
        matplotlib.use("Agg")  # files only
        import matplotlib.pyplot as plt
        plt.close(st.plot(cells, Path(out) / "survival.png"))
    return record


if __name__ == "__main__":
    main()
