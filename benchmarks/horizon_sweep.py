"""Does a per-token baseline matter more as responses get longer? A static sweep over the horizon.

At fixed weights (a warmed-up checkpoint of the tiny model on the periodic-copy task, one per
seed and horizon n), every estimator sees the same sampled responses, and its batch gradient
for one group of N responses,

    g = (1 / N) sum_i sum_t A_t^i grad_theta log pi(y_t^i)                          (1)

is computed exactly by backward passes (benchmarks/grad_variance.py: one backward per response
for sequence-level advantages, one per group for OTB's token-level ones). Per prompt,
M pooled responses are split into M / N disjoint groups (i.i.d. samples of (1)); quality is the
scale-free normalised variance nvar = tr Var(g) / ||E g||^2 (scale_free.py), with alpha and the
cosine against a separate reference pool, and the headline is the gain over the group mean,
nvar(group_mean) / nvar(estimator). Prompts are the bootstrap's unit, seeds are combined on the
log scale (stats.py; how and why: docs/variance.md); the per-prompt sufficient statistics are
saved in stats.npz, so --from-saved re-bootstraps without a model:

    python benchmarks/horizon_sweep.py                               # n = 16, 64, 128; 3 seeds
    python benchmarks/horizon_sweep.py --horizons 16 --seeds 0 --prompts 4 --pool 16   # smoke run
    python benchmarks/horizon_sweep.py --from-saved benchmarks/results/horizon_sweep --out /tmp/re
    python benchmarks/horizon_sweep.py --horizons 16,64,128,256 --resume --out DIR   # add n = 256 to DIR

With tool use (``--task calculator``, tasks.CalculatorTask) the horizon is k, the number of
numbers to add with k - 1 tool calls; the responses hold the tool's output as holes (mask 0), the
sampler forces it in, and every gradient sees it as context. There the sweep compares
position-aligned otb with action-aligned otb_tir (docs/tool_use.md):

    python benchmarks/horizon_sweep.py --task calculator --estimators reinforce,group_mean,rloo,otb,otb_tir

Writes runs/horizon_sweep/ by default; ``--out benchmarks/results/horizon_sweep`` updates the
committed results (results.json, stats.npz, table.md, gain_vs_horizon.png).
"""
import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import rollout  # noqa: E402
import scale_free  # noqa: E402
import stats  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
import train_cli  # noqa: E402
from benchmarks.common import (draw_pool, group_gradients, group_ids_of,  # noqa: E402
                               per_response_scores, reference_gradient, subset)
from benchmarks import cli  # noqa: E402
from benchmarks.machine import machine  # noqa: E402


def parse_args(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("--task", default="periodic", choices=("periodic", "calculator", "factors"),
                   help="periodic: n = answer length; calculator and factors (its tool's replies vary in length): "
                   "n = k, numbers added with k - 1 tool calls")
    p.add_argument("--horizons", type=cli.int_list(1), default=None,
                   help="the task's horizons n (periodic: 16,64,128; calculator, factors: 2,4,8)")
    p.add_argument("--estimators", type=cli.choice_list(list(otb.ESTIMATORS)),
                   default=",".join(otb.ESTIMATORS), help="reinforce and group_mean are always needed")
    p.add_argument("--seeds", type=cli.int_list(0), default="0,1,2", help="a warmed-up model per (seed, n)")
    p.add_argument("--group-sizes", type=cli.int_list(1), default="4,16",
                   help="N values; each must divide --pool at least twice")
    p.add_argument("--prompts", type=cli.at_least(2), default=48,
                   help="prompts per checkpoint (the bootstrap's units)")
    p.add_argument("--pool", type=int, default=32, help="M, responses per prompt split into groups")
    p.add_argument("--ref-pool", type=cli.multiple_of(4, 8), default=32, help="responses per prompt of the "
                   "separate reference pool (RLOO in 4 sub-pools)")
    p.add_argument("--warmup-target", type=float, default=0.25, help="warm-up stops at this sampled success")
    p.add_argument("--cache", default=str(ROOT / "runs"), help="folder of train.py's warm-up cache")
    p.add_argument("--replicates", type=cli.at_least(100), default=2000,
                   help="bootstrap draws of prompts per checkpoint")
    p.add_argument("--from-saved", default="", help="a folder with a saved sweep (results.json, stats.npz): "
                   "re-analyse it into --out without measuring anything")
    p.add_argument("--resume", action="store_true", help="keep the (n, seed) cells already saved in --out "
                   "(results.json, stats.npz, same pool settings) and measure only the missing ones")
    p.add_argument("--out", type=cli.out_folder, default=str(cli.RUNS / "horizon_sweep"), help="the results")
    args = p.parse_args(argv)
    args.horizons = args.horizons or ([16, 64, 128] if args.task == "periodic" else [2, 4, 8])
    if not {"reinforce", "group_mean"} <= set(args.estimators):
        p.error(f"--estimators {','.join(args.estimators)}: reinforce and group_mean are always needed")
    if any(n > 400 for n in args.horizons):
        p.error(f"--horizons {max(args.horizons)}: n must be at most 400 (the tiny model has 512 positions)")
    if any(args.pool % n or args.pool // n < 2 for n in args.group_sizes):
        p.error(f"--group-sizes {','.join(map(str, args.group_sizes))}: each N must divide "
                f"--pool {args.pool} at least twice")
    if args.resume and not all((Path(args.out) / f).is_file() for f in ("results.json", "stats.npz")):
        p.error(f"--resume: {args.out} holds no finished sweep (results.json and stats.npz)")
    if args.from_saved and not (Path(args.from_saved) / "stats.npz").is_file():
        p.error(f"--from-saved {args.from_saved}: no stats.npz there (a sweep saved by this script)")
    if not 0 < args.warmup_target < 1:
        p.error(f"--warmup-target {args.warmup_target} must be in (0, 1)")
    return args


def checkpoint(n, seed, args):
    """The warmed-up tiny model for (n, seed), through train.py's cached warm-up."""
    cfg = train.Config(task=args.task, horizon=n, seed=seed, warmup_target=args.warmup_target,
                       out=args.cache)
    torch.manual_seed(seed)
    model, tok, source = train_cli.load(cfg, torch.device("cpu"))
    return model, tok, tasks.make_task(cfg), cfg, source


def measure_checkpoint(model, tok, task, cfg, args, seed):
    """Per estimator and N, the sufficient statistics over prompts (scale_free.gram_stats); info."""
    limit = tasks.response_limit(cfg, task)
    prompts, answers = tasks.prompt_batch(task, tok, 10_000 + seed, 0, args.prompts)  # unseen by RL
    draw = lambda m, s: draw_pool(model, tok, task, prompts, answers, m, s, limit,  # noqa: E731
                                  cfg.temperature)
    pool, (R, token_rewards, _) = draw(args.pool, seed)
    ref_pool, (R_ref, ref_rewards, _) = draw(args.ref_pool, seed + 7919)  # independent of the pool
    units = {(e, N): [] for e in args.estimators for N in args.group_sizes}  # per prompt: (m_p, V_p, K)
    refs, lengths = [], []
    split = torch.Generator().manual_seed(seed + 1)
    for p in tqdm(range(args.prompts), desc=f"n={task.horizon} seed={seed}", leave=False):
        # reference r_p: RLOO inside 4 disjoint sub-pools of a separate pool (unbiased for this prompt)
        refs.append(reference_gradient(model, ref_pool, ref_rewards,
                                       torch.arange(p * args.ref_pool, (p + 1) * args.ref_pool), cfg.temperature)[0])
        # the pool: every estimator on the same groups
        rows = torch.arange(p * args.pool, (p + 1) * args.pool)
        sub = subset(pool, rows)
        m, r = sub.response_mask, token_rewards[rows, :sub.response.shape[1]]  # (M, T)
        lengths.append(m.sum(-1).mean().item())
        with torch.no_grad():
            logp, spp, _ = rollout.score(model, sub.prompt_ids, sub.prompt_mask, sub.response, m, cfg.temperature)
        S = per_response_scores(model, sub, cfg.temperature)  # S_i, (M, D)
        perm = torch.randperm(args.pool, generator=split)
        for N in args.group_sizes:
            groups = perm.view(-1, N)  # (K, N) disjoint groups
            gid = group_ids_of(groups, args.pool)
            for name in args.estimators:
                adv, _ = otb.ESTIMATORS[name](token_rewards=r, response_mask=m, group_index=gid,
                                              log_probs=logp, sum_pi_sq=spp)
                G = group_gradients(model, sub, groups, adv, cfg.temperature, S=S).double()  # (K, D)
                mean, var, K = scale_free.unit_summary(G)
                units[(name, N)].append((mean.float(), var, K))  # float32 keeps 15 x P x D in memory
    refs = torch.stack(refs).float()  # r_p, (P, D)
    grams = {key: scale_free.gram_stats(torch.stack([u[0] for u in us]), [u[1] for u in us], refs)
             for key, us in units.items()}
    return grams, dict(success=R.mean().item(), ref_success=R_ref.mean().item(),
                       mean_length=sum(lengths) / len(lengths))


# =====================================================================================
# Saved sufficient statistics: anyone can re-bootstrap from stats.npz
# =====================================================================================

def save_grams(path, grams_by_cell):
    """{(n, seed): {(estimator, N): gram_stats}} -> one .npz, keys 'n64_seed0/otb/N4/gram'."""
    arrays = {f"n{n}_seed{seed}/{e}/N{N}/{k}": v.numpy() for (n, seed), grams in grams_by_cell.items()
              for (e, N), s in grams.items() for k, v in s.items()}
    np.savez_compressed(path, **arrays)


def load_grams(path):
    """The inverse of save_grams."""
    out = {}
    with np.load(path) as data:
        for key in data.files:
            cell, e, N, k = key.split("/")
            n, seed = (int(x) for x in cell[1:].split("_seed"))
            out.setdefault((n, seed), {}).setdefault((e, int(N[1:])), {})[k] = torch.from_numpy(data[key])
    return out


# =====================================================================================
# Analysis: bootstrap over prompts per seed, seeds combined on the log scale (stats.py)
# =====================================================================================

def analyse(grams_by_cell, replicates=2000):
    """Per (n, seed, estimator, N): every metric and the gain over group_mean with a paired bootstrap
    interval over prompts. Returns (rows, gains, pooled)."""
    rows = []
    for (n, seed), grams in sorted(grams_by_cell.items()):
        for N in sorted({N for _, N in grams}):
            units = {e: s for (e, NN), s in grams.items() if NN == N}
            factors = {e: scale_free.FACTORS[e](N) for e in units if e in scale_free.FACTORS}
            out = scale_free.bootstrap(units, factors, baseline="group_mean", replicates=replicates,
                                       seed=1000 * n + seed, j_gram=scale_free.pooled_reference(units["reinforce"]))
            raw_gm = units["group_mean"]["V"].mean().item()
            for e, metrics in out.items():
                rows.append(dict(n=n, seed=seed, estimator=e, N=N, factor=factors.get(e),
                                 raw_var_ratio=units[e]["V"].mean().item() / raw_gm if raw_gm else math.nan,
                                 **{k: list(v) for k, v in metrics.items()}))
    return rows, gains(rows), pooled(rows)


def gains(rows):
    """Per (estimator, N, n): the gain's geometric mean over seeds with a t interval (eq. (4) of stats.py),
    alpha and cosine as means over seeds with t intervals; nan (unresolved) if any seed is."""
    cells = {}
    for r in rows:
        cells.setdefault((r["estimator"], r["N"], r["n"]), []).append(r)
    summary = []
    for (e, N, n), rs in sorted(cells.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        g = stats.geometric_mean([r["gain"][0] for r in rs])
        summary.append(dict(estimator=e, N=N, n=n, gain=list(g), seeds=len(rs), factor=rs[0]["factor"],
                            per_seed=[r["gain"] for r in rs],
                            alpha=list(stats.mean_interval([r["alpha"][0] for r in rs])),
                            cosine=list(stats.mean_interval([r["cosine"][0] for r in rs])),
                            raw_var_ratio=stats.geometric_mean([r["raw_var_ratio"] for r in rs])[0]))
    return summary


def pooled(rows):
    """Per (estimator, N): the gain's geometric mean over every (n, seed) cell, t interval."""
    cells = {}
    for r in rows:
        cells.setdefault((r["estimator"], r["N"]), []).append(r["gain"][0])
    return [dict(estimator=e, N=N, cells=len(xs), gain=list(stats.geometric_mean(xs)))
            for (e, N), xs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0]))]


def head_to_head(grams_by_cell, a="otb_tir", b="otb", replicates=2000):
    """nvar(b) / nvar(a) per (n, N): paired bootstrap over prompts per seed, seeds on the log scale.
    Neither has a known factor, so a cell is unresolved where b's signal is. [] without both."""
    cells = {}
    for (n, seed), grams in sorted(grams_by_cell.items()):
        for N in sorted({N for e, N in grams if e == a and (b, N) in grams}):
            out = scale_free.bootstrap({a: grams[(a, N)], b: grams[(b, N)]}, baseline=b,
                                       replicates=replicates, seed=1000 * n + seed)
            cells.setdefault((n, N), []).append(out[a]["gain"])
    return [dict(n=n, N=N, gain=list(stats.geometric_mean([g[0] for g in gs])),
                 per_seed=[list(g) for g in gs]) for (n, N), gs in sorted(cells.items())]


def head_to_head_md(rows, a="otb_tir", b="otb"):
    lines = [f"| n | N | nvar({b}) / nvar({a}) [95% t over seeds] | per seed [95% bootstrap] |",
             "|---|---|---|---|"]
    return "\n".join(lines + [f"| {r['n']} | {r['N']} | {stats.fmt(*r['gain'], low=0.0, suffix='x')} | "
                              + "; ".join(stats.fmt(*g, low=0.0) for g in r["per_seed"]) + " |"
                              for r in rows])


def table_md(rows, summary):
    """The table: gains with seed intervals, per-seed bootstrap intervals, alpha, cosine, raw variance."""
    lines = ["| n | N | estimator | gain over group_mean: geometric mean over seeds [95% t] | per seed [95% bootstrap "
             "over prompts] | alpha | cosine | raw tr Var / group_mean's |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["estimator"] == "group_mean":
            continue
        per_seed = "; ".join(stats.fmt(*g, low=0.0) for g in s["per_seed"])
        lines.append(f"| {s['n']} | {s['N']} | {s['estimator']} | {stats.fmt(*s['gain'], low=0.0, suffix='x')} | "
                     f"{per_seed} | {scale_free.cell('alpha', s['alpha'], s['factor'])} | "
                     f"{scale_free.cell('cosine', s['cosine'], s['factor'])} | {s['raw_var_ratio']:.2f} |")
    return "\n".join(lines)


TOOL_ROWS = ("reinforce", "rloo", "otb", "otb_tir")  # docs/tool_use.md's columns (--task calculator)


def compact_md(summary, pool, estimators=("otb", "otb_zero_tail", "otb_loo", "reinforce", "grpo")):
    """The gains as one N x n table with a pooled row per N (docs/variance.md shows it, tested)."""
    lines = ["| N | n | " + " | ".join(estimators) + " |", "|---" * (len(estimators) + 2) + "|"]
    cell = {(s["estimator"], s["N"], s["n"]): s["gain"] for s in summary}
    pooled_gain = {(p["estimator"], p["N"]): p["gain"] for p in pool}
    for N in sorted({s["N"] for s in summary}):
        for n in sorted({s["n"] for s in summary}):
            lines.append(f"| {N} | {n} | " + " | ".join(stats.fmt(*cell[(e, N, n)], low=0.0, suffix="x")
                                                    for e in estimators) + " |")
        lines.append(f"| {N} | pooled | " + " | ".join(stats.fmt(*pooled_gain[(e, N)], low=0.0, suffix="x")
                                                       for e in estimators) + " |")
    return "\n".join(lines)


def checkpoints_md(checkpoints):
    """Each checkpoint's warm-up success and its pool's (sweeps that saved the warm-up's only)."""
    if not all("warmup_success" in c for c in checkpoints):
        return ""
    rows = [f"| {c['n']} | {c['seed']} | {c['warmup_success']:.3f} | {c['success']:.3f} | "
            f"{c['mean_length']:.1f} |"
            for c in sorted(checkpoints, key=lambda c: (c["n"], c["seed"]))]
    return "\n".join(["\n## Checkpoints\n", "| n | seed | warm-up's last sampled success | pool success | "
                      "mean actions |", "|---|---|---|---|---|", *rows, ""])


def pooled_md(pool):
    lines = ["| N | estimator | gain over group_mean pooled over n and seeds [95% t] | cells |", "|---|---|---|---|"]
    lines += [f"| {p['N']} | {p['estimator']} | {stats.fmt(*p['gain'], low=0.0, suffix='x')} | {p['cells']} |"
              for p in pool if p["estimator"] != "group_mean"]
    return "\n".join(lines)


def plot(summary, path=None, task="periodic"):
    """Gain over group_mean against n (geometric mean over seeds, 95% t interval), one panel per N, and
    each resolved seed's own gain as a hollow marker; unresolved values are left out. Returns the figure."""
    import matplotlib.pyplot as plt
    Ns = sorted({s["N"] for s in summary})
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.2 * len(Ns), 4.2), squeeze=False)
    style = {"otb": dict(lw=2.6, marker="o", zorder=5), "otb_zero_tail": dict(ls="--", marker="s"),
             "otb_loo": dict(ls=":", marker="D"), "reinforce": dict(marker="^"), "rloo": dict(marker="v"),
             "grpo": dict(marker="x"), "otb_tir": dict(lw=2.6, marker="*", ms=10, zorder=6)}
    ns = sorted({s["n"] for s in summary})
    for ax, N in zip(axes[0], Ns):
        for i, (e, st) in enumerate(style.items()):
            pts = sorted((s["n"], *s["gain"]) for s in summary if s["estimator"] == e and s["N"] == N
                         and not math.isnan(s["gain"][0]))
            shift = 1.03 ** (i - 2.5)  # side by side, not on top of each other
            if pts:
                n, g, lo, hi = zip(*pts)
                err = [[max(a - b, 0) if not math.isnan(b) else 0 for a, b in zip(g, lo)],
                       [max(b - a, 0) if not math.isnan(b) else 0 for a, b in zip(g, hi)]]
                ax.errorbar([x * shift for x in n], g, yerr=err, capsize=3, label=e, color=f"C{i}", **st)
            seeds = [(s["n"] * shift, g[0]) for s in summary if s["estimator"] == e and s["N"] == N
                     for g in s["per_seed"] if not math.isnan(g[0])]
            if seeds:  # hollow: each seed's own gain, drawn also where the seeds together are unresolved
                ax.plot(*zip(*seeds), ls="none", marker=st["marker"], mfc="none", color=f"C{i}", alpha=0.6,
                        label=None if pts else f"{e} (single seeds only)")
        ax.axhline(1.0, color="k", lw=0.8, label="group_mean")
        ax.set(xscale="log", yscale="log", xlabel="answer length n (periodic copy)" if task == "periodic"
               else "k, numbers added with k - 1 calculator calls",
               ylabel="nvar(group_mean) / nvar(estimator)", title=f"N = {N}: gain over the group mean (> 1 is "
               "better)\nfilled: geometric mean over seeds, 95% t interval; hollow: one seed")
        ax.title.set_fontsize(9)
        ax.xaxis.set_minor_locator(plt.NullLocator())  # only the measured n are labelled
        ax.set_xticks(ns)
        ax.set_xticklabels([str(x) for x in ns])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def write(out, command, args, seconds, checkpoints, grams_by_cell):
    """Analyse and write results.json, table.md, gain_vs_horizon.png (and stats.npz when measured)."""
    rows, summary, pool = analyse(grams_by_cell, args.replicates)
    versus = head_to_head(grams_by_cell, replicates=args.replicates)
    (out / "results.json").write_text(json.dumps(dict(
        command=command, args=vars(args), machine=machine(), seconds=seconds, checkpoints=checkpoints,
        sufficient_statistics="stats.npz", rows=rows, gains=summary, pooled=pool, otb_tir_over_otb=versus),
        indent=1))
    seeds = sorted({s for _, s in grams_by_cell})
    prompts = next(iter(next(iter(grams_by_cell.values())).values()))["V"].shape[0]
    text = (f"# Normalised gradient variance against the horizon\n\n`{command}`  \n"
            f"{len(seeds)} seeds x {prompts} prompts x {args.pool} responses per checkpoint; measured in "
            f"{seconds:.0f} s; intervals: {args.replicates} bootstrap draws of prompts per seed, seeds "
            f"combined on the log scale (t with {len(seeds) - 1} degrees of freedom). \"unresolved\": the "
            f"denominator's interval covers 0. alpha and cosine are exact where E g is known "
            f"(scale_free.FACTORS).\n\n" + table_md(rows, summary) + "\n\n## Pooled over n\n\n" + pooled_md(pool)
            + "\n" + ("\n## Action-aligned against position-aligned OTB, paired\n\n" + head_to_head_md(versus)
                       + "\n" if versus else "") + checkpoints_md(checkpoints))
    (out / "table.md").write_text(text)
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(summary, out / "gain_vs_horizon.png", getattr(args, "task", "periodic")))
    print(text)
    print(f"wrote {out}/results.json, table.md, gain_vs_horizon.png")
    return rows, summary


def resumed(out, args, t0):
    """The cells a finished earlier run saved in ``out``, its checkpoints, and t0 moved back by its time."""
    saved = json.loads((out / "results.json").read_text())
    same = ("prompts", "pool", "ref_pool", "group_sizes", "warmup_target", "task", "estimators")
    saved["args"] = {"task": "periodic", "estimators": args.estimators, **saved["args"]}  # older sweeps
    if any(saved["args"][k] != getattr(args, k) for k in same):
        raise SystemExit(f"--resume: {out} was measured with other settings "
                         f"({ {k: saved['args'][k] for k in same} }); use another --out")
    return load_grams(out / "stats.npz"), saved["checkpoints"], t0 - saved["seconds"]


def main(argv=None):
    args = parse_args(argv)
    command = ("python benchmarks/horizon_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    out = Path(args.out)
    if args.from_saved:  # re-bootstrap a saved sweep: nothing is measured
        saved = json.loads((Path(args.from_saved) / "results.json").read_text())
        grams = load_grams(Path(args.from_saved) / "stats.npz")
        out.mkdir(parents=True, exist_ok=True)
        if out.resolve() != Path(args.from_saved).resolve():
            shutil.copy(Path(args.from_saved) / "stats.npz", out / "stats.npz")
        return write(out, saved["command"], argparse.Namespace(**{**saved["args"], "replicates": args.replicates}),
                     saved["seconds"], saved["checkpoints"], grams)
    out.mkdir(parents=True, exist_ok=True)
    grams_by_cell, checkpoints, t0 = {}, [], time.time()
    if args.resume:
        grams_by_cell, checkpoints, t0 = resumed(out, args, t0)
    todo = [(n, seed) for seed in args.seeds for n in args.horizons if (n, seed) not in grams_by_cell]
    for i, (n, seed) in enumerate(todo):  # seed by seed: a partial sweep has every n
        model, tok, task, cfg, source = checkpoint(n, seed, args)
        grams_by_cell[(n, seed)], info = measure_checkpoint(model, tok, task, cfg, args, seed)
        warm = json.loads((Path(source["path"]) / "warmup.json").read_text())["history"]
        checkpoints.append(dict(n=n, seed=seed, model=source["path"],
                                warmup_success=warm[-1][1] if warm else None, **info))
        print(f"n={n} seed={seed}: pool success {info['success']:.2f}, mean length "
              f"{info['mean_length']:.1f}", flush=True)
        save_grams(out / "stats.npz", grams_by_cell)  # after every checkpoint: nothing measured is lost,
        if i + 1 < len(todo):  # and a results.json that --resume continues from
            write(out, command + "  # partial", args, time.time() - t0, checkpoints, grams_by_cell)
    return write(out, command, args, time.time() - t0, checkpoints, grams_by_cell)


if __name__ == "__main__":
    main()
