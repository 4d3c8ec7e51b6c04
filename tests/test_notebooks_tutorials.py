"""Notebook tier: the tutorial notebooks run top to bottom and their stored outputs are current.

They are committed with outputs (a reader on the web sees numbers and figures); a fresh run must
print the same text (wall-clock times masked) and draw the same number of figures, else the
notebook is stale. Cells tagged machine-dependent (notebook 02's float32 training) are compared as
text only on the machine recorded in the notebook's metadata; elsewhere their numbers are masked
(notebooks/execute.py). The two figures of docs/teaching.md's two-hour path come from
notebooks/teaching_figures.py, run here into a temporary folder.
"""
import os
import sys

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "notebooks"))
import execute  # noqa: E402  (notebooks/execute.py)
from lab import machine  # noqa: E402
import teaching_figures  # noqa: E402  (notebooks/teaching_figures.py)


@pytest.mark.saved_results
@pytest.mark.parametrize("path", execute.TUTORIALS)
def test_tutorial_is_stored_with_current_outputs(path):
    stored = nbformat.read(str(ROOT / path), as_version=4)
    assert sum(bool(c.get("outputs")) for c in stored.cells if c.cell_type == "code") >= 3, \
        f"{path} is stored without outputs: run python notebooks/execute.py"
    fresh = execute.execute(path)
    recorded = stored.metadata.get("machine", {})
    stale, cpu = execute.compare(stored, fresh, machine.matches(recorded))
    assert stale == [], f"{path} is STALE: {'; '.join(stale)}\n{execute.how_to_check([path], {path: recorded})}"
    if cpu:
        print(f"{path}: numbers the CPU decides, not compared on this machine: {'; '.join(cpu)}")


def test_the_staleness_check_sees_a_changed_number_but_not_a_time():
    cell = nbformat.v4.new_code_cell("print(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="nvar 12.5, done in 3.2 s\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    other.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="nvar 12.5, done in 4.9 s\n")]
    assert execute.compare(nb, other)[0] == []  # only the time changed
    other.cells[0].outputs[0]["text"] = "nvar 12.6, done in 4.9 s\n"
    assert execute.compare(nb, other)[0] == [
        "code cell 0: text differs, line 1: stored 'nvar 12.5, done in <time>', here 'nvar 12.6, done in <time>'"]
    other.cells[0].outputs.append(nbformat.v4.new_output("display_data", data={"image/png": "AAAA"}))
    other.cells[0].outputs[0]["text"] = "nvar 12.5, done in 1 s\n"
    assert execute.compare(nb, other)[0] == ["code cell 0: 0 figure(s) stored, 1 here"]


def test_rounding_residues_are_not_stale_but_a_grown_error_is():
    """A float64 residue's digits are the CPU's (1.214e-17 stored, 1.388e-17 on an AVX-512 Xeon for notebook
    01's max |autograd grad J - E[R S]|): below 1e-10 they are not compared; an error of 1e-6 is."""
    stored, fresh = machine_dependent_pair("max |a - b| = 1.214306433183765e-17, S = 1.3e+03\n",
                                           "max |a - b| = 1.3877787807814457e-17, S = 1.3e+03\n", tagged=False)
    assert execute.compare(stored, fresh) == ([], [])
    grown = machine_dependent_pair("max |a - b| = 1.2e-17\n", "max |a - b| = 1.2e-06\n", tagged=False)
    assert execute.compare(*grown) == (["code cell 0: text differs, line 1: stored 'max |a - b| = <1e-10', "
                                        "here 'max |a - b| = 1.2e-06'"], [])
    big = machine_dependent_pair("S = 1.3e+03\n", "S = 1.4e+03\n", tagged=False)
    assert execute.compare(*big)[0] != []


def machine_dependent_pair(stored_text, fresh_text, tagged=True):
    """Two one-cell notebooks, the cell tagged machine-dependent (or not), with these outputs."""
    nbs = []
    for text in (stored_text, fresh_text):
        cell = nbformat.v4.new_code_cell("print(1)", metadata={"tags": ["machine-dependent"]} if tagged else {})
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nbs.append(nbformat.v4.new_notebook(cells=[cell]))
    return nbs


def test_numbers_the_cpu_decides_are_compared_only_on_the_machine_that_stored_them():
    stored, fresh = machine_dependent_pair("warm-up stopped at step 90 with success 0.375\n| otb | 116,424 | 0.517 |\n",
                                           "warm-up stopped at step 100 with success 0.385\n| otb | 115,903 | 0.492 |\n")
    assert execute.compare(stored, fresh, same_machine=True) == (
        ["code cell 0: text differs, line 1: stored 'warm-up stopped at step 90 with success 0.375', "
         "here 'warm-up stopped at step 100 with success 0.385'"], [])
    assert execute.compare(stored, fresh, same_machine=False) == (
        [], ["code cell 0: 90 -> 100, 0.375 -> 0.385, 116,424 -> 115,903, 0.517 -> 0.492"])
    # elsewhere the words, rows and columns are still compared, and an untagged cell is compared whole
    other, changed = machine_dependent_pair("success 0.375\n| otb | 0.517 |\n", "success 0.375\n| grpo | 0.517 |\n")
    assert execute.compare(other, changed, same_machine=False)[0] == [
        "code cell 0: text differs, line 2: stored '| otb | 0.517 |', here '| grpo | 0.517 |'"]
    plain, moved = machine_dependent_pair("success 0.375\n", "success 0.385\n", tagged=False)
    assert execute.compare(plain, moved, same_machine=False)[0] == [
        "code cell 0: text differs, line 1: stored 'success 0.375', here 'success 0.385'"]


def test_an_untagged_number_may_move_by_one_unit_of_its_last_digit_on_another_machine_only():
    """A value within the last bits of a rounding boundary prints either way on two CPUs: in any cell, one
    unit of the last digit is listed as the CPU's on another machine, and is stale on the machine that
    stored it; two units are stale anywhere."""
    stored, fresh = machine_dependent_pair("alpha 0.375, 24 seeds\n", "alpha 0.376, 24 seeds\n", tagged=False)
    assert execute.compare(stored, fresh, same_machine=False) == ([], ["code cell 0: 0.375 -> 0.376"])
    assert execute.compare(stored, fresh, same_machine=True)[0] != []
    stored, fresh = machine_dependent_pair("alpha 0.375, 24 seeds\n", "alpha 0.377, 24 seeds\n", tagged=False)
    assert execute.compare(stored, fresh, same_machine=False)[0] != []


def test_progress_bars_leave_the_same_outputs_with_or_without_ipywidgets(tmp_path, monkeypatch):
    """tqdm.auto draws a widget where ipywidgets is installed (the README's notebook extras) and writes to
    stderr where it is not: neither is stored, so a notebook's outputs are the same either way. Run twice,
    the second time with ipywidgets hidden from the kernel."""
    if os.environ.get("CI") == "true":  # .ci/run installs what the README's Quick start installs
        import ipywidgets  # noqa: F401
    else:
        pytest.importorskip("ipywidgets")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='steps'):\n    pass\nprint('done')")])
    path = tmp_path / "bars.ipynb"
    nbformat.write(nb, str(path))
    from nbclient import NotebookClient
    raw = nbformat.read(str(path), as_version=4)
    NotebookClient(raw, timeout=120, kernel_name="python3").execute()
    assert any(execute.WIDGET in o.get("data", {}) for o in raw.cells[0].outputs)  # a widget bar was drawn
    with_widgets = execute.execute(path)
    hidden = tmp_path / "hidden" / "ipywidgets"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('ipywidgets hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hidden.parent), os.environ.get("PYTHONPATH", "")]))
    without = execute.execute(path)
    assert execute.cell_outputs(with_widgets) == execute.cell_outputs(without) == [("done\n", 0, False)]
    assert "widgets" not in with_widgets.metadata


def test_a_stale_notebook_says_how_to_check_and_not_how_to_overwrite(monkeypatch):
    here = dict(cpu="Some CPU", cpu_capability="AVX512", torch="2.13.0+cpu", mkl="2024.2", transformers="5.24.0")
    monkeypatch.setattr(machine, "fingerprint", lambda: dict(here))
    path = "notebooks/02_training_comparison.ipynb"
    text = execute.how_to_check([path], {path: dict(here, cpu_capability="AVX2", mkl="unknown")})
    assert f"git stash && python notebooks/execute.py --check {path}; git stash pop" in text
    assert "This machine: Some CPU (AVX512), torch 2.13.0+cpu, MKL 2024.2, transformers 5.24.0." in text
    assert (f"{path}: outputs stored on Some CPU (AVX2), torch 2.13.0+cpu, MKL unknown, transformers 5.24.0; "
            "not the same machine (cpu_capability, mkl).") in text
    assert all("--check" in line for line in text.splitlines() if "execute.py" in line)  # none that rewrites it
    same = execute.how_to_check([path], {path: dict(here)})
    assert same.endswith("; the same machine.")


def test_writing_a_notebook_records_the_machine_and_the_tagged_cells_are_02s_training(monkeypatch, tmp_path):
    """execute.py stores the fingerprint with the outputs it writes (here into a copy of notebook 03, with
    the execution itself replaced); notebook 02's warm-up and table cells carry the tag, 01 and 03 none."""
    import shutil
    monkeypatch.setattr(execute, "ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / execute.TUTORIALS[2], tmp_path / execute.TUTORIALS[2])
    monkeypatch.setattr(execute, "execute", lambda path: nbformat.read(str(tmp_path / path), as_version=4))
    assert execute.main([execute.TUTORIALS[2]]) == 0
    written = nbformat.read(str(tmp_path / execute.TUTORIALS[2]), as_version=4)
    assert written.metadata["machine"] == machine.fingerprint()
    tagged = {path: [i for i, c in enumerate(c for c in nbformat.read(str(ROOT / path), as_version=4).cells
                                             if c.cell_type == "code") if execute.TAG in c.metadata.get("tags", [])]
              for path in execute.TUTORIALS}
    assert tagged == {execute.TUTORIALS[0]: [], execute.TUTORIALS[1]: [2, 3], execute.TUTORIALS[2]: []}


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
