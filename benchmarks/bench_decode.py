"""How long does one sampled token take? The rollout's decode loop, timed.

In ``train.py --preset gpu`` (SmolLM2-135M, 32 prompts x N, up to 32 new tokens) almost all
compute-heavy work (scoring, the update) is a few large batched passes, but sampling is one small
forward pass per new token: 30 layers of little kernels, each launched from Python. On a GPU
that loop, not the arithmetic, sets the time of a step, so it is what this script measures.

It times ``rollout.sample`` itself (the code train.py runs) on a model with SmolLM2-135M's
shape (30 layers, hidden 576, 9 heads, 3 key/value heads, V = 49152) and random weights: the
weights do not change the time. No row ever ends (the EOS id is one the model cannot emit), so
every call runs exactly ``--tokens`` decode steps. Reported: milliseconds per sampled position
(one decode step for the whole batch), median of ``--repeats`` calls.

``--hidden 72`` keeps the depth and shrinks the width: the arithmetic vanishes and what is left
is the per-layer cost of launching work from Python, the floor of a decode step on any device.

Where the draw happens (``--draws``): ``device`` samples with a generator on the model's device
(what train.py does); ``cpu`` copies the (B, V) probabilities to the CPU at every token and
samples there (what it did before). On a CPU-only machine the two are the same thing.

    python benchmarks/bench_decode.py                                    # CPU, ~1 min
    python benchmarks/bench_decode.py --batch 1,128,512 --draws device,cpu   # on a GPU

``--decode plain,static,compiled`` times the decoders of fast_decode.py in turns (each round calls
each once, same seed; the first round, with the compilation, is reported apart and dropped) and
checks that they sample the same tokens.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout  # noqa: E402
from benchmarks.cli import at_least, int_list, device_option, multiple_of, out_json  # noqa: E402
from benchmarks.machine import machine  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int_list(1), default="1,32",
                   help="B values, rows sampled together (the GPU preset: 128 at N = 4, 512 at N = 16)")
    model_options(p, layers=30, prompt=48)  # the preset's chat prompt: 47 tokens
    p.add_argument("--tokens", type=at_least(1), default=16, help="decode steps per call")
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed calls per setting (median reported)")
    p.add_argument("--draws", default="device", help="comma-separated: device and/or cpu (where the multinomial runs)")
    p.add_argument("--decode", default="plain",
                   help="comma-separated, timed in turns: plain (the default loop), static (a static KV "
                        "cache) and/or compiled (static + torch.compile; fast_decode.py)")
    p.add_argument("--device", default="auto", type=device_option, help="where the model runs: auto (cuda if present), cpu or cuda")
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
    """{decode: (median seconds per decode step of ``rollout.sample`` over ``args.repeats`` calls,
    seconds of the first call (for "compiled": the compilation), tokens equal to the first decode's,
    the seconds of every round)}.
    The decoders take turns in every round, so a change in the machine's load hits them alike."""
    device = next(model.parameters()).device
    prompts = torch.randint(3, 49152, (B, args.prompt), generator=torch.Generator().manual_seed(0)).tolist()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    times, first, same = {d: [] for d in decodes}, {}, {d: True for d in decodes}
    for r in range(args.repeats + 1):  # the first call warms up (allocator, kernels, compiling): dropped
        for decode in decodes:
            gen = torch.Generator(device if draws == "device" else "cpu").manual_seed(r)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with autocast:
                ro = rollout.sample(model, prompts, group_size=1, max_new_tokens=args.tokens, temperature=1.0,
                                    eos_id=-1, pad_id=0, generator=gen, decode=decode)  # -1: never ends
            if device.type == "cuda":
                torch.cuda.synchronize()
            assert ro.response.shape == (B, args.tokens)
            if r:
                times[decode].append((time.perf_counter() - t) / args.tokens)
            else:
                first[decode] = time.perf_counter() - t
            if decode == decodes[0]:
                reference = ro.response  # (B, tokens), the same seed for every decoder of the round
            same[decode] &= torch.equal(ro.response, reference)
    return {d: (statistics.median(times[d]), first[d], same[d], times[d]) for d in decodes}


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    info = machine()
    print(f"machine: {info}\nmodel: SmolLM2-135M shape, hidden {args.hidden}, {args.layers} layers, "
          f"on {device}; prompt {args.prompt}, {args.tokens} decode steps per call")
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
