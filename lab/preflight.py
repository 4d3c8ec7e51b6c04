"""Preflight: one step at the largest shape before the long run, and what the whole run will need.

    python train.py --preset gpu --preflight                      # about a minute on a GPU: measure, project, stop
    python train.py --preset gpu --preflight --memory-limit 24    # as if the device had 24 GB

A comparison's largest configuration is the one with the most rows per step (``group_mean:16``:
8 prompts x 16 = 128 rows). The preflight runs, at that configuration and with every memory option
of the command line:

1. **the worst case for memory**: score, estimate and update (train.py's learn) on the step's real
   prompts with fabricated responses of the full response limit (random tokens, every position
   valid), since training may well make responses that long;
2. **one real step** (train.py's train_step: sampling, then the same update), for its time and its
   response length.

It reports the peak memory of the two (CUDA: ``torch.cuda.max_memory_allocated``; CPU on Linux: the
process's resident peak, VmHWM), the seconds per step, and a projection for the whole run:

    steps(n)  = min(--steps, ceil(B / (prompts x n x L)))      L: the real step's mean response length
    time      = sum over runs of steps(n) x (t_rollout + t_learn x n / n_max)
    disk      = 4 P  +  8 P   (--keep-weights: runs x 4 P + 8 P)   P parameters: float32 weights of the
                                     running run and AdamW's two moments (a finished run keeps its weights
                                     only with --keep-weights)

where the runs are every configuration on every seed, and the pilot's runs (one per rate, at its
own budget) when there is one.

The time is an upper bound in the rollout (a smaller batch never samples slower) and an estimate
elsewhere: the real step's response length and speed stand for every step. The weights are
restored afterwards, so a comparison that follows starts from the same ones.

If the peak exceeds ``--memory-limit`` (GB), or else the device's memory, it stops with a message
naming the options that lower it. Everything goes into ``<run folder>/preflight.json``.
"""
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

import rollout
import tasks
from lab import plumbing, train_cli

GB = 1e9


def largest(cfg):
    """(estimator, group size) of the configuration with the most rows per step."""
    return max(train_cli.runs_of(cfg), key=lambda run: run[1])


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif Path("/proc/self/clear_refs").exists():
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current resident size


def peak(device):
    """Bytes: the CUDA allocator's peak, or this process's resident peak (None where unknown)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else resident("VmHWM")


def resident(field="VmRSS"):
    """Bytes of this process's resident memory (VmRSS: now; VmHWM: the peak since ``reset_peak``), from
    /proc/self/status; None where there is no such file or field."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    line = next((ln for ln in status.read_text().splitlines() if ln.startswith(field + ":")), None)
    return int(line.split()[1]) * 1024 if line else None


def device_memory(device):
    """Bytes the device has: the GPU's memory, or the machine's (None where unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        return int(meminfo.read_text().split("MemTotal:")[1].split()[0]) * 1024
    return None


def full_length_batch(prompts, group_size, length, vocab, pad_id, device):
    """A Rollout of the given prompts, each repeated group_size times, with responses of ``length``
    random tokens, every position valid; and its token rewards (0 or 1 at the last token)."""
    ids, mask = rollout.left_pad([p for p in prompts for _ in range(group_size)], pad_id)  # (B, P)
    B, g = len(ids), torch.Generator().manual_seed(0)
    response = torch.randint(0, vocab, (B, length), generator=g)  # (B, T)
    m = torch.ones(B, length)
    R = (torch.rand(B, generator=g) < 0.5).float()  # (B,)
    token_rewards = torch.zeros(B, length)
    token_rewards[:, -1] = R
    ro = rollout.Rollout(prompt_ids=ids.to(device), prompt_mask=mask.to(device), response=response.to(device),
                         response_mask=m.to(device), group_index=torch.arange(B, device=device) // group_size,
                         logp=torch.zeros(B, length, device=device),
                         finished=torch.zeros(B, dtype=torch.bool, device=device))
    return ro, R, token_rewards.to(device)


def run(cfg, model, tok, folder, train_step, learn, make_estimator):
    """Measure, project, write folder/preflight.json, print; UsageError when the peak is over the limit.
    train_step, learn and make_estimator are train.py's."""
    device = next(model.parameters()).device
    est, n = largest(cfg)
    sub = replace(cfg, estimator=est, group_size=n, compare=None, seeds=None)
    task = tasks.make_task(cfg)
    init = plumbing.weights(model)  # restored at the end
    estimator = make_estimator(est, cfg.zero_tail)
    limit = tasks.response_limit(cfg, task)
    rows = cfg.prompts_per_step * n
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        # 1. the worst case: every response as long as the limit
        prompts, _ = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)
        ro, R, token_rewards = full_length_batch(prompts, n, limit, len(tok), tok.pad_token_id, device)
        reset_peak(device)
        t0 = time.perf_counter()
        try:
            learn(sub, model, opt, ro, R, token_rewards, estimator, torch.Generator().manual_seed(0))
        except torch.OutOfMemoryError:
            worst, t_full = math.inf, None  # reported as out_of_memory
        else:
            worst, t_full = peak(device), time.perf_counter() - t0
        del ro, token_rewards
        # 2. one real step: its time and response length
        s = None
        if worst is not math.inf:
            sampler = train_cli.sampler(cfg, model)
            reset_peak(device)
            s = train_step(sub, model, sampler, opt, task, tok, estimator, 0)
            worst = max(worst or 0, peak(device) or 0) or None
    finally:
        model.load_state_dict(init)
    report = project(cfg, est, n, rows, limit, prompts, s, worst, t_full, sum(p.numel() for p in model.parameters()))
    report["memory_limit"] = cfg.memory_limit * GB if cfg.memory_limit else device_memory(device)
    report["device"] = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    print(describe(report), flush=True)
    over = report["out_of_memory"] or (report["peak_memory"] is not None and report["memory_limit"] is not None
                                       and report["peak_memory"] > report["memory_limit"])
    if over:
        raise train_cli.UsageError(too_big(cfg, report, rows))
    return report


def project(cfg, est, n, rows, limit, prompts, s, worst, t_full, n_params):
    """The report: what was measured and the projection for the whole run or comparison."""
    P = max(map(len, prompts))
    report = dict(largest=f"{est}:{n}", rows=rows, positions=P + limit, out_of_memory=worst == math.inf,
                  peak_memory=None if worst == math.inf else worst, seconds_full_length_update=t_full)
    if s is None:  # out of memory at the full length: nothing to project from
        return report
    L = s.ro.response_mask.sum(-1).mean().item()  # mean response length of the real step
    t_rollout, t_learn = s.seconds[0], s.seconds[1] + s.seconds[2]
    seeds = len(train_cli.seed_list(cfg)) if cfg.seeds else 1
    def planned(name, g, budget, copies):
        per_step = cfg.prompts_per_step * g * max(L, 1.0)  # tokens sampled per step
        steps = min(cfg.steps, math.ceil(budget / per_step)) if budget else cfg.steps
        return dict(run=name, runs=copies, steps=steps, seconds_per_step=t_rollout + t_learn * g / n)
    plan = [planned(f"{e}:{g}", g, cfg.token_budget, seeds) for e, g in train_cli.runs_of(cfg)]
    if cfg.lr_pilot:  # the pilot's runs come first: one per rate
        e, _, g = cfg.lr_pilot_run.partition(":")
        plan.insert(0, planned(f"pilot {e}:{g}", int(g), cfg.lr_pilot_budget or max(1, cfg.token_budget // 4),
                               len(cfg.lr_pilot.split(","))))
    report.update(mean_response_length=L, seconds_rollout=t_rollout, seconds_score_update=t_learn, seeds=seeds,
                  runs=plan, projected_seconds=sum(r["runs"] * r["steps"] * r["seconds_per_step"] for r in plan),
                  projected_disk=((sum(r["runs"] for r in plan) if cfg.keep_weights else 1) * 4 + 8) * n_params)
    return report


def describe(r):
    """The report as a few readable lines."""
    gb = lambda x: "unknown" if x is None else f"{x / GB:.2f} GB"  # noqa: E731
    lines = [f"preflight: largest step {r['largest']} ({r['rows']} rows x {r['positions']} positions) on {r['device']}",
             f"  peak memory {'out of memory' if r['out_of_memory'] else gb(r['peak_memory'])} "
             f"(limit {gb(r['memory_limit'])})"]
    if "runs" in r:
        lines += [f"  one step: rollout {r['seconds_rollout']:.1f} s + score/update {r['seconds_score_update']:.1f} s "
                  f"(mean response {r['mean_response_length']:.0f} tokens); full-length update "
                  f"{r['seconds_full_length_update']:.1f} s",
                  f"  projected: {r['projected_seconds'] / 60:.1f} min for "
                  + ", ".join(f"{p['runs']} x {p['run']} ({p['steps']} steps)" for p in r["runs"])
                  + f"; disk {r['projected_disk'] / GB:.1f} GB (estimates from this one step)"]
    return "\n".join(lines)


def too_big(cfg, r, rows):
    """The message when the peak is over the limit: the options that lower it."""
    fixes = [f"--micro-batch-rows {max(1, (cfg.micro_batch_rows or rows) // 2)} (now "
             f"{cfg.micro_batch_rows or 'the whole batch'})"]
    if not cfg.activation_checkpointing:
        fixes.append("--activation-checkpointing")
    if cfg.chunk_size is None:
        fixes.append("--chunk-size 32")
    what = "--memory-limit" if cfg.memory_limit else "the device's memory"
    peak_text = "ran out of memory" if r["out_of_memory"] else f"peaked at {r['peak_memory'] / GB:.2f} GB, above {what}"
    limit = "" if r["memory_limit"] is None else f" ({r['memory_limit'] / GB:.2f} GB)"
    return (f"--preflight: the largest step ({r['largest']}, {rows} rows x {r['positions']} positions) {peak_text}"
            f"{limit}; lower it with " + " or ".join(fixes))
