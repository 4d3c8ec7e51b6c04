"""Shared test plumbing: the repository root on sys.path and one warm-up cache for the run.

The tests come in tiers, named by their file prefix:

- ``test_exact_*``: the maths against exact answers (closed forms, enumeration of the toy bandit,
  autograd, the verl reference vectors in data/, hand-computed cases);
- ``test_naive_*``: vectorised code against the plainest loops, which live in ``naive.py``;
- ``test_inputs_*``: bad input gives one clear error naming it, and nothing is written;
- ``test_e2e_*``: short end-to-end runs of the scripts (train.py, TRL, the experiments);
- ``test_notebooks_*``: the tutorials (stored with current outputs) and the exercises.

A test that repeats a saved result (a table re-analysed from saved statistics, the default run, a
stored notebook) is marked ``saved_results``. .ci/run runs those again under other CPUs' rounding
(``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE``; on an AVX-512 CPU also
``ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2``), which the machine fingerprint sees, so a comparison pinned
to one CPU's last bits fails in CI rather than on a user's machine.

A test of the compiled decode step, the fast sampler or activation checkpointing is marked
``compile_path``: what dynamo can trace and how ATen draws differ between torch versions, so .ci/run
runs these again in a second virtual environment with the lowest torch that requirements.txt allows.

``tiny_runs.py`` holds the tiny train.py configuration and helpers that test_e2e_train.py and
test_inputs_train.py share. The ``out`` fixture gives a test a fresh folder for train.py's --out
whose warm-up cache (``_cache``) is one folder per test process, so each tiny model is warmed up
once per process.

The README's test command runs the suite in parallel processes (pytest-xdist: ``-n auto --dist
loadfile``). ``-n auto`` is one process per CPU core, at most 4 (``pytest_xdist_auto_num_workers``
below): most tests run one thread of small tensors, so a second core halves the wait, while each
process holds its own torch and models (SmolLM2's process several GB). ``--dist loadfile`` keeps
each test file in one process, so a module's fixtures (SmolLM2 loaded from its GGUF file) load
once. Each process gets an equal share of the cores as torch threads (``OMP_NUM_THREADS``, unless it
is set), so that the processes do not fight over the cores. Without ``-n`` the suite runs in one
process, as before; a test must pass both ways.

The modules are plain top-level files (not a package), so the tests import them
by putting the repository root first on ``sys.path``.
"""
import os
import sys
from pathlib import Path

# Before any test module loads torch (and with it OpenMP), as train.py does for itself: waiting
# threads sleep instead of spinning, which a busy machine pays for many times over (docs/cost.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
MAX_PROCESSES = 4  # what `-n auto` starts at most


def usable_cpus():
    """The CPU cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by pytest-xdist in each worker
if PROCESSES > 1:  # the cores shared out among the test processes (and what they start: notebooks, scripts)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // PROCESSES)))

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process per core, at most MAX_PROCESSES (memory: each holds its own torch
    and models). PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides instead (pytest-xdist's own rule)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return max(1, min(MAX_PROCESSES, usable_cpus()))


def pytest_configure(config):
    config.addinivalue_line("markers", "saved_results: repeats a saved result; .ci/run runs these again "
                                       "under another CPU's rounding")
    config.addinivalue_line("markers", "compile_path: the compiled decode step, the fast sampler or activation "
                                       "checkpointing; .ci/run runs these again under requirements.txt's lowest torch")


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test starts with no compiled graphs. torch.compile keeps every graph it makes on the compiled
    function's code, and fails a fullgraph compile past 8 of them (torch._dynamo's recompile limit): a
    training process compiles the decode step once or twice (per batch size), but the suite compiles it
    for a fresh tiny model in test after test. Compiled kernels stay in inductor's cache on disk."""
    if "torch._dynamo" in sys.modules:  # where something was compiled (resetting costs microseconds)
        sys.modules["torch._dynamo"].reset()
    yield


@pytest.fixture(scope="session")
def warm_ups(tmp_path_factory):
    """The warm-up cache of this test process (models.tiny_model_folder writes under it)."""
    return tmp_path_factory.mktemp("warm_ups")


@pytest.fixture
def out(tmp_path, warm_ups):
    """A fresh folder for train.py's --out; its _cache is the session's warm-up cache."""
    (tmp_path / "_cache").symlink_to(warm_ups, target_is_directory=True)
    return tmp_path
