"""Helpers shared by the train.py tests (test_e2e_train.py, test_inputs_train.py): a tiny
configuration, a run of train.main in a folder, its metrics, and a simulated Ctrl-C."""
import json
import signal
from pathlib import Path

import train
from lab import logbook

# A tiny model (hidden 32, 1 layer) with a 60-step warm-up on strings of length 1-2, so rewards are
# not all zero and the updates are not trivially zero.
TINY = ["--tiny-hidden", "32", "--tiny-layers", "1", "--horizon", "2", "--warmup-max-steps", "60",
        "--prompts-per-step", "4", "--log-every", "100"]  # N = 4, the default: a comparison gives its own
# the wall-clock columns; the saved default run (benchmarks/results/default_run) was logged before the
# loop timed the step whole, with the step's phases apart
TIME_KEYS = set(logbook.TIME_KEYS) | {"t_rollout", "t_score", "t_update"}


def run(out, name, *extra):
    return train.main(TINY + ["--out", str(out), "--name", name, *extra])


def metrics(path):
    return [json.loads(line) for line in Path(path, "metrics.jsonl").read_text().splitlines()]


def without_times(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def interrupt_at(monkeypatch, step, hard=False, sig=signal.SIGINT):
    """Simulate Ctrl-C late in training step `step` (1-based; counted over the whole process): a SIGINT
    (the loop finishes the step, saves and stops; sig=SIGTERM: the same from `timeout` or a cluster)
    or, hard=True, a KeyboardInterrupt raised there (a second Ctrl-C: the step is lost, the last
    checkpoint is kept)."""
    seen = []
    real = logbook.step_metrics
    # A shell can start the tests with SIGINT ignored (nohup, some CI runners), and train.py then
    # rightly keeps ignoring it: give this process Python's default Ctrl-C, as a terminal has.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(sig) is signal.SIG_IGN:  # likewise a hang-up under nohup: a terminal's is not ignored
        signal.signal(sig, signal.SIG_DFL)

    def step_metrics(*a, **k):
        seen.append(1)
        if len(seen) == step:
            if hard:
                raise KeyboardInterrupt
            signal.raise_signal(sig)
        return real(*a, **k)
    monkeypatch.setattr(logbook, "step_metrics", step_metrics)
