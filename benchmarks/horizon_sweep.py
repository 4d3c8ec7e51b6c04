"""Does a per-token baseline matter more as responses get longer? A static sweep over the horizon.

At fixed weights (a warmed-up checkpoint of the tiny model on the periodic-copy task, one per
seed and horizon n), every estimator sees the same sampled responses, and its batch gradient
for one group of N responses,

    g = (1 / N) sum_i sum_t A_t^i grad_theta log pi(y_t^i)                          (1)

is computed exactly by backward passes (benchmarks/grad_variance.py: one backward per response
for sequence-level advantages, one per group for OTB's token-level ones). For each prompt its M
pooled responses are split into M / N disjoint groups: i.i.d. samples of (1). The quality of an
estimator is scale-free (scale_free.py): the normalised variance

    nvar = tr Var(g) / ||E g||^2                                                      (2)

(noise per unit of signal; a baseline that shrinks g does not look better for it), plus alpha and
the cosine against a reference gradient r estimated from a separate pool of responses with an
unbiased estimator (RLOO within sub-pools), and the raw variance, labelled raw. Prompts are the
units of the jackknife standard errors. The headline is the gain over the group mean at the same
N and n, nvar(group_mean) / nvar(estimator), with its spread over seeds.

    python benchmarks/horizon_sweep.py                               # n = 16, 64, 128; 3 seeds
    python benchmarks/horizon_sweep.py --horizons 16 --seeds 0 --prompts 4 --pool 16   # smoke run

Writes runs/horizon_sweep/ by default; ``--out benchmarks/results/horizon_sweep`` updates the
committed results (results.json, table.md, gain_vs_horizon.png).
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout  # noqa: E402
import scale_free  # noqa: E402
import train  # noqa: E402
from benchmarks.grad_variance import (ESTIMATORS, group_gradients, group_ids_of,  # noqa: E402
                                      per_response_scores, reference_gradient, subset)
from benchmarks.machine import machine  # noqa: E402



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--horizons", default="16,64,128", help="answer lengths n of the periodic task")
    p.add_argument("--seeds", default="0,1,2", help="one warm-up checkpoint per (seed, n)")
    p.add_argument("--group-sizes", default="4,16", help="N values; each must divide --pool at least twice")
    p.add_argument("--prompts", type=int, default=12, help="prompts per checkpoint (the jackknife units)")
    p.add_argument("--pool", type=int, default=32, help="M, responses per prompt split into groups")
    p.add_argument("--ref-pool", type=int, default=32, help="responses per prompt of the separate "
                   "reference pool (RLOO in 4 sub-pools)")
    p.add_argument("--warmup-target", type=float, default=0.25, help="warm-up stops at this sampled success")
    p.add_argument("--cache", default=str(ROOT / "runs"), help="folder of train.py's warm-up cache")
    p.add_argument("--out", default=str(ROOT / "runs" / "horizon_sweep"), help="output folder")
    args = p.parse_args(argv)
    try:
        args.horizons = [int(x) for x in args.horizons.split(",")]
        args.seeds = [int(x) for x in args.seeds.split(",")]
        args.group_sizes = [int(x) for x in args.group_sizes.split(",")]
    except ValueError as e:
        p.error(f"--horizons/--seeds/--group-sizes take comma-separated integers ({e})")
    if any(not 1 <= n <= 400 for n in args.horizons):
        p.error(f"--horizons {args.horizons}: each n must be in 1..400 (the tiny model has 512 positions)")
    if any(args.pool % n or args.pool // n < 2 for n in args.group_sizes):
        p.error(f"--group-sizes {args.group_sizes}: each N must divide --pool {args.pool} at least twice")
    if args.ref_pool < 8 or args.ref_pool % 4:
        p.error(f"--ref-pool {args.ref_pool} must be a multiple of 4, at least 8")
    if args.prompts < 2:
        p.error(f"--prompts {args.prompts} must be >= 2 (the jackknife needs two units)")
    if not 0 < args.warmup_target < 1:
        p.error(f"--warmup-target {args.warmup_target} must be in (0, 1)")
    if Path(args.out).is_file():
        p.error(f"--out {args.out} is a file, not a folder")
    return args


def checkpoint(n, seed, args):
    """The warmed-up tiny model for (n, seed), through train.py's cached warm-up."""
    cfg = train.parse_config(["--task", "periodic", "--horizon", str(n), "--seed", str(seed),
                              "--warmup-target", str(args.warmup_target), "--out", args.cache])
    torch.manual_seed(seed)
    model, tok, source = train.load(cfg, torch.device("cpu"))
    return model, tok, train.make_task(cfg), cfg, source


def measure_checkpoint(model, tok, task, cfg, args, seed):
    """Per estimator and N: per-prompt (mean gradient, tr Var, K); the reference gradient."""
    limit = train.response_limit(cfg, task)
    prompts, answers = rollout.prompt_batch(task, tok, 10_000 + seed, 0, args.prompts)  # unseen by RL
    draw = lambda s, m: rollout.sample(model, prompts, group_size=m, max_new_tokens=limit,  # noqa: E731
                                       temperature=cfg.temperature, eos_id=tok.eos_token_id,
                                       pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(s))
    pool, ref_pool = draw(seed, args.pool), draw(seed + 7919, args.ref_pool)
    R, token_rewards, _ = rollout.rewards(task, tok, pool, answers, args.pool)
    R_ref, ref_rewards, _ = rollout.rewards(task, tok, ref_pool, answers, args.ref_pool)
    units = {(e, N): [] for e in ESTIMATORS for N in args.group_sizes}
    refs, ref_vars, lengths = [], [], []
    split = torch.Generator().manual_seed(seed + 1)
    for p in tqdm(range(args.prompts), desc=f"n={task.horizon} seed={seed}", leave=False):
        # reference: RLOO inside 4 disjoint sub-pools of a separate pool (unbiased), and its variance
        ref_p, var_p = reference_gradient(model, ref_pool, ref_rewards,
                                          torch.arange(p * args.ref_pool, (p + 1) * args.ref_pool), cfg.temperature)
        refs.append(ref_p)
        ref_vars.append(var_p)
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
            for name, fn in ESTIMATORS.items():
                adv, _ = fn(token_rewards=r, response_mask=m, group_index=gid, log_probs=logp, sum_pi_sq=spp)
                G = group_gradients(model, sub, groups, adv, cfg.temperature, S=S).double()  # (K, D)
                units[(name, N)].append(scale_free.unit_summary(G))
    ref = torch.stack(refs).mean(0)  # r = mean over prompts, (D,)
    ref_var = sum(ref_vars) / len(ref_vars) ** 2
    rows = []
    for (name, N), us in units.items():
        stats = scale_free.scale_free_metrics(torch.stack([u[0] for u in us]), [u[1] for u in us],
                                              [u[2] for u in us], ref, ref_var)
        rows.append(dict(estimator=name, N=N, **stats))
    return rows, dict(success=R.mean().item(), ref_success=R_ref.mean().item(),
                      mean_length=sum(lengths) / len(lengths))


def gains(rows):
    """nvar(group_mean) / nvar(e) at the same (n, N), per seed; mean and s.e. over seeds."""
    out = {}
    for r in rows:
        ref = next(q for q in rows if q["estimator"] == "group_mean" and q["N"] == r["N"]
                   and q["n"] == r["n"] and q["seed"] == r["seed"])
        gain = ref["nvar"] / r["nvar"] if r["nvar"] > 0 else math.nan  # nan: not measurable (no signal)
        out.setdefault((r["estimator"], r["N"], r["n"]), []).append(gain)
    summary = []
    for (e, N, n), all_xs in sorted(out.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        xs = [x for x in all_xs if not math.isnan(x)] or [math.nan]
        mu = sum(xs) / len(xs)
        se = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) if len(xs) > 1 else float("nan")
        summary.append(dict(estimator=e, N=N, n=n, gain=mu, gain_se=se, per_seed=all_xs))
    return summary


def table_md(rows, summary):
    lines = ["| n | N | estimator | nvar (mean over seeds) | gain over group_mean (± s.e. over seeds) | "
             "alpha | cosine | raw tr Var / group_mean's |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        cell = [r for r in rows if (r["estimator"], r["N"], r["n"]) == (s["estimator"], s["N"], s["n"])]
        gm = [r for r in rows if (r["estimator"], r["N"], r["n"]) == ("group_mean", s["N"], s["n"])]
        mean = lambda k, rs: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        lines.append(f"| {s['n']} | {s['N']} | {s['estimator']} | {mean('nvar', cell):.3g} | "
                     f"{s['gain']:.2f} ± {s['gain_se']:.2f} | {mean('alpha', cell):.2f} | "
                     f"{mean('cosine', cell):.2f} | {mean('raw_variance', cell) / mean('raw_variance', gm):.2f} |")
    return "\n".join(lines)


def plot(summary, path=None):
    """Gain over group_mean against n, one panel per N; ``summary`` from gains(). Returns the figure."""
    import matplotlib.pyplot as plt
    Ns = sorted({s["N"] for s in summary})
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.2 * len(Ns), 4.2), squeeze=False)
    style = {"otb": dict(lw=2.6, marker="o", zorder=5), "otb_zero_tail": dict(ls="--", marker="s"),
             "otb_loo": dict(ls=":", marker="D"), "reinforce": dict(marker="^"), "rloo": dict(marker="v"),
             "grpo": dict(marker="x")}
    for ax, N in zip(axes[0], Ns):
        for e, st in style.items():
            pts = sorted((s["n"], s["gain"], s["gain_se"]) for s in summary if s["estimator"] == e and s["N"] == N)
            if pts:
                n, g, se = zip(*pts)
                ax.errorbar(n, g, yerr=[0 if math.isnan(x) else x for x in se], capsize=3, label=e, **st)
        ax.axhline(1.0, color="k", lw=0.8, label="group_mean")
        ax.set(xscale="log", yscale="log", xlabel="answer length n (periodic copy)",
               ylabel="nvar(group_mean) / nvar(estimator)", title=f"N = {N}: gain over the group mean "
               "(> 1 is better)")
        ax.xaxis.set_minor_locator(plt.NullLocator())  # only the measured n are labelled
        ax.set_xticks(sorted({s["n"] for s in summary}))
        ax.set_xticklabels([str(x) for x in sorted({s["n"] for s in summary})])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def main(argv=None):
    args = parse_args(argv)
    command = "python benchmarks/horizon_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, checkpoints, t0 = [], [], time.time()
    for n in args.horizons:
        for seed in args.seeds:
            model, tok, task, cfg, source = checkpoint(n, seed, args)
            cell, info = measure_checkpoint(model, tok, task, cfg, args, seed)
            rows += [dict(r, n=n, seed=seed) for r in cell]
            checkpoints.append(dict(n=n, seed=seed, model=source["path"], **info))
            print(f"n={n} seed={seed}: pool success {info['success']:.2f}, mean length "
                  f"{info['mean_length']:.1f}; " + ", ".join(
                      f"{r['estimator']}@{r['N']} nvar {r['nvar']:.3g}" for r in cell), flush=True)
    summary = gains(rows)
    seconds = time.time() - t0
    (out / "results.json").write_text(json.dumps(dict(command=command.strip(), args=vars(args), machine=machine(),
                                                      seconds=seconds, checkpoints=checkpoints, rows=rows,
                                                      gains=summary), indent=1))
    text = (f"# Normalised gradient variance against the horizon\n\n`{command.strip()}`  \n"
            f"{len(args.seeds)} seeds x {args.prompts} prompts x {args.pool} responses per checkpoint; "
            f"{seconds:.0f} s\n\n" + table_md(rows, summary) + "\n")
    (out / "table.md").write_text(text)
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(summary, out / "gain_vs_horizon.png"))
    print(text)
    print(f"wrote {out}/results.json, table.md, gain_vs_horizon.png")
    return rows, summary


if __name__ == "__main__":
    main()
