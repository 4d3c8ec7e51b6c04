"""Does the length-triggered learning-rate schedule keep an unstable run stable? (docs/lr_schedule.md)

Runs train.py on {constant, length} schedule x {group_mean, otb} x seeds in a setting chosen to be
unstable (longer strings, a bfloat16 rollout copy, a high learning rate) through benchmarks/grid.py
(logs in <out>/<run>.log, one warm-up per seed in <out>/_cache, finished runs kept). Writes
lr_schedule.png (six metrics per step, seed mean and min..max band) and summary.md/json, one row
per run, by definitions fixed before the real run:

* surge step: lr_schedule.py's rule applied to the logged lengths of every run, the first step
  i > W with L_i > r mean(L_1..L_W) (under a constant LR, when the schedule would have fired);
* collapsed: success over the last k = 10 steps below 0.5 x the first k, or finished fraction
  (rows that emitted EOS) below 0.5; collapse step: the first step whose trailing k-step success
  mean is below 0.5 x the first k ("length rose before collapse": surge step < collapse step).

Each run records the code it ran as it starts (provenance.json); the grid stops at the first run of
other code than it started from (benchmarks/grid.py; --allow-dirty goes on), and summary.md/json say
which runs ran which code (``runs_code``).

    OMP_NUM_THREADS=1 python benchmarks/lr_schedule_experiment.py   # the real grid: 24 runs, 10-30 min, 2 cores
    python benchmarks/lr_schedule_experiment.py --aggregate-only    # re-plot finished runs
    python benchmarks/lr_schedule_experiment.py --quick             # smoke run into runs/lr_schedule_quick
"""
import itertools
import json
import math
import shlex
import sys
import time
from pathlib import Path
from statistics import fmean as mean, stdev

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.analysis import stats  # noqa: E402
from lab.runs import read_jsonl  # noqa: E402
import otb  # noqa: E402
from lab.lr_schedule import SCHEDULES, surge_step  # noqa: E402  (the rule train.py runs: first i > W with L_i > r L0)
from benchmarks import cli, grid  # noqa: E402
from lab import machine  # noqa: E402
from benchmarks.cli import at_least, choice_list, int_list, parser, positive_float  # noqa: E402

COLLAPSE_RATIO, MIN_FINISHED = 0.5, 0.5  # collapsed: final success < 0.5 x initial, or finished < 0.5
PANELS = [  # (metric key, y label, log scale, floor: smaller values are drawn at the floor)
    ("response_len", "mean response length (tokens)", False, None),
    ("lr", "learning rate used", True, None),
    ("mismatch_mean_abs", "mismatch mean |log pi_train - log pi_rollout|", True, None),
    ("grad_norm", "gradient norm (before clipping; 0 drawn at 1e-3)", True, 1e-3),
    ("success", "success rate", False, None),
    ("finished", "finished fraction (emitted EOS)", False, None),
]


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--seeds", type=int_list(0), default="0,1,2,3,4,5", help="comma-separated seeds (model init, prompts, sampler)")
    p.add_argument("--steps", type=at_least(1), default=50, help="training steps per run")
    p.add_argument("--horizon", type=at_least(1), default=8, help="max string length of the reversal task")
    p.add_argument("--max-new-tokens", type=at_least(1), default=40,
                   help="response length limit; above 2 * horizon + 2 so that a length surge has room")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="initial AdamW learning rate eta_0")
    p.add_argument("--rollout-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the sampling copy of the model (training stays float32)")
    p.add_argument("--estimators", type=choice_list(list(otb.ESTIMATORS)), default="group_mean,otb",
                   help="advantage estimators to compare")
    p.add_argument("--schedules", type=choice_list(SCHEDULES), default="constant,length", help="LR schedules")
    p.add_argument("--lr-warmup-window", type=int, default=10, help="W: steps whose mean length is L0")
    p.add_argument("--lr-surge-ratio", type=float, default=1.5, help="r: a surge is L_i > r * L0")
    p.add_argument("--lr-decay-factor", type=float, default=0.5, help="d: LR multiplier per decay")
    p.add_argument("--lr-decay-period-factor", type=float, default=1.8, help="c: decay period = c * s")
    p.add_argument("--lr-floor", type=float, default=0.1, help="f: the LR never goes below f * eta_0")
    p.add_argument("--window", type=at_least(1), default=10, help="k: steps averaged for initial/final success")
    p.add_argument("--train-args", default="", help="extra arguments passed to every train.py run")
    p.add_argument("--jobs", type=at_least(1), default=2, help="train.py processes in parallel")
    p.add_argument("--out", default=None,
                   help="folder of the run folders (and warm-up cache); default runs/lr_schedule (--quick: "
                        "runs/lr_schedule_quick)")
    p.add_argument("--results", default=None,
                   help="where plot and summary go; default benchmarks/results/lr_schedule (--quick: "
                        "runs/lr_schedule_quick/results)")
    p.add_argument("--aggregate-only", action="store_true", help="do not train; aggregate existing runs")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 seed, 6 steps, a 1-layer model without warm-up, W = 2")
    cli.allow_dirty_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.horizon, args.max_new_tokens, args.lr_warmup_window = [0], 6, 4, 12, 2
        args.window = 2
        args.train_args = ("--tiny-hidden 32 --tiny-layers 1 --warmup-max-steps 0 --prompts-per-step 2 "
                           "--group-size 2 " + args.train_args)
    quick = "runs/lr_schedule_quick"  # a smoke run never overwrites the real results
    args.out = args.out or (quick if args.quick else "runs/lr_schedule")
    args.results = args.results or (quick + "/results" if args.quick else "benchmarks/results/lr_schedule")
    return args


def configs(args):
    """The grid: list of (config name, schedule, estimator)."""
    return [(f"{s}/{e}", s, e) for s in args.schedules for e in args.estimators]


def run_name(config, seed):
    return config.replace("/", "-") + f"-seed{seed}"


SHARED = ["steps", "horizon", "max_new_tokens", "lr", "rollout_dtype", "lr_warmup_window", "lr_surge_ratio",
          "lr_decay_factor", "lr_decay_period_factor", "lr_floor", "out"]  # train.py options every run shares


def train_command(args, schedule, estimator, seed):
    """The train.py command line of one run (everything but the schedule and estimator is shared)."""
    cmd = [sys.executable, "train.py", "--estimator", estimator, "--lr-schedule", schedule,
           "--seed", str(seed)]
    cmd += [x for k in SHARED for x in ("--" + k.replace("_", "-"), str(getattr(args, k)))]
    cmd += ["--name", run_name(f"{schedule}/{estimator}", seed), "--log-every", "10"]
    return cmd + shlex.split(args.train_args)


# ---- Aggregation: pure functions of the per-step metrics (tested on synthetic histories)

def first_lr_drop(lrs):
    """Step after which the logged LR first falls below the initial one (lr of step i + 1 < lr_1)."""
    return next((i for i in range(1, len(lrs)) if lrs[i] < lrs[0] * (1 - 1e-9)), None)


def collapse(history, k, ratio, min_finished):
    """(collapsed, collapse step) by the criterion fixed in the module docstring."""
    success = [r["success"] for r in history]
    initial, final = mean(success[:k]), mean(success[-k:])
    finished = mean([r["finished"] for r in history[-k:]])
    step = next((i for i in range(k, len(success) + 1)  # trailing k-step means from step k on
                 if mean(success[i - k:i]) < ratio * initial), None)
    return final < ratio * initial or finished < min_finished, step


def correlation(xs, ys):
    """Pearson correlation over steps (stats.pearson); None for a constant series."""
    r = stats.pearson(xs, ys)
    return None if math.isnan(r) else r


def summarize_run(history, args):
    """One row per run (seed)."""
    k, m = args.window, {key: [r[key] for r in history] for key in history[0]}  # m[metric]: per step
    collapsed, c_step = collapse(history, k, COLLAPSE_RATIO, MIN_FINISHED)
    s = surge_step(m["response_len"], args.lr_warmup_window, args.lr_surge_ratio)
    return dict(
        steps=len(history), initial_success=mean(m["success"][:k]), final_success=mean(m["success"][-k:]),
        final_finished=mean(m["finished"][-k:]), max_grad_norm=max(m["grad_norm"]),
        max_len=max(m["response_len"]), final_lr=m["lr"][-1], surge_step=s,
        lr_drop_step=first_lr_drop(m["lr"]), collapsed=collapsed, collapse_step=c_step,
        len_before_collapse=None if c_step is None else (s is not None and s < c_step),
        max_mismatch=max(m["mismatch_mean_abs"]),
        corr_mismatch_gradnorm=correlation(m["mismatch_mean_abs"], m["grad_norm"]))


def band(histories, key):
    """Per step mean, min and max over seeds (runs cut to the shortest)."""
    n = min(len(h) for h in histories)
    cols = [[h[i][key] for h in histories] for i in range(n)]
    return [mean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def summarize(histories, args):
    """histories: {config: {seed: [metrics rows]}} -> {config: dict(runs={seed: row}, aggregate)}."""
    out = {}
    for config, by_seed in histories.items():
        runs = {seed: summarize_run(h, args) for seed, h in sorted(by_seed.items())}
        finals = [r["final_success"] for r in runs.values()]
        sd = stdev(finals) if len(finals) > 1 else 0.0
        corrs = [r["corr_mismatch_gradnorm"] for r in runs.values() if r["corr_mismatch_gradnorm"] is not None]
        out[config] = dict(runs=runs, final_success_mean=mean(finals), final_success_sd=sd,
                           collapsed=sum(r["collapsed"] for r in runs.values()), n_seeds=len(runs),
                           surged=sum(r["surge_step"] is not None for r in runs.values()),
                           max_grad_norm=max(r["max_grad_norm"] for r in runs.values()),
                           max_len=max(r["max_len"] for r in runs.values()),
                           corr_mismatch_gradnorm_mean=mean(corrs) if corrs else None)
    return out


def cell(x):
    """A table cell: none, yes / no, or the number to 3 significant digits."""
    if x is None:
        return "none"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def markdown(summary, args, header=""):
    cols = ["initial_success", "final_success", "final_finished", "max_grad_norm", "max_len",
            "final_lr", "surge_step", "collapsed", "collapse_step", "corr_mismatch_gradnorm"]
    lines = [header, "", "| config | seed | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 2)]
    lines += [f"| {config} | {seed} | " + " | ".join(cell(r[c]) for c in cols) + " |"
              for config, agg in summary.items() for seed, r in agg["runs"].items()]
    lines += ["", "| config | final success (mean ± sd over seeds) | collapsed | surged | max grad norm "
              "| max length | mean corr(mismatch, grad norm) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {config} | {a['final_success_mean']:.3f} ± {a['final_success_sd']:.3f} | "
              f"{a['collapsed']}/{a['n_seeds']} | {a['surged']}/{a['n_seeds']} | "
              f"{a['max_grad_norm']:.3g} | {a['max_len']:.3g} | {cell(a['corr_mismatch_gradnorm_mean'])} |"
              for config, a in summary.items()]
    lines += ["", f"success / finished: means over the first / last {args.window} steps. surge_step: first step "
              f"i > {args.lr_warmup_window} with mean length > {args.lr_surge_ratio} x the mean of steps "
              f"1..{args.lr_warmup_window} (computed for every run; only the length schedule acts on it). "
              f"collapsed: final success < {COLLAPSE_RATIO} x initial, or final finished fraction < "
              f"{MIN_FINISHED}; collapse_step: first step whose trailing {args.window}-step success "
              f"mean is below {COLLAPSE_RATIO} x initial. corr: Pearson correlation over steps of "
              f"mismatch_mean_abs and grad_norm within a run."]
    return "\n".join(lines) + "\n"


def plot(histories, args, path, title=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    colors = dict(zip(histories, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (key, label, log, floor) in zip(axes.flat, PANELS):
        for config, by_seed in histories.items():
            runs = list(by_seed.values())
            mid, lo, hi = band(runs, key)
            if floor is not None:  # a zero gradient (every group's rewards equal) on a log axis
                mid, lo, hi = ([max(v, floor) for v in vs] for vs in (mid, lo, hi))
            steps = list(range(1, len(mid) + 1))
            style = "-" if config.startswith("length") else "--"  # dashed under solid: equal runs show as one
            ax.plot(steps, mid, style, color=colors[config], label=config,
                    lw=2.5 if config.startswith("constant") else 1.2)
            ax.fill_between(steps, lo, hi, color=colors[config], alpha=0.15, lw=0)
        ax.set(ylabel=label, yscale="log" if log else "linear")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def load_histories(args):
    """({config: {seed: metrics rows}} of every run that has logged a step, {run name: the code it recorded
    as it started (provenance.json), None where it recorded none})."""
    histories, code = {}, {}
    for (config, _, _), seed in itertools.product(configs(args), args.seeds):
        folder = ROOT / args.out / run_name(config, seed)
        rows = read_jsonl(folder / "metrics.jsonl")
        if rows:
            histories.setdefault(config, {})[seed] = rows
            code[folder.name] = machine.recorded_code(folder)
    return histories, code


def main(argv=None):
    args = parse_args(argv)
    command = cli.command("lr_schedule_experiment.py", argv)
    info = machine.info()
    print(command, "\nmachine:", json.dumps(info), flush=True)
    one_run = shlex.join(train_command(args, "length", "otb", args.seeds[0])[1:])
    print("one run:", one_run, flush=True)
    t0 = time.time()
    if not args.aggregate_only:  # at most --jobs runs at a time; a run with DONE is not run again
        grid.run([(train_command(args, s, e, seed), ROOT / args.out / run_name(c, seed), seed)
                  for c, s, e in configs(args) for seed in args.seeds], args.jobs,
                 cli.study_code(args.allow_dirty))  # every run is held to the code it started from
    wall = time.time() - t0
    histories, runs_code = load_histories(args)
    if not histories:
        sys.exit("no metrics found under " + args.out)
    summary = summarize(histories, args)
    results = ROOT / args.results
    title = (f"reverse, horizon {args.horizon}, rollout {args.rollout_dtype}, lr {args.lr}, "
             f"{len(args.seeds)} seeds (band: min..max); length rule W={args.lr_warmup_window} "
             f"r={args.lr_surge_ratio} d={args.lr_decay_factor} c={args.lr_decay_period_factor} f={args.lr_floor}")
    run = dict(command=command, machine=info, wall_seconds=round(wall))  # the run that trained
    if args.aggregate_only and (results / "summary.json").exists():  # re-plotting keeps that record
        run = json.loads((results / "summary.json").read_text()).get("run", run)
    header = f"`{run['command']}` ({run['wall_seconds']} s wall)\n\n{title}"
    record = dict(run=run, aggregated_by=command, args=vars(args), train_command=one_run, configs=summary,
                  runs_code=runs_code)
    code_line = f"\nCode, as each run recorded it when it started (provenance.json): {grid.which_code(runs_code)}.\n"
    cli.write_results(results, "summary", record, markdown(summary, args, header) + code_line)
    plot(histories, args, results / "lr_schedule.png", title)
    print(f"wall {wall:.0f} s; plot {results / 'lr_schedule.png'}")
    return summary


if __name__ == "__main__":
    main()
