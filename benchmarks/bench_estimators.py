"""How fast is the vectorised Optimal Token Baseline? (docs/cost.md)

Times ``otb.optimal_token_baseline`` on a grid of shapes (random lengths, interleaved groups, from
train.py's 64 x 18 up to 4M tokens) against a loop over the groups (``per_group_loop``, the shape
of the widely used implementation) and a floor (one
reverse cumulative sum over (B, T), the pass G_t alone needs); checks that OTB and the loop agree,
then prints the medians of interleaved rounds and both ratios. Nothing here is a goal.

    OMP_NUM_THREADS=1 python benchmarks/bench_estimators.py            # the full grid, CPU
    python benchmarks/bench_estimators.py --shapes 64x128:4 512x32:4 --repeats 2   # a smoke run
    python benchmarks/bench_estimators.py --shapes 8192x256:4 --repeats 9 --device cuda
"""
import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import otb  # noqa: E402
from lab import machine  # noqa: E402
from benchmarks.common import interleaved_rounds  # noqa: E402
from benchmarks.cli import at_least, command, device_option, parser, pick_device  # noqa: E402

# rows x tokens : group size
GRID = ["64x18:4", "128x68:16", "2048x512:2", "8192x256:4", "1024x4096:4", "4096x1024:8"]


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--device", default="auto", type=device_option,
                   help="where to run; auto picks cuda when available, else cpu")
    p.add_argument("--repeats", type=at_least(1), default=5, help="timed calls per measurement (median reported)")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(t) for t in GRID],
                   metavar="ROWSxTOKENS:GROUP", help="shapes to run, e.g. 8192x256:4")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    return p.parse_args(argv)


def parse_shape(text):
    """'ROWSxTOKENS:GROUP' -> (rows, tokens, group), each a positive integer."""
    match = re.fullmatch(r"(\d+)[xX](\d+):(\d+)", text)
    if not match or min(map(int, match.groups())) < 1:
        raise argparse.ArgumentTypeError(f"must look like ROWSxTOKENS:GROUP, e.g. 8192x256:4, got {text!r}")
    return tuple(map(int, match.groups()))


# ---- Inputs, the per-group loop and the floor

def make_inputs(rows, tokens, group_size, device, seed=0):
    """Outcome rewards, random lengths in [1, T], groups of `group_size` interleaved at random."""
    g = torch.Generator().manual_seed(seed)
    n_groups = max(rows // group_size, 1)
    group_index = torch.arange(n_groups).repeat_interleave(group_size)[:rows]
    group_index = group_index[torch.randperm(rows, generator=g)]  # (B,) interleaved
    lengths = torch.randint(1, tokens + 1, (rows,), generator=g)  # (B,)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()  # (B, T)
    rewards = torch.zeros(rows, tokens)
    rewards[torch.arange(rows), lengths - 1] = (torch.rand(rows, generator=g) < 0.5).float()
    pi_y = torch.rand(rows, tokens, generator=g).clamp_min(1e-4)  # pi(y_t)
    # a valid sum pi^2 for that pi_y: pi_y^2 + (rest of the mass)^2 * u, u in (0, 1]
    sum_pi_sq = pi_y ** 2 + (1 - pi_y) ** 2 * torch.rand(rows, tokens, generator=g).clamp_min(0.01)
    inputs = dict(token_rewards=rewards, response_mask=mask, group_index=group_index,
                  log_probs=pi_y.log(), sum_pi_sq=sum_pi_sq)
    return {k: v.to(device) for k, v in inputs.items()}


def per_group_loop(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, eps=1e-8):
    """OTB one group at a time (no importance weights, own row included, singletons B = 0): what
    otb.optimal_token_baseline computes for all groups at once. Returns (A_t, G_t), (B, T) each."""
    m = response_mask
    G = floor_pass(token_rewards * m) * m  # G_t, eq. (1)
    W = ((1 - 2 * log_probs.exp() + sum_pi_sq).clamp(0, 2) * m).cumsum(-1) * m  # W_t, eqs. (3), (7)
    B = torch.zeros_like(G)  # B_t
    for uid in torch.unique(group_index).tolist():
        rows = (group_index == uid).nonzero()[:, 0]  # this group's rows
        if len(rows) > 1:
            B[rows] = (G[rows] * W[rows]).sum(0) / (W[rows].sum(0) + eps)  # eq. (6), broadcast to its rows
    return (G - B) * m, G


def floor_pass(x):
    """One reverse cumulative sum over (B, T): the single pass that computing G_t needs."""
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])


def main():
    args = parse_args()
    device = pick_device(args.device)
    print("command: " + command("bench_estimators.py"))
    print(f"{machine.describe_info(machine.info())}, device: {device}")
    print(f"float32 inputs, median of {args.repeats} interleaved rounds after a warm-up round\n")
    header = (f"{'shape (rows x tokens : group)':>30} {'groups':>7} {'otb ms':>9} {'loop ms':>9} "
              f"{'floor ms':>9} {'loop/otb':>9} {'otb/floor':>10} {'max|diff|':>10}  faster")
    print(header)
    print("-" * len(header))
    all_agree = True
    for rows, tokens, group in args.shapes:
        x = make_inputs(rows, tokens, group, device, seed=args.seed)
        adv, ret = otb.optimal_token_baseline(**x)
        adv_loop, ret_loop = per_group_loop(**x)
        diff = max((adv - adv_loop).abs().max().item(), (ret - ret_loop).abs().max().item())
        agree = diff <= 1e-4 * (1 + ret_loop.abs().max().item())
        all_agree &= agree
        variants = [lambda r: otb.optimal_token_baseline(**x), lambda r: per_group_loop(**x),
                    lambda r: floor_pass(x["token_rewards"])]
        seconds, _ = interleaved_rounds(variants, args.repeats, device=device)
        t_otb, t_loop, t_floor = (statistics.median(s[1:]) for s in seconds)  # round 0 warmed up
        n_groups = int(torch.unique(x["group_index"]).numel())
        faster = "otb" if t_otb < t_loop else "loop"
        print(f"{f'{rows} x {tokens} : {group}':>30} {n_groups:>7} {t_otb * 1e3:>9.2f} {t_loop * 1e3:>9.2f} "
              f"{t_floor * 1e3:>9.3f} {t_loop / t_otb:>8.2f}x {t_otb / t_floor:>9.1f}x {diff:>10.1e}  "
              f"{faster}{'' if agree else '  DISAGREES WITH LOOP'}")
    if not all_agree:
        print("\nERROR: otb.optimal_token_baseline disagrees with the per-group loop", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
