"""The equal-token study: OTB at N = 4 against group baselines, at the same budget of sampled tokens.

Runs exactly the pre-registered protocol of docs/equal_tokens_protocol.md (read it first): a
learning-rate pilot on seed 100, then 5 configurations x 6 paired seeds of ``train.py`` on the
periodic-copy task at n = 64, then the analysis (endpoints per run, paired differences of OTB at
N = 4 against each comparator with 95% intervals, one figure).

    python benchmarks/equal_tokens.py                  # everything (about an hour on 2 CPU cores)
    python benchmarks/equal_tokens.py --analyse-only   # recompute the tables from finished runs

Each training run is a ``python train.py ...`` subprocess writing its own folder under ``--runs``;
a run whose metrics reach its step count is not run again, so an interrupted study resumes where
it stopped. Results (summary.md, results.json, success_vs_tokens.png) go to --out.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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
T_975_DF5 = 2.571  # t quantile for a 95% interval with 6 seeds
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
    path = Path(runs) / run_name(est, n, seed, lr) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finished(runs, est, n, seed, lr):
    h = history(runs, est, n, seed, lr)
    return bool(h) and h[-1]["step"] >= STEPS[n]


def run_all(jobs, runs, workers, log):
    """Run train.py for every (est, n, seed, lr) job, ``workers`` at a time.

    The first job of a seed builds that seed's warm-up (cached under runs/_cache); the seed's
    other jobs wait for it, so two processes never warm up the same model.
    """
    jobs = [j for j in jobs if not finished(runs, *j)]
    lock, ready, started = threading.Lock(), {}, set()
    for j in jobs:
        ready.setdefault(j[2], threading.Event())

    def one(job):
        est, n, seed, lr = job
        with lock:
            first = seed not in started
            started.add(seed)
        if not first:
            ready[seed].wait()
        folder = Path(runs) / run_name(*job)
        if folder.exists():  # an interrupted earlier attempt: start it again from scratch
            shutil.rmtree(folder)
        t0 = time.time()
        with open(log, "a") as f:
            rc = subprocess.run(command(*job, runs), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}).returncode
        if first:
            ready[seed].set()
        print(f"  {run_name(*job)}: rc {rc}, {time.time() - t0:.0f} s", flush=True)
        return rc

    # first job of every seed early, so warm-ups of different seeds overlap
    order = sorted(jobs, key=lambda j: (0 if j == next(k for k in jobs if k[2] == j[2]) else 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        codes = list(pool.map(one, order))
    if any(codes):
        raise SystemExit(f"{sum(1 for c in codes if c)} run(s) failed; see {log}")


# =====================================================================================
# Endpoints and analysis (as pre-registered)
# =====================================================================================

def within_budget(h):
    """Steps whose cumulative tokens are <= BUDGET, with each step's own token count."""
    out, prev = [], 0
    for r in h:
        if r["tokens"] > BUDGET:
            break
        out.append((r["tokens"], r["tokens"] - prev, r["success"]))
        prev = r["tokens"]
    return out


def endpoints(h):
    steps = within_budget(h)
    if not steps:
        return None
    used = steps[-1][0]
    last = [(d, s) for c, d, s in steps if c > 0.75 * BUDGET]
    primary = sum(d * s for d, s in last) / sum(d for d, _ in last) if last else float("nan")
    auc = sum(d * s for _, d, s in steps) / used
    to_target = None
    for i, (c, _, _) in enumerate(steps):
        window = [(d, s) for c2, d, s in steps[:i + 1] if c2 > c - WINDOW]
        if c >= WINDOW and sum(d * s for d, s in window) / sum(d for d, _ in window) >= TARGET_SUCCESS:
            to_target = c
            break
    return dict(primary=primary, auc=auc, tokens_to_target=to_target, tokens_used=used,
                reached_budget=used >= 0.98 * BUDGET, steps=len(steps))


def mean_se(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return mu, sd / math.sqrt(len(xs))


def choose_lrs(runs):
    chosen, pilot = {}, []
    for est, n in CONFIGS:
        scores = []
        for lr in LR_GRID:
            e = endpoints(history(runs, est, n, PILOT_SEED, lr))
            scores.append((e["primary"] if e else float("nan"), lr))
            pilot.append(dict(config=f"{est}:{n}", lr=lr, **(e or {})))
        best = max(s for s, _ in scores if not math.isnan(s))
        chosen[(est, n)] = min(lr for s, lr in scores if s == best)  # ties: the smaller LR
    return chosen, pilot


def analyse(runs, lrs):
    per_run = {(est, n): {s: endpoints(history(runs, est, n, s, lrs[(est, n)])) for s in SEEDS}
               for est, n in CONFIGS}
    configs = []
    for (est, n), by_seed in per_run.items():
        row = dict(config=f"{est}:{n}", lr=lrs[(est, n)])
        for k in ("primary", "auc"):
            row[k], row[k + "_se"] = mean_se([by_seed[s][k] for s in SEEDS])
        reached = [by_seed[s]["tokens_to_target"] for s in SEEDS if by_seed[s]["tokens_to_target"]]
        row["reached_target"] = len(reached)
        row["tokens_to_target_median"] = sorted(reached)[len(reached) // 2] if reached else None
        row["all_reached_budget"] = all(by_seed[s]["reached_budget"] for s in SEEDS)
        configs.append(row)
    otb4 = per_run[("otb", 4)]
    paired = []
    for est, n in CONFIGS[1:]:
        for k in ("primary", "auc"):
            d = [otb4[s][k] - per_run[(est, n)][s][k] for s in SEEDS]
            mu, se = mean_se(d)
            lo, hi = mu - T_975_DF5 * se, mu + T_975_DF5 * se
            paired.append(dict(comparator=f"{est}:{n}", endpoint=k, mean_diff=mu, ci_low=lo, ci_high=hi,
                               per_seed=d, otb_better_seeds=sum(x > 0 for x in d)))
    return per_run, configs, paired


def verdicts(paired):
    out = []
    for p in paired:
        if p["endpoint"] != "primary":
            continue
        if p["ci_low"] > 0:
            v = "OTB at N=4 is better (interval above 0)"
        elif p["ci_high"] < 0:
            v = "OTB at N=4 is worse (interval below 0)"
        else:
            v = "no difference shown (interval contains 0)"
        if p["comparator"] == "group_mean:16":
            v += ("; non-inferiority at margin 0.05 supported" if p["ci_low"] > -MARGIN
                  else "; non-inferiority at margin 0.05 NOT supported")
        out.append(dict(comparator=p["comparator"], verdict=v))
    return out


def curve(h):
    """Trailing-window (WINDOW tokens) success against tokens, within the budget."""
    steps = within_budget(h)
    xs, ys = [], []
    for i, (c, _, _) in enumerate(steps):
        window = [(d, s) for c2, d, s in steps[:i + 1] if c2 > c - WINDOW]
        xs.append(c)
        ys.append(sum(d * s for d, s in window) / sum(d for d, _ in window))
    return xs, ys


def curves_of(runs, lrs):
    """{"est:n": {seed: (tokens, trailing-window success)}} for the figure (stored in results.json)."""
    return {f"{est}:{n}": {str(s): curve(history(runs, est, n, s, lrs[(est, n)])) for s in SEEDS}
            for est, n in CONFIGS}


def plot(curves, lrs, path=None):
    """Success against tokens, mean of the seeds ± 1 s.e.; ``curves`` from curves_of. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    grid = np.linspace(WINDOW, BUDGET, 60)
    for est, n in CONFIGS:
        ys = np.array([np.interp(grid, x, y) for x, y in curves[f"{est}:{n}"].values()])  # (seeds, grid)
        mu, se = ys.mean(0), ys.std(0, ddof=1) / np.sqrt(len(ys))
        style = dict(lw=2.6, zorder=5) if est == "otb" else dict(lw=1.4, ls="--" if n == 16 else "-")
        ax.plot(grid, mu, label=f"{est} N={n} (lr {lrs[(est, n)]:g})", **style)
        ax.fill_between(grid, mu - se, mu + se, alpha=0.15)
    ax.set(xlabel="response tokens sampled", ylabel=f"success (trailing {WINDOW:,} tokens)",
           title=f"periodic copy n={HORIZON}: mean of {len(SEEDS)} seeds (band: ± 1 s.e.)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def fmt(x, spec=".3f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def report(out, lrs, pilot, configs, paired, seconds):
    lines = ["# Equal-token study: results", "",
             "Protocol: docs/equal_tokens_protocol.md (pre-registered). Command: "
             "`python benchmarks/equal_tokens.py`.", "",
             "## Learning rates chosen on the pilot seed", "",
             "| config | " + " | ".join(f"lr {lr:g}: primary" for lr in LR_GRID) + " | chosen |",
             "|---|" + "---|" * (len(LR_GRID) + 1)]
    for est, n in CONFIGS:
        cells = [fmt(next(p.get("primary") for p in pilot if p["config"] == f"{est}:{n}" and p["lr"] == lr))
                 for lr in LR_GRID]
        lines.append(f"| {est}:{n} | " + " | ".join(cells) + f" | {lrs[(est, n)]:g} |")
    lines += ["", "## Endpoints per configuration (mean ± s.e. over 6 seeds)", "",
              "| config | lr | primary: success, last quarter | AUC: mean success | seeds reaching "
              f"{TARGET_SUCCESS} | median tokens to {TARGET_SUCCESS} | full budget used |",
              "|---|---|---|---|---|---|---|"]
    for c in configs:
        lines.append(f"| {c['config']} | {c['lr']:g} | {fmt(c['primary'])} ± {fmt(c['primary_se'])} | "
                     f"{fmt(c['auc'])} ± {fmt(c['auc_se'])} | {c['reached_target']}/6 | "
                     f"{fmt(c['tokens_to_target_median'], 'd')} | {'yes' if c['all_reached_budget'] else 'no'} |")
    lines += ["", "## Paired differences, OTB N=4 minus comparator (95% interval, t with 5 df)", "",
              "| comparator | endpoint | mean difference | 95% interval | seeds where OTB is higher |",
              "|---|---|---|---|---|"]
    for p in paired:
        lines.append(f"| {p['comparator']} | {p['endpoint']} | {p['mean_diff']:+.3f} | "
                     f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] | {p['otb_better_seeds']}/6 |")
    lines += ["", "## Verdicts (primary endpoint, as pre-registered)", ""]
    lines += [f"- {v['comparator']}: {v['verdict']}" for v in verdicts(paired)]
    lines += ["", f"Budget {BUDGET:,} tokens per run; wall time of this invocation {seconds:.0f} s.", ""]
    (out / "summary.md").write_text("\n".join(lines))
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", default=str(ROOT / "runs" / "equal_tokens"), help="folder of the training runs")
    p.add_argument("--out", default=str(ROOT / "runs" / "equal_tokens"), help="folder for summary.md, "
                   "results.json and success_vs_tokens.png (benchmarks/results/equal_tokens to update the "
                   "committed results)")
    p.add_argument("--jobs", type=int, default=2, help="training runs at a time (one thread each)")
    p.add_argument("--analyse-only", action="store_true", help="no training: analyse the finished runs")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs} must be >= 1")
    for flag in ("runs", "out"):
        if Path(getattr(args, flag)).is_file():
            p.error(f"--{flag} {getattr(args, flag)} is a file, not a folder")
    return args


def main(argv=None):
    args = parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    runs.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log, t0 = runs / "train_output.log", time.time()
    if not args.analyse_only:
        print(f"pilot: {len(CONFIGS) * len(LR_GRID)} runs on seed {PILOT_SEED}", flush=True)
        run_all([(e, n, PILOT_SEED, lr) for e, n in CONFIGS for lr in LR_GRID], runs, args.jobs, log)
    lrs, pilot = choose_lrs(runs)
    print("chosen learning rates: " + ", ".join(f"{e}:{n} {lr:g}" for (e, n), lr in lrs.items()), flush=True)
    if not args.analyse_only:
        print(f"main: {len(CONFIGS) * len(SEEDS)} runs", flush=True)
        run_all([(e, n, s, lrs[(e, n)]) for s in SEEDS for e, n in CONFIGS], runs, args.jobs, log)
    per_run, configs, paired = analyse(runs, lrs)
    seconds = time.time() - t0
    text = report(out, lrs, pilot, configs, paired, seconds)
    curves = curves_of(runs, lrs)
    (out / "results.json").write_text(json.dumps(dict(
        protocol="docs/equal_tokens_protocol.md", budget=BUDGET, seeds=SEEDS, pilot_seed=PILOT_SEED,
        lr_grid=LR_GRID, chosen_lr={f"{e}:{n}": lr for (e, n), lr in lrs.items()}, pilot=pilot,
        per_run={f"{e}:{n}": {str(s): v for s, v in d.items()} for (e, n), d in per_run.items()},
        configs=configs, paired=paired, verdicts=verdicts(paired), seconds=seconds, curves=curves), indent=1))
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(curves, lrs, out / "success_vs_tokens.png"))
    print(text)
    print(f"wrote {out}/summary.md, results.json, success_vs_tokens.png")


if __name__ == "__main__":
    main()
