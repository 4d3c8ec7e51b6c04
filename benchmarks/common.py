"""What the benchmark scripts share, written once; every script in benchmarks/ imports this module
(and cli.py, grid.py) and no other script, but for two that extend one: factors_meta.py reads
horizon_sweep.py's analysis and stability_replication.py runs stability.py's. Each prints and stores the machine it
ran on (lab/machine.py: ``info``, ``describe_info``).

- ``interleaved_rounds``: how the timing benchmarks (bench_estimators, bench_score, bench_step_cost,
  bench_decode) compare variants: one call of each variant per round, in turns, so a change in a
  shared machine's load hits all of them alike; round 0 warms up and is not in medians.

- A model of SmolLM2-135M's shape with random weights, and its command-line options
  (bench_decode, bench_score, bench_step_cost).
- ``sum_pi_squared(variant)``: otb.sum_pi_squared as it is, or stubbed to zeros, inside a block
  (bench_score, bench_step_cost time a scoring pass with and without it).
- Exact per-prompt gradients of the tiny model (grad_variance, horizon_sweep): the model, a pool of
  sampled responses with their rewards, one backward pass per group, and an unbiased reference
  gradient from a separate pool (RLOO inside disjoint sub-pools).
- ``sketch``: a fixed random projection of those gradients to k numbers (horizon_sweep --project),
  for models whose gradients are too large to keep one per prompt and estimator.
"""
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
import rollout  # noqa: E402
from lab.analysis import scale_free  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from lab import options  # noqa: E402
from benchmarks.cli import at_least, multiple_of  # noqa: E402


# ---- Timing variants in turns

def interleaved_rounds(fns, repeats, rotate=False, device=None, setup=None, desc=None, keep=False):
    """Call each of ``fns`` once per round, for 1 + ``repeats`` rounds, in turns (a, b, c, a, b, c,
    ...; with ``rotate`` the order turns by one each round: a, b, c, then b, c, a, ...). Each fn takes
    the round number r. Untimed before each call: ``setup()`` if given, and waiting for a CUDA
    ``device`` (waited for again at the end of the call). ``desc``: a progress bar over the rounds.
    Returns (seconds, values): per fn, in every round, its wall time and, with ``keep``, what it
    returned (else None: an output is freed at once, as in a training loop); round 0 (the warm-up:
    allocator, kernels, compiling; left out of the medians) first."""
    cuda = device is not None and device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    seconds, values = [[] for _ in fns], [[] for _ in fns]
    for r in tqdm(range(repeats + 1), desc=desc, disable=desc is None):
        start = r % len(fns) if rotate else 0
        for i in [*range(start, len(fns)), *range(start)]:
            if setup is not None:
                setup()
            sync()
            t0 = time.perf_counter()
            out = fns[i](r)
            sync()
            seconds[i].append(time.perf_counter() - t0)
            values[i].append(out if keep else None)
            del out
    return seconds, values


# ---- A model of SmolLM2-135M's shape

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


# ---- sum pi^2 on or off

REAL_SUM_PI_SQUARED = otb.sum_pi_squared


def stub_sum_pi_squared(logits):
    """The baseline: no pass over the logits, zeros of the right shape (...,)."""
    return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)


@contextmanager
def sum_pi_squared(variant):
    """Inside the block, otb.sum_pi_squared as it is (``with``) or stubbed to zeros (``without``)."""
    otb.sum_pi_squared = REAL_SUM_PI_SQUARED if variant == "with" else stub_sum_pi_squared
    try:
        yield
    finally:
        otb.sum_pi_squared = REAL_SUM_PI_SQUARED


# ---- Exact gradients of the tiny model: the model and a pool

def load_model(model_dir=""):
    """(model, tokenizer, folder) saved in model_dir; empty: the default run's warmed-up tiny model
    (options.load builds it and caches it under runs/_cache when it is not there yet)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if not model_dir:
        model_dir = options.load(train.Config(out=str(ROOT / "runs")), torch.device("cpu"))[2]["path"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # no dropout
    return model, AutoTokenizer.from_pretrained(model_dir), Path(model_dir)


def subset(ro, rows):
    """The rows ``rows`` of a Rollout, responses trimmed after their last valid token (a tool's
    output inside a response is kept: it is context for the tokens after it)."""
    rows = torch.as_tensor(rows)
    T = int(tasks.last_valid(ro.response_mask[rows]).max()) + 1
    return rollout.Rollout(prompt_ids=ro.prompt_ids[rows], prompt_mask=ro.prompt_mask[rows],
                           response=ro.response[rows, :T], response_mask=ro.response_mask[rows, :T],
                           group_index=ro.group_index[rows], logp=ro.logp[rows, :T],
                           finished=ro.finished[rows])


def draw_pool(model, tok, task, prompts, answers, size, seed, max_new, temperature, sample=rollout.sample):
    """``size`` responses to every prompt (the sampler's generator seeded with ``seed`` on the model's
    device, the task's tool and stop rule if it has them, as train.py samples) and their rewards:
    (Rollout, tasks.rewards(...)). ``sample``: rollout.sample, or lab/fast_decode.py's sample (the same
    tokens from a compiled decode step, for a GPU)."""
    device = next(model.parameters()).device
    ro = sample(model, prompts, group_size=size, max_new_tokens=max_new, temperature=temperature,
                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        generator=torch.Generator(device).manual_seed(seed), tool=task.tool(tok),
                        stop=task.stop_rule(tok, answers, size))
    ro = rollout.Rollout(**{k: v.cpu() if torch.is_tensor(v) else v for k, v in vars(ro).items()})
    return ro, tasks.rewards(task, tok, ro, answers, size)


# ---- Exact gradients and their variance

def flatten(grads):
    """The gradient as it is: every parameter's, concatenated, (D,)."""
    return torch.cat([g.reshape(-1) for g in grads])


def sketch(model, k, seed=0):
    """A fixed random projection P: R^D -> R^k of the model's gradients (a count sketch): coordinate i
    goes to one bucket h(i) with a random sign s_i, (P g)_j = sum_{h(i) = j} s_i g_i. The buckets are a
    random permutation cut into k equal parts (each holds ceil(D / k) coordinates or fewer).

        E <P a, P b> = <a, b>   for any fixed a, b (over the draw of P)

    because E s_i s_l = 0 for i != l: the cross terms vanish and the own terms are kept with weight 1
    (no 1/sqrt(k) is needed, unlike a dense Gaussian P, whose k x D matrix would not fit: 553 GB at
    k = 1024 for 135M parameters). So every inner product that scale_free.gram_stats takes (tr Var,
    ||E g||^2 from pairs of prompts, <E g, r>) is unbiased under the projection, and its relative error
    is about sqrt(2 / k) for a single squared norm, less for sums. One P for everything (seeded, drawn
    on the CPU so it is the same on every device).

    P g is computed as a scatter-add: each parameter's s_i g_i, read in memory order, is added into the
    k buckets h(i) (a k-vector stays in cache). Reading g through the permutation instead (a gather
    of D scattered values) gives the same P g but was 8 times slower on a CPU at SmolLM2's size
    (docs/cost.md). Its memory: h as int32 and s, 8 bytes per parameter. Returns
    ``project(grads) -> (k,)`` for weighted_score_gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    D, device = sum(p.numel() for p in params), params[0].device
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(D, generator=gen)  # coordinate perm[j] goes to bucket j // width
    sign = torch.randint(0, 2, (D,), generator=gen) * 2 - 1  # s_{perm[j]}
    width = -(-D // k)  # coordinates per bucket
    h = torch.empty(D, dtype=torch.int32)
    h[perm] = (torch.arange(D) // width).int()  # h(i), the bucket of coordinate i, (D,)
    s = torch.empty(D)
    s[perm] = sign.float()  # s_i, (D,)
    del perm, sign
    h, s = h.to(device), s.to(device)

    def project(grads):
        out, start = torch.zeros(k, device=device), 0  # P g, (k,)
        for g in grads:
            end = start + g.numel()
            out.index_add_(0, h[start:end], g.reshape(-1) * s[start:end])  # sum_{h(i) = j} s_i g_i
            start = end
        return out
    return project


def weighted_score_gradient(model, ro, rows, weights, temperature, project=flatten):
    """grad_theta sum_{i in rows} sum_t weights[i, t] log pi(y_t^i), flattened: (D,) (or projected: the
    (k,) of ``sketch``). One backward pass over the rows ``rows`` of ``ro`` alone; ``weights`` (B, T)
    covers all of ro's rows. Runs on the model's device; the result is on the CPU."""
    return weighted_score_gradients(model, ro, rows, [weights], temperature, project)[0]


def weighted_score_gradients(model, ro, rows, weights, temperature, project=flatten, timing=None):
    """``weighted_score_gradient`` for each of the (B, T) tensors in the list ``weights``, over one forward
    pass: the graph is kept between the backward passes, so each extra weighting costs a backward pass and
    not a forward. timing: a dict that collects the seconds of the forward ('forward') and of each
    backward (by its place in the list), or None. Returns a list of (D,) (or (k,)) on the CPU."""
    sub = subset(ro, rows)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    timing = {} if timing is None else timing

    def clock(key, started):  # the seconds since ``started``, once the device has finished
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timing[key] = timing.get(key, 0.0) + time.perf_counter() - started
    started = time.perf_counter()
    logp, _, _ = rollout.score(model, sub.prompt_ids.to(device), sub.prompt_mask.to(device),
                               sub.response.to(device), sub.response_mask.to(device),
                               temperature)  # log pi(y_t), (b, T'), keeps the graph
    clock("forward", started)
    out = []
    for k, weights_k in enumerate(weights):
        started = time.perf_counter()
        w = weights_k[torch.as_tensor(rows), :sub.response.shape[1]].to(device)  # (b, T')
        grads = torch.autograd.grad((w * logp).sum(), params, retain_graph=k + 1 < len(weights))
        out.append(project(grads).cpu())  # (D,) or (k,)
        clock(k, started)
    return out


def per_response_scores(model, ro, temperature, project=flatten):
    """S_i = grad_theta log pi(tau_i) = grad sum_t log pi(y_t^i) for every row: (B, D) (projected: (B, k))."""
    return response_scores(model, ro, temperature, project)[0]


def response_scores(model, ro, temperature, project=flatten):
    """(S_i for every row, (B, D) or projected (B, k); ||S_i||^2 of the full, unprojected gradient, (B,)
    float64): one backward pass per response. The squared norm is the exact energy of the classic
    sequence-level optimal baseline (otb.sequence_optimal_baseline, eq. 9)."""
    norms = []

    def keep_norm(grads):  # ||S_i||^2 from the full gradient, then the projection
        norms.append(sum(g.double().square().sum() for g in grads).item())
        return project(grads)
    S = torch.stack([weighted_score_gradient(model, ro, [i], ro.response_mask, temperature, keep_norm)
                     for i in range(len(ro.response))])
    return S, torch.tensor(norms, dtype=torch.float64)


SEQUENCE_ENERGIES = {  # the sequence-level optimal baseline, otb eq. (9), with another energy than OPO's length
    "seq_proxy": ("proxy", False),  # e_j = W_T^j, OTB's proxy energy of the whole response, own row in
    "seq_proxy_loo": ("proxy", True),  # the same over the rows j != i
    "seq_exact": ("exact", False),  # e_j = ||S_j||^2 of the full gradient (response_scores), own row in
    "seq_exact_loo": ("exact", True),
}


def proxy_energy(log_probs, sum_pi_sq, response_mask):
    """W_T = sum_t w_t m_t, OTB's realized energy of each whole response (eqs. 3 and 7 of otb.py), (B,)."""
    w = otb.token_energy(log_probs, sum_pi_sq)  # w_t, (B, T)
    return torch.where(torch.as_tensor(response_mask) > 0, w, 0.0).sum(-1)  # W_T, (B,)


def advantages(name, token_rewards, response_mask, group_index, log_probs, sum_pi_sq, exact_energy=None):
    """A_t (B, T) of ``otb.ESTIMATORS[name]``, or of eq. (9) with the energy that ``SEQUENCE_ENERGIES[name]``
    names: the proxy W_T = sum_t w_t m_t (eq. 7, from the forward pass) or ``exact_energy``, ||S_i||^2 (B,)."""
    if name not in SEQUENCE_ENERGIES:
        return otb.ESTIMATORS[name](token_rewards=token_rewards, response_mask=response_mask, group_index=group_index,
                                    log_probs=log_probs, sum_pi_sq=sum_pi_sq)[0]
    kind, loo = SEQUENCE_ENERGIES[name]
    energy = proxy_energy(log_probs, sum_pi_sq, response_mask) if kind == "proxy" else exact_energy  # (B,)
    return otb.sequence_optimal_baseline(token_rewards, response_mask, group_index, energy, leave_one_out=loo)[0]


def is_sequence_level(adv, mask):
    """True when every row's advantage is one number over its valid tokens."""
    first = adv[:, :1]  # (B, 1)
    return bool(torch.allclose(adv * mask, first * mask, rtol=0, atol=1e-7))


def group_gradients(model, ro, groups, adv, temperature, S=None, project=flatten):
    """g_k of eq. (1) for the (K, N) row indices ``groups``: (K, D). With S (B, D) and a
    sequence-level advantage, (1/N) sum_i A_i S_i; otherwise one backward pass per group. A projection
    is linear, so with projected S and the same ``project`` both ways give P g_k, (K, k)."""
    N = groups.shape[1]
    if S is not None and is_sequence_level(adv, ro.response_mask):
        A = adv[:, 0]  # A_i, (B,)
        return torch.stack([(A[g, None] * S[g]).sum(0) / N for g in groups])  # (K, D)
    return token_group_gradients(model, ro, groups, [adv], temperature, project)[0]


def token_group_gradients(model, ro, groups, advs, temperature, project=flatten, timing=None):
    """g_k of eq. (1) for several token-level advantages (a list of (B, T)) on the same (K, N) groups: one
    forward pass per group and one backward pass per advantage (``weighted_score_gradients``). Returns a
    list of (K, D) (or (K, k)), in the order of ``advs``; timing as weighted_score_gradients'."""
    N = groups.shape[1]
    w = [adv / N for adv in advs]  # the weights of eq. (1), (B, T) each
    per_group = [weighted_score_gradients(model, ro, g, w, temperature, project, timing) for g in groups]
    return [torch.stack([gk[a] for gk in per_group]) for a in range(len(advs))]  # (K, D) each


def group_ids_of(groups, M):
    """(K, N) disjoint row indices of M rows -> the group id of each row, (M,)."""
    gid = torch.empty(M, dtype=torch.long)
    gid[groups.reshape(-1)] = torch.arange(len(groups)).repeat_interleave(groups.shape[1])
    return gid


def reference_gradient(model, ro, token_rewards, rows, temperature, parts=4, project=flatten):
    """One prompt's policy gradient, unbiased, from its responses ``rows`` of a separate pool: RLOO
    inside ``parts`` disjoint sub-pools. Returns (the mean of the parts (D,) or (k,), its variance)."""
    sub = subset(ro, rows)
    r, m = token_rewards[rows, :sub.response.shape[1]], sub.response_mask  # (M, T)
    M = len(rows)
    part = torch.arange(parts).repeat_interleave(M // parts)  # sub-pool of each row, (M,)
    adv, _ = otb.rloo(r, m, part)  # A_i, (M, T)
    w = adv * parts / M  # a part's gradient: the mean of A_i S_i over its M / parts rows
    est = torch.stack([weighted_score_gradient(model, sub, (part == k).nonzero()[:, 0], w, temperature, project)
                       for k in range(parts)])  # (parts, D)
    mean, var, _ = scale_free.unit_summary(est)  # var: tr Var of one part, eq. (2)
    return mean, var / parts
