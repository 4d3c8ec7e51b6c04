"""The command line's small things: --help explains the log line, a negative number after an option is
checked like any other value, --report-to without its package, a full disk during the warm-up, and no
doc tells a user to run a module that is not a command."""
import re
import shlex
from pathlib import Path

import pytest

import train
from lab import models, parse_options, options
from tiny_runs import TINY

ROOT = Path(train.__file__).resolve().parent


def test_help_ends_with_the_log_line_legend(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0 and text.rstrip().endswith(options.LOG_COLUMNS.rstrip())
    assert "--show-samples" in text and "--no-progress" in text and "--report-to" in text


@pytest.mark.parametrize("value", ["-1e-3", "-0.001", "-inf"])
def test_a_negative_value_after_an_option_is_checked_like_any_other(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--lr", value, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == f"train.py: error: --lr {float(value)}: " + (
        "must be a finite number" if value == "-inf" else "must be > 0")
    assert not (tmp_path / "runs").exists()


def test_negative_values_parse_where_they_are_allowed():
    cfg = parse_options.parse_config(["--compare", "otb:2,group_mean:2", "--seeds", "-1,0", "--token-budget", "99",
                                  "--seed", "-3"], train.Config, options.PRESETS)
    assert (cfg.seeds, cfg.seed) == ("-1,0", -3)


def test_report_to_tensorboard_without_the_package_says_what_to_install(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--report-to", "tensorboard", "--out", str(tmp_path / "runs")])
    assert e.value.code == 2 and capsys.readouterr().err.strip() == (
        "train.py: error: --report-to tensorboard needs the tensorboard package: pip install -r "
        "requirements-tensorboard.txt")
    assert not (tmp_path / "runs").exists()


def test_a_full_disk_during_the_warm_up_says_to_run_the_command_again_which_goes_on(tmp_path, capsys, monkeypatch):
    """The second save of the warm-up's state finds the disk full: one line saying to free space and run
    the same command again, the state saved at step 10 kept; the same command then goes on from it."""
    import shutil
    from collections import namedtuple

    import torch
    argv = TINY + ["--estimator", "otb", "--steps", "1", "--out", str(tmp_path), "--name", "w"]
    real_save, saves = torch.save, []

    def save(obj, path):
        saves.append(path)
        if len(saves) == 2:
            Path(path).write_bytes(b"x" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1000 vs 960")
        real_save(obj, path)
    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: namedtuple("usage", "total used free")(10**9, 10**9, 1000))
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and err.startswith(f"train.py: error: no space left in {tmp_path / '_cache'}: ")
    assert err.endswith("free some space, then run the same command again: python train.py " + shlex.join(argv))
    [state] = (tmp_path / "_cache").iterdir()
    assert state.name.endswith(".warm-up.pt") and torch.load(state, weights_only=True)["step"] == 10
    resumed, real_load = [], models.load_warm_up_state
    monkeypatch.setattr(models, "load_warm_up_state", lambda *a: resumed.append(real_load(*a)) or resumed[-1])
    train.main(argv)
    assert [step for step, _ in resumed] == [10] and (tmp_path / "w" / "DONE").exists()


def test_no_doc_tells_a_user_to_run_a_file_that_is_not_a_command():
    """Every `python X.py` in the README and docs names a file that runs as a command (lab/ holds
    modules that are only imported: `python compare.py` would print nothing)."""
    named = set()
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        named |= set(re.findall(r"python3? ((?:[\w-]+/)*[\w-]+\.py)\b", doc.read_text()))
    assert "train.py" in named and len(named) > 10
    for path in sorted(named):
        text = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        assert '__name__ == "__main__"' in text, f"{path}: named as a command in the docs, but it is not one"
