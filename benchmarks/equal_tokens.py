"""The equal-token study: OTB at N = 4 against group baselines, at the same budget of sampled tokens.

Runs the pre-registered protocol of docs/equal_tokens_protocol.md (read it first: Addendum 1 fixes
the endpoints' rules and the saved data, Addenda 2-5 the common-learning-rate runs): a pilot on
seed 100 picks each learning rate, then 5 configurations x 6 paired seeds of ``train.py`` (one
subprocess and folder each under --runs; benchmarks/grid.py keeps finished runs, so a study
resumes), endpoints, OTB's paired differences (95% t intervals), a labelled post-hoc section and a
figure, into --out. The runs' metrics files were not kept: --from-saved recovers every step from
the curves in results.json. Each run records the code it ran as it starts (provenance.json); the
study stops at the first run of other code than it started from (benchmarks/grid.py; --allow-dirty
goes on), and results.json (``runs_code``) and summary.md say which runs ran which code. Results and
commands: docs/reproduction.md.

    python benchmarks/equal_tokens.py                  # everything (about an hour; finished runs kept)
    python benchmarks/equal_tokens.py --from-saved benchmarks/results/equal_tokens/results.json \
        --out benchmarks/results/equal_tokens          # re-analyse the saved per-step data (1 s)
"""
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import compare  # noqa: E402
from benchmarks import grid  # noqa: E402
from benchmarks.cli import allow_dirty_option, at_least, out_folder, parser, study_code, write_results  # noqa: E402
from lab.runs import read_jsonl  # noqa: E402
from lab.analysis.stats import mean_se  # noqa: E402
from lab.machine import NOT_RECORDED, kept_provenance, provenance  # noqa: E402
from lab import machine  # noqa: E402

# ---- the protocol (docs/equal_tokens_protocol.md); change only by an addendum there
HORIZON = 64
CONFIGS = [("otb", 4), ("group_mean", 4), ("rloo", 4), ("reinforce", 4), ("group_mean", 16)]
PROMPTS_PER_STEP = 8
BUDGET = 120 * 32 * 65  # sampled response tokens per run: 249,600
STEPS = {4: 140, 16: 35}  # slack beyond the budget; endpoints use tokens <= BUDGET only
SEEDS = [0, 1, 2, 3, 4, 5]
PILOT_SEED = 100
LR_GRID = [1e-4, 3e-4, 1e-3]
WARMUP_TARGET = 0.25
TARGET_SUCCESS = 0.5
WINDOW = 25_000  # tokens of the trailing window for "tokens to target" and the figure
MARGIN = 0.05  # non-inferiority margin on the primary endpoint


def run_name(est, n, seed, lr):
    return f"{est}-n{n}-seed{seed}-lr{lr:g}"


def command(est, n, seed, lr, runs):
    return [sys.executable, str(ROOT / "train.py"), "--task", "periodic", "--horizon", str(HORIZON),
            "--estimator", est, "--group-size", str(n), "--prompts-per-step", str(PROMPTS_PER_STEP),
            "--steps", str(STEPS[n]), "--lr", f"{lr:g}", "--seed", str(seed),
            "--warmup-target", str(WARMUP_TARGET), "--out", str(runs), "--name", run_name(est, n, seed, lr),
            "--log-every", "1000"]


def history(runs, est, n, seed, lr):
    return read_jsonl(Path(runs) / run_name(est, n, seed, lr) / "metrics.jsonl")


def train(jobs, runs, workers, code):
    """Every (est, n, seed, lr) job as a train.py run in its folder under ``runs``, each held to the
    study's ``code`` (benchmarks/grid.py)."""
    grid.run([(command(*j, runs), Path(runs) / run_name(*j), j[2]) for j in jobs], workers, code)


# ---- Endpoints and analysis (as pre-registered, with Addendum 1 of the protocol)

# The endpoints of compare.py (train.py --seeds computes the same ones) at this study's B, window, target
within_budget = partial(compare.within_budget, budget=BUDGET)
endpoints = partial(compare.endpoints, budget=BUDGET, window=WINDOW, target=TARGET_SUCCESS)
curve = partial(compare.curve, budget=BUDGET, window=WINDOW)


def median_censored(values):
    """(median, lower_bound) of per-seed tokens to target, a seed that never reached it counted as
    BUDGET (censored); lower_bound: a censored value enters the median, so the true one is at least it."""
    xs = sorted((BUDGET, True) if v is None else (v, False) for v in values)
    mid = xs[(len(xs) - 1) // 2:len(xs) // 2 + 1]  # the middle one, or the middle two
    return sum(v for v, _ in mid) / len(mid), any(c for _, c in mid)


def paired_diff(a, b, endpoint, comparator):
    """d_s = a[s] - b[s] over SEEDS: mean and 95% interval mean +- t(0.975, 5) sd / sqrt(6)."""
    return compare.paired_diff(a, b, SEEDS, endpoint, comparator)


def choose_lrs(pilot):
    """The pilot's rule: the LR with the highest primary endpoint, ties to the smaller LR."""
    return {(est, n): -max((p["primary"], -p["lr"]) for p in pilot if p["config"] == f"{est}:{n}"
                           and p["primary"] is not None and not math.isnan(p["primary"]))[1]
            for est, n in CONFIGS}  # max of (primary, -lr): on a tie the larger -lr, the smaller lr


def config_row(est, n, lr, by_seed):
    row = dict(config=f"{est}:{n}", lr=lr)
    for k in ("primary", "auc"):
        row[k], row[k + "_se"] = mean_se([by_seed[s][k] for s in SEEDS])
    ttt = [by_seed[s]["tokens_to_target"] for s in SEEDS]
    row["reached_target"] = sum(v is not None for v in ttt)
    row["tokens_to_target_median"], row["tokens_to_target_median_is_lower_bound"] = median_censored(ttt)
    row["stopped_short_seeds"] = [s for s in SEEDS if by_seed[s]["stopped_short"]]
    return row


def analyse(load, lrs, optional=False):
    """Endpoints of each configuration's 6 runs at ``lrs[(est, n)]``, its table row, and OTB N=4 minus
    each comparator. ``load(est, n, seed, lr)`` returns (history, steps given) of one run; with
    ``optional`` a configuration not run is named and left out (Addendum 3), else it stops the script."""
    per_run, missing = {}, []
    for est, n in CONFIGS:
        try:
            per_run[(est, n)] = {s: endpoints(*load(est, n, s, lrs[(est, n)])) for s in SEEDS}
        except SystemExit:
            if not optional:
                raise
            missing.append(f"{est}:{n}")
    rows = [config_row(est, n, lrs[(est, n)], by_seed) for (est, n), by_seed in per_run.items()]
    otb4 = per_run.get(("otb", 4))
    paired = [paired_diff(otb4, per_run[(est, n)], k, f"{est}:{n}") for est, n in per_run
              if (est, n) != ("otb", 4) for k in ("primary", "auc")] if otb4 else []
    return per_run, rows, paired, missing


def verdicts(paired):
    """The pre-registered verdicts (primary endpoint); against group_mean:16 also non-inferiority."""
    def margin(p):  # the non-inferiority test, against group_mean:16 only
        ok = "supported" if p["ci_low"] > -MARGIN else "NOT supported"
        return f"; non-inferiority at margin {MARGIN} {ok}" if p["comparator"] == "group_mean:16" else ""
    return [dict(comparator=p["comparator"], verdict=compare.verdict(p, "OTB at N=4") + margin(p))
            for p in paired if p["endpoint"] == "primary"]


def post_hoc_vs_n16(per_run):
    """Post hoc, not pre-registered: each N = 4 configuration minus group_mean:16 (same t interval).
    It checks the reading "every N = 4 configuration ends above group_mean at N = 16"."""
    out = [paired_diff(per_run[(est, n)], per_run[("group_mean", 16)], k, f"{est}:{n}")
           for est, n in CONFIGS if n == 4 for k in ("primary", "auc")]
    for p in out:
        p["verdict"] = compare.verdict(p, p["comparator"]) if p["endpoint"] == "primary" else None
    return out


# ---- Addenda 2 and 3: otb:4 and its comparators at a common learning rate
COMMON_LRS = {3e-4: "Addendum 2", 1e-4: "Addendum 3"}
PLANNED = {3e-4: ["otb:4", "group_mean:4", "rloo:4", "reinforce:4", "group_mean:16"],  # Addendum 2
           1e-4: ["group_mean:4", "rloo:4", "reinforce:4"]}  # Addendum 3 (stopped: Addendum 8)
# existing runs made again and compared with the saved ones: seed 0 (Addendum 2), seeds 1-5 (Addendum 4)
RERUN_CHECKS = [("group_mean", 4, s, 3e-4) for s in SEEDS]


def analyse_common_lr(load, lr):
    """otb:4 against every comparator with all 6 seeds run at ``lr``: rows and paired differences;
    not_run: the configurations the addendum planned (PLANNED) that lack a seed (Addendum 9)."""
    _, rows, paired, missing = analyse(load, dict.fromkeys(CONFIGS, lr), optional=True)
    for p in paired:
        p["verdict"] = compare.verdict(p, "OTB at N=4") if p["endpoint"] == "primary" else None
    return dict(lr=lr, addendum=COMMON_LRS[lr], rows=rows, paired=paired,
                not_run=[c for c in missing if c in PLANNED[lr]])


def rerun_check(job, rerun, saved):
    """Compare a re-run's within-budget steps with the saved ones: steps, tokens, success."""
    a, b = within_budget(rerun), within_budget(saved)
    same = sum(x == y for x, y in zip(a, b))
    return dict(run=run_name(*job), steps_rerun=len(a), steps_saved=len(b), identical_steps=same,
                max_abs_success_diff=max((abs(x[2] - y[2]) for x, y in zip(a, b)), default=None),
                max_abs_tokens_diff=max((abs(x[0] - y[0]) for x, y in zip(a, b)), default=None),
                primary_rerun=endpoints(rerun)["primary"], primary_saved=endpoints(saved)["primary"])


# ---- Where the histories come from: the run folders, or the curves saved in results.json

def history_from_curve(xs, ys, n):
    """Invert ``curve`` (Addendum 1): step i's success is what its window's token-weighted sum leaves
    after the earlier steps in it, rounded to the grid k/(8N) of a batch of 8N (removing float error)."""
    h, succ = [], []
    for i, (c, y) in enumerate(zip(xs, ys)):
        window = [j for j in range(i + 1) if xs[j] > c - WINDOW]
        d = [xs[j] - (xs[j - 1] if j else 0) for j in window]
        rest = sum(dj * succ[j] for dj, j in zip(d[:-1], window[:-1]))
        s = round((y * sum(d) - rest) / d[-1] * PROMPTS_PER_STEP * n) / (PROMPTS_PER_STEP * n)
        succ.append(s)
        h.append(dict(step=i + 1, tokens=c, success=s))
    return h


def saved_curves(d):
    """{run name: (xs, ys)} of every run whose curve is stored in ``d``, a loaded results.json."""
    out = {}
    for cfg, by_seed in d["curves"].items():
        est, n = cfg.split(":")
        for s, xy in by_seed.items():
            out[run_name(est, int(n), int(s), d["chosen_lr"][cfg])] = xy
    out.update(d.get("extra_curves", {}))
    return out


def make_loader(runs, saved):
    """load(est, n, seed, lr) -> (history, steps given): the saved curve if there is one (the record of
    the study), else the run folder's metrics (which must be finished)."""
    def load(est, n, seed, lr):
        name = run_name(est, n, seed, lr)
        if name in saved:
            return history_from_curve(*saved[name], n), STEPS[n]
        h = history(runs, est, n, seed, lr)
        if not h or h[-1]["step"] < STEPS[n]:
            raise SystemExit(f"{name}: no finished run in {runs} and no saved curve")
        load.from_runs[name] = curve(h)
        return h, STEPS[n]
    load.from_runs = {}  # {run name: curve} of the runs read from the folders, saved in results.json
    return load


def plot(curves, lrs, path=None):
    """Success against tokens, mean of the seeds ± 1 s.e.; ``curves``: {"est:n": {seed: curve}}."""
    import matplotlib.pyplot as plt
    import numpy as np
    from scipy.stats import sem
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    at = np.linspace(WINDOW, BUDGET, 60)  # tokens where the seeds are averaged
    for est, n in CONFIGS:
        ys = np.array([np.interp(at, x, y) for x, y in curves[f"{est}:{n}"].values()])  # (seeds, 60)
        mu, se = ys.mean(0), sem(ys, axis=0)  # (60,) each
        style = dict(lw=2.6, zorder=5) if est == "otb" else dict(lw=1.4, ls="--" if n == 16 else "-")
        ax.plot(at, mu, label=f"{est} N={n} (lr {lrs[(est, n)]:g})", **style)
        ax.fill_between(at, mu - se, mu + se, alpha=0.15)
    ax.set(xlabel="response tokens sampled", ylabel=f"success (trailing {WINDOW:,} tokens)",
           title=f"periodic copy n={HORIZON}: mean of {len(SEEDS)} seeds (band: ± 1 s.e.)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def number(x, spec=".3f"):
    """A table cell: x formatted, "-" when it is missing (None or nan)."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def config_line(c):
    m = c["tokens_to_target_median"]
    med = number(m, ",.1f" if m % 1 else ",.0f")
    med += " (lower bound)" if c["tokens_to_target_median_is_lower_bound"] else ""
    short = ", ".join(f"seed {s}" for s in c["stopped_short_seeds"]) or "none"
    return (f"| {c['config']} | {c['lr']:g} | {number(c['primary'])} ± {number(c['primary_se'])} | "
            f"{number(c['auc'])} ± {number(c['auc_se'])} | {c['reached_target']}/6 | {med} | {short} |")


def paired_line(p):
    return (f"| {p['comparator']} | {p['endpoint']} | {p['mean_diff']:+.3f} | "
            f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] | {p['higher_seeds']}/6 |")


CONFIG_HEAD = ["| config | lr | primary: success, last quarter | AUC: success over B | seeds reaching "
               f"{TARGET_SUCCESS} | median tokens to {TARGET_SUCCESS} (censored at B) | stopped short of B |",
               "|---|---|---|---|---|---|---|"]
PAIRED_HEAD = ["| comparator | endpoint | mean difference | 95% interval | seeds where OTB is higher |",
               "|---|---|---|---|---|"]


def report(lrs, pilot, configs, paired, post_hoc, common, reruns, source):
    lines = ["# Equal-token study: results", "",
             "Protocol: docs/equal_tokens_protocol.md (pre-registered, with its dated addenda). Written by "
             f"`{source}`.", "",
             "## Learning rates chosen on the pilot seed", "",
             "| config | " + " | ".join(f"lr {lr:g}: primary" for lr in LR_GRID) + " | chosen |",
             "|---|" + "---|" * (len(LR_GRID) + 1)]
    for est, n in CONFIGS:
        cells = [number(next(p["primary"] for p in pilot if p["config"] == f"{est}:{n}" and p["lr"] == lr))
                 for lr in LR_GRID]
        lines.append(f"| {est}:{n} | " + " | ".join(cells) + f" | {lrs[(est, n)]:g} |")
    lines += ["", "## Endpoints per configuration (mean ± s.e. over 6 seeds)", "", *CONFIG_HEAD,
              *map(config_line, configs), "",
              "A run stops short of B when it ran out of its steps before B (Addendum 1); the tokens "
              "to target of a seed that never reached it count as B.",
              "", "## Paired differences, OTB N=4 minus comparator (95% interval, t with 5 df)", "",
              *PAIRED_HEAD, *map(paired_line, paired),
              "", "## Verdicts (primary endpoint, as pre-registered)", ""]
    lines += [f"- {v['comparator']}: {v['verdict']}" for v in verdicts(paired)]
    lines += ["", "## Post hoc (not pre-registered): each N=4 configuration minus group_mean:16", "",
              "Same paired t interval; a reading made after the results, not a test the protocol planned.",
              "",
              "| N=4 configuration | endpoint | mean difference | 95% interval | seeds where N=4 is higher |",
              PAIRED_HEAD[1], *map(paired_line, post_hoc), ""]
    lines += [f"- {p['comparator']} vs group_mean:16: {p['verdict']}" for p in post_hoc if p["verdict"]]
    for c in common:
        lr, add = c["lr"], c["addendum"]
        lines += ["", f"## {add}: OTB and the comparators at a common learning rate ({lr:g})", "",
                  f"Not the pre-registered analysis: every configuration below at lr {lr:g} on the same 6 "
                  f"seeds ({add} of the protocol, committed before its runs), OTB N=4 paired with each "
                  "comparator at the same rate.", "", *CONFIG_HEAD, *map(config_line, c["rows"]), "",
                  *PAIRED_HEAD, *map(paired_line, c["paired"]), ""]
        lines += [f"- {p['comparator']}: {p['verdict']}" for p in c["paired"] if p["verdict"]]
        if c["not_run"]:
            lines += [f"- not run at lr {c['lr']:g} (all 6 seeds needed): " + ", ".join(c["not_run"])
                      + (" (the addendum was stopped after 2 of its 18 runs: Addendum 8 of the protocol)"
                         if c["lr"] == 1e-4 else "")]
    if reruns:
        lines += ["", "## Re-run checks (Addenda 2 and 4): saved runs made again from the same seed", "",
                  "| run | steps within B (re-run / saved) | identical steps | largest success difference "
                  "| largest token difference | primary re-run (saved) |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['run']} | {r['steps_rerun']} / {r['steps_saved']} | {r['identical_steps']} | "
                  f"{number(r['max_abs_success_diff'], '.4f')} | "
                  f"{number(r['max_abs_tokens_diff'], ',.0f')} | "
                  f"{r['primary_rerun']:.4f} ({r['primary_saved']:.4f}) |" for r in reruns]
    lines += ["", f"Budget {BUDGET:,} tokens per run.", ""]
    return "\n".join(lines)


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--runs", type=out_folder, default=str(ROOT / "runs" / "equal_tokens"),
                   help="folder of the training runs")
    p.add_argument("--out", type=out_folder, default=str(ROOT / "runs" / "equal_tokens"), help="folder for "
                   "summary.md, results.json and success_vs_tokens.png (benchmarks/results/equal_tokens to "
                   "update the committed results)")
    p.add_argument("--jobs", type=at_least(1), default=2, help="training runs at a time (one thread each)")
    p.add_argument("--from-saved", default=None, metavar="RESULTS_JSON",
                   help="no training: take each run's per-step data from the curves saved in this "
                   "results.json (Addendum 1), and from --runs only for runs it does not hold (Addendum 2's)")
    allow_dirty_option(p)
    args = p.parse_args(argv)
    if args.from_saved is not None and not Path(args.from_saved).is_file():
        p.error(f"--from-saved {args.from_saved}: no such file")
    return args


def main(argv=None):
    args = parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    t0 = time.time()
    saved_json = json.loads(Path(args.from_saved).read_text()) if args.from_saved else {}
    saved = saved_curves(saved_json) if saved_json else {}
    load = make_loader(runs, saved)
    if not args.from_saved:
        code = study_code(args.allow_dirty)  # every run is held to it
        print(f"pilot: {len(CONFIGS) * len(LR_GRID)} runs on seed {PILOT_SEED}", flush=True)
        train([(e, n, PILOT_SEED, lr) for e, n in CONFIGS for lr in LR_GRID], runs, args.jobs, code)
    pilot = saved_json["pilot"] if args.from_saved else [  # saved: config, lr and primary only
        dict(config=f"{e}:{n}", lr=lr, primary=endpoints(*load(e, n, PILOT_SEED, lr))["primary"])
        for e, n in CONFIGS for lr in LR_GRID]
    lrs = choose_lrs(pilot)
    print("chosen learning rates: " + ", ".join(f"{e}:{n} {lr:g}" for (e, n), lr in lrs.items()), flush=True)
    if not args.from_saved:
        print(f"main: {len(CONFIGS) * len(SEEDS)} runs, then those of Addenda 2 and 3", flush=True)
        train([(e, n, s, lrs[(e, n)]) for s in SEEDS for e, n in CONFIGS], runs, args.jobs, code)
        train([(e, n, s, lr) for lr in COMMON_LRS for e, n in CONFIGS if n == 4 and lrs[(e, n)] != lr
               for s in SEEDS], runs, args.jobs, code)  # Addenda 2 and 3
    per_run, configs, paired, _ = analyse(load, lrs)
    common = [analyse_common_lr(load, lr) for lr in COMMON_LRS]
    reruns = []
    for job in RERUN_CHECKS:
        check = "rerun:" + run_name(*job)
        h = history(runs, *job)
        if check not in saved and run_name(*job) in saved and h and h[-1]["step"] >= STEPS[job[1]]:
            saved[check] = curve(h)
            load.from_runs[check] = saved[check]  # read from its folder, as the runs load reads
        if check in saved:
            reruns.append(rerun_check(job, history_from_curve(*saved[check], job[1]), load(*job)[0]))
    path = Path(args.from_saved or ".").resolve()
    path = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    source = "python benchmarks/equal_tokens.py" + (f" --from-saved {path}" if args.from_saved else "")
    post_hoc = post_hoc_vs_n16(per_run)
    text = report(lrs, pilot, configs, paired, post_hoc, common, reruns, source)
    curves = {f"{e}:{n}": {str(s): curve(load(e, n, s, lrs[(e, n)])[0]) for s in SEEDS} for e, n in CONFIGS}
    main_runs = {run_name(e, n, s, lrs[(e, n)]) for e, n in CONFIGS for s in SEEDS}
    extra = {k: v for k, v in {**saved, **load.from_runs}.items() if k not in main_runs}
    runs_code = {**saved_json.get("runs_code", {}),  # each run's own record, as it started (None: not recorded)
                 **{k: machine.recorded_code(runs / k.removeprefix("rerun:")) for k in load.from_runs}}
    runs_code = {k: runs_code.get(k) for k in sorted(main_runs | set(extra))}
    text += f"\nCode, as each run recorded it when it started (provenance.json): {grid.which_code(runs_code)}.\n"
    made_on = dict(machine=saved_json.get("machine", NOT_RECORDED), provenance=kept_provenance(saved_json)) \
        if args.from_saved else dict(machine=machine.info(), provenance=provenance())  # the measurement's
    write_results(out, "results", dict(
        protocol="docs/equal_tokens_protocol.md", command=source, **made_on, budget=BUDGET, seeds=SEEDS,
        pilot_seed=PILOT_SEED, lr_grid=LR_GRID, chosen_lr={f"{e}:{n}": lr for (e, n), lr in lrs.items()},
        pilot=pilot, per_run={f"{e}:{n}": {str(s): v for s, v in d.items()} for (e, n), d in per_run.items()},
        configs=configs, paired=paired, verdicts=verdicts(paired), post_hoc_vs_group_mean16=post_hoc,
        common_lr=common, rerun_checks=reruns, seconds=time.time() - t0, curves=curves,
        extra_curves=extra, runs_code=runs_code), text, md_stem="summary")
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(curves, lrs, out / "success_vs_tokens.png"))


if __name__ == "__main__":
    main()
