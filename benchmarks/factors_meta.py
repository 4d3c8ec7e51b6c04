"""The factors sweep's headline, nvar(otb) / nvar(otb_tir) at N = 4 and 16, read across its seeds.

The sweep (docs/tool_use.md, Addenda 3-4) reports a *stratified pooled ratio*: each side summed over
the seeds, prompts resampled within each seed (resampling.py eq. (5)). That is a statement about these
checkpoints, weighted by their signal. Whether a *new* checkpoint would see the same ratio is a
question about the spread between seeds, which this script answers from the saved sufficient
statistics alone (benchmarks/results/factors_sweep_128 and factors_replication, stats.npz), with
the same bootstrap draws as the sweep's own tables (horizon_sweep.seed_evaluations):

    y_s, se_s     each seed's log ratio and its bootstrap standard error (resampling.log_ratio_se)
    DL            DerSimonian-Laird random effects over the seeds whose ratio resolves (stats eq. (6))
    HK            the same mean with the Hartung-Knapp interval, t with k - 1 df (eq. (6'))
    PI            the 95% prediction interval of a new seed's ratio, t with k - 2 df (eq. (6''))

all on the log scale and printed as ratios.

    python benchmarks/factors_meta.py --out benchmarks/results/factors_meta
"""
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import horizon_sweep as hs  # noqa: E402
from benchmarks.cli import RUNS, out_folder, parser, write_results  # noqa: E402
from lab.analysis import resampling, scale_free, stats  # noqa: E402
from lab.machine import NOT_RECORDED, kept_provenance  # noqa: E402

FOLDERS = {"primary (seeds 0-5)": "benchmarks/results/factors_sweep_128",
           "replication (seeds 6-11)": "benchmarks/results/factors_replication"}
A, B = "otb_tir", "otb"  # nvar(B) / nvar(A): above 1 when aligning by action lowers the variance


def per_seed(folder, replicates=2000):
    """{N: {seed: (evaluation, y_s, se_s)}} for one saved sweep (n = 3)."""
    grams = hs.load_grams(ROOT / folder / "stats.npz")
    out = {}
    for (n, N), by_seed in hs.seed_evaluations(grams, replicates).items():
        for seed, (_, point, boot, _, _) in by_seed.items():
            num, den, num_r, den_r = scale_free.gain_parts([(point, boot)], A, B, {})
            y = math.log(num / den) if num > 0 and den > 0 else math.nan
            out.setdefault(N, {})[seed] = ((point, boot), y, resampling.log_ratio_se(num_r, den_r))
    return out


def summarise(cells):
    """The pooled ratio and DL / HK / PI over the seeds (evaluation, y, se) whose ratio resolves."""
    evals = [ev for ev, _, _ in cells]
    num, den, num_r, den_r = scale_free.gain_parts(evals, A, B, {})
    pooled = resampling.ratio_set(num, den, num_r, den_r, low=0.0)
    ok = [(y, se) for _, y, se in cells if math.isfinite(y) and math.isfinite(se)]
    ys, ses = [y for y, _ in ok], [se for _, se in ok]
    dl, hk = stats.random_effects(ys, ses), stats.hartung_knapp(ys, ses)
    pi = stats.prediction_interval(ys, ses)
    ex = lambda v: math.exp(v) if math.isfinite(v) else math.nan  # noqa: E731
    return dict(seeds=len(cells), resolved=len(ok), y=[y for _, y, _ in cells], se=[se for _, _, se in cells],
                pooled=list(pooled), dl=[ex(dl[k]) for k in ("mean", "lo", "hi")],
                hk=[ex(hk[k]) for k in ("mean", "lo", "hi")], pi=[ex(pi[0]), ex(pi[1])],
                I2=dl["I2"], Q=dl["Q"], p=dl["p"], tau2=dl["tau2"])


def analyse(replicates=2000):
    seeds = {name: per_seed(folder, replicates) for name, folder in FOLDERS.items()}
    rows = []
    for N in (4, 16):
        sets = {name: list(s[N].values()) for name, s in seeds.items()}
        sets["all 12 seeds"] = [c for name in FOLDERS for c in sets[name]]
        sets["primary without seed 3 (post hoc)"] = [c for s, c in seeds["primary (seeds 0-5)"][N].items() if s != 3]
        for name, cells in sets.items():
            rows.append(dict(N=N, seeds_set=name, **summarise(cells)))
    return rows


def table(rows):
    f = lambda v: f"{v:.2f}" if math.isfinite(v) else "-"  # noqa: E731
    lines = ["| N | seeds | pooled ratio [95%] (these checkpoints) | seeds resolved | DerSimonian-Laird [95% z] | "
             "Hartung-Knapp [95% t] | I² | prediction interval for a new seed [95%] |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['seeds_set']} | {resampling.fmt_set(*r['pooled'], low=0.0)} | {r['resolved']} of "
                     f"{r['seeds']} | {f(r['dl'][0])} [{f(r['dl'][1])}, {f(r['dl'][2])}] | "
                     f"{f(r['hk'][0])} [{f(r['hk'][1])}, {f(r['hk'][2])}] | {100 * r['I2']:.0f}% | "
                     f"[{f(r['pi'][0])}, {f(r['pi'][1])}] |")
    return lines


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--out", type=out_folder, default=str(RUNS / "factors_meta"),
                   help="where to write (the committed tables: benchmarks/results/factors_meta)")
    args = p.parse_args(argv)
    rows = analyse()
    command = "python benchmarks/factors_meta.py --out benchmarks/results/factors_meta"
    text = "\n".join(["# nvar(otb) / nvar(otb_tir) across the factors sweep's seeds", "", f"`{command}`  ",
                      "From the saved stats.npz of " + " and ".join(FOLDERS.values()) + ", with the sweep's own "
                      "bootstrap draws (2000). Random effects over the seeds whose ratio resolves (the log scale "
                      "needs a ratio bounded away from 0).", ""] + table(rows)) + "\n"
    sources = {}  # the sweeps read: the machine and the code that measured each
    for folder in FOLDERS.values():
        saved = json.loads((ROOT / folder / "results.json").read_text())
        sources[folder] = dict(machine=saved.get("machine", NOT_RECORDED), provenance=kept_provenance(saved))
    record = json.loads(json.dumps(dict(command=command, sources=sources, rows=rows)))
    write_results(Path(args.out), "results", record, text, md_stem="summary")
    return rows


if __name__ == "__main__":
    main()
