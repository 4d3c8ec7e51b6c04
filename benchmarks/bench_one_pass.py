"""Time per training step: one forward pass (train.py's default) against the old two-pass path.

With one update per batch, train.py's scoring pass keeps its autograd graph and is the update's
forward pass; the two-pass path (a no-grad scoring pass, then the update's own forward) is what
train.py still runs when PPO reuses the batch. This script runs both on identical batches,
interleaved step by step in one process (the order alternates every round), from the same
weights, and prints the medians and their ratio. Prints only; writes nothing but a temporary folder.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_one_pass.py --rounds 60
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_one_pass.py --rounds 15 \\
        --train-args "--task periodic --horizon 64"

Round r uses seed r for the prompts and the sampler (the model is the seed-0 warm-up, reused from
the cache under --out), so every round is a different batch and both paths see the same one.
"""
import argparse
import contextlib
import io
import shlex
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

import train  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40, help="timed rounds (one step of each path per round)")
    p.add_argument("--train-args", default="", help="train.py options, e.g. '--task periodic --horizon 64'")
    p.add_argument("--out", default="runs", help="train.py --out: where the warm-up cache is (or is built)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: must be >= 1")
    cfg = train.parse_config(["--estimator", "otb", "--steps", "1", "--checkpoint-minutes", "600",
                              "--out", args.out, *shlex.split(args.train_args)])
    train.check(cfg)
    model, tok, _ = train.load(cfg, train.pick_device(cfg.device))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    one_pass = train.one_update_per_batch
    paths = {"one pass": one_pass, "two passes": lambda cfg, batch: False}
    times = {name: [] for name in paths}  # (whole step, score + update) per round
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # round 0 warms up and is dropped
            rows = {}
            for name in (list(paths) if r % 2 else list(paths)[::-1]):
                train.one_update_per_batch = paths[name]
                model.load_state_dict(start)
                run_dir = Path(tmp) / f"{r}-{name.replace(' ', '-')}"
                run_dir.mkdir()
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    rows[name] = train.train(replace(cfg, seed=r), run_dir, model, tok)[0]
            train.one_update_per_batch = one_pass
            a, b = rows.values()
            assert a["tokens"] == b["tokens"] and a["success"] == b["success"], "the paths saw different batches"
            if r:
                for name, row in rows.items():
                    times[name].append((sum(row[k] for k in train.TIME_KEYS), row["t_score"] + row["t_update"]))
    print(f"train.py {shlex.join(['--estimator', 'otb', *shlex.split(args.train_args)])}: "
          f"{args.rounds} rounds, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for i, what in enumerate(("whole step", "score + update")):
        one, two = (statistics.median(t[i] for t in times[name]) for name in paths)
        per_round = statistics.median(x[i] / y[i] for x, y in zip(*times.values()))
        print(f"{what:>14}: median one pass {one:.4f} s, two passes {two:.4f} s, ratio {one / two:.3f} "
              f"(median of per-round ratios {per_round:.3f})")


if __name__ == "__main__":
    main()
