"""What a saved result records of where it was made, and how a fresh result is held against it on
another CPU (lab/machine.py).

- Every results file that a test regenerates records the machine that measured it and the commit of
  the code that did ("not recorded" for results saved before commits were: never a guess).
- ``provenance`` reads the commit and the uncommitted changes to the code from git.
- ``rounding_moves`` lets a rounded number move by one unit of its last printed digit and nothing else.
- The settings under which .ci/run repeats the saved-result tests really change a float, and the
  fingerprint sees them, so those passes cannot pass by running the first one again.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from code_repo import checkout, commit
from lab import machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# the results files a test regenerates from saved statistics or runs, and the tests that do
REGENERATED = {
    "equal_tokens/results.json": "test_exact_equal_tokens.py",
    "factors_meta/results.json": "test_exact_factors_meta.py",
    "horizon_sweep/results.json": "test_exact_horizon_sweep.py",
    "calculator_sweep/results.json": "test_exact_horizon_sweep.py",
    "factors_sweep/results.json": "test_exact_horizon_sweep.py",
    "factors_sweep_128/results.json": "test_exact_horizon_sweep.py",
    "factors_replication/results.json": "test_exact_horizon_sweep.py",
    "smollm2_variance/results.json": "test_exact_horizon_sweep.py",
    "grad_variance/results.json": "test_naive_grad_variance.py",
    "default_run/summary.json": "test_e2e_default_run.py",
    "stability/results.json": "test_exact_stability.py",
    "stability_replication/results.json": "test_exact_stability_replication.py",
}
# .ci/run's other CPUs: ATen's unvectorised kernels with MKL's compatible path, and (where the CPU has
# AVX-512) ATen's and MKL's AVX2 code, which is how a CPU without AVX-512 computes
OTHER_CPUS = {"DEFAULT": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
              "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}}


def check_made_on(record, where):
    """A machine record (a dict naming the CPU, or NOT_RECORDED) and a provenance record (a commit of 40
    hex digits or NOT_RECORDED, and the changed code files: a list, or None where unknown)."""
    made = record["machine"]
    assert made == machine.NOT_RECORDED or (isinstance(made, dict) and made.get("cpu")), where
    provenance = record["provenance"]
    for p in provenance if isinstance(provenance, list) else [provenance]:  # a list: one per commit it ran under
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) or p["commit"] == machine.NOT_RECORDED, where
        assert p["code_changes"] is None or isinstance(p["code_changes"], list), where


@pytest.mark.parametrize("name", sorted(REGENERATED))
def test_every_regenerated_result_records_its_machine_and_commit(name):
    record = json.loads((RESULTS / name).read_text())
    assert (ROOT / "tests" / REGENERATED[name]).read_text().count(name.split("/")[0]) >= 1  # a test reads it
    if "sources" in record:  # an analysis across saved sweeps: each sweep's record
        assert record["sources"]
        for folder, made_on in record["sources"].items():
            check_made_on(made_on, f"{name}: {folder}")
    elif "code" in record:  # a study of many runs (benchmarks/stability.py): each run's commit and machine
        code = record["code"]
        recorded = [c for c in code["runs"].values() if c != "commit not recorded"]
        assert code["runs"] and len(recorded) + code["not_recorded"] == len(code["runs"]), name
        assert all(re.fullmatch(r"[0-9a-f]{40}", c) for c in code["commits"]), name
        assert len(code["machines"]) >= (1 if recorded else 0), name
    else:
        check_made_on(record, name)


def test_provenance_names_the_commit_and_the_code_changed_since(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    first = checkout(repo, monkeypatch)  # a committed train.py, lab.machine pointed at it
    (repo / "lab").mkdir()
    (repo / "notes.md").write_text("notes\n")
    second = commit(repo)
    assert machine.provenance() == {"commit": second, "code_changes": []} and first != second
    (repo / "train.py").write_text("x = 2\n")  # a change to the code
    (repo / "lab" / "new.py").write_text("y = 1\n")  # a new module
    (repo / "lab" / "analysis").mkdir()
    (repo / "lab" / "analysis" / "stats.py").write_text("z = 1\n")  # in lab's sub-package
    (repo / "notes.md").write_text("more notes\n")  # not code: not listed
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("t = 1\n")  # a test is not the code an experiment runs
    assert machine.code_changes() == ["lab/analysis/stats.py", "lab/new.py", "train.py"]
    monkeypatch.setattr(machine, "ROOT", tmp_path / "not-a-checkout")
    (tmp_path / "not-a-checkout").mkdir()
    assert machine.provenance()["commit"] == machine.UNKNOWN and machine.code_changes() is None


def test_rounding_moves_allows_one_unit_of_the_last_digit_and_nothing_else():
    table = "| otb | 0.375 [0.120, 0.631] | 24 seeds | 1.20e-05 |"
    assert machine.rounding_moves(table, table) == []
    assert machine.rounding_moves(table, table.replace("0.375", "0.376").replace("1.20e-05", "1.19e-05")) == [
        "0.375 -> 0.376", "1.20e-05 -> 1.19e-05"]
    assert machine.rounding_moves("| -0.000 |", "| 0.000 |") == ["-0.000 -> 0.000"]
    for changed in (table.replace("0.375", "0.377"),  # two units
                    table.replace("24 seeds", "25 seeds"),  # an integer: a count, exact
                    table.replace("0.375", "0.38"),  # printed with another number of digits
                    table.replace("otb", "rloo"),  # a word
                    table.replace("1.20e-05", "1.20e-04"),  # another exponent
                    table + " |"):  # the layout
        assert machine.rounding_moves(table, changed) is None, changed


PROBE = ("import json, torch\nfrom lab import machine\ntorch.manual_seed(0)\nx = torch.randn(1_000_003)\n"
         "a, b = torch.randn(64, 257), torch.randn(257, 129)\n"
         "print(json.dumps(dict(sum=x.sum().item(), matmul=torch.nn.functional.linear(a, b.T).double().sum().item(), "
         "log_softmax=torch.log_softmax(a, -1).double().sum().item(), fingerprint=machine.fingerprint())))")


def probe(env):
    """A float32 sum (ATen's reduction), a float32 matrix product (MKL's GEMM), a float32 log-softmax
    (ATen's vectorised exp and sum) and the fingerprint, computed in a fresh process with ``env``."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.saved_results
@pytest.mark.parametrize("capability", sorted(OTHER_CPUS))
def test_the_other_cpu_settings_change_a_float_and_the_fingerprint(capability):
    """Each setting under which .ci/run repeats the saved-result tests moves the last bits of a float32
    sum, matrix product or log-softmax (as another CPU does), and the fingerprint sees it, so no
    bit-for-bit branch runs under it. In that pass this process itself runs under the setting."""
    settings = OTHER_CPUS[capability]
    native_env = {k: v for k, v in os.environ.items() if k not in settings}
    native, other = probe(native_env), probe({**native_env, **settings})
    here = native["fingerprint"]["cpu_capability"]
    plays_another_cpu = {"DEFAULT": here != "DEFAULT", "AVX2": here == "AVX512"}[capability]
    if not plays_another_cpu:  # the unvectorised kernels differ from any vectorised ones; AVX2 only from AVX-512
        pytest.skip(f"ATen runs its {here} kernels here: {capability} cannot play another CPU")
    floats = ("sum", "matmul", "log_softmax")
    assert [native[k] for k in floats] != [other[k] for k in floats]
    assert not machine.matches(native["fingerprint"], other["fingerprint"])
    assert other["fingerprint"]["cpu_capability"] == capability
    assert f"MKL_CBWR={settings['MKL_CBWR']}" in other["fingerprint"]["mkl"]
    if all(os.environ.get(k) == v for k, v in settings.items()):  # that pass of .ci/run
        assert machine.fingerprint() == other["fingerprint"]
