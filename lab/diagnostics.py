"""How noisy is one batch's policy gradient? Forward-only diagnostics in proxy units.

A training step logs two numbers besides the loss: the "total power" of the per-response
gradients and the "pure noise" left in their batch mean. Both come from the forward pass alone,
through the Logit-Gradient Proxy of ``otb.py`` (eq. (7) there): the score of token t with
respect to the logits at its own position is

    d log pi(y_t | context) / d z = e_{y_t} - pi_t,      ||e_{y_t} - pi_t||^2 = w_t.

The proxy treats the logits at each distinct context (prompt, y_<t) as parameters of their own.
The policy-gradient contribution of response i is then g_i = sum_t A_t (e_{y_t} - pi_t), one
block per position, and in these units:

1. Per-response power (``gradient_power``). The positions of one response are distinct
   contexts, so the blocks do not overlap and

       P_i = ||g_i||^2 = sum_t w_t A_t^2,

   which is W(tau) A^2 when A is constant over the response. The batch mean of P_i is the
   total power; its expectation is ||E g||^2 + tr Var(g).

2. The batch-mean gradient (``mean_gradient_sq_norm``), ||(1/B) sum_i g_i||^2. Responses that
   share a context (every row of a group at t = 0, and longer while they agree) add into the
   same block. At one context, with c_k the sum of A over the rows that sampled token k there
   and S = sum_k c_k,

       ||c - S pi||^2 = sum_k c_k^2 - 2 S sum_k c_k pi_k + S^2 sum_k pi_k^2.

   Its expectation is ||E g||^2 + tr Var(g) / B.

3. Pure noise (``noise_diagnostics``): (total power - ||mean g||^2) / (B - 1), an unbiased
   estimate of tr Var(g) / B, the noise left in the batch-mean gradient.

Departures: these are proxy units. The proxy is exact for the gradient with respect to the
logits and ignores the hidden-state factor and all earlier layers, so the numbers track the true
parameter-gradient quantities only up to that factor (``benchmarks/grad_variance.py`` compares
them with exact per-sample gradients).
"""
from functools import partial

import torch

import otb


def gradient_power(advantages, response_mask, log_probs, sum_pi_sq):
    """P_i = sum_t w_t A_t^2 m_t: the proxy of ||g(tau_i)||^2, (B, T) -> (B,)."""
    valid = torch.as_tensor(response_mask).bool()  # m_t, (B, T)
    w = otb.token_energy(log_probs, sum_pi_sq)  # w_t, (B, T)
    A = torch.as_tensor(advantages).to(w.dtype)  # A_t, (B, T)
    return torch.where(valid, w * A ** 2, 0.0).sum(-1)  # P_i, (B,)


def context_ids(response, response_mask, group_index):
    """An integer per (row, position) naming its context (prompt, y_<t), (B, T).

    Two entries get the same id exactly when their rows are in the same group and agree on every
    token before t. Each row is the key (group, y_0, ..., y_{T-1}); the rows are sorted by it,
    lexicographically, once. In that order the rows that share a context at t are consecutive (a
    shared prefix sorts together), so the context of a row is new at t exactly when its first t + 1
    keys differ from the row above it, and numbering the contexts of position t is a running count
    of those changes down the sorted rows: the id is the context's rank among that position's
    contexts, in [0, B). One sort and one cumulative sum for all positions, whatever the prefixes.
    A tool's output inside a response (mask 0 before the row's last valid token) is not an action
    but is part of the context of every token after it. Padded positions get ids too; they are
    never used.
    """
    B, T = response.shape
    gid, _ = otb.group_ids(group_index, B)
    m = torch.as_tensor(response_mask).bool()  # (B, T)
    padding = m.flip(-1).cumsum(-1).flip(-1) == 0  # no valid token at or after t, (B, T)
    tokens = torch.where(padding, 0, response)  # y_t, tool output kept, 0 on padding
    keys = torch.cat([gid.to(response.device)[:, None], tokens], dim=1)  # (group, y_0, ..., y_{T-1}), (B, 1 + T)
    rank = torch.unique(keys, dim=0, return_inverse=True)[1]  # rows sorted lexicographically, (B,)
    order = torch.sort(rank, stable=True).indices  # (B,)
    k = keys[order]  # the sorted rows, (B, 1 + T)
    new = (k[1:] != k[:-1]).cumsum(-1)[:, :T] > 0  # context at t differs from the row above's, (B - 1, T)
    sorted_ids = torch.cat([new.new_zeros(1, T), new]).long().cumsum(0)  # rank of the context at t, (B, T)
    ids = torch.empty_like(sorted_ids).index_copy_(0, order, sorted_ids)  # back to the rows' order
    # every position's ids lie in [0, B): shifting position t by t * B makes them distinct across positions
    return ids + B * torch.arange(T, device=response.device)  # (B, T)


def mean_gradient_sq_norm(response, response_mask, group_index, adv, logp, sum_pi_sq):
    """||(1/B) sum_i g_i||^2 in the units of the Logit-Gradient Proxy; forward-only.

    Per context c (see context_ids), with c_k the sum of A over the rows that sampled token k
    there and S_c = sum_k c_k, the block of the summed gradient is c - S_c pi and

        ||c - S_c pi||^2 = sum_k c_k^2 + S_c sum_{rows at c} A (sum_k pi_k^2 - 2 pi(y)),

    using that the rows at one context share pi: sum_k c_k pi_k = sum_rows A pi(y) and
    S_c^2 sum pi^2 = S_c sum_rows A sum pi^2. With a single row this is w_t A_t^2, the term of
    gradient_power. Inputs (B, T) right-padded, with holes allowed (mask 0 on tool output inside a
    response); group_index: one prompt id per row. Returns a float.
    """
    valid = torch.as_tensor(response_mask).bool()  # (B, T)
    B = len(valid)
    if not valid.any():
        return 0.0
    ctx = context_ids(response, valid, group_index)[valid]  # context of each valid token, (n,)
    y = response[valid]  # sampled token, (n,)
    A = adv.double()[valid]  # A_t, (n,)
    pi_y, p2 = logp.double().exp()[valid], sum_pi_sq.double()[valid]  # pi(y_t), sum_k pi_k^2, (n,)

    n_ctx = valid.numel()  # context ids lie in [0, B T)
    zeros = partial(torch.zeros, dtype=A.dtype, device=A.device)
    S = zeros(n_ctx).index_add_(0, ctx, A)  # S_c
    Q = zeros(n_ctx).index_add_(0, ctx, A * (p2 - 2 * pi_y))  # sum_rows A (sum pi^2 - 2 pi(y))
    pair = torch.unique(ctx * (int(y.max()) + 1) + y, return_inverse=True)[1]  # (context, token) id, (n,)
    c = zeros(len(A)).index_add_(0, pair, A)  # c_k, one per (context, token)
    return ((c ** 2).sum() + (S * Q).sum()).item() / B ** 2


def noise_diagnostics(power, mean_grad_sq_norm):
    """total_power = mean_i P_i; pure_noise = (total_power - ||mean g||^2) / (N - 1).

    E[total_power] = ||E g||^2 + tr Var(g) and E||mean g||^2 = ||E g||^2 + tr Var(g) / N,
    so pure_noise estimates tr Var(g) / N, the noise left in the batch-mean gradient.
    """
    n = power.numel()
    total_power = power.mean().item()
    pure_noise = (total_power - float(mean_grad_sq_norm)) / (n - 1) if n > 1 else float("nan")
    return {"total_power": total_power, "pure_noise": pure_noise}
