"""Monte Carlo on the enumerable toy bandit: how good is each baseline, measured scale-free?

``toy_env.py`` builds the toy and every exact quantity (grad J, per-token scores, oracle
baselines). This file samples from it the way training does and judges each estimator.

The harness (``measure``)
-------------------------
Groups of N responses are drawn i.i.d. from pi (by index into the enumeration), every estimator
turns them into advantages A_t, and the batch gradient

    g_hat = (1/N) sum_i sum_t A_t^i s_t^i                                            (1)

is a gather and a contraction on the precomputed scores. Over many independent groups, against
the exact grad J (scale_free.py has the definitions):

    alpha  = <E g_hat, grad J> / ||grad J||^2           how much of the gradient survives
    cosine = <E g_hat, grad J> / (||E g_hat|| ||grad J||)   direction of the mean
    nvar   = tr Var(g_hat) / ||E g_hat||^2              noise per unit of signal: THE quality number
    rmse   = min_c E||c g_hat - grad J||^2 / ||grad J||^2   MSE after the best rescaling

and, labelled raw because they reward a shrunk gradient, bias^2, variance and MSE in units of
||grad J||^2. All estimators see the same groups (common random numbers), so their differences
are measured in pairs: the groups are cut into 50 blocks, the toy's sampled unit, and every
scale-free number carries a paired bootstrap interval over blocks (resampling.py), the gain over the
group mean included. Where E g_hat is known exactly (scale_free.FACTORS, and the oracles' fixed
baselines: unbiased) alpha and the cosine are exact and the gain is a ratio of raw variances.

Estimators: every entry of ``otb.ESTIMATORS`` (OTB with zero tail, ``otb_zero_tail``, included) and
the oracles of toy_env.py (``ORACLES``: fixed per-position baselines, unbiased, plus ``otb_exact_w``,
OTB fed the exact ||s_t||^2 instead of the Logit-Gradient Proxy).

Caveat: GRPO divides by the group's std; groups with identical rewards give it A = 0. Its alpha
measures that rescaling, its nvar and cosine are comparable with the others.

    python toy_harness.py                                   # the default table, under a minute
    python toy_harness.py --json t.json --plot nvar.png     # also save them (paths required)
"""
import argparse
import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

# Before torch loads OpenMP: a thread waiting for the others sleeps instead of spinning, which on a
# busy CPU made each training step 8-100x slower (docs/cost.md, "Busy machines").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

import otb
from lab.analysis import scale_free
from toy_env import ToyConfig, check_config, enumerate_toy, exact_summary, oracle_baselines

ORACLES = ("b_star", "opt_per_position", "otb_population", "otb_exact_w")
UNBIASED = ("reinforce", "rloo", "otb_loo")  # no baseline or leave-one-out: E g_hat = grad J
FIXED = ("b_star", "opt_per_position", "otb_population")  # oracle numbers per position: unbiased
SCALE_FREE = ("alpha", "cosine", "nvar", "rmse")


# =====================================================================================
# Estimators under test: otb.ESTIMATORS plus the oracles, all as rows -> advantages
# =====================================================================================

def make_estimators(en):
    """name -> f(rows (B,), group_index (B,)) -> advantages A_t (B, T)."""
    def project(fn):
        return lambda rows, gid: fn(**en.batch(rows), group_index=gid)[0]

    def fixed(b):
        return lambda rows, gid: (en.G[rows] - b[None, :]) * en.mask[rows]

    rho = torch.where(en.mask.bool(), (en.w_exact / en.w_proxy.clamp(min=1e-300)).sqrt(), 1.0)  # (M, T)

    def otb_exact_w(rows, gid):  # otb's w_t * rho_t^2 = exact ||s_t||^2
        return otb.optimal_token_baseline(**en.batch(rows), group_index=gid, is_weights=rho[rows])[0]

    ests = {name: project(fn) for name, fn in otb.ESTIMATORS.items()}
    ests.update({name: fixed(b) for name, b in oracle_baselines(en).items()})
    ests["otb_exact_w"] = otb_exact_w
    return ests


# =====================================================================================
# The bias / variance harness
# =====================================================================================

def sample_groups(en, N, groups, generator):
    """rows (groups * N,) drawn i.i.d. from pi(tau), and their group ids (contiguous)."""
    rows = torch.multinomial(en.pi, groups * N, replacement=True, generator=generator)
    return rows, torch.arange(groups).repeat_interleave(N)


def batch_gradients(en, A, rows, N, max_entries=1 << 22):
    """g_hat per group = (1/N) sum_i sum_t A_t^i s_t^i: A (G*N, T) -> (G, P).

    Each group's gradient is a weighted sum of the M*T precomputed score vectors: scatter the
    advantages into a (groups, M*T) coefficient matrix and multiply by the scores (M*T, P).
    """
    M, T, P = en.scores.shape
    G = len(rows) // N
    col = (rows[:, None] * T + torch.arange(T)).reshape(G, N * T)  # where A_t^i goes, (G, N*T)
    val = A.reshape(G, N * T) / N  # (G, N*T)
    out = []
    chunk = max(1, max_entries // (M * T))
    for g0 in range(0, G, chunk):  # a loop over memory chunks only
        coef = torch.zeros(len(col[g0:g0 + chunk]), M * T, dtype=A.dtype)  # (chunk, M*T)
        coef.scatter_add_(1, col[g0:g0 + chunk], val[g0:g0 + chunk])
        out.append(coef @ en.scores.reshape(M * T, P))  # (chunk, P)
    return torch.cat(out)


def factor_of(name, N):
    """c in E g_hat = c grad J where it is known exactly, else None (estimated)."""
    if name in scale_free.FACTORS:
        return scale_free.FACTORS[name](N)
    return 1.0 if name in FIXED else None


def block_stats(g_hat, grad_J, units=50):
    """g_hat (G, P) cut into ``units`` equal blocks of groups -> scale_free.gram_stats against grad_J."""
    G = g_hat.shape[0]
    units = min(units, G // 2)
    blocks = [scale_free.unit_summary(b) for b in g_hat[: G - G % units].chunk(units)]  # (m_u, V_u, K_u)
    return scale_free.gram_stats(torch.stack([b[0] for b in blocks]), [b[1] for b in blocks], grad_J)


def quality_columns(metrics):
    """{metric: (value, lo, hi)} -> flat columns metric, metric_lo, metric_hi (nan: unresolved)."""
    return {k + sfx: v[i] for k, v in metrics.items() for i, sfx in enumerate(("", "_lo", "_hi"))}


def out_of_range(quality, raw):
    """The stored columns that lie outside their range, for a table to mark: the scale-free ones
    scale_free.bootstrap flags, and bias2, an unbiased estimate that is negative when the squared bias
    is smaller than its noise (stored as estimated: clipping it at 0 would bias it)."""
    return [k for k in quality.get("out_of_range", []) if k in SCALE_FREE + ("gain",)] + \
        (["bias2"] if raw["bias2"] < 0 else [])


def raw_stats(g_hat, grad_J):
    """Raw (scale-dependent, never a quality by themselves) bias2, variance and MSE of g_hat (G, P)
    against grad_J (P,), with standard errors. Returns (dict, per-group squared errors (G,))."""
    G = g_hat.shape[0]
    err = g_hat - grad_J  # (G, P)
    mean_err = err.mean(0)  # (P,)
    dev = g_hat - g_hat.mean(0)  # (G, P)
    cov = dev.T @ dev / (G - 1)  # (P, P)
    variance = torch.trace(cov)  # tr Cov, unbiased
    bias2 = (mean_err ** 2).sum() - variance / G  # ||E g_hat - grad J||^2, unbiased
    se_bias2 = (4 * mean_err @ cov @ mean_err / G + 2 * (cov ** 2).sum() / G ** 2).clamp(min=0).sqrt()
    sq = (err ** 2).sum(-1)  # per-group squared error, (G,)
    dsq = (dev ** 2).sum(-1)  # per-group squared deviation, (G,)
    return {"bias2": bias2.item(), "bias2_se": se_bias2.item(),
            "variance": variance.item(), "variance_se": (dsq.std() / math.sqrt(G)).item(),
            "mse": sq.mean().item(), "mse_se": (sq.std() / math.sqrt(G)).item()}, sq


def gradient_stats(g_hat, grad_J, units=50, factor=None, replicates=1000):
    """Quality of g_hat (G, P) against the exact grad_J (P,), with 95% intervals, and raw_stats.

    Scale-free (scale_free.py): alpha, cosine, nvar = tr Var / ||E g||^2 and rmse (MSE after the
    best rescaling, in units of ||grad J||^2), each with a bootstrap interval over ``units`` blocks
    of groups (factor: the known c of E g = c grad J, which makes alpha and cosine exact).
    Returns (dict, per-group squared errors (G,)).
    """
    raw, sq = raw_stats(g_hat, grad_J)
    quality = scale_free.bootstrap({"e": block_stats(g_hat, grad_J, units)},
                                   {} if factor is None else {"e": factor}, replicates=replicates)["e"]
    return {**quality_columns({k: quality[k] for k in SCALE_FREE}), **raw,
            "out_of_range": out_of_range(quality, raw)}, sq


def measure(en, Ns=(2, 4, 8, 16, 32), groups=10000, seed=0, names=None, keep_errors=False, replicates=1000):
    """The table: one dict per (estimator, N), with the gain over group_mean (nvar ratio, paired
    bootstrap over blocks) when group_mean is measured. With keep_errors, also {(name, N): (G,) sq errors}."""
    ests = make_estimators(en)
    names = list(ests) if names is None else list(names)
    gen = torch.Generator().manual_seed(seed)
    rows_out, errors = [], {}
    for N in Ns:
        rows, gid = sample_groups(en, N, groups, gen)  # the same groups for every estimator
        tokens = en.mask[rows].sum() / groups  # tokens sampled per group
        units, block = {}, []
        for name in names:
            A = ests[name](rows, gid)  # (G*N, T)
            g_hat = batch_gradients(en, A, rows, N)  # (G, P)
            raw, sq = raw_stats(g_hat, en.grad_J)
            units[name] = block_stats(g_hat, en.grad_J)  # the same blocks of groups for every estimator
            block.append({"estimator": name, "N": N, "factor": factor_of(name, N), **raw, "tokens": tokens.item()})
            if keep_errors:
                errors[(name, N)] = sq
        factors = {e: factor_of(e, N) for e in names if factor_of(e, N) is not None}
        paired = scale_free.bootstrap(units, factors, baseline="group_mean" if "group_mean" in units else None,
                                      replicates=replicates, seed=seed + N)
        for r in block:  # the scale-free columns from the paired bootstrap
            q = paired[r["estimator"]]
            r.update(quality_columns({k: v for k, v in q.items() if k in SCALE_FREE + ("gain",)}),
                     out_of_range=out_of_range(q, r))
        rows_out += block
    return (rows_out, errors) if keep_errors else rows_out





# =====================================================================================
# Command line: print the table, --json, --plot
# =====================================================================================

def markdown_table(rows, key, title, digits=3):
    """One metric as a markdown table, estimators x N (docs/toy_bandit.md shows these, tested)."""
    Ns = sorted({r["N"] for r in rows})
    names = list(dict.fromkeys(r["estimator"] for r in rows))
    by = {(r["estimator"], r["N"]): r for r in rows}
    lines = [f"| {title} | " + " | ".join(f"N = {N}" for N in Ns) + " |", "|---" * (len(Ns) + 1) + "|"]
    lines += [f"| `{e}` | " + " | ".join(cell(by[(e, N)], key, digits) for N in Ns) + " |" for e in names]
    return "\n".join(lines)


def cell(r, k, digits=3):
    """One metric of a row (columns k, k_lo, k_hi) as scale_free.cell prints it."""
    return scale_free.cell(k, (r[k], r[k + "_lo"], r[k + "_hi"]), r.get("factor"), digits, exact=f".{digits}f")


def format_table(rows, grad_sq):
    """Text table: scale-free columns with 95% intervals first; raw MSE (units of ||grad J||^2) last."""
    lines = []
    gain = "gain" in rows[0]
    heads = ("alpha", "cosine", "nvar", "rescaled MSE") + (("gain vs group_mean",) if gain else ()) + ("raw MSE",)
    for N in sorted({r["N"] for r in rows}):
        block = [r for r in rows if r["N"] == N]
        lines.append(f"N = {N}   ({block[0]['tokens']:.1f} tokens sampled per group)")
        lines.append(f"  {'estimator':<17}" + "".join(f"{h:>29}" for h in heads))
        for r in block:
            cells = [cell(r, k) for k in SCALE_FREE + (("gain",) if gain else ())]
            cells.append(f"{r['mse'] / grad_sq:.3f} +- {r['mse_se'] / grad_sq:.3f}")
            lines.append((f"  {r['estimator']:<17}" + "".join(f"{c:>29}" for c in cells)).rstrip())
    return "\n".join(lines)


STYLE = {"otb": dict(lw=2.8, marker="o", ms=7, zorder=10, color="tab:red"),
         "group_mean": dict(lw=6, alpha=0.35, color="tab:green", zorder=1),  # wide: rloo lies on it
         "otb_zero_tail": dict(ls=(0, (4, 2)), marker="s", color="tab:orange", zorder=9),
         "otb_exact_w": dict(ls="--", marker="o", ms=4, color="k", zorder=11)}


PALETTE = ("tab:blue", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan", "navy",
           "gold", "teal", "lime", "maroon")


def plot_metric(rows, path=None, title=""):
    """N x nvar (flat for noise that falls as 1/N) against N, one line per estimator (oracles dashed),
    OTB drawn thick and on top. Saved to ``path`` if given."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.8))
    markers = itertools.cycle("sD^vP*Xhx")
    colors = itertools.cycle(PALETTE)  # one colour per estimator (STYLE's own are not in PALETTE)
    for name in dict.fromkeys(r["estimator"] for r in rows):
        pts = sorted((r["N"], *(r["nvar" + sfx] * r["N"] for sfx in ("", "_lo", "_hi")))
                     for r in rows if r["estimator"] == name and math.isfinite(r["nvar"]))
        if not pts:
            continue  # unresolved at every N
        n, y, lo, hi = zip(*pts)
        err = [[max(a - b, 0) if math.isfinite(b) else 0 for a, b in zip(y, lo)],
               [max(b - a, 0) if math.isfinite(b) else 0 for a, b in zip(y, hi)]]  # 95% bootstrap interval
        style = STYLE.get(name) or dict(marker=next(markers), ms=5, ls="--" if name in ORACLES else "-",
                                        color=next(colors))
        ax.errorbar(n, y, yerr=err, capsize=2, label=name, mfc="none", **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("group size N (responses per prompt)")
    ax.set_ylabel("N x tr Var(g) / ||E g||^2  (lower is better)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def writable_file(flag, path, suffixes):
    """An error message if ``path`` cannot be written as a file of one of ``suffixes``, else None."""
    p = Path(path)
    if p.is_dir():
        return f"{flag} {path} is a folder; give a file name"
    if p.suffix.lower() not in suffixes:
        return f"{flag} {path}: the name must end in one of {', '.join(suffixes)}"
    from lab.parse_options import unwritable  # train.py's check; imported here, as it brings transformers along
    why = unwritable(p)  # its first existing folder must be writable
    return None if why is None else f"{flag} {path}: {why}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Scale-free quality (and raw bias/variance) of policy-gradient "
                                "baselines on the enumerable toy bandit of toy_env.py.")
    for f in fields(ToyConfig):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=f.default,
                       help=f.metadata["help"] + f" (default: {f.default})")
    p.add_argument("--groups", type=int, default=10000, help="independent groups per (estimator, N) (default: 10000)")
    p.add_argument("--Ns", type=int, nargs="+", default=[2, 4, 8, 16, 32], help="group sizes N (default: 2 4 8 16 32)")
    p.add_argument("--json", default=None, help="also write the table as JSON to this file "
                   "(benchmarks/results/toy_table.json is the committed one)")
    p.add_argument("--plot", default=None, help="also save nvar against N (log-log) to this image file "
                   "(.png, .pdf, .svg, .jpg)")
    args = p.parse_args(argv)
    cfg = ToyConfig(**{f.name: getattr(args, f.name) for f in fields(ToyConfig)})
    try:
        check_config(cfg)
    except ValueError as e:
        p.error(str(e))  # one line on stderr, exit status 2
    checks = [(args.groups >= 50, f"--groups {args.groups} must be >= 50 (the intervals bootstrap blocks of "
               "at least 2 groups)"),
              (min(args.Ns) >= 2, f"--Ns {args.Ns}: every N must be >= 2 (group baselines need two responses)"),
              (not args.json or not writable_file("--json", args.json, (".json",)),
               args.json and writable_file("--json", args.json, (".json",))),
              (not args.plot or not writable_file("--plot", args.plot, PLOT_FORMATS),
               args.plot and writable_file("--plot", args.plot, PLOT_FORMATS))]
    for ok, why in checks:
        if not ok:
            p.error(why)
    return cfg, args


def main(argv=None):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # exact sums: the whole toy runs in float64
    try:
        return run(argv)
    finally:
        torch.set_default_dtype(previous)  # leave the caller's process as it was


def run(argv=None):
    cfg, args = parse_args(argv)
    command = "python toy_harness.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print("#", command.strip())
    start = time.time()
    en = enumerate_toy(cfg)
    ex = exact_summary(en)
    grad_sq = ex["grad_J_sq_norm"]
    print(f"toy: {asdict(cfg)}")
    print(f"exact: {ex['responses']} responses, {ex['parameters']} parameters, E[L] = {ex['mean_length']:.2f}, "
          f"J = {ex['J']:.4f}, ||grad J||^2 = {grad_sq:.4g}")
    print(f"exact: max_t |E||S_<=t||^2 - E[W_t]| = {ex['martingale_max_gap']:.1e}, "
          f"while max_t E| ||S_<=t||^2 - W_t | = {ex['per_sample_cross_term']:.2g}; "
          f"corr(proxy, ||s_t||^2) = {ex['proxy_correlation']:.3f}")
    print("exact one-sample tr Var with a fixed (unbiased) baseline, units of ||grad J||^2 "
          "(= nvar; divide by N for a batch):")
    print("   " + ", ".join(f"{k}: {v / grad_sq:.2f}" for k, v in ex["one_sample_variance"].items()))
    rows = measure(en, Ns=args.Ns, groups=args.groups, seed=cfg.seed)
    print(f"Monte Carlo, {args.groups} groups per N in 50 blocks; [95% bootstrap interval over blocks]. "
          f"nvar = tr Var / ||E g||^2 is the quality number (lower is better); gain = nvar(group_mean) / nvar; "
          f"raw MSE (+- s.e.) rewards a shrunk gradient:")
    print(format_table(rows, grad_sq))
    print(f"done in {time.time() - start:.1f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": command.strip(), "config": asdict(cfg),
                                               "groups": args.groups, "exact": ex, "rows": rows}, indent=1))
        print("wrote", args.json)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")  # files only, no window
        plot_metric(rows, args.plot, title=f"N x normalised variance (flat = the 1/N law)\n{cfg.policy} policy, "
                    f"K={cfg.K}, T={cfg.T}, reward={cfg.reward}, {args.groups} groups per point\n"
                    f"bars: 95% bootstrap interval over 50 blocks")
        print("wrote", args.plot)
    return rows


if __name__ == "__main__":
    main()
