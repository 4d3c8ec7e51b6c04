"""The variance sweep's tables and figure: what benchmarks/horizon_sweep.py prints and writes from its
analysis (table.md, summary.md, gain_vs_horizon.png), and the compact tables the docs show.

Every number comes from the analysis' rows (horizon_sweep.analyse, horizon_contrasts); this module only
formats: a gain as its 95% set with its verdict (resampling.fmt_set), alpha and the cosine as
scale_free.cell prints them (clipped to their range and marked), and the words of each verdict.
"""
import math

from lab.analysis import resampling, scale_free


VERDICT_WORDS = dict(above="grows with n", below="shrinks with n", covers="not shown to change with n",
                     edge="at the Monte Carlo edge: not decided")


def contrasts_md(contrasts):
    """The horizon contrasts as a table: estimator, N, the pair of horizons, rho's 95% set and its verdict."""
    lines = ["| estimator | N | gain(n_hi) / gain(n_lo) | rho [95% set] | the gain |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {c['estimator']} | {c['N']} | n = {c['n_hi']} / n = {c['n_lo']} | "
                              + ("- | 1 at every n by construction (no sampling error): no rho |" if c.get("fixed") else
                                 f"{gain_cell(c['ratio'], '', c['verdict'])} | {VERDICT_WORDS[c['verdict']]} |")
                              for c in contrasts])


def summary_md(summary, contrasts, checkpoints, sizes, command, estimator="otb", baseline="group_mean"):
    """summary.md: the protocol's two questions answered from the analysis (docs/smollm2_variance_protocol.md):
    per (N, n) whether ``estimator``'s gain over ``baseline`` lies above 1, and whether it grows with n.
    sizes: {(n, seed): prompts}. '' without the estimator."""
    gains = {(s["N"], s["n"]): s for s in summary if s["estimator"] == estimator and "gain" in s}
    if not gains:
        return ""
    Ns, ns = sorted({N for N, _ in gains}), sorted({n for _, n in gains})
    lines = [f"# {estimator} against {baseline}: the gain in normalised variance and its growth with n\n",
             f"`{command}`\n", "| n | prompts | pool success | mean response tokens | " + " | ".join(
                 f"gain at N = {N} [95% set]" for N in Ns) + " |", "|---" * (4 + len(Ns)) + "|"]
    for n in ns:
        mean = {k: [c[k] for c in checkpoints if c["n"] == n and k in c] for k in ("success", "mean_length")}
        mean = {k: sum(v) / len(v) if v else math.nan for k, v in mean.items()}  # over the seeds
        lines.append(f"| {n} | {sum(u for (m, _), u in sizes.items() if m == n)} | "
                     f"{mean['success']:.2f} | {mean['mean_length']:.1f} | "
                     + " | ".join(gain_cell(gains[(N, n)]["gain"], "x", gains[(N, n)]["verdict"]) for N in Ns) + " |")
    lines.append("\n## Question 1: does the gain exceed 1?\n")
    for n in ns:
        above = all(gains[(N, n)]["verdict"] == "above" for N in Ns)
        lines.append(f"- n = {n}: " + "; ".join(f"N = {N}: {VERDICT_WORDS_GAIN[gains[(N, n)]['verdict']]}"
                                                  for N in Ns)
                     + (f". {estimator} beats {baseline} at every N." if above else
                        ". Not shown at every N (a claim at this n needs every N above 1)."))
    mine = [c for c in contrasts if c["estimator"] == estimator]
    if mine:
        lines.append("\n## Question 2: does the gain grow with n?\n\nrho = gain(n_hi) / gain(n_lo), "
                     "prompts resampled jointly across n (horizon_sweep.horizon_contrasts).\n")
        lines.append(contrasts_md(mine))
    return "\n".join(lines) + "\n"


VERDICT_WORDS_GAIN = dict(above="above 1", below="below 1", covers="not shown to differ from 1",
                          edge="at the Monte Carlo edge")


def gain_cell(g, suffix="x", verdict=None):
    """A gain's set; ' (edge)' where its verdict against 1 is within Monte Carlo error."""
    return resampling.fmt_set(*g, low=0.0, suffix=suffix) + (" (edge)" if verdict == "edge" else "")


def random_effects_cell(r):
    """'gain [lo, hi]; Q = q (p), I2' of a cell's random-effects check, '-' where a seed has no log gain
    or where there is one seed (no spread between seeds to measure: Q's p value is undefined)."""
    re = r["random_effects"]
    if re.get("exact"):
        return "- (no sampling error)"
    if re.get("df") == 0:
        return "- (one seed)"
    if math.isnan(re["gain"][0]):
        return "- (a seed not resolved)"
    return (f"{resampling.fmt(*re['gain'], suffix='x')}; Q = {re['Q']:.1f} (p {re['p']:.2f}), "
            f"I\u00b2 {100 * re['I2']:.0f}%")


def head_to_head_md(rows, a="otb_tir", b="otb"):
    lines = [f"| n | N | nvar({b}) / nvar({a}), seeds pooled [95%] | random effects over seeds | "
             "per seed [95%] |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {r['n']} | {r['N']} | {gain_cell(r['gain'], 'x', r['verdict'])} | "
                              f"{random_effects_cell(r)} | " + "; ".join(
                                  gain_cell(g, "", v) for g, v in zip(r["per_seed"], r["per_seed_verdict"])) + " |"
                              for r in rows])


def table_md(summary):
    """The table: the seeds pooled, the random-effects check, each seed, alpha, cosine, raw variance."""
    lines = ["| n | N | estimator | gain over group_mean, seeds pooled [95%] | random effects over seeds | "
             "per seed [95%] | alpha | cosine | raw tr Var / group_mean's |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if "gain" not in s:
            continue
        per_seed = "; ".join(gain_cell(g, "", v) for g, v in zip(s["per_seed"], s["per_seed_verdict"]))
        lines.append(f"| {s['n']} | {s['N']} | {s['estimator']} | {gain_cell(s['gain'], 'x', s['verdict'])} | "
                     f"{random_effects_cell(s)} | "
                     f"{per_seed} | {scale_free.cell('alpha', s['alpha'], s['factor'])} | "
                     f"{scale_free.cell('cosine', s['cosine'], s['factor'])} | {s['raw_var_ratio']:.2f} |")
    return "\n".join(lines)


TOOL_ROWS = ("reinforce", "rloo", "otb", "otb_tir")  # docs/tool_use.md's columns (--task calculator)


def compact_md(summary, estimators=("otb", "otb_zero_tail", "otb_loo", "reinforce", "grpo")):
    """The gains (seeds pooled) as one N x n table, one row per n (docs/variance.md shows it, tested)."""
    lines = ["| N | n | " + " | ".join(estimators) + " |", "|---" * (len(estimators) + 2) + "|"]
    cell = {(s["estimator"], s["N"], s["n"]): (s["gain"], s["verdict"]) for s in summary if "gain" in s}
    for N in sorted({s["N"] for s in summary}):
        for n in sorted({s["n"] for s in summary}):
            lines.append(f"| {N} | {n} | " + " | ".join(gain_cell(*cell[(e, N, n)][:1], "x", cell[(e, N, n)][1])
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


def plot(summary, path=None, task="periodic"):
    """Gain over group_mean against n, one panel per N: filled, the seeds pooled with their 95% set (an
    arrow from the lower end where only that end is resolved); hollow, each seed's own gain where its
    set is bounded. Returns the figure."""
    import matplotlib.pyplot as plt
    rows = [s for s in summary if "gain" in s]
    Ns = sorted({s["N"] for s in rows})
    fig, axes = plt.subplots(1, len(Ns), figsize=(5.2 * len(Ns), 4.2), squeeze=False)
    style = {"otb": dict(lw=2.6, marker="o", zorder=5), "otb_zero_tail": dict(ls="--", marker="s"),
             "otb_loo": dict(ls=":", marker="D"), "reinforce": dict(marker="^"), "rloo": dict(marker="v"),
             "grpo": dict(marker="x"), "otb_tir": dict(lw=2.6, marker="*", ms=10, zorder=6)}
    ns = sorted({s["n"] for s in rows})
    for ax, N in zip(axes[0], Ns):
        for i, (e, st) in enumerate(style.items()):
            shift = 1.03 ** (i - 2.5)  # side by side, not on top of each other
            cells = sorted((s["n"], *s["gain"]) for s in rows if s["estimator"] == e and s["N"] == N)
            bounded = [(n * shift, g, lo, hi) for n, g, lo, hi in cells if 0 < lo and hi < math.inf]
            lower = [(n * shift, lo) for n, g, lo, hi in cells if 0 < lo and hi == math.inf]
            if bounded:
                x, g, lo, hi = zip(*bounded)
                ax.errorbar(x, g, yerr=[[a - b for a, b in zip(g, lo)], [b - a for a, b in zip(g, hi)]], capsize=3,
                            label=e, color=f"C{i}", **st)
            if lower:  # only a lower bound: an arrow up from it
                x, lo = zip(*lower)
                ax.errorbar(x, lo, yerr=[[0] * len(lo), [v * 0.5 for v in lo]], lolims=True, ls="none",
                            color=f"C{i}", marker="_", label=None if bounded else f"{e} (lower bound)")
            seeds = [(s["n"] * shift, g[0]) for s in rows if s["estimator"] == e and s["N"] == N
                     for g in s["per_seed"] if 0 < g[1] and g[2] < math.inf]
            if seeds:
                ax.plot(*zip(*seeds), ls="none", marker=st["marker"], mfc="none", color=f"C{i}", alpha=0.6)
        ax.axhline(1.0, color="k", lw=0.8, label="group_mean")
        ax.set(xscale="log", yscale="log", xlabel=dict(periodic="answer length n (periodic copy)",
                                                       count="n, numbers listed (count)").get(
                   task, "k, numbers added with k - 1 calculator calls"),
               ylabel="nvar(group_mean) / nvar(estimator)", title=f"N = {N}: gain over the group mean (> 1 is "
               "better)\nfilled: seeds pooled, 95% set (arrow: lower bound only); hollow: one seed")
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


def model_note(args):
    """'' for the tiny model; else the model, its temperature and the projection (a sweep's table says it)."""
    model, k = getattr(args, "model", "tiny"), getattr(args, "project", 0)
    if model == "tiny" and not k:
        return ""
    return (f"; model {model}, temperature {args.temperature}, " + (f"gradients projected to k = {k} numbers "
            "(common.sketch: inner products kept in expectation)" if k else "exact gradients"))


def took(seconds):
    """'3279 s', or for sweeps measured side by side '1200 s + 1300 s (side by side)'."""
    if isinstance(seconds, list):
        return " + ".join(f"{t:.0f} s" for t in seconds) + (" (side by side)" if len(seconds) > 1 else "")
    return f"{seconds:.0f} s"
