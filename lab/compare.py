"""Comparisons: every configuration from the same weights, then a table and a plot.

``python train.py`` without ``--estimator`` runs a comparison: each ``estimator:group_size`` of
``--compare`` is trained by train.py's loop from the same initial weights, on the same prompts and
sampler noise (both are functions of (seed, step) only), into ``<folder>/<estimator>-n<N>/``.
This file holds what happens around those runs:

- ``run_comparison``: the runs (a finished one, with its DONE marker, is kept on --resume; its
  checkpoint, only with ``--keep-weights``), then
  ``summary.md`` / ``summary.json`` (one row per run: success at the start and the end, tokens
  sampled until the 10-step mean success first reaches ``--target-success``, a column left out when
  no run reached it, gradient norms) and ``compare.png`` (success against tokens sampled and against
  steps, the gradient norm), which is also redrawn as each configuration finishes, so a long
  comparison can be watched. summary.md, and the screen, end with what one seed can say
  (``conclusion``): the first configuration's final success minus each other's with a 95% interval
  (paired by step over the last 10 steps; where a token budget ends the runs at different steps, over
  the last quarter of the budget, as the equal-token endpoint below), which intervals exclude 0, and
  that these intervals are about these runs, not the methods, whose answer over seeds is in
  docs/reproduction.md and docs/stability.md.
- With ``--seeds 0,1,2 --token-budget B`` (``run_seeds``), the equal-token comparison of
  docs/equal_tokens_protocol.md over paired seeds: every configuration on every seed
  (``<folder>/seed<s>/``), each run ending where its sampled response tokens reach B. Per run,
  the protocol's endpoints (``endpoints``; only steps whose cumulative tokens are <= B count):

      final   token-weighted success over the last quarter of the budget, steps in (0.75 B, B]
      auc     area under success against tokens, divided by B (tokens never sampled count 0)

  and, for every other configuration c, the paired difference over the k seeds

      d_s = endpoint(ref, s) - endpoint(c, s),   mean and 95% interval mean +- t(0.975, k - 1) sd / sqrt(k)

  where ref is the first configuration of ``--compare`` (``otb:4`` in the GPU preset). With 3
  seeds t = 4.30: only large differences are resolved, and the table says "no difference shown"
  otherwise. summary.md holds the tables, summary.json every endpoint of every run, compare.png
  success against tokens (mean of the seeds, trailing window of B / 10 tokens).

benchmarks/equal_tokens.py, the pre-registered study, computes its endpoints with the same functions.

- With ``--lr-pilot 1e-6,3e-6,1e-5,3e-5`` (``lr_pilot``; on in the GPU preset), the comparison is
  preceded by the pre-registered learning-rate pilot of docs/training.md: ``--lr-pilot-run``
  (group_mean:4) at each rate, one seed (``--lr-pilot-seed``) that the comparison does not use, to
  ``--lr-pilot-budget`` tokens, into ``<folder>/pilot/lr<rate>/``; the rate with the highest final
  success (the endpoint above, at the pilot's budget) is chosen, undefined values ranking last, and
  every configuration of the comparison then runs at it. Each rate's final success has its standard
  error (``final_se``), and a rate within ``NEAR_TIE`` standard errors of the difference from the
  best ties with it: among ties the smallest rate is chosen (Addendum 1 of the pilot's protocol,
  docs/training.md). ``pilot.md`` and ``pilot.json`` hold the table and the choice.
- ``POWER_PLAN``: the planning values of the GPU preset's seeds (docs/training.md, "How many seeds"),
  from the saved CPU study; ``stats.seeds_needed`` turns them into the number of paired seeds.

The statistics (lab/analysis/stats.py, on scipy and statsmodels, which bring pandas) are imported inside
the functions that compute one, not with this file: ``import train`` imports it, and a training step
computes no statistic, so a learner's first command does not wait the seconds those libraries take to
load (docs/cost.md).
"""
import json
import math
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from lab import machine
from lab import progress
from lab import options
from lab import runs
from lab.logbook import moving_average, summarize  # a run's curve and its row of the table


# ===== The learning-rate pilot: one configuration, one seed, a few rates; the rule picks one ================

def lr_pilot(cfg, folder, model, tok, device, command, source, train):
    """Run the pilot (a finished run, DONE, is kept on --resume); returns the chosen rate."""
    rates = options.pilot_rates(cfg)
    est, _, n = cfg.lr_pilot_run.partition(":")
    budget = cfg.lr_pilot_budget or max(1, cfg.token_budget // 4)
    sub = replace(cfg, estimator=est, group_size=int(n), compare=None, seeds=None, seed=cfg.lr_pilot_seed,
                  token_budget=budget, lr_pilot=None)
    if cfg.model == "tiny" and sub.seed != cfg.seed:  # the tiny model's warm-up depends on the seed
        model, tok, _ = options.load(sub, device)
    init = weights(model)
    rows = []
    for lr in tqdm(rates, desc=f"learning-rate pilot {cfg.lr_pilot_run}", disable=True if cfg.no_progress else None):
        history = run_one(replace(sub, lr=lr), folder / "pilot" / f"lr{lr:g}", model, init, tok, command,
                          source, train, cfg.keep_weights)
        e = endpoints(history, sub.steps, budget=budget, window=max(1, budget // 10), target=cfg.target_success)
        rows.append(dict(lr=lr, final=None if e is None else e["primary"], auc=None if e is None else e["auc"],
                         se=final_se(history, budget, cfg.prompts_per_step * int(n)), steps=len(history)))
    model.load_state_dict(init)
    chosen = choose_rate(rows)
    ties = tied_with_best(rows)
    table = ["| lr | final success ± s.e. | auc | steps | ties with the best |", "|---|---|---|---|---|"] + [
        f"| {r['lr']:g} | {fmt(r['final'])} ± {fmt(r['se'])} | {fmt(r['auc'])} | {r['steps']} | "
        f"{'yes' if r in ties else 'no'} |" for r in rows]
    (folder / "pilot.md").write_text(
        f"# Learning-rate pilot: {cfg.lr_pilot_run}, seed {sub.seed}, {budget} tokens per rate\n\n"
        + "\n".join(table) + f"\n\nchosen (the smallest rate within {NEAR_TIE:g} standard error of the difference "
        f"from the highest final success; undefined values rank last): **{chosen:g}**; every configuration of "
        "the comparison runs at it. s.e.: binomial, responses independent (final_se).\n")
    (folder / "pilot.json").write_text(json.dumps(dict(run=cfg.lr_pilot_run, seed=sub.seed, budget=budget,
                                                       rates=rows, chosen=chosen), indent=1))
    print((folder / "pilot.md").read_text(), flush=True)
    return chosen


NEAR_TIE = 1.0  # a rate ties with the best when their finals differ by at most this many standard errors

# Planning values of the GPU preset's paired seeds (docs/training.md, "How many seeds"): the CPU study's
# otb:4 - group_mean:16 primary difference over its 6 seeds (mean, and the larger between-seed SD of the
# two primary contrasts: this one's, 0.0627; otb:4 - group_mean:4's, 0.0438), two-sided 5% level, power 0.8
# (benchmarks/results/equal_tokens/results.json; tests/test_exact_power.py recomputes them)
POWER_PLAN = dict(effect=0.0935, sd=0.0627, alpha=0.05, power=0.8)


def final_se(h, budget, rows_per_step):
    """Standard error of the final success (the token-weighted mean of the step success rates s_j over
    the last quarter of the budget, weights w_j = d_j / sum d), each step's s_j a mean of rows_per_step
    independent 0/1 rewards: sqrt(sum_j w_j^2 s_j (1 - s_j) / rows_per_step). None without such steps."""
    last = [(d, s) for c, d, s in within_budget(h, budget) if c > 0.75 * budget]
    total = sum(d for d, _ in last)
    if not total:
        return None
    return math.sqrt(sum((d / total) ** 2 * s * (1 - s) / rows_per_step for d, s in last))


def defined(x):
    return x is not None and x == x  # neither None nor nan


def tied_with_best(rows):
    """The rows whose final success is within NEAR_TIE standard errors of the difference from the best
    (the best included); none when no final is defined."""
    ok = [r for r in rows if defined(r["final"])]
    if not ok:
        return []
    best = max(ok, key=lambda r: r["final"])
    se = lambda r: r.get("se") if defined(r.get("se")) else 0.0  # noqa: E731
    return [r for r in ok if best["final"] - r["final"] <= NEAR_TIE * math.hypot(se(best), se(r))]


def choose_rate(rows):
    """The protocol's rule with its Addendum 1: among the rates tied with the highest final success
    (``tied_with_best``), the smallest; a run without a final (None or nan) ranks last, and with none
    defined the smallest rate. Without standard errors only equal values tie (the original rule)."""
    ties = tied_with_best(rows)
    return min(r["lr"] for r in (ties or rows))


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


# ===== One seed: every configuration from the same weights ==================================================

def run_comparison(cfg, out, model, tok, command, source, train, bars=None):
    """Every configuration of cfg.compare, each by ``train`` (train.py's loop) from the same initial
    weights into ``out/<estimator>-n<N>``; a finished one (DONE) is kept on resume. Returns the rows.
    bars: each configuration's progress bar (``make_bars``; with --seeds, those of all the seeds)."""
    bars = bars or make_bars(cfg, out)
    init = weights(model)  # every run starts here
    histories = {}
    for est, n in runs.runs_of(cfg):
        sub = replace(cfg, estimator=est, group_size=n, compare=None)
        run_dir = out / runs.run_name(est, n, cfg.zero_tail)
        history = run_one(sub, run_dir, model, init, tok, command, source, train, cfg.keep_weights,
                          bar=bars[(cfg.seed, est, n)])
        histories[run_dir.name] = (sub, history)
        if len(histories) < len(runs.runs_of(cfg)):  # the plot so far, redrawn as each one finishes
            plot_runs(out / "compare.png", cfg, histories)
            tqdm.write(f"plot: {out / 'compare.png'} ({len(histories)} of {len(runs.runs_of(cfg))} "
                       "configurations so far)")
    return write_summary(out, cfg, histories)


def run_one(sub, run_dir, model, init, tok, command, source, train, keep_weights, bar=None):
    """One configuration ``sub`` in run_dir from the weights ``init``; returns its metrics. A finished
    run (DONE) is read back, a stopped one continues from its checkpoint; once finished, its checkpoint
    is deleted unless keep_weights (its DONE marker is all a resume needs)."""
    if (run_dir / "DONE").exists():
        return runs.read_jsonl(run_dir / "metrics.jsonl")
    resume = (run_dir / "checkpoint.pt").exists()
    if not resume:
        runs.write_config(run_dir, sub, command, source)
    model.load_state_dict(init)
    history = train(sub, run_dir, model, tok, resume=resume, keep_optimizer=False, bar=bar)
    if not keep_weights:
        (run_dir / "checkpoint.pt").unlink(missing_ok=True)
    return history


def make_bars(cfg, folder):
    """{(seed, estimator, N): its bar}: labelled "[k/K] estimator N=n", with the time left of the
    whole comparison (progress.TimeLeft: from the steps run so far)."""
    time_left = progress.TimeLeft(cfg, runs.steps_left(cfg, folder))
    return {(s, est, n): partial(progress.Bar, label=label, time_left=time_left)
            for label, s, est, n, _ in runs.configurations(cfg, folder)}


def write_summary(out, cfg, histories):
    """compare.png, summary.json and summary.md of one seed's runs; returns the table's rows."""
    plot_runs(out / "compare.png", cfg, histories)
    rows = [summarize(sub, h) for sub, h in histories.values()]
    (out / "summary.json").write_text(json.dumps(dict(config=runs.applied(cfg), runs=rows, **runs.versions(),
                                                      machine=machine.fingerprint(), provenance=machine.provenance()),
                                                 indent=1))  # machine and code: its numbers depend on both
    (out / "summary.md").write_text(summary_text(rows, {name: h for name, (_, h) in histories.items()},
                                                 cfg.target_success, cfg.token_budget))
    return rows


def rewrite_summary(folder):
    """summary.md of a saved comparison made again from its summary.json (the rows and the target) and
    each run's metrics.jsonl, by the code that wrote it (``summary_text``); summary.json, the figure
    and the runs are left as they are:
    python -c "from lab import compare; compare.rewrite_summary('benchmarks/results/default_run')"."""
    folder = Path(folder)
    saved = json.loads((folder / "summary.json").read_text())
    histories = {r["run"]: runs.read_jsonl(folder / r["run"] / "metrics.jsonl") for r in saved["runs"]}
    (folder / "summary.md").write_text(summary_text(saved["runs"], histories, saved["config"]["target_success"],
                                                    saved["config"].get("token_budget")))


def summary_text(rows, histories, target, budget=None):
    """summary.md of one seed's comparison: the table (``rows``, one per run; tokens_to_target only where
    some run reached ``target``), what its columns mean, and the conclusion (``conclusion``) from the
    runs' per-step successes (``histories``: {run name: its metrics rows}) and the token budget, if any."""
    cell = lambda x: "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))  # noqa: E731
    reached = any(r["tokens_to_target"] is not None for r in rows)
    cols = [c for c in rows[0] if c not in ("estimator", "group_size", "steps")  # run, tokens, ..., seconds
            and (c != "tokens_to_target" or reached)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    note = (f"tokens_to_target: response tokens sampled until the 10-step moving average of success first "
            f"reached {target} (-: not reached)." if reached else
            f"No run's 10-step moving average of success reached the target {target}, so the table has no "
            "tokens_to_target column.")
    return ("\n".join(lines) + f"\n\nsuccess: mean over the first / last {FINAL} steps. {note}\n\n"
            + " ".join(conclusion([r["run"] for r in rows], histories, budget=budget)) + "\n")


FINAL = 10  # final_success is the mean over the last FINAL steps; the conclusion pairs those steps


def final_difference(a, b, k=FINAL):
    """a's final success minus b's over their last k steps (final_success's window), for runs that end at
    the same step: paired by step (the same prompts at a step: both are functions of (seed, step)), the
    mean of the k differences and its 95% t interval, and the steps it rests on."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    d = [x["success"] - y["success"] for x, y in zip(a[-k:], b[-k:])]
    mean, lo, hi = stats.mean_interval(d)
    return dict(mean=mean, lo=lo, hi=hi, steps=len(d))


def budget_difference(a, b, budget):
    """a's success minus b's over the last quarter of the token budget B, for runs that the budget ends
    at different steps (N = 16 takes a quarter of N = 4's steps, so each run's own last 10 steps would
    cover about a third of B for one and a twelfth for the other): the equal-token protocol's endpoint
    (``endpoints``), success over the steps whose cumulative tokens lie in (0.75 B, B], each weighted by
    its tokens; the steps of two such runs see different prompts, so the interval is Welch's for two
    independent weighted means. The steps: the fewer of the two runs' steps in that quarter."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    last = [[(d, s) for c, d, s in within_budget(h, budget) if c > 0.75 * budget] for h in (a, b)]
    mean, lo, hi = stats.welch_interval([s for _, s in last[0]], [s for _, s in last[1]],
                                        wx=[d for d, _ in last[0]], wy=[d for d, _ in last[1]])
    return dict(mean=mean, lo=lo, hi=hi, steps=min(len(x) for x in last))


def conclusion(names, histories, k=FINAL, budget=None):
    """Two or three sentences: the first run's final success minus each other's, which of these
    differences have a 95% interval that excludes 0, and that such an interval is about these runs, not
    about the methods, with where the answer over seeds is. Runs that end at the same step are compared
    over their last k steps, paired by step (``final_difference``); where they end at different steps
    (a token budget) they are compared on equal shares of it, the last quarter (``budget_difference``;
    without a budget, B is the fewest tokens any run sampled). The interval treats the steps as
    independent draws: it holds the noise of sampling prompts and responses in these runs, not the
    spread between seeds (another seed's warm-up and prompts)."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    ref = names[0]
    if len(names) < 2:
        return [f"One configuration ({ref}): nothing to compare."]
    seeds_answer = ("docs/reproduction.md (equal sampled tokens) and docs/stability.md (collapse), over "
                    "paired seeds.")
    together = len({histories[n][-1]["step"] for n in names}) == 1
    B = None if together else budget or min(histories[n][-1]["tokens"] for n in names)
    d = {n: final_difference(histories[ref], histories[n], k) if together else
         budget_difference(histories[ref], histories[n], B) for n in names[1:]}
    if min(x["steps"] for x in d.values()) < 2:
        return [f"Success of {ref} minus each other run at their last step: "
                + "; ".join(f"{n} {d[n]['mean']:+.3f}" for n in d) + ".",
                "One step gives no interval; how the methods compare is answered in " + seeds_answer]
    shown = lambda n: f"{n} {d[n]['mean']:+.3f} [{d[n]['lo']:+.3f}, {d[n]['hi']:+.3f}]"  # noqa: E731
    resolved = [n for n in d if stats.verdict(d[n]["lo"], d[n]["hi"], 0.0) != "covers"]
    unresolved = [n for n in d if n not in resolved]
    if together:
        first = (f"Final success of {ref} minus each other run, paired by step over the last "
                 f"{min(x['steps'] for x in d.values())} steps (the same prompts at each step; mean and 95% t "
                 f"interval over the steps): " + "; ".join(shown(n) for n in d) + ".")
    else:  # a token budget ended the runs at different steps: their last steps saw other prompts
        first = (f"Success of {ref} minus each other run over the last quarter of the token budget B = {B:,} "
                 "(the steps whose cumulative sampled tokens lie in (0.75 B, B], each weighted by its tokens, "
                 "as in the equal-token protocol; the runs ended at different steps, so not paired: Welch's "
                 "95% interval): " + "; ".join(shown(n) for n in d) + ".")
    if resolved and unresolved:
        second = (f"In these runs the interval excludes 0 for {', '.join(resolved)} and contains 0 for "
                  f"{', '.join(unresolved)}.")
    elif resolved:
        second = "In these runs every interval excludes 0."
    else:
        second = "In these runs every interval contains 0."
    third = ("Each interval is about these runs, not about the methods: it holds only the noise of sampling "
             "prompts and responses within them, not the spread between seeds, so whether it excludes 0 does "
             "not say how the methods compare on another seed; that is answered in " + seeds_answer)
    return [first, second, third]


def title(cfg):
    """'tiny model, task reverse (horizon 8)': the model and the task as train.py's options name them."""
    task = options.make_task(cfg)
    name = next(k for k, v in options.TASKS.items() if type(task) is v)
    return f"{cfg.model} model, task {name} (horizon {task.horizon})"


def plot_runs(path, cfg, histories):
    """Success against tokens (log scale) and against steps, and the gradient norm, one line per run."""
    import matplotlib.pyplot as plt
    plt.switch_backend("Agg")  # files only
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for name, (_, h) in histories.items():
        smooth = moving_average([r["success"] for r in h])
        ax1.plot([r["tokens"] for r in h], smooth, label=name)
        ax2.plot([r["step"] for r in h], smooth, label=name)
        ax3.plot([r["step"] for r in h], [r["grad_norm"] for r in h], label=name, lw=1)
    ax1.set(xlabel="response tokens sampled (log scale)", ylabel="success rate (10-step moving average)",
            title="success against sampling cost", xscale="log")  # log: N = 4 and N = 16 both get room
    ax2.set(xlabel="step", ylabel="success rate (10-step moving average)", title="success against step")
    ax3.set(xlabel="step", ylabel="gradient norm before clipping (symlog)", title="gradient norm against step")
    ax3.set_yscale("symlog", linthresh=1e-3)  # log-like above 1e-3, linear through 0 (a zero norm is drawn)
    ax1.legend()
    fig.suptitle(f"{title(cfg)}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ===== Endpoints at a token budget B (docs/equal_tokens_protocol.md, Addendum 1) ============================

def within_budget(h, budget):
    """Steps whose cumulative tokens are <= budget, as (cumulative tokens, the step's tokens, success)."""
    out, prev = [], 0
    for r in h:
        if r["tokens"] > budget:
            break
        out.append((r["tokens"], r["tokens"] - prev, r["success"]))
        prev = r["tokens"]
    return out


def curve(h, budget, window):
    """Trailing-window (``window`` tokens) success against tokens, within the budget: (xs, ys)."""
    steps = within_budget(h, budget)
    xs, ys = [], []
    for i, (c, _, _) in enumerate(steps):
        inside = [(d, s) for c2, d, s in steps[:i + 1] if c2 > c - window]
        xs.append(c)
        ys.append(sum(d * s for d, s in inside) / sum(d for d, _ in inside))
    return xs, ys


def endpoints(h, steps_given=None, *, budget, window, target):
    """The endpoints of one run from its history ``h`` (dicts with tokens, success), counting its steps
    within the budget B; ``steps_given``: the steps it was given (None: all of h). None if no step fits."""
    steps = within_budget(h, budget)
    if not steps:
        return None
    steps_given = len(h) if steps_given is None else steps_given
    used = steps[-1][0]
    last = [(d, s) for c, d, s in steps if c > 0.75 * budget]
    primary = sum(d * s for d, s in last) / sum(d for d, _ in last) if last else float("nan")  # final
    auc = sum(d * s for _, d, s in steps) / budget  # area over B (tokens not sampled count 0)
    to_target = next((c for c, y in zip(*curve(h, budget, window))
                      if c >= window and y >= target), None)  # a full trailing window only
    return dict(primary=primary, auc=auc, tokens_to_target=to_target,
                tokens_to_target_censored=budget if to_target is None else to_target, tokens_used=used,
                stopped_short=len(steps) >= steps_given and used < budget, steps=len(steps))


def paired_diff(a, b, seeds, endpoint, comparator):
    """d_s = a[s][endpoint] - b[s][endpoint] over the seeds: mean, 95% t interval (k - 1 degrees of
    freedom) and how many seeds put a higher."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    d = [a[s][endpoint] - b[s][endpoint] for s in seeds]
    mu, lo, hi = stats.mean_interval(d)
    return dict(comparator=comparator, endpoint=endpoint, mean_diff=mu, ci_low=lo, ci_high=hi, per_seed=d,
                higher_seeds=sum(x > 0 for x in d))


def verdict(p, who):
    """What a paired difference's interval shows (stats.verdict against 0, in words); nan (fewer than 2
    seeds) shows nothing."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    return {"above": f"{who} is better (interval above 0)", "below": f"{who} is worse (interval below 0)",
            "covers": "no difference shown (interval contains 0)"}[stats.verdict(p["ci_low"], p["ci_high"], 0.0)]


# ===== Paired seeds at a token budget (train.py --seeds) ====================================================

def run_seeds(cfg, folder, model, tok, device, command, source, train):
    """Every configuration on every seed (a finished one is kept on --resume), then the analysis."""
    seeds = runs.seed_list(cfg)
    init = weights(model)
    bars = make_bars(cfg, folder)  # "[k/K] seed s estimator N=n" over all the seeds
    for s in seeds:
        sub = replace(cfg, seed=s, seeds=None)
        if cfg.model == "tiny" and s != cfg.seed:  # the tiny model's warm-up depends on the seed
            model, tok, _ = options.load(sub, device)
        else:  # a pretrained model's weights do not: every seed starts from them
            model.load_state_dict(init)
        run_comparison(sub, folder / f"seed{s}", model, tok, command, source, train, bars)
    return analyse_seeds(cfg, folder)


def analyse_seeds(cfg, folder):
    """Endpoints per run, the paired table and the figure, from the runs' metrics.jsonl files."""
    from lab.analysis import stats  # scipy and statsmodels: loaded where a statistic is computed
    seeds, configs, B = runs.seed_list(cfg), runs.runs_of(cfg), cfg.token_budget
    window = max(1, B // 10)
    names = [f"{est}:{n}" for est, n in configs]
    histories = {f"{est}:{n}": {s: runs.read_jsonl(folder / f"seed{s}" / runs.run_name(est, n, cfg.zero_tail)
                                                       / "metrics.jsonl")
                                for s in seeds} for est, n in configs}
    per_run = {c: {s: endpoints(h, cfg.steps, budget=B, window=window, target=cfg.target_success)  # final, auc, ...
                   for s, h in by_seed.items()} for c, by_seed in histories.items()}
    empty = [f"{c} seed {s}" for c, by_seed in per_run.items() for s, e in by_seed.items() if e is None]
    if empty:  # its first step alone sampled more than B
        raise SystemExit(f"train.py: --token-budget {B} is smaller than one step's tokens of {empty[0]}; "
                         "no step lies within the budget (raise --token-budget)")
    rows = [dict(config=c, stopped_short=[s for s in seeds if per_run[c][s]["stopped_short"]],
                 **{k: stats.mean_se([per_run[c][s][k] for s in seeds]) for k in ("primary", "auc")})
            for c in names]  # (mean, s.e.) over the seeds
    pairs = [paired_diff(per_run[names[0]], per_run[c], seeds, k, c) for c in names[1:] for k in ("primary", "auc")]
    for p in pairs:
        p["verdict"] = verdict(p, names[0])
    (folder / "summary.md").write_text(seeds_table(cfg, names[0], rows, pairs, len(seeds)))
    (folder / "summary.json").write_text(json.dumps(dict(
        config=runs.applied(cfg), **runs.versions(), machine=machine.fingerprint(),
        provenance=machine.provenance(), budget=B, seeds=seeds,
        per_run=per_run, configs=rows, paired=pairs), indent=1))
    plot_seeds(histories, B, folder / "compare.png", f"{title(cfg)}, {len(seeds)} seeds")
    return rows


def seeds_table(cfg, ref, rows, pairs, k):
    name = {"primary": "final success (last quarter of B)", "auc": "AUC (success over B)"}
    lines = [f"Equal-token comparison: budget B = {cfg.token_budget:,} sampled response tokens per run, "
             f"{k} paired seeds ({cfg.seeds}), protocol of docs/equal_tokens_protocol.md.", "",
             "| config | final success (mean ± s.e.) | AUC (mean ± s.e.) | seeds that ran out of steps "
             "before B |",
             "|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['primary'][0]:.3f} ± {r['primary'][1]:.3f} | {r['auc'][0]:.3f} ± "
              f"{r['auc'][1]:.3f} | {', '.join(map(str, r['stopped_short'])) or 'none'} |" for r in rows]
    lines += ["", f"Paired differences, {ref} minus comparator (95% t interval, {k - 1} degrees of freedom):",
              "",
              "| comparator | endpoint | mean difference | 95% interval | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {p['comparator']} | {name[p['endpoint']]} | {p['mean_diff']:+.3f} | "
              f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] | {p['verdict']} |" for p in pairs]
    return "\n".join(lines) + "\n"


def plot_seeds(histories, budget, path, title):
    """Success (trailing window of budget / 10 tokens) against tokens, mean of the seeds per config."""
    import matplotlib.pyplot as plt
    import numpy as np
    plt.switch_backend("Agg")  # files only
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    grid = np.linspace(0, budget, 60)
    for c, by_seed in histories.items():
        curves = [curve(h, budget, max(1, budget // 10)) for h in by_seed.values()]
        ys = np.array([np.interp(grid, x, y, left=np.nan, right=np.nan)
                       for x, y in curves if x])  # (seeds, 60)
        if len(ys):  # nan where a seed has no step yet (or ran out of steps): matplotlib leaves a gap
            ax.plot(grid, ys.mean(0), label=c, lw=2.4 if c.startswith("otb") else 1.4)
    ax.set(xlabel="response tokens sampled", ylabel=f"success (trailing {max(1, budget // 10):,} tokens)",
           title=f"{title}: mean of the seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(cfg, model, tok, folder, command, source, train):
    """train.py without --estimator: the pilot if asked, every configuration (on every seed), the table.
    ``train`` is train.py's loop. Returns the table's rows."""
    t0 = time.time()
    device = next(model.parameters()).device
    with runs.ctrl_c_exits(folder, cfg.checkpoint_minutes):  # says how to resume; exit status 130
        if cfg.lr_pilot:  # the pre-registered pilot chooses the rate of every configuration
            cfg = replace(cfg, lr=lr_pilot(cfg, folder, model, tok, device, command, source, train), lr_pilot=None)
        if cfg.seeds:  # every configuration on every seed, then the paired table
            rows = run_seeds(cfg, folder, model, tok, device, command, source, train)
        else:
            rows = run_comparison(cfg, folder, model, tok, command, source, train)
    if cfg.results_dir:
        runs.copy_results(folder, Path(cfg.results_dir))
    print(f"comparison done in {time.time() - t0:.0f} s\nplot: {folder / 'compare.png'}\n"
          f"table: {folder / 'summary.md'} (and summary.json)\n")
    print((folder / "summary.md").read_text(), end="")  # the table, then what it shows: the screen ends there
    return rows


def weights(model):
    """A copy of the model's weights: its state_dict's tensors, detached and cloned."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
