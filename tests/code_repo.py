"""A throwaway git checkout for the tests of what the experiment scripts record of their code
(lab/machine.py's ``provenance``): ``checkout`` makes one with a committed train.py and points
lab.machine at it, ``commit`` commits what is there, ``edit`` leaves an uncommitted change."""
import subprocess
from pathlib import Path

from lab import machine


def git(path, *args):
    return subprocess.run(["git", "-C", str(path), "-c", "user.name=test", "-c", "user.email=test@example.com",
                           *args], capture_output=True, text=True, check=True).stdout.strip()


def commit(path, message="a commit"):
    """Commit everything in path; returns the new HEAD (40 hex digits)."""
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD")


def checkout(path, monkeypatch):
    """A git checkout at path holding train.py, committed, that lab.machine reads as the repository;
    returns its HEAD."""
    Path(path).mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    (Path(path) / "train.py").write_text("print('first')\n")
    monkeypatch.setattr(machine, "ROOT", Path(path))
    return commit(path, "first")


def edit(path, name="train.py"):
    """An uncommitted change to a code file of the checkout."""
    (Path(path) / name).write_text("print('changed')\n")
