"""Preflight: the largest step's memory and one real step per batch size before the long run, and what
the whole run will need.

    python train.py --preset gpu --preflight                      # minutes on a GPU: measure, project, stop
    python train.py --preset gpu --preflight --memory-limit 24    # as if the device had 24 GB

A comparison's largest configuration is the one with the most rows per step (``group_mean:16``:
8 prompts x 16 = 128 rows). The preflight runs, with every memory option of the command line:

1. **the worst case for memory**: score, estimate and update (``score_estimate_update``: train_step's
   calls after its rollout) on the step's real prompts with fabricated responses of the full response
   limit (random tokens, every position valid), since training may well make responses that long;
2. **one real step per batch size** of the plan (prompts x N for every N a configuration or the pilot
   uses; train.py's train_step: sampling, then the same update), smallest first, each from the initial
   weights and a fresh optimizer, as training's first step, for its time and its response length: a
   configuration is projected with its own batch size's rollout and learn, not with the largest's
   scaled. With ``--compile-decode`` each batch size's step runs once before, untimed: the first rollout
   of a shape compiles its decode step (on CUDA, and records its graph), which the timed step then
   reuses; that rollout's seconds beyond the timed one's are the batch size's compile, reported cold or
   warm (``fast_decode.compiled_since``: inductor's FX-graph cache missed, so kernels were built, or only
   hit, so they came from this machine's cache folder).

It reports the peak memory of each phase (the full-length update; the real steps' rollouts and their
score and update, split where train_step's rollout ends: the record it writes on its step log as its
scoring begins (``timed_step``), the largest over the batch sizes; CUDA:
``torch.cuda.max_memory_allocated``; CPU on Linux: the process's resident peak, VmHWM), the seconds per
step of each batch size, the largest configuration's success and sampler / trainer mismatch (what
training starts from on this device, in its precision), and a projection for the whole run:

    steps(c)  = min(--steps, ceil(B_c / (prompts x n_c x L(n_c))))    c: a configuration (or the pilot's)
    saves(c)  = as train.py writes them: after the first step, every --checkpoint-minutes, after the last
                (every step with 0)
    time      = sum over runs c of steps(c) x (t_rollout(n_c) + t_learn(n_c))  +  sum of saves(c) x t_save
                +  sum over batch sizes b of t_compile(b)               --compile-decode: once per batch size
    written   = saves x S                                     S, t_save: one checkpoint, written and timed here
    disk      = 4 P  +  8 P   (--keep-weights: runs x 4 P + 8 P)   P parameters: float32 weights of the
                                     running run and AdamW's two moments (a finished run keeps its weights
                                     only with --keep-weights)

where the runs are every configuration on every seed, and the pilot's runs (one per rate, at its
own budget) when there is one; L(n), t_rollout(n) and t_learn(n) are the mean response length, the
rollout's seconds and the score and update's seconds of the real step of prompts x n rows, and
t_compile(b) the untimed rollout's seconds less the timed one's at b rows. ``project`` computes it
from those numbers alone, so it can be checked on recorded timings.

t_rollout is the real step's decode steps (one per sampled position, until every row has ended) times
its seconds per decode step; the report gives both. The time is an estimate: each real step's response
length and speed stand for every step of its batch size. The weights are restored afterwards, so a
comparison that follows starts from the same ones. For ``--preset gpu`` the report ends with the
preset's goal (1 hour on one H100, 2 on a 24 GB card) beside the projection.

If a phase runs out of memory, or its peak exceeds ``--memory-limit`` (GB; by default what the
device has free when the preflight starts, plus what this process already holds), it stops with
one line naming the phase and the options that lower that phase. Everything goes into
``<run folder>/preflight.json``.
"""
import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

import rollout
import tasks
from lab import compare, fast_decode, options, runs

GB = 1e9


def largest(cfg):
    """(estimator, group size) of the configuration with the most rows per step."""
    return max(runs.runs_of(cfg), key=lambda run: run[1])


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
    """Bytes this process may use: on CUDA what the card has free (torch.cuda.mem_get_info, so other
    processes count against it) plus what this process's allocator already holds; on Linux the
    machine's available memory plus this process's resident size; None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
    meminfo = Path("/proc/meminfo")
    if meminfo.exists() and resident() is not None:
        return int(meminfo.read_text().split("MemAvailable:")[1].split()[0]) * 1024 + resident()
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


def batch_sizes(cfg):
    """{group size N: estimator} of every batch size (prompts x N) the run samples, the pilot's included,
    each with the first configuration of that size (the one whose step the preflight times)."""
    configs = runs.runs_of(cfg)
    if cfg.lr_pilot:
        e, _, g = cfg.lr_pilot_run.partition(":")
        configs = [(e, int(g))] + configs
    sizes = {}
    for e, g in configs:
        sizes.setdefault(g, e)
    return sizes


def run(cfg, model, tok, folder, train):
    """Measure, project, write folder/preflight.json, print; UsageError (one line naming the phase) when
    a phase runs out of memory or peaks over the limit. ``train``: train.py itself, whose step is measured
    (lab/ imports no command: train.main passes its module)."""
    device = next(model.parameters()).device
    memory_limit = cfg.memory_limit * GB if cfg.memory_limit else device_memory(device)  # before we allocate
    est, n = largest(cfg)
    sub = replace(cfg, estimator=est, group_size=n, compare=None, seeds=None)
    task = options.make_task(cfg)
    init = compare.weights(model)  # restored at the end
    limit = tasks.response_limit(task, cfg.max_new_tokens)
    rows = cfg.prompts_per_step * n
    folder.mkdir(parents=True, exist_ok=True)
    peaks, phase, measured, t_full, save = {}, ["learn"], {}, None, None  # phase: where an out-of-memory error lands

    def rollout_done():  # train_step's rollout has ended: its peak is complete
        peaks["rollout"], phase[0] = max(peaks.get("rollout") or 0, peak(device) or 0) or None, "learn"
        reset_peak(device)

    adamw = lambda: torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # noqa: E731

    try:
        opt = adamw()
        # 1. the worst case: every response as long as the limit
        prompts, _ = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)
        ro, R, token_rewards = full_length_batch(prompts, n, limit, len(tok), tok.pad_token_id, device)
        reset_peak(device)
        t0 = time.perf_counter()
        score_estimate_update(train, sub, model, opt, ro, token_rewards, train.make_estimator(est, cfg.zero_tail))
        peaks["learn_full_length"], t_full = peak(device), time.perf_counter() - t0
        model.zero_grad(set_to_none=True)  # as in training: no gradients held through the rollout
        del ro, R, token_rewards, opt
        # 2. one real step per batch size, smallest first (the largest then holds the others' static caches, as
        # in the run), each from the initial weights and a fresh optimizer as training's first step: its time,
        # response length, success and mismatch; a peak per phase
        sampler = options.sampler(cfg, model)
        for g, e in sorted(batch_sizes(cfg).items()):
            step_cfg, estimator = replace(sub, estimator=e, group_size=g), train.make_estimator(e, cfg.zero_tail)
            model.load_state_dict(init)
            phase[0] = "rollout"
            compiled, t_first = None, None
            if cfg.compile_decode:  # the first step of a shape compiles its decode step (CUDA: and records
                before = fast_decode.compile_counts()  # its graph): untimed
                first, t = timed_step(train, step_cfg, model, sampler, adamw(), task, tok, estimator, 0, rollout_done)
                compiled, t_first = fast_decode.compiled_since(before), t["rollout"]
                del first
                model.zero_grad(set_to_none=True)
                model.load_state_dict(init)
                phase[0] = "rollout"
            opt = adamw()
            reset_peak(device)
            s, t = timed_step(train, step_cfg, model, sampler, opt, task, tok, estimator, 0, rollout_done)
            seconds = (t["rollout"], t["score"] + t["estimate"] + t["update"])  # rollout, learn
            peaks["learn"] = max(peaks.get("learn") or 0, peak(device) or 0) or None
            measured[g] = step_record(s, seconds, f"{e}:{g}", compiled, t_first)
            model.zero_grad(set_to_none=True)
            if g == n:
                save = time_save(folder / "preflight_checkpoint.pt", model, opt)
            del s, opt
    except torch.OutOfMemoryError:
        peaks["out_of_memory"] = phase[0]
    finally:
        model.load_state_dict(init)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = project(cfg, est, n, rows, limit, prompts, measured if save else None, peaks, t_full, save,
                     sum(p.numel() for p in model.parameters()))
    report["memory_limit"] = memory_limit
    report["device"] = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    (folder / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    print(describe(report), flush=True)
    if report["out_of_memory"] or over_limit(report):
        raise options.UsageError(too_big(cfg, report, rows, limit))
    return report


def step_record(s, seconds, run, compiled=None, t_first=None):
    """What the projection takes from one real step (train.py's StepResult ``s`` of the configuration
    ``run``, and its ``seconds``: (rollout, learn: score, estimate, update)), as plain numbers: its mean
    response length L, rollout and learn seconds, decode steps, success and sampler / trainer mismatch; with
    ``--compile-decode``, ``compiled`` (fast_decode.compiled_since over the untimed first step) and that
    step's rollout seconds ``t_first``."""
    m = s.ro.response_mask  # (B, T)
    delta = ((s.old_logp - s.ro.logp) * m).abs()  # |log pi_train - log pi_rollout|, (B, T)
    decode_steps = s.ro.response.shape[1]  # positions the step sampled: one decode step each
    record = dict(run=run, rows=len(m), mean_response_length=m.sum(-1).mean().item(), seconds_rollout=seconds[0],
                  seconds_score_update=seconds[1], decode_steps=decode_steps,
                  seconds_per_decode_step=seconds[0] / max(decode_steps, 1), success=(s.R >= 1).float().mean().item(),
                  mismatch_mean_abs=(delta.sum() / m.sum().clamp(min=1)).item(), mismatch_max_abs=delta.max().item(),
                  seconds_compile=None, compile_cache=None, compiled=compiled)
    if compiled is not None:  # the untimed rollout less the timed one: compiling (CUDA: and recording the graph)
        record.update(seconds_compile=max(0.0, t_first - seconds[0]), compile_cache=compiled["cache"])
    return record


def score_estimate_update(train, cfg, model, opt, ro, token_rewards, estimator):
    """train.py's train_step after its rollout, on a batch of the preflight's own (``full_length_batch``):
    the step's calls in its order, score (``score_rows``, its graph kept as ``keep_scoring_graph`` says) ->
    estimate -> update (``policy_update``). tests/test_inputs_preflight.py checks that on the step's own
    batch it updates the weights as the step does. ``train``: train.py's module; the update's minibatch order
    (if any) from a fixed seed."""
    model.train()
    B = len(ro.response_mask)
    with torch.set_grad_enabled(train.keep_scoring_graph(cfg, B)):
        logp, sum_pi_sq, _ = train.score_rows(model, cfg, ro, torch.arange(B, device=ro.response.device))
    adv, _ = estimator(token_rewards=token_rewards, response_mask=ro.response_mask, group_index=ro.group_index,
                       log_probs=logp.detach(), sum_pi_sq=sum_pi_sq)  # A_t, (B, T)
    train.policy_update(model, opt, cfg, ro, logp, adv, torch.Generator().manual_seed(0))


def timed_step(train, cfg, model, sampler, opt, task, tok, estimator, step, rollout_done=lambda: None):
    """train.py's train_step, its phases timed from the records it writes on ``train.step_log`` as each
    begins: (its StepResult, seconds), seconds = dict(rollout, score, estimate, update), in the step's
    order; they add up to the step. On CUDA the device is synchronized at each record, so that a phase's
    seconds are its own kernels'. ``rollout_done()`` runs as the rollout ends (the caller reads a phase's
    peak memory there). ``train``: train.py's module."""
    device = next(model.parameters()).device
    begun = {}  # phase -> the time it began

    def hear(record):
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the phase before has finished on the device
        begun[record.getMessage()] = time.perf_counter()
        if record.getMessage() == "score":
            rollout_done()
    with Listening(train.step_log, hear):
        s = train.train_step(cfg, model, sampler, opt, task, tok, estimator, step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    ends = list(begun.values())[1:] + [time.perf_counter()]  # a phase ends where the next begins
    return s, {phase: end - t for (phase, t), end in zip(begun.items(), ends)}


class Listening(logging.Handler):
    """Within the block, ``hear(record)`` gets each record written on ``log``, its DEBUG records
    included; they do not reach the handlers above it. The log's level and propagation are put back on
    leaving."""

    def __init__(self, log, hear):
        super().__init__(logging.DEBUG)
        self.log, self.hear = log, hear

    def emit(self, record):
        self.hear(record)

    def __enter__(self):
        self.before = self.log.level, self.log.propagate
        self.log.setLevel(logging.DEBUG)
        self.log.propagate = False
        self.log.addHandler(self)

    def __exit__(self, *exc):
        self.log.removeHandler(self)
        self.log.setLevel(self.before[0])  # (and clears the log's cache of what is enabled)
        self.log.propagate = self.before[1]


def time_save(path, model, opt):
    """(seconds, bytes) of writing one checkpoint of the running run (weights and AdamW's moments),
    as the run's checkpoints write it; the file is deleted."""
    t0 = time.perf_counter()
    torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict()), path)
    seconds, size = time.perf_counter() - t0, path.stat().st_size
    path.unlink()
    return seconds, size


# What a compile's cache state means for the projection (fast_decode.compiled_since)
CACHE_NOTE = {"warm": " (inductor read its kernels from this machine's cache: where they were never built, compiling "
                      "takes longer; docs/training.md, 'Time')",
              "none": " (inductor compiled nothing: another backend)"}

PHASES = {"learn_full_length": "learn (score and update) at full length", "rollout": "rollout",
          "learn": "learn (score and update) of the real step"}


def over_limit(r):
    """The phases whose peak is above the limit, highest first."""
    if r["memory_limit"] is None:
        return []
    return sorted((k for k, v in r["peaks"].items() if v is not None and v > r["memory_limit"]),
                  key=lambda k: -r["peaks"][k])


def project(cfg, est, n, rows, limit, prompts, measured, peaks, t_full, save, n_params):
    """The report: what was measured and the projection for the whole run or comparison. ``measured``:
    {group size: step_record} of every batch size (None after an out-of-memory error); ``save``: (seconds,
    bytes) of one checkpoint; ``t_full``: the full-length update's seconds. Plain numbers only, so the
    projection can be checked on recorded timings."""
    P = max(map(len, prompts))
    oom = peaks.pop("out_of_memory", None)
    known = [v for v in peaks.values() if v is not None]
    report = dict(largest=f"{est}:{n}", rows=rows, positions=P + limit, out_of_memory=oom is not None,
                  out_of_memory_phase=oom, peaks=peaks, peak_memory=None if oom or not known else max(known),
                  seconds_full_length_update=t_full)
    if measured is None or oom:  # out of memory: nothing to project from
        return report
    t_save, size = save
    seeds = len(runs.seed_list(cfg)) if cfg.seeds else 1

    def planned(name, g, budget, copies):
        m = measured[g]  # the real step of this configuration's batch size
        per_step = cfg.prompts_per_step * g * max(m["mean_response_length"], 1.0)  # tokens sampled per step
        steps = min(cfg.steps, math.ceil(budget / per_step)) if budget else cfg.steps
        seconds = m["seconds_rollout"] + m["seconds_score_update"]
        return dict(run=name, runs=copies, group_size=g, steps=steps, seconds_per_step=seconds,
                    saves=checkpoint_saves(steps, seconds, cfg.checkpoint_minutes))
    plan = [planned(f"{e}:{g}", g, cfg.token_budget, seeds) for e, g in runs.runs_of(cfg)]
    if cfg.lr_pilot:  # the pilot's runs come first: one per rate
        e, _, g = cfg.lr_pilot_run.partition(":")
        plan.insert(0, planned(f"pilot {e}:{g}", int(g), cfg.lr_pilot_budget or max(1, cfg.token_budget // 4),
                               len(cfg.lr_pilot.split(","))))
    saves = sum(r["runs"] * r["saves"] for r in plan)
    # --compile-decode compiles once per batch size in the process (the cache length is the same for all)
    compiled = [m for m in measured.values() if m["seconds_compile"] is not None]
    t_compiling = sum(m["seconds_compile"] for m in compiled)
    top = measured[n]  # the largest configuration's real step
    report.update({k: top[k] for k in ("mean_response_length", "seconds_rollout", "seconds_score_update",
                                       "decode_steps", "seconds_per_decode_step", "success", "mismatch_mean_abs",
                                       "mismatch_max_abs")})
    report.update(measured=[dict(m, group_size=g) for g, m in sorted(measured.items())], seeds=seeds,
                  checkpoint_bytes=size, seconds_checkpoint=t_save, checkpoint_saves=saves, runs=plan,
                  compiles=len(compiled), seconds_compiling=t_compiling,
                  projected_seconds=sum(r["runs"] * r["steps"] * r["seconds_per_step"] for r in plan)
                  + saves * t_save + t_compiling,
                  projected_bytes_written=saves * size,
                  projected_disk=((sum(r["runs"] for r in plan) if cfg.keep_weights else 1) * 4 + 8) * n_params)
    if cfg.preset in GOAL_HOURS:
        report["goal_hours"] = GOAL_HOURS[cfg.preset]
    if cfg.seeds:
        report["seeds_plan"] = seeds_plan(plan, seeds, t_save, t_compiling)
    return report


def checkpoint_saves(steps, seconds_per_step, minutes):
    """The checkpoints a run of ``steps`` steps of ``seconds_per_step`` each writes, as train.train writes
    them: after its first step, then after each step that ends ``minutes`` or more after the last save,
    and after its last step; after every step with 0."""
    if minutes == 0:
        return steps
    count, last = 0, -math.inf
    for k in range(1, steps + 1):
        if k == steps or k * seconds_per_step - last >= 60 * minutes:
            count, last = count + 1, k * seconds_per_step
    return count


# What the GPU preset should take, as this projection has it (docs/training.md): (card, hours)
GOAL_HOURS = {"gpu": [("one H100", 1.0), ("a 24 GB card", 2.0)]}


def seeds_plan(plan, seeds, t_save, fixed=0.0):
    """How many paired seeds the primary contrast needs at the planning values (compare.POWER_PLAN,
    docs/training.md), the power of the seeds given, and what one seed and the needed seeds cost
    by this projection (the pilot's runs and the ``fixed`` seconds, compiling, counted once)."""
    from lab.analysis import stats  # scipy: loaded where a statistic is computed, not by ``import train``
    plan_values = compare.POWER_PLAN
    cost = lambda r: r["runs"] * (r["steps"] * r["seconds_per_step"] + r["saves"] * t_save)  # noqa: E731
    pilot = sum(cost(r) for r in plan if r["run"].startswith("pilot"))
    per_seed = sum(cost(r) / r["runs"] for r in plan if not r["run"].startswith("pilot"))
    need = stats.seeds_needed(**plan_values)
    return dict(effect=plan_values["effect"], sd=plan_values["sd"], alpha=plan_values["alpha"],
                target_power=plan_values["power"], seeds_needed=need, seeds=seeds,
                power_of_these_seeds=stats.paired_t_power(plan_values["effect"], plan_values["sd"], seeds,
                                                          plan_values["alpha"]) if seeds >= 2 else None,
                seconds_per_seed=per_seed, projected_seconds_needed=pilot + fixed + need * per_seed)


def describe(r):
    """The report as a few readable lines."""
    gb = lambda x: "unknown" if x is None else f"{x / GB:.2f} GB"  # noqa: E731
    peaks = ", ".join(f"{PHASES[k]} {gb(v)}" for k, v in r["peaks"].items())
    lines = [f"preflight: largest step {r['largest']} ({r['rows']} rows x {r['positions']} positions) on {r['device']}",
             f"  peak memory: {peaks}" + (f"; out of memory in the {r['out_of_memory_phase']}" if r["out_of_memory"]
                                          else "") + f" (limit {gb(r['memory_limit'])})"]
    if "runs" in r:
        lines.append("  one real step per batch size: rollout + score/update seconds, mean response, decode steps:")
        for m in r["measured"]:
            compiled = "" if m["seconds_compile"] is None else (
                f"; compiling it {m['seconds_compile']:.1f} s, {m['compile_cache']}"
                + CACHE_NOTE.get(m["compile_cache"], ""))
            lines.append(f"    {m['rows']} rows ({m['run']}): {m['seconds_rollout']:.1f} s + "
                         f"{m['seconds_score_update']:.1f} s, "
                         f"{m['mean_response_length']:.0f} tokens, {m['decode_steps']} decode steps of "
                         f"{1000 * m['seconds_per_decode_step']:.1f} ms{compiled}")
        lines += [f"  full-length update {r['seconds_full_length_update']:.1f} s; the largest step as sampled here: "
                  f"success {r['success']:.3f}; sampler / trainer mismatch |log pi_train - log pi_rollout| mean "
                  f"{r['mismatch_mean_abs']:.1e}, max {r['mismatch_max_abs']:.1e}",
                  f"  projected: {r['projected_seconds'] / 60:.1f} min ({r['projected_seconds'] / 3600:.2f} h) = "
                  "steps x seconds per step of the run's batch size + saves x seconds per save"
                  + (" + each batch size's compile" if r["compiles"] else "") + ", each factor measured here:",
                  "    " + ", ".join(f"{p['runs']} x {p['run']} ({p['steps']} steps of {p['seconds_per_step']:.1f} s)"
                                     for p in r["runs"]) + "; the steps from the batch size's mean response",
                  f"    {r['checkpoint_saves']} checkpoint saves of {gb(r['checkpoint_bytes'])} "
                  f"({r['seconds_checkpoint']:.1f} s each, {gb(r['projected_bytes_written'])} written)"
                  + (f"; {r['compiles']} compiles of the decode step, {r['seconds_compiling']:.0f} s in all"
                     if r["compiles"] else "")
                  + f"; disk {r['projected_disk'] / GB:.1f} GB (estimates from these steps)"]
    if "goal_hours" in r:
        goal = ", ".join(f"{h:g} h on {card}" for card, h in r["goal_hours"])
        lines.append(f"  goal for this preset (docs/training.md): {goal}; projected here "
                     f"{r['projected_seconds'] / 3600:.2f} h")
    if "seeds_plan" in r:
        p = r["seeds_plan"]
        power = "-" if p["power_of_these_seeds"] is None else f"{p['power_of_these_seeds']:.2f}"
        lines.append(f"  seeds: the primary contrast needs {p['seeds_needed']} paired seeds "
                     f"for power {p['target_power']:g} "
                     f"at the {p['alpha']:g} level against a difference of {p['effect']:+.3f} (between-seed SD "
                     f"{p['sd']:.3f}; planning values from the CPU study, docs/training.md); the {p['seeds']} given "
                     f"have power {power}; one seed costs {p['seconds_per_seed'] / 60:.1f} min, "
                     f"{p['seeds_needed']} seeds {p['projected_seconds_needed'] / 60:.1f} min with the pilot")
    return "\n".join(lines)


def too_big(cfg, r, rows, response_limit):
    """One line: the phase that ran out of memory (or those over the limit) and the options that lower each."""
    what = "--memory-limit" if cfg.memory_limit else "the memory free on the device"
    limit = "" if r["memory_limit"] is None else f" ({r['memory_limit'] / GB:.2f} GB)"
    if r["out_of_memory"]:
        phases = [r["out_of_memory_phase"]]
        text = f"the {'rollout' if phases[0] == 'rollout' else 'learn (score and update)'} ran out of memory"
    else:
        phases = list(dict.fromkeys("rollout" if k == "rollout" else "learn" for k in over_limit(r)))
        text = ", ".join(f"the {PHASES[k]} peaked at {r['peaks'][k] / GB:.2f} GB" for k in over_limit(r))
        text += f", above {what}{limit}"
    remedies = []
    for ph in phases:
        lowering = fixes(cfg, ph, rows, response_limit)
        remedies.append(f"lower the {ph} with " + " or ".join(lowering) if lowering else
                        f"no option lowers the {ph} further")
    return (f"--preflight: in the largest step ({r['largest']}, {rows} rows x {r['positions']} positions) {text}; "
            + "; ".join(remedies))


def fixes(cfg, phase, rows, response_limit):
    """The options that lower a phase's memory, each with a value that changes something."""
    if phase == "rollout":  # the sampler holds prompts x N rows and their KV cache
        P = cfg.prompts_per_step
        return [f"--prompts-per-step {P // 2} (now {P}; fewer prompts per step)"] if P > 1 else []
    out = []
    now = min(cfg.micro_batch_rows or rows, rows)  # rows per pass as it runs
    if now > 1:
        out.append(f"--micro-batch-rows {now // 2} (now {now} rows per pass)")
    chunk = min(cfg.chunk_size or response_limit, response_limit)  # positions of the LM head at once
    if chunk > 1:
        out.append(f"--chunk-size {min(32, chunk // 2) if cfg.chunk_size is None else chunk // 2} (now {chunk})")
    if not cfg.activation_checkpointing:
        out.append("--activation-checkpointing")
    return out
