"""What a run shows while it runs: its progress bar, and a comparison's time left.

One bar per run (``Bar``), advanced after each step together with that step's log line, so the two
always agree; a comparison's bars say "[k/K]" and the time left of the whole comparison (``TimeLeft``:
seconds per step of the runs so far, or per sampled response for a run not started). Off with
--no-progress, and where stderr is not a terminal (a log file gets the log lines only).
"""
import time

from tqdm.auto import tqdm


class Bar:
    """The progress bar of one run, from step ``start`` to ``cfg.steps``. It advances after each
    step, before that step's log line, so the bar and the log always show the same step; at the
    end it stands at 100%, also when the token budget ended the run before ``--steps``. ``label``:
    its name ("[2/5] grpo N=4" in a comparison); ``time_left``: a comparison's TimeLeft. Off with
    --no-progress, and where its stream (stderr) is not a terminal: a log file gets the log lines only."""

    def __init__(self, cfg, start, label=None, time_left=None):
        self.time_left, self.key = time_left, (cfg.seed, cfg.estimator, cfg.group_size)
        self.tick = time.monotonic()
        self.bar = tqdm(total=cfg.steps, initial=start, desc=label or f"{cfg.estimator} N={cfg.group_size}",
                        dynamic_ncols=True, mininterval=0,  # redrawn at every step: it never lags the log
                        disable=True if cfg.no_progress else None)  # None: off where stderr is no terminal

    def step(self, row):
        """Step ``row["step"]`` is done: the bar shows it, with its success, length and gradient norm."""
        now, post = time.monotonic(), dict(success=f"{row['success']:.2f}", len=f"{row['response_len']:.1f}",
                                           gnorm=f"{row['grad_norm']:.2f}")
        if self.time_left:
            self.time_left.done(self.key, now - self.tick)
            post["comparison"] = self.time_left.text()
        self.tick = now
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self):
        if self.bar.n < self.bar.total:  # ended by the token budget: the steps it ran are all of it
            self.bar.total = self.bar.n
            if self.time_left:
                self.time_left.finished(self.key)
        self.bar.refresh()
        self.bar.close()


class TimeLeft:
    """A comparison's time left, from the steps done so far in this process: a configuration that
    has run steps, its seconds per step times its steps left; one that has not, the seconds per
    sampled response so far times its responses (steps x prompts_per_step x N: a step's cost grows
    with N). With --token-budget a run may end before --steps: the estimate is an upper bound."""

    def __init__(self, cfg, steps_left):
        self.left = dict(steps_left)  # (seed, estimator, N) -> steps still to run
        self.prompts, self.bound = cfg.prompts_per_step, cfg.token_budget is not None
        self.seconds, self.steps = dict.fromkeys(self.left, 0.0), dict.fromkeys(self.left, 0)

    def done(self, key, seconds):
        self.left[key] -= 1
        self.seconds[key] += seconds
        self.steps[key] += 1

    def finished(self, key):
        self.left[key] = 0

    def text(self):
        per_response = sum(self.seconds.values()) / sum(self.prompts * k[2] * n for k, n in self.steps.items())
        todo = sum(steps * (self.seconds[k] / self.steps[k] if self.steps[k] else per_response * self.prompts * k[2])
                   for k, steps in self.left.items())
        return ("at most " if self.bound and todo else "") + duration(todo) + " left"


def duration(seconds):
    """'45 s', '12 min', '2.5 h'."""
    return (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400
            else f"{seconds / 3600:.1f} h")
