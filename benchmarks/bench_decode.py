"""How long does one sampled token take? The rollout's decode loop, timed (docs/cost.md).

Times ``rollout.sample`` on a SmolLM2-135M-shaped model with random weights; no row ever ends (EOS
id -1), so a call runs exactly ``--tokens`` decode steps. Reported: ms per sampled position (one
decode step of the batch), median of ``--repeats`` calls after a warm-up call. ``--hidden 72``
leaves only the cost of launching the layers; ``--draws cpu`` samples on the CPU instead of the
model's device; ``--decode`` times fast_decode.py's decoders in turns and checks their tokens agree.

    python benchmarks/bench_decode.py                                    # CPU, ~1 min
    python benchmarks/bench_decode.py --batch 1,128,512 --draws device,cpu   # on a GPU
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout  # noqa: E402
from benchmarks.cli import (at_least, device_option, int_list, multiple_of, out_json,  # noqa: E402
                            parser, pick_device)
from benchmarks.machine import describe, machine  # noqa: E402


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--batch", type=int_list(1), default="1,32",
                   help="B values, rows sampled together (the GPU preset: 128 at N = 4, 512 at N = 16)")
    model_options(p, layers=30, prompt=48)  # the preset's chat prompt: 47 tokens
    p.add_argument("--tokens", type=at_least(1), default=16, help="decode steps per call")
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed calls per setting (median reported)")
    p.add_argument("--draws", default="device",
                   help="comma-separated: device and/or cpu (where the multinomial runs)")
    p.add_argument("--decode", default="plain",
                   help="comma-separated, timed in turns: plain (the default loop), static (a static KV "
                        "cache) and/or compiled (static + torch.compile; fast_decode.py)")
    p.add_argument("--device", default="auto", type=device_option,
                   help="where the model runs: auto (cuda if present), cpu or cuda")
    p.add_argument("--json", type=out_json, default=None,
                   help="also write the results to this .json file (default: print only; the saved results "
                        "are benchmarks/results/cost/decode_cpu_*.json, rewritten only when named here)")
    args = p.parse_args(argv)
    if not set(args.draws.split(",")) <= {"device", "cpu"}:
        p.error(f"argument --draws: must be device and/or cpu, got {args.draws!r}")
    if not set(args.decode.split(",")) <= {"plain", "static", "compiled"}:
        p.error(f"argument --decode: must be plain, static and/or compiled, got {args.decode!r}")
    return args


def model_options(p, layers, prompt):
    """--hidden, --layers and --prompt of a SmolLM2-135M-shaped model (bench_decode, bench_score)."""
    p.add_argument("--hidden", type=multiple_of(18, 18), default=576,
                   help="hidden size, a multiple of 18: 9 heads of even size (SmolLM2-135M: 576; 72 "
                        "isolates the cost of launching the layers)")
    p.add_argument("--layers", type=at_least(1), default=layers, help="decoder layers (SmolLM2-135M: 30)")
    p.add_argument("--prompt", type=at_least(1), default=prompt, help="prompt tokens per row")


def smollm2_shaped(hidden=576, layers=30, device="cpu", vocab=49152):
    """SmolLM2-135M's architecture (heads, vocabulary) at this width and depth, random weights (seed 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                      num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                      max_position_embeddings=2048, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).to(device).eval()


def time_sampling(model, B, args, draws, decodes=("plain",)):
    """{decode: (median seconds per decode step over ``args.repeats`` calls, seconds of the first call
    (with any compiling), tokens equal to the first decode's, seconds per step of every round)}.
    The decoders take turns in every round, so a change in the machine's load hits them alike."""
    device = next(model.parameters()).device
    prompts = torch.randint(3, 49152, (B, args.prompt), generator=torch.Generator().manual_seed(0)).tolist()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds, same = {d: [] for d in decodes}, {d: True for d in decodes}
    for r in range(args.repeats + 1):  # round 0 warms up (allocator, kernels, compiling): reported apart
        for decode in decodes:
            gen = torch.Generator(device if draws == "device" else "cpu").manual_seed(r)
            sync()
            t = time.perf_counter()
            with autocast:
                ro = rollout.sample(model, prompts, group_size=1, max_new_tokens=args.tokens, temperature=1.0,
                                    eos_id=-1, pad_id=0, generator=gen, decode=decode)  # -1: never ends
            sync()
            seconds[decode].append(time.perf_counter() - t)
            assert ro.response.shape == (B, args.tokens)
            if decode == decodes[0]:
                reference = ro.response  # (B, tokens), the same seed for every decoder of the round
            same[decode] &= torch.equal(ro.response, reference)
    per_step = {d: [x / args.tokens for x in s[1:]] for d, s in seconds.items()}
    return {d: (statistics.median(per_step[d]), seconds[d][0], same[d], per_step[d]) for d in decodes}

def main(argv=None):
    args = parse_args(argv)
    device, info = pick_device(args.device), machine()
    print(f"machine: {describe(info)}\nmodel: SmolLM2-135M shape, hidden {args.hidden}, "
          f"{args.layers} layers, on {device}; prompt {args.prompt}, {args.tokens} decode steps per call")
    draws = ["device"] if device.type == "cpu" else args.draws.split(",")
    model = smollm2_shaped(args.hidden, args.layers, device)
    rows, decodes = [], args.decode.split(",")
    print(f"{'B':>5} {'draws on':>9} {'decode':>9} {'ms / sampled position':>22} {'plain / this':>12} "
          f"{'first call s':>12} {'same tokens':>11}")
    for B in (int(b) for b in args.batch.split(",")):
        for d in draws:
            timed = time_sampling(model, B, args, d, decodes)
            for decode, (seconds, first, same, rounds) in timed.items():
                ratio = timed["plain"][0] / seconds if "plain" in timed else None
                rows.append(dict(batch=B, draws=d, decode=decode, ms_per_position=1000 * seconds,
                                 plain_over_this=ratio, first_call_s=first, same_tokens_as_first=same,
                                 ms_rounds=[1000 * t for t in rounds]))
                print(f"{B:>5} {d:>9} {decode:>9} {1000 * seconds:>22.1f} {ratio or float('nan'):>12.2f} "
                      f"{first:>12.1f} {str(same):>11}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(machine=info, device=str(device), args=vars(args),
                                                   results=rows), indent=1) + "\n")
        print(f"results: {args.json}")
    return rows


if __name__ == "__main__":
    main()
