# Colab / JupyterHub setup: paste this as the first cell of any notebook of the project and run it once
# per session. It fetches the project (a git clone), installs its requirements and sets OTB_ROOT, which
# the notebook's own first cell reads to find otb.py. Locally, inside the project, it is not needed.
import os
import subprocess
import sys
from pathlib import Path

OTB_REPO = os.environ.get("OTB_REPO", "https://github.com/YOUR-ORG/otb.git")  # the class's copy: a URL or a path
root = Path(os.environ.get("OTB_ROOT") or Path.home() / "otb")
if not (root / "otb.py").is_file():
    subprocess.run(["git", "clone", "--quiet", OTB_REPO, str(root)], check=True)
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(root / "requirements.txt")], check=True)
os.environ["OTB_ROOT"] = str(root)
print(f"the OTB project is in {root}; now run the notebook from its first cell")
