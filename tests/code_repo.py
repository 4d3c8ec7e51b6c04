"""A throwaway git checkout for the tests of what the experiment scripts record of their code
(lab/machine.py's ``provenance``): ``checkout`` makes one with a committed train.py and points
lab.machine at it, ``commit`` commits what is there, ``edit`` leaves an uncommitted change.

``project`` makes one that runs: the project's code files as they are in this working tree, committed,
with lab.machine and the given benchmark modules pointed at it, so that the train.py runs a study
starts are the copy's and record the copy's code (``touch`` then changes a file without breaking it)."""
import shutil
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


def project(path, monkeypatch, *modules):
    """A git checkout at path holding the project's code files (lab.machine's CODE) as this working tree has
    them, committed; lab.machine and each of ``modules`` (their ROOT) point at it. Returns its HEAD."""
    here = machine.ROOT
    files = git(here, "ls-files", "--cached", "--others", "--exclude-standard", "--", *machine.CODE).splitlines()
    for name in files:
        if (here / name).exists():  # a file deleted in the working tree is not copied
            (Path(path) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(here / name, Path(path) / name)
    git(path, "init", "-q")
    for module in (machine, *modules):
        monkeypatch.setattr(module, "ROOT", Path(path))
    return commit(path, "the project")


def touch(path, name="train.py"):
    """An uncommitted change to a code file of the checkout that leaves it working (a comment line added)."""
    with open(Path(path) / name, "a") as f:
        f.write("# an edit made while a study runs\n")
