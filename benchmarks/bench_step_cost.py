"""How much slower is a training step with OTB than with a group baseline? (docs/cost.md)

Times ``train.train_step`` on identical batches in one process (model and optimizer restored to one
snapshot before every timed step; variants alternate; logging not timed): ``group_mean`` with
``otb.sum_pi_squared`` stubbed out (the ratio's baseline), ``otb``, and ``group_mean+spp`` (sum pi^2
computed, then unused). Goal: OTB at most 3% slower. Models: ``tiny`` (train.py's cached model) and
``v49k`` (random Llama, SmolLM2's width and vocabulary, 2 layers, character tokenizer: rewards 0).

    OMP_NUM_THREADS=1 python benchmarks/bench_step_cost.py   # both models, ~3 min, writes runs/cost/
"""
import copy
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from benchmarks.common import load_model, smollm2_shaped, sum_pi_squared  # noqa: E402
from lab import machine  # noqa: E402
from benchmarks.common import interleaved_rounds  # noqa: E402
from benchmarks import cli  # noqa: E402
from benchmarks.cli import RUNS, at_least, choice_list, out_folder, parser  # noqa: E402

VARIANTS = {"group_mean": ("group_mean", False), "otb": ("otb", True), "group_mean+spp": ("group_mean", True)}


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--models", type=choice_list(["tiny", "v49k"]), default="tiny,v49k",
                   help="comma-separated models to time: tiny, v49k")
    p.add_argument("--steps", type=at_least(1), default=6, help="timed steps per variant (median reported)")
    p.add_argument("--group-size", type=at_least(2), default=4, help="N")
    p.add_argument("--out", type=out_folder, default=str(RUNS / "cost"),
                   help="results folder (bench_step_cost.md/.json); the saved results are in "
                        "benchmarks/results/cost, rewritten only when named here")
    return p.parse_args(argv)


def build(name):
    """(model, tokenizer, prompts per step, response limit): the default run's; 8 x 32 tokens at V = 49152."""
    if name == "tiny":
        model, tok, _ = load_model()
        return model, tok, 16, 18
    from lab.models import char_tokenizer
    return smollm2_shaped(layers=2), char_tokenizer(), 8, 32


def step(model, opt, tok, cfg, task, estimator, spp_on, s):
    """One train.train_step, sum pi^2 stubbed out unless spp_on. Returns its number of tokens."""
    with sum_pi_squared("with" if spp_on else "without"):
        out = train.train_step(cfg, model, model, opt, task, tok, otb.ESTIMATORS[estimator], s)
    return int(out.ro.response_mask.sum())


def time_model(name, args):
    model, tok, prompts, limit = build(name)
    cfg = train.Config(prompts_per_step=prompts, group_size=args.group_size, max_new_tokens=limit)
    task = tasks.ReverseTask()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    snap = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))

    def restore():  # before every step, untimed: every variant steps from the same weights and state
        model.load_state_dict(snap[0])
        opt.load_state_dict(snap[1])
    variants = [lambda s, v=v: step(model, opt, tok, cfg, task, *VARIANTS[v], s) for v in VARIANTS]
    # step 0 warms up; the order of the variants rotates every step; keep: each step's token count
    seconds, n_tok = interleaved_rounds(variants, args.steps, rotate=True, setup=restore, desc=name,
                                        keep=True)
    assert len({tuple(t) for t in n_tok}) == 1, "variants did not see identical batches"
    med = {v: statistics.median(t[1:]) for v, t in zip(VARIANTS, seconds)}
    tokens = n_tok[0][1:]  # the same for every variant (checked above)
    row = dict(model=name, vocab=model.config.vocab_size, params=sum(p.numel() for p in model.parameters()),
               prompts_per_step=prompts, group_size=args.group_size, max_new_tokens=limit,
               mean_tokens=sum(tokens) / len(tokens), median_step_s=med,
               ratio_otb_vs_group_mean=med["otb"] / med["group_mean"],
               ratio_group_mean_spp_vs_group_mean=med["group_mean+spp"] / med["group_mean"])
    row["meets_goal"] = row["ratio_otb_vs_group_mean"] <= 1.03
    return row


def main(argv=None):
    args = parse_args(argv)
    info = machine.info()
    print(info)
    rows = [time_model(name, args) for name in args.models]
    cmd = cli.command("bench_step_cost.py", argv)
    lines = ["# Time per training step: OTB vs group_mean (same process, identical batches)\n", f"`{cmd}`  ",
             f"{machine.describe_info(info)}; median of {args.steps} steps per variant\n",
             "| model | V | prompts x N | group_mean (s) | otb (s) | group_mean+spp (s) | otb / group_mean | goal <= 1.03 |",
             "|" + "---|" * 8]
    lines += [f"| {r['model']} | {r['vocab']} | {r['prompts_per_step']} x {r['group_size']} | "
              f"{r['median_step_s']['group_mean']:.3f} | {r['median_step_s']['otb']:.3f} | "
              f"{r['median_step_s']['group_mean+spp']:.3f} | {r['ratio_otb_vs_group_mean']:.3f} | "
              f"{'met' if r['meets_goal'] else 'not met'} |" for r in rows]
    cli.write_results(args.out, "bench_step_cost", dict(command=cmd, machine=info, steps=args.steps, results=rows),
                      "\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
