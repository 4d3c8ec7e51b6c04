"""The true variance of the policy gradient on the tiny language model, estimator by estimator,
and how well train.py's forward-only proxies (total_power, pure_noise) track it (docs/variance.md).

At fixed weights (the warmed-up tiny model train.py caches), P prompts x M responses are sampled
once; for each N they are split into K = M / N disjoint groups, the same for every estimator.
Each group's batch gradient, with advantages from ``otb.ESTIMATORS[e]`` on that group,

    g_k = (1 / N) sum_{i in group k} sum_t A_t^i grad_theta log pi(y_t^i)          (1)

is an i.i.d. draw, so tr Var[g] = (1 / (K - 1)) sum_k ||g_k - mean_k g_k||^2 (2) is unbiased.
Sequence-level advantages use S_i = grad log pi(tau_i), one backward per response; OTB's needs one
backward per group (tests/test_naive_grad_variance.py checks both against a naive loop). Quality
is scale-free (scale_free.py: nvar, gain over group_mean, alpha and cosine against a reference
gradient from a separate pool, RLOO in 4 sub-pools), with paired bootstrap intervals over
prompts; the raw tr Var is kept, labelled raw. The proxies are the functions train.py logs
(diagnostics.py), per group, divided by group_mean's at the same N; the proxy W(tau) = sum_t w_t
is also compared with the exact ||S(tau)||^2 per response (correlations and a scatter plot).
(1) normalises by N per group; train.py's token mean rescales every estimator alike.

    OMP_NUM_THREADS=1 python benchmarks/grad_variance.py --out benchmarks/results/grad_variance  # 10 min, 5GB
    python benchmarks/grad_variance.py --prompts 8 --pool 16 --group-sizes 2,4   # a smoke run
"""
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import diagnostics  # noqa: E402
import otb  # noqa: E402
from lab.analysis import scale_free  # noqa: E402
from lab.analysis import stats  # noqa: E402
import rollout  # noqa: E402
import tasks  # noqa: E402
from benchmarks.cli import (RUNS, at_least, choice_list, command, int_list, multiple_of,  # noqa: E402
                            out_folder, parser, write_results)
from benchmarks.common import (draw_pool, group_gradients, group_ids_of, load_model,  # noqa: E402
                               per_response_scores, reference_gradient, subset)
from lab import machine  # noqa: E402
from lab.machine import kept_provenance, provenance  # noqa: E402


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--model-dir", default="", help="save_pretrained folder of the model; empty: the "
                   "default run's warmed-up tiny model (runs/_cache, built if missing)")
    p.add_argument("--prompts", type=at_least(1), default=48, help="P, prompts (the bootstrap's units)")
    p.add_argument("--pool", type=at_least(2), default=32, help="M, responses sampled once per prompt")
    p.add_argument("--group-sizes", type=int_list(1), default="2,4,8,16",
                   help="N values, each must divide M at least twice (K = M / N >= 2 groups)")
    p.add_argument("--estimators", type=choice_list(list(otb.ESTIMATORS)), default=",".join(otb.ESTIMATORS),
                   help="estimators to measure")
    p.add_argument("--ref-pool", type=multiple_of(4, 8), default=32, help="responses per prompt of the "
                   "separate reference pool (RLOO in 4 sub-pools: the reference gradient of alpha/cosine)")
    p.add_argument("--horizon", type=at_least(1), default=8, help="reversal task: max string length")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling and scoring temperature")
    p.add_argument("--seed", type=int, default=1234, help="seed of the prompts, the sampler and the splits")
    p.add_argument("--out", type=out_folder, default=str(RUNS / "grad_variance"), help="folder for table.md, "
                   "results.json, stats.npz and proxy_vs_true.png (benchmarks/results/grad_variance: the committed)")
    p.add_argument("--from-saved", default="", help="a folder with a saved run (results.json, stats.npz): "
                   "re-analyse it into --out without a model; the measurement's record is kept")
    args = p.parse_args(argv)
    if args.from_saved and not (Path(args.from_saved) / "stats.npz").is_file():
        p.error(f"--from-saved {args.from_saved}: no stats.npz there (a run saved by this script)")
    if any(args.pool % n or args.pool // n < 2 for n in args.group_sizes):
        p.error(f"argument --group-sizes: every N must divide --pool {args.pool} at least twice (K >= 2 "
                f"groups), got {','.join(map(str, args.group_sizes))!r}")
    return args


# ---- The measurement

def measure(model, tok, args, progress=True):
    """Returns (cells, scatter, R, refs): cells[(estimator, N)] -> lists of per-prompt values,
    refs (P, D) the reference gradient of each prompt."""
    task = tasks.ReverseTask(horizon=args.horizon)
    prompts, answers = tasks.prompt_batch(task, tok, args.seed, 0, args.prompts)
    pool = lambda size, seed: draw_pool(model, tok, task, prompts, answers, size, seed,  # noqa: E731
                                        2 * args.horizon + 2, args.temperature)
    ro, (R, token_rewards, _) = pool(args.pool, args.seed)
    ref_ro, (_, ref_rewards, _) = pool(args.ref_pool, args.seed + 7919)  # independent of the pool
    refs = []
    cells = {(e, n): dict(true=[], power=[], noise=[], units=[])
             for e in args.estimators for n in args.group_sizes}
    scatter = dict(W=[], S_sq=[], R=[])
    split_gen = torch.Generator().manual_seed(args.seed + 1)
    for p in tqdm(range(args.prompts), desc="prompts", disable=not progress):
        rows = torch.arange(p * args.pool, (p + 1) * args.pool)
        ref_rows = torch.arange(p * args.ref_pool, (p + 1) * args.ref_pool)  # for r_p, (D,)
        refs.append(reference_gradient(model, ref_ro, ref_rewards, ref_rows, args.temperature)[0].float())
        sub = subset(ro, rows)  # this prompt's M responses
        m, r = sub.response_mask, token_rewards[rows, :sub.response.shape[1]]  # (M, T)
        with torch.no_grad():
            logp, spp, _ = rollout.score(model, sub.prompt_ids, sub.prompt_mask, sub.response, m,
                                         args.temperature)  # (M, T)
        S = per_response_scores(model, sub, args.temperature)  # S_i, (M, D)
        scatter["W"] += (otb.token_energy(logp, spp) * m).sum(-1).tolist()  # W(tau)
        scatter["S_sq"] += (S.double() ** 2).sum(-1).tolist()  # ||S(tau)||^2
        scatter["R"] += R[rows].tolist()
        perm = torch.randperm(args.pool, generator=split_gen)  # one random split of the pool
        for n in args.group_sizes:
            groups = perm.view(-1, n)  # (K, N) disjoint groups
            gid = group_ids_of(groups, args.pool)
            for e in args.estimators:
                adv, _ = otb.ESTIMATORS[e](token_rewards=r, response_mask=m, group_index=gid,
                                           log_probs=logp, sum_pi_sq=spp)  # A_t, (M, T)
                G = group_gradients(model, sub, groups, adv, args.temperature, S=S)  # (K, D)
                power = diagnostics.gradient_power(adv, m, logp, spp)  # P_i, (M,)
                diag = [diagnostics.noise_diagnostics(power[g], diagnostics.mean_gradient_sq_norm(
                    sub.response[g], m[g], gid[g], adv[g], logp[g], spp[g])) for g in groups]
                mean_g, V = scale_free.unit_summary(G)[:2]  # this prompt's unit; V: tr Var, eq. (2)
                c = cells[(e, n)]
                c["true"].append(V)
                c["units"].append((mean_g.float(), V))  # float32: P x cells x D in memory
                c["power"].append(sum(d["total_power"] for d in diag) / len(diag))
                c["noise"].append(sum(d["pure_noise"] for d in diag) / len(diag))
    return cells, scatter, R, torch.stack(refs)


def per_prompt_stats(cells, scatter, refs):
    """What the analysis needs, per prompt: {(estimator, N): gram_stats + power (P,), noise (P,)},
    and the per-response scatter (W, S_sq, R): small enough to save (stats.npz), so --from-saved
    re-bootstraps without a model."""
    grams = {}
    for key, c in cells.items():
        g = scale_free.gram_stats(torch.stack([u[0] for u in c["units"]]), [u[1] for u in c["units"]], refs)
        grams[key] = {**g, "power": torch.tensor(c["power"], dtype=torch.float64),
                      "noise": torch.tensor(c["noise"], dtype=torch.float64)}
    return grams, {k: torch.tensor(v, dtype=torch.float64) for k, v in scatter.items()}


def save_stats(path, grams, scatter):
    """One .npz: keys 'otb/N4/gram' (and cross, ref_gram, V, power, noise) and 'scatter/W' etc."""
    arrays = {f"{e}/N{N}/{k}": v.numpy() for (e, N), g in grams.items() for k, v in g.items()}
    arrays.update({f"scatter/{k}": v.numpy() for k, v in scatter.items()})
    np.savez_compressed(path, **arrays)


def load_stats(path):
    """The inverse of save_stats: (grams, scatter)."""
    grams, scatter = {}, {}
    with np.load(path) as data:
        for key in data.files:
            parts = key.split("/")
            if parts[0] == "scatter":
                scatter[parts[1]] = torch.from_numpy(data[key])
            else:
                grams.setdefault((parts[0], int(parts[1][1:])), {})[parts[2]] = torch.from_numpy(data[key])
    return grams, scatter


def summarize(grams, scatter, replicates=2000, boot_seed=0):
    """Per (estimator, N): scale-free quality (nvar, alpha, cosine, gain over group_mean; paired
    bootstrap over prompts, nvar and gain as resampling.py's eq. (4') sets), the raw true variance and the
    proxies; each also relative to group_mean at the same N. boot_seed shifts the bootstrap's draws."""
    rows = []
    for n in sorted({n for _, n in grams}):
        units = {e: {k: g[k] for k in ("gram", "cross", "ref_gram", "V")} for (e, nn), g in grams.items() if nn == n}
        factors = {e: scale_free.FACTORS[e](n) for e in units if e in scale_free.FACTORS}
        j_gram = scale_free.pooled_reference(units["reinforce"]) if "reinforce" in units else None  # eq. (8)
        quality = scale_free.bootstrap(units, factors, baseline="group_mean" if "group_mean" in units else None,
                                       replicates=replicates, seed=n + boot_seed, j_gram=j_gram)
        for e in units:
            g = grams[(e, n)]
            true, se = stats.mean_se(g["V"].tolist())
            rows.append(dict(estimator=e, N=n, factor=factors.get(e),
                             **{k: v if isinstance(v, str) else list(v) for k, v in quality[e].items()},
                             true_var=true, true_var_se=se, total_power=g["power"].mean().item(),
                             pure_noise=g["noise"].mean().item()))
    for r in rows:  # relative to group_mean at the same N
        ref = next((q for q in rows if q["estimator"] == "group_mean" and q["N"] == r["N"]), None)
        r.setdefault("gain", [math.nan] * 3)
        for k in ("true_var", "total_power", "pure_noise"):
            r[k + "_rel"] = r[k] / ref[k] if ref and ref[k] else float("nan")
        r["pure_noise_over_true"] = r["pure_noise"] / r["true_var"] if r["true_var"] else float("nan")
    W, S2 = scatter["W"], scatter["S_sq"]
    corr = dict(pearson=stats.pearson(W, S2), spearman=stats.spearman(W, S2),
                pearson_log=stats.pearson(W.clamp_min(1e-12).log(), S2.clamp_min(1e-12).log()), responses=len(W))
    tv = torch.tensor([r["true_var"] for r in rows])
    across = dict(spearman_true_vs_pure_noise=stats.spearman(tv, torch.tensor([r["pure_noise"] for r in rows])),
                  spearman_true_vs_total_power=stats.spearman(tv, torch.tensor([r["total_power"] for r in rows])))
    return rows, corr, across


def verdicts(rows):
    """The table's verdict per (estimator, N): the gain above 1, below, around it, or at the Monte Carlo
    edge (resampling.replicate_verdict)."""
    return {(r["estimator"], r["N"]): r["verdict"] for r in rows if r["estimator"] != "group_mean"}


def table_md(rows):
    cols = ["estimator", "N", "nvar = tr Var / ||E g||^2 [95%]", "gain over group_mean (nvar ratio) [95%]",
            "alpha", "cosine", "raw tr Var / group_mean's", "raw pure_noise / group_mean's", "pure_noise / raw tr Var"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += [f"| {r['estimator']} | {r['N']} | {scale_free.cell('nvar', r['nvar'], digits=3)} | "
              f"{scale_free.cell('gain', r['gain'])}{' (edge)' if r.get('verdict') == 'edge' else ''} | "
              f"{scale_free.cell('alpha', r['alpha'], r['factor'])} | "
              f"{scale_free.cell('cosine', r['cosine'], r['factor'])} | {r['true_var_rel']:.3f} | "
              f"{r['pure_noise_rel']:.3f} | {r['pure_noise_over_true']:.3g} |"
              for r in sorted(rows, key=lambda r: (r["N"], r["estimator"]))]
    return "\n".join(lines)


def docs_md(rows, estimators=("otb", "otb_loo", "reinforce", "grpo")):
    """The gains as one N x estimator table (docs/variance.md shows it, tested)."""
    by = {(r["estimator"], r["N"]): r for r in rows}
    lines = ["| N | " + " | ".join(estimators) + " |", "|---" * (len(estimators) + 1) + "|"]
    for n in sorted({r["N"] for r in rows}):
        cells = [scale_free.cell("gain", by[(e, n)]["gain"]) + (" (edge)" if by[(e, n)].get("verdict") == "edge" else "")
                 for e in estimators]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(scatter, corr, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    W, S2, R = (torch.tensor(scatter[k]) for k in ("W", "S_sq", "R"))
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for val, colour, label in [(0.0, "tab:blue", "reward 0"), (1.0, "tab:orange", "reward 1")]:
        sel = R == val
        ax.scatter(W[sel], S2[sel], s=6, alpha=0.5, c=colour, label=label)
    ax.set(xscale="log", yscale="log", xlabel="W(tau) = sum_t w_t  (forward-only proxy)",
           ylabel="||grad_theta log pi(tau)||^2  (exact)",
           title=f"Pearson {corr['pearson']:.2f}, Spearman {corr['spearman']:.2f}, "
                 f"log-log Pearson {corr['pearson_log']:.2f}")
    ax.title.set_fontsize(9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(record, rows, corr, across):
    """table.md's text from a results record and its analysis."""
    a = record["args"]
    return (f"# True gradient variance vs the forward-only proxies\n\n`{record['command']}`  \n"
            f"model: {Path(record['model_dir']).name} ({record['parameters']} parameters), {a['prompts']} prompts x "
            f"{a['pool']} responses, success rate of the pool {record['success_rate']:.3f}; {record['seconds']:.0f} s "
            f"on {machine.describe_info(record['machine'])}. Intervals: 2,000 bootstrap draws of prompts; "
            f"nvar and the gain "
            f"are test-inversion sets (resampling.py eq. 4'): \u2265 / \u2264 where only one end is resolved, (edge) a verdict "
            f"against 1 within Monte Carlo error; * marks a number shown clipped to its range.\n\n{table_md(rows)}\n\n"
            f"Proxy W(tau) vs exact ||grad log pi(tau)||^2 over {corr['responses']} responses: "
            f"Pearson {corr['pearson']:.3f}, Spearman {corr['spearman']:.3f}, log-log Pearson "
            f"{corr['pearson_log']:.3f}.  \nAcross the table's cells, Spearman(true, pure_noise) = "
            f"{across['spearman_true_vs_pure_noise']:.3f}, Spearman(true, total_power) = "
            f"{across['spearman_true_vs_total_power']:.3f}.\n")


def write(out, record, grams, scatter):
    """Analyse the per-prompt statistics and write results.json, table.md, stats.npz, proxy_vs_true.png."""
    rows, corr, across = summarize(grams, scatter)
    record = {**record, "sufficient_statistics": "stats.npz", "rows": rows, "proxy_correlation": corr,
              "across_cells": across}
    Path(out).mkdir(parents=True, exist_ok=True)
    save_stats(Path(out) / "stats.npz", grams, scatter)
    write_results(out, "results", record, report(record, rows, corr, across), md_stem="table")
    plot({k: v.tolist() for k, v in scatter.items()}, corr, Path(out) / "proxy_vs_true.png")
    return rows, corr, across


def main(argv=None):
    args = parse_args(argv)
    if args.from_saved:  # re-analyse: the measurement's record (command, machine, code, time) is kept as it was
        record = json.loads((Path(args.from_saved) / "results.json").read_text())
        record = {k: v for k, v in record.items() if k not in ("rows", "proxy_correlation", "across_cells")}
        record["provenance"] = kept_provenance(record)
        return write(args.out, record, *load_stats(Path(args.from_saved) / "stats.npz"))
    torch.manual_seed(args.seed)
    model, tok, model_dir = load_model(args.model_dir)
    info = machine.info()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {model_dir} ({n_params / 1e6:.2f}M parameters); {info}", flush=True)
    t0 = time.time()
    cells, scatter, R, refs = measure(model, tok, args)
    grams, scatter = per_prompt_stats(cells, scatter, refs)
    record = dict(command=command("grad_variance.py", argv), args={k: v for k, v in vars(args).items()
                                                                    if k != "from_saved"},
                  model_dir=str(model_dir), parameters=n_params, machine=info, provenance=provenance(),
                  seconds=time.time() - t0,
                  success_rate=R.mean().item())
    return write(args.out, record, grams, scatter)


if __name__ == "__main__":
    main()
