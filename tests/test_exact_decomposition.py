"""benchmarks/decomposition.py on inputs whose answers are known by construction."""
import math

import pytest
import torch

from benchmarks import decomposition as dc
from lab.analysis import scale_free


def test_bootstrap_p_is_the_two_sided_share_of_draws():
    one = torch.ones(1000)
    assert dc.bootstrap_p(2 * one, one) == 0.0  # every draw above 1
    assert dc.bootstrap_p(torch.cat([2 * one[:30], 0.5 * one[:970]]), one[:1000]) == pytest.approx(0.06)
    assert dc.bootstrap_p(one, one) == 1.0  # every draw at 1
    assert math.isnan(dc.bootstrap_p(torch.tensor([math.nan]), torch.tensor([1.0])))


def grams(U=8, seed=0):
    """group_mean, reinforce and otb_loo over U prompts, their per-prompt tr Var 3 V, 4 V and V."""
    gen = torch.Generator().manual_seed(seed)
    refs = torch.randn(U, 5, generator=gen, dtype=torch.float64) + 2
    V = torch.rand(U, generator=gen, dtype=torch.float64) + 1
    def stats(c, v):
        return scale_free.gram_stats(refs * c + 0.2 * torch.randn(U, 5, generator=gen, dtype=torch.float64), v, refs)
    return {(30, 0): {("group_mean", 4): stats(0.75, 3 * V), ("reinforce", 4): stats(1.0, 4 * V),
                      ("otb_loo", 4): stats(1.0, V)}}


def test_contrasts_with_known_factors_are_ratios_of_variances():
    # otb_loo and reinforce both have E g = grad J: nvar(reinforce) / nvar(otb_loo) = tr Var ratio = 4, every draw.
    ev = dc.cell_evaluations(grams(), replicates=1000)  # 200 draws cannot clear the edge band
    evals, factors = ev[(30, 4)]
    c = dc.contrast(evals, "otb_loo", "reinforce", factors)
    assert c["ratio"] == pytest.approx([4.0, 4.0, 4.0], rel=1e-9) and c["verdict"] == "above" and c["p"] == 0.0
    rows = dc.contrasts(ev)  # only the contrasts whose two estimators were measured: the first secondary
    assert [(r["a"], r["b"], r["role"]) for r in rows] == [("otb_loo", "group_mean", "secondary")]
    assert rows[0]["tested"] and rows[0]["p_holm"] == rows[0]["p"]  # Holm over one P is that P
    gm = dc.contrast(evals, "otb_loo", "group_mean", factors)
    assert gm["ratio"][0] == pytest.approx(3 / 0.75 ** 2, rel=1e-9)  # eq. (5): (3 V / 0.75^2) / (V / 1^2)


def test_descriptive_counts_lone_successes_and_active_rows():
    # One prompt, two groups of 4 (perm = identity): group 0 has one success of length 5 beside failures of
    # lengths 1, 2, 2; group 1 has no success. Success tokens: positions 0..4, active rows 4, 3, 1, 1, 1.
    length = torch.tensor([[5, 1, 2, 2, 3, 3, 3, 3]], dtype=torch.float64)
    R = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    resp = dict(length=length, R=R, W_T=length * 0.5, S_sq=length ** 2, perm=torch.arange(8)[None].double(),
                seconds=torch.tensor([10.0]), **{"timing.S_i": torch.tensor([4.0])})
    d = dc.descriptive(resp, group_sizes=(4,))
    g = d["groups"]["N4"]
    assert g["mixed"] == 0.5 and g["one_success_of_mixed"] == 1.0
    assert g["rows_active_per_token"]["successes"] == pytest.approx((4 + 3 + 1 + 1 + 1) / 5)
    assert g["success_tokens_alone"] == pytest.approx(3 / 5)
    assert d["mean_length"] == dict(successes=5.0, failures=pytest.approx(17 / 7))
    assert d["proxy_vs_exact"]["spearman"] == pytest.approx(1.0)  # W_T and ||S||^2 both increase with length
    assert d["seconds_per_prompt"] == {"S_i": 4.0, "total": 10.0}


def test_the_token_lesson_reads_where_the_success_runs_alone(tmp_path):
    # A success of 5 tokens beside failures of 2, 3 and 1 tokens: from position 3 it runs alone. OTB's
    # advantages there are 0 by eq. (6) with one row (computed here by otb itself), otb_loo's are the return.
    import otb
    from benchmarks import token_lesson
    lengths, R = [5, 2, 3, 1], [1.0, 0.0, 0.0, 0.0]
    m = torch.tensor([[1.0 if t < L else 0.0 for t in range(5)] for L in lengths])
    r = torch.zeros(4, 5)
    for i, L in enumerate(lengths):
        r[i, L - 1] = R[i]
    lp, spp = torch.full((4, 5), -0.5), torch.full((4, 5), 0.3)
    adv = {e: otb.ESTIMATORS[e](token_rewards=r, response_mask=m, group_index=[0] * 4, log_probs=lp,
                                sum_pi_sq=spp)[0] for e in ("group_mean", "otb", "otb_loo")}
    lesson = dict(n=30, seed=0, prompt=0, rows=[dict(tokens=[f"t{t}" for t in range(L)], reward=R[i],
                                                     advantages={e: a[i, :L].tolist() for e, a in adv.items()})
                                                for i, L in enumerate(lengths)])
    assert token_lesson.alone_from(lesson) == 3
    s = token_lesson.summary(lesson)["mean_advantage"]
    assert s["otb"]["alone"] == pytest.approx(0.0, abs=1e-6) and s["otb_loo"]["alone"] == pytest.approx(1.0)
    assert s["group_mean"]["alone"] == pytest.approx(0.75) and s["group_mean"]["shared"] == pytest.approx(0.75)
    # lambda_t = W_t of the success / sum of W_t over the active rows: every row has the same w_t here, so at
    # t = 0, 1, 2 (4, 3 and 2 rows active, each with W_t = (t + 1) w) it is 1/4, 1/3, 1/2; alone it is 1.
    lam = token_lesson.summary(lesson)["self_weight"]
    assert lam["shared"] == pytest.approx((1 / 4 + 1 / 3 + 1 / 2) / 3, rel=1e-5) and lam["alone"] == pytest.approx(1.0)
    fig = token_lesson.draw(lesson, tmp_path / "lesson.png")
    assert (tmp_path / "lesson.png").stat().st_size > 0 and len(fig.axes) == 4  # three panels and the colour bar


def test_a_folder_without_a_sweep_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        dc.main(["--from-saved", str(tmp_path / "nothing")])
    assert f"--from-saved {tmp_path / 'nothing'}: no sweep saved there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dc.main(["--from-saved", str(tmp_path), "--replicates", "10"])
    assert "--replicates 10: at least 100" in capsys.readouterr().err
