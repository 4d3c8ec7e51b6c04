"""A run a person can watch: the header first, a sampled response on each log line, the comparison's
plot redrawn as each configuration finishes, TensorBoard, no bar noise in a log file, a closed terminal
(SIGHUP) stopping like Ctrl-C, and a checkpoint from the first step on."""
import dataclasses
import io
import json
import os
import pty
import re
import shlex
import signal
import sys
from pathlib import Path

import pytest
import torch

import tasks
import train
from lab import compare, models, progress, options
from lab import runs as lab_runs
from tiny_runs import TINY, interrupt_at, metrics, run, without_times

ROOT = Path(train.__file__).resolve().parent
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
try:
    import tensorboard  # noqa: F401
    HAS_TENSORBOARD = True
except ImportError:
    HAS_TENSORBOARD = False


@pytest.fixture(scope="module")
def out(tmp_path_factory, warm_ups):
    """One --out folder for this module's runs (distinct --name each), the session's warm-up cache."""
    folder = tmp_path_factory.mktemp("runs")
    (folder / "_cache").symlink_to(warm_ups, target_is_directory=True)
    return folder


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as a person's is: the bars draw on it."""

    def isatty(self):
        return True


# ----------------------------------------------------------------------------- the header, the warm-up

def test_the_header_comes_first_and_says_whether_the_warm_up_is_cached(tmp_path, capsys):
    argv = TINY + ["--out", str(tmp_path), "--compare", "otb:2,group_mean:4", "--steps", "1", "--lr", "3e-4"]
    train.main(argv + ["--name", "first"])
    first = capsys.readouterr().out.splitlines()
    [cache] = (tmp_path / "_cache").iterdir()
    assert first[:8] == [
        "python train.py " + shlex.join(argv + ["--name", "first"]),
        f"  output  {tmp_path / 'first'}",
        f"  model   tiny; warm-up: runs now (to sampled success 0.15, at most 60 steps), then cached in {cache}",
        "  task    reverse (horizon 2)",
        "  runs    otb N=2, group_mean N=4  (2 configurations, one after another)",
        "  steps   1, 4 prompts x N responses each; seed 0",
        "  lr      0.0003 (constant schedule)",
        f"  device  cpu, {torch.get_num_threads()} threads"]
    assert first[8].startswith("  time    about ") and "(warm-up " in first[8] and ", not cached; 2 steps)" in first[8]
    step, success = json.loads((cache / "warmup.json").read_text())["history"][-1]
    stopped = [line for line in first if line.startswith("warm-up: stopped")]  # after any heartbeat line
    assert stopped[0].startswith(f"warm-up: stopped at step {step} with sampled success {success:.2f} in ")
    train.main(argv + ["--name", "second"])
    second = capsys.readouterr().out.splitlines()
    assert second[2] == f"  model   tiny; warm-up: from the cache ({cache})"
    assert "(warm-up cached; 2 steps)" in second[8]
    assert not any(line.startswith("warm-up:") for line in second)


def test_the_time_estimate_is_the_measured_rates_times_the_work():
    """The header's range: start-up, the warm-up (unless cached) and every sampled response position at the
    rates measured on the 2-core CPUs (progress.STEP_SECONDS, WARMUP_SECONDS). The default comparison samples
    16 prompts x (4 + 4 + 4 + 4 + 16) responses x 100 steps x 18 positions = 921,600 positions: 10 + 25 +
    110.6 = 146 s to 10 + 100 + 331.8 = 442 s, shown as 2-7 min; cached, 121-342 s, 2-6 min."""
    cfg = train.Config()
    runs = lab_runs.runs_of(cfg)
    assert progress.estimate(cfg, runs, 18, warm_up_runs=True).startswith("about 2-7 min on a 2-core CPU (warm-up")
    assert progress.estimate(cfg, runs, 18, warm_up_runs=False) == (
        "about 2-6 min on a 2-core CPU (warm-up cached; 500 steps)")
    one = dataclasses.replace(cfg, estimator="otb", steps=10)  # 16 x 4 x 10 x 18 = 11,520 positions
    assert progress.estimate(one, [("otb", 4)], 18, warm_up_runs=False) == "about 11-14 s on a 2-core CPU (warm-up " \
                                                                             "cached; 10 steps)"
    assert progress.estimate(dataclasses.replace(cfg, model="smollm2"), runs, 18, warm_up_runs=False) is None
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "tiny language model: 2-7 minutes on a\n   2-core CPU, warm-up included" in readme  # what the header says


def test_a_log_file_gets_a_progress_line_through_the_warm_up_and_the_steps(tmp_path, capsys, monkeypatch):
    """Where no bar is drawn (stdout and stderr captured: no terminal), the heartbeat prints where the run
    is once HEARTBEAT_SECONDS have passed: here 0, so after every warm-up step and every training step."""
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0)
    train.main(TINY + ["--out", str(tmp_path), "--estimator", "otb", "--group-size", "2", "--steps", "2",
                       "--warmup-max-steps", "20"])
    lines = capsys.readouterr().out.splitlines()
    warm = [line for line in lines if line.startswith("warm-up: step ")]
    assert warm[0].startswith("warm-up: step 1 of at most 20, ") and len(warm) == len({w.split(",")[0] for w in warm})
    assert any(", success " in w and "at the last check" in w for w in warm[10:])  # after the check at step 10
    steps = [line for line in lines if line.startswith("otb N=2: step ")]
    assert [s.split(",")[0] for s in steps] == ["otb N=2: step 1 of 2", "otb N=2: step 2 of 2"]
    assert all("left" in s for s in steps)
    assert progress.Heartbeat(bar_drawn=False).on  # in this process (no kernel)
    kernel = type("Shell", (), {"config": {"IPKernelApp": {}}})()  # a notebook's kernel, as IPython shows it
    monkeypatch.setitem(sys.modules, "IPython", type("IPython", (), {"get_ipython": staticmethod(lambda: kernel)}))
    assert not progress.Heartbeat(bar_drawn=False).on  # never in a notebook


def test_a_warm_up_outside_train_py_prints_no_line(tmp_path, capsys):
    """Only train.py says where a warm-up stopped: a notebook that loads the tiny model keeps its stored
    output (a line with a path and seconds would differ on every machine)."""
    task = tasks.ReverseTask(horizon=2)
    folder = models.tiny_model_folder(tmp_path, task, max_new=6, hidden=16, layers=1, warmup_max_steps=20,
                                      warmup_target=0.01)
    assert (folder / "warmup.json").exists() and capsys.readouterr().out == ""


def test_the_warm_up_bar_shows_the_step_it_stopped_at(monkeypatch):
    """The bar counts a step when it is done (iterating a bar over the steps counted it when the next
    began, so it stood one behind at the stop), also where a jump over the ceiling was replayed."""
    bars = []

    class Shown(models.tqdm):  # drawn into a string, as a terminal would show it
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "disable": False, "file": io.StringIO()})
            bars.append(self)
    monkeypatch.setattr(models, "tqdm", Shown)
    monkeypatch.setattr(models, "evaluate", lambda *a, seed, **kw: 0.9 if seed >= 8 else 0.0)  # success by step
    tok, task = models.char_tokenizer(), tasks.ReverseTask(horizon=2)
    for kw, stop in ((dict(check_every=5), 10), (dict(check_every=5, ceiling=0.5), 8)):
        model = models.tiny_model(tok, hidden=16, layers=1, seed=0)
        history = models.warm_up(model, tok, task, temperature=1.0, max_new=6, max_steps=20, target=0.3, seed=0,
                                 batch=4, **kw)
        assert history[-1][0] == stop and bars[-1].n == stop
        assert bars[-1].fp.getvalue().rstrip().endswith("success=0.90]")


# ----------------------------------------------------------------------------- samples and bars

def test_each_log_line_shows_a_sampled_response_and_its_reward(out, capsys):
    run(out, "samples", "--estimator", "otb", "--steps", "4", "--log-every", "1")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[otb N=4] step")]
    assert len(lines) == 4
    task = tasks.ReverseTask(horizon=2)
    for line in lines:
        prompt, response, reward = re.fullmatch(r'.* \| sample (".*") -> (".*") R=(\S+)', line).groups()
        prompt, response = json.loads(prompt), json.loads(response)
        assert prompt.endswith("=") and float(reward) == task.reward(response, prompt[:-1][::-1], True)
    run(out, "no-samples", "--estimator", "otb", "--steps", "1", "--log-every", "1", "--no-show-samples")
    assert "| sample" not in capsys.readouterr().out


def test_samples_are_on_by_default_for_the_tiny_model_only():
    from lab import parse_options, options
    parse = lambda *argv: parse_options.parse_config(list(argv), train.Config, options.PRESETS)  # noqa: E731
    assert parse().show_samples and not parse("--no-show-samples").show_samples
    assert not parse("--model", "smollm2").show_samples  # a pretrained model's responses are long
    assert parse("--model", "smollm2", "--show-samples").show_samples


def test_bars_are_off_where_stderr_is_no_terminal_or_with_no_progress(out, capsys, monkeypatch):
    args = ["--estimator", "otb", "--steps", "3", "--log-every", "1"]
    run(out, "bars-file", *args)  # pytest's captured stderr is not a terminal
    captured = capsys.readouterr()
    assert "it/s" not in captured.err and "s/it" not in captured.err and captured.out.count("[otb N=4] step") == 3
    for name, extra, drawn in (("bars-tty", [], True), ("bars-off", ["--no-progress"], False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        run(out, name, *args, *extra)
        monkeypatch.undo()
        assert ("3/3 [" in terminal.getvalue()) == drawn, terminal.getvalue()
        assert capsys.readouterr().out.count("[otb N=4] step") == 3  # the log lines stay


# ----------------------------------------------------------------------------- the comparison's plot

def test_the_plot_is_redrawn_as_each_configuration_finishes(out, monkeypatch):
    drawn, real = [], compare.plot_runs

    def plot_runs(path, cfg, histories):
        drawn.append(({name: len(h) for name, (_, h) in histories.items()}, sorted(
            p.parent.name for p in path.parent.glob("*/DONE"))))
        real(path, cfg, histories)
        assert path.stat().st_size > 10_000
    monkeypatch.setattr(compare, "plot_runs", plot_runs)
    train.main(TINY + ["--out", str(out), "--name", "plot-each", "--compare", "otb:2,group_mean:4,rloo:2",
                       "--steps", "2"])
    assert drawn == [({"otb-n2": 2}, ["otb-n2"]),  # drawn before the second configuration starts
                     ({"otb-n2": 2, "group_mean-n4": 2}, ["group_mean-n4", "otb-n2"]),
                     ({"otb-n2": 2, "group_mean-n4": 2, "rloo-n2": 2}, ["group_mean-n4", "otb-n2", "rloo-n2"])]


# ----------------------------------------------------------------------------- TensorBoard

needs_tensorboard = pytest.mark.skipif(not HAS_TENSORBOARD and not IN_CI,
                                       reason="tensorboard not installed (pip install -r requirements-tensorboard.txt)")


def test_tensorboard_is_installed_under_ci():
    if IN_CI:
        assert HAS_TENSORBOARD, "CI is set but tensorboard is missing: pip install -r requirements-tensorboard.txt"


def scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder)).Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


@needs_tensorboard
def test_report_to_tensorboard_logs_every_step_and_a_resume_replaces_the_steps_it_runs_again(out, monkeypatch):
    args = ["--estimator", "otb", "--steps", "4", "--report-to", "tensorboard"]
    run(out, "tb", *args)
    rows = metrics(out / "tb")
    assert scalars(out / "tb", "train/success") == [(r["step"], pytest.approx(r["success"])) for r in rows]
    assert [s for s, _ in scalars(out / "tb", "time/t_step")] == [1, 2, 3, 4]
    # stopped at once in step 3 (the checkpoint of step 1 is kept), then resumed: steps 2-4 once each
    real_save = models.save_atomic
    monkeypatch.setattr(models, "save_atomic", lambda state, path: state.get("step") == 1 and real_save(state, path))
    interrupt_at(monkeypatch, 3, hard=True)
    with pytest.raises(SystemExit):
        run(out, "tb-cut", *args, "--checkpoint-minutes", "0")
    monkeypatch.undo()
    train.main(["--resume", str(out / "tb-cut")])
    assert [s for s, _ in scalars(out / "tb-cut", "train/success")] == [1, 2, 3, 4]
    assert scalars(out / "tb-cut", "train/success") == [(r["step"], pytest.approx(r["success"]))
                                                        for r in metrics(out / "tb-cut")]


# ----------------------------------------------------------------------------- stopping and resuming

def test_a_stop_in_the_second_step_resumes_from_the_first(out, monkeypatch, capsys):
    """The first step always saves, whatever --checkpoint-minutes says, so an early stop can resume."""
    run(out, "early-full", "--estimator", "otb", "--steps", "3")
    interrupt_at(monkeypatch, 2, hard=True)  # a second Ctrl-C during step 2: no save after it
    with pytest.raises(SystemExit) as e:
        run(out, "early", "--estimator", "otb", "--steps", "3", "--checkpoint-minutes", "60")
    monkeypatch.undo()
    assert e.value.code == 130 and f"resume with: python train.py --resume {out / 'early'}" in capsys.readouterr().err
    assert torch.load(out / "early" / "checkpoint.pt", weights_only=True)["step"] == 1
    train.main(["--resume", str(out / "early")])
    assert without_times(metrics(out / "early")) == without_times(metrics(out / "early-full"))


def test_sighup_stops_like_ctrl_c_and_says_how_to_resume(out, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # the hang-up wraps them; put them back afterwards
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    interrupt_at(monkeypatch, 2, sig=signal.SIGHUP)
    with pytest.raises(SystemExit) as e:
        run(out, "hup", "--estimator", "otb", "--steps", "3", "--checkpoint-minutes", "60")
    text = capsys.readouterr()
    assert "SIGHUP: stopping after this step and saving a checkpoint" in text.out
    assert e.value.code == 130 and text.err.strip().splitlines()[-1] == (
        f"train.py: stopped after step 2 of 3; checkpoint saved; resume with: python train.py --resume {out / 'hup'} "
        f"(also in {out / 'hup' / 'resume.txt'})")
    assert torch.load(out / "hup" / "checkpoint.pt", weights_only=True)["step"] == 2


def test_closing_the_terminal_saves_the_run_which_then_resumes(out):
    """train.py in a real terminal (a pseudo-terminal); once its second log line shows, the terminal is
    closed and the kernel sends SIGHUP: the run finishes the step and saves although its output can no
    longer be written, exits with status 130, and --resume continues it."""
    folder = out / "closed"
    argv = [sys.executable, str(ROOT / "train.py"), *TINY, "--out", str(out), "--name", "closed", "--estimator",
            "otb", "--steps", "40", "--log-every", "1", "--checkpoint-minutes", "60"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own, the pseudo-terminal its controlling terminal
        os.chdir(ROOT)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it, even under nohup
        os.execv(sys.executable, argv)
    seen = b""
    while b"] step    2 " not in seen:
        seen += os.read(fd, 65536)
    os.close(fd)  # the terminal closes
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 130, seen.decode(errors="replace")[-2000:]
    saved = torch.load(folder / "checkpoint.pt", weights_only=True)["step"]
    assert 2 <= saved < 40 and len(metrics(folder)) >= saved and not (folder / "DONE").exists()
    train.main(["--resume", str(folder)])
    assert [r["step"] for r in metrics(folder)] == list(range(1, 41)) and (folder / "DONE").exists()


def test_resuming_a_finished_comparison_says_so_and_touches_nothing(out, capsys):
    folder = out / "finished"
    train.main(TINY + ["--out", str(out), "--name", "finished", "--compare", "otb:2,group_mean:2", "--steps", "1"])
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main(["--resume", str(folder)])
    text = capsys.readouterr()
    assert e.value.code == 0 and text.err == "" and text.out == (
        f"train.py: {folder} is finished: all its configurations ran (table: {folder / 'summary.md'}, plot: "
        f"{folder / 'compare.png'}); nothing to resume\n")
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} == before
