"""Why OTB wins or loses: its approximations taken apart on the same responses (docs/smollm2_decomposition_protocol.md).

A variance sweep (benchmarks/horizon_sweep.py) that measured OTB beside the estimators that each undo one of
its approximations holds everything this report needs: per prompt, every estimator's gradient statistics
on the same groups, and every pool response's length, proxy energy W_T, exact ||S_i||^2, reward and group.
From them, per horizon n and group size N:

- **contrasts**: a over b = nvar(b) / nvar(a) (above 1: a has less noise per unit of signal), on the same
  bootstrap draws of prompts as the sweep's table (paired), with the eq. (4') set of resampling.py and a
  two-sided bootstrap P value for a ratio of 1,

      P = min(1, 2 min(#{num* <= den*}, #{num* >= den*}) / R)                                         (1)

  read from the replicates of the ratio's numerator and denominator, no division;
- **the primary** (otb_loo over otb: does the self-weight cost OTB its gain?) and **five secondaries**
  with Holm's correction (lab/analysis/stats.holm) at N = 4, the same contrasts described at N = 16;
- **descriptives** of the responses: the proxy W_T against the exact ||S_i||^2 (Pearson, Spearman, Pearson
  of the logs), the lengths by outcome, the share of mixed groups with exactly one success, how many of a
  group's rows are active where each token sits, and the seconds of each phase.

    python benchmarks/decomposition.py --from-saved benchmarks/results/smollm2_decomposition
    python benchmarks/decomposition.py --from-saved DIR --replay-of benchmarks/results/smollm2_variance

horizon_sweep.py writes this report (decomposition.md, decomposition.json) beside its tables whenever
its estimators include the primary pair; ``--replay-of`` compares the group_mean and otb statistics with
an earlier sweep's, which tells whether the two sampled the same responses.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.analysis import resampling, scale_free, stats  # noqa: E402
from benchmarks import token_lesson  # noqa: E402
from benchmarks.sweep_records import read_responses, read_saved  # noqa: E402

PRIMARY = ("otb_loo", "otb")  # a over b: nvar(otb) / nvar(otb_loo)
SECONDARY = (("otb_loo", "group_mean"), ("otb_loo", "seq_proxy_loo"), ("seq_exact_loo", "seq_proxy_loo"),
             ("opo", "group_mean"), ("otb_zero_tail", "otb"))
QUESTIONS = {  # what each contrast asks, for the tables
    PRIMARY: "does the self-weight cost OTB its gain?",
    SECONDARY[0]: "does an unbiased token-level baseline beat the group mean?",
    SECONDARY[1]: "does the per-token form beat one baseline per response, same proxy energy?",
    SECONDARY[2]: "the exact energy against the proxy, one baseline per response",
    SECONDARY[3]: "does OPO beat the group mean?",
    SECONDARY[4]: "does verl's zero tail help OTB?",
}
PRIMARY_WORDS = dict(
    above="above 1: dropping the own term improves OTB here; the self-weight costs more signal than the "
          "variance it removes",
    below="below 1: the self-weight helps OTB here too; its loss lies elsewhere",
    covers="covers 1: no difference shown between OTB with and without its self-weight",
    edge="at the Monte Carlo edge: not decided")
PRIMARY_N = 4


def bootstrap_p(num_r, den_r):
    """Eq. (1): the two-sided bootstrap P value of num / den = 1 from paired replicates."""
    x, y = torch.as_tensor(num_r, dtype=torch.float64), torch.as_tensor(den_r, dtype=torch.float64)
    ok = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[ok], y[ok]
    if not x.numel():
        return math.nan
    return min(1.0, 2 * min((x <= y).double().mean().item(), (x >= y).double().mean().item()))


def cell_evaluations(grams_by_cell, replicates=2000, seed_evals=None):
    """{(n, N): ([(point, boot) per seed], factors)}: every estimator evaluated on the bootstrap draws of
    horizon_sweep.seed_evaluations (the same draws as the sweep's table, so a contrast here is paired with its
    gains); ``seed_evals``: that function's result where the caller has it already."""
    if seed_evals is None:
        from benchmarks.horizon_sweep import seed_evaluations  # here: horizon_sweep writes this report
        seed_evals = seed_evaluations(grams_by_cell, replicates)
    return {key: ([(point, boot) for _, point, boot, _, _ in by_seed.values()], next(iter(by_seed.values()))[3])
            for key, by_seed in seed_evals.items()}


def contrast(evals, a, b, factors, level=0.95):
    """a over b = nvar(b) / nvar(a) over the seeds' strata: value, eq. (4') set, verdict against 1, P (eq. 1)."""
    num, den, num_r, den_r = scale_free.gain_parts(evals, a, b, factors)
    return dict(a=a, b=b, ratio=list(resampling.ratio_set(num, den, num_r, den_r, level=level, low=0.0)),
                verdict=resampling.replicate_verdict(num_r, den_r, level=level), p=bootstrap_p(num_r, den_r))


def contrasts(evaluations):
    """Per (n, N): the primary and the secondaries (Holm over the secondaries at N = PRIMARY_N; described
    at other N), those whose estimators the sweep measured."""
    out = []
    for (n, N), (evals, factors) in sorted(evaluations.items()):
        have = set(evals[0][0])
        rows = [dict(contrast(evals, a, b, factors), n=n, N=N, role="primary" if (a, b) == PRIMARY else "secondary",
                     question=QUESTIONS[(a, b)]) for a, b in (PRIMARY, *SECONDARY) if {a, b} <= have]
        second = [r for r in rows if r["role"] == "secondary"]
        for r, adjusted in zip(second, stats.holm([r["p"] for r in second])):
            r["p_holm"] = adjusted
            r["tested"] = N == PRIMARY_N
        out += rows
    return out


def descriptive(resp, group_sizes=(4, 16)):
    """What the responses of one cell show: resp = {name: (P, M)} from sweep_records.read_responses."""
    L, W, S, R = (resp[k].double().reshape(-1) for k in ("length", "W_T", "S_sq", "R"))  # over every response
    logs = (W > 0) & (S > 0)
    out = dict(responses=len(L), success=R.mean().item(),
               proxy_vs_exact=dict(pearson=stats.pearson(W, S), spearman=stats.spearman(W, S),
                                   pearson_of_logs=stats.pearson(W[logs].log(), S[logs].log())),
               length_vs_exact=dict(pearson=stats.pearson(L, S), spearman=stats.spearman(L, S),
                                    pearson_of_logs=stats.pearson(L[logs].log(), S[logs].log())),
               mean_length=dict(successes=L[R == 1].mean().item() if (R == 1).any() else math.nan,
                                failures=L[R == 0].mean().item() if (R == 0).any() else math.nan),
               mean_energy=dict(W_T=W.mean().item(), S_sq=S.mean().item()), groups={})
    perm = resp["perm"].long()  # (P, M)
    for N in group_sizes:
        if perm.shape[1] % N:
            continue
        lengths = torch.gather(resp["length"].double(), 1, perm).reshape(-1, N)  # (groups, N)
        wins = torch.gather(resp["R"].double(), 1, perm).reshape(-1, N)
        k = wins.sum(-1)  # successes per group
        mixed = (k > 0) & (k < N)
        T = int(lengths.max().item())
        active = (torch.arange(T)[None, None] < lengths[..., None]).double()  # (groups, N, T)
        count = active.sum(1, keepdim=True).expand_as(active)  # rows active at t, per token
        tokens = active.bool()
        success_tokens = tokens & (wins[..., None] == 1)
        out["groups"][f"N{N}"] = dict(
            groups=len(k), mixed=mixed.double().mean().item(),
            one_success_of_mixed=((k == 1) & mixed).double().sum().item() / max(mixed.sum().item(), 1),
            rows_active_per_token=dict(successes=count[success_tokens].mean().item() if success_tokens.any() else math.nan,
                                       failures=count[tokens & (wins[..., None] == 0)].mean().item()
                                       if (tokens & (wins[..., None] == 0)).any() else math.nan),
            success_tokens_alone=(count[success_tokens] == 1).double().mean().item() if success_tokens.any() else math.nan,
            tokens_alone=(count[tokens] == 1).double().mean().item())
    out["seconds_per_prompt"] = {k[len("timing."):]: resp[k].double().nanmean().item() for k in resp
                                 if k.startswith("timing.")}
    out["seconds_per_prompt"]["total"] = resp["seconds"].double().mean().item() if "seconds" in resp else math.nan
    return out


def replay(grams_by_cell, earlier, estimators=("group_mean", "otb")):
    """Does this sweep hold the same responses as ``earlier`` (another saved sweep)? Per shared (n, seed) and
    N: the largest relative difference of the per-prompt tr Var of ``estimators`` over their shared prompts
    (float64 in both files). {cell: {'N4': difference}}; identical responses give differences near float32
    rounding, others differences of order 1."""
    _, old = read_saved(earlier)
    out = {}
    for cell, grams in grams_by_cell.items():
        if cell not in old:
            continue
        for (e, N), s in grams.items():
            if e in estimators and (e, N) in old[cell]:
                a, b = s["V"], old[cell][(e, N)]["V"]
                U = min(len(a), len(b))
                diff = ((a[:U] - b[:U]).abs() / b[:U].abs().clamp_min(1e-300)).max().item()
                key = f"n{cell[0]}_seed{cell[1]}"
                out.setdefault(key, {})[f"{e}/N{N}"] = dict(prompts=U, max_relative_difference=diff)
    return out


def analyse(folder, replicates=2000, earlier=None, seed_evals=None):
    """The whole report of a saved sweep (finished or not) as a dict; seed_evals as cell_evaluations'."""
    saved, grams = read_saved(folder)
    responses = read_responses(folder)
    evaluations = cell_evaluations(grams, replicates, seed_evals)
    sizes = {f"n{n}_seed{s}": next(iter(g.values()))["V"].shape[0] for (n, s), g in grams.items()}
    return dict(command=saved["command"], prompts=sizes, replicates=replicates,
                unfinished=any(c.get("partial") for c in saved["checkpoints"]),
                contrasts=contrasts(evaluations),
                descriptive={f"n{n}_seed{s}": descriptive(r) for (n, s), r in sorted(responses.items())},
                replay=replay(grams, earlier) if earlier else None,
                lessons={f.stem: dict(token_lesson.load(f), summary=token_lesson.summary(token_lesson.load(f)))
                         for f in sorted(Path(folder).glob("lesson_n*_seed*.json"))})


def fmt_ratio(c):
    return resampling.fmt_set(*c["ratio"], low=0.0, suffix="x") + (" (edge)" if c["verdict"] == "edge" else "")


def fmt_p(p):
    return "nan" if not math.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def markdown(report):
    """decomposition.md from ``analyse``'s dict."""
    lines = ["# Where OTB's gain goes: its approximations on the same responses\n",
             f"`{report['command']}`" + ("  # unfinished: the prompts recorded so far" if report["unfinished"] else ""),
             "", "Prompts per cell: " + ", ".join(f"{k}: {v}" for k, v in report["prompts"].items())
             + f"; {report['replicates']} bootstrap draws of prompts, the same for every estimator (paired). "
             "a over b = nvar(b) / nvar(a): above 1 when a has less noise per unit of signal. Protocol: "
             "docs/smollm2_decomposition_protocol.md.\n"]
    interim = report["unfinished"]  # the protocol's verdicts are read on the whole run only
    if interim:
        lines.append("**Interim**: the run is not finished. The numbers below are those of the prompts recorded so "
                     "far; no verdict is drawn from them (the readings say 'interim').\n")
    primary = [c for c in report["contrasts"] if c["role"] == "primary"]
    for c in primary:
        if c["N"] == PRIMARY_N:
            lines += [f"## The primary question, n = {c['n']}, N = {c['N']}: {c['question']}\n",
                      f"nvar(otb) / nvar(otb_loo) = **{fmt_ratio(c)}** (bootstrap P {fmt_p(c['p'])})"
                      + (": interim, no verdict.\n" if interim else f": {PRIMARY_WORDS[c['verdict']]}.\n")]
    lines += ["## The contrasts\n",
              "Secondaries at N = 4 tested with Holm's correction over the five; at other N described, not tested.\n",
              "| n | N | a over b | question | ratio [95% set] | P | Holm P | reading |", "|---|---|---|---|---|---|---|---|"]
    for c in report["contrasts"]:
        holm = fmt_p(c["p_holm"]) if "p_holm" in c else "-"
        if c["role"] == "primary":
            reading = ("interim" if interim else "primary: " + c["verdict"]) if c["N"] == PRIMARY_N else "described"
        elif c["tested"] and interim:
            reading = "interim"
        elif c["tested"]:
            reading = ("resolved: " + ("above 1" if c["ratio"][0] > 1 else "below 1")) if c["p_holm"] <= 0.05 \
                else "not resolved after Holm"
        else:
            reading = "described"
        lines.append(f"| {c['n']} | {c['N']} | {c['a']} over {c['b']} | {c['question']} | {fmt_ratio(c)} | "
                     f"{fmt_p(c['p'])} | {holm} | {reading} |")
    lines.append("\nEvery estimator's gain over the group mean, alpha and cosine: table.md, beside this file.")
    for cell, d in report["descriptive"].items():
        pe, le = d["proxy_vs_exact"], d["length_vs_exact"]
        lines += [f"\n## The responses ({cell}, {d['responses']} of them)\n",
                  f"- success {d['success']:.2f}; mean length {d['mean_length']['successes']:.1f} tokens for a success, "
                  f"{d['mean_length']['failures']:.1f} for a failure;",
                  f"- the proxy W_T against the exact ||S_i||^2: Pearson {pe['pearson']:.2f}, Spearman "
                  f"{pe['spearman']:.2f}, Pearson of the logs {pe['pearson_of_logs']:.2f}; the length against "
                  f"||S_i||^2: {le['pearson']:.2f}, {le['spearman']:.2f}, {le['pearson_of_logs']:.2f};"]
        for N, g in d["groups"].items():
            lines.append(f"- {N}: {g['mixed']:.2f} of the groups are mixed, {g['one_success_of_mixed']:.2f} of those "
                         f"hold exactly one success; a success's token has {g['rows_active_per_token']['successes']:.2f} "
                         f"of the group's rows active at its position (a failure's {g['rows_active_per_token']['failures']:.2f}); "
                         f"{g['success_tokens_alone']:.2f} of successes' tokens run alone;")
        secs = d["seconds_per_prompt"]
        lines.append("- seconds per prompt: " + ", ".join(f"{k} {v:.0f}" for k, v in secs.items() if math.isfinite(v)) + ".")
    if report["replay"] is not None:
        lines.append("\n## Replay of the earlier sweep\n")
        for cell, by in report["replay"].items():
            lines.append(f"- {cell}: " + "; ".join(f"{k} over {v['prompts']} prompts, largest relative difference "
                                                   f"of tr Var {v['max_relative_difference']:.2g}" for k, v in by.items()))
    for name, lesson in report["lessons"].items():
        s = lesson["summary"]
        lines += [f"\n## One group, token by token ({name}.png)\n",
                  f"The first N = 4 group with exactly one success (prompt {lesson['prompt']}): the success has "
                  f"{s['success_tokens']} tokens and runs alone from position {s['alone_from']}. Its mean advantage "
                  "while other rows are active, and once it runs alone: " + "; ".join(
                      f"{e} {v['shared']:+.3f}, {v['alone']:+.3f}" for e, v in s["mean_advantage"].items()) + "."]
    lines.append("\nRho over n needs two horizons: this report reads one horizon per cell and gives none.")
    return "\n".join(lines) + "\n"


def write(out, report):
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "decomposition.json").write_text(json.dumps(report, indent=1))
    (Path(out) / "decomposition.md").write_text(markdown(report))
    for name, lesson in report["lessons"].items():
        (Path(out) / f"{name}.json").write_text(json.dumps({k: v for k, v in lesson.items() if k != "summary"}, indent=1))
        import matplotlib.pyplot as plt
        plt.close(token_lesson.draw(lesson, Path(out) / f"{name}.png"))
    print(markdown(report))
    print(f"wrote {out}/decomposition.json, decomposition.md")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-saved", required=True, help="a folder with a saved sweep (finished, or recording)")
    p.add_argument("--out", default="", help="where to write decomposition.md and .json (default: --from-saved)")
    p.add_argument("--replicates", type=int, default=2000, help="bootstrap draws of prompts")
    p.add_argument("--replay-of", default="", help="an earlier saved sweep: compare its group_mean and otb "
                   "statistics with this one's (the same responses, or not)")
    args = p.parse_args(argv)
    if args.replicates < 100:
        p.error(f"--replicates {args.replicates}: at least 100")
    for option, folder in (("--from-saved", args.from_saved), ("--replay-of", args.replay_of)):
        if folder and not any((Path(folder) / f).is_file() for f in ("sweep.json", "results.json")):
            p.error(f"{option} {folder}: no sweep saved there (sweep.json or results.json of horizon_sweep.py)")
    report = analyse(args.from_saved, args.replicates, args.replay_of or None)
    write(args.out or args.from_saved, report)
    return report


if __name__ == "__main__":
    main()
