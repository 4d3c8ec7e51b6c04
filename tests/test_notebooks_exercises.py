"""The classroom exercises: solutions pass their checks, blanks fail them helpfully, checks diagnose.

Three kinds of test:
1. the stored notebooks are exactly what ``notebooks/exercises/build.py`` makes from the solutions
   (so a blank and its solution cannot drift) and carry no outputs;
2. every solution notebook runs and every check cell prints CORRECT; every blank notebook runs top to
   bottom without an exception and its first check prints NOT YET CORRECT with a problem and a hint;
3. the check functions recognise the usual mistakes (overflow, bf16, missing clamp, padding, interleaved
   or singleton groups, a dropped eps, a biased variance) and say so, and accept the project's own code.
"""
import sys
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "notebooks" / "exercises"
sys.path.insert(0, str(EXERCISES))

import build  # noqa: E402
import check  # noqa: E402
import otb  # noqa: E402

NAMES = sorted(p.name for p in (EXERCISES / "solutions").glob("*.ipynb"))


def _check_outputs(nb):
    """The printed text of every cell tagged 'check', in order."""
    out = []
    for cell in nb.cells:
        if "check" in cell.get("metadata", {}).get("tags", []):
            out.append("".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"))
    return out


# =====================================================================================
# 1. The stored notebooks
# =====================================================================================

def test_five_exercises_in_order():
    assert [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_"]
    assert sorted(p.name for p in EXERCISES.glob("*.ipynb")) == NAMES


def test_blank_notebooks_are_built_from_the_solutions():
    stale = [str(p.relative_to(ROOT)) for p, text in build.expected_files().items() if p.read_text() != text]
    assert not stale, f"run `python notebooks/exercises/build.py`; out of date: {stale}"


@pytest.mark.parametrize("name", NAMES)
def test_blanks_hide_every_solution_and_are_marked(name):
    blank = nbformat.read(str(EXERCISES / name), as_version=4)
    text = "\n".join(c.source for c in blank.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "TODO(student)" in text
    solution_text = "\n".join(c.source for c in nbformat.read(str(EXERCISES / "solutions" / name), as_version=4).cells)
    assert solution_text.count("### BEGIN SOLUTION") == text.count("TODO(student): fill in the lines above")


def test_builder_replaces_blocks_and_keeps_indentation():
    src = "def f(x):\n    # TODO(student): double it\n    ### BEGIN SOLUTION\n    y = 2 * x\n    return y\n" \
          "    ### END SOLUTION\n\nz = 1\n### BEGIN SOLUTION (blank: answer = None)\nanswer = 42\n### END SOLUTION"
    assert build.blank_code(src) == ("def f(x):\n    # TODO(student): double it\n"
                                     "    return None  # TODO(student): fill in the lines above\n\nz = 1\n"
                                     "answer = None  # TODO(student): fill in the lines above")
    with pytest.raises(ValueError):
        build.blank_code("### BEGIN SOLUTION\nx = 1\n")


# =====================================================================================
# 2. Running the notebooks
# =====================================================================================

@pytest.mark.parametrize("name", NAMES)
def test_solution_notebook_passes_every_check(run_notebook, name):
    nb = run_notebook(f"notebooks/exercises/solutions/{name}", timeout=120)
    outputs = _check_outputs(nb)
    assert len(outputs) >= 2, "each exercise has at least two checks"
    for text in outputs:
        assert check.CORRECT in text and check.NOT_YET not in text, text


@pytest.mark.parametrize("name", NAMES)
def test_blank_notebook_runs_and_fails_its_checks_helpfully(run_notebook, name):
    nb = run_notebook(f"notebooks/exercises/{name}", timeout=120)  # raises if any cell crashes
    outputs = _check_outputs(nb)
    first = outputs[0]
    assert check.NOT_YET in first and "problem:" in first and "hint:" in first, first
    assert "TODO(student)" in first  # points the student at the blank
    for text in outputs:
        assert check.NOT_YET in text and f"{check.CORRECT}." not in text.replace(check.NOT_YET, ""), text


# =====================================================================================
# 3. The checks themselves
# =====================================================================================

def _verdict(capsys, fn, *args, **kwargs):
    ok = fn(*args, **kwargs)
    return ok, capsys.readouterr().out


def _group(fn):
    return lambda r, m, g: fn(r, m, g)[0]


def _otb(**fixed):
    return lambda *a, **k: otb.optimal_token_baseline(*a, **{**k, **fixed})[0]


def test_checks_accept_the_project_functions(capsys):
    assert _verdict(capsys, check.ex1a_sum_pi_squared, otb.sum_pi_squared)[0]
    assert _verdict(capsys, check.ex1b_token_energy, otb.token_energy)[0]
    assert _verdict(capsys, check.ex2b_group_mean, _group(otb.group_mean))[0]
    assert _verdict(capsys, check.ex2c_rloo, _group(otb.rloo))[0]
    assert _verdict(capsys, check.ex3c_optimal_token_baseline, _otb())[0]
    assert _verdict(capsys, check.ex3c_optimal_token_baseline, _otb(), leave_one_out=True)[0]
    assert _verdict(capsys, check.ex5c_action_aligned_otb, lambda *a, **k: otb.action_aligned_otb(*a, **k)[0])[0]


def _naive_group_mean(r, m, g):
    """Group mean with contiguous equal groups assumed (reshape), padding ignored correctly."""
    R = (r * m).sum(-1)
    n = len(set(g.tolist() if isinstance(g, torch.Tensor) else g))
    return (R - R.reshape(n, -1).mean(1).repeat_interleave(len(R) // n))[:, None] * m


def _mean_including_singletons(r, m, g):
    R = (r * m).sum(-1)
    gid, n = otb.group_ids(g, len(R))
    means = torch.stack([R[gid == k].mean() for k in range(n)])
    return (R - means[gid])[:, None] * m


MISTAKES = [  # (check, wrong implementation, words the message must contain)
    (check.ex1a_sum_pi_squared, lambda z: (z.exp() ** 2).sum(-1) / z.exp().sum(-1) ** 2, ["huge", "logsumexp"]),
    (check.ex1a_sum_pi_squared, lambda z: (z.softmax(-1) ** 2).sum(-1), ["bf16", "float32"]),
    (check.ex1a_sum_pi_squared, lambda z: (z.float().softmax(-1) ** 2).sum(-1), ["float64"]),
    (check.ex1b_token_energy, lambda lp, s: 1 - 2 * lp.exp() + s, ["clamp"]),
    (check.ex1b_token_energy, lambda lp, s: 1 - lp.exp() + s, ["factor 2"]),
    (check.ex2a_sequence_scores, lambda r, m: r.sum(-1), ["padding"]),
    (check.ex2b_group_mean, lambda r, m, g: _group(otb.group_mean)(r * 0 + r, torch.ones_like(m), g) * m,
     ["padding"]),
    (check.ex2b_group_mean, _naive_group_mean, ["interleaved"]),
    (check.ex2b_group_mean, _mean_including_singletons, ["singleton"]),
    (check.ex2c_rloo, _group(otb.group_mean), ["one group of 4"]),
    (check.ex3a_reward_to_go, lambda r, m: (r * m).sum(-1, keepdim=True) * m, ["dense", "reversed cumulative"]),
    (check.ex3c_optimal_token_baseline, _otb(eps=0.0), ["certain", "eps"]),
    (check.ex3c_optimal_token_baseline,
     lambda r, m, g, lp, s, **k: _otb()(r, torch.ones_like(m), g, lp, s) * m, ["padding", "active"]),
    (check.ex3c_optimal_token_baseline, lambda r, m, g, lp, s, **k: _otb()(r, m, list(range(len(r))), lp, s),
     ["one group of 4"]),
    (check.ex5a_action_index, lambda m: torch.where(m.bool(), torch.arange(m.shape[1]), -1), ["position t"]),
    (check.ex5a_action_index, lambda m: torch.where(m.bool(), m.long().cumsum(-1), -1), ["starts at 1"]),
    (check.ex5c_action_aligned_otb, _otb(), ["by position", "to_actions"]),
    (check.ex5c_action_aligned_otb, lambda *a, **k: otb.action_aligned_otb(*a)[0], ["leave_one_out"]),
]


def test_compaction_check_names_a_lost_order_and_a_hole_that_is_not_zero(capsys):
    def to_actions(x, m):  # unstable: the actions' order is lost
        idx = torch.argsort((m == 0).float() + 1e-3 * torch.rand(m.shape), dim=-1)
        return x.gather(-1, idx), m.gather(-1, idx)

    def from_actions(y_k, m):
        idx = torch.argsort(m == 0, dim=-1, stable=True)
        return torch.zeros_like(y_k).scatter(-1, idx, y_k) * m
    ok, out = _verdict(capsys, check.ex5b_compaction, to_actions, from_actions)
    assert not ok and "stable=True" in out
    ok, out = _verdict(capsys, check.ex5b_compaction, lambda x, m: (x.gather(-1, torch.argsort(m == 0, dim=-1,
                       stable=True)), m.gather(-1, torch.argsort(m == 0, dim=-1, stable=True))),
                       lambda y, m: from_actions(y, m) / m.clamp(min=1) + (1 - m))  # holes hold 1
    assert not ok and "must be 0" in out


@pytest.mark.parametrize("k", range(len(MISTAKES)))
def test_checks_name_the_mistake(capsys, k):
    fn, wrong, words = MISTAKES[k]
    ok, out = _verdict(capsys, fn, wrong)
    assert not ok and check.NOT_YET in out and "hint:" in out
    for word in words:
        assert word in out, (word, out)


def test_loo_check_requires_zero_baseline_without_other_rows(capsys):
    ok, out = _verdict(capsys, check.ex3c_optimal_token_baseline,
                       lambda *a, **k: otb.optimal_token_baseline(*a)[0], leave_one_out=True)
    assert not ok and check.NOT_YET in out


def test_a_crashing_student_function_is_reported_not_raised(capsys):
    def broken(z):
        raise IndexError("oops")
    ok, out = _verdict(capsys, check.ex1a_sum_pi_squared, broken)
    assert not ok and "IndexError: oops" in out


@pytest.fixture(scope="module")
def toy():
    import toy_env
    import toy_harness
    return toy_env.enumerate_toy(toy_env.ToyConfig())


def test_toy_checks_diagnose_sum_instead_of_mean_and_biased_statistics(capsys, toy):
    import toy_env
    import toy_harness

    def summed(en, A, rows, N):
        return N * toy_harness.batch_gradients(en, A, rows, N)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, summed, toy)
    assert not ok and "mean" in out

    def zeros(en, A, rows, N):  # right shape, no work: the sparse toy must not let this through
        return torch.zeros(len(rows) // N, en.scores.shape[-1], dtype=en.scores.dtype)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, zeros, toy)
    assert not ok and "differ" in out and "times too large" not in out

    def ungathered(en, A, rows, N):  # scores of responses 0..G*N-1 instead of the sampled rows
        g = torch.einsum("bt,btp->bp", A, en.scores[: len(rows)])
        return g.reshape(-1, N, g.shape[-1]).mean(1)
    ok, out = _verdict(capsys, check.ex4a_batch_gradients, ungathered, toy)
    assert not ok and "en.scores[rows]" in out

    def naive_bias(g_hat, grad_J):
        var = ((g_hat - g_hat.mean(0)) ** 2).sum() / (len(g_hat) - 1)
        return ((g_hat.mean(0) - grad_J) ** 2).sum().item(), var.item()
    ok, out = _verdict(capsys, check.ex4b_bias_and_variance, naive_bias)
    assert not ok and "variance / G" in out

    def var_over_G(g_hat, grad_J):
        stats = toy_harness.gradient_stats(g_hat, grad_J)[0]
        return stats["bias2"], stats["variance"] * (len(g_hat) - 1) / len(g_hat)
    ok, out = _verdict(capsys, check.ex4b_bias_and_variance, var_over_G)
    assert not ok and "G - 1" in out

    def unseeded(en, name, N, groups, seed):  # different groups than asked for
        r = toy_harness.measure(en, Ns=(N,), groups=groups, seed=seed + 1, names=[name])[0]
        return r["bias2"], r["variance"]
    ok, out = _verdict(capsys, check.ex4c_measure, unseeded, toy, Ns=(2,), groups=500)
    assert not ok and "sample_groups" in out
