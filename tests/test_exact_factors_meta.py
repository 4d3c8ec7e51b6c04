"""The factors sweep across seeds (benchmarks/factors_meta.py): the committed table is what the script
writes from the saved sufficient statistics, its per-seed log ratios and pooled ratios are the saved
sweeps' own, and the numbers docs/tool_use.md and the README print are rows of it."""
import json
import math
from pathlib import Path

import pytest

from benchmarks import factors_meta as fm
from saved import same_record, same_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "factors_meta"


@pytest.mark.saved_results
def test_the_committed_table_is_what_the_script_writes_from_the_saved_sweeps(tmp_path):
    fm.main(["--out", str(tmp_path)])  # both up to another CPU's rounding (tests/saved.py)
    same_text((tmp_path / "summary.md").read_text(), (RESULTS / "summary.md").read_text(), "summary.md")
    same_record(json.loads((tmp_path / "results.json").read_text()), json.loads((RESULTS / "results.json").read_text()))


@pytest.mark.saved_results
def test_per_seed_ratios_and_pooled_ratios_are_the_saved_sweeps():
    rows = json.loads((RESULTS / "results.json").read_text())["rows"]
    for name, folder in fm.FOLDERS.items():
        saved = json.loads((ROOT / folder / "results.json").read_text())["otb_tir_over_otb"]
        for cell in saved:
            row = next(r for r in rows if r["N"] == cell["N"] and r["seeds_set"] == name)
            assert row["pooled"] == pytest.approx(cell["gain"], rel=1e-12)
            for y, (point, _, _) in zip(row["y"], cell["per_seed"]):
                assert y == pytest.approx(math.log(point), abs=1e-12)
            if not math.isnan(cell["random_effects"]["gain"][0]):  # the sweep's own DL row, where it formed one
                assert row["dl"] == pytest.approx(cell["random_effects"]["gain"], rel=1e-9)


@pytest.mark.saved_results
def test_docs_print_rows_of_the_committed_table():
    table = [line for line in (RESULTS / "summary.md").read_text().splitlines() if line.startswith("|")]
    doc = (ROOT / "docs" / "tool_use.md").read_text()
    assert all(line in doc for line in table)
    readme = (ROOT / "README.md").read_text()
    row = next(r for r in json.loads((RESULTS / "results.json").read_text())["rows"]
               if r["N"] == 4 and r["seeds_set"] == "all 12 seeds")
    for text in (f"{row['pooled'][0]:.2f}x [{row['pooled'][1]:.2f}x, {row['pooled'][2]:.2f}x]",
                 f"{row['dl'][0]:.2f} [{row['dl'][1]:.2f}, {row['dl'][2]:.2f}]",
                 f"[{row['hk'][1]:.2f}, {row['hk'][2]:.2f}]", f"[{row['pi'][0]:.2f}, {row['pi'][1]:.2f}]"):
        assert text in readme, text
