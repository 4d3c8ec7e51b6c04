"""Success of SmolLM2-135M-Instruct on the counting task before any RL: sampling only, on the CPU.

    python benchmarks/smollm2_task_success.py                        # horizon 70, tau 0.7, 128 prompts
    python benchmarks/smollm2_task_success.py --out benchmarks/results/smollm2_count

One response per prompt of ``tasks.CountTask`` (chat template, the task's response limit,
prompts from ``tasks.prompt_batch`` on a seed no training run uses); the success rate with
Wilson's 95% score interval (each prompt one trial), and the token count of correct responses in
SmolLM2's tokenizer (EOS included). Writes success.json into --out only when --out is given.
"""
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import models  # noqa: E402
import rollout  # noqa: E402
import tasks  # noqa: E402
from benchmarks.cli import at_least, command, out_folder, parser, positive_float  # noqa: E402


def wilson(k, n, z=1.959964):
    """Wilson's 95% score interval (lo, hi) for k successes in n trials."""
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return mid - half, mid + half


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--horizon", type=at_least(1), default=tasks.CountTask.horizon, help="numbers to list")
    p.add_argument("--temperature", type=positive_float, default=0.7, help="sampling temperature tau")
    p.add_argument("--prompts", type=at_least(1), default=128, help="prompts, one response each")
    p.add_argument("--batch", type=at_least(1), default=16, help="prompts sampled together")
    p.add_argument("--seed", type=int, default=12345, help="prompt stream and sampler seed")
    p.add_argument("--out", type=out_folder, default=None,
                   help="folder for success.json (not written without it)")
    a = p.parse_args(argv)
    task = tasks.CountTask(horizon=a.horizon)
    model, tok, source = models.load_model("smollm2", task, "cpu", max_new=task.max_new_tokens(), cache_dir=None)
    t0, wins, lengths = time.time(), [], []
    for b in tqdm(range(0, a.prompts, a.batch), desc=f"count horizon {a.horizon}, tau {a.temperature}"):
        n = min(a.batch, a.prompts - b)
        prompts, answers = tasks.prompt_batch(task, tok, a.seed, b, n)
        ro = rollout.sample(model, prompts, group_size=1, max_new_tokens=task.max_new_tokens(),
                            temperature=a.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(a.seed + b),
                            stop=tasks.stop_rule(task, tok, answers, 1))  # as train.py samples
        R, _, _ = tasks.rewards(task, tok, ro, answers, 1)
        wins += R.tolist()
        lengths += ro.response_mask.sum(-1).tolist()
    k, n = int(sum(wins)), len(wins)
    lo, hi = wilson(k, n)
    correct = [len(tok(task.target_text(ans), add_special_tokens=False)["input_ids"]) + 1
               for _, ans in task.sample(random.Random(0), 200)]
    result = dict(command=command("smollm2_task_success.py", argv), model_weights=source["weights"],
                  stop_rule="graded_end (a row ends once its reward is decided)", horizon=a.horizon,
                  temperature=a.temperature, prompts=n, successes=k, success=k / n,
                  wilson_95=[lo, hi], mean_response_tokens=sum(lengths) / n,
                  correct_response_tokens=[min(correct), max(correct)], max_new_tokens=task.max_new_tokens(),
                  seconds=round(time.time() - t0, 1), torch_threads=torch.get_num_threads())
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "success.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
