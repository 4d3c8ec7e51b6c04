"""What a run shows while it runs: how long it will take, its progress bar, and a comparison's time left.

Before anything runs, the header gives the run's duration as a range (``estimate``), from the
seconds per sampled response position and per warm-up step measured on the project's 2-core CPUs.
Then one bar per run (``Bar``), advanced after each step together with that step's log line, so the
two always agree; a comparison's bars say "[k/K]" and the time left of the whole comparison
(``TimeLeft``: seconds per step of the runs so far, or per sampled response for a run not started).
Bars are off with --no-progress and where stderr is not a terminal; there, in a log file, a
``Heartbeat`` line says where the run is at least every 30 s, through the warm-up and the steps.
"""
import sys
import time

from tqdm.auto import tqdm

HEARTBEAT_SECONDS = 30  # where no bar is drawn, a progress line at least this often


class Heartbeat:
    """A line of progress at least every ``HEARTBEAT_SECONDS`` where no bar is drawn (stderr is not a
    terminal, or the bar is off): a log file shows that a run is alive and where it is. ``beat(text)``
    after each unit of work prints ``text()`` (a function: only called when due) once that long has
    passed since the last line. Never in a notebook's kernel: there a missing bar means no ipywidgets,
    and a line that depends on the machine's speed would land in the notebook's stored outputs."""

    def __init__(self, bar_drawn):
        self.on, self.last = not bar_drawn and not in_a_notebook(), time.monotonic()

    def beat(self, text):
        now = time.monotonic()
        if self.on and now - self.last >= HEARTBEAT_SECONDS:
            tqdm.write(text(), file=sys.stdout)
            sys.stdout.flush()
            self.last = now


def in_a_notebook():
    """Whether this process is a Jupyter kernel (IPython's shell runs under IPKernelApp; tqdm.auto asks the same)."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def drawn(bar):
    """Whether a tqdm bar is drawn (tqdm's disable=None turns it off where its stream is no terminal)."""
    return not bar.disable


class Bar:
    """The progress bar of one run, from step ``start`` to ``cfg.steps``. It advances after each
    step, before that step's log line, so the bar and the log always show the same step; at the
    end it stands at 100%, also when the token budget ended the run before ``--steps``. ``label``:
    its name ("[2/5] grpo N=4" in a comparison); ``time_left``: a comparison's TimeLeft. Off with
    --no-progress, and where its stream (stderr) is not a terminal: a log file gets the log lines only."""

    def __init__(self, cfg, start, label=None, time_left=None):
        self.time_left, self.key = time_left, (cfg.seed, cfg.estimator, cfg.group_size)
        self.tick = self.started = time.monotonic()
        self.start, self.label = start, label or f"{cfg.estimator} N={cfg.group_size}"
        self.bar = tqdm(total=cfg.steps, initial=start, desc=self.label,
                        dynamic_ncols=True, mininterval=0,  # redrawn at every step: it never lags the log
                        disable=True if cfg.no_progress else None)  # None: off where stderr is no terminal
        self.heartbeat = Heartbeat(drawn(self.bar))

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
        self.heartbeat.beat(lambda: self.line(row, post.get("comparison")))

    def line(self, row, comparison=None):
        """The heartbeat's line: '[2/5] grpo N=4: step 40 of 100, 25 s, about 37 s left (comparison: 4 min left)'."""
        done, elapsed = row["step"] - self.start, time.monotonic() - self.started
        left = elapsed / done * (self.bar.total - row["step"]) if done else 0.0
        return (f"{self.label}: step {row['step']} of {self.bar.total}, {duration(elapsed)}, about "
                f"{duration(left)} left" + (f" (comparison: {comparison})" if comparison else ""))

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


def span(lo, hi):
    """A range of seconds: '25-100 s', '2-7 min', '45 s to 3 min'."""
    a, b = duration(lo), duration(hi)
    if a.split()[1] == b.split()[1]:
        return f"{a.split()[0]}-{b}"
    return f"{a} to {b}"


# Seconds on the project's 2-core AMD EPYC, tiny model, quiet (low) and busy with other jobs (high);
# benchmarks/results/wall_times.md ("The header's time estimate") derives each from its measured runs.
STEP_SECONDS = (0.12e-3, 0.36e-3)  # a training step, per sampled response position (rows x response limit)
WARMUP_SECONDS = (25, 100)  # the default task's warm-up (240-330 steps), scaled by the response limit
STARTUP_SECONDS = 10  # imports, building the model, loading the warm-up's cache
DEFAULT_LIMIT = 18  # the default task's response limit, which those were measured at


def estimate(cfg, runs, limit, warm_up_runs):
    """The header's duration of a run or comparison on a CPU, as a range: 'about 2-7 min on a 2-core CPU
    (warm-up 25 s to 2 min, not cached; 500 steps)'; None where nothing measured applies (a pretrained
    model: --preflight measures a step). ``runs``: [(estimator, N)] run one after another, each for
    --steps steps (a --token-budget may end them sooner: an upper bound then); ``limit``: the response
    limit; ``warm_up_runs``: whether the warm-up runs now (not cached)."""
    if cfg.model != "tiny":
        return None
    positions = sum(cfg.prompts_per_step * n * cfg.steps for _, n in runs) * limit  # response positions
    seeds = len(cfg.seeds.split(",")) if cfg.seeds else 1
    scale = limit / DEFAULT_LIMIT
    warm = [w * scale if warm_up_runs else 0.0 for w in WARMUP_SECONDS]
    lo, hi = (STARTUP_SECONDS + w + seeds * positions * s for w, s in zip(warm, STEP_SECONDS))
    parts = [f"warm-up {span(*warm)}, not cached" if warm_up_runs else "warm-up cached",
             f"{seeds * len(runs) * cfg.steps} steps" + (", fewer if the token budget ends them" if cfg.token_budget
                                                          else "")]
    return f"about {span(lo, hi)} on a 2-core CPU ({'; '.join(parts)})"
