"""Peak memory of one update of group_mean:16 at the GPU preset's shapes: measured on the CPU, and counted.

The preset's largest step (``--compare ... group_mean:16``): 8 prompts x 16 responses = 128 rows,
a chat-template prompt of about 45 tokens and responses of the full 327 tokens (the count task's
limit), SmolLM2-135M's architecture (30 layers, width 576, 9 query / 3 key-value heads, MLP 1536,
vocabulary 49,152, tied head). The responses are fabricated (random tokens, every position valid):
memory depends on shapes, not on which tokens.

Measured (``--rows`` rows, each in a fresh subprocess, float32 on this CPU): resident memory before
the model is built, after, and the peak (VmHWM) over one update as train.py makes it with the
preset's memory options (score, group_mean advantages, the update with --chunk-size 32,
--activation-checkpointing and --micro-batch-rows).

Counted: weights, gradients and AdamW's two moments (float32); the layer inputs that activation
checkpointing keeps (float32 residual stream, every layer) and the shared 4-D attention mask; the
activations of the one layer being recomputed, measured as the bytes autograd saves for one decoder
layer (the difference between a 2-layer and a 1-layer decoder, one row, ``saved_tensors_hooks``),
counted twice (the saved tensors and their gradients in the backward); the final norm and the
hidden states the head reads; the chunked float32 head (4 tensors of one chunk's (b, c, V)); and
under bf16 autocast the bf16 copies of the linear weights. The same count is made for float32 on
this CPU (checked against the measurement) and for bf16 autocast, the GPU's setting; the per-layer
bytes of bf16 are those of CPU autocast (the CUDA attention kernel saves another set; see the saved
breakdown).

    OMP_NUM_THREADS=1 python benchmarks/bench_memory.py --rows 4,8 --out benchmarks/results/memory
"""
import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
from lab import preflight  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
from benchmarks import cli  # noqa: E402
from benchmarks.common import smollm2_shaped  # noqa: E402
from lab import machine, models  # noqa: E402

SHAPE = dict(vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, mlp=1536)
PROMPT, RESPONSE, ROWS, GROUP = 45, 327, 128, 16  # the preset's group_mean:16 step
GB = 1e9


def fabricated(rows):
    """A rollout of ``rows`` full-length responses (every position valid), groups of GROUP rows."""
    g = torch.Generator().manual_seed(0)
    return rollout.Rollout(
        prompt_ids=torch.randint(3, SHAPE["vocab"], (rows, PROMPT), generator=g),
        prompt_mask=torch.ones(rows, PROMPT, dtype=torch.long),
        response=torch.randint(3, SHAPE["vocab"], (rows, RESPONSE), generator=g),
        response_mask=torch.ones(rows, RESPONSE), group_index=torch.arange(rows) // GROUP,
        logp=torch.zeros(rows, RESPONSE), finished=torch.zeros(rows, dtype=torch.bool))


def one_update(rows, micro, chunk):
    """Child process: build, then one update as train_step makes it; returns the measurements."""
    before = preflight.resident()
    model = smollm2_shaped(layers=SHAPE["layers"])
    models.checkpoint_layers(model)  # --activation-checkpointing, as options.load enables it
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    cfg = replace(train.Config(), chunk_size=chunk, activation_checkpointing=True, micro_batch_rows=micro,
                  temperature=0.7)
    ro = fabricated(rows)
    built = preflight.resident()
    preflight.reset_peak(torch.device("cpu"))  # VmHWM back to the current resident size
    t0 = time.time()
    R = (torch.rand(rows, generator=torch.Generator().manual_seed(1)) < 0.3).float()
    token_rewards = torch.zeros_like(ro.response_mask)
    token_rewards[:, -1] = R  # the outcome reward at the last token
    preflight.score_estimate_update(train, cfg, model, opt, ro, token_rewards, otb.ESTIMATORS["group_mean"])  # score,
    # estimate, update: train_step after its rollout, as the preflight measures it
    return dict(rows=rows, micro_batch_rows=micro, chunk_size=chunk, rss_before_model=before, rss_built=built,
                peak_rss=preflight.resident("VmHWM"), seconds=round(time.time() - t0, 1),
                params=sum(p.numel() for p in model.parameters()))


def saved_bytes(layers, rows, dtype):
    """{(shape, dtype): [count, bytes]} of the activations autograd saves in a forward of a ``layers``-layer
    decoder over ``rows`` rows of PROMPT + RESPONSE positions (float32, or under bf16 autocast)."""
    ids = torch.randint(3, SHAPE["vocab"], (rows, PROMPT + RESPONSE), generator=torch.Generator().manual_seed(0))
    model = smollm2_shaped(layers=layers)
    params = {p.data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.data_ptr() not in params:  # not a weight itself (they are counted once, elsewhere)
            saved[t.data_ptr()] = ((tuple(t.shape), str(t.dtype).replace("torch.", "")), t.numel() * t.element_size())
        return t
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    out = {}
    for key, size in saved.values():
        out.setdefault(key, [0, 0])
        out[key][0] += 1
        out[key][1] += size
    return out


def layer_bytes(dtype):
    """Bytes autograd saves for one decoder layer per row (a 2-layer decoder minus a 1-layer one, at 2
    rows minus 1 row: what grows with rows, so not the bf16 copies of the weights), and the tensors the
    second layer adds at one row."""
    saved = {(n, r): saved_bytes(n, r, dtype) for n in (1, 2) for r in (1, 2)}  # layers, rows
    total = {key: sum(v[1] for v in s.values()) for key, s in saved.items()}
    per_row = (total[2, 2] - total[1, 2]) - (total[2, 1] - total[1, 1])
    one, two = saved[1, 1], saved[2, 1]
    added = [(str(k), two[k][0] - one.get(k, [0, 0])[0], two[k][1] - one.get(k, [0, 0])[1]) for k in two]
    return per_row, sorted((a for a in added if a[1] > 0), key=lambda a: -a[2])


def count(rows, dtype, per_layer_row, params, linear_params, chunk=32):
    """The count of one update's peak for a micro-batch of ``rows`` rows, in bytes, by component."""
    L, H, V = PROMPT + RESPONSE, SHAPE["hidden"], SHAPE["vocab"]
    c = dict(weights=4 * params, gradients=4 * params, adamw_moments=8 * params,
             layer_inputs_kept=SHAPE["layers"] * rows * L * H * 4,  # float32 residual stream
             attention_mask=rows * L * L * 4,  # the 4-D (b, 1, L, L) mask, shared by every layer
             one_layer_recomputed=2 * rows * per_layer_row,  # saved activations and their gradients
             final_norm_and_hidden=3 * rows * L * H * 4,  # norm input, output, its gradient
             chunked_head=4 * rows * min(chunk, RESPONSE) * V * 4,  # z, softmax, grad z, scatter: (b, c, V)
             autocast_weight_copies=2 * linear_params if dtype == "bfloat16" else 0)
    c["total"] = sum(c.values())
    return c


def parse_args(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("--rows", type=cli.int_list(1), default="4,8", help="rows of the measured updates (one subprocess each)")
    p.add_argument("--micro-batch-rows", type=cli.at_least(1), default=32,
                   help="the preset's --micro-batch-rows (the measured updates use min(rows, this))")
    p.add_argument("--chunk-size", type=cli.at_least(1), default=32, help="the preset's --chunk-size")
    p.add_argument("--out", type=cli.out_folder, default=cli.RUNS / "memory", help="folder for memory.json / .md")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(one_update(args.child, min(args.child, args.micro_batch_rows), args.chunk_size)))
        return
    command = cli.command("bench_memory.py", argv)
    measured = []
    for rows in args.rows:
        res = subprocess.run([sys.executable, __file__, "--child", str(rows), "--micro-batch-rows",
                              str(args.micro_batch_rows), "--chunk-size", str(args.chunk_size)],
                             capture_output=True, text=True, check=True, env={**os.environ})
        measured.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(measured[-1], flush=True)
    params = measured[0]["params"]
    model = smollm2_shaped(layers=1)
    per_layer_params = sum(p.numel() for p in model.model.layers[0].parameters() if p.dim() == 2)
    linear_params = SHAPE["layers"] * per_layer_params
    per_layer = {d: layer_bytes(d) for d in ("float32", "bfloat16")}
    rows_out, lines = [], []
    for r in measured:
        c = count(r["micro_batch_rows"], "float32", per_layer["float32"][0], params, linear_params, args.chunk_size)
        got = r["peak_rss"] - r["rss_before_model"]
        rows_out.append(dict(**r, measured_peak_above_start=got, count_float32=c, count_over_measured=c["total"] / got))
        lines.append(f"| {r['rows']} | {r['micro_batch_rows']} | {r['seconds']} | {got / GB:.2f} | {c['total'] / GB:.2f} "
                     f"| {c['total'] / got:.3f} |")
    micro = min(ROWS, args.micro_batch_rows)
    preset = {d: count(micro, d, per_layer[d][0], params, linear_params, args.chunk_size) for d in per_layer}
    whole = {d: count(ROWS, d, per_layer[d][0], params, linear_params, args.chunk_size) for d in per_layer}
    record = dict(command=command, machine=machine.info(),
                  shape=dict(SHAPE, prompt=PROMPT, response=RESPONSE, rows=ROWS), measured=rows_out,
                  per_layer_row_bytes={d: v[0] for d, v in per_layer.items()},
                  per_layer_saved={d: v[1] for d, v in per_layer.items()},
                  count_preset_micro_batch=preset, count_one_pass_128_rows=whole)
    comp = list(preset["bfloat16"])
    text = (f"# Memory of one group_mean:16 update at the GPU preset's shapes\n\n`{command}`\n\n"
            f"{machine.describe_info(record['machine'])}. SmolLM2-135M's shape, random weights, {PROMPT} + {RESPONSE} "
            f"positions per row, --chunk-size {args.chunk_size}, --activation-checkpointing.\n\n"
            "## Measured on the CPU (float32), against the count\n\n"
            "| rows | micro-batch rows | seconds | measured peak above start (GB) | count (GB) | count / measured |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
            f"## Count at the preset's shape: {ROWS} rows, micro-batches of {micro} (GB)\n\n"
            "| component | float32 (CPU) | bf16 autocast (GPU) | one pass of 128 rows, bf16 |\n|---|---|---|---|\n"
            + "\n".join(f"| {k} | {preset['float32'][k] / GB:.2f} | {preset['bfloat16'][k] / GB:.2f} "
                        f"| {whole['bfloat16'][k] / GB:.2f} |" for k in comp)
            + f"\n\nBytes autograd saves per row for one decoder layer ({PROMPT + RESPONSE} positions): "
            f"float32 {per_layer['float32'][0] / 1e6:.1f} MB, bf16 autocast (CPU kernels) "
            f"{per_layer['bfloat16'][0] / 1e6:.1f} MB; the tensors are listed in memory.json.\n")
    cli.write_results(args.out, "memory", record, text)


if __name__ == "__main__":
    main()
