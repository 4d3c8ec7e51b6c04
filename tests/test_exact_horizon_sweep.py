"""The horizon sweep's analysis (benchmarks/horizon_sweep.py): seeds pooled as strata with a
random-effects check, one-sided sets, verdicts that do not turn with the bootstrap's seed, and the
saved sufficient statistics re-analysed to the committed files, up to another CPU's rounding (tests/saved.py)."""
import math
from pathlib import Path

import pytest
import torch

from lab.analysis import scale_free
from lab.analysis import stats
import tool_use
from benchmarks import horizon_sweep as hs
from benchmarks import sweep_records as records, sweep_report as report
from saved import same_record, same_text


def two_seeds():
    """Two checkpoints of 6 prompts; group_mean, reinforce (known factors) and otb (estimated signal)."""
    gen = torch.Generator().manual_seed(0)
    grams = {}
    for seed, scale in ((0, 1.0), (1, 3.0)):
        refs = torch.randn(6, 5, generator=gen, dtype=torch.float64) + 2
        grams[(64, seed)] = {(e, 4): scale_free.gram_stats(
            refs * c + 0.3 * torch.randn(6, 5, generator=gen, dtype=torch.float64),
            scale * (torch.rand(6, generator=gen, dtype=torch.float64) + v), refs)
            for e, c, v in [("group_mean", 0.75, 3.0), ("reinforce", 1.0, 1.0), ("otb", 0.6, 0.5)]}
    return grams


def test_seeds_are_pooled_as_strata_with_a_random_effects_check():
    # Known factors: the pooled gain is (sum_s V_gm,s) / (0.75^2 sum_s V_re,s) exactly (signal cancels),
    # each seed's is its own variance ratio; DerSimonian-Laird runs on the seeds' log gains.
    grams = two_seeds()
    rows, summary, evaluations = hs.analyse(grams, replicates=400)
    V = {(e, s): grams[(64, s)][(e, 4)]["V"].mean().item() for e in ("group_mean", "reinforce") for s in (0, 1)}
    r = next(x for x in summary if x["estimator"] == "reinforce")
    pooled = (V[("group_mean", 0)] + V[("group_mean", 1)]) / (V[("reinforce", 0)] + V[("reinforce", 1)]) / 0.75 ** 2
    assert r["gain"][0] == pytest.approx(pooled, rel=1e-12)
    assert [g[0] for g in r["per_seed"]] == pytest.approx([V[("group_mean", s)] / V[("reinforce", s)] / 0.75 ** 2
                                                            for s in (0, 1)], rel=1e-12)
    assert r["gain"][1] < r["gain"][0] < r["gain"][2] and r["seeds"] == 2
    # the random-effects row is stats.random_effects of log(per-seed gain) with each seed's bootstrap s.e.
    ses = []
    for s in (0, 1):
        _, pt, bt, f, _ = evaluations[(64, 4)][s]
        _, _, num, den = scale_free.gain_parts([(pt, bt)], "reinforce", "group_mean", f)
        ses.append((num.log() - den.log()).std().item())
    re = stats.random_effects([math.log(g[0]) for g in r["per_seed"]], ses)
    assert r["random_effects"]["gain"] == pytest.approx([math.exp(re[k]) for k in ("mean", "lo", "hi")])
    assert r["random_effects"]["Q"] == pytest.approx(re["Q"])
    # no row pools across horizons, and the verdicts are those of the printed sets
    assert {x["n"] for x in summary} == {64} and "pooled" not in report.compact_md(summary, estimators=("otb", "reinforce"))
    assert hs.verdicts(summary, [])[("gain", "reinforce", 4, 64)] == r["verdict"]


def test_a_weak_signal_gives_a_one_sided_set_not_a_number():
    g = dict(estimator="otb", N=4, n=64, seeds=3, factor=None, gain=[3.0, 1.4, math.inf], verdict="above",
             per_seed=[[2.0, 0.0, math.inf], [3.0, 1.1, 9.0], [4.0, 0.5, 8.0]],
             per_seed_verdict=["covers", "above", "covers"], random_effects=dict(gain=[math.nan] * 3),
             alpha=[0.5, 0.4, 0.6], cosine=[1.02, 0.9, 1.05], raw_var_ratio=0.5)
    line = report.table_md([g]).splitlines()[-1]
    assert "| \u2265 1.40x |" in line and "unresolved; 3.00 [1.10, 9.00]; 4.00 [0.50, 8.00]" in line
    assert "- (a seed not resolved)" in line and "1.00* [0.90, 1.00*]" in line  # a clipped cosine is marked


def test_one_seed_prints_no_random_effects_check():
    # with one seed there is no spread between seeds: the column says so instead of "Q = 0.0 (p nan)"
    g = dict(estimator="otb", N=4, n=30, seeds=1, factor=None, gain=[1.14, 0.74, 1.63], verdict="covers",
             per_seed=[[1.14, 0.74, 1.63]], per_seed_verdict=["covers"],
             random_effects=dict(gain=[1.14, 0.77, 1.69], Q=0.0, df=0, p=math.nan, I2=0.0, tau2=0.0),
             alpha=[0.54, 0.44, 0.67], cosine=[0.99, 0.95, 1.0], raw_var_ratio=0.5)
    line = report.table_md([g]).splitlines()[-1]
    assert "| - (one seed) |" in line and "nan" not in line
    two = dict(g, seeds=2, random_effects=dict(g["random_effects"], df=1, p=0.5, Q=0.4))
    assert "Q = 0.4 (p 0.50)" in report.table_md([two]).splitlines()[-1]

def test_saved_statistics_round_trip_and_reproduce_the_analysis(tmp_path):
    # stats.npz keeps what the analysis reads (lab/analysis/compact.py): V exactly; the references' Gram
    # matrix once per cell; gram and cross (its symmetric part) only for estimators whose E g is not known,
    # and reinforce's; each matrix within 2^-11 of its largest entry. Every metric of the analysis made from
    # the saved file is that of the full statistics within 1e-3 relative, and the gains of known factors
    # (variance ratios) exactly.
    gen = torch.Generator().manual_seed(0)
    refs = torch.randn(6, 5, generator=gen, dtype=torch.float64) + 2
    cell = {(e, 4): scale_free.gram_stats(refs * c + 0.5 * torch.randn(6, 5, generator=gen, dtype=torch.float64),
                                          torch.rand(6, generator=gen, dtype=torch.float64) + v, refs)
            for e, c, v in [("group_mean", 0.75, 3.0), ("reinforce", 1.0, 1.0), ("otb", 0.6, 0.5)]}
    grams = {(64, 0): cell, (64, 1): cell}
    records.save_grams(tmp_path / "stats.npz", grams)
    back = records.load_grams(tmp_path / "stats.npz")
    assert set(back) == set(grams)
    assert set(back[(64, 0)][("group_mean", 4)]) == {"V", "ref_gram"}  # its gram and cross are never read
    for key in cell:
        assert torch.equal(back[(64, 0)][key]["V"], cell[key]["V"])
        for k, M in ((k, M) for k, M in back[(64, 0)][key].items() if k != "V"):
            want = (cell[key][k] + cell[key][k].T) / 2  # the symmetric part
            assert (M - want).abs().max() <= 2 ** -11 * want.abs().max(), (key, k)
            assert (M - want).abs().max() > 0  # rounded, so the tolerance is what is tested
    rows, summary, _ = hs.analyse(back, replicates=200)
    again, _, _ = hs.analyse(records.load_grams(tmp_path / "stats.npz"), replicates=200)
    assert rows == again  # the same draws from the same saved statistics
    full, _, _ = hs.analyse(grams, replicates=200)
    for r, f in zip(rows, full):
        for metric in ("gain", "alpha", "cosine", "nvar"):
            if metric in r and all(math.isfinite(x) for x in f[metric]):
                assert r[metric] == pytest.approx(f[metric], rel=1e-3), (r["estimator"], metric)
    by = {(r["estimator"], r["seed"]): r for r in rows}
    V = {e: cell[(e, 4)]["V"].mean().item() for e in ("group_mean", "reinforce")}
    # eq. (5) of scale_free.py: known factors, so the gain is the variance ratio times (1 / 0.75)^2
    assert by[("reinforce", 0)]["gain"][0] == pytest.approx(V["group_mean"] / V["reinforce"] / 0.75 ** 2, rel=1e-12)
    assert by[("reinforce", 0)]["alpha"][0] == pytest.approx(1.0) and by[("reinforce", 0)]["factor"] == 1.0
    # a file in the full float64 format (older sweeps) is still read as it is
    import numpy as np
    np.savez(tmp_path / "full.npz", **{f"n64_seed0/{e}/N{N}/{k}": v.numpy() for (e, N), s in cell.items()
                                       for k, v in s.items()})
    old = records.load_grams(tmp_path / "full.npz")
    assert all(torch.equal(old[(64, 0)][key][k], cell[key][k]) for key in cell for k in cell[key])


def test_resume_keeps_saved_cells_only_with_the_same_settings(tmp_path):
    import json
    cell = {("group_mean", 4): scale_free.gram_stats(torch.eye(3), [1.0, 2.0, 3.0], torch.ones(3))}
    records.save_grams(tmp_path / "stats.npz", {(16, 0): cell})
    args = hs.parse_args(["--out", str(tmp_path), "--prompts", "3", "--pool", "8", "--group-sizes", "2,4"])
    (tmp_path / "results.json").write_text(json.dumps(dict(args=vars(args), checkpoints=[dict(n=16, seed=0)],
                                                           seconds=100.0)))
    grams, checkpoints, seconds, provenance = records.resumed(tmp_path, args)
    assert set(grams) == {(16, 0)} and checkpoints == [dict(n=16, seed=0)] and seconds == 100.0
    assert provenance == [{"commit": "not recorded", "code_changes": None}]
    other = hs.parse_args(["--out", str(tmp_path), "--prompts", "4", "--pool", "8", "--group-sizes", "2,4"])
    with pytest.raises(SystemExit, match="other settings"):
        records.resumed(tmp_path, other)


def test_sweeps_measured_side_by_side_are_analysed_as_one(tmp_path):
    # Seeds measured into separate folders (one process each): --from-saved A,B analyses the union of
    # their cells exactly as one sweep of both seeds; overlapping cells or other settings are refused.
    import json
    args = hs.parse_args(["--horizons", "64", "--prompts", "6", "--pool", "8", "--group-sizes", "4",
                          "--estimators", "reinforce,group_mean,otb"])
    records.save_grams(tmp_path / "saved.npz", two_seeds())
    grams = records.load_grams(tmp_path / "saved.npz")  # the statistics as saved (lab/analysis/compact.py)
    for seed in (0, 1):
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        records.save_grams(folder / "stats.npz", {(64, seed): grams[(64, seed)]})
        folder.joinpath("results.json").write_text(json.dumps(dict(
            command=f"sweep --seeds {seed}", args={**vars(args), "seeds": [seed]}, seconds=100.0 + seed,
            checkpoints=[dict(n=64, seed=seed)], machine=dict(logical_cpus=2))))
    hs.main(["--from-saved", f"{tmp_path / 's0'},{tmp_path / 's1'}", "--out", str(tmp_path / "both"),
             "--replicates", "200"])
    both = json.loads((tmp_path / "both" / "results.json").read_text())
    rows, _, _ = hs.analyse(grams, replicates=200)
    assert both["rows"] == json.loads(json.dumps(rows)) and both["args"]["seeds"] == [0, 1]
    assert both["seconds"] == [100.0, 101.0] and both["checkpoints"] == [dict(n=64, seed=0), dict(n=64, seed=1)]
    assert "measured in 100 s + 101 s (side by side)" in (tmp_path / "both" / "table.md").read_text()
    assert set(records.load_grams(tmp_path / "both" / "stats.npz")) == {(64, 0), (64, 1)}
    # --seeds with --from-saved: only those seeds' cells, as if only they had been measured
    hs.main(["--from-saved", str(tmp_path / "both"), "--seeds", "1", "--out", str(tmp_path / "one"),
             "--replicates", "200"])
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    rows, _, _ = hs.analyse({(64, 1): grams[(64, 1)]}, replicates=200)
    assert one["rows"] == json.loads(json.dumps(rows)) and one["args"]["seeds"] == [1]
    assert one["checkpoints"] == [dict(n=64, seed=1)]
    # a folder analysed from several (seconds: a list) joins others the same way
    hs.main(["--from-saved", f"{tmp_path / 's0'},{tmp_path / 'one'}", "--out", str(tmp_path / "again"),
             "--replicates", "200"])
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["rows"] == both["rows"] and again["seconds"] == [100.0, 100.0, 101.0]
    with pytest.raises(SystemExit, match=r"--seeds: \[7\]"):
        hs.main(["--from-saved", str(tmp_path / "both"), "--seeds", "1,7", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="already read"):
        hs.main(["--from-saved", f"{tmp_path / 's0'},{tmp_path / 's0'}", "--out", str(tmp_path / "x")])
    other = json.loads((tmp_path / "s1" / "results.json").read_text())
    other["args"]["prompts"] = 7
    (tmp_path / "s1" / "results.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="other settings"):
        hs.main(["--from-saved", f"{tmp_path / 's0'},{tmp_path / 's1'}", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        hs.parse_args(["--from-saved", f"{tmp_path / 's0'},{tmp_path / 'missing'}"])


ROOT = Path(__file__).resolve().parent.parent
SWEEPS = [("horizon_sweep", "variance.md", ("otb", "otb_zero_tail", "otb_loo", "reinforce", "grpo")),
          ("calculator_sweep", "tool_use.md", report.TOOL_ROWS), ("factors_sweep", "tool_use.md", report.TOOL_ROWS),
          ("factors_sweep_128", "tool_use.md", report.TOOL_ROWS),
          ("factors_replication", "tool_use.md", report.TOOL_ROWS),
          ("smollm2_variance", "variance.md", ("otb", "reinforce", "rloo"))]


@pytest.mark.saved_results
@pytest.mark.parametrize("folder, doc, columns", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_committed_sweep_is_its_statistics_reanalysed(folder, doc, columns, tmp_path):
    # --from-saved remakes table.md and results.json up to another CPU's rounding (tests/saved.py),
    # keeps the measuring machine's record,
    # and the docs show compact_md() of the saved gains, not numbers copied by hand.
    import json
    saved = ROOT / "benchmarks" / "results" / folder
    hs.main(["--from-saved", str(saved), "--out", str(tmp_path)])
    same_text((tmp_path / "table.md").read_text(), (saved / "table.md").read_text(), "table.md")
    same_record(json.loads((tmp_path / "results.json").read_text()), json.loads((saved / "results.json").read_text()))
    record = json.loads((saved / "results.json").read_text())
    assert record["machine"]["logical_cpus"] == 2  # the machine that measured, not the one that re-analysed
    assert report.compact_md(record["gains"], estimators=columns) in (ROOT / "docs" / doc).read_text()


@pytest.mark.parametrize("folder", [s[0] for s in SWEEPS])
def test_verdicts_do_not_turn_with_the_bootstrap_seed(folder):
    # The saved verdicts (boot_seed 0) and 9 more independent sets of bootstrap draws: a verdict may fall
    # to "edge" (within Monte Carlo error of the threshold) but never turns from above to covers or below
    # (or back). Not repeated under other CPUs' rounding (not saved_results): the re-analysis above holds
    # boot_seed 0's verdicts to the saved ones in every pass, and what this test draws is the bootstrap's
    # Monte Carlo error, which a last bit does not change.
    import json
    saved = ROOT / "benchmarks" / "results" / folder
    grams = records.load_grams(saved / "stats.npz")
    seen = {tuple(v[:-1]): {v[-1]} for v in json.loads((saved / "results.json").read_text())["verdicts"]}
    for boot_seed in range(1, 10):
        drawn = hs.all_verdicts(grams, boot_seed=boot_seed)
        assert drawn.keys() == seen.keys(), boot_seed
        for k, v in drawn.items():
            seen[k].add(v)
    turned = {k: v for k, v in seen.items() if len(v - {"edge"}) > 1}
    assert not turned, turned


def test_subset_keeps_a_tool_output_inside_a_response():
    # grad_variance.subset trims after the last valid token, not after sum(m) tokens: a response
    # with a hole keeps the hole (context) and the action after it.
    import rollout
    from benchmarks.common import subset
    m = torch.tensor([[1, 0, 0, 1, 0], [1, 1, 0, 0, 0]])
    ro = rollout.Rollout(prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                         response=torch.arange(10).view(2, 5), response_mask=m, group_index=torch.zeros(2),
                         logp=torch.zeros(2, 5), finished=torch.ones(2, dtype=torch.bool))
    assert subset(ro, [0]).response.tolist() == [[0, 1, 2, 3]]
    assert subset(ro, [1]).response.tolist() == [[5, 6]]
    assert subset(ro, [0, 1]).response_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]


def test_calculator_sweep_samples_with_the_tool_and_saves_otb_tir(tmp_path, monkeypatch):
    """--task calculator on tiny sizes (a 1-layer model, 60 warm-up steps, k = 2, 2 prompts): the
    sampler gets the calculator, the saved rows hold the chosen estimators, every checkpoint its
    warm-up success, and a partial sweep (one checkpoint of two) is resumed to the whole."""
    import json
    import rollout
    import train
    from lab import options
    tools, real_sample = [], rollout.sample
    monkeypatch.setattr(rollout, "sample", lambda *a, **k: tools.append(k["tool"]) or real_sample(*a, **k))

    def checkpoint(n, seed, args):  # hs.checkpoint with a smaller model and warm-up
        cfg = train.Config(task=args.task, horizon=n, seed=seed, tiny_hidden=32, tiny_layers=1,
                           warmup_max_steps=60, out=str(tmp_path / "cache"))
        model, tok, source = options.load(cfg, torch.device("cpu"))
        return model, tok, options.make_task(cfg), cfg, source
    monkeypatch.setattr(hs, "checkpoint", checkpoint)
    # 60 warm-up steps never solve k = 2: a stand-in reward (text length odd) gives the estimators signal
    monkeypatch.setattr(tool_use.CalculatorTask, "reward", lambda self, text, answer, finished: len(text) % 2)
    argv = ["--task", "calculator", "--horizons", "2", "--prompts", "2", "--pool", "8", "--ref-pool", "8",
            "--group-sizes", "4", "--estimators", "reinforce,group_mean,otb,otb_tir", "--replicates", "100",
            "--out", str(tmp_path / "out")]
    hs.main(argv + ["--seeds", "0"])
    assert tools and all(isinstance(t, tool_use.Tool) for t in tools)
    hs.main(argv + ["--seeds", "0,1", "--resume"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["estimator"] for r in saved["rows"]} == {"reinforce", "group_mean", "otb", "otb_tir"}
    assert [(c["n"], c["seed"]) for c in saved["checkpoints"]] == [(2, 0), (2, 1)]
    assert all(0 <= c["warmup_success"] <= 1 for c in saved["checkpoints"])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "## Checkpoints" in table and "| 2 | 0 |" in table and "| 2 | 1 |" in table
    assert [(r["n"], r["N"], len(r["per_seed"])) for r in saved["otb_tir_over_otb"]] == [(2, 4, 2)]
    assert all(math.isfinite(g["gain"][0]) for g in saved["gains"] if g["estimator"] == "reinforce")
    with pytest.raises(SystemExit):
        hs.parse_args(["--estimators", "otb,rloo"])  # no group_mean, no reinforce



@pytest.mark.saved_results
def test_committed_factors_sweep_shows_its_paired_otb_otb_tir_table_in_docs_tool_use():
    # benchmarks/results/factors_sweep (horizon_sweep.py --task factors): docs/tool_use.md shows
    # head_to_head_md() of the saved otb / otb_tir ratios (the byte-for-byte re-analysis: SWEEPS above).
    import json
    saved = json.loads((ROOT / "benchmarks" / "results" / "factors_sweep" / "results.json").read_text())
    assert saved["args"]["task"] == "factors" and saved["args"]["seeds"] == [0, 1, 2]
    assert report.head_to_head_md(saved["otb_tir_over_otb"]) in (ROOT / "docs" / "tool_use.md").read_text()


@pytest.mark.saved_results
def test_factors_sweep_at_128_prompts_and_its_seed_subsets_are_the_tables_in_docs_tool_use(tmp_path):
    # The second measurement (docs/tool_use.md, Addenda 2-3): six seeds pooled (primary) and, from the
    # same saved statistics, seeds 0-2 alone (secondary); both head-to-head tables are in the docs.
    import json
    folder = ROOT / "benchmarks" / "results" / "factors_sweep_128"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["args"]["task"] == "factors" and saved["args"]["seeds"] == [0, 1, 2, 3, 4, 5]
    assert saved["args"]["prompts"] == 128
    doc = (ROOT / "docs" / "tool_use.md").read_text()
    assert report.head_to_head_md(saved["otb_tir_over_otb"]) in doc
    hs.main(["--from-saved", str(folder), "--seeds", "0,1,2", "--out", str(tmp_path)])
    secondary = json.loads((tmp_path / "results.json").read_text())
    assert report.head_to_head_md(secondary["otb_tir_over_otb"]) in doc


@pytest.mark.saved_results
def test_factors_replication_and_all_twelve_seeds_are_the_tables_in_docs_tool_use(tmp_path):
    # Addendum 4: seeds 6-11 alone (the replication) and, from both saved folders, all twelve seeds.
    import json
    results = ROOT / "benchmarks" / "results"
    rep = json.loads((results / "factors_replication" / "results.json").read_text())
    assert rep["args"]["seeds"] == [6, 7, 8, 9, 10, 11] and rep["args"]["prompts"] == 128
    doc = (ROOT / "docs" / "tool_use.md").read_text()
    assert report.head_to_head_md(rep["otb_tir_over_otb"]) in doc
    hs.main(["--from-saved", f"{results / 'factors_sweep_128'},{results / 'factors_replication'}",
             "--out", str(tmp_path)])
    twelve = json.loads((tmp_path / "results.json").read_text())
    assert twelve["args"]["seeds"] == list(range(12))
    assert report.head_to_head_md(twelve["otb_tir_over_otb"]) in doc


def test_same_record_allows_the_last_bits_of_a_float_and_nothing_else():
    want = {"rows": [{"N": 4, "gain": 1.2345678901234567, "verdict": "above", "ci": [0.9, None]}], "nan": math.nan}
    moved = {"rows": [{"N": 4, "gain": 1.2345678901234567 * (1 + 3e-16), "verdict": "above", "ci": [0.9, None]}],
             "nan": math.nan}
    same_record(moved, want)  # a CPU's rounding
    for changed in ({**want, "rows": [{**want["rows"][0], "gain": 1.2345678901234567 * (1 + 1e-6)}]},
                    {**want, "rows": [{**want["rows"][0], "verdict": "covers"}]},
                    {**want, "rows": [{**want["rows"][0], "N": 16}]},
                    {"nan": math.nan, "rows": want["rows"]},  # keys in another order
                    {**want, "nan": 0.0}):
        with pytest.raises(AssertionError):
            same_record(changed, want)


def test_the_horizon_contrast_resamples_prompts_jointly_across_n():
    # Cell n = 16 is cell n = 64 with otb's per-prompt tr Var doubled: otb's gain over the group mean is
    # exactly twice as large at n = 64, prompt by prompt. Resampled jointly (the same prompts drawn for
    # both horizons), every draw gives rho = gain(64) / gain(16) = 2: the set is [2, 2], "grows with n".
    # Independent draws for the two cells would give a wide set. reinforce's gain, the same at both n, has
    # rho 1 exactly; rloo's gain, 1 by construction at every n, is listed as fixed, without a rho; cells of
    # unequal prompts give no contrast.
    hi = two_seeds()[(64, 0)]
    hi[("rloo", 4)] = dict(hi[("group_mean", 4)], V=hi[("group_mean", 4)]["V"] * (4 / 3) ** 2)  # N / (N - 1) x gm
    lo = {key: dict(s, V=s["V"] * (1.0 if key[0] != "otb" else 2.0)) for key, s in hi.items()}
    grams = {(16, 0): lo, (64, 0): hi}
    contrasts = hs.horizon_contrasts(grams, replicates=1000)  # 300 draws cannot clear the edge band
    assert [(c["estimator"], c["N"], c["n_lo"], c["n_hi"]) for c in contrasts] == [
        ("reinforce", 4, 16, 64), ("otb", 4, 16, 64), ("rloo", 4, 16, 64)]
    by = {c["estimator"]: c for c in contrasts}
    assert by["otb"]["ratio"] == pytest.approx([2.0, 2.0, 2.0], rel=1e-9) and by["otb"]["verdict"] == "above"
    assert by["reinforce"]["ratio"] == pytest.approx([1.0, 1.0, 1.0], rel=1e-9) and by["reinforce"]["verdict"] == "covers"
    assert by["rloo"].get("fixed") and "ratio" not in by["rloo"]
    assert "| rloo | 4 | n = 64 / n = 16 | - | 1 at every n by construction" in report.contrasts_md(contrasts)
    contrasts = [c for c in contrasts if c["estimator"] == "otb"]
    _, summary, _ = hs.analyse(grams, replicates=300)
    gains = {s["n"]: s["gain"][0] for s in summary if s["estimator"] == "otb"}
    assert gains[64] / gains[16] == pytest.approx(2.0, rel=1e-9)  # the point value is the ratio of the gains
    text = report.summary_md(summary, contrasts, [dict(n=n, seed=0, success=0.5, mean_length=10.0) for n in (16, 64)],
                         {(16, 0): 6, (64, 0): 6}, "cmd")
    assert "| otb | 4 | n = 64 / n = 16 | 2.00 [2.00, 2.00] | grows with n |" in text
    fewer = {(16, 0): {k: scale_free.gram_stats(torch.eye(5, 3, dtype=torch.float64), torch.ones(5),
                                                torch.ones(5, 3, dtype=torch.float64)) for k in hi}, (64, 0): hi}
    assert hs.horizon_contrasts(fewer, replicates=100) == []


def test_a_prompt_record_keeps_what_the_analysis_needs(tmp_path):
    # save_prompt stores m_p and r_p scaled to float16 (each entry within 2^-11 of the vector's largest),
    # V_p, K and the rewards exactly; a record written with float32 vectors and no scales reads as it is.
    import numpy as np
    gen = torch.Generator().manual_seed(0)
    units = {(e, N): (torch.randn(50, generator=gen) * 1e5, float(torch.rand(1, generator=gen)), 8 // N)
             for e in ("otb", "reinforce") for N in (2, 4)}
    ref, R = torch.randn(50, generator=gen), torch.tensor([0.0, 1.0, 1.0, 0.0])
    records.save_prompt(tmp_path / "p0000.npz", units, ref, R, 1 - R, 12.5, 3.0)
    back = records.load_prompt(tmp_path / "p0000.npz")
    for key, (mean, var, K) in units.items():
        got = back["units"][key]
        assert (got[0] - mean).abs().max() <= 2 ** -11 * mean.abs().max() and (got[0] - mean).abs().max() > 0
        assert got[1:] == (var, K)
    assert (back["ref"] - ref).abs().max() <= 2 ** -11 * ref.abs().max()
    assert torch.equal(back["R"], R) and torch.equal(back["R_ref"], 1 - R) and back["length"] == 12.5
    np.savez(tmp_path / "p0001.npz", ref=ref.numpy(), R=R.numpy(), R_ref=R.numpy(), length=1.0, seconds=1.0,
             **{f"{e}/N{N}/{k}": np.asarray(v) for (e, N), (m, var, K) in units.items()
                for k, v in (("mean", m.numpy()), ("var", var), ("K", K))})
    old = records.load_prompt(tmp_path / "p0001.npz")
    assert torch.equal(old["ref"], ref) and all(torch.equal(old["units"][k][0], units[k][0]) for k in units)
    # An estimator whose E g is known (scale_free.FACTORS, not reinforce) keeps no m_p: its signal comes from
    # the references. The statistics the analysis reads (compact.save's) are those of the full record.
    known = {("group_mean", 2): (torch.randn(50, generator=gen), 0.5, 4), ("otb_loo", 2): (torch.randn(50, generator=gen), 0.7, 4)}
    for p in range(3):
        records.save_prompt(tmp_path / f"slim{p}.npz", {**units, **known}, ref * (p + 1), R, 1 - R, 12.5, 3.0)
    slim = [records.load_prompt(tmp_path / f"slim{p}.npz") for p in range(3)]
    assert slim[0]["units"][("otb_loo", 2)][0] is None and slim[0]["units"][("otb", 2)][0] is not None
    with np.load(tmp_path / "slim0.npz") as data:
        assert "group_mean/N2/mean" not in data.files and "group_mean/N2/var" in data.files
    full = [dict(s, units={k: (known[k][0] if u[0] is None else u[0], *u[1:]) for k, u in s["units"].items()})
            for s in slim]
    records.save_grams(tmp_path / "slim.npz", {(4, 0): records.grams_of(slim)})
    records.save_grams(tmp_path / "full.npz", {(4, 0): records.grams_of(full)})
    with np.load(tmp_path / "slim.npz") as a, np.load(tmp_path / "full.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.saved_results
@pytest.mark.parametrize("folder, card", [("smollm2_variance", None), ("smollm2_variance_gpu", "NVIDIA H200")])
def test_the_smollm2_sweep_rebuilds_its_table_from_what_it_saved(folder, card, tmp_path):
    # The SmolLM2 sweeps of docs/smollm2_variance_protocol.md (the CPU run, and the GPU window's replicate
    # of its addendum), finished or still measuring: --from-saved analyses their finished cells (stats.npz)
    # to the rows the run saved, up to another CPU's rounding, and a cell still measuring on the prompts
    # recorded so far (to the interim analysis the run wrote when it stopped, where there is one); the
    # record names the commit of every process that measured it and the machine.
    import json
    folder = ROOT / "benchmarks" / "results" / folder
    record = records.read_record(folder)  # sweep.json while measuring, else results.json
    assert record["args"]["model"] == "smollm2" and record["args"]["prompts"] == 24 and record["machine"]["cpu"]
    assert record["machine"].get("cuda") == card
    hs.main(["--from-saved", str(folder), "--out", str(tmp_path), "--replicates", "2000"])
    again = json.loads((tmp_path / "results.json").read_text())
    finished = {c["n"] for c in record["checkpoints"]}
    assert finished, "no finished horizon yet"
    saved = json.loads((folder / "results.json").read_text())
    rows = lambda r, ns: [x for x in r["rows"] if x["n"] in ns]  # noqa: E731
    same_record(rows(again, finished), rows(saved, finished))
    recorded = {int(f.name[1:].split("_")[0]): len(list(f.glob("p*.npz"))) for f in (folder / "prompts").glob("n*")}
    partial = {c["n"]: c["prompts"] for c in again["checkpoints"] if c.get("partial")}
    assert partial == {n: k for n, k in recorded.items() if k >= 2}
    if (folder / "interim" / "results.json").is_file():
        interim = json.loads((folder / "interim" / "results.json").read_text())
        assert rows(interim, set(partial))
        same_record(rows(again, set(partial)), rows(interim, set(partial)))
    # docs/variance.md shows the gains of a finished run, or of an interim analysis where a window closed
    shown = interim if (folder / "interim" / "results.json").is_file() else \
        None if (folder / "sweep.json").is_file() else saved
    if shown is not None:
        assert report.compact_md(shown["gains"], estimators=("otb", "reinforce", "rloo")) in \
            (ROOT / "docs" / "variance.md").read_text()


def test_a_cell_without_variance_has_no_variance_ratio_and_does_not_stop_the_analysis():
    """Prompts whose responses all earn the same reward give zero gradients (an interim analysis of a few
    prompts can hold only such): the raw variance ratio to group_mean is then undefined, NaN in every row
    and summary of that cell, while the other cells are analysed as before."""
    grams = two_seeds()
    grams[(16, 0)] = {key: {k: torch.zeros_like(v) for k, v in g.items()} for key, g in grams[(64, 0)].items()}
    rows, summary, _ = hs.analyse(grams, replicates=200)
    assert all(math.isnan(r["raw_var_ratio"]) for r in rows + summary if r["n"] == 16)
    assert all(math.isfinite(r["raw_var_ratio"]) for r in rows + summary if r["n"] == 64)
