"""Where the variance sweep's time goes on SmolLM2, and its rate against a plain forward and backward pass
of the same shape (docs/cost.md, "The variance sweep on a CPU").

One prompt of benchmarks/horizon_sweep.py's work at horizon n (a pool of M responses and a reference pool
of M, gradients projected to k numbers), each part timed on its own, the parts interleaved over rounds
(common.interleaved_rounds: a change in a shared machine's load hits all of them alike):

- ``reference``: the reference pool's 4 backward passes (RLOO in 4 sub-pools), projected;
- ``score``: the pool's scoring forward (log pi and sum pi^2, no graph);
- ``scores_S``: M backward passes of one response each (S_i), projected;
- ``otb_N4``, ``otb_N16``: OTB's one backward pass per group, projected;
- ``plain``: a forward and backward pass of 16 rows of the pool's padded length, the gradient not read;
- ``project``: one projection of a gradient (common.sketch, a scatter-add into k buckets), and
  ``project_gather``: the same P computed by reading the gradient through the permutation (a gather),
  the way it was computed before.

FLOPs of a pass: 6 D per position of a forward and backward, 2 D of a forward (D parameters; positions
as run, padding included), so a part's GFLOP/s against ``plain``'s says what its overheads cost (batches of
one row, the projection), not what padding costs. Sampling is timed once (not interleaved).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_sweep_cost.py --out benchmarks/results/cost  # ~6 min
    python benchmarks/bench_sweep_cost.py --model FOLDER --pool 8 --project 64 --repeats 1   # a tiny check
"""
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
import tasks  # noqa: E402
import train  # noqa: E402
from lab import machine, options  # noqa: E402
from benchmarks.cli import RUNS, at_least, out_folder, parser  # noqa: E402
from benchmarks.common import (draw_pool, flatten, group_gradients, interleaved_rounds, per_response_scores,  # noqa: E402
                               reference_gradient, sketch, subset)


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--model", default="smollm2", help="smollm2, a model folder or a hub id (as train.py's --model)")
    p.add_argument("--horizon", type=at_least(1), default=10, help="n of the count task")
    p.add_argument("--pool", type=at_least(4), default=32, help="M, responses in the pool and in the reference pool")
    p.add_argument("--project", type=at_least(2), default=4096, help="k of the projection")
    p.add_argument("--repeats", type=at_least(1), default=2, help="timed rounds after the warm-up round")
    p.add_argument("--out", type=out_folder, default=str(RUNS / "cost"),
                   help="folder for bench_sweep_cost.json and .md (benchmarks/results/cost: the saved ones)")
    return p.parse_args(argv)


def gather_projection(model, k, seed=0):
    """common.sketch's P computed by reading g through the permutation: (P g)_j = sum over bucket j of
    s_i g_i, the buckets a permutation cut into k parts. The same numbers, a gather of D scattered values."""
    params = [p for p in model.parameters() if p.requires_grad]
    D = sum(p.numel() for p in params)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(D, generator=gen)
    sign = (torch.randint(0, 2, (D,), generator=gen) * 2 - 1).float()
    width = -(-D // k)
    return lambda grads: torch.nn.functional.pad(flatten(grads)[perm] * sign, (0, k * width - D)).view(k, width).sum(1)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    cfg = train.Config(task="count", horizon=args.horizon, model=args.model, temperature=0.7)
    model, tok, _ = options.load(cfg, torch.device("cpu"))
    model.eval()
    D = sum(p.numel() for p in model.parameters())
    task = options.make_task(cfg)
    prompts, answers = tasks.prompt_batch(task, tok, 10_000, 0, 1)
    t0 = time.perf_counter()
    pool, (_, rewards, _) = draw_pool(model, tok, task, prompts, answers, args.pool, 0, task.max_new_tokens(), 0.7)
    sample_seconds = time.perf_counter() - t0
    ref, (_, ref_rewards, _) = draw_pool(model, tok, task, prompts, answers, args.pool, 7919, task.max_new_tokens(), 0.7)
    sub, ref_sub = subset(pool, torch.arange(args.pool)), subset(ref, torch.arange(args.pool))
    m, r = sub.response_mask, rewards[:, :sub.response.shape[1]]  # (M, T)
    P, T, T_ref = sub.prompt_ids.shape[1], m.shape[1], ref_sub.response.shape[1]
    project, gather = sketch(model, args.project), gather_projection(model, args.project)
    with torch.no_grad():
        logp, spp, _ = rollout.score(model, sub.prompt_ids, sub.prompt_mask, sub.response, m, 0.7)
    S = per_response_scores(model, sub, 0.7, project)
    params = [p for p in model.parameters()]
    grads = [torch.randn_like(p) for p in params]
    plain_rows = min(16, args.pool)

    def otb_groups(N):
        groups = torch.arange(args.pool).view(-1, N)
        gid = torch.arange(args.pool) // N
        adv, _ = otb.ESTIMATORS["otb"](token_rewards=r, response_mask=m, group_index=gid, log_probs=logp, sum_pi_sq=spp)
        return lambda _: group_gradients(model, sub, groups, adv, 0.7, S=S, project=project)

    def plain(_):
        lp, _, _ = rollout.score(model, sub.prompt_ids[:plain_rows], sub.prompt_mask[:plain_rows],
                                 sub.response[:plain_rows], m[:plain_rows], 0.7)
        torch.autograd.grad(lp.sum(), params)

    def score(_):
        with torch.no_grad():
            rollout.score(model, sub.prompt_ids, sub.prompt_mask, sub.response, m, 0.7)
    lengths = m.sum(-1)  # valid tokens of each row, (M,)
    last = lambda rows: int(lengths[rows].max())  # noqa: E731  the padded length of a pass over ``rows``
    quarters = torch.arange(args.pool).view(4, -1)
    parts = {  # name: (fn, FLOPs as run)
        "reference": (lambda _: reference_gradient(model, ref, ref_rewards, torch.arange(args.pool), 0.7, project=project),
                      6 * D * sum(len(q) * (P + int(ref_sub.response_mask[q].sum(-1).max())) for q in quarters)),
        "score": (score, 2 * D * args.pool * (P + T)),
        "scores_S": (lambda _: per_response_scores(model, sub, 0.7, project),
                     6 * D * sum(P + last([i]) for i in range(args.pool))),
        **{f"otb_N{N}": (otb_groups(N), 6 * D * sum(N * (P + last(g)) for g in torch.arange(args.pool).view(-1, N)))
           for N in (4, 16) if args.pool % N == 0 and args.pool // N >= 2},  # the sweep's group sizes that fit M
        "plain": (plain, 6 * D * plain_rows * (P + T)),
        "project": (lambda _: project(grads), 0),
        "project_gather": (lambda _: gather(grads), 0),
    }
    seconds, _ = interleaved_rounds([fn for fn, _ in parts.values()], args.repeats, desc="rounds")
    median = {name: statistics.median(s[1:]) for name, s in zip(parts, seconds)}
    rate = {name: flops / median[name] / 1e9 for name, (_, flops) in parts.items() if flops}
    rows = {name: dict(seconds=median[name], all_seconds=s, gflop=parts[name][1] / 1e9,
                       gflop_per_s=rate.get(name), of_plain=rate[name] / rate["plain"] if name in rate else None)
            for name, s in zip(parts, seconds)}
    sweep = [n for n in parts if n not in ("plain", "project", "project_gather")]
    total = dict(seconds=sum(median[n] for n in sweep), gflop=sum(parts[n][1] for n in sweep) / 1e9)
    total.update(gflop_per_s=total["gflop"] / total["seconds"], of_plain=total["gflop"] / total["seconds"] / rate["plain"])
    result = dict(command="python benchmarks/bench_sweep_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  machine=machine.info(), parameters=D, prompt_tokens=P, response_positions=T, pool=args.pool,
                  k=args.project, sample_seconds_one_pool=sample_seconds, parts=rows, one_prompt_without_sampling=total)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_sweep_cost.json").write_text(json.dumps(result, indent=1))
    lines = [f"`{result['command']}`  \n{machine.describe_info(result['machine'])}; D = {D:,}; prompt {P} tokens, "
             f"responses padded to {T}; M = {args.pool}; k = {args.project}; medians of {args.repeats} rounds "
             "after a warm-up, parts interleaved.\n", "| part | seconds | GFLOP | GFLOP/s | of plain's rate |",
             "|---|---|---|---|---|"]
    for name, row in {**rows, "one prompt (the sweep's parts)": total}.items():
        g = row.get("gflop_per_s")
        lines.append(f"| {name} | {row['seconds']:.2f} | {row['gflop']:.0f} | {g:.1f} | {row['of_plain']:.2f} |"
                     if g else f"| {name} | {row['seconds']:.3f} | - | - | - |")
    (out / "bench_sweep_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
