"""The Optimal Token Baseline (OTB), the Logit-Gradient Proxy and the group baselines.

Pure tensor functions, no classes. Everything takes right-padded (B, T) tensors:
B rows (responses), T response positions, ``response_mask`` 1 on valid tokens.

The story
---------
REINFORCE estimates the policy gradient from one sampled response tau as

    g(tau) = R(tau) * S(tau),    S(tau) = sum_t s_t,    s_t = grad log pi(y_t | x, y_<t).

Subtracting a baseline that does not depend on the sampled action keeps it unbiased and can
cut its variance a lot. Group baselines (GRPO, Dr.GRPO, RLOO) compare each response with the
other N - 1 responses to the same prompt and give *one* number per response.

OTB gives one baseline per token position t. With the reward-to-go G_t and the per-token
squared score norm w_t,

    G_t  = sum_{u >= t} r_u                     (1) reward-to-go
    w_t  = ||s_t||^2                            (2) token energy
    W_t  = sum_{j <= t} w_j                     (3) realized energy up to t
    B*_t = E[G_t W_t] / E[W_t]                  (4) optimal token baseline
    A_t  = G_t - B*_t                           (5) advantage

Where (4) comes from: the minimum-variance constant baseline for the estimator (G_t - b) S_<=t
is E[||S_<=t||^2 G_t] / E[||S_<=t||^2] (set the derivative of the variance to zero). Per-token
scores are martingale differences, E[s_j | y_<j] = 0, so E||S_<=t||^2 = E[sum_{j<=t} ||s_j||^2]
= E[W_t] exactly; using W_t inside the reward-weighted expectation too is the approximation
that makes (4) computable. ``toy_env.py`` checks both statements with exact numbers.

The expectations in (4) are estimated over the N responses of the group, counting only rows
still active at t (padding never enters the average):

    B_t = sum_i G_t^i W_t^i m_t^i / (sum_i W_t^i m_t^i + eps)           (6)

The Logit-Gradient Proxy. w_t needs a backward pass per token. For a softmax over logits z,
d log softmax(z)_y / dz = e_y - pi, so the squared gradient norm *with respect to that
position's logits* is

    ||e_y - pi||^2 = 1 - 2 pi(y) + sum_k pi_k^2                         (7)

which needs only the forward pass. sum_k pi_k^2 = exp(logsumexp(2z) - 2 logsumexp(z)).
(7) is exact for the logits and a proxy for the full parameter gradient (it ignores the
hidden-state factor and all earlier layers). Mathematically 0 <= w_t <= 2.

Departures and choices (all matching the widely used verl implementation unless noted)
- The row's own return is inside its baseline (6): biased by O(1/N), like GRPO's mean.
  ``leave_one_out=True`` drops the row's own term: unbiased; B = 0 where no other row of the
  group is active. (This variant is ours; verl has no leave-one-out OTB.)
- Singleton groups get B = 0 (the advantage is the return itself).
- Importance weights rho_t (``is_weights``) multiply w_t by rho_t^2.
- ``zero_tail=True``: where only one row of a group is still active its baseline would be its
  own return (advantage ~ 0); zero tail sets B = 0 there instead.
- w_t is clamped to [0, 2]: rounding can push (7) a hair below 0 for confident tokens.
- sum pi^2 is computed in float32 even for bf16 logits (float64 stays float64): in bf16 the
  difference in (7) can go negative.

Diagnostics. With the proxy, ||g(tau)||^2 ~ sum_t w_t A_t^2 (cross terms vanish in
expectation), which is W(tau) A^2 when A is constant over the response. Its batch mean is the
"total power"; subtracting the squared norm of the batch-mean gradient (in the same proxy
units, ``mean_gradient_sq_norm``) and dividing by N - 1 gives "pure noise", an estimate of the
variance of the batch-mean gradient.
"""
from functools import partial

import torch

# =====================================================================================
# Input checks: every public function fails early, naming the argument and the problem.
# =====================================================================================

LOG_PROB_TOLERANCE = 1e-4  # log-probs a hair above 0 are float rounding, not a bug


def _as_2d(name, x):
    x = torch.as_tensor(x)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch, length), got shape {tuple(x.shape)}")
    return x


def _check_inputs(token_rewards, response_mask, group_index, **extra):
    """Validate the (B, T) inputs; returns (rewards, valid, m, gid, n_groups, extra tensors).

    m is the mask as 0/1 floats in the working dtype (float64 if the rewards are, else float32).
    The common case (everything fine) costs a few reductions and no (B, T) temporaries; the
    search for the offending position only runs when a reduction says something is wrong.
    """
    token_rewards = _as_2d("token_rewards", token_rewards)
    response_mask = _as_2d("response_mask", response_mask)
    shape = tuple(token_rewards.shape)
    if 0 in shape:
        raise ValueError(f"empty batch: token_rewards has shape {shape}")
    tensors = {k: _as_2d(k, v) for k, v in extra.items() if v is not None}
    for name, x in [("response_mask", response_mask)] + list(tensors.items()):
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)} but token_rewards has shape {shape}")
    if response_mask.dtype != torch.bool:
        # All 0/1 exactly when every non-zero entry equals 1 (counts, no float temporaries).
        if torch.count_nonzero(response_mask) != torch.count_nonzero(response_mask == 1):
            bad = response_mask[(response_mask != 0) & (response_mask != 1)][0].item()
            raise ValueError(f"response_mask must contain only 0 and 1, found {bad}")
    valid = response_mask.bool()  # (B, T)
    for name, x in [("token_rewards", token_rewards)] + list(tensors.items()):
        if not torch.isfinite(x.sum()):  # fast path: a finite sum means finite entries
            nonfinite = ~torch.isfinite(x) & valid
            if nonfinite.any():
                i, t = nonfinite.nonzero()[0].tolist()
                raise ValueError(f"{name} has a non-finite value ({x[i, t].item()}) "
                                 f"at valid position ({i}, {t})")
    if "log_probs" in tensors and tensors["log_probs"].max() > LOG_PROB_TOLERANCE:
        too_big = (tensors["log_probs"] > LOG_PROB_TOLERANCE) & valid
        if too_big.any():
            i, t = too_big.nonzero()[0].tolist()
            raise ValueError(f"log_probs must be <= 0, found {tensors['log_probs'][i, t].item():.6g} "
                             f"at valid position ({i}, {t})")
    dtype = torch.float64 if token_rewards.dtype == torch.float64 else torch.float32
    m = response_mask if response_mask.dtype == dtype else valid.to(dtype)  # m_t, 0/1, (B, T)
    gid, n_groups = group_ids(group_index, shape[0])
    return token_rewards, valid, m, gid.to(token_rewards.device), n_groups, {k: tensors.get(k) for k in extra}


def _zero_padding(x, valid, m, inplace=False):
    """x with padded positions set to 0 (in place when ``inplace``, else as a new tensor).

    Padding may hold anything, NaN included; multiplying by m is the fast way but keeps NaN as
    NaN, so the slower masked fill is used only when x is not finite everywhere.
    """
    if torch.isfinite(x.sum()):
        return x.mul_(m) if inplace else x * m
    return x.masked_fill_(~valid, 0.0) if inplace else x.masked_fill(~valid, 0.0)


def group_ids(group_index, batch):
    """Map one prompt id per row (any hashables, or an integer tensor) to ids 0..n_groups-1.

    Returns (gid, n_groups) with gid a (B,) long tensor. Groups may be interleaved.
    """
    if isinstance(group_index, torch.Tensor):
        if group_index.dim() != 1 or group_index.is_floating_point():
            raise ValueError(f"group_index must be a 1-D integer tensor or a sequence of ids, "
                             f"got a tensor of shape {tuple(group_index.shape)} and dtype {group_index.dtype}")
        if len(group_index) != batch:
            raise ValueError(f"group_index has {len(group_index)} entries but the batch has {batch} rows")
        uniq, gid = torch.unique(group_index, return_inverse=True)
        return gid.long(), len(uniq)
    ids = list(group_index)
    if len(ids) != batch:
        raise ValueError(f"group_index has {len(ids)} entries but the batch has {batch} rows")
    first_seen = {}
    gid = [first_seen.setdefault(g, len(first_seen)) for g in ids]  # id encoding, not the estimator
    return torch.tensor(gid, dtype=torch.long), len(first_seen)


def _group_sum(x, gid, n_groups):
    """Sum rows of x (B, ...) into their groups: (n_groups, ...). No loop over groups."""
    out = torch.zeros((n_groups,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    return out.index_add_(0, gid, x)


# =====================================================================================
# The Logit-Gradient Proxy, eq. (7)
# =====================================================================================

def _sum_pi_squared_dense(z):
    """exp(logsumexp(2z) - 2 logsumexp(z)) over the last dimension, (..., V) -> (...).

    Shifting z by its max changes neither logsumexp difference, and then the expression is
    sum_k e_k^2 / (sum_k e_k)^2 with e_k = exp(z_k - max z) in (0, 1]: both sums lie in
    [1, V], so nothing overflows, and there is no subtraction of two large logsumexps to lose
    float32 digits (LM logits often sit around +40). One exp pass, one sum and one dot product.
    """
    e = (z - z.amax(dim=-1, keepdim=True)).exp_()  # e_k = exp(z_k - max z), (..., V)
    return torch.linalg.vecdot(e, e) / e.sum(dim=-1).square()  # sum e^2 / (sum e)^2


CPU_CHUNK_LOGITS = 2 ** 20  # logits per chunk on a CPU when chunk_size is None (4 MB in float32)


def sum_pi_squared(logits, chunk_size=None):
    """sum_k softmax(z)_k^2 over the last dimension, computed stably in float32.

    Uses exp(logsumexp(2z) - 2 logsumexp(z)), evaluated after shifting z by its max (see
    _sum_pi_squared_dense). float64 input stays float64; every other dtype (bf16, fp16, fp32)
    is computed and returned in float32. Shape: (..., V) -> (...).

    The logit vectors (rows of the (N, V) view) are processed ``chunk_size`` rows at a time, so
    the temporaries are bounded by one chunk instead of the whole (B, T, V) tensor. None means
    all at once on a GPU, and chunks of about CPU_CHUNK_LOGITS logits on a CPU, where small
    temporaries that the allocator reuses are ~3x faster than fresh full-size ones.
    (Non-contiguous logits are copied once to take the (N, V) view.)
    """
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    logits = torch.as_tensor(logits)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    V = logits.shape[-1]
    rows = logits.reshape(-1, V)  # one logit vector per row, (N, V)
    if chunk_size is None:
        chunk_size = len(rows) if logits.is_cuda else max(1, CPU_CHUNK_LOGITS // max(V, 1))
    out = torch.empty(len(rows), dtype=dtype, device=logits.device)  # (N,)
    for start in range(0, len(rows), chunk_size):  # a loop over memory chunks only
        out[start:start + chunk_size] = _sum_pi_squared_dense(rows[start:start + chunk_size].to(dtype))
    return out.reshape(logits.shape[:-1])


def token_energy(log_probs, sum_pi_sq):
    """w_t = 1 - 2 pi(y_t) + sum_k pi_k^2, eq. (7), clamped to [0, 2]. Same shape as inputs."""
    dtype = torch.float64 if torch.float64 in (log_probs.dtype, sum_pi_sq.dtype) else torch.float32
    pi_y = log_probs.to(dtype).exp()  # pi(y_t), a fresh tensor: the in-place ops below are safe
    return pi_y.mul_(-2.0).add_(sum_pi_sq.to(dtype)).add_(1.0).clamp_(0.0, 2.0)  # w_t


# =====================================================================================
# The Optimal Token Baseline, eqs. (1)-(6)
# =====================================================================================

def optimal_token_baseline(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, *,
                           is_weights=None, leave_one_out=False, zero_tail=False, eps=1e-8):
    """OTB advantages A_t = G_t - B_t, eq. (5), with B_t from eq. (6).

    token_rewards, response_mask, log_probs (of the sampled tokens), sum_pi_sq, is_weights:
    (B, T). group_index: one prompt id per row. Returns (advantages, returns), both (B, T),
    exactly 0 at padded positions.
    """
    r, valid, m, gid, n_groups, x = _check_inputs(token_rewards, response_mask, group_index,
                                                  log_probs=log_probs, sum_pi_sq=sum_pi_sq,
                                                  is_weights=is_weights)
    dtype = m.dtype  # float64 if the rewards are, else float32
    r = _zero_padding(r.to(dtype), valid, m)  # r_t, 0 on padding, (B, T)

    R = r.sum(-1, keepdim=True)  # R(tau) = sum_u r_u, (B, 1)
    G = r.cumsum(-1).neg_().add_(r).add_(R)  # G_t = R - sum_{u<t} r_u = sum_{u>=t} r_u, eq. (1)
    w = token_energy(x["log_probs"], x["sum_pi_sq"]).to(dtype)  # w_t, eq. (7), (B, T)
    if x["is_weights"] is not None:
        w.mul_(x["is_weights"].to(dtype) ** 2)  # w_t <- rho_t^2 w_t
    w = _zero_padding(w, valid, m, inplace=True)  # 0 on padding (w is our own tensor)
    Wm = w.cumsum_(-1).mul_(m)  # W_t = sum_{j<=t} w_j, eq. (3), times m_t, (B, T)
    # Fresh (B, T) buffers cost more than the arithmetic on a CPU, so the ones no longer needed
    # are reused: r's memory holds G W m, and after the group sums it holds B_t, then A_t.
    GWm = torch.mul(G, Wm, out=r)  # G_t W_t m_t, (B, T)

    if leave_one_out:  # sums over the *other* rows j != i of the group, (B, T)
        # "group total minus own term" cancels badly in float32 when one row's energy dwarfs
        # the others', so these sums are taken in float64.
        GWm64, Wm64 = GWm.double(), Wm.double()
        num = _group_sum(GWm64, gid, n_groups)[gid] - GWm64  # sum_j G W m
        den = (_group_sum(Wm64, gid, n_groups)[gid] - Wm64).clamp_(min=0.0)  # sum_j W m
        others = _group_sum(m, gid, n_groups)[gid] - m  # other rows active at t
        B = torch.where(others > 0, num / (den + eps), 0.0).to(dtype)  # B_t without row i
    else:  # the baseline is the same for every row of a group: compute it once per group
        num = _group_sum(GWm, gid, n_groups)  # sum_i G W m, (groups, T)
        den = _group_sum(Wm, gid, n_groups)  # sum_i W m, (groups, T)
        B_group = num / (den + eps)  # B_t, eq. (6), (groups, T)
        group_size = torch.bincount(gid, minlength=n_groups)  # rows per group, (groups,)
        B_group[group_size == 1] = 0.0  # singleton groups: B = 0
        if zero_tail:
            active = _group_sum(m, gid, n_groups)  # rows still active at t, (groups, T)
            B_group[active <= 1] = 0.0  # only one row left at t: B = 0
        B = torch.index_select(B_group, 0, gid, out=GWm)  # each row gets its group's B_t, (B, T)

    advantages = torch.sub(G, B, out=B).mul_(m)  # A_t = G_t - B_t, eq. (5), 0 on padding
    return advantages, G.mul_(m)


# =====================================================================================
# Group baselines: one number per response
# =====================================================================================

def _sequence_setup(token_rewards, response_mask, group_index):
    r, valid, m, gid, n_groups, _ = _check_inputs(token_rewards, response_mask, group_index)
    score = _zero_padding(r.to(m.dtype), valid, m).sum(-1)  # R(tau) = sum of valid rewards, (B,)
    size = torch.bincount(gid, minlength=n_groups).to(m.dtype)  # rows per group, (G,)
    return score, m, gid, n_groups, size


def _broadcast(adv, score, m):
    """Per-response advantage and score (B,) -> token level (B, T), 0 on padding."""
    return adv[:, None] * m, score[:, None] * m


def reinforce(token_rewards, response_mask, group_index, log_probs=None, sum_pi_sq=None):
    """No baseline: A = R(tau). (log_probs and sum_pi_sq are accepted and ignored.)"""
    score, m, _, _, _ = _sequence_setup(token_rewards, response_mask, group_index)
    return _broadcast(score, score, m)


def group_mean(token_rewards, response_mask, group_index, log_probs=None, sum_pi_sq=None):
    """Dr.GRPO: A = R - mean of the group's R (own row included). Singletons keep R."""
    score, m, gid, n, size = _sequence_setup(token_rewards, response_mask, group_index)
    mean = _group_sum(score, gid, n) / size  # group mean, (G,)
    mean = torch.where(size > 1, mean, 0.0)[gid]  # singleton: mean 0, (B,)
    return _broadcast(score - mean, score, m)


def grpo(token_rewards, response_mask, group_index, log_probs=None, sum_pi_sq=None):
    """GRPO: A = (R - mean) / (std + 1e-6), std with N - 1. Singletons: mean 0, std 1."""
    score, m, gid, n, size = _sequence_setup(token_rewards, response_mask, group_index)
    mean = (_group_sum(score, gid, n) / size)[gid]  # (B,)
    sq_dev = _group_sum((score - mean) ** 2, gid, n)  # sum of squared deviations, (G,)
    std = (sq_dev / (size - 1).clamp(min=1)).sqrt()  # unbiased std, (G,)
    singleton = (size == 1)[gid]  # (B,)
    mean = torch.where(singleton, 0.0, mean)
    std = torch.where(singleton, 1.0, std[gid])
    return _broadcast((score - mean) / (std + 1e-6), score, m)


def rloo(token_rewards, response_mask, group_index, log_probs=None, sum_pi_sq=None):
    """RLOO: A = R - mean of the *other* rows' R. Singletons keep R."""
    score, m, gid, n, size = _sequence_setup(token_rewards, response_mask, group_index)
    others = size[gid] - 1  # (B,)
    loo_mean = (_group_sum(score, gid, n)[gid] - score) / others.clamp(min=1)  # (B,)
    loo_mean = torch.where(others > 0, loo_mean, 0.0)
    return _broadcast(score - loo_mean, score, m)


# =====================================================================================
# Forward-only variance diagnostics
# =====================================================================================

def gradient_power(advantages, response_mask, log_probs, sum_pi_sq):
    """P_i = sum_t w_t A_t^2 m_t: the proxy of ||g(tau_i)||^2, (B, T) -> (B,)."""
    valid = torch.as_tensor(response_mask).bool()
    w = token_energy(log_probs, sum_pi_sq)  # w_t, (B, T)
    return torch.where(valid, w * advantages.to(w.dtype) ** 2, 0.0).sum(-1)  # P_i, (B,)


def mean_gradient_sq_norm(response, response_mask, group_index, adv, logp, sum_pi_sq):
    """||(1/B) sum_i g_i||^2 in the units of the Logit-Gradient Proxy; forward-only.

    The proxy treats the logits at each distinct context (prompt, response prefix) as parameters of
    their own, so g_i = sum_t A_t (e_{y_t} - pi_t) placed at its contexts, and responses that share
    a prefix add into the same block. For one context, with c_k = sum of A over the rows that
    sampled token k there and S = sum_k c_k:  ||c - S pi||^2 = sum_k c_k^2 - 2 S sum_rows A pi(y)
    + S^2 sum_k pi_k^2. With a single row this is w_t A_t^2, the term of gradient_power.
    A diagnostic, not an estimator: it walks the tokens in Python (fine for a logged metric).
    Inputs (B, T); group_index: one integer prompt id per row. Returns a float.
    """
    # Python floats once, not a .item() per token: (B, T) nested lists
    A, pi_y, spp = (x.double().cpu().tolist() for x in (adv, logp.double().exp(), sum_pi_sq))
    rows, lengths = response.cpu().tolist(), response_mask.sum(-1).long().tolist()
    nodes = {}  # context -> [ {token: c_k}, S, sum A pi(y), sum pi^2 ]
    for i, (row, n) in enumerate(zip(rows, lengths)):
        for t in range(n):
            node = nodes.setdefault((int(group_index[i]), tuple(row[:t])), [{}, 0.0, 0.0, spp[i][t]])
            a = A[i][t]
            node[0][row[t]] = node[0].get(row[t], 0.0) + a
            node[1] += a
            node[2] += a * pi_y[i][t]
    total = sum(sum(c * c for c in cs.values()) - 2 * S * a_pi + S * S * p2 for cs, S, a_pi, p2 in nodes.values())
    return total / len(rows) ** 2


def noise_diagnostics(power, mean_grad_sq_norm):
    """total_power = mean_i P_i; pure_noise = (total_power - ||mean g||^2) / (N - 1).

    E[total_power] = ||E g||^2 + tr Var(g) and E||mean g||^2 = ||E g||^2 + tr Var(g) / N,
    so pure_noise estimates tr Var(g) / N, the noise left in the batch-mean gradient.
    """
    n = power.numel()
    total_power = power.mean().item()
    pure_noise = (total_power - float(mean_grad_sq_norm)) / (n - 1) if n > 1 else float("nan")
    return {"total_power": total_power, "pure_noise": pure_noise}


# One string picks the estimator in a training loop; all take the same keyword arguments.
ESTIMATORS = {
    "reinforce": reinforce,
    "group_mean": group_mean,
    "grpo": grpo,
    "rloo": rloo,
    "otb": optimal_token_baseline,
    "otb_loo": partial(optimal_token_baseline, leave_one_out=True),
}
