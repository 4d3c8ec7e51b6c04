"""The Optimal Token Baseline (OTB), the Logit-Gradient Proxy and the group baselines.

Pure tensor functions; the one class, ``Checked``, carries the checked inputs by name.
Everything takes right-padded (B, T) tensors: B rows (responses), T response positions,
``response_mask`` 1 on valid tokens.

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
- The row's own return is inside its baseline (6), so the gradient is biased, as with GRPO's
  mean, but the row weighs W_t^i / sum_j W_t^j m_t^j in it, not 1/N (up to 1 where it runs alone):
  on the toy the bias falls much more slowly than 1/N (docs/toy_bandit.md).
- Singleton groups get B = 0 (the advantage is the return itself).
- w_t is clamped to [0, 2]: rounding can push (7) a hair below 0 for confident tokens.
- sum pi^2 is computed in float32 even for bf16 logits (float64 stays float64): in bf16 the
  difference in (7) can go negative.

The variants (leave-one-out, zero tail, importance weights, pooling by action for tool output) are
in ``optimal_token_baseline``'s docstring. How the lines compute the equations, and why the input
checks always run: docs/otb.md.
"""
import math
import numbers
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch

# =====================================================================================
# The Logit-Gradient Proxy, eq. (7)
# =====================================================================================

def sum_pi_squared(logits):
    """sum_k softmax(z)_k^2 over the last dimension, (..., V) -> (...), in float32 (float64 stays float64).

    Computed as sum_k e_k^2 / (sum_k e_k)^2 with e_k = exp(z_k - max z), which equals
    exp(logsumexp(2z) - 2 logsumexp(z)): every e_k lies in [0, 1] and both sums in [1, V], so nothing
    overflows and no two large logsumexps are subtracted (LM logits often sit around +40).

    A logit of -inf (a token masked out) is fine. NaN, +inf or only -inf in a vector is a ValueError,
    found on the result (one reduction over (...), not over (..., V)); so is an input without a
    vocabulary dimension. Plain (nested) lists are accepted.
    """
    logits = _checked_logits(logits)  # a tensor with a non-empty last (vocabulary) dimension
    z = logits.to(_working_dtype(logits))  # z, (..., V)
    e = (z - z.amax(dim=-1, keepdim=True)).exp()  # e_k = exp(z_k - max z), (..., V)
    spp = (e * e).sum(dim=-1) / e.sum(dim=-1) ** 2  # sum_k pi_k^2, (...)
    if not torch.isfinite(spp).all():
        raise _not_finite(spp)
    return spp


def token_energy(log_probs, sum_pi_sq):
    """w_t = 1 - 2 pi(y_t) + sum_k pi_k^2, eq. (7), clamped to [0, 2]. Both inputs the same shape
    (tensors or plain lists; a ValueError otherwise)."""
    log_probs, sum_pi_sq = _checked_pair(log_probs, sum_pi_sq)  # tensors of one shape
    return _token_energy(log_probs, sum_pi_sq)


def _token_energy(log_probs, sum_pi_sq):
    """w_t of eq. (7), clamped to [0, 2], from two tensors of one shape, in float64 if either is, else
    in float32. Unchecked: ``token_energy`` checks first, and the estimators have checked already."""
    if torch.float64 in (log_probs.dtype, sum_pi_sq.dtype):
        dtype = torch.float64
    else:
        dtype = torch.float32
    pi_y = log_probs.to(dtype).exp()  # pi(y_t)
    return (1.0 - 2.0 * pi_y + sum_pi_sq.to(dtype)).clamp(0.0, 2.0)  # w_t


# =====================================================================================
# The Optimal Token Baseline, eqs. (1)-(6), pooled by position or by action (8)
# =====================================================================================

def optimal_token_baseline(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, *,
                           is_weights=None, leave_one_out=False, zero_tail=False, by_action=False, eps=1e-8):
    """OTB advantages A_t = G_t - B_t, eq. (5), with B_t from eq. (6).

    token_rewards, response_mask, log_probs (of the sampled tokens), sum_pi_sq, is_weights:
    (B, T). group_index: one prompt id per row. Returns (advantages, returns), both (B, T),
    exactly 0 at padded positions.

    The variants:

    - ``leave_one_out=True`` (``otb_loo``) drops the row's own term from its baseline (6): unbiased;
      B = 0 where no other row of the group is active. (This variant is ours; verl has none.)
    - ``zero_tail=True``: where only one row of a group is still active, B = 0 instead of its own
      return (advantage ~ 0). verl 0.9.1 always runs with it on (``handle_zero_tail=True``); here it
      is off by default (why: docs/toy_bandit.md, docs/variance.md); ``otb_zero_tail`` is verl's.
    - ``is_weights``: importance weights rho_t multiply w_t by rho_t^2.
    - ``by_action=True``: for tool output inside a response (holes, m_t = 0 inside a row), the rows
      share B at the policy's own k-th token, eq. (8), instead of at position t:
      ``action_aligned_otb`` (``otb_tir``).

    Bad input raises a ValueError naming the argument (what is checked: docs/otb.md); padded
    positions may hold anything, and plain (nested) lists are accepted wherever a tensor is.
    """
    x = _checked_inputs(token_rewards, response_mask, group_index, log_probs=log_probs, sum_pi_sq=sum_pi_sq,
                        is_weights=is_weights, eps=eps)  # read by name: x.log_probs, ..., (B, T) each
    m = x.response_mask  # m_t, (B, T)
    w = _token_energy(x.log_probs, x.sum_pi_sq).to(m.dtype)  # w_t, eq. (2) through (7), (B, T)
    if x.is_weights is not None:
        w = w * x.is_weights.to(m.dtype) ** 2  # w_t <- rho_t^2 w_t
    G = (x.token_rewards * m).flip(-1).cumsum(-1).flip(-1) * m  # G_t m_t, eq. (1): reverse cumulative sum, (B, T)
    W = (w * m).cumsum(-1) * m  # W_t m_t, eq. (3): cumulative sum, (B, T)
    t = torch.arange(m.shape[-1], device=m.device).expand(m.shape)  # t, (B, T)
    k = _action_index(m) if by_action else t  # k_t: where a group's rows share B, their k-th action (8) or t
    if leave_one_out:
        B = _leave_one_out_baseline(G, W, x, k, eps=eps)  # eq. (6) over the other rows j != i, (B, T)
    else:
        num = _pooled(G * W, x, k)  # sum_i G_t W_t m_t over the rows i of the group at k_t, (B, T)
        den = _pooled(W, x, k)  # sum_i W_t m_t, (B, T)
        keep = (torch.bincount(x.gid, minlength=x.n_groups) > 1)[x.gid, None]  # singleton groups: B = 0
        if zero_tail:
            keep = keep & (_pooled(m, x, k) > 1)  # one row left at k_t (sum_i m_t = 1): B = 0
        B = torch.where(keep, num / (den + eps), 0.0)  # B_t = E[G_t W_t] / E[W_t] over the group, eq. (6), (B, T)
    A = (G - B) * m  # A_t, eq. (5), 0 on padding
    return A, G


def _pooled(v, x, k):
    """sum_i v^i over the rows i of each group at each slot, given back to every token at its own slot
    k_t: (B, T) -> (B, T). The slot is the position (k_t = t) or the action index of eq. (8)."""
    by_slot = torch.zeros_like(v).scatter_add_(-1, k, v)  # each row's values moved to their slots, (B, T)
    return _group_sum(by_slot, x.gid, x.n_groups)[x.gid].gather(-1, k)  # the group's sum at k_t, (B, T)


def _action_index(m):
    """k_t = sum_{j<=t} m_j - 1, eq. (8): the index of token t among its row's actions, (B, T). A masked
    token before a row's first action gets 0, not -1: it adds only zeros wherever it is pooled."""
    return (m.cumsum(-1) - 1).clamp(min=0).long()


def _leave_one_out_baseline(G, W, x, k, *, eps):
    """Eq. (6) over the *other* rows j != i of each row's group at its slot k_t, (B, T), in the mask's
    dtype; B = 0 where no other row is active. "Group total minus own term" cancels badly in float32 when
    one row's energy dwarfs the others', so the sums are taken in float64."""
    GW, W, m = (G * W).double(), W.double(), x.response_mask.double()  # G_t W_t m_t, W_t m_t, m_t, (B, T)
    num_i = _pooled(GW, x, k) - GW  # sum_{j != i} G_t W_t m_t
    den_i = (_pooled(W, x, k) - W).clamp(min=0.0)  # sum_{j != i} W_t m_t
    others = _pooled(m, x, k) - m  # active rows besides row i
    return torch.where(others > 0, num_i / (den_i + eps), 0.0).to(x.response_mask.dtype)


# =====================================================================================
# Group baselines: one number per response
# =====================================================================================

def _sequence_setup(token_rewards, response_mask, group_index):
    """R(tau) per row (B,), the mask m (B, T), group ids (B,), their count, and group sizes. The inputs
    are checked as ``optimal_token_baseline``'s are."""
    x = _checked_inputs(token_rewards, response_mask, group_index)  # r_t, m_t: x.token_rewards, x.response_mask
    m = x.response_mask  # m_t, (B, T)
    score = (x.token_rewards * m).sum(-1)  # R(tau) = sum of r_t m_t, (B,)
    size = torch.bincount(x.gid, minlength=x.n_groups).to(m.dtype)  # rows per group, (G,)
    return score, m, x.gid, x.n_groups, size


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
# OTB aligned by the policy's own tokens, eq. (8): responses with tool output
# =====================================================================================

def action_aligned_otb(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, *,
                       is_weights=None, leave_one_out=False, zero_tail=False, eps=1e-8):
    """OTB with the baseline pooled over k, the index of each token among its row's actions, eq. (8).

    Tool output that the environment inserts into a response has m_t = 0 inside the row (holes).
    This estimator (``ESTIMATORS["otb_tir"]``) pools a group's rows by the policy's own tokens
    instead of by position t, with

        k_t = sum_{j<=t} m_j - 1                    (8) the index of token t among the row's actions

    applying (1)-(6) over k and giving token t the advantage A_{k_t}. A row's own sums G and W
    are the same over k as over t (a hole adds 0 to them), so only the pooling, eq. (6), moves: the
    rows share B_t at their k-th actions instead of at their t-th positions.
    Why, an example, and how it matches verl's multi-turn estimator: docs/tool_use.md.

    The same inputs, options (leave_one_out, zero_tail, eps), input checks and outputs as
    optimal_token_baseline; response_mask may have holes (0 on tool output inside a response).
    Returns (advantages, returns), both (B, T), 0 at masked positions. Without holes it is
    optimal_token_baseline.
    """
    return optimal_token_baseline(token_rewards, response_mask, group_index, log_probs, sum_pi_sq,
                                  is_weights=is_weights, leave_one_out=leave_one_out, zero_tail=zero_tail,
                                  by_action=True, eps=eps)


# =====================================================================================
# The sequence-level optimal baseline, eq. (9), and OPO
# =====================================================================================

def sequence_optimal_baseline(token_rewards, response_mask, group_index, energy, *, leave_one_out=False):
    """One baseline per response, each row of the group weighted by its energy e_j (B,):

        b_i = sum_j e_j R_j / sum_j e_j      over the rows j of i's group             (9)

    with leave_one_out over the rows j != i. The minimum-variance constant baseline for the
    sequence-level estimator (R - b) S is E[R ||S||^2] / E[||S||^2] (the derivation of (4) with
    t = T); (9) estimates it over the group with e_j standing in for ||S_j||^2: the exact squared
    norm of the response's full gradient, OTB's energy W_T of the whole response, or its length
    (``opo``). OTB, (4)-(6), is the same idea per token position. A = R - b on every valid token.

    With the own row in (the default, as OPO) the gradient is biased like the group mean's; with
    leave_one_out b_i does not depend on row i and the gradient is unbiased. b = 0 in a singleton
    group and wherever the energies summed over are 0. Inputs as ``optimal_token_baseline``'s, and
    ``energy``: one finite number >= 0 per row. Returns (advantages, returns), both (B, T)."""
    score, m, gid, _, _ = _sequence_setup(token_rewards, response_mask, group_index)  # R_i (B,), m (B, T)
    e = _checked_energy(energy, len(m)).to(m.device)  # e_j, (B,)
    b = _energy_baseline(score, e, gid, leave_one_out)  # b_i, eq. (9), (B,)
    return _broadcast(score - b.to(m.dtype), score, m)


def opo(token_rewards, response_mask, group_index, log_probs=None, sum_pi_sq=None, *, leave_one_out=False):
    """OPO (arXiv 2505.23585, verl 0.9.1's ``compute_opo_outcome_advantage``): eq. (9) with the
    response length as the energy, e_j = l_j = sum_t m_t, own row in. ``opo_loo``: the rows j != i.
    (log_probs and sum_pi_sq are accepted and ignored.)"""
    score, m, gid, _, _ = _sequence_setup(token_rewards, response_mask, group_index)  # R_i (B,), m (B, T)
    length = m.sum(-1)  # l_j, (B,)
    b = _energy_baseline(score, length, gid, leave_one_out)  # b_i, eq. (9), (B,)
    return _broadcast(score - b.to(m.dtype), score, m)


def _energy_baseline(score, e, gid, leave_one_out):
    """b_i of eq. (9) for every row, (B,), from R_i, e_i and the group ids (0..G-1), in float64 (leave-one-out
    subtracts the own term from the group's total, which cancels badly in float32 when one energy dwarfs
    the others)."""
    R, e, G = score.double(), e.double(), int(gid.max()) + 1  # R_j, e_j (B,); the number of groups
    num = _group_sum(e * R, gid, G)[gid]  # sum_j e_j R_j over the group, (B,)
    den = _group_sum(e, gid, G)[gid]  # sum_j e_j, (B,)
    if leave_one_out:
        num, den = num - e * R, (den - e).clamp(min=0.0)  # over j != i
    size = torch.bincount(gid, minlength=G)[gid]  # rows in the group, (B,)
    keep = (size > 1) & (den > 0)  # a singleton, or no energy to weigh by: b = 0
    return torch.where(keep, num / den.clamp(min=1e-300), 0.0)  # b_i, (B,)


# One string picks the estimator in a training loop; all take the same keyword arguments.
ESTIMATORS = {
    "reinforce": reinforce,
    "group_mean": group_mean,
    "grpo": grpo,
    "rloo": rloo,
    "otb": optimal_token_baseline,
    "otb_loo": partial(optimal_token_baseline, leave_one_out=True),
    "otb_zero_tail": partial(optimal_token_baseline, zero_tail=True),  # verl 0.9.1 as its trainer runs it
    "otb_tir": action_aligned_otb,
    "otb_tir_zero_tail": partial(action_aligned_otb, zero_tail=True),  # verl 0.9.1's tir_optimal_token_baseline
    "opo": opo,  # eq. (9) with the length as the energy: verl 0.9.1's compute_opo_outcome_advantage
    "opo_loo": partial(opo, leave_one_out=True),
}


# =====================================================================================
# Group ids and group sums
# =====================================================================================

def group_ids(group_index, batch):
    """Map one prompt id per row (an integer tensor, or a sequence of hashable ids) to (gid, n_groups):
    gid (B,) long, ids 0..n_groups-1. Groups may be interleaved. A bad group_index is a ValueError."""
    if isinstance(group_index, (str, bytes)):  # a string is one id, not one id per character
        raise ValueError(f"group_index must hold one prompt id per row, got the string {group_index!r}")
    if isinstance(group_index, torch.Tensor):
        if group_index.dim() != 1 or group_index.is_floating_point():
            raise ValueError(f"group_index must be a 1-D integer tensor or a sequence of ids, got a tensor "
                             f"of shape {tuple(group_index.shape)} and dtype {group_index.dtype}")
        uniq, gid = torch.unique(group_index, return_inverse=True)  # ids in sorted order, (B,)
        n_groups = len(uniq)
    else:
        first_seen = {}  # id -> its number, in order of first appearance
        try:
            ids = [first_seen.setdefault(g, len(first_seen)) for g in group_index]
        except TypeError as e:
            raise ValueError(f"group_index must be a sequence of hashable prompt ids, one per row ({e})") from None
        gid = torch.tensor(ids, dtype=torch.long)
        n_groups = len(first_seen)
    if len(gid) != batch:
        raise ValueError(f"group_index has {len(gid)} entries but the batch has {batch} rows")
    return gid.long(), n_groups


def _group_sum(x, gid, n_groups):
    """Sum the rows of x (B, ...) into their groups: (n_groups, ...). No loop over groups."""
    sums = torch.zeros((n_groups, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return sums.index_add_(0, gid, x)


def _working_dtype(x):  # float64 stays float64; any other dtype is computed in float32
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# =====================================================================================
# The input checks: the first line of every public function
# =====================================================================================

ROUNDING = 1e-4  # log-probs a hair above 0, or sum pi^2 a hair above 1, are float rounding
LIMITS = {  # name: (lowest, highest, rule) allowed at valid positions; every value must be finite
    "token_rewards": (-math.inf, math.inf, "finite"),
    "log_probs": (-math.inf, ROUNDING, "finite and <= 0"),
    "sum_pi_sq": (-ROUNDING, 1 + ROUNDING, "finite and in [0, 1]"),
    "is_weights": (-1e18, 1e18, "finite and at most 1e18 in size (rho^2 must not overflow)"),
}


@dataclass(frozen=True)
class Checked:
    """An estimator's inputs after ``_checked_inputs``, read by name only (there is no order to unpack):
    (B, T) tensors with padding out of range set to 0, so the maths can mask by multiplying; an input
    not given stays None."""
    token_rewards: torch.Tensor  # r_t, (B, T)
    response_mask: torch.Tensor  # m_t, 0/1 in the working dtype (float64 if token_rewards is, else float32)
    gid: torch.Tensor  # each row's group, 0..n_groups-1 (``group_ids``), on the mask's device, (B,)
    n_groups: int
    log_probs: Optional[torch.Tensor] = None  # log pi(y_t), (B, T)
    sum_pi_sq: Optional[torch.Tensor] = None  # sum_k pi_k^2, (B, T)
    is_weights: Optional[torch.Tensor] = None  # rho_t, (B, T)


def _checked_inputs(token_rewards, response_mask, group_index, *, log_probs=None, sum_pi_sq=None,
                    is_weights=None, eps=0.0):
    """Every estimator's first line: its inputs checked (the rules: ``optimal_token_baseline``'s
    docstring) and given back as a ``Checked``, each tensor under its own name whatever the order of the
    call's keywords. On valid input the cost is one min/max reduction per tensor; the helpers that name
    a culprit run only on bad input."""
    x = {"token_rewards": token_rewards, "response_mask": response_mask, "log_probs": log_probs,
         "sum_pi_sq": sum_pi_sq, "is_weights": is_weights}
    x = {name: None if v is None else _as_tensor(name, v) for name, v in x.items()}
    if not (isinstance(eps, numbers.Real) and 0.0 <= eps < math.inf):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    shape = x["token_rewards"].shape  # (B, T)
    if {v.shape for v in x.values() if v is not None} != {shape} or len(shape) != 2 or 0 in shape:
        raise _shape_error(x)
    m = x.pop("response_mask").to(_working_dtype(x["token_rewards"]))  # m_t, (B, T)
    if not (_in_range(m, 0, 1) and _in_range(m.frac(), 0, 0)):  # in [0, 1], no fraction: 0 or 1
        other = m[(m != 0) & (m != 1)][0].item()
        raise ValueError(f"response_mask must contain only 0 and 1, found {other}")
    for name, (lowest, highest, rule) in LIMITS.items():
        if x[name] is not None and not _in_range(x[name], lowest, highest):
            x[name] = _zero_padding(name, x[name], m, lowest, highest, rule)  # or the error
    gid, n_groups = group_ids(group_index, len(m))
    return Checked(response_mask=m, gid=gid.to(m.device), n_groups=n_groups, **x)  # each by its name


def _checked_logits(logits):
    """sum_pi_squared's input as a tensor with a non-empty last (vocabulary) dimension, or the ValueError."""
    z = _as_tensor("logits", logits)
    if z.dim() == 0 or z.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got {tuple(z.shape)}")
    return z


def _checked_pair(log_probs, sum_pi_sq):
    """token_energy's inputs as tensors of one shape; a ValueError naming the problem otherwise."""
    log_probs, sum_pi_sq = _as_tensor("log_probs", log_probs), _as_tensor("sum_pi_sq", sum_pi_sq)
    if log_probs.shape != sum_pi_sq.shape:
        raise ValueError(f"sum_pi_sq has shape {tuple(sum_pi_sq.shape)} but log_probs has shape "
                         f"{tuple(log_probs.shape)}")
    return log_probs, sum_pi_sq


def _checked_energy(energy, batch):
    """sequence_optimal_baseline's energy as a 1-D tensor of ``batch`` finite numbers >= 0, or the ValueError."""
    e = _as_tensor("energy", energy)
    if e.dim() != 1 or len(e) != batch:
        raise ValueError(f"energy must hold one number per row, shape ({batch},), got shape {tuple(e.shape)}")
    if not _in_range(e, 0.0, math.inf):
        bad = e[~(torch.isfinite(e) & (e >= 0))][0].item()
        raise ValueError(f"energy must be finite and >= 0, found {bad:.6g}")
    return e


def _as_tensor(name, x):  # a tensor as it is; a (nested) list of numbers as a tensor; else the error
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be a tensor or a (nested) list of numbers ({e})") from None


def _in_range(v, lowest, highest):
    """Every value of v finite and in [lowest, highest]: one min/max reduction."""
    lo, hi = (float(a) for a in torch.aminmax(v.float() if v.dtype == torch.bool else v))
    return math.isfinite(lo) and math.isfinite(hi) and lowest <= lo and hi <= highest


def _shape_error(x):
    """The ValueError for a bad shape: every input 2-D, of token_rewards' shape, and not empty."""
    shape = x["token_rewards"].shape
    for name, v in x.items():
        if v is not None and v.dim() != 2:
            return ValueError(f"{name} must be 2-D (batch, length), got shape {tuple(v.shape)}")
        if v is not None and v.shape != shape:
            return ValueError(f"{name} has shape {tuple(v.shape)} but token_rewards has shape {tuple(shape)}")
    return ValueError(f"empty batch: token_rewards has shape {tuple(shape)}")


def _zero_padding(name, v, m, lowest, highest, rule):
    """v with 0 at padded positions out of range; a ValueError naming the first valid one out of range."""
    ok = torch.isfinite(v) & (v >= lowest) & (v <= highest)
    bad = (m > 0) & ~ok
    if bad.any():
        i, t = bad.nonzero()[0].tolist()
        raise ValueError(f"{name} must be {rule}, found {v[i, t].item():.6g} at valid position ({i}, {t})")
    return torch.where(ok, v, 0)


def _not_finite(spp):
    """The ValueError for logits whose sum pi^2 is not finite, naming the first such vector."""
    index = tuple((~torch.isfinite(spp)).nonzero()[0].tolist())
    return ValueError(f"logits must be finite (NaN, +inf or only -inf in the vector at index {index})")
