"""Exact checks of OTB on the enumerable toy bandit (toy_env.py).

Tier 1, exact maths by enumeration: probabilities, the score-function gradient, the martingale
identity, the proxy, the optimal per-position baseline. Tier 2, vectorised against naive: the
batch gradient against autograd on a surrogate loss. Tier 3, Monte Carlo claims with an explicit
allowance of a few standard errors (fixed seeds, so every run draws the same numbers), each
paired with a check that the same test *does* flag an estimator for which the claim is false.
"""
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

import otb
import toy_env as te
import toy_harness as th

Z = 4.0  # Monte Carlo allowance, in standard errors (one-sided p ~ 3e-5 for a true claim)


@pytest.fixture(scope="module")
def tab():
    return te.enumerate_toy(te.ToyConfig())


@pytest.fixture(scope="module")
def shared():
    return te.enumerate_toy(te.ToyConfig(policy="shared"))


def sample_gradients(en, names, N, groups, seed=0):
    """g_hat (groups, P) for each estimator, all on the same sampled groups."""
    ests = th.make_estimators(en)
    rows, gid = th.sample_groups(en, N, groups, torch.Generator().manual_seed(seed))
    return {n: th.batch_gradients(en, ests[n](rows, gid), rows, N) for n in names}


# ------------------------------------------------------------------ tier 1: exact maths

@pytest.mark.parametrize("K,T", [(3, 4), (3, 7), (4, 3)])
def test_enumeration_is_every_response_once(K, T):
    tokens, mask = te.enumerate_responses(K, T)
    M = sum((K - 1) ** (L - 1) for L in range(1, T + 1)) + (K - 1) ** T
    assert tokens.shape == (M, T)
    seqs = {tuple(tok[:int(m.sum())].tolist()) for tok, m in zip(tokens, mask)}
    assert len(seqs) == M  # no duplicates
    for s in seqs:  # EOS only ever as the last token; no EOS means cut off at T
        assert te.EOS not in s[:-1] and (s[-1] == te.EOS or len(s) == T)


@pytest.mark.parametrize("fixture", ["tab", "shared"])
def test_probabilities_and_score_function_gradient(fixture, request):
    en = request.getfixturevalue(fixture)
    assert torch.isclose(en.pi.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-12)
    # grad J by autograd on sum pi R equals the score-function form E[R sum_t s_t]
    score_form = en.expect(en.R[:, None] * en.scores.sum(1))
    assert torch.allclose(en.grad_J, score_form, atol=1e-12)
    # per-token scores are martingale differences: E[s_t] = 0 at every position
    assert en.expect(en.scores).abs().max() < 1e-12


def test_vmap_scores_match_one_backward_per_token(shared):
    cfg = te.ToyConfig(policy="shared")
    policy = te.make_policy(cfg)
    for m in [0, 7, 100, len(shared.R) - 1]:
        lp, _ = te.token_log_probs(policy, shared.tokens[m:m + 1], shared.mask[m:m + 1])
        for t in range(int(shared.mask[m].sum())):
            g = torch.autograd.grad(lp[0, t], list(policy.parameters()), retain_graph=True)
            assert torch.allclose(torch.cat([x.reshape(-1) for x in g]), shared.scores[m, t], atol=1e-12)


@pytest.mark.parametrize("fixture", ["tab", "shared"])
def test_martingale_identity_exact(fixture, request):
    en = request.getfixturevalue(fixture)
    lhs, rhs = te.martingale_sides(en)  # E||S_<=t||^2, E[W_t]
    assert torch.allclose(lhs, rhs, rtol=1e-10, atol=1e-12)
    C = te.score_gram(en)  # E[s_j . s_k]: diagonal
    assert (C - torch.diag(torch.diag(C))).abs().max() < 1e-10 * C.abs().max()
    cross = (en.prefix_sq - en.w_exact.cumsum(-1)).abs().max()  # per response, cross terms
    if fixture == "shared":
        assert cross > 1e-3  # not zero sample by sample: the identity holds only in expectation
    else:
        assert cross < 1e-12  # tabular: scores of different positions are orthogonal


def test_proxy_exact_for_tabular_and_correlated_for_shared(tab, shared):
    assert torch.allclose(tab.w_proxy, tab.w_exact, atol=1e-12)
    corr = te.proxy_correlation(shared)
    assert 0.25 < corr < 0.999  # informative, not exact (0.40 at the default seed)
    assert not torch.allclose(shared.w_proxy, shared.w_exact, atol=1e-3)


@pytest.mark.parametrize("fixture", ["tab", "shared"])
def test_optimal_per_position_baseline_is_the_minimum(fixture, request):
    en = request.getfixturevalue(fixture)
    base = te.oracle_baselines(en)
    b = base["opt_per_position"]
    v0 = te.fixed_baseline_variance(en, b)
    for t, d in itertools.product(range(len(b)), (-0.05, 0.05)):
        e = torch.zeros_like(b)
        e[t] = d
        assert te.fixed_baseline_variance(en, b + e) > v0
    for other in ("b_star", "otb_population"):
        assert te.fixed_baseline_variance(en, base[other]) >= v0
    if fixture == "tab":  # orthogonal scores: b_t = E[G_t w_t] / E[w_t] in closed form
        closed = en.expect(en.G * en.w_exact) / en.expect(en.w_exact)
        assert torch.allclose(b, closed, atol=1e-10)


def test_b_star_is_best_scalar(tab):
    b = te.oracle_baselines(tab)["b_star"]
    T = len(b)
    grid = torch.linspace(0, 0.2, 201, dtype=torch.float64)
    best = min(grid, key=lambda c: te.fixed_baseline_variance(tab, torch.full((T,), c.item())))
    assert abs(best - b[0]) <= 0.001 + 1e-12


def test_exact_norms_reach_otb_through_is_weights(tab, shared):
    rows, gid = th.sample_groups(shared, 4, 50, torch.Generator().manual_seed(0))
    ests = th.make_estimators(shared)
    # rho^2 * proxy = exact norm, so otb_exact_w is OTB with W_t from the exact ||s_t||^2
    rho2 = shared.w_exact / shared.w_proxy.clamp(min=1e-300)
    assert torch.allclose((shared.w_proxy * rho2 * shared.mask), shared.w_exact, atol=1e-10)
    assert not torch.allclose(ests["otb_exact_w"](rows, gid), ests["otb"](rows, gid))
    ests_t = th.make_estimators(tab)  # tabular: the proxy is exact, so both coincide
    assert torch.allclose(ests_t["otb_exact_w"](rows, gid), ests_t["otb"](rows, gid), atol=1e-12)


# ------------------------------------------------------------------ tier 2: vectorised vs naive

@pytest.mark.parametrize("policy", ["tabular", "shared"])
def test_batch_gradient_matches_autograd_on_surrogate(policy):
    cfg = te.ToyConfig(policy=policy)
    net = te.make_policy(cfg)
    en = te.enumerate_toy(cfg, net)
    N, G = 4, 3
    rows, gid = th.sample_groups(en, N, G, torch.Generator().manual_seed(1))
    for name, est in th.make_estimators(en).items():
        A = est(rows, gid)
        fast = th.batch_gradients(en, A, rows, N)  # (G, P)
        for g in range(G):  # naive: d/dtheta (1/N) sum_i sum_t A_t^i log pi(y_t^i)
            r = rows[g * N:(g + 1) * N]
            lp, _ = te.token_log_probs(net, en.tokens[r], en.mask[r])
            grads = torch.autograd.grad((A[g * N:(g + 1) * N] * lp).sum() / N, list(net.parameters()))
            assert torch.allclose(fast[g], torch.cat([x.reshape(-1) for x in grads]), atol=1e-12), name


def test_group_mean_is_rloo_scaled_by_one_minus_one_over_n(tab):
    # A_gm = R - mean = (1 - 1/N)(R - mean of the others): with RLOO unbiased, E g_gm = (1 - 1/N) grad J,
    # a bias of exactly -grad J / N.
    for N in (2, 4, 8):
        g = sample_gradients(tab, ["group_mean", "rloo"], N, 200)
        assert torch.allclose(g["group_mean"], (1 - 1 / N) * g["rloo"], atol=1e-12)


# ------------------------------------------------------------------ tier 3: Monte Carlo claims

def max_abs_z(g_hat, target):
    """Largest per-coordinate z-score of mean g_hat against target."""
    se = g_hat.std(0) / math.sqrt(len(g_hat))
    return ((g_hat.mean(0) - target).abs() / se.clamp(min=1e-30)).max().item()


def test_unbiased_estimators_are_unbiased(tab):
    P = tab.scores.shape[-1]
    limit = 4.5  # Bonferroni over P = 21 coordinates: a true claim fails with p ~ 1e-4
    for N in (2, 8):
        g = sample_gradients(tab, list(th.UNBIASED) + ["group_mean"], N, 20000, seed=N)
        for name in th.UNBIASED:
            assert max_abs_z(g[name], tab.grad_J) < limit, (name, N, P)
        if N == 2:  # the same test has the power to see a bias of grad J / 2
            assert max_abs_z(g["group_mean"], tab.grad_J) > limit


def test_self_inclusive_bias_shrinks(tab):
    # E[g_otb] - grad J = E[g_otb - g_otb_loo] (otb_loo is unbiased): measured on the same groups.
    bias2, se = [], []
    for N in (2, 4, 8, 16, 32):
        g = sample_gradients(tab, ["otb", "otb_loo"], N, 4000, seed=N)
        d = g["otb"] - g["otb_loo"]  # (G, P)
        bias2.append((d.mean(0) ** 2).sum().item())
        se.append(2 * (d.mean(0) * d.std(0) / math.sqrt(len(d))).norm().item())
    for k in range(len(bias2) - 1):
        assert bias2[k + 1] + Z * se[k + 1] < bias2[k], (bias2, se)
    # On this sparse toy the decay is *slower* than 1/N^2 in bias^2 at these N (few responses reach
    # the late positions, so the effective group there is N P(L > t)). Where every position is
    # reached often, N |bias| settles to a constant: the O(1/N) law.
    dense = te.enumerate_toy(te.ToyConfig(T=4, eos_bias=-1.0, reward="length"))
    nb = []
    for N in (16, 32):
        g = sample_gradients(dense, ["otb", "otb_loo"], N, 4000, seed=N)
        nb.append(N * (g["otb"] - g["otb_loo"]).mean(0).norm().item())
    assert abs(nb[1] / nb[0] - 1) < 0.15, nb


def test_otb_mse_below_group_mean(tab):
    for N in (2, 4, 8):
        g = sample_gradients(tab, ["otb", "group_mean"], N, 4000, seed=10 + N)
        diff = ((g["otb"] - tab.grad_J) ** 2).sum(-1) - ((g["group_mean"] - tab.grad_J) ** 2).sum(-1)  # paired
        assert diff.mean() + Z * diff.std() / math.sqrt(len(diff)) < 0, N


@pytest.mark.parametrize("fixture", ["tab", "shared"])
def test_no_unbiased_estimator_beats_optimal_per_position(fixture, request):
    # For a leave-one-out (or no) baseline, g = g_opt + correction with Cov(g_opt, correction) = 0
    # (the normal equations of b_opt), so Var(g) >= Var_1(b_opt) / N exactly; the MC estimate of
    # Var(g) may fall below only by sampling error.
    en = request.getfixturevalue(fixture)
    v_opt = te.fixed_baseline_variance(en, te.oracle_baselines(en)["opt_per_position"])
    names = list(th.UNBIASED) + ["opt_per_position", "group_mean"]
    for row in th.measure(en, Ns=(2, 8, 32), groups=3000, seed=3, names=names):
        if row["estimator"] in th.UNBIASED:
            assert row["variance"] + Z * row["variance_se"] >= v_opt / row["N"], row
        elif row["estimator"] == "opt_per_position":  # the harness reproduces the exact variance
            assert abs(row["variance"] - v_opt / row["N"]) < Z * row["variance_se"], row
        elif row["N"] == 2:  # a biased estimator can go below: group mean shrinks g by (1 - 1/N)
            assert row["variance"] + Z * row["variance_se"] < v_opt / row["N"], row


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "t.json", tmp_path / "p.png"
    before = torch.get_default_dtype()
    th.main(["--groups", "200", "--Ns", "2", "4", "--json", str(js), "--plot", str(png)])
    assert torch.get_default_dtype() == before  # the float64 toy must not leak into the process
    out = capsys.readouterr().out
    assert out.startswith("# python toy_harness.py") and "opt_per_position" in out
    data = json.loads(js.read_text())
    assert {r["estimator"] for r in data["rows"]} == set(otb.ESTIMATORS) | set(th.ORACLES) | {"otb_zero_tail"}
    for r in data["rows"]:  # scale-free numbers with their errors, beside the raw ones
        assert all(k in r and k + "_lo" in r and k + "_hi" in r for k in th.SCALE_FREE)
    assert {r["N"] for r in data["rows"]} == {2, 4}
    for r in data["rows"]:
        assert math.isclose(r["mse"], r["bias2"] + r["variance"], rel_tol=1e-9, abs_tol=1e-15)
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--K", "1"], "--K 1 must be >= 2"),
    (["--T", "1"], "--T 1 must be >= 2"),
    (["--K", "9", "--T", "9"], "more than 200000 to enumerate"),
    (["--policy", "cnn"], "--policy cnn must be one of"),
    (["--reward", "dense"], "--reward dense must be one of"),
    (["--min-len", "8"], "--min-len 8 must be in 1..T (7)"),
    (["--groups", "1"], "--groups 1 must be >= 50"),
    (["--Ns", "1", "4"], "every N must be >= 2"),
    (["--eos-bias", "nan"], "--eos-bias nan must be a finite number"),
    (["--init-scale", "inf"], "--init-scale inf must be finite and >= 0"),
    (["--plot", "{tmp}/out.xyz"], "the name must end in one of .png"),
    (["--json", "{tmp}"], "is a folder; give a file name"),
    (["--json", "{tmp}/afile/x.json"], "afile is a file, not a folder"),
    (["--json", "{tmp}/t.txt"], "the name must end in one of .json"),
])
def test_cli_rejects_bad_arguments_with_one_line(argv, message, capsys, tmp_path):
    (tmp_path / "afile").write_text("keep me")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:
        th.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1] and "Traceback" not in "\n".join(err)
    assert sorted(tmp_path.iterdir()) == before and (tmp_path / "afile").read_text() == "keep me"


def test_cli_writes_nothing_unless_a_path_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    th.main(["--groups", "50", "--Ns", "2"])
    assert list(tmp_path.iterdir()) == []  # no default output file: nothing committed is overwritten
    with pytest.raises(SystemExit):
        th.main(["--json"])  # a path is required



def test_rloo_is_group_mean_rescaled_so_only_raw_numbers_differ(tab):
    # RLOO = N/(N-1) x group mean, sample by sample: raw variance scales by (N/(N-1))^2, while every
    # scale-free number (cosine, nvar, rescaled MSE) is the same and alpha scales by N/(N-1).
    for N in (2, 4, 8):
        g = sample_gradients(tab, ["group_mean", "rloo"], N, 2000, seed=20 + N)
        gm, lo = th.gradient_stats(g["group_mean"], tab.grad_J)[0], th.gradient_stats(g["rloo"], tab.grad_J)[0]
        assert lo["variance"] == pytest.approx((N / (N - 1)) ** 2 * gm["variance"], rel=1e-9)
        assert lo["alpha"] == pytest.approx(N / (N - 1) * gm["alpha"], rel=1e-9)
        for k in ("cosine", "nvar", "rmse"):
            assert lo[k] == pytest.approx(gm[k], rel=1e-9), (k, N)


@pytest.mark.saved_results
def test_docs_tables_are_the_saved_results():
    # docs/toy_bandit.md shows markdown_table() of the committed JSON, not numbers copied by hand.
    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "toy_bandit.md").read_text()
    for name, policy, tables in [("toy_table.json", "tabular", [("nvar", 1), ("gain", 2), ("alpha", 2), ("cosine", 2)]),
                                 ("toy_table_shared.json", "shared", [("nvar", 2), ("gain", 2)])]:
        rows = [r for r in json.loads((root / "benchmarks" / "results" / name).read_text())["rows"]
                if r["estimator"] != "otb_exact_w"]
        for key, digits in tables:
            title = ("gain over group_mean" if key == "gain" else key) + f" ({policy})"
            assert th.markdown_table(rows, key, title, digits) in doc, (name, key)


@pytest.mark.saved_results
@pytest.mark.parametrize("name, policy", [("toy_table.json", "tabular"), ("toy_table_shared.json", "shared")])
def test_committed_toy_tables_have_the_rows_and_keys_toy_harness_writes_today(name, policy):
    # The committed tables must be regenerated when toy_harness.py gains or loses an estimator (or a
    # column): their (estimator, N) rows and each row's keys must be what a run writes today. Only the
    # row set and the keys are compared, not the numbers, which depend on the CPU's rounding.
    saved = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / name).read_text())
    cfg, args = th.parse_args(["--policy", policy] if policy != "tabular" else [])
    assert saved["config"] == {k: getattr(cfg, k) for k in saved["config"]} and set(saved["config"]) == set(
        th.asdict(cfg)), "the committed table was made with another configuration than the documented command"
    en = te.enumerate_toy(cfg)
    names = list(th.make_estimators(en))
    assert {(r["estimator"], r["N"]) for r in saved["rows"]} == {(e, N) for e in names for N in args.Ns}
    assert len(saved["rows"]) == len(names) * len(args.Ns)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as toy_harness.main runs it
    try:
        today = th.measure(en, Ns=[2], groups=50, replicates=20)
    finally:
        torch.set_default_dtype(previous)
    keys = {frozenset(r) for r in today}
    assert len(keys) == 1 and all(frozenset(r) in keys for r in saved["rows"])
