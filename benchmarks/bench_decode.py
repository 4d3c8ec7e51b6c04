"""How long does one sampled token take? The rollout's decode loop, timed (docs/cost.md).

Times ``fast_decode.sample`` (rollout.sample's loop on a chosen decoder) on a SmolLM2-135M-shaped model
with random weights; no row ever ends (EOS id -1), so a call runs exactly ``--tokens`` decode steps.
Reported: ms per sampled position (one decode step of the batch), median of ``--repeats`` calls after a
warm-up call; the draws on the
model's device, as train.py makes them. ``--hidden 72`` leaves only the cost of launching the
layers; ``--decode`` times fast_decode.py's decoders in turns and checks their tokens agree.

    python benchmarks/bench_decode.py                            # CPU, ~1 min
    python benchmarks/bench_decode.py --batch 1,128,512          # on a GPU
"""
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import fast_decode  # noqa: E402
from benchmarks.cli import (at_least, choice_list, device_option, int_list,  # noqa: E402
                            out_json, parser, pick_device)
from benchmarks.common import model_options, smollm2_shaped  # noqa: E402
from lab import machine  # noqa: E402
from benchmarks.common import interleaved_rounds  # noqa: E402


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--batch", type=int_list(1), default="1,32",
                   help="B values, rows sampled together (the GPU preset: 128 at N = 4, 512 at N = 16)")
    model_options(p, layers=30, prompt=48)  # the preset's chat prompt: 47 tokens
    p.add_argument("--tokens", type=at_least(1), default=16, help="decode steps per call")
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed calls per setting (median reported)")
    p.add_argument("--decode", type=choice_list(["plain", "static", "compiled"]), default="plain",
                   help="comma-separated, timed in turns: plain (the default loop), static (a static KV "
                        "cache) and/or compiled (static + torch.compile; fast_decode.py)")
    p.add_argument("--device", default="auto", type=device_option,
                   help="where the model runs: auto (cuda if present), cpu or cuda")
    p.add_argument("--json", type=out_json, default=None,
                   help="also write the results to this .json file (default: print only; the saved results "
                        "are benchmarks/results/cost/decode_cpu_*.json, rewritten only when named here)")
    return p.parse_args(argv)


def time_sampling(model, B, args, decodes=("plain",)):
    """One row per decoder: ms per sampled position (median of ``args.repeats`` calls, and every
    call's), plain's time over its, the first call's seconds (with any compiling) and whether its tokens
    equal the first decoder's. The decoders take turns in every round on that round's seed, so a
    change in the machine's load hits them alike."""
    device = next(model.parameters()).device
    prompts = torch.randint(3, 49152, (B, args.prompt), generator=torch.Generator().manual_seed(0)).tolist()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def sample(r, decode):  # the draws on the model's device, as train.py makes them
        with autocast:
            ro = fast_decode.sample(model, prompts, group_size=1, max_new_tokens=args.tokens, temperature=1.0,
                                    eos_id=-1, pad_id=0, generator=torch.Generator(device).manual_seed(r),
                                    decoder=fast_decode.decoder(model, decode))  # eos_id -1: no row ever ends
        assert ro.response.shape == (B, args.tokens)
        return ro.response  # (B, tokens)
    # round 0 warms up (allocator, kernels, compiling): reported apart
    seconds, tokens = interleaved_rounds([lambda r, d=d: sample(r, d) for d in decodes], args.repeats,
                                         device=device, keep=True)
    ms = {d: [1000 * x / args.tokens for x in s[1:]] for d, s in zip(decodes, seconds)}  # timed rounds
    plain = statistics.median(ms["plain"]) if "plain" in ms else None
    return [dict(batch=B, decode=d, ms_per_position=statistics.median(ms[d]),
                 plain_over_this=plain / statistics.median(ms[d]) if plain else None, first_call_s=s[0],
                 same_tokens_as_first=all(map(torch.equal, t, tokens[0])), ms_rounds=ms[d])
            for d, s, t in zip(decodes, seconds, tokens)]


def main(argv=None):
    args = parse_args(argv)
    device, info = pick_device(args.device), machine.info()
    print(f"machine: {machine.describe_info(info)}\nmodel: SmolLM2-135M shape, hidden {args.hidden}, "
          f"{args.layers} layers, on {device}; prompt {args.prompt}, {args.tokens} decode steps per call")
    model = smollm2_shaped(args.hidden, args.layers, device)
    print(f"{'B':>5} {'decode':>9} {'ms / sampled position':>22} {'plain / this':>12} {'first call s':>12} "
          f"{'same tokens':>11}")
    rows = []
    for B in args.batch:
        for r in time_sampling(model, B, args, args.decode):
            rows.append(r)
            print(f"{B:>5} {r['decode']:>9} {r['ms_per_position']:>22.1f} "
                  f"{r['plain_over_this'] or math.nan:>12.2f} {r['first_call_s']:>12.1f} "
                  f"{str(r['same_tokens_as_first']):>11}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(machine=info, device=str(device), args=vars(args),
                                                   results=rows), indent=1) + "\n")
        print(f"results: {args.json}")
    return rows


if __name__ == "__main__":
    main()
