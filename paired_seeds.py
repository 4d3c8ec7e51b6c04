"""train.py --seeds: the equal-token comparison of docs/equal_tokens_protocol.md, over paired seeds.

``python train.py --preset gpu`` runs it; any comparison can (``--seeds 0,1,2 --token-budget B``).
For every seed s, train.py's ``run_comparison`` runs each configuration of ``--compare`` from the
same initial weights, on the same prompt stream and sampler noise, into ``<folder>/seed<s>/``; each
run ends at the step where its sampled response tokens reach the budget B (``--token-budget``).
Then, per run, the protocol's endpoints, computed by ``benchmarks/equal_tokens.endpoints`` with
this B (only the steps whose cumulative tokens are <= B count):

    final   token-weighted success over the last quarter of the budget, steps in (0.75 B, B]
    auc     area under success against tokens, divided by B (tokens never sampled count 0)

and, for every other configuration c, the paired difference over the k seeds

    d_s = endpoint(ref, s) - endpoint(c, s),   mean and 95% interval mean +- t(0.975, k - 1) sd / sqrt(k)

where ref is the first configuration of ``--compare`` (``otb:4`` in the preset). With 3 seeds
t = 4.30: only large differences are resolved, and the table says "no difference shown" otherwise.
Written into the comparison folder (so ``--results-dir`` copies them): summary.md (the tables),
summary.json (every endpoint of every run) and compare.png (success against tokens, mean of the
seeds, trailing window B / 10 tokens).
"""
import json
from dataclasses import asdict, replace

from tqdm.auto import tqdm

import stats
import train_cli
from benchmarks import equal_tokens  # the protocol's endpoint functions


def run(cfg, folder, model, tok, device, command, source, run_comparison):
    """Every configuration on every seed (a finished one is kept on --resume), then the analysis."""
    seeds = train_cli.seed_list(cfg)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for s in tqdm(seeds, desc=f"seeds {cfg.seeds}"):
        sub = replace(cfg, seed=s, seeds=None)
        if cfg.model == "tiny" and s != cfg.seed:  # the tiny model's warm-up depends on the seed
            model, tok, _ = train_cli.load(sub, device)
        else:  # a pretrained model's weights do not: every seed starts from them
            model.load_state_dict(init)
        run_comparison(sub, folder / f"seed{s}", model, tok, command, source)
    return analyse(cfg, folder)


def analyse(cfg, folder):
    """Endpoints per run, the paired table and the figure, from the runs' metrics.jsonl files."""
    seeds, configs, B = train_cli.seed_list(cfg), train_cli.runs_of(cfg), cfg.token_budget
    names = [f"{est}:{n}" for est, n in configs]
    histories = {f"{est}:{n}": {s: read(folder / f"seed{s}" / f"{est}-n{n}" / "metrics.jsonl")
                                for s in seeds} for est, n in configs}
    per_run = {c: {s: equal_tokens.endpoints(h, cfg.steps, budget=B, window=max(1, B // 10),
                                             target=cfg.target_success)  # primary (final), auc, ...
                   for s, h in by_seed.items()} for c, by_seed in histories.items()}
    empty = [f"{c} seed {s}" for c, by_seed in per_run.items() for s, e in by_seed.items() if e is None]
    if empty:  # its first step alone sampled more than B
        raise SystemExit(f"train.py: --token-budget {B} is smaller than one step's tokens of {empty[0]}; "
                         "no step lies within the budget (raise --token-budget)")
    rows = [dict(config=c, stopped_short=[s for s in seeds if per_run[c][s]["stopped_short"]],
                 **{k: stats.mean_se([per_run[c][s][k] for s in seeds]) for k in ("primary", "auc")})
            for c in names]  # (mean, s.e.) over the seeds
    pairs = [paired_diff(per_run[names[0]], per_run[c], seeds, k, c)
             for c in names[1:] for k in ("primary", "auc")]
    text = table(cfg, names[0], rows, pairs, len(seeds))
    (folder / "summary.md").write_text(text)
    (folder / "summary.json").write_text(json.dumps(dict(
        config=asdict(cfg), budget=B, seeds=seeds, per_run=per_run, configs=rows, paired=pairs), indent=1))
    task = type(train_cli.make_task(cfg)).__name__
    plot(histories, B, folder / "compare.png", f"{cfg.model} on {task}, {len(seeds)} seeds")
    return rows


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def paired_diff(a, b, seeds, endpoint, comparator):
    """d_s = a[s] - b[s] over the seeds: mean, 95% t interval and a verdict."""
    d = [a[s][endpoint] - b[s][endpoint] for s in seeds]
    mu, lo, hi = stats.mean_interval(d)
    verdict = ("ref better (interval above 0)" if lo > 0 else "ref worse (interval below 0)" if hi < 0
               else "no difference shown")  # nan (fewer than 2 seeds) compares False: not shown
    return dict(comparator=comparator, endpoint=endpoint, per_seed=d, mean_diff=mu, ci_low=lo, ci_high=hi,
                verdict=verdict)


def table(cfg, ref, rows, pairs, k):
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
              f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] | {p['verdict'].replace('ref', ref)} |"
              for p in pairs]
    return "\n".join(lines) + "\n"


def plot(histories, budget, path, title):
    """Success (trailing window of budget / 10 tokens) against tokens, mean of the seeds per config."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    grid = np.linspace(0, budget, 60)
    for c, by_seed in histories.items():
        curves = [equal_tokens.curve(h, budget, max(1, budget // 10)) for h in by_seed.values()]
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
