"""What one training step logs: a row of metrics.jsonl, and a readable line every --log-every steps.

``step_metrics`` turns the ``train.StepResult`` of one step into its row: success and reward, response
length and tokens sampled, the loss and gradient norm, the advantage's mean and spread, the entropy,
the forward-only noise diagnostics (lab/diagnostics.py) and the sampler / trainer mismatch (train.py's
loop adds the step's wall clock, ``TIME_KEYS``); ``log`` appends the row and prints the line whose
columns train.py's ``--help`` explains (options.LOG_COLUMNS), with one sampled response and its reward
(``sample``, with --show-samples), and with --report-to tensorboard also writes the row to TensorBoard
(``Board``).
"""
import json
import math

import torch
from tqdm.auto import tqdm

from lab import diagnostics, options, runs
import tasks

TIME_KEYS = ("t_step", "t_log")  # wall-clock seconds, timed by train.py's loop: never identical twice


def step_metrics(step, s, tokens, lr):
    """The metrics.jsonl row of one step (``s``, the StepResult of train_step)."""
    m, adv = s.ro.response_mask, s.adv  # (B, T)
    delta = (s.old_logp - s.ro.logp) * m  # log pi_train - log pi_rollout, (B, T)
    power = diagnostics.gradient_power(adv, m, s.old_logp, s.sum_pi_sq)  # P_i, (B,)
    mean_g_sq = diagnostics.mean_gradient_sq_norm(s.ro.response, m, s.ro.group_index, adv, s.old_logp,
                                                  s.sum_pi_sq)
    adv_mean = masked_mean(adv, m)
    return dict(step=step + 1, reward=s.R.mean().item(), success=(s.R >= 1).float().mean().item(),
                response_len=m.sum(-1).mean().item(), finished=s.ro.finished.float().mean().item(),
                tokens=tokens, loss=s.loss, grad_norm=s.norms[0], lr=lr, clip_frac=s.clip_frac,
                adv_mean=adv_mean, adv_std=math.sqrt(max(masked_mean(adv ** 2, m) - adv_mean ** 2, 0.0)),
                entropy=masked_mean(s.entropy, m), **diagnostics.noise_diagnostics(power, mean_g_sq),
                mismatch_mean_abs=masked_mean(delta.abs(), m), mismatch_max_abs=delta.abs().max().item(),
                mismatch_k3=masked_mean(torch.expm1(delta) - delta, m),  # KL(rollout || train)
                **tool_metrics(s.ro))


def tool_metrics(ro):
    """With a tool, per response on average: calls answered, error replies, tool tokens forced in (not
    counted in ``tokens``), and the fraction of responses whose reply the length limit cut. {} without."""
    if ro.tool_calls is None:
        return {}
    return dict(tool_calls=ro.tool_calls.float().mean().item(), tool_errors=ro.tool_errors.float().mean().item(),
                tool_tokens=ro.tool_tokens.float().mean().item(), tool_cut=ro.tool_cut.float().mean().item())


def log(run_dir, cfg, bar, r, s=None, tok=None):
    """The row into metrics.jsonl, the progress bar (progress.Bar) and TensorBoard (--report-to); every
    log_every steps, one readable line, ending with a sampled response of the step (``s``, its
    StepResult, decoded by ``tok``) when --show-samples."""
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(r) + "\n")
    bar.step(r)  # the bar reaches step r["step"] before its line is printed: both show the same step
    shown = sample(s, tok) if cfg.show_samples and s is not None else ""
    if cfg.report_to == "tensorboard":
        Board.of(run_dir, r["step"]).write(r, shown)
    if r["step"] % cfg.log_every == 0 or r["step"] == cfg.steps:
        tqdm.write(f"[{cfg.estimator} N={cfg.group_size}] step {r['step']:4d} | success {r['success']:.2f} "
                   f"| len {r['response_len']:5.1f} | tokens {r['tokens']:7d} | gnorm {r['grad_norm']:6.3f} "
                   f"| adv {r['adv_mean']:+.3f}±{r['adv_std']:.3f} | H {r['entropy']:.3f} "
                   f"| power {r['total_power']:.3g} | mism {r['mismatch_mean_abs']:.1e} | lr {r['lr']:.1e} "
                   f"| s {r['t_step']:.2f}/{r['t_log']:.2f}"
                   + (f" | tool {r['tool_calls']:.2f}/{r['tool_errors']:.2f}/{r['tool_cut']:.2f}"
                      if "tool_calls" in r else "") + (f" | sample {shown}" if shown else ""))


def sample(s, tok, row=0):
    """One response of the step as the log line shows it: '"prompt" -> "response" R=reward', the
    prompt cut to its last 24 characters and the response to its first 60 (a pretrained model's are long)."""
    ro = s.ro
    prompt = tok.decode(ro.prompt_ids[row][ro.prompt_mask[row].bool()].tolist(), skip_special_tokens=True)
    [response] = tasks.response_texts(tok, ro.response[row:row + 1], ro.response_mask[row:row + 1])
    prompt = prompt if len(prompt) <= 24 else "..." + prompt[-24:]
    response = response if len(response) <= 60 else response[:60] + "..."
    return f"{json.dumps(prompt)} -> {json.dumps(response)} R={s.R[row].item():g}"


class Board:
    """--report-to tensorboard: one event file per run folder (``tensorboard --logdir runs`` shows each
    run by its folder's name), every metric of a step as a scalar, the sampled response as text. A
    resumed run first drops the events at and after its first step again (TensorBoard's purge_step)."""
    active = {}  # run folder -> its Board, while the run goes on in this process

    @classmethod
    def of(cls, run_dir, step):
        board = cls.active.get(run_dir)
        if board is None or step <= board.last:  # a new run, or one resumed in this process
            if board is not None:
                board.close()
            board = cls.active[run_dir] = cls(run_dir, step)
        return board

    def __init__(self, run_dir, step):
        from torch.utils.tensorboard import SummaryWriter
        self.run_dir, self.last = run_dir, step - 1
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=step)

    def write(self, r, shown):
        for key, value in r.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(("time/" if key in TIME_KEYS else "train/") + key, value, r["step"])
        if shown:
            self.writer.add_text("sample", shown, r["step"])
        self.writer.flush()  # a stopped run keeps every step it logged
        self.last = r["step"]

    def close(self):
        self.writer.close()
        Board.active.pop(self.run_dir, None)


def masked_mean(x, m):
    return ((x * m).sum() / m.sum().clamp(min=1)).item()


def moving_average(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def summarize(cfg, history, k=10):
    """One row of the summary table. Success numbers are means over k steps."""
    success = [r["success"] for r in history]
    smooth = moving_average(success, k)
    reached = [r["tokens"] for r, s in zip(history, smooth) if s >= cfg.target_success]
    norms = [r["grad_norm"] for r in history]
    seconds = sum(v for r in history for key, v in r.items() if key.startswith("t_"))  # TIME_KEYS
    return dict(run=runs.run_name(cfg.estimator, cfg.group_size, cfg.zero_tail), estimator=cfg.estimator,
                group_size=cfg.group_size, steps=len(history), tokens=history[-1]["tokens"],
                initial_success=sum(success[:k]) / len(success[:k]),
                final_success=sum(success[-k:]) / len(success[-k:]),
                tokens_to_target=reached[0] if reached else None,
                grad_norm_mean=sum(norms) / len(norms), grad_norm_max=max(norms),
                total_power_mean=sum(r["total_power"] for r in history) / len(history),
                seconds=round(seconds, 1))


def mark_done(run_dir, cfg, history):
    """The DONE marker of a finished run: its row of the summary table (a comparison keeps the run);
    its TensorBoard file, if any, is closed."""
    (run_dir / "DONE").write_text(json.dumps(summarize(cfg, history)) + "\n")
    if run_dir in Board.active:
        Board.active[run_dir].close()
