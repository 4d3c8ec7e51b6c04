"""Train a causal language model with policy gradients: OTB versus the group baselines.

    python train.py                         # the default comparison on a CPU (a few minutes)
    python train.py --estimator otb         # one run
    python train.py --task periodic --horizon 64 --estimator otb   # the long-horizon task
    python train.py --resume runs/NAME      # continue a stopped run or comparison (Ctrl-C: stop)
    python train.py --preset gpu            # SmolLM2-135M-Instruct counting: equal tokens, 1 GPU

One training step (everything except the marked line is identical for every estimator):

    rollout   P prompts (tasks.py), N responses to each, y ~ pi_tau, and their 0/1 rewards
    score     the training forward pass: log pi(y_t), sum_k pi_k^2, entropy (rollout.score)
    estimate  A_t = otb.ESTIMATORS[estimator](...)                       <- the only difference
    update    L = -(1 / sum m) sum_{i,t} m_t min(rho_t A_t, clip(rho_t, 1 -+ eps) A_t),
              rho_t = pi(y_t) / pi_old(y_t); AdamW with gradient clipping

The file reads in that order: Config, the step, the loop, main. Fairness by construction: the
prompts of step s and the sampler's draws are seeded from (seed, s) only; every configuration starts
from the same weights, optimizer and loss aggregation. The prompts per step are fixed, so N = 16
samples 4x the tokens of N = 4: a comparison's x-axis is tokens sampled (``--token-budget``).

Departures: dropout is off, so ``score`` is exactly the training forward pass, and ``old_logp``
comes from it (not the sampler): the PPO ratio is 1 in the first epoch and the sampler / trainer gap
is logged, not corrected. The memory options change what is held at once, never the gradient
(tests/test_exact_memory.py). What surrounds this file lives in lab/ (lab/__init__.py maps it).
"""
import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal, Optional

# Before torch loads OpenMP: a waiting thread sleeps instead of spinning (docs/cost.md, "Busy
# machines").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

import otb
import rollout
import tasks
from lab import compare, fast_decode, logbook, lr_schedule, options, parse_options, preflight
from lab import progress, runs
from lab.options import arg

# train_step writes a DEBUG record here as each of its phases begins: nothing is written unless
# someone listens (lab/preflight.py's timed_step times the phases from these records)
step_log = logging.getLogger("train.step")


@dataclass
class Config(options.Options):
    """Train a causal language model with policy gradients: OTB versus the group baselines."""
    estimator: Optional[Literal[tuple(otb.ESTIMATORS)]] = arg(
        None, "advantage estimator of a single run; without it train.py runs a comparison (--compare)")
    zero_tail: bool = arg(
        False, "otb and otb_tir: baseline 0 where one row of the group is left (verl 0.9.1 always has it on)")
    task: Optional[Literal[tuple(options.TASKS)]] = arg(
        None, "reverse, periodic (long horizon), calculator and factors (with a tool); for a chat model: "
        "arithmetic, count, chat_calculator (tasks.py, tool_use.py); default: reverse for the tiny model, "
        "arithmetic otherwise")
    horizon: Optional[int] = arg(
        None, "the task's length knob: string length, answer length, numbers added / digits / numbers listed "
        "(default: the task's own, tasks.py)")
    seed: int = arg(0, "seed of the model initialisation, the prompt stream and the sampler")
    prompts_per_step: int = arg(16, "prompts per step (held fixed when the group size changes)")
    group_size: int = arg(4, "N, responses sampled per prompt (a group)")
    max_new_tokens: Optional[int] = arg(None, "response limit (default: the task's max_new_tokens())")
    temperature: float = arg(1.0, "sampling temperature tau; log-probs are those of softmax(z / tau)")
    steps: int = arg(100, "training steps (one rollout batch each)")
    token_budget: Optional[int] = arg(None, "B: a run ends at the step where its sampled tokens reach B")
    lr: float = arg(2e-4, "AdamW learning rate")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping threshold (the logged grad_norm is before clipping)")
    ppo_epochs: int = arg(1, "passes over each batch; > 1 uses the PPO clipped ratio")
    minibatch_size: Optional[int] = arg(None, "responses per optimizer step (default: the whole batch)")
    clip_eps: float = arg(0.2, "PPO clip range eps: rho is clipped to [1 - eps, 1 + eps]")
    # memory and speed: none of these changes the gradient, only what is held at once or how fast it
    # samples
    chunk_size: Optional[int] = arg(
        None, "response positions per chunk of the float32 LM head, recomputed in the backward "
        "(default: all at once)")
    micro_batch_rows: Optional[int] = arg(
        None, "rows per forward/backward pass, gradients accumulated: the same gradient, one optimizer step")
    activation_checkpointing: bool = arg(
        False, "recompute each layer in the backward (Hugging Face gradient checkpointing): less memory")
    compile_decode: bool = arg(
        False, "sample with a static KV cache and a compiled decode step (lab/fast_decode.py): the plain "
        "loop's tokens; compiling takes about a minute per batch size on a CPU")
    log_every: int = arg(10, "print one metrics line every k steps (the bar updates every step)")


# ===== One training step: rollout -> score -> estimate -> update ==================================

def train_step(cfg, model, sampler, opt, task, tok, estimator, step):
    """One step: rollout -> score -> estimate -> update. Everything but ``estimator`` is identical
    for every configuration, and the prompts and the sampler's draws depend on (seed, step) only.
    ``sampler``: the model, or its lower-precision copy (--rollout-dtype). Returns its
    StepResult."""
    device = next(model.parameters()).device
    step_log.debug("rollout")  # each phase begins with its record (for whoever listens, if anyone)
    # ---- rollout: N responses to each prompt, and their rewards
    prompts, answers = tasks.prompt_batch(task, tok, cfg.seed, step, cfg.prompts_per_step)
    seed = tasks.step_seed(cfg.seed, step)
    gen = torch.Generator(device).manual_seed(seed)  # the sampler's draws, then the minibatch order
    if sampler is not model:
        sampler.load_state_dict(model.state_dict())  # cast to the rollout dtype on copy
    # The rollout begins: eval mode (checkpointed layers in train mode turn the KV cache off).
    sampler.eval()
    sample = fast_decode.sample if cfg.compile_decode else rollout.sample  # same tokens, compiled
    with autocast(device):
        ro = sample(sampler, prompts, group_size=cfg.group_size, temperature=cfg.temperature,
                    max_new_tokens=tasks.response_limit(task, cfg.max_new_tokens), generator=gen,
                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                    tool=task.tool(tok),  # None: a single-turn task
                    stop=task.stop_rule(tok, answers, cfg.group_size))  # None: a row ends at EOS
    R, token_rewards, _ = tasks.rewards(task, tok, ro, answers, cfg.group_size)  # R (B,), r_t (B,T)
    step_log.debug("score")
    # ---- score: the training forward pass, in train mode (its layers checkpointed, if asked)
    model.train()
    B = len(ro.response_mask)
    with torch.set_grad_enabled(keep_scoring_graph(cfg, B)):  # by default: the update's forward too
        logp, sum_pi_sq, entropy = score_rows(model, cfg, ro, torch.arange(B, device=device))
    old_logp = logp.detach()  # log pi_old(y_t); logp, sum_pi_sq, entropy: (B, T) each
    step_log.debug("estimate")
    # ---- estimate: the one line that differs between configurations, A_t (B, T)
    adv, _ = estimator(token_rewards=token_rewards.to(device), response_mask=ro.response_mask,
                       group_index=ro.group_index, log_probs=old_logp, sum_pi_sq=sum_pi_sq)
    step_log.debug("update")
    # ---- update: the loss L of the module docstring, one AdamW step per minibatch
    norms, clip_frac, loss = policy_update(model, opt, cfg, ro, logp, adv, gen)
    return StepResult(ro, R, adv, old_logp, sum_pi_sq, entropy, norms, clip_frac, loss)


def keep_scoring_graph(cfg, batch):
    """Whether the scoring pass keeps its graph for the update's loss: where one optimizer step
    takes the whole batch in one block (one epoch, one minibatch, one micro-batch: the default), so
    that the step runs the model forward once, not twice (docs/cost.md, "One forward pass per
    step")."""
    one_block = (cfg.minibatch_size or batch) >= batch and (cfg.micro_batch_rows or batch) >= batch
    return cfg.ppo_epochs == 1 and one_block


def score_rows(model, cfg, ro, rows):
    """rollout.score of the batch's rows ``rows`` (indices), ``micro_batch_rows`` at a time, in the
    step's precision (``autocast``): (logp, sum_pi_sq, entropy), (len(rows), T) each."""
    parts = []
    for block in rows.split(cfg.micro_batch_rows or len(rows)):  # one block by default
        with autocast(ro.response.device):
            parts.append(rollout.score(model, ro.prompt_ids[block], ro.prompt_mask[block],
                                       ro.response[block], ro.response_mask[block], cfg.temperature,
                                       cfg.chunk_size))
    return tuple(torch.cat(x) for x in zip(*parts))


def policy_update(model, opt, cfg, ro, logp, adv, generator):
    """The policy-gradient step(s) on the loss L of the module docstring, identical for every
    estimator: (grad norms, clip fraction, loss). ``logp``: the scoring pass's log pi(y_t), (B, T):
    log pi_old of the ratio and, where it kept its graph (``keep_scoring_graph``), the update's
    forward; otherwise each block is scored again.

    Each minibatch is one optimizer step. Its rows go through the model ``micro_batch_rows`` at a
    time (gradient accumulation): each block's loss is divided by the token count of the whole
    minibatch, so the gradients that add up over the blocks are those of the minibatch's token mean,
    the same as one pass over all its rows would give (tests/test_exact_memory.py)."""
    B = adv.shape[0]
    size = cfg.minibatch_size or B
    old_logp = logp.detach()  # log pi_old(y_t), (B, T)
    norms, clipped, losses = [], [], []
    for _ in range(cfg.ppo_epochs):
        if size < B:  # minibatches of random rows
            order = torch.randperm(B, generator=generator, device=generator.device)
        else:
            order = torch.arange(B)
        for minibatch in order.to(adv.device).split(size):
            n_tokens = ro.response_mask[minibatch].sum()  # sum m over the whole minibatch
            opt.zero_grad(set_to_none=True)
            loss, n_clipped = 0.0, 0.0
            for block in minibatch.split(cfg.micro_batch_rows or len(minibatch)):  # one by default
                m, a = ro.response_mask[block], adv[block]  # m_t, A_t, (b, T)
                # log pi(y_t), (b, T): the scoring pass's where it kept its graph, else scored again
                logp_b = logp[block] if logp.requires_grad else score_rows(model, cfg, ro, block)[0]
                rho = torch.exp(logp_b - old_logp[block])  # rho_t = pi / pi_old, (b, T)
                clipped_rho = rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)
                surrogate = torch.minimum(rho * a, clipped_rho * a)
                part = -(surrogate * m).sum() / n_tokens  # its share of the minibatch's token mean
                part.backward()  # gradients add up over the blocks
                loss += part.item()
                n_clipped += (((rho - 1).abs() > cfg.clip_eps).float() * m).sum()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            norms.append(norm.item())
            opt.step()
            clipped.append((n_clipped / n_tokens.clamp(min=1)).item())
            losses.append(loss)
    return norms, sum(clipped) / len(clipped), sum(losses) / len(losses)


@dataclass
class StepResult:
    """What one training step produced (all (B, T) tensors right-padded, on the model's device)."""
    ro: rollout.Rollout  # the sampled batch
    R: torch.Tensor  # outcome reward per response, (B,)
    adv: torch.Tensor  # A_t
    old_logp: torch.Tensor  # log pi_old(y_t) of the training forward pass
    sum_pi_sq: torch.Tensor  # sum_k pi_k^2
    entropy: torch.Tensor  # per-token entropy
    norms: list  # gradient norm (before clipping) of each optimizer step
    clip_frac: float  # fraction of tokens whose PPO ratio was clipped
    loss: float


def autocast(device):
    """bf16 autocast on a GPU (sampling and scoring; the weights stay float32, the sampler's LM head
    runs in bf16, the scoring pass's in float32: rollout.score); full float32 on the CPU (and
    MPS)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def make_estimator(name, zero_tail):
    """otb.ESTIMATORS[name]; --zero-tail turns otb and otb_tir into their zero-tail variants
    (verl's)."""
    return otb.ESTIMATORS[options.estimator_name(name, zero_tail)]


# ===== The training loop (checkpoints, Ctrl-C and --resume: lab/runs.py) ==========================

def train(cfg, run_dir, model, tok, resume=False, keep_optimizer=True, bar=None):
    """Run one configuration in run_dir (metrics.jsonl, checkpoint.pt, DONE); returns the metrics.
    resume: from run_dir's checkpoint. Ctrl-C finishes the step, saves and raises runs.Stopped.
    keep_optimizer=False: the final checkpoint keeps the weights only (a comparison's). bar: makes
    the progress bar from (cfg, first step) (default progress.Bar)."""
    task = options.make_task(cfg)
    estimator = make_estimator(cfg.estimator, cfg.zero_tail)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = options.sampler(cfg, model)  # the model, or its copy in --rollout-dtype
    start, tokens, lengths, history = 0, 0, [], []
    if resume:  # a resumed run drops the lines logged after its checkpoint
        start, tokens, lengths, history = runs.load_checkpoint(run_dir, model, opt)
    runs.write_metrics(run_dir, history)
    bar = (bar or progress.Bar)(cfg, start)
    schedule, saved_at = options.schedule_kwargs(cfg), -math.inf  # -inf: the first step saves
    with runs.StopOnCtrlC() as stop:
        for step in range(start, cfg.steps):
            lr = cfg.lr * lr_schedule.lr_factor(cfg.lr_schedule, lengths, cfg.steps, **schedule)
            for group in opt.param_groups:
                group["lr"] = lr  # a function of the earlier steps' mean lengths only
            t0 = time.perf_counter()
            s = train_step(cfg, model, sampler, opt, task, tok, estimator, step)
            opt.zero_grad(set_to_none=True)  # the gradients are not held through the next rollout
            t1 = time.perf_counter()
            lengths.append(s.ro.response_mask.sum(-1).mean().item())  # L_i, the mean length
            tokens += int(s.ro.response_mask.sum().item())
            row = logbook.step_metrics(step, s, tokens, lr)
            row.update(t_step=t1 - t0, t_log=time.perf_counter() - t1)  # seconds: step, diagnostics
            history.append(row)
            logbook.log(run_dir, cfg, bar, row, s, tok)  # metrics.jsonl, the bar, the log line
            last = step + 1 == cfg.steps or tokens >= (cfg.token_budget or math.inf)
            if last or stop.requested or time.monotonic() - saved_at >= 60 * cfg.checkpoint_minutes:
                runs.save_checkpoint(run_dir, model, opt if keep_optimizer or not last else None,
                                     step + 1, tokens, lengths)
                saved_at = time.monotonic()
            if stop.requested and not last:
                raise runs.Stopped(f"stopped after step {step + 1} of {cfg.steps}")
            if last:
                break  # the token budget is spent (or this was step --steps)
    bar.close()  # at 100%, also where the token budget ended the run before --steps
    logbook.mark_done(run_dir, cfg, history)
    return history


def main(argv=None):
    """Parse, load the model, then one run (--estimator) or a comparison (lab/compare.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # the options checked, the header printed, the model loaded, the run folder made
    cfg, model, tok, folder, command, source = parse_options.start(argv, Config)
    gpu_comparison = cfg.preset != "cpu" and not cfg.estimator and not cfg.resume  # checked first
    if cfg.preflight or gpu_comparison:  # it measures this module's step (lab/ imports no command)
        with runs.errors_exit():  # over the memory limit: one line naming the options, exit 2
            report = preflight.run(cfg, model, tok, folder, sys.modules[__name__])
        if cfg.preflight:
            return report
    if cfg.estimator:  # a single run
        with runs.ctrl_c_exits(folder, cfg.checkpoint_minutes):  # says how to resume; exit 130
            (folder / "DONE").unlink(missing_ok=True)  # a finished run extended by a larger --steps
            history = train(cfg, folder, model, tok, resume=bool(cfg.resume))
        print(f"metrics: {folder / 'metrics.jsonl'}")
        return history
    return compare.main(cfg, model, tok, folder, command, source, train)  # the runs, then the table


if __name__ == "__main__":
    main()
