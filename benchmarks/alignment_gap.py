"""How far apart are OTB's two alignments on a tool task? Advantages by position (otb) and by action (otb_tir).

At fixed warmed-up weights (the tiny model's cached warm-up, as horizon_sweep.py uses), sample
``--pool`` responses to each of ``--prompts`` prompts, split them into groups of N, and compute both
estimators' advantages on the same tokens. Per prompt (the bootstrap's unit) three numbers:

    alone_position  share of the actions that are the only active row of their group at their position t
                    (their otb baseline is their own return, their advantage 0 without zero tail)
    alone_action    the same at their action index k (otb_tir)
    gap             sum |A_otb - A_otb_tir| / sum |A_otb_tir| over the actions: how much of the advantage
                    signal the alignment changes

Each is reported as a mean over prompts with a 95% t interval over prompts. Sampling and one
scoring pass only, no backward passes: minutes on a CPU.

    python benchmarks/alignment_gap.py --task factors --horizon 3 --seed 0
    python benchmarks/alignment_gap.py --task calculator --horizon 3 --seed 0 --out runs/gap_calculator
"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import rollout  # noqa: E402
from lab.analysis import stats  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from lab import options  # noqa: E402
from benchmarks import cli  # noqa: E402
from benchmarks.common import draw_pool, subset  # noqa: E402
from lab import machine  # noqa: E402


def alone(m, gid):
    """Per action, is it the only active row of its group at its column? (B, T) bool on m's actions."""
    n_groups = int(gid.max()) + 1
    active = torch.zeros(n_groups, m.shape[1]).index_add_(0, gid, m)[gid]  # rows active per group and column
    return (active == 1) & m.bool()


def measure(model, tok, task, cfg, prompts, answers, pool, N, seed):
    """Per prompt: (alone_position, alone_action, gap) as three lists."""
    ro, (R, token_rewards, _) = draw_pool(model, tok, task, prompts, answers, pool, seed,
                                          tasks.response_limit(task, cfg.max_new_tokens), cfg.temperature)
    out = {"alone_position": [], "alone_action": [], "gap": []}
    for p in range(len(prompts)):
        rows = torch.arange(p * pool, (p + 1) * pool)
        sub = subset(ro, rows)
        m, r = sub.response_mask, token_rewards[rows, :sub.response.shape[1]]  # (M, T)
        with torch.no_grad():
            logp, spp, _ = rollout.score(model, sub.prompt_ids, sub.prompt_mask, sub.response, m, cfg.temperature)
        gid = torch.arange(pool) // N  # consecutive groups of N (the draws are i.i.d.)
        kw = dict(token_rewards=r, response_mask=m, group_index=gid, log_probs=logp, sum_pi_sq=spp)
        A_pos, _ = otb.ESTIMATORS["otb"](**kw)
        A_act, _ = otb.ESTIMATORS["otb_tir"](**kw)
        at_k = torch.argsort(m == 0, dim=-1, stable=True)  # where the k-th action sits
        actions = m.sum()
        out["alone_position"].append((alone(m, gid).sum() / actions).item())
        out["alone_action"].append((alone(m.gather(-1, at_k), gid).sum() / actions).item())
        out["gap"].append(((A_pos - A_act).abs().sum() / A_act.abs().sum().clamp(min=1e-12)).item())
    return out, dict(success=R.mean().item(), tool_tokens=ro.tool_tokens.float().mean().item())


def main(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("--task", default="factors", choices=("calculator", "factors"), help="the tool task")
    p.add_argument("--horizon", type=cli.at_least(2), default=3, help="k, numbers added with k - 1 calls")
    p.add_argument("--seed", type=int, default=0, help="the warm-up's seed (its cached checkpoint)")
    p.add_argument("--group-size", type=cli.at_least(2), default=4, help="N")
    p.add_argument("--prompts", type=cli.at_least(2), default=32, help="prompts (the bootstrap's units)")
    p.add_argument("--pool", type=cli.at_least(2), default=16, help="responses per prompt, a multiple of N")
    p.add_argument("--warmup-target", type=float, default=0.15, help="the warm-up stops at this sampled success")
    p.add_argument("--cache", default=str(ROOT / "runs"), help="folder of train.py's warm-up cache")
    p.add_argument("--out", type=cli.out_folder, default=None, help="folder for gap.json (not written without it)")
    a = p.parse_args(argv)
    if a.pool % a.group_size:
        p.error(f"--pool {a.pool} must be a multiple of --group-size {a.group_size}")
    cfg = train.Config(task=a.task, horizon=a.horizon, seed=a.seed, warmup_target=a.warmup_target, out=a.cache)
    model, tok, source = options.load(cfg, torch.device("cpu"))
    task = options.make_task(cfg)
    prompts, answers = tasks.prompt_batch(task, tok, 20_000 + a.seed, 0, a.prompts)  # unseen by RL and the sweep
    per_prompt, info = measure(model, tok, task, cfg, prompts, answers, a.pool, a.group_size, a.seed)
    result = dict(command=cli.command("alignment_gap.py", argv), args=vars(a), machine=machine.info(),
                  model=source["path"], **info, **{k: list(stats.mean_interval(v)) for k, v in per_prompt.items()},
                  per_prompt=per_prompt)
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}, indent=1))
    if a.out:
        cli.write_json(a.out, "gap.json", result)
    return result


if __name__ == "__main__":
    main()
