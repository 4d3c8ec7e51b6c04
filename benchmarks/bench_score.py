"""What does sum_k pi_k^2 cost inside the scoring pass? (docs/cost.md)

Times ``rollout.score`` as it is (``with``) against the same pass with ``otb.sum_pi_squared``
stubbed to zeros (``without``: what a group baseline needs), on one model and batch: median of
``--repeats`` calls, variants alternating in one process; working memory of each in a fresh
subprocess (peak during the call minus before it). The model has SmolLM2-135M's width, heads and
vocabulary, random weights and only ``--layers`` layers: an upper bound. Goals: +5% time, +10% memory.

    OMP_NUM_THREADS=1 python benchmarks/bench_score.py                   # CPU, ~2 min, writes runs/cost/
    python benchmarks/bench_score.py --batch 32 --response 512 --chunk-sizes 0,64   # on a GPU
"""
import argparse
import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import preflight  # noqa: E402
import rollout  # noqa: E402
from lab import machine  # noqa: E402
from benchmarks.common import interleaved_rounds  # noqa: E402
from benchmarks.common import model_options, smollm2_shaped, sum_pi_squared  # noqa: E402
from benchmarks import cli  # noqa: E402
from benchmarks.cli import RUNS, at_least, device_option, int_list, out_folder, parser  # noqa: E402

VARIANTS = ("without", "with")  # sum pi^2 stubbed out (a group baseline's scoring pass), computed


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--vocab", type=at_least(2), default=49152, help="vocabulary size V")
    model_options(p, layers=2, prompt=32)
    p.add_argument("--batch", type=at_least(1), default=8, help="B, responses scored in one pass")
    p.add_argument("--response", type=at_least(1), default=128, help="T, response tokens per row")
    p.add_argument("--chunk-sizes", type=int_list(0), default="0,32", help="rollout.score chunk_size values; 0 = all at once")
    p.add_argument("--repeats", type=at_least(1), default=5, help="timed calls per variant (median reported)")
    p.add_argument("--device", default="auto", type=device_option, help="where to run: auto (cuda if present), cpu or cuda")
    p.add_argument("--out", type=out_folder, default=str(RUNS / "cost"),
                   help="results folder (bench_score_<device>.md/.json); the saved results are in "
                        "benchmarks/results/cost, rewritten only when named here")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # internal: one memory measurement
    return p.parse_args(argv)


def build(args, device):
    """The model (intermediate size 1536 at the default width) and one batch of random tokens."""
    model = smollm2_shaped(args.hidden, args.layers, device, args.vocab)
    g = torch.Generator().manual_seed(0)
    B, P, T = args.batch, args.prompt, args.response
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)  # ragged responses
    inputs = dict(prompt_ids=torch.randint(0, args.vocab, (B, P), generator=g),
                  prompt_mask=torch.ones(B, P, dtype=torch.long),
                  response=torch.randint(0, args.vocab, (B, T), generator=g),
                  response_mask=(torch.arange(T)[None] < lengths[:, None]).float())
    return model, {k: v.to(device) for k, v in inputs.items()}


def call(model, inputs, chunk, variant="with"):
    """One scoring pass, sum pi^2 computed (``with``) or stubbed out (``without``)."""
    with sum_pi_squared(variant), torch.no_grad():  # the scoring pass of train.py: old_logp, sum_pi_sq
        out = rollout.score(model, **inputs, temperature=1.0, chunk_size=chunk or None)
    if out[0].is_cuda:
        torch.cuda.synchronize()
    return out


def child(args, device):
    """One variant in a fresh process: the working memory of one call, printed as JSON."""
    variant, chunk = args.child.split(":")
    model, inputs = build(args, device)
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    preflight.reset_peak(device)  # CUDA's peak, or the resident peak (VmHWM), back to the current one
    before = torch.cuda.memory_allocated() if cuda else preflight.resident()
    call(model, inputs, int(chunk), variant)
    peak = preflight.peak(device)
    print(json.dumps(dict(before=before, peak=peak)))


def memory(args, variant, chunk):
    cmd = [sys.executable, __file__, "--child", f"{variant}:{chunk}", "--device", args.device]
    for k in ("vocab", "hidden", "layers", "batch", "prompt", "response"):
        cmd += [f"--{k}", str(getattr(args, k))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    args = parse_args(argv)
    device = cli.pick_device(args.device)
    if args.child:
        return child(args, device)
    info = machine.info()
    model, inputs = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    shape = f"B={args.batch}, prompt {args.prompt}, T={args.response}, V={args.vocab}"
    print(f"{shape}; Llama hidden {args.hidden}, {args.layers} layers ({n_params / 1e6:.1f}M params) on {device}\n{info}")
    a = call(model, inputs, 0)[1]
    assert torch.allclose(a, call(model, inputs, 32)[1]), "chunked and unchunked sum pi^2 differ"
    results = []
    for chunk in tqdm(args.chunk_sizes, desc="chunk sizes"):
        variants = [lambda r, v=v: call(model, inputs, chunk, v) for v in VARIANTS]
        seconds, _ = interleaved_rounds(variants, args.repeats, rotate=True)  # without first in even rounds
        t = {v: statistics.median(s[1:]) for v, s in zip(VARIANTS, seconds)}  # round 0 warmed up
        mem = {v: memory(args, v, chunk) for v in VARIANTS}  # bytes before the call and at its peak
        work = {v: mem[v]["peak"] - mem[v]["before"] for v in VARIANTS}
        row = dict(chunk_size=chunk or None, time_without_s=t["without"], time_with_s=t["with"],
                   work_mem_without_mb=work["without"] / 2**20, work_mem_with_mb=work["with"] / 2**20,
                   peak_without_mb=mem["without"]["peak"] / 2**20, peak_with_mb=mem["with"]["peak"] / 2**20,
                   time_ratio=t["with"] / t["without"], work_mem_ratio=work["with"] / work["without"],
                   peak_ratio=mem["with"]["peak"] / mem["without"]["peak"])
        row["meets_goals"] = row["time_ratio"] <= 1.05 and row["work_mem_ratio"] <= 1.10
        results.append(row)
    cmd, tag = cli.command("bench_score.py", argv), device.type
    lines = [f"# sum pi^2 in rollout.score: cost ({tag})\n", f"`{cmd}`  ",
             f"{shape}; Llama hidden {args.hidden}, {args.layers} layers, {n_params / 1e6:.1f}M params; "
             f"{machine.describe_info(info)}\n",
             "| chunk_size | time without (s) | time with (s) | time ratio | work mem without (MB) | "
             "work mem with (MB) | work mem ratio | process peak ratio | goals met |", "|" + "---|" * 9]
    lines += [f"| {r['chunk_size']} | {r['time_without_s']:.3f} | {r['time_with_s']:.3f} | {r['time_ratio']:.3f} | "
              f"{r['work_mem_without_mb']:.0f} | {r['work_mem_with_mb']:.0f} | {r['work_mem_ratio']:.3f} | "
              f"{r['peak_ratio']:.3f} | {'yes' if r['meets_goals'] else 'no'} |" for r in results]
    cli.write_results(args.out, f"bench_score_{tag}", dict(
        command=cmd, shape=shape, model=dict(hidden=args.hidden, layers=args.layers, params=n_params),
        device=str(device), machine=info, repeats=args.repeats, results=results), "\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main()
