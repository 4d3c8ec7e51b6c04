"""Notebook tier: the tutorial notebooks run top to bottom and their stored outputs are current.

They are committed with outputs (a reader on the web sees numbers and figures); a fresh run must
print the same text (wall-clock times masked) and draw the same number of figures, else the
notebook is stale: re-run `python notebooks/execute.py`. The two figures of docs/teaching.md's
two-hour path come from notebooks/teaching_figures.py, run here into a temporary folder.
"""
import sys

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "notebooks"))
import execute  # noqa: E402  (notebooks/execute.py)
import teaching_figures  # noqa: E402  (notebooks/teaching_figures.py)


@pytest.mark.parametrize("path", execute.TUTORIALS)
def test_tutorial_is_stored_with_current_outputs(path):
    stored = nbformat.read(str(ROOT / path), as_version=4)
    assert sum(bool(c.get("outputs")) for c in stored.cells if c.cell_type == "code") >= 3, \
        f"{path} is stored without outputs: run python notebooks/execute.py"
    fresh = execute.execute(path)
    assert execute.stale_cells(stored, fresh) == [], f"{path} is stale: run python notebooks/execute.py"


def test_the_staleness_check_sees_a_changed_number_but_not_a_time():
    cell = nbformat.v4.new_code_cell("print(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="nvar 12.5, done in 3.2 s\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    other.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="nvar 12.5, done in 4.9 s\n")]
    assert execute.stale_cells(nb, other) == []  # only the time changed
    other.cells[0].outputs[0]["text"] = "nvar 12.6, done in 4.9 s\n"
    assert execute.stale_cells(nb, other) == ["code cell 0: text differs"]
    other.cells[0].outputs.append(nbformat.v4.new_output("display_data", data={"image/png": "AAAA"}))
    other.cells[0].outputs[0]["text"] = "nvar 12.5, done in 1 s\n"
    assert execute.stale_cells(nb, other) == ["code cell 0: 0 figure(s) stored, 1 fresh"]


def test_teaching_figures_are_written_and_the_baselines_behind_figure_1_are_exact(tmp_path):
    import torch
    import toy_env
    en = toy_env.enumerate_toy(toy_env.ToyConfig())
    b = teaching_figures.baselines_by_position(en)
    oracle = toy_env.oracle_baselines(en)
    # on the tabular policy, weighting by w_t gives the exact per-position optimum (a linear solve in toy_env)
    assert torch.allclose(b["w_weighted"], oracle["opt_per_position"], atol=1e-10)
    assert torch.allclose(b["otb"], oracle["otb_population"], atol=1e-12)
    assert torch.isclose(b["otb"][0], b["w_weighted"][0], atol=1e-12)  # W_0 = w_0
    assert (b["otb"] - b["w_weighted"]).abs().max() > 0.1  # and they part later: W_t is a choice
    assert abs(b["active"][0] - 1) < 1e-12 and (b["active"].diff() <= 1e-12).all()
    assert teaching_figures.main(["--out", str(tmp_path)]) == 0
    for name in ("baselines.png", "masks.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (ROOT / "docs" / "figures" / name).is_file(), f"docs/figures/{name}: run python notebooks/teaching_figures.py"


def test_energy_by_outcome_splits_the_running_responses_consistently():
    import toy_env
    en = toy_env.enumerate_toy(toy_env.ToyConfig())
    for t in (3, 6):
        split = teaching_figures.energy_by_outcome(en, t)
        running = en.pi * en.mask[:, t]
        p = split["success_share"]
        assert abs(p - (running * en.G[:, t]).sum().item() / running.sum().item()) < 1e-12  # G_t = R when running
        for name, x in (("w", en.w_proxy[:, t]), ("W", (en.w_proxy * en.mask).cumsum(-1)[:, t])):
            overall = (running * x).sum().item() / running.sum().item()
            assert abs((1 - p) * split[name][0] + p * split[name][1] - overall) < 1e-12  # the two parts mix back
