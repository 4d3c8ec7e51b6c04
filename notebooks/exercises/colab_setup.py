# Colab / JupyterHub setup: paste this as the first cell of any notebook of the project and run it once
# per session. It fetches the class copy of the project (a git clone of OTB_REPO: the repository the
# teacher pushed handout.py's copy to), says in one line whether the torch and transformers at hand meet
# requirements.txt (Colab's may be older) and what pip will install, installs the requirements and sets
# OTB_ROOT, which the notebook's own first cell reads to find otb.py. Locally, inside the project, it is
# not needed.
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement  # pip's own parser of requirement lines

OTB_REPO = os.environ.get("OTB_REPO", "https://github.com/YOUR-ORG/otb-class.git")  # the class copy: a URL or a path


class SetupError(Exception):
    def _render_traceback_(self):  # Jupyter shows the message alone, one line, without a traceback
        return [f"SetupError: {self}"]


root = Path(os.environ.get("OTB_ROOT") or Path.home() / "otb")
if not (root / "otb.py").is_file():
    clone = subprocess.run(["git", "clone", "--quiet", OTB_REPO, str(root)], capture_output=True, text=True)
    if clone.returncode != 0:
        why = (clone.stderr.strip().splitlines() or ["git gave no message"])[-1]
        raise SetupError(f"git could not clone OTB_REPO = {OTB_REPO} ({why}); set OTB_REPO at the top of this "
                         f"cell to the class copy's git URL that your teacher gave you, then run the cell again")


def _installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


wanted = [Requirement(line.split("#")[0]) for line in (root / "requirements.txt").read_text().splitlines()
          if line.split("#")[0].strip()]
have = {r.name: _installed(r.name) for r in wanted if r.name in ("torch", "transformers")}
short = [f"{r.name} {have[r.name] or '(none)'} -> {r.name}{r.specifier}" for r in wanted if r.name in have
         and not (have[r.name] and r.specifier.contains(have[r.name], prereleases=True))]
print(f"pip will install {', '.join(short)} (requirements.txt; a new torch takes minutes), then the rest"
      if short else f"torch {have['torch']} and transformers {have['transformers']} meet requirements.txt; pip "
      f"installs only the rest of it")
pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(root / "requirements.txt")],
                     capture_output=True, text=True)
if pip.returncode != 0:  # its first ERROR line, colour codes stripped (Colab's kernel sets FORCE_COLOR=1)
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", pip.stderr).splitlines() if line.strip()]
    why = next((line for line in lines if line.startswith("ERROR:")), lines[-1] if lines else "pip gave no message")
    raise SetupError(f"pip could not install {root / 'requirements.txt'} ({why})")
os.environ["OTB_ROOT"] = str(root)
print(f"the OTB project is in {root}; now run the notebook from its first cell")
