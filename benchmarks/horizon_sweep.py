"""Does a per-token baseline matter more as responses get longer? A static sweep over the horizon.

At fixed weights (a warmed-up checkpoint of the tiny model on the periodic-copy task, one per
seed and horizon n), every estimator sees the same sampled responses, and its batch gradient
for one group of N responses,

    g = (1 / N) sum_i sum_t A_t^i grad_theta log pi(y_t^i)                          (1)

is computed exactly by backward passes (benchmarks/grad_variance.py: one backward per response
for sequence-level advantages, one per group for OTB's token-level ones). Per prompt,
M pooled responses are split into M / N disjoint groups (i.i.d. samples of (1)); quality is the
scale-free normalised variance nvar = tr Var(g) / ||E g||^2 (scale_free.py), with alpha and the
cosine against a separate reference pool, and the headline is the gain over the group mean,
nvar(group_mean) / nvar(estimator). Prompts are the bootstrap's unit, resampled within each seed;
the seeds are strata whose signal and noise are summed, the ratio's interval is a test inversion,
and a random-effects fit over the seeds shows whether they agree (resampling.py, stats.py; how and why:
docs/variance.md). The per-prompt sufficient statistics are
saved in stats.npz, so --from-saved re-bootstraps without a model:

    python benchmarks/horizon_sweep.py                               # n = 16, 64, 128; 3 seeds
    python benchmarks/horizon_sweep.py --horizons 16 --seeds 0 --prompts 4 --pool 16   # smoke run
    python benchmarks/horizon_sweep.py --from-saved benchmarks/results/horizon_sweep --out /tmp/re
    python benchmarks/horizon_sweep.py --from-saved DIR_SEED0,DIR_SEED1 --out DIR   # seeds run side by side
    python benchmarks/horizon_sweep.py --from-saved DIR --seeds 0,1 --out DIR2      # two of DIR's seeds
    python benchmarks/horizon_sweep.py --horizons 16,64,128,256 --resume --out DIR   # add n = 256 to DIR

With tool use (``--task calculator``, tool_use.CalculatorTask) the horizon is k, the number of
numbers to add with k - 1 tool calls; the responses hold the tool's output as holes (mask 0), the
sampler forces it in, and every gradient sees it as context. There the sweep compares
position-aligned otb with action-aligned otb_tir (docs/tool_use.md):

    python benchmarks/horizon_sweep.py --task calculator --estimators reinforce,group_mean,rloo,otb,otb_tir

Memory: every estimator's mean gradient per prompt and N is kept until the end (float32, the
model's parameter count each): with the tiny model (0.8M parameters), 5 estimators and 2 group
sizes, 32 MB per prompt, and --prompts 128 was measured near 10 GB at its end; measure seeds in separate processes (--seeds 0, --seeds 1,
... each with its own --out) only as many at a time as memory holds, and join them with --from-saved.

A pretrained model (``--model smollm2``, a folder or a hub id, as train.py's --model) is measured
the same way on --task count (tasks.CountTask: n = how many numbers are listed), with no warm-up:
one model for every (seed, n), the seeds drawing other prompts and responses. Its gradients are
projected (--project k, common.sketch: a fixed count sketch that keeps every inner product in
expectation), so a prompt keeps k numbers per estimator and N instead of 135M; pools are sampled
--sample-prompts prompts at a time. It prints its projected GPU time before measuring
(``projected_gpu_seconds``; docs/variance.md):

    python benchmarks/horizon_sweep.py --model smollm2 --task count --horizons 10,30,70 --seeds 0 \
        --estimators reinforce,group_mean,rloo,otb --project 4096 --out runs/smollm2_variance

A long sweep survives a stop: each prompt's statistics are written to OUT/prompts/ as it finishes (and a
progress record to OUT/sweep.json), ``--resume`` continues from them with the same pools, groups and
projection as a run straight through, ``--from-saved OUT --out DIR`` analyses the prompts done so far, and
``--stop-after SECONDS`` stops by itself after the prompt that passes the limit. Each finished cell goes into
stats.npz (lab/analysis/compact.py: only what the analysis reads) and its prompts' files are removed. What is
saved and how it is read back: benchmarks/sweep_records.py; the tables and the figure:
benchmarks/sweep_report.py.

OTB taken apart (docs/smollm2_decomposition_protocol.md): with otb_loo, otb_zero_tail, OPO (opo, opo_loo) and
the sequence-level optimal baselines of otb eq. (9) (seq_proxy, seq_exact and their _loo forms, from the S_i,
no backward pass of their own) among the estimators, each prompt's record also keeps its responses' lengths,
energies and groups (OUT/responses.npz once a cell is done), one one-success group is saved token by token
(OUT/lesson_nN_seedS.json), and benchmarks/decomposition.py's report is written beside the tables.

Writes runs/horizon_sweep/ by default; ``--out benchmarks/results/horizon_sweep`` updates the
committed results (results.json, stats.npz, table.md, summary.md, gain_vs_horizon.png). summary.md answers
docs/smollm2_variance_protocol.md's two questions for OTB: is its gain over the group mean above 1 at every
N, and does it grow with n (``horizon_contrasts``: the ratio of the gains, prompts resampled jointly).
"""
import argparse
import itertools
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import rollout  # noqa: E402
from lab.analysis import resampling, scale_free, stats  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from lab import options  # noqa: E402
from benchmarks.common import (SEQUENCE_ENERGIES, advantages, draw_pool, flatten, group_gradients,  # noqa: E402
                               group_ids_of, is_sequence_level, proxy_energy, reference_gradient, response_scores,
                               sketch, subset, token_group_gradients)
from benchmarks import cli, decomposition  # noqa: E402
from benchmarks.sweep_records import (cell_of, grams_of, info_of, load_grams, load_prompt,  # noqa: E402
                                      progress_file, read_responses, read_saved, record_path, recorded_cells,
                                      resumed, save_grams, save_lesson, save_prompt, save_responses, settings,
                                      write_responses)
from benchmarks.sweep_report import (checkpoints_md, contrasts_md, head_to_head_md, model_note, plot,  # noqa: E402
                                     summary_md, table_md, took)
from lab import machine  # noqa: E402
from lab.machine import kept_provenance, provenance as code_provenance  # noqa: E402


def parse_args(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("--task", default="periodic", choices=("periodic", "calculator", "factors", "count"),
                   help="periodic: n = answer length; calculator and factors (its tool's replies vary in length): "
                   "n = k, numbers added with k - 1 tool calls; count (a chat model, e.g. --model smollm2): "
                   "n = numbers listed")
    p.add_argument("--horizons", type=cli.int_list(1), default=None,
                   help="the task's horizons n (periodic: 16,64,128; calculator, factors: 2,4,8; count: 10,30,70)")
    p.add_argument("--model", default="tiny", help="tiny (a warmed-up checkpoint per seed and n), or as train.py's "
                   "--model: smollm2, a folder or a hub id (pretrained: no warm-up, one model for every cell)")
    p.add_argument("--project", type=cli.at_least(0), default=None, help="k: keep a fixed random projection "
                   "of each gradient to k numbers (common.sketch), not the gradient; 0: the exact gradient "
                   "(default: 0 for tiny, 4096 otherwise)")
    p.add_argument("--temperature", type=float, default=None, help="sampling and scoring temperature "
                   "(default: train.py's 1.0 for tiny, the gpu preset's 0.7 otherwise)")
    p.add_argument("--sample-prompts", type=cli.at_least(0), default=None, help="prompts per sampling call "
                   "(memory: the KV cache of prompts x pool rows); 0: all at once (default: 0 for tiny, 8 otherwise)")
    p.add_argument("--device", type=cli.device_option, default="auto", help="auto (cuda if there is one), cpu or cuda")
    p.add_argument("--decode", default="plain", choices=("plain", "compiled"), help="the sampler: rollout.sample "
                   "(plain), or lab/fast_decode.py's static cache and compiled decode step (the same tokens; for a GPU)")
    p.add_argument("--stop-after", type=float, default=0.0, help="seconds: stop once this much time has passed "
                   "(checked after each prompt; what is measured stays recorded, --resume continues it, --from-saved "
                   "analyses it); 0: no limit")
    p.add_argument("--estimators", type=cli.choice_list(list(otb.ESTIMATORS) + list(SEQUENCE_ENERGIES)),
                   default=",".join(e for e in otb.ESTIMATORS if not e.startswith("opo")),
                   help="reinforce and group_mean are always needed; besides otb.ESTIMATORS, the sequence-level "
                   "optimal baselines of otb eq. (9) with the proxy energy W_T (seq_proxy, seq_proxy_loo) or the "
                   "exact ||S_i||^2 (seq_exact, seq_exact_loo), computed from the S_i the sweep has")
    p.add_argument("--seeds", type=cli.int_list(0), default=None, help="a warmed-up model per (seed, n) "
                   "(default 0,1,2); with --from-saved: analyse only these seeds' cells")
    p.add_argument("--group-sizes", type=cli.int_list(1), default="4,16",
                   help="N values; each must divide --pool at least twice")
    p.add_argument("--prompts", type=cli.at_least(2), default=48,
                   help="prompts per checkpoint (the bootstrap's units)")
    p.add_argument("--pool", type=int, default=32, help="M, responses per prompt split into groups")
    p.add_argument("--ref-pool", type=cli.multiple_of(4, 8), default=32, help="responses per prompt of the "
                   "separate reference pool (RLOO in 4 sub-pools)")
    p.add_argument("--warmup-target", type=float, default=0.25, help="warm-up stops at this sampled success")
    p.add_argument("--cache", default=str(ROOT / "runs"), help="folder of train.py's warm-up cache")
    p.add_argument("--replicates", type=cli.at_least(100), default=2000,
                   help="bootstrap draws of prompts per checkpoint")
    p.add_argument("--from-saved", default="", help="a folder with a saved sweep (results.json, stats.npz), or "
                   "several, comma-separated, measured with the same settings for different seeds: re-analyse "
                   "them together into --out without measuring anything")
    p.add_argument("--resume", action="store_true", help="continue the sweep saved in --out (same pool "
                   "settings): keep its finished (n, seed) cells and the prompts it recorded in an unfinished one, "
                   "measure only the rest; the same pools, groups and projection as a run straight through")
    p.add_argument("--out", type=cli.out_folder, default=str(cli.RUNS / "horizon_sweep"), help="the results")
    args = p.parse_args(argv)
    args.only_seeds, args.seeds = args.seeds, args.seeds or [0, 1, 2]
    args.horizons = args.horizons or dict(periodic=[16, 64, 128], count=[10, 30, 70]).get(args.task, [2, 4, 8])
    tiny = args.model == "tiny"
    args.project = (0 if tiny else 4096) if args.project is None else args.project
    args.temperature = (1.0 if tiny else options.PRESETS["gpu"]["temperature"]) if args.temperature is None \
        else args.temperature
    args.sample_prompts = (0 if tiny else 8) if args.sample_prompts is None else args.sample_prompts
    if args.project == 1:
        p.error("--project 1: k must be 0 (no projection) or at least 2")
    if not {"reinforce", "group_mean"} <= set(args.estimators):
        p.error(f"--estimators {','.join(args.estimators)}: reinforce and group_mean are always needed")
    if args.model == "tiny" and any(n > 400 for n in args.horizons):
        p.error(f"--horizons {max(args.horizons)}: n must be at most 400 (the tiny model has 512 positions)")
    if any(args.pool % n or args.pool // n < 2 for n in args.group_sizes):
        p.error(f"--group-sizes {','.join(map(str, args.group_sizes))}: each N must divide "
                f"--pool {args.pool} at least twice")
    def holds_sweep(folder):  # a finished sweep, or one this script has started and records as it goes
        return progress_file(folder).is_file() or all((Path(folder) / f).is_file() for f in ("results.json", "stats.npz"))
    if args.resume and not holds_sweep(args.out):
        p.error(f"--resume: {args.out} holds no sweep to continue (sweep.json, or results.json and stats.npz)")
    if not args.resume and not args.from_saved and any(Path(args.out).glob("prompts/n*_seed*/p*.npz")):
        p.error(f"--out {args.out} holds the recorded prompts of an unfinished sweep: add --resume to continue it, "
                "or choose another --out")
    for folder in filter(None, args.from_saved.split(",")):
        if not holds_sweep(folder):
            p.error(f"--from-saved {folder}: no results.json and stats.npz there, nor sweep.json "
                    "(a sweep saved by this script)")
    if args.stop_after < 0:
        p.error(f"--stop-after {args.stop_after:g}: seconds must be 0 (no limit) or more")
    if not 0 < args.warmup_target < 1:
        p.error(f"--warmup-target {args.warmup_target} must be in (0, 1)")
    return args


LOADED = {}  # a pretrained model is loaded once for every (n, seed)


def compiled_sampler():
    from lab import fast_decode  # only where it is asked for: it imports torch's compiler
    return fast_decode.sample


SAMPLERS = {"plain": lambda: rollout.sample, "compiled": compiled_sampler}


class OutOfTime(Exception):
    """--stop-after has passed: the sweep stops after the prompt it has just recorded."""


def checkpoint(n, seed, args):
    """The warmed-up tiny model for (n, seed), through train.py's cached warm-up; or the pretrained
    --model, the same for every cell."""
    cfg = train.Config(task=args.task, horizon=n, seed=seed, warmup_target=args.warmup_target,
                       out=args.cache, model=args.model, temperature=args.temperature)
    torch.manual_seed(seed)
    device = options.pick_device(args.device) if args.model != "tiny" else torch.device("cpu")
    if args.model == "tiny":
        model, tok, source = options.load(cfg, device)
    else:
        if (args.model, device) not in LOADED:
            LOADED[(args.model, device)] = options.load(cfg, device)
        model, tok, source = LOADED[(args.model, device)]
    return model, tok, options.make_task(cfg), cfg, source


def measure_checkpoint(model, tok, task, cfg, args, seed, records, saved=lambda: None, lesson=None):
    """Per estimator and N, the sufficient statistics over prompts (scale_free.gram_stats); info.

    Each prompt's statistics are written to the folder ``records`` as soon as it is measured (``save_prompt``;
    then ``saved()`` is called), and a prompt already recorded there (a run that stopped and is resumed) is
    read back, not measured again. A resumed run measures the rest exactly as a run straight through
    would: a block's pools are drawn from the same seeds when its first unrecorded prompt needs them, the
    groups' permutations are drawn for every prompt in order, recorded or not, and the projection is seeded.
    Per prompt the record also keeps every pool response's length, proxy energy W_T and ||S_i||^2 (exact, and
    projected) and the group permutation; ``lesson``: a file for one N = 4 group with exactly one success
    (its tokens and their advantages, ``save_lesson``), written at the first prompt that has one."""
    limit = tasks.response_limit(task, cfg.max_new_tokens)
    prompts, answers = tasks.prompt_batch(task, tok, 10_000 + seed, 0, args.prompts)  # unseen by RL
    block = args.sample_prompts or args.prompts  # prompts per sampling call
    records.mkdir(parents=True, exist_ok=True)
    drawn = {}  # the block whose pools are in memory

    def pools_of(b):  # (pool, reference pool) of block b: (Rollout, (R, token_rewards, texts)), seeded s + 1000003 b
        if b not in drawn:
            drawn.clear()
            rows = slice(b * block, (b + 1) * block)
            drawn[b] = [draw_pool(model, tok, task, prompts[rows], answers[rows], m, s + 1_000_003 * b, limit,
                                  cfg.temperature, SAMPLERS[args.decode]())
                        for m, s in ((args.pool, seed), (args.ref_pool, seed + 7919))]  # the reference: independent
        return drawn[b]
    split = torch.Generator().manual_seed(seed + 1)
    project = sketch(model, args.project) if args.project else flatten  # the same P for every gradient
    device = next(model.parameters()).device
    for p in tqdm(range(args.prompts), desc=f"n={task.horizon} seed={seed}", leave=False):
        perm = torch.randperm(args.pool, generator=split)  # the prompt's groups, drawn whether it is recorded or not
        if record_path(records, p).is_file():
            continue
        started = time.time()
        q = p % block  # the prompt's place in its block
        (pool, (R, token_rewards, _)), (ref_pool, (R_ref, ref_rewards, _)) = pools_of(p // block)
        # the seconds of each phase; a block's sampling lands on its first prompt
        timing, mark = {"pools": time.time() - started}, time.time()
        # reference r_p: RLOO inside 4 disjoint sub-pools of a separate pool (unbiased for this prompt)
        ref_rows = torch.arange(q * args.ref_pool, (q + 1) * args.ref_pool)
        ref = reference_gradient(model, ref_pool, ref_rewards, ref_rows, cfg.temperature, project=project)[0]
        timing["reference"], mark = time.time() - mark, time.time()
        # the pool: every estimator on the same groups
        rows = torch.arange(q * args.pool, (q + 1) * args.pool)
        sub = subset(pool, rows)
        m, r = sub.response_mask, token_rewards[rows, :sub.response.shape[1]]  # (M, T)
        with torch.no_grad():
            logp, spp, _ = (x.cpu() for x in rollout.score(model, sub.prompt_ids.to(device), sub.prompt_mask.to(device),
                                                           sub.response.to(device), m.to(device), cfg.temperature))
        timing["score"], mark = time.time() - mark, time.time()
        S, S_sq = response_scores(model, sub, cfg.temperature, project)  # S_i (M, D) or (M, k); ||S_i||^2 (M,)
        timing["S_i"] = time.time() - mark
        units = {}
        for N in args.group_sizes:
            groups = perm.view(-1, N)  # (K, N) disjoint groups
            gid = group_ids_of(groups, args.pool)
            adv = {e: advantages(e, r, m, gid, logp, spp, S_sq) for e in args.estimators}  # A_t, (M, T) each
            token = [e for e in args.estimators if not is_sequence_level(adv[e], m)]  # one backward pass per group
            grads = {e: group_gradients(model, sub, groups, adv[e], cfg.temperature, S=S, project=project)
                     for e in args.estimators if e not in token}  # through S_i, (K, D)
            clock = {}  # the token-level estimators share each group's forward pass
            grads.update(zip(token, token_group_gradients(model, sub, groups, [adv[e] for e in token],
                                                          cfg.temperature, project, clock)))
            timing.update({f"N{N}/forward": clock.get("forward", 0.0),
                           **{f"N{N}/backward/{e}": clock[k] for k, e in enumerate(token)}})
            for e in args.estimators:
                mean, var, K = scale_free.unit_summary(grads[e].double())  # (K, D) -> mean, tr Var, K
                units[(e, N)] = (mean.float(), var, K)  # float32 keeps 15 x P x D in memory
            if lesson is not None and N == 4 and not lesson.is_file():
                save_lesson(lesson, tok, sub, groups, adv, R[rows], p, n=task.horizon, seed=seed)
        responses = dict(length=m.sum(-1).double(), W_T=proxy_energy(logp, spp, m).double(), S_sq=S_sq,
                         PS_sq=S.double().square().sum(-1), perm=perm)  # per response of the pool, (M,)
        save_prompt(record_path(records, p), units, ref.float(), R[rows], R_ref[ref_rows], m.sum(-1).mean().item(),
                    time.time() - started, responses=responses, timing=timing)
        saved()
    done = [load_prompt(record_path(records, p)) for p in range(args.prompts)]
    return grams_of(done), info_of(done)


# =====================================================================================
# What a sweep of a pretrained model would cost on one GPU (a projection, not a measurement)
# =====================================================================================

DECODE_SECONDS = (0.019, 0.035)  # one eager decode step of a 30-layer model: its Python launches (docs/training.md)
PASS_LAUNCHES = 3  # a forward and backward pass launches about 3 decode steps' kernels
FLOPS = 30e12  # assumed float32 FLOP/s of the passes on an H100 (the sweep runs float32; peak about 67e12)
SEQUENCE_LEVEL = ("reinforce", "group_mean", "rloo", "grpo", "opo", "opo_loo",
                  *SEQUENCE_ENERGIES)  # advantages one number per response: through S_i


def projected_gpu_seconds(args, model, tok):
    """Seconds of one GPU for this sweep, low and high, from counts of what it runs (docs/variance.md):

        decode steps  = cells x 2 pools x ceil(P / sample_prompts) x L      (L: the response limit, an upper bound)
        passes        = cells x P x (M + 4 + E_tok x sum_N M / N)           (S_i, the reference's 4 parts, OTB's groups)
        pass FLOPs    = 8 D x positions of those passes (+ 2 D for the scoring forward of each pool)
        seconds       = decode steps x t_d + passes x 3 t_d + FLOPs / 30e12,   t_d = 19-35 ms

    E_tok: the token-level estimators (one backward pass per group); D: parameters; positions: prompt
    + L per row. Every input is returned with the result."""
    D = sum(p.numel() for p in model.parameters())
    cells, rows = [], 0
    for n in args.horizons:
        task = options.make_task(train.Config(task=args.task, horizon=n, model=args.model))
        prompts, _ = tasks.prompt_batch(task, tok, 10_000, 0, args.prompts)
        L, P = task.max_new_tokens(), max(map(len, prompts))
        calls = -(-args.prompts // (args.sample_prompts or args.prompts))
        e_tok = sum(e not in SEQUENCE_LEVEL for e in args.estimators)
        passes = args.prompts * (args.pool + 4 + e_tok * sum(args.pool // N for N in args.group_sizes))
        rows = args.prompts * (args.pool + args.ref_pool + e_tok * args.pool * len(args.group_sizes))
        flops = 8 * D * rows * (P + L) + 2 * D * args.prompts * args.pool * (P + L)
        cells.append(dict(n=n, response_limit=L, prompt_tokens=P, decode_steps=2 * calls * L, passes=passes,
                          flops=flops))
    seeds = len(args.seeds)
    total = {k: seeds * sum(c[k] for c in cells) for k in ("decode_steps", "passes", "flops")}
    seconds = [total["decode_steps"] * t + total["passes"] * PASS_LAUNCHES * t + total["flops"] / FLOPS
               for t in DECODE_SECONDS]
    return dict(seconds=seconds, parameters=D, seeds=seeds, per_horizon=cells, decode_seconds=list(DECODE_SECONDS),
                pass_launches=PASS_LAUNCHES, flops_per_second=FLOPS, **total)


def projection_line(g):
    """One line: the projected GPU time and its main counts."""
    lo, hi = g["seconds"]
    span = f"{lo:.0f}-{hi:.0f} s" if hi < 120 else f"{lo / 60:.0f}-{hi / 60:.0f} min"
    return (f"projected on one GPU (not measured): {span} "
            f"({g['decode_steps']:,} decode steps and {g['passes']:,} backward passes at 19-35 ms of launches "
            f"per decode step, {g['flops'] / 1e12:,.0f} TFLOP at 30 TFLOP/s; docs/variance.md)")


# =====================================================================================
# Analysis: prompts resampled within each seed, seeds as strata, a random-effects check (resampling.py, stats.py)
# =====================================================================================

def seed_evaluations(grams_by_cell, replicates=2000, boot_seed=0):
    """{(n, N): {seed: (point, boot, factors, j_gram)}}: every estimator at the point and on R draws of
    prompts (scale_free.evaluations), the same draws for all estimators of a checkpoint, independent
    draws for each checkpoint; boot_seed shifts every draw (0: the saved tables)."""
    out = {}
    for (n, seed), grams in sorted(grams_by_cell.items()):
        for N in sorted({N for _, N in grams}):
            units = {e: s for (e, NN), s in grams.items() if NN == N}
            factors = {e: scale_free.FACTORS[e](N) for e in units if e in scale_free.FACTORS}
            j_gram = scale_free.pooled_reference(units["reinforce"])  # eq. (8) of scale_free.py
            point, boot = scale_free.evaluations(units, factors, replicates, 1000 * n + seed + 100_003 * boot_seed,
                                                 j_gram)
            out.setdefault((n, N), {})[seed] = (units, point, boot, factors, j_gram)
    return out


def combined(evals, e, b, factors):
    """nvar(b) / nvar(e) over the seeds of one cell: the stratified pooled ratio (resampling.py eqs. (4)-(5)),
    each seed's own set, and DerSimonian-Laird over the seeds' log ratios (eq. (6))."""
    pooled = scale_free.gain(evals, e, b, factors)
    per_seed, per_seed_verdict, y, se = [], [], [], []
    for ev in evals:
        num, den, num_r, den_r = scale_free.gain_parts([ev], e, b, factors)
        per_seed.append(list(resampling.ratio_set(num, den, num_r, den_r, low=0.0)))
        per_seed_verdict.append(resampling.replicate_verdict(num_r, den_r))
        y.append(math.log(num / den) if num > 0 and den > 0 else math.nan)
        se.append(resampling.log_ratio_se(num_r, den_r))
    if all(x < 1e-6 for x in se):  # a ratio fixed by the known factors (rloo, up to float error)
        return dict(gain=list(pooled), verdict=scale_free.gain_verdict(evals, e, b, factors), per_seed=per_seed,
                    per_seed_verdict=per_seed_verdict, random_effects=dict(exact=True))
    re = stats.random_effects(y, se)
    ok = not math.isnan(re["mean"])
    return dict(gain=list(pooled), verdict=scale_free.gain_verdict(evals, e, b, factors), per_seed=per_seed,
                per_seed_verdict=per_seed_verdict, random_effects=dict(
        gain=[math.exp(re[k]) if ok else math.nan for k in ("mean", "lo", "hi")],
        Q=re["Q"], df=re["df"], p=re["p"], I2=re["I2"], tau2=re["tau2"]))


def pooled_direction(evals, e, factor, level=0.95):
    """alpha = sum <E g, r> / sum ||r||^2 (eq. (4) set) and the cosine sum <E g, r> / sqrt(sum ||E g||^2
    sum ||r||^2) (percentile, nan unless both sums are resolved) over the seeds' strata; exact where
    E g = c grad J is known. Values as estimated; the caller flags those outside the range."""
    if factor is not None:
        return [factor] * 3, [1.0] * 3
    total = {k: resampling.stratified([(pt[e][k].item(), bt[e][k]) for pt, bt in evals]) for k in ("dot", "ref_sq", "signal")}
    (dot, dot_r), (ref, ref_r), (sig, sig_r) = total["dot"], total["ref_sq"], total["signal"]
    alpha = list(resampling.ratio_set(dot, ref, dot_r, ref_r, level=level))
    if math.isinf(alpha[1]) or math.isinf(alpha[2]):  # ||grad J||^2 not resolved: no size to report
        alpha = [math.nan] * 3
    if any(resampling.covers_zero(*resampling.interval(x, level)) for x in (ref_r, sig_r)) or not (sig > 0 and ref > 0):
        return alpha, [math.nan] * 3
    reps = dot_r / (sig_r.clamp_min(1e-300) * ref_r.clamp_min(1e-300)).sqrt()
    return alpha, [dot / math.sqrt(sig * ref), *resampling.interval(reps[(sig_r > 0) & (ref_r > 0)], level)]


def analyse(grams_by_cell, replicates=2000, boot_seed=0, baseline="group_mean"):
    """Per (n, seed, estimator, N): every metric with its bootstrap interval over prompts (rows); per
    (estimator, N, n): the seeds combined (summary). Returns (rows, summary, evaluations)."""
    evaluations = seed_evaluations(grams_by_cell, replicates, boot_seed)
    rows, summary = [], []
    for (n, N), by_seed in sorted(evaluations.items()):
        for seed, (units, point, boot, factors, j_gram) in by_seed.items():
            out = scale_free.bootstrap(units, factors, baseline=baseline, j_gram=j_gram, evals=(point, boot))
            raw_b = units[baseline]["V"].mean().item()
            for e, metrics in out.items():
                rows.append(dict(n=n, seed=seed, estimator=e, N=N, factor=factors.get(e),
                                 raw_var_ratio=units[e]["V"].mean().item() / raw_b if raw_b else math.nan,
                                 **{k: v if isinstance(v, str) else list(v) for k, v in metrics.items()}))
        evals = [(pt, bt) for _, pt, bt, _, _ in by_seed.values()]
        factors = next(iter(by_seed.values()))[3]
        for e in evals[0][0]:
            alpha, cosine = pooled_direction(evals, e, factors.get(e))
            V = {x: sum(pt[x]["raw_variance"].item() for pt, _ in evals) for x in (e, baseline)}
            row = dict(estimator=e, N=N, n=n, seeds=len(evals), factor=factors.get(e), alpha=alpha, cosine=cosine,
                       raw_var_ratio=V[e] / V[baseline] if V[baseline] else math.nan)
            if e != baseline:
                row.update(combined(evals, e, baseline, factors))
            row["out_of_range"] = [k for k in ("cosine",) if resampling.clip(*row[k], *scale_free.RANGE[k])[3]]
            summary.append(row)
    summary.sort(key=lambda r: (r["n"], r["N"], r["estimator"]))
    return rows, summary, evaluations


def head_to_head(evaluations, a="otb_tir", b="otb"):
    """nvar(b) / nvar(a) per (n, N), seeds combined as the gains are (``combined``, no known factor).
    [] without both estimators."""
    out = []
    for (n, N), by_seed in sorted(evaluations.items()):
        evals = [(pt, bt) for _, pt, bt, _, _ in by_seed.values()]
        if a in evals[0][0] and b in evals[0][0]:
            out.append(dict(n=n, N=N, seeds=len(evals), **combined(evals, a, b, {})))
    return out


def horizon_contrasts(grams_by_cell, replicates=2000, baseline="group_mean", boot_seed=0):
    """Does a gain grow with the horizon? rho = gain(n_hi) / gain(n_lo) for every estimator, N and pair of
    horizons, with its 95% set (docs/smollm2_variance_protocol.md, the primary contrast).

    A seed's cells at different n share their prompts' draws (tasks.prompt_batch), so its prompts are
    resampled jointly: prompt p of n_lo and prompt p of n_hi enter each bootstrap draw together (the same
    weights w for both cells; valid whether or not the two cells are correlated). With each gain a ratio
    num / den over the seeds (scale_free.gain_parts),

        rho = (num_hi den_lo) / (den_hi num_lo)

    and its set is the test inversion of resampling.py eq. (4') on those joint draws. Pairs whose cells
    hold different numbers of prompts (an unfinished sweep) are left out; a gain with no sampling error at
    either horizon (rloo over the group mean: 1 by construction) is listed with ``fixed`` and no rho. Returns
    a list of dicts."""
    ns, seeds = sorted({n for n, _ in grams_by_cell}), sorted({s for _, s in grams_by_cell})
    evals = {}  # (n, seed, N) -> (point, boot); one draw of prompts per seed, shared by its horizons
    for (n, seed), grams in grams_by_cell.items():
        for N in sorted({N for _, N in grams}):
            units = {e: st for (e, NN), st in grams.items() if NN == N}
            factors = {e: scale_free.FACTORS[e](N) for e in units if e in scale_free.FACTORS}
            evals[(n, seed, N)] = (scale_free.evaluations(units, factors, replicates, 7 * seed + 100_003 * boot_seed + 1,
                                                          scale_free.pooled_reference(units["reinforce"])), factors)
    out = []
    for lo, hi in itertools.combinations(ns, 2):  # every pair of horizons
        if any((n, s) not in grams_by_cell for n in (lo, hi) for s in seeds):
            continue
        sizes = {next(iter(grams_by_cell[(n, s)].values()))["V"].shape[0] for n in (lo, hi) for s in seeds}
        if len(sizes) > 1:
            continue  # unequal prompts: no joint draws
        for N in sorted({N for (_, _, N) in evals}):
            factors = evals[(lo, seeds[0], N)][1]
            for e in evals[(lo, seeds[0], N)][0][0]:
                if e == baseline:
                    continue
                parts = {n: scale_free.gain_parts([evals[(n, s, N)][0] for s in seeds], e, baseline, factors)
                         for n in (lo, hi)}
                (nl, dl, nl_r, dl_r), (nh, dh, nh_r, dh_r) = parts[lo], parts[hi]
                a, b, a_r, b_r = nh * dl, dh * nl, nh_r * dl_r, dh_r * nl_r
                row = dict(estimator=e, N=N, n_lo=lo, n_hi=hi, seeds=len(seeds))
                if all(resampling.log_ratio_se(x_r, y_r) < 1e-6 for x_r, y_r in ((nl_r, dl_r), (nh_r, dh_r))):
                    out.append(dict(row, fixed=True))  # rloo's gain is N / (N - 1) x the group mean's / its factor: 1
                    continue
                out.append(dict(row, ratio=list(resampling.ratio_set(a, b, a_r, b_r, low=0.0)),
                                verdict=resampling.replicate_verdict(a_r, b_r)))
    return out


def verdicts(summary, versus):
    """Every verdict the tables print: each gain (seeds pooled, and each seed's) above 1, below, around
    it, or at the Monte Carlo edge (resampling.replicate_verdict)."""
    out = {}
    for s in summary:
        if "gain" in s:
            out[("gain", s["estimator"], s["N"], s["n"])] = s["verdict"]
            out.update({("seed", s["estimator"], s["N"], s["n"], i): v for i, v in enumerate(s["per_seed_verdict"])})
    for v in versus:
        out[("otb_tir/otb", v["N"], v["n"])] = v["verdict"]
        out.update({("otb_tir/otb seed", v["N"], v["n"], i): x for i, x in enumerate(v["per_seed_verdict"])})
    return out


def all_verdicts(grams_by_cell, replicates=2000, boot_seed=0, baseline="group_mean"):
    """``verdicts`` of the tables from the gains alone (what a test re-draws with other boot_seeds)."""
    evaluations, summary = seed_evaluations(grams_by_cell, replicates, boot_seed), []
    for (n, N), by_seed in sorted(evaluations.items()):
        evals, factors = [(pt, bt) for _, pt, bt, _, _ in by_seed.values()], next(iter(by_seed.values()))[3]
        summary += [dict(estimator=e, N=N, n=n, **combined(evals, e, baseline, factors))
                    for e in evals[0][0] if e != baseline]
    return verdicts(summary, head_to_head(evaluations))


def write(out, command, args, seconds, checkpoints, grams_by_cell, measured_on, provenance):
    """Analyse and write results.json, table.md, gain_vs_horizon.png (stats.npz is written by the
    caller). measured_on, provenance: the machine and the code (lab/machine.py) of the measurement, kept as
    they were by --from-saved (provenance: a list for sweeps measured side by side); seconds: its time, or
    a list of the times of sweeps measured side by side."""
    rows, summary, evaluations = analyse(grams_by_cell, args.replicates)
    versus = head_to_head(evaluations)
    contrasts = horizon_contrasts(grams_by_cell, args.replicates)
    (out / "results.json").write_text(json.dumps(dict(
        command=command, args=vars(args), machine=measured_on, provenance=provenance, seconds=seconds,
        checkpoints=checkpoints,
        sufficient_statistics="stats.npz", rows=rows, gains=summary, otb_tir_over_otb=versus,
        horizon_contrasts=contrasts,
        verdicts=[[*k, v] for k, v in verdicts(summary, versus).items()]), indent=1))
    seeds = sorted({s for _, s in grams_by_cell})
    sizes = {cell: next(iter(g.values()))["V"].shape[0] for cell, g in sorted(grams_by_cell.items())}
    prompts = (next(iter(sizes.values())) if len(set(sizes.values())) == 1 else
               "(" + ", ".join(f"n = {n}: {u}" for (n, _), u in sizes.items()) + ")")
    text = (f"# Normalised gradient variance against the horizon\n\n`{command}`  \n"
            f"{len(seeds)} seeds x {prompts} prompts x {args.pool} responses per checkpoint; measured in "
            f"{took(seconds)}{model_note(args)}. Seeds pooled: prompts resampled within each seed "
            f"({args.replicates} draws), "
            f"signal and noise summed over seeds, the ratio's 95% set by test inversion (resampling.py eqs. 4-5): "
            f"\u2265 where only the lower end is resolved, \"unresolved\" where neither is. Random effects: "
            f"DerSimonian-Laird over the seeds' log gains (eq. 6), with Cochran's Q (p) and I\u00b2; \"-\" "
            f"where a seed's gain is not resolved away from 0. alpha and cosine are exact where E g is known "
            f"(scale_free.FACTORS); * marks a number shown clipped to its range.\n\n" + table_md(summary)
            + "\n" + ("\n## Action-aligned against position-aligned OTB, paired\n\n" + head_to_head_md(versus)
                       + "\n" if versus else "")
            + ("\n## Does the gain grow with n? Prompts resampled jointly across n\n\n" + contrasts_md(contrasts)
               + "\n" if contrasts else "") + checkpoints_md(checkpoints))
    (out / "table.md").write_text(text)
    brief = summary_md(summary, contrasts, checkpoints, sizes, command)
    if brief:
        (out / "summary.md").write_text(brief)
    if set(decomposition.PRIMARY) <= set(getattr(args, "estimators", ())) and read_responses(out):
        decomposition.write(out, decomposition.analyse(out, args.replicates, seed_evals=evaluations))  # OTB taken apart
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    plt.close(plot(summary, out / "gain_vs_horizon.png", getattr(args, "task", "periodic")))
    print(text)
    print(f"wrote {out}/results.json, table.md, summary.md, gain_vs_horizon.png")
    return rows, summary


def from_saved(folders, out, replicates, seeds=None):
    """Re-analyse one saved sweep, or several measured side by side (same settings, different cells),
    into ``out``: their cells together (only those of ``seeds`` if given), their commands and times
    side by side, nothing measured. An unfinished sweep is analysed on the prompts it has recorded."""
    for f in folders:
        if progress_file(f).is_file() and Path(f).resolve() == out.resolve():
            raise SystemExit(f"--from-saved {f}: an unfinished sweep is analysed into another --out (its stats.npz "
                             "holds finished cells only, which --resume relies on)")
    loaded = [read_saved(f) for f in folders]
    saved = [s for s, _ in loaded]
    grams = {}
    for folder, (s, cells) in zip(folders, loaded):
        if settings(s, None) != settings(saved[0], None):
            raise SystemExit(f"--from-saved: {folder} was measured with other settings than {folders[0]} "
                             f"({settings(s, None)})")
        if grams.keys() & cells.keys():
            raise SystemExit(f"--from-saved: {folder} holds (n, seed) cells already read from another folder: "
                             f"{sorted(grams.keys() & cells.keys())}")
        grams.update(cells)
    if not grams:
        raise SystemExit(f"--from-saved: {','.join(map(str, folders))} holds no cell with 2 prompts measured yet")
    checkpoints = [c for s in saved for c in s["checkpoints"]]
    if seeds:
        missing = sorted(set(seeds) - {seed for _, seed in grams})
        if missing:
            raise SystemExit(f"--seeds: {missing} not in {','.join(map(str, folders))}")
        grams = {cell: g for cell, g in grams.items() if cell[1] in seeds}
        checkpoints = [c for c in checkpoints if c["seed"] in seeds]
    out.mkdir(parents=True, exist_ok=True)
    unfinished = any(progress_file(f).is_file() for f in folders)
    if len(folders) > 1 or seeds or unfinished or out.resolve() != Path(folders[0]).resolve():
        save_grams(out / "stats.npz", grams)
        responses = {cell: r for f in folders for cell, r in read_responses(f).items() if cell in grams}
        if responses:
            write_responses(out, responses)  # the per-response numbers of the cells analysed
    args = {**saved[0]["args"], "replicates": replicates}
    if len(saved) > 1 or seeds or unfinished:
        args.update(seeds=sorted({seed for _, seed in grams}), horizons=sorted({n for n, _ in grams}))
    times = [t for s in saved for t in (s["seconds"] if isinstance(s["seconds"], list) else [s["seconds"]])]
    return write(out, " ; ".join(s["command"] for s in saved) + ("  # unfinished" if unfinished else ""),
                 argparse.Namespace(**args),
                 saved[0]["seconds"] if len(saved) == 1 else times,  # a folder of folders: every one's time
                 checkpoints, grams, saved[0].get("machine"),  # the measurement's
                 kept_provenance(saved[0]) if len(saved) == 1 else [kept_provenance(s) for s in saved])


def main(argv=None):
    args = parse_args(argv)
    command = ("python benchmarks/horizon_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    out = Path(args.out)
    if args.from_saved:  # re-bootstrap saved sweeps: nothing is measured
        return from_saved(args.from_saved.split(","), out, args.replicates, args.only_seeds)
    out.mkdir(parents=True, exist_ok=True)
    grams_by_cell, checkpoints, before, earlier = {}, [], 0.0, []
    provenance = code_provenance()  # the commit this process measures with
    if args.resume:
        grams_by_cell, checkpoints, before, earlier = resumed(out, args)
        provenance = earlier[0] if earlier == [provenance] else earlier + [provenance]  # every commit it ran under
    for folder in (out / "prompts").glob("n*_seed*"):
        n, seed = cell_of(folder.name)
        if (n, seed) in grams_by_cell:  # finished: its records are in stats.npz already
            shutil.rmtree(folder)
    t0 = time.time()

    def record():  # what --resume continues from
        tmp = progress_file(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(command=command, args=vars(args), machine=machine.info(), provenance=provenance,
                                       seconds=before + time.time() - t0, checkpoints=checkpoints), indent=1))
        tmp.replace(progress_file(out))

    def measured():  # after every prompt and cell: the record, then a stop if --stop-after has passed
        record()
        if args.stop_after and time.time() - t0 > args.stop_after:
            raise OutOfTime
    record()
    try:
        return measure_cells(out, command, args, grams_by_cell, checkpoints, before, t0, provenance, measured)
    except OutOfTime:
        print(f"--stop-after {args.stop_after:g}: stopped after {time.time() - t0:.0f} s; every measured prompt is "
              f"recorded in {out}: continue with --resume, or analyse with --from-saved {out} --out DIR", flush=True)
        if (out / "stats.npz").is_file() or recorded_cells(out):
            from_saved([out], out / "interim", args.replicates)
        return None


def measure_cells(out, command, args, grams_by_cell, checkpoints, before, t0, provenance, record):
    """Measure every (n, seed) cell not yet in ``grams_by_cell``, saving as it goes; write the tables."""
    todo = [(n, seed) for seed in args.seeds for n in args.horizons if (n, seed) not in grams_by_cell]
    for i, (n, seed) in enumerate(todo):  # seed by seed: a partial sweep has every n
        model, tok, task, cfg, source = checkpoint(n, seed, args)
        if i == 0 and args.model != "tiny":  # before anything is measured: what it would cost on one GPU
            args.gpu_projection = projected_gpu_seconds(args, model, tok)
            print(projection_line(args.gpu_projection), flush=True)
        records = out / "prompts" / f"n{n}_seed{seed}"
        grams_by_cell[(n, seed)], info = measure_checkpoint(model, tok, task, cfg, args, seed, records, record,
                                                            lesson=out / f"lesson_n{n}_seed{seed}.json")
        warmup = Path(source["path"]) / "warmup.json"  # the tiny model's; a pretrained one has none
        warm = json.loads(warmup.read_text())["history"] if warmup.is_file() else None
        checkpoints.append(dict(n=n, seed=seed, model=source["path"], **info,
                                **(dict(warmup_success=warm[-1][1] if warm else None) if warmup.is_file() else {})))
        print(f"n={n} seed={seed}: pool success {info['success']:.2f}, mean length "
              f"{info['mean_length']:.1f}", flush=True)
        save_grams(out / "stats.npz", grams_by_cell)  # after every checkpoint: nothing measured is lost,
        grams_by_cell = load_grams(out / "stats.npz")  # and the tables are made from what is saved
        save_responses(out, (n, seed), [load_prompt(record_path(records, p)) for p in range(args.prompts)])
        shutil.rmtree(records)  # its prompts are in stats.npz and responses.npz now
        record()
        if i + 1 < len(todo):  # and a table of the finished cells
            write(out, command + "  # partial", args, before + time.time() - t0, checkpoints, grams_by_cell,
                  machine.info(), provenance)
    result = write(out, command, args, before + time.time() - t0, checkpoints, grams_by_cell, machine.info(),
                   provenance)
    progress_file(out).unlink()
    if (out / "prompts").is_dir() and not any((out / "prompts").iterdir()):
        (out / "prompts").rmdir()
    return result


if __name__ == "__main__":
    main()
