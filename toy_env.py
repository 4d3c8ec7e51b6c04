"""A token-level bandit small enough to enumerate: exact checks of the Optimal Token Baseline.

Every claim in ``otb.py`` is a statement about expectations over responses. On a real language
model those expectations are Monte Carlo guesses; here the policy writes at most T tokens from a
vocabulary of K (token 0 is EOS), so there are only

    M = sum_{L=1..T} (K-1)^(L-1)  +  (K-1)^T        (stopped by EOS at L, or cut off at T)

responses, and every expectation is a finite sum  E[f] = sum_tau pi(tau) f(tau).

The toy
-------
- Policy (a) ``tabular``: one softmax per position, logits theta[t] (T, K), blind to the prefix.
  The score of token t lives in row t of theta only, s_t = e_{y_t} - pi_t there, so the
  Logit-Gradient Proxy 1 - 2 pi(y_t) + sum_k pi_k^2 *is* ||s_t||^2 and scores of different
  positions are orthogonal.
- Policy (b) ``shared``: an embedding of the previous token and a small Elman RNN over the prefix,
  then a linear read-out to K logits. Parameters are shared by all positions, so ||s_t||^2
  includes the hidden-state factor and earlier layers: the proxy is only an approximation and
  scores of different positions are correlated sample by sample.
- Reward (default ``"long_finish"``): R(tau) = 1 if the response *ended with EOS* and has
  length L >= ``min_len`` (EOS counted), else 0. The initial policy leans towards EOS
  (``eos_bias``), so short answers are typical. Why this design:
  * sparse: only ~2% of responses succeed with the defaults (K=3, T=7, min_len=5, eos_bias=1),
    so most groups of 2-8 contain no success at all;
  * length dependent: success lives in the long-but-finished responses, while the short ones
    (low energy, never rewarded) and the cut-off ones (high energy, never rewarded: an
    over-length penalty) fail. Whether a response is still running at position t says a lot
    about its return, so a baseline per position beats one number per response: with exact
    numbers the variance of the single-sample estimator with the best per-position baseline is
    ~30% below the classic optimal scalar b* (see ``fixed_baseline_variance``).
  ``"streak"`` (R = 1 for a run of ``min_len`` - 2 copies of token 1 in a finished response) and
  ``"length"`` (R = L / T if EOS was produced, dense) are alternatives for experiments.

Exact quantities, by enumeration (``enumerate_toy``)
----------------------------------------------------
J(theta) = sum_tau pi(tau) R(tau) and grad J by autograd; for every response the per-token
scores s_t (vmap of jacrev, one row per token), w_t = ||s_t||^2, the proxy from ``otb``, the
prefix norms ||S_<=t||^2 with S_<=t = sum_{j<=t} s_j, and the reward-to-go G_t.

Oracle baselines (``oracle_baselines``), all fixed numbers per position, hence unbiased:
- ``b_star``: the classic optimal scalar b* = E[||S||^2 R] / E[||S||^2] with exact norms;
- ``opt_per_position``: the b_t minimising the exact variance of g = sum_t (G_t - b_t) s_t.
  Var is quadratic in b: minimise E||u - sum_t b_t s_t||^2 with u = sum_t G_t s_t, i.e. solve
  C b = c with C_jk = E[s_j . s_k] and c_j = E[s_j . u]. (C is diagonal: martingale differences.)
- ``otb_population``: OTB's B_t = E[G_t W_t] / E[W_t] with population expectations (N -> inf).
Plus ``otb_exact_w``: the group OTB of ``otb.py`` at finite N fed the exact ||s_t||^2 instead of
the proxy (through its ``is_weights`` argument, rho_t^2 = exact / proxy).

The harness (``measure``)
-------------------------
Groups of N responses are drawn i.i.d. from pi (by index into the enumeration), every estimator
turns them into advantages A_t, and the batch gradient is g_hat = (1/N) sum_i sum_t A_t^i s_t^i,
a gather and a contraction on the precomputed scores. Over many independent groups:
bias^2 = ||mean g_hat - grad J||^2 (minus its Monte Carlo excess Var/G), variance = tr Cov(g_hat),
MSE = mean ||g_hat - grad J||^2 = bias^2 + variance, each with a standard error. All estimators
see the same groups (common random numbers), so their differences are measured in pairs.

Departures and caveats
- GRPO divides by the group std: it estimates a rescaled gradient, so most of its "bias" is that
  scale (and groups with identical rewards give it A = 0); it is in the table because it is in
  ``otb.ESTIMATORS``, not because MSE against grad J is the right yardstick for it.
- The variance-optimal per-position baseline is in general *not* OTB's B_t: for the tabular
  policy it is E[G_t w_t] / E[w_t] (this position's energy), while OTB weights by the energy
  accumulated so far, W_t. The table shows how much that costs.
"""
import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

import otb

EOS = 0  # token 0 ends a response
REWARDS = ("long_finish", "streak", "length")
POLICIES = ("tabular", "shared")
MAX_RESPONSES = 200_000  # enumeration (and per-response scores) must fit in memory and a minute
ORACLES = ("b_star", "opt_per_position", "otb_population", "otb_exact_w")
UNBIASED = ("reinforce", "rloo", "otb_loo")  # no baseline or leave-one-out: E g_hat = grad J


def _opt(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class ToyConfig:
    """The toy bandit; every field is also a command-line option (--min-len for min_len)."""
    K: int = _opt(3, "vocabulary size including EOS (token 0); (K-1)^(L-1) responses have length L")
    T: int = _opt(7, "maximum response length; a response without EOS by then is cut off")
    policy: str = _opt("tabular", "'tabular' (one softmax per position: proxy exact) or "
                                  "'shared' (embedding + RNN over the prefix: proxy approximate)")
    reward: str = _opt("long_finish", "'long_finish' (default, sparse), 'streak' or 'length' (dense)")
    min_len: int = _opt(5, "'long_finish' pays 1 for a response that ended with EOS at length >= min_len")
    eos_bias: float = _opt(1.0, "added to the initial EOS logit: > 0 makes short answers typical, success rare")
    init_scale: float = _opt(0.5, "std of the random initial logits / weights")
    hidden: int = _opt(8, "hidden size of the shared policy's RNN (the embedding has half of it)")
    seed: int = _opt(0, "seed of the initial policy and of the Monte Carlo groups")


# =====================================================================================
# The toy: responses, rewards, policies
# =====================================================================================

def enumerate_responses(K, T):
    """Every response: (tokens (M, T) long, padded with EOS; mask (M, T) float64)."""
    content = range(1, K)  # every token but EOS
    seqs = [body + (EOS,) for L in range(1, T + 1) for body in itertools.product(content, repeat=L - 1)]
    seqs += list(itertools.product(content, repeat=T))  # cut off at T, never said EOS
    lengths = torch.tensor([len(s) for s in seqs])  # L, EOS included, (M,)
    tokens = torch.tensor([s + (EOS,) * (T - len(s)) for s in seqs])  # (M, T), padded with EOS
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()  # (M, T)
    return tokens, mask


def longest_run(tokens, mask, token=1):
    """Length of the longest run of ``token`` in each response, (M,)."""
    hit = ((tokens == token) & mask.bool()).long()  # (M, T)
    run = best = torch.zeros_like(hit[:, 0])
    for t in range(tokens.shape[1]):  # a loop over the T <= 10 positions
        run = (run + 1) * hit[:, t]
        best = torch.maximum(best, run)
    return best


def reward_fn(tokens, mask, cfg):
    """R(tau) for every response, (M,). See the module docstring for the design."""
    ended = ((tokens == EOS) & mask.bool()).any(-1)  # produced EOS (not cut off), (M,)
    length = mask.sum(-1)  # L, EOS included, (M,)
    if cfg.reward == "long_finish":
        return (ended & (length >= cfg.min_len)).double()
    if cfg.reward == "streak":
        return (ended & (longest_run(tokens, mask) >= cfg.min_len - 2)).double()
    if cfg.reward == "length":
        return ended.double() * length / tokens.shape[1]
    raise ValueError(f"unknown reward {cfg.reward!r}; choose from {REWARDS}")


class TabularPolicy(nn.Module):
    """pi(y_t | y_<t) = softmax(theta[t]): one free softmax per position, prefix ignored."""

    def __init__(self, K, T, init_scale, generator):
        super().__init__()
        self.theta = nn.Parameter(init_scale * torch.randn(T, K, generator=generator, dtype=torch.float64))

    def forward(self, tokens):  # (B, T) -> logits (B, T, K)
        return self.theta.expand(tokens.shape[0], -1, -1)


class SharedPolicy(nn.Module):
    """Embedding of the previous token (BOS = K at t = 0), Elman RNN, linear read-out."""

    def __init__(self, K, T, init_scale, generator, hidden=8):
        super().__init__()
        emb = max(hidden // 2, 2)

        def param(*shape):
            return nn.Parameter(init_scale * torch.randn(*shape, generator=generator, dtype=torch.float64))

        self.embed = param(K + 1, emb)  # row K is BOS
        self.w_in = param(hidden, emb)
        self.w_rec = param(hidden, hidden)
        self.b_rec = param(hidden)
        self.w_out = param(K, hidden)
        self.b_out = param(K)
        self.K = K

    def forward(self, tokens):  # (B, T) -> logits (B, T, K)
        B, T = tokens.shape
        prev = torch.cat([torch.full((B, 1), self.K, dtype=tokens.dtype), tokens[:, :-1]], dim=1)  # (B, T)
        x = self.embed[prev]  # (B, T, E)
        h = torch.zeros(B, self.w_rec.shape[0], dtype=x.dtype)
        logits = []
        for t in range(T):  # recurrence over at most T positions
            h = torch.tanh(x[:, t] @ self.w_in.T + h @ self.w_rec.T + self.b_rec)  # (B, H)
            logits.append(h @ self.w_out.T + self.b_out)  # (B, K)
        return torch.stack(logits, dim=1)


def make_policy(cfg):
    """A fresh policy, float64, seeded by cfg.seed, with cfg.eos_bias added to the EOS logit."""
    gen = torch.Generator().manual_seed(cfg.seed)
    if cfg.policy == "tabular":
        policy = TabularPolicy(cfg.K, cfg.T, cfg.init_scale, gen)
        eos_logit = policy.theta[:, EOS]  # (T,)
    elif cfg.policy == "shared":
        policy = SharedPolicy(cfg.K, cfg.T, cfg.init_scale, gen, hidden=cfg.hidden)
        eos_logit = policy.b_out[EOS]
    else:
        raise ValueError(f"unknown policy {cfg.policy!r}; choose 'tabular' or 'shared'")
    with torch.no_grad():
        eos_logit += cfg.eos_bias
    return policy


# =====================================================================================
# Exact quantities, by enumeration
# =====================================================================================

@dataclass
class Enumeration:
    """Everything about every response; M responses, T positions, P parameters."""
    tokens: torch.Tensor  # y_t, (M, T) long
    mask: torch.Tensor  # m_t, (M, T) float64
    R: torch.Tensor  # R(tau), (M,)
    token_rewards: torch.Tensor  # r_t: R at the last valid token, (M, T)
    G: torch.Tensor  # G_t reward-to-go, 0 on padding, (M, T)
    log_probs: torch.Tensor  # log pi(y_t | y_<t), 0 on padding, (M, T)
    sum_pi_sq: torch.Tensor  # sum_k pi_k^2 at each position, (M, T)
    pi: torch.Tensor  # pi(tau), (M,), sums to 1
    scores: torch.Tensor  # s_t = grad log pi(y_t | y_<t), 0 on padding, (M, T, P)
    w_exact: torch.Tensor  # ||s_t||^2, (M, T)
    w_proxy: torch.Tensor  # 1 - 2 pi(y_t) + sum pi^2 from otb.token_energy, 0 on padding, (M, T)
    prefix_sq: torch.Tensor  # ||S_<=t||^2, (M, T)
    J: float  # sum_tau pi R
    grad_J: torch.Tensor  # exact gradient by autograd, (P,)

    def expect(self, x):
        """E_pi[x] over responses: x (M, ...) -> (...)."""
        return torch.tensordot(self.pi, x, dims=1)

    def batch(self, rows):
        """The otb.ESTIMATORS keyword arguments for sampled responses ``rows`` (B,)."""
        return dict(token_rewards=self.token_rewards[rows], response_mask=self.mask[rows],
                    log_probs=self.log_probs[rows], sum_pi_sq=self.sum_pi_sq[rows])


def flat_params(policy):
    return {k: v.detach() for k, v in policy.named_parameters()}


def token_log_probs(policy, tokens, mask):
    """(log pi(y_t | y_<t), logits): (B, T) masked, and (B, T, K)."""
    logits = policy(tokens)  # (B, T, K)
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]  # (B, T)
    return lp * mask, logits


def per_token_scores(policy, tokens, mask):
    """s_t for every response and position: (M, T, P), by vmap(jacrev) of the token log-probs."""
    from torch.func import functional_call, jacrev, vmap
    params = flat_params(policy)

    def logp_one(p, tok, m):  # one response: (T,) -> (T,)
        return token_log_probs(lambda x: functional_call(policy, p, (x,)), tok[None], m[None])[0][0]

    jac = vmap(jacrev(logp_one), in_dims=(None, 0, 0))(params, tokens, mask)  # name -> (M, T, *shape)
    return torch.cat([j.reshape(tokens.shape[0], tokens.shape[1], -1) for j in jac.values()], dim=-1)


def enumerate_toy(cfg, policy=None):
    """Exact quantities of ``cfg``'s toy under ``policy`` (a fresh one from cfg.seed if None)."""
    policy = make_policy(cfg) if policy is None else policy
    tokens, mask = enumerate_responses(cfg.K, cfg.T)  # (M, T)
    R = reward_fn(tokens, mask, cfg)  # (M,)
    last = mask.sum(-1).long() - 1  # index of the last valid token, (M,)
    token_rewards = torch.zeros_like(mask).scatter_(1, last[:, None], R[:, None])  # r_t, (M, T)
    G = token_rewards.flip(-1).cumsum(-1).flip(-1) * mask  # G_t, (M, T)

    lp, logits = token_log_probs(policy, tokens, mask)  # (M, T), (M, T, K)
    pi = lp.sum(-1).exp()  # pi(tau), (M,)
    J = (pi * R).sum()  # J(theta) = sum_tau pi(tau) R(tau)
    grad_J = torch.cat([g.reshape(-1) for g in torch.autograd.grad(J, list(policy.parameters()))])  # (P,)

    scores = per_token_scores(policy, tokens, mask) * mask[..., None]  # s_t, (M, T, P)
    sum_pi_sq = otb.sum_pi_squared(logits.detach()) * mask  # (M, T)
    lp = lp.detach()
    w_proxy = otb.token_energy(lp, sum_pi_sq) * mask  # proxy w_t, (M, T)
    return Enumeration(tokens=tokens, mask=mask, R=R, token_rewards=token_rewards, G=G, log_probs=lp,
                       sum_pi_sq=sum_pi_sq, pi=pi.detach(), scores=scores,
                       w_exact=(scores ** 2).sum(-1), w_proxy=w_proxy,
                       prefix_sq=(scores.cumsum(1) ** 2).sum(-1), J=J.item(), grad_J=grad_J.detach())


# =====================================================================================
# Oracle baselines: fixed numbers per position, computed from the whole distribution
# =====================================================================================

def single_sample_gradients(en, b):
    """g(tau) = sum_t (G_t - b_t) m_t s_t for every response, b of shape (T,): (M, P)."""
    A = (en.G - b[None, :]) * en.mask  # (M, T)
    return torch.einsum("mt,mtp->mp", A, en.scores)


def fixed_baseline_variance(en, b):
    """Exact tr Var of the one-sample estimator with fixed per-position baseline b (T,).

    A batch of N i.i.d. responses has exactly this divided by N.
    """
    g = single_sample_gradients(en, b)  # (M, P)
    mean = en.expect(g)  # = grad J for any fixed b
    return (en.expect((g ** 2).sum(-1)) - (mean ** 2).sum()).item()


def score_gram(en):
    """C_jk = E[s_j . s_k], (T, T): diagonal, because per-token scores are martingale differences."""
    return torch.einsum("m,mjp,mkp->jk", en.pi, en.scores, en.scores)


def oracle_baselines(en):
    """The fixed baselines of the module docstring, each a (T,) tensor."""
    T = en.mask.shape[1]
    S_sq = en.prefix_sq[:, -1]  # ||S(tau)||^2 exact, (M,)
    b_star = en.expect(S_sq * en.R) / en.expect(S_sq)  # classic optimal scalar
    u = torch.einsum("mt,mtp->mp", en.G, en.scores)  # u = sum_t G_t s_t, (M, P)
    C = score_gram(en)  # (T, T)
    c = torch.einsum("m,mjp,mp->j", en.pi, en.scores, u)  # c_j = E[s_j . u], (T,)
    b_opt = torch.linalg.solve(C, c)  # argmin_b Var, (T,)
    W = en.w_proxy.cumsum(-1) * en.mask  # W_t m_t, (M, T)
    b_otb = en.expect(en.G * W) / en.expect(W)  # B_t = E[G_t W_t] / E[W_t], (T,)
    return {"b_star": b_star.expand(T).clone(), "opt_per_position": b_opt, "otb_population": b_otb}


# =====================================================================================
# Estimators under test: otb.ESTIMATORS plus the oracles, all as rows -> advantages
# =====================================================================================

def make_estimators(en):
    """name -> f(rows (B,), group_index (B,)) -> advantages A_t (B, T)."""
    def project(fn):
        return lambda rows, gid: fn(**en.batch(rows), group_index=gid)[0]

    def fixed(b):
        return lambda rows, gid: (en.G[rows] - b[None, :]) * en.mask[rows]

    rho = torch.where(en.mask.bool(), (en.w_exact / en.w_proxy.clamp(min=1e-300)).sqrt(), 1.0)  # (M, T)

    def otb_exact_w(rows, gid):  # otb's w_t * rho_t^2 = exact ||s_t||^2
        return otb.optimal_token_baseline(**en.batch(rows), group_index=gid, is_weights=rho[rows])[0]

    ests = {name: project(fn) for name, fn in otb.ESTIMATORS.items()}
    ests.update({name: fixed(b) for name, b in oracle_baselines(en).items()})
    ests["otb_exact_w"] = otb_exact_w
    return ests


# =====================================================================================
# The bias / variance harness
# =====================================================================================

def sample_groups(en, N, groups, generator):
    """rows (groups * N,) drawn i.i.d. from pi(tau), and their group ids (contiguous)."""
    rows = torch.multinomial(en.pi, groups * N, replacement=True, generator=generator)
    return rows, torch.arange(groups).repeat_interleave(N)


def batch_gradients(en, A, rows, N, max_entries=1 << 22):
    """g_hat per group = (1/N) sum_i sum_t A_t^i s_t^i: A (G*N, T) -> (G, P).

    Each group's gradient is a weighted sum of the M*T precomputed score vectors: scatter the
    advantages into a (groups, M*T) coefficient matrix and multiply by the scores (M*T, P).
    """
    M, T, P = en.scores.shape
    G = len(rows) // N
    col = (rows[:, None] * T + torch.arange(T)).reshape(G, N * T)  # where A_t^i goes, (G, N*T)
    val = A.reshape(G, N * T) / N  # (G, N*T)
    out = []
    chunk = max(1, max_entries // (M * T))
    for g0 in range(0, G, chunk):  # a loop over memory chunks only
        coef = torch.zeros(len(col[g0:g0 + chunk]), M * T, dtype=A.dtype)  # (chunk, M*T)
        coef.scatter_add_(1, col[g0:g0 + chunk], val[g0:g0 + chunk])
        out.append(coef @ en.scores.reshape(M * T, P))  # (chunk, P)
    return torch.cat(out)


def gradient_stats(g_hat, grad_J):
    """bias^2, variance, MSE of g_hat (G, P) against grad_J (P,), with standard errors."""
    G = g_hat.shape[0]
    err = g_hat - grad_J  # (G, P)
    mean_err = err.mean(0)  # (P,)
    dev = g_hat - g_hat.mean(0)  # (G, P)
    cov = dev.T @ dev / (G - 1)  # (P, P)
    variance = torch.trace(cov)  # tr Cov, unbiased
    bias2 = (mean_err ** 2).sum() - variance / G  # ||E g_hat - grad J||^2, unbiased
    se_bias2 = (4 * mean_err @ cov @ mean_err / G + 2 * (cov ** 2).sum() / G ** 2).clamp(min=0).sqrt()
    sq = (err ** 2).sum(-1)  # per-group squared error, (G,)
    dsq = (dev ** 2).sum(-1)  # per-group squared deviation, (G,)
    return {"bias2": bias2.item(), "bias2_se": se_bias2.item(),
            "variance": variance.item(), "variance_se": (dsq.std() / math.sqrt(G)).item(),
            "mse": sq.mean().item(), "mse_se": (sq.std() / math.sqrt(G)).item()}, sq


def measure(en, Ns=(2, 4, 8, 16, 32), groups=10000, seed=0, names=None, keep_errors=False):
    """The table: one dict per (estimator, N). With keep_errors, also {(name, N): (G,) sq errors}."""
    ests = make_estimators(en)
    names = list(ests) if names is None else list(names)
    gen = torch.Generator().manual_seed(seed)
    rows_out, errors = [], {}
    for N in Ns:
        rows, gid = sample_groups(en, N, groups, gen)  # the same groups for every estimator
        tokens = en.mask[rows].sum() / groups  # tokens sampled per group
        for name in names:
            A = ests[name](rows, gid)  # (G*N, T)
            stats, sq = gradient_stats(batch_gradients(en, A, rows, N), en.grad_J)
            rows_out.append({"estimator": name, "N": N, **stats, "tokens": tokens.item()})
            if keep_errors:
                errors[(name, N)] = sq
    return (rows_out, errors) if keep_errors else rows_out


# =====================================================================================
# Exact checks used by the tests, the notebook and the printed summary
# =====================================================================================

def martingale_sides(en):
    """(E||S_<=t||^2, E[W_t]) per position with exact norms, both (T,): equal, cross terms vanish."""
    return en.expect(en.prefix_sq), en.expect(en.w_exact.cumsum(-1))


def proxy_correlation(en):
    """pi-weighted Pearson correlation of the proxy with the exact ||s_t||^2 over valid tokens."""
    wt = en.pi[:, None] * en.mask  # weight of each (response, position), (M, T)
    wt = wt / wt.sum()
    x, y = en.w_proxy, en.w_exact
    mx, my = (wt * x).sum(), (wt * y).sum()
    cov = (wt * (x - mx) * (y - my)).sum()
    return (cov / ((wt * (x - mx) ** 2).sum() * (wt * (y - my) ** 2).sum()).sqrt()).item()


def exact_summary(en):
    """Exact facts about the toy, no sampling: a dict of plain numbers and lists."""
    T = en.mask.shape[1]
    base = oracle_baselines(en)
    lhs, rhs = martingale_sides(en)
    C = score_gram(en)
    var1 = {"reinforce (b=0)": torch.zeros(T, dtype=torch.float64),
            "mean (b=E[R])": torch.full((T,), en.J, dtype=torch.float64), **base}
    return {
        "responses": len(en.R), "parameters": en.scores.shape[-1],
        "mean_length": en.expect(en.mask.sum(-1)).item(), "J": en.J,
        "grad_J_sq_norm": (en.grad_J ** 2).sum().item(),
        "martingale_max_gap": (lhs - rhs).abs().max().item(),
        "per_sample_cross_term": en.expect((en.prefix_sq - en.w_exact.cumsum(-1)).abs()).max().item(),
        "score_gram_offdiag_max": (C - torch.diag(torch.diag(C))).abs().max().item(),
        "proxy_correlation": proxy_correlation(en),
        "one_sample_variance": {k: fixed_baseline_variance(en, b) for k, b in var1.items()},
        "baselines": {k: b.tolist() for k, b in base.items()},
    }


# =====================================================================================
# Command line: print the table, --json, --plot
# =====================================================================================

def format_table(rows, grad_sq):
    """Text table, values in units of ||grad J||^2 (an all-zero gradient estimate scores MSE 1)."""
    lines = []
    for N in sorted({r["N"] for r in rows}):
        block = [r for r in rows if r["N"] == N]
        lines.append(f"N = {N}   ({block[0]['tokens']:.1f} tokens sampled per group)")
        lines.append(f"  {'estimator':<18}{'bias^2':>18}{'variance':>18}{'MSE':>18}")
        for r in block:
            cells = [f"{r[k] / grad_sq:9.3f} +- {r[k + '_se'] / grad_sq:<5.3f}" for k in ("bias2", "variance", "mse")]
            lines.append(f"  {r['estimator']:<18}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def plot_mse(rows, path=None, title="", ax=None, unit=1.0):
    """MSE / unit against N, log-log, one line per estimator (oracles dashed); saved to ``path`` if given."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.8)) if ax is None else (ax.figure, ax)
    markers = itertools.cycle("osD^vP*Xhx")
    for name in dict.fromkeys(r["estimator"] for r in rows):
        pts = sorted((r["N"], r["mse"] / unit, r["mse_se"] / unit) for r in rows if r["estimator"] == name)
        n, mse, se = zip(*pts)
        ax.errorbar(n, mse, yerr=se, marker=next(markers), ms=5, capsize=2, label=name, mfc="none",
                    linestyle="--" if name in ORACLES else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("group size N (responses per prompt)")
    ax.set_ylabel("MSE of batch gradient vs exact grad J" + (" / ||grad J||^2" if unit != 1.0 else ""))
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Exact bias/variance of policy-gradient baselines on an enumerable toy bandit.")
    for f in fields(ToyConfig):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=f.default,
                       help=f.metadata["help"] + f" (default: {f.default})")
    p.add_argument("--groups", type=int, default=10000, help="independent groups per (estimator, N) (default: 10000)")
    p.add_argument("--Ns", type=int, nargs="+", default=[2, 4, 8, 16, 32], help="group sizes N (default: 2 4 8 16 32)")
    p.add_argument("--json", nargs="?", const="benchmarks/results/toy_table.json", default=None,
                   help="write the table as JSON (default path: benchmarks/results/toy_table.json)")
    p.add_argument("--plot", nargs="?", const="benchmarks/results/toy_mse_vs_n.png", default=None,
                   help="save MSE against N, log-log (default path: benchmarks/results/toy_mse_vs_n.png)")
    args = p.parse_args(argv)
    cfg = ToyConfig(**{f.name: getattr(args, f.name) for f in fields(ToyConfig)})
    n_responses = sum((cfg.K - 1) ** (L - 1) for L in range(1, cfg.T + 1)) + (cfg.K - 1) ** cfg.T
    checks = [("--K", cfg.K, cfg.K >= 2, "must be >= 2 (EOS and at least one other token)"),
              ("--T", cfg.T, cfg.T >= 2, "must be >= 2 (responses of different lengths)"),
              ("--T", cfg.T, cfg.K < 2 or cfg.T < 2 or n_responses <= MAX_RESPONSES,
               f"with --K {cfg.K} gives {n_responses} responses, more than {MAX_RESPONSES} to enumerate"),
              ("--policy", cfg.policy, cfg.policy in POLICIES, f"must be one of {POLICIES}"),
              ("--reward", cfg.reward, cfg.reward in REWARDS, f"must be one of {REWARDS}"),
              ("--min-len", cfg.min_len, 1 <= cfg.min_len <= cfg.T, f"must be in 1..T ({cfg.T})"),
              ("--hidden", cfg.hidden, cfg.hidden >= 2, "must be >= 2"),
              ("--init-scale", cfg.init_scale, cfg.init_scale >= 0, "must be >= 0"),
              ("--groups", args.groups, args.groups >= 2, "must be >= 2 (a variance needs two groups)"),
              ("--Ns", args.Ns, min(args.Ns) >= 2, "every N must be >= 2 (group baselines need two responses)")]
    for flag, value, ok, why in checks:
        if not ok:
            p.error(f"{flag} {value} {why}")  # one line on stderr, exit status 2
    return cfg, args


def main(argv=None):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # exact sums: the whole toy runs in float64
    try:
        return run(argv)
    finally:
        torch.set_default_dtype(previous)  # leave the caller's process as it was


def run(argv=None):
    cfg, args = parse_args(argv)
    command = "python toy_env.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print("#", command.strip())
    start = time.time()
    en = enumerate_toy(cfg)
    ex = exact_summary(en)
    grad_sq = ex["grad_J_sq_norm"]
    print(f"toy: {asdict(cfg)}")
    print(f"exact: {ex['responses']} responses, {ex['parameters']} parameters, E[L] = {ex['mean_length']:.2f}, "
          f"J = {ex['J']:.4f}, ||grad J||^2 = {grad_sq:.4g}")
    print(f"exact: max_t |E||S_<=t||^2 - E[W_t]| = {ex['martingale_max_gap']:.1e}, while max_t E| ||S_<=t||^2 - W_t | = "
          f"{ex['per_sample_cross_term']:.2g}; corr(proxy, ||s_t||^2) = {ex['proxy_correlation']:.3f}")
    print("exact one-sample tr Var with a fixed baseline (units of ||grad J||^2; divide by N for a batch):")
    print("   " + ", ".join(f"{k}: {v / grad_sq:.2f}" for k, v in ex["one_sample_variance"].items()))
    rows = measure(en, Ns=args.Ns, groups=args.groups, seed=cfg.seed)
    print(f"Monte Carlo, {args.groups} groups per N, values in units of ||grad J||^2 (+- one standard error):")
    print(format_table(rows, grad_sq))
    print(f"done in {time.time() - start:.1f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": command.strip(), "config": asdict(cfg),
                                               "groups": args.groups, "exact": ex, "rows": rows}, indent=1))
        print("wrote", args.json)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")  # files only, no window
        plot_mse(rows, args.plot, unit=grad_sq, title=f"{command.strip()}\n{cfg.policy} policy, K={cfg.K}, T={cfg.T}, "
                                        f"reward={cfg.reward}, {args.groups} groups per point")
        print("wrote", args.plot)
    return rows


if __name__ == "__main__":
    main()
