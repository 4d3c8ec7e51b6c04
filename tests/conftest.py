"""Shared test plumbing: the repository root on sys.path and a notebook runner.

The modules are plain top-level files (not a package), so the tests import them
by putting the repository root first on ``sys.path``.
"""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def run_notebook():
    """Execute a notebook top to bottom with the repository root as working directory.

    Returns the executed ``nbformat`` notebook; a failing cell raises
    ``nbclient.exceptions.CellExecutionError`` with the cell's traceback.
    """
    import nbformat
    from nbclient import NotebookClient

    def run(path, timeout=300):
        nb = nbformat.read(str(ROOT / path), as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
        return nb

    return run
