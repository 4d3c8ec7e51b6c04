"""The project's training step beside TRL's GRPOTrainer: same model, prompts and configuration.

    OMP_NUM_THREADS=1 python benchmarks/bench_vs_trl.py                 # 100 steps each, ~3 min
    python benchmarks/bench_vs_trl.py --out benchmarks/results/trl      # the saved results

Both sides start from train.py's warmed-up tiny model in its configuration (docs/cost.md) and see
tasks.prompt_batch(seed, s) at step s. One process: the project's step runs in a TrainerCallback,
outside TRL's timed window, so the sides alternate step by step; neither side's logging is timed.
Medians over the steps after ``--skip`` of rollout (TRL: ``_generate``), score (the rest of
``_generate_and_score_completions``) and update (the rest of the step), and success over the first
and last 10 steps. Results go to runs/bench_vs_trl/ (.json, .md), into benchmarks/results/ only with --out.
"""
import os

if __name__ == "__main__":  # run as a script: before torch (and its OpenMP runtime) starts
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from lab import options, preflight  # noqa: E402
from benchmarks import cli  # noqa: E402
from benchmarks.cli import at_least, out_folder, parser  # noqa: E402
from benchmarks.common import load_model  # noqa: E402  (float32, eval mode)
from lab import machine  # noqa: E402

TRL_SCALE = {"group_mean": "none", "grpo": "group"}  # the project's estimator -> TRL's scale_rewards
PHASES = ("rollout", "score", "update")


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--steps", type=at_least(1), default=100, help="training steps per side (interleaved)")
    p.add_argument("--skip", type=at_least(0), default=3, help="first steps left out of the timing medians")
    p.add_argument("--estimator", default="group_mean", choices=sorted(TRL_SCALE),
                   help="the project's estimator; TRL gets the matching scale_rewards")
    p.add_argument("--prompts-per-step", type=at_least(1), default=16, help="prompts per step")
    p.add_argument("--group-size", type=at_least(2), default=4, help="N, responses per prompt")
    p.add_argument("--task", default="reverse", choices=["reverse", "periodic"],
                   help="train.py's task: reverse (the default run) or periodic (the long-horizon one)")
    p.add_argument("--horizon", type=at_least(1), default=None, help="the task's length knob (default: the task's)")
    p.add_argument("--max-new-tokens", type=at_least(1), default=None,
                   help="response length limit (default: the task's, 18 for reverse)")
    p.add_argument("--seed", type=int, default=0, help="prompt stream and sampler seed (the tiny model's too)")
    p.add_argument("--out", type=out_folder, default=str(ROOT / "runs" / "bench_vs_trl"), help="results folder")
    args = p.parse_args(argv)
    if args.skip >= args.steps:
        p.error(f"argument --skip: must be smaller than --steps ({args.steps}), got {args.skip}")
    try:
        import otb_trl  # noqa: F401
    except ImportError as e:
        p.error(str(e))
    return args


# ---- Shared setup: the tiny model, the configuration, the prompts of each step

def setup(args):
    """(model folder, tokenizer, task, cfg): train.py's tiny model and configuration."""
    cfg = train.Config(estimator=args.estimator, seed=args.seed, prompts_per_step=args.prompts_per_step,
                       group_size=args.group_size, task=args.task, horizon=args.horizon,
                       max_new_tokens=args.max_new_tokens, out=str(ROOT / "runs"))
    cfg.max_new_tokens = tasks.response_limit(options.make_task(cfg), cfg.max_new_tokens)  # explicit for TRL's config
    _, tok, source = options.load(cfg, torch.device("cpu"))  # builds and caches the warm-up if needed
    return source["path"], tok, options.make_task(cfg), cfg


def prompt_rows(tok, task, cfg, steps):
    """TRL's dataset: the project's prompts of steps 0..steps-1, in order, as text + answer."""
    from datasets import Dataset
    rows = []
    for s in range(steps):
        ids, answers = tasks.prompt_batch(task, tok, cfg.seed, s, cfg.prompts_per_step)
        rows += [{"prompt": tok.decode(i), "answer": a} for i, a in zip(ids, answers)]
    return Dataset.from_list(rows)


# ---- The project's side: one train.py step, through train.train_step itself

def project_step(model, opt, tok, task, cfg, step):
    """One train.train_step, as train.train runs it without its logging: phase times (s), success. The
    phases are those the step marks on its step log (preflight.timed_step): its rollout (rewards included),
    score (with the advantages, as TRL's) and update."""
    estimator = train.make_estimator(cfg.estimator, cfg.zero_tail)
    s, t = preflight.timed_step(train, cfg, model, model, opt, task, tok, estimator, step)
    seconds = dict(rollout=t["rollout"], score=t["score"] + t["estimate"], update=t["update"])
    return dict(seconds, step=sum(seconds.values()), success=(s.R >= 1).float().mean().item())


# ---- TRL's side: GRPOTrainer with its phases timed

def trl_trainer(folder, tok, task, cfg, data, out, steps, callbacks=()):
    import otb_trl
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that records how long sampling and the whole rollout + scoring take."""

        def __init__(self, *a, **kw):
            self.times, self.success, self.batch = {}, [], None
            super().__init__(*a, **kw)

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self.times["generate"] = time.perf_counter() - t0
            return out

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.times["generate_and_score"] = time.perf_counter() - t0
            self.batch = out  # its prompt_ids: checked against the project's prompts
            return out

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self.success.append((rewards[:, 0] >= 1).float().mean().item())
            return rewards

    from transformers import PrinterCallback
    args = otb_trl.grpo_config(out, cfg, steps, cfg.prompts_per_step, cfg.max_new_tokens,
                               scale_rewards=TRL_SCALE[cfg.estimator])
    reward = otb_trl.task_reward(task, tok.eos_token_id)
    trainer = TimedGRPOTrainer(load_model(folder)[0], reward_funcs=reward, args=args, train_dataset=data,
                               processing_class=tok, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # TRL's per-step log dicts; the report has the numbers
    return trainer


# ---- The interleaved run and the report

def interleaved(folder, tok, task, cfg, args, out):
    """args.steps steps of each side, alternating. Returns {side: [per-step dicts]}."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback
    model = load_model(folder)[0]  # a fresh copy for each side
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # as train.train
    rows = {"project": [], "trl": []}
    bar = tqdm(total=args.steps, desc="interleaved steps (TRL, project)")

    class Interleave(TrainerCallback):
        t0 = None

        def on_step_begin(self, *a, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, targs, state, control, **kw):
            total = time.perf_counter() - self.t0
            t = trainer.times
            rows["trl"].append(dict(rollout=t["generate"], score=t["generate_and_score"] - t["generate"],
                                    update=total - t["generate_and_score"], step=total,
                                    success=trainer.success[-1]))
            step = state.global_step - 1
            ids, _ = rollout.left_pad(tasks.prompt_batch(task, tok, cfg.seed, step, cfg.prompts_per_step)[0],
                                      tok.pad_token_id)  # the project's prompts of this step, (P, L)
            if not torch.equal(ids, trainer.batch["prompt_ids"][::cfg.group_size]):
                raise RuntimeError(f"TRL and the project saw different prompts at step {step}")
            rows["project"].append(project_step(model, opt, tok, task, cfg, step))
            bar.update(1)

    trainer = trl_trainer(folder, tok, task, cfg, prompt_rows(tok, task, cfg, args.steps), out / "trl",
                          args.steps, callbacks=[Interleave()])
    trainer.train()
    bar.close()
    return rows


def summarize(rows, skip):
    med = {side: {k: statistics.median(r[k] for r in rs[skip:]) for k in PHASES + ("step",)}
           for side, rs in rows.items()}
    learn = {side: dict(first10=statistics.mean(r["success"] for r in rs[:10]),
                        last10=statistics.mean(r["success"] for r in rs[-10:])) for side, rs in rows.items()}
    per_step_ratio = [p["step"] / t["step"] for p, t in zip(rows["project"][skip:], rows["trl"][skip:])]
    return dict(median_s=med, ratio_project_over_trl=med["project"]["step"] / med["trl"]["step"],
                per_step_ratio_quartiles=statistics.quantiles(per_step_ratio, n=4) if len(per_step_ratio) > 1 else None,
                learning=learn)


def report(args, cfg, command, info, summary):
    med, r = summary["median_s"], summary["ratio_project_over_trl"]
    trl_name = f'TRL GRPOTrainer (scale_rewards="{TRL_SCALE[args.estimator]}", loss_type="dapo")'
    lines = [f"# train.py's step vs {trl_name}\n", f"`{command}`  ",
             f"{machine.describe_info(info)}, trl {info['trl']}, transformers {info['transformers']}; "
             f"OMP_WAIT_POLICY={info['omp_wait_policy']}; "
             f"task {args.task}, {args.prompts_per_step} prompts x N={args.group_size}, {cfg.max_new_tokens} new tokens; "
             f"median of steps {args.skip + 1}-{args.steps}, the two sides interleaved\n",
             "| side | rollout (s) | score (s) | update (s) | step (s) |", "|---|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join(f"{med[side][k]:.3f}" for k in PHASES + ("step",)) + " |"
              for side, name in (("project", f"project ({args.estimator})"), ("trl", "TRL"))]
    q = summary["per_step_ratio_quartiles"]
    lines += ["", f"**project / TRL time per step: {r:.2f}x** (ratio of the medians"
              + (f"; per-step ratios, quartiles {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f})" if q else ")"), ""]
    learn = summary["learning"]
    lines.append("Learning (success rate, first 10 -> last 10 steps): " + ", ".join(
        f"{side} {v['first10']:.3f} -> {v['last10']:.3f}" for side, v in learn.items()))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    command = cli.command("bench_vs_trl.py", argv)
    import transformers
    import trl
    info = dict(machine.info(), trl=trl.__version__, transformers=transformers.__version__,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "unset"))
    print(command, info, sep="\n", flush=True)
    out = Path(args.out)
    folder, tok, task, cfg = setup(args)
    rows = interleaved(folder, tok, task, cfg, args, out)
    summary = summarize(rows, args.skip)
    text = report(args, cfg, command, info, summary)
    cli.write_results(out, "bench_vs_trl", dict(command=command, machine=info, args=vars(args), summary=summary,
                                                 steps=rows), text)
    return summary


if __name__ == "__main__":
    main()
