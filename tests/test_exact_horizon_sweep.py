"""The horizon sweep's analysis (benchmarks/horizon_sweep.py): seeds on the log scale, unresolved
cells, and the saved sufficient statistics re-bootstrapped to the same numbers."""
import math

import pytest
import torch

import scale_free
from benchmarks import horizon_sweep as hs


def row(est, gain, seed, n=64, N=4, factor=None):
    return dict(estimator=est, N=N, n=n, seed=seed, factor=factor, gain=[gain, gain / 2, gain * 2],
                alpha=[0.5, 0.4, 0.6], cosine=[0.9, 0.8, 1.0], raw_var_ratio=0.5)


def test_gain_over_seeds_is_a_geometric_mean_with_a_t_interval():
    rows = [row("otb", 2.0, 0), row("otb", 8.0, 1)]
    g = hs.gains(rows)[0]
    assert g["gain"][0] == pytest.approx(4.0)  # sqrt(2 * 8)
    half = math.tan(math.pi * (0.975 - 0.5)) * (math.log(8) - math.log(2)) / math.sqrt(2) / math.sqrt(2)  # t(1 df)
    assert g["gain"][1:] == pytest.approx([4.0 * math.exp(-half), 4.0 * math.exp(half)])
    assert g["per_seed"] == [[2.0, 1.0, 4.0], [8.0, 4.0, 16.0]]


def test_one_unresolved_seed_makes_the_cell_unresolved():
    g = hs.gains([row("otb", math.nan, 0), row("otb", 3.0, 1)])[0]
    assert math.isnan(g["gain"][0])
    assert "| unresolved |" in hs.table_md([], [g])


def test_pooled_over_n_combines_every_cell():
    p = hs.pooled([row("otb", 2.0, 0, n=16), row("otb", 2.0, 1, n=64), row("otb", 2.0, 0, n=128)])
    assert p[0]["cells"] == 3 and p[0]["gain"][0] == pytest.approx(2.0)


def test_saved_statistics_round_trip_and_reproduce_the_analysis(tmp_path):
    gen = torch.Generator().manual_seed(0)
    refs = torch.randn(6, 5, generator=gen, dtype=torch.float64) + 2
    cell = {(e, 4): scale_free.gram_stats(refs * c + 0.5 * torch.randn(6, 5, generator=gen, dtype=torch.float64),
                                          torch.rand(6, generator=gen, dtype=torch.float64) + v, refs)
            for e, c, v in [("group_mean", 0.75, 3.0), ("reinforce", 1.0, 1.0), ("otb", 0.6, 0.5)]}
    grams = {(64, 0): cell, (64, 1): cell}
    hs.save_grams(tmp_path / "stats.npz", grams)
    back = hs.load_grams(tmp_path / "stats.npz")
    assert set(back) == set(grams)
    for key in cell:
        for k in cell[key]:
            assert torch.equal(back[(64, 0)][key][k], cell[key][k])
    rows, summary, _ = hs.analyse(back, replicates=200)
    again, _, _ = hs.analyse(grams, replicates=200)
    assert rows == again  # the same draws from the same statistics
    by = {(r["estimator"], r["seed"]): r for r in rows}
    V = {e: cell[(e, 4)]["V"].mean().item() for e in ("group_mean", "reinforce")}
    # eq. (5) of scale_free.py: known factors, so the gain is the variance ratio times (1 / 0.75)^2
    assert by[("reinforce", 0)]["gain"][0] == pytest.approx(V["group_mean"] / V["reinforce"] / 0.75 ** 2)
    assert by[("reinforce", 0)]["alpha"][0] == pytest.approx(1.0) and by[("reinforce", 0)]["factor"] == 1.0


def test_resume_keeps_saved_cells_only_with_the_same_settings(tmp_path):
    import json
    cell = {("group_mean", 4): scale_free.gram_stats(torch.eye(3), [1.0, 2.0, 3.0], torch.ones(3))}
    hs.save_grams(tmp_path / "stats.npz", {(16, 0): cell})
    args = hs.parse_args(["--out", str(tmp_path), "--prompts", "3", "--pool", "8", "--group-sizes", "2,4"])
    (tmp_path / "results.json").write_text(json.dumps(dict(args=vars(args), checkpoints=[dict(n=16, seed=0)],
                                                           seconds=100.0)))
    grams, checkpoints, t0 = hs.resumed(tmp_path, args, 1000.0)
    assert set(grams) == {(16, 0)} and checkpoints == [dict(n=16, seed=0)] and t0 == 900.0
    other = hs.parse_args(["--out", str(tmp_path), "--prompts", "4", "--pool", "8", "--group-sizes", "2,4"])
    with pytest.raises(SystemExit, match="other settings"):
        hs.resumed(tmp_path, other, 1000.0)


def test_committed_results_are_the_saved_statistics_reanalysed_and_the_docs_show_them():
    # results.json is what analyse() makes of the committed stats.npz, and docs/variance.md shows
    # compact_md() of it, not numbers copied by hand.
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    folder = root / "benchmarks" / "results" / "horizon_sweep"
    saved = json.loads((folder / "results.json").read_text())
    rows, gains, pool = hs.analyse(hs.load_grams(folder / "stats.npz"), saved["args"]["replicates"])
    for mine, theirs in zip(gains, saved["gains"]):
        assert (mine["estimator"], mine["N"], mine["n"]) == (theirs["estimator"], theirs["N"], theirs["n"])
        assert mine["gain"] == pytest.approx(theirs["gain"], rel=1e-9, nan_ok=True)
    assert hs.compact_md(saved["gains"], saved["pooled"]) in (root / "docs" / "variance.md").read_text()


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
    import tasks
    import train
    import train_cli
    tools, real_sample = [], rollout.sample
    monkeypatch.setattr(rollout, "sample", lambda *a, **k: tools.append(k["tool"]) or real_sample(*a, **k))

    def checkpoint(n, seed, args):  # hs.checkpoint with a smaller model and warm-up
        cfg = train.Config(task=args.task, horizon=n, seed=seed, tiny_hidden=32, tiny_layers=1,
                           warmup_max_steps=60, out=str(tmp_path / "cache"))
        model, tok, source = train_cli.load(cfg, torch.device("cpu"))
        return model, tok, tasks.make_task(cfg), cfg, source
    monkeypatch.setattr(hs, "checkpoint", checkpoint)
    # 60 warm-up steps never solve k = 2: a stand-in reward (text length odd) gives the estimators signal
    monkeypatch.setattr(tasks.CalculatorTask, "reward", lambda self, text, answer, finished: len(text) % 2)
    argv = ["--task", "calculator", "--horizons", "2", "--prompts", "2", "--pool", "8", "--ref-pool", "8",
            "--group-sizes", "4", "--estimators", "reinforce,group_mean,otb,otb_tir", "--replicates", "100",
            "--out", str(tmp_path / "out")]
    hs.main(argv + ["--seeds", "0"])
    assert tools and all(isinstance(t, tasks.Tool) for t in tools)
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


def test_committed_calculator_sweep_is_its_statistics_reanalysed_and_docs_tool_use_shows_it():
    # benchmarks/results/calculator_sweep (horizon_sweep.py --task calculator): the gains are what
    # analyse() makes of its stats.npz, and docs/tool_use.md shows compact_md() of them.
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    folder = root / "benchmarks" / "results" / "calculator_sweep"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["args"]["task"] == "calculator"
    _, gains, _ = hs.analyse(hs.load_grams(folder / "stats.npz"), saved["args"]["replicates"])
    for mine, theirs in zip(gains, saved["gains"], strict=True):
        assert (mine["estimator"], mine["N"], mine["n"]) == (theirs["estimator"], theirs["N"], theirs["n"])
        assert mine["gain"] == pytest.approx(theirs["gain"], rel=1e-9, nan_ok=True)
    table = hs.compact_md(saved["gains"], saved["pooled"], estimators=hs.TOOL_ROWS)
    assert table in (root / "docs" / "tool_use.md").read_text()


def test_committed_factors_sweep_is_its_statistics_reanalysed_and_docs_tool_use_shows_it():
    # benchmarks/results/factors_sweep (horizon_sweep.py --task factors): the paired otb / otb_tir
    # ratios are what head_to_head() makes of its stats.npz, and docs/tool_use.md's table shows them.
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    folder = root / "benchmarks" / "results" / "factors_sweep"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["args"]["task"] == "factors" and saved["args"]["seeds"] == [0, 1, 2]
    versus = hs.head_to_head(hs.load_grams(folder / "stats.npz"), replicates=saved["args"]["replicates"])
    docs = (root / "docs" / "tool_use.md").read_text()
    for mine, theirs in zip(versus, saved["otb_tir_over_otb"], strict=True):
        assert (mine["n"], mine["N"]) == (theirs["n"], theirs["N"])
        for a, b in zip(mine["per_seed"], theirs["per_seed"], strict=True):
            assert a == pytest.approx(b, rel=1e-9, nan_ok=True)
        cells = ["unresolved" if g[0] != g[0] else hs.stats.fmt(*g, low=0.0) for g in mine["per_seed"]]
        combined = "unresolved" if mine["gain"][0] != mine["gain"][0] else hs.stats.fmt(*mine["gain"], low=0.0)
        assert f"| {mine['N']} | {combined} | " + " | ".join(cells) + " |" in docs
