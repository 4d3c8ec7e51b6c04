"""How much slower is a training step with OTB than with a group baseline?

A training step (train.py) is: sample N responses per prompt, score them (log pi, sum pi^2,
entropy), compute advantages, update (a second scoring pass with gradients, backward, AdamW).
OTB's extra work is sum_k pi_k^2 in the scoring passes and the ``otb.optimal_token_baseline``
call; everything else is shared. Variants, all on identical batches:

- ``group_mean``: Dr.GRPO with ``otb.sum_pi_squared`` stubbed out (what a group-baseline trainer
  has to compute); the baseline of the ratio.
- ``otb``: OTB with the real sum pi^2.
- ``group_mean+spp``: Dr.GRPO as train.py runs it today (sum pi^2 computed, then unused).

Fairness: one process; before every timed step the model and optimizer are restored to the same
snapshot, so each variant samples the same responses (same prompts, same sampler seed) and
updates from the same weights; variants alternate in order. The logged diagnostics (gradient
power, the proxy of ||mean g||^2) are left out: they are logging, not the step. Goal: OTB at most
3% slower than group_mean.

Models: ``tiny`` (the warmed-up tiny model train.py caches, vocabulary 49, the CPU default run)
and ``v49k`` (random Llama, V = 49152, hidden 576, 2 layers, SmolLM2's width and vocabulary; with
the character tokenizer for the rewards, so rewards are 0; the step's cost does not depend on them).

    OMP_NUM_THREADS=1 python benchmarks/bench_step_cost.py              # both models, ~3 min, writes runs/cost/
"""
import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
from benchmarks.bench_decode import smollm2_shaped  # noqa: E402
from benchmarks.bench_score import REAL_SUM_PI_SQUARED, stub_sum_pi_squared  # noqa: E402
from benchmarks.grad_variance import find_cached_tiny, load_model  # noqa: E402
from benchmarks.machine import machine  # noqa: E402
from benchmarks.cli import RUNS, at_least, choice_list, out_folder  # noqa: E402

VARIANTS = {"group_mean": ("group_mean", False), "otb": ("otb", True), "group_mean+spp": ("group_mean", True)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", type=choice_list(["tiny", "v49k"]), default="tiny,v49k",
                   help="comma-separated models to time: tiny, v49k")
    p.add_argument("--steps", type=at_least(1), default=6, help="timed steps per variant (median reported)")
    p.add_argument("--prompts-per-step", type=at_least(0), default=0, help="0: 16 (tiny), 8 (v49k)")
    p.add_argument("--group-size", type=at_least(2), default=4, help="N")
    p.add_argument("--max-new-tokens", type=at_least(0), default=0, help="0: 18 (tiny, reversal), 32 (v49k)")
    p.add_argument("--out", type=out_folder, default=str(RUNS / "cost"),
                   help="results folder (bench_step_cost.md/.json); the saved results are in "
                        "benchmarks/results/cost, rewritten only when named here")
    return p.parse_args(argv)


def build(name, tiny_dir=None):
    if name == "tiny":
        model, tok = load_model(tiny_dir or find_cached_tiny())
        return model, tok, 16, 18
    from models import char_tokenizer
    return smollm2_shaped(layers=2), char_tokenizer(), 8, 32


def step(model, opt, tok, cfg, task, estimator, spp_on, s, limit):
    """One train.py step (rollout, score, advantages, update), without the logging."""
    otb.sum_pi_squared = REAL_SUM_PI_SQUARED if spp_on else stub_sum_pi_squared
    prompts, answers = rollout.prompt_batch(task, tok, cfg.seed, s, cfg.prompts_per_step)
    gen = torch.Generator().manual_seed(rollout.step_seed(cfg.seed, s))
    ro = rollout.sample(model, prompts, group_size=cfg.group_size, max_new_tokens=limit,
                        temperature=cfg.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        generator=gen)
    R, token_rewards, _ = rollout.rewards(task, tok, ro, answers, cfg.group_size)
    m = ro.response_mask
    with torch.no_grad():
        old_logp, sum_pi_sq, _ = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response, m,
                                               cfg.temperature, cfg.chunk_size or None)
    adv, _ = otb.ESTIMATORS[estimator](token_rewards=token_rewards, response_mask=m, group_index=ro.group_index,
                                       log_probs=old_logp, sum_pi_sq=sum_pi_sq)
    train.update(model, opt, cfg, ro, old_logp, adv, gen)
    otb.sum_pi_squared = REAL_SUM_PI_SQUARED
    return int(m.sum())


def time_model(name, args, tiny_dir=None):
    model, tok, prompts, limit = build(name, tiny_dir)
    prompts = args.prompts_per_step or prompts
    limit = args.max_new_tokens or limit
    cfg = train.Config(prompts_per_step=prompts, group_size=args.group_size)
    task = rollout.ReverseTask()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    snap = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
    names = list(VARIANTS)
    times, tokens = {v: [] for v in names}, {v: [] for v in names}
    for s in range(args.steps + 1):  # step 0 warms up and is dropped
        order = names[s % len(names):] + names[:s % len(names)]  # rotate the order every step
        for v in order:
            model.load_state_dict(snap[0])
            opt.load_state_dict(snap[1])
            t0 = time.perf_counter()
            n_tok = step(model, opt, tok, cfg, task, *VARIANTS[v], s, limit)
            if s:
                times[v].append(time.perf_counter() - t0)
                tokens[v].append(n_tok)
    assert len({tuple(t) for t in tokens.values()}) == 1, "variants did not see identical batches"
    med = {v: statistics.median(times[v]) for v in names}
    row = dict(model=name, vocab=model.config.vocab_size, params=sum(p.numel() for p in model.parameters()),
               prompts_per_step=prompts, group_size=args.group_size, max_new_tokens=limit,
               mean_tokens=sum(tokens["otb"]) / len(tokens["otb"]), median_step_s=med,
               ratio_otb_vs_group_mean=med["otb"] / med["group_mean"],
               ratio_group_mean_spp_vs_group_mean=med["group_mean+spp"] / med["group_mean"])
    row["meets_goal"] = row["ratio_otb_vs_group_mean"] <= 1.03
    print(f"{name}: median step group_mean {med['group_mean']:.3f} s, otb {med['otb']:.3f} s, "
          f"group_mean+spp {med['group_mean+spp']:.3f} s -> otb / group_mean = x{row['ratio_otb_vs_group_mean']:.3f} "
          f"(goal <= x1.03: {'met' if row['meets_goal'] else 'NOT met'})", flush=True)
    return row


def main(argv=None):
    args = parse_args(argv)
    models = args.models.split(",")
    tiny_dir = find_cached_tiny() if "tiny" in models else None  # a missing cache stops us before any timing
    info = machine()
    print(info)
    rows = [time_model(name, args, tiny_dir) for name in models]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_step_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "bench_step_cost.json").write_text(json.dumps(dict(command=command.strip(), machine=info,
                                                              steps=args.steps, results=rows), indent=1))
    lines = ["# Time per training step: OTB vs group_mean (same process, identical batches)\n",
             f"`{command.strip()}`  ", f"{info['cpu']}, {info['torch_threads']} thread(s), torch {info['torch']}; "
             f"median of {args.steps} steps per variant\n",
             "| model | V | prompts x N | group_mean (s) | otb (s) | group_mean+spp (s) | otb / group_mean | goal <= 1.03 |",
             "|" + "---|" * 8]
    lines += [f"| {r['model']} | {r['vocab']} | {r['prompts_per_step']} x {r['group_size']} | "
              f"{r['median_step_s']['group_mean']:.3f} | {r['median_step_s']['otb']:.3f} | "
              f"{r['median_step_s']['group_mean+spp']:.3f} | {r['ratio_otb_vs_group_mean']:.3f} | "
              f"{'met' if r['meets_goal'] else 'not met'} |" for r in rows]
    (out / "bench_step_cost.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'bench_step_cost.md'} and .json")
    return rows


if __name__ == "__main__":
    main()
