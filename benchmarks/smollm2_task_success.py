"""Success of SmolLM2-135M-Instruct on a chat task before any RL: sampling only, on the CPU.

    python benchmarks/smollm2_task_success.py                        # count: horizon 70, tau 0.7, 128 prompts
    python benchmarks/smollm2_task_success.py --out benchmarks/results/smollm2_count
    python benchmarks/smollm2_task_success.py --task chat_calculator --prompts 64   # with its tool
    python benchmarks/smollm2_task_success.py --task arithmetic --horizon 3 --prompts 64  # the same sums, no tool

One response per prompt of the task (``tasks.CountTask`` by default; chat template, the task's response limit,
prompts from ``tasks.prompt_batch`` on a seed no training run uses); the success rate with
Wilson's 95% score interval (each prompt one trial), and the token count of correct responses in
SmolLM2's tokenizer (EOS included). A task with a tool (``chat_calculator``) samples with it, in
the same batched loop as training, and reports its calls, error replies and cut replies per
response. Writes success.json into --out only when --out is given.
"""
import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import models  # noqa: E402
import rollout  # noqa: E402
from lab.analysis import stats  # noqa: E402
import tasks  # noqa: E402
from lab import options  # noqa: E402
from benchmarks.cli import at_least, command, out_folder, parser, positive_float, write_json  # noqa: E402


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--task", default="count", choices=("count", "arithmetic", "chat_calculator"),
                   help="the task (tasks.py, tool_use.py): count, or the sums of arithmetic, without and with a tool")
    p.add_argument("--horizon", type=at_least(1), default=None,
                   help="numbers to list (count), digits per number (arithmetic) or numbers added "
                   "(chat_calculator); default: the task's own")
    p.add_argument("--temperature", type=positive_float, default=0.7, help="sampling temperature tau")
    p.add_argument("--prompts", type=at_least(1), default=128, help="prompts, one response each")
    p.add_argument("--batch", type=at_least(1), default=16, help="prompts sampled together")
    p.add_argument("--seed", type=int, default=12345, help="prompt stream and sampler seed")
    p.add_argument("--out", type=out_folder, default=None,
                   help="folder for success.json (not written without it)")
    a = p.parse_args(argv)
    task = options.TASKS[a.task]() if a.horizon is None else options.TASKS[a.task](horizon=a.horizon)
    model, tok, source = models.load_model("smollm2", task, "cpu", max_new=task.max_new_tokens(), cache_dir=None)
    tool = task.tool(tok)
    t0, wins, lengths, counts = time.time(), [], [], {"calls": [], "errors": [], "cut": []}
    for b in tqdm(range(0, a.prompts, a.batch), desc=f"{a.task} horizon {task.horizon}, tau {a.temperature}"):
        n = min(a.batch, a.prompts - b)
        prompts, answers = tasks.prompt_batch(task, tok, a.seed, b, n)
        ro = rollout.sample(model, prompts, group_size=1, max_new_tokens=task.max_new_tokens(),
                            temperature=a.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(a.seed + b), tool=tool,
                            stop=task.stop_rule(tok, answers, 1))  # as train.py samples
        R, _, _ = tasks.rewards(task, tok, ro, answers, 1)
        wins += R.tolist()
        lengths += ro.response_mask.sum(-1).tolist()
        if tool is not None:
            for key, v in (("calls", ro.tool_calls), ("errors", ro.tool_errors), ("cut", ro.tool_cut)):
                counts[key] += v.float().tolist()
    k, n = int(sum(wins)), len(wins)
    _, lo, hi = stats.wilson(k, n)  # Wilson's 95% score interval
    correct = [len(tok(task.target_text(ans), add_special_tokens=False)["input_ids"]) + 1
               for _, ans in task.sample(random.Random(0), 200)]
    tools = {f"tool_{k}_per_response": sum(v) / n for k, v in counts.items()} if tool is not None else {}
    stop = "graded_end (a row ends once its reward is decided)" if hasattr(task, "graded_end") else None
    result = dict(command=command("smollm2_task_success.py", argv), model_weights=source["weights"],
                  task=a.task, stop_rule=stop, horizon=task.horizon,
                  temperature=a.temperature, prompts=n, successes=k, success=k / n,
                  wilson_95=[lo, hi], mean_response_tokens=sum(lengths) / n,
                  correct_response_tokens=[min(correct), max(correct)], max_new_tokens=task.max_new_tokens(),
                  seconds=round(time.time() - t0, 1), torch_threads=torch.get_num_threads(), **tools)
    print(json.dumps(result, indent=1))
    if a.out:
        write_json(a.out, "success.json", result)
    return result


if __name__ == "__main__":
    main()
