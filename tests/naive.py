"""Naive references: the estimators and diagnostics written as plainly as possible.

Tier 2 of the house testing ladder compares every vectorised function with one of these. They are
plain Python loops over rows, positions and groups, in float64, straight from the formulas:

    G_t = sum_{u>=t} r_u                      returns (reward-to-go)
    w_t = clamp(1 - 2 pi(y_t) + sum_k pi_k^2, 0, 2) * rho_t^2
    W_t = sum_{j<=t} w_j
    B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + eps)     over the rows i of the group
    A_t = G_t - B_t

- ``naive_otb``, ``naive_scores``: loops over rows and positions (OTB; REINFORCE, group mean,
  GRPO, RLOO);
- ``naive_otb_by_action``: OTB aligned by the policy's own tokens (``otb_tir``): each row's list of
  valid positions, and the group's rows compared at their k-th valid token;
- ``loop_reference``: OTB with a Python loop over groups, the shape of the widely used
  implementation (``benchmarks/bench_estimators.py`` times ``otb.py`` against it);
- ``naive_mean_gradient_sq_norm``: the proxy-unit ||mean g||^2 with a dict keyed by whole
  prefixes (quadratic in the response length, so only for tests);
- ``make_batch``: random right-padded batches of interleaved groups to compare them on;
  ``insert_holes``: the same batch with tool output (mask 0) inserted inside the responses.

Benchmarks may import this module; it imports nothing from them.
"""
import math
from collections import defaultdict

import numpy as np
import torch


def naive_otb(r, m, gid, lp, spi, isw=None, leave_one_out=False, zero_tail=False, eps=1e-8):
    """Returns (A, G) as float64 numpy arrays. Inputs: nested sequences / arrays (B, T)."""
    n_rows, n_pos = len(r), len(r[0])
    G = np.zeros((n_rows, n_pos))
    W = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        acc = 0.0
        for t in reversed(range(n_pos)):  # G_t = sum_{u >= t} r_u over valid u
            if m[i][t]:
                acc += float(r[i][t])
                G[i, t] = acc
        acc = 0.0
        for t in range(n_pos):  # W_t = sum_{j <= t} w_j
            if m[i][t]:
                w = 1.0 - 2.0 * math.exp(float(lp[i][t])) + float(spi[i][t])
                w = min(max(w, 0.0), 2.0)
                if isw is not None:
                    w *= float(isw[i][t]) ** 2
                acc += w
                W[i, t] = acc
    A = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        group = [j for j in range(n_rows) if gid[j] == gid[i]]
        for t in range(n_pos):
            if not m[i][t]:
                continue
            active = [j for j in group if m[j][t]]
            used = [j for j in active if not (leave_one_out and j == i)]
            if len(group) == 1 or not used or (zero_tail and len(active) == 1):
                b = 0.0
            else:
                b = sum(G[j, t] * W[j, t] for j in used) / (sum(W[j, t] for j in used) + eps)
            A[i, t] = G[i, t] - b
    return A, G


def naive_otb_by_action(r, m, gid, lp, spi, isw=None, leave_one_out=False, zero_tail=False, eps=1e-8):
    """OTB over k, the index among a row's valid tokens; returns (A, G) as float64 arrays (B, T).

    G_k, W_k are sums over the row's valid tokens; B_k pools the rows of the group that have a k-th
    valid token; A goes to the position of the row's k-th valid token, 0 elsewhere.
    """
    n_rows, n_pos = len(r), len(r[0])
    acts = [[t for t in range(n_pos) if m[i][t]] for i in range(n_rows)]  # each row's valid positions
    G, W = [], []  # per row, one value per action k
    for i in range(n_rows):
        w = [min(max(1.0 - 2.0 * math.exp(float(lp[i][t])) + float(spi[i][t]), 0.0), 2.0)
             * (1.0 if isw is None else float(isw[i][t]) ** 2) for t in acts[i]]
        G.append([sum(float(r[i][t]) for t in acts[i][k:]) for k in range(len(acts[i]))])
        W.append([sum(w[:k + 1]) for k in range(len(acts[i]))])
    A, G_out = np.zeros((n_rows, n_pos)), np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        group = [j for j in range(n_rows) if gid[j] == gid[i]]
        for k, t in enumerate(acts[i]):
            active = [j for j in group if len(acts[j]) > k]
            used = [j for j in active if not (leave_one_out and j == i)]
            if len(group) == 1 or not used or (zero_tail and len(active) == 1):
                b = 0.0
            else:
                b = sum(G[j][k] * W[j][k] for j in used) / (sum(W[j][k] for j in used) + eps)
            A[i, t], G_out[i, t] = G[i][k] - b, G[i][k]
    return A, G_out


def naive_scores(r, m, gid, kind):
    """Per-sequence estimators, broadcast over valid tokens. Returns (A, R broadcast)."""
    n_rows, n_pos = len(r), len(r[0])
    score = [sum(float(r[i][t]) for t in range(n_pos) if m[i][t]) for i in range(n_rows)]
    A = np.zeros((n_rows, n_pos))
    R = np.zeros((n_rows, n_pos))
    for i in range(n_rows):
        others = [score[j] for j in range(n_rows) if gid[j] == gid[i] and j != i]
        group = others + [score[i]]
        n = len(group)
        if kind == "reinforce":
            a = score[i]
        elif kind == "group_mean":
            a = score[i] - (sum(group) / n if n > 1 else 0.0)
        elif kind == "grpo":
            if n == 1:
                mean, std = 0.0, 1.0
            else:
                mean = sum(group) / n
                std = math.sqrt(sum((s - mean) ** 2 for s in group) / (n - 1))
            a = (score[i] - mean) / (std + 1e-6)
        elif kind == "rloo":
            a = score[i] - (sum(others) / len(others) if others else 0.0)
        for t in range(n_pos):
            if m[i][t]:
                A[i, t] = a
                R[i, t] = score[i]
    return A, R


def loop_reference(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, eps=1e-8):
    """OTB with a Python loop over groups: the shape of the widely used implementation.

    Same maths as otb.optimal_token_baseline with its defaults (no importance weights, no zero
    tail, own row included, singleton groups get B = 0). Returns (advantages, returns), (B, T).
    """
    m = response_mask.to(token_rewards.dtype)  # (B, T)
    G = torch.flip(torch.cumsum(torch.flip(token_rewards * m, [-1]), -1), [-1]) * m  # G_t
    w = (1 - 2 * log_probs.exp() + sum_pi_sq).clamp(0, 2)  # w_t
    W = torch.cumsum(w * m, -1) * m  # W_t
    rows_of = defaultdict(list)  # prompt id -> its rows
    for row, uid in enumerate(group_index.tolist()):
        rows_of[uid].append(row)
    B = torch.zeros_like(G)  # B_t
    for rows in rows_of.values():
        if len(rows) == 1:
            continue  # singleton: B = 0
        idx = torch.tensor(rows, device=G.device)
        Gg, Wg = G[idx], W[idx]  # (n, T)
        B[idx] = ((Gg * Wg).sum(0) / (Wg.sum(0) + eps)).expand_as(Gg)
    return (G - B) * m, G


def naive_mean_gradient_sq_norm(response, response_mask, group_index, adv, logp, sum_pi_sq):
    """||(1/B) sum_i g_i||^2 in proxy units, one context (group, whole prefix tuple) at a time.

    Every valid token counts, with everything before it as its context (tool output included).

    For each context, with c_k the sum of A over the rows that sampled token k there and
    S = sum_k c_k: ||c - S pi||^2 = sum_k c_k^2 - 2 S sum_rows A pi(y) + S^2 sum_k pi_k^2, with
    sum pi^2 taken from the first row that reaches the context.
    """
    pi = torch.as_tensor(logp).double().exp()
    A, pi_y, spp = (torch.as_tensor(x).double().tolist() for x in (adv, pi, sum_pi_sq))
    rows, mask = torch.as_tensor(response).tolist(), torch.as_tensor(response_mask).tolist()
    group_index = group_index.tolist() if isinstance(group_index, torch.Tensor) else list(group_index)
    nodes = {}  # (group, prefix) -> [{token: c_k}, S, sum A pi(y), sum pi^2]
    for i, (row, valid) in enumerate(zip(rows, mask)):
        for t in (t for t in range(len(row)) if valid[t]):  # the prefix keeps tool output (holes)
            node = nodes.setdefault((group_index[i], tuple(row[:t])), [{}, 0.0, 0.0, spp[i][t]])
            node[0][row[t]] = node[0].get(row[t], 0.0) + A[i][t]
            node[1] += A[i][t]
            node[2] += A[i][t] * pi_y[i][t]
    total = sum(sum(c * c for c in cs.values()) - 2 * S * a_pi + S * S * p2 for cs, S, a_pi, p2 in nodes.values())
    return total / len(rows) ** 2


# (log pi_y, sum pi^2) pairs for which the raw 1 - 2 pi + sum pi^2 is either clearly negative
# (clamped to 0) or >= 0.1: exercises the clamp without creating near-zero denominators.
_LP_CHOICES = np.log([0.9, 0.5, 0.1, 1.0])
_SPI_CHOICES = np.array([0.1, 0.5, 0.9])


def make_batch(seed, sizes, n_pos, *, process=False, consistent=True, with_isw=False,
               equal_lengths=False, reward_scale=1.0):
    """A right-padded batch of interleaved groups; numpy float64 arrays plus a list of ids."""
    rng = np.random.default_rng(seed)
    gid = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(gid)  # interleave the groups
    n_rows = len(gid)
    lengths = np.full(n_rows, n_pos) if equal_lengths else rng.integers(1, n_pos + 1, n_rows)
    m = (np.arange(n_pos)[None, :] < lengths[:, None]).astype(np.float64)  # (B, T)
    r = np.zeros((n_rows, n_pos))
    r[np.arange(n_rows), lengths - 1] = reward_scale * rng.choice([0.0, 1.0, -0.5, 2.0], n_rows)
    if process:  # sparse per-token rewards at a few valid positions
        extra = (rng.random((n_rows, n_pos)) < 0.3) * rng.normal(size=(n_rows, n_pos))
        r += extra * m
    if consistent:  # from real softmaxes of random logits
        logits = rng.normal(size=(n_rows, n_pos, 5)) * rng.choice([0.3, 1.0, 3.0])
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        tok = rng.integers(0, 5, (n_rows, n_pos))
        lp = np.take_along_axis(logp, tok[..., None], -1)[..., 0]
        spi = (np.exp(logp) ** 2).sum(-1)
    else:
        lp = rng.choice(_LP_CHOICES, (n_rows, n_pos))
        spi = rng.choice(_SPI_CHOICES, (n_rows, n_pos))
    isw = rng.uniform(0.5, 1.5, (n_rows, n_pos)) if with_isw else None
    return dict(r=r, m=m, gid=[f"prompt-{g}" for g in gid], lp=lp, spi=spi, isw=isw)


def insert_holes(b, seed, max_hole=3):
    """The batch b of make_batch with holes: tool output (mask 0) inserted inside the responses.

    Before each valid token, with probability 1/2, 1..max_hole positions of mask 0 are inserted;
    they hold garbage (NaN log-probs and sum pi^2, reward 7). Returns (holes, where):
    the new batch (same keys, T grown to fit) and, per row, the new position of each old one.
    """
    rng = np.random.default_rng(seed)
    n_rows, n_pos = b["m"].shape
    where = np.zeros((n_rows, n_pos), dtype=int)
    for i in range(n_rows):
        gaps = rng.integers(1, max_hole + 1, n_pos) * (rng.random(n_pos) < 0.5) * (b["m"][i] > 0)
        where[i] = np.arange(n_pos) + np.cumsum(gaps)
    T = int(where.max()) + 1
    fill = dict(r=7.0, m=0.0, lp=np.nan, spi=np.nan, isw=np.nan)
    holes = dict(gid=b["gid"])
    for k, v in fill.items():
        if b[k] is None:
            holes[k] = None
            continue
        holes[k] = np.full((n_rows, T), v)
        np.put_along_axis(holes[k], where, b[k], axis=1)
    return holes, where
