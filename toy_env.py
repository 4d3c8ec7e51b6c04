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

Sampling from the toy, the estimators under test and the bias / variance harness live beside
this file in ``toy_harness.py`` (``python toy_harness.py`` prints the table).

Departures and caveats
- The variance-optimal per-position baseline is in general *not* OTB's B_t: for the tabular
  policy it is E[G_t w_t] / E[w_t] (this position's energy), while OTB weights by the energy
  accumulated so far, W_t. ``toy_harness.py`` measures how much that costs.
"""
import itertools
from dataclasses import dataclass, field

import torch
from torch import nn

import otb

EOS = 0  # token 0 ends a response
REWARDS = ("long_finish", "streak", "length")
POLICIES = ("tabular", "shared")
MAX_RESPONSES = 200_000  # enumeration (and per-response scores) must fit in memory and a minute


def arg(default, help):
    """A dataclass field with its --help text (toy_harness.py's options)."""
    return field(default=default, metadata={"help": help})


@dataclass
class ToyConfig:
    """The toy bandit; every field is also a command-line option of toy_harness.py (--min-len)."""
    K: int = arg(3, "vocabulary size including EOS (token 0); (K-1)^(L-1) responses have length L")
    T: int = arg(7, "maximum response length; a response without EOS by then is cut off")
    policy: str = arg("tabular", "'tabular' (one softmax per position: proxy exact) or "
                                  "'shared' (embedding + RNN over the prefix: proxy approximate)")
    reward: str = arg("long_finish", "'long_finish' (default, sparse), 'streak' or 'length' (dense)")
    min_len: int = arg(5, "'long_finish' pays 1 for a response that ended with EOS at length >= min_len")
    eos_bias: float = arg(1.0, "added to the initial EOS logit: > 0 makes short answers typical, success rare")
    init_scale: float = arg(0.5, "std of the random initial logits / weights")
    hidden: int = arg(8, "hidden size of the shared policy's RNN (the embedding has half of it)")
    seed: int = arg(0, "seed of the initial policy and of the Monte Carlo groups")


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
        bos = torch.full((B, 1), self.K, dtype=tokens.dtype)  # BOS before the first token
        prev = torch.cat([bos, tokens[:, :-1]], dim=1)  # the previous token at each position, (B, T)
        x = self.embed[prev]  # (B, T, E)
        h = torch.zeros(B, self.w_rec.shape[0], dtype=x.dtype)
        logits = []
        for t in range(T):  # recurrence over at most T positions
            h = torch.tanh(x[:, t] @ self.w_in.T + h @ self.w_rec.T + self.b_rec)  # (B, H)
            logits.append(h @ self.w_out.T + self.b_out)  # (B, K)
        return torch.stack(logits, dim=1)


def check_config(cfg):
    """Raise ValueError naming the first bad field of a ToyConfig (as its option: --min-len)."""
    n_responses = sum((cfg.K - 1) ** (L - 1) for L in range(1, cfg.T + 1)) + (cfg.K - 1) ** cfg.T
    checks = [("--K", cfg.K, cfg.K >= 2, "must be >= 2 (EOS and at least one other token)"),
              ("--T", cfg.T, cfg.T >= 2, "must be >= 2 (responses of different lengths)"),
              ("--T", cfg.T, cfg.K < 2 or cfg.T < 2 or n_responses <= MAX_RESPONSES,
               f"with --K {cfg.K} gives {n_responses} responses, more than {MAX_RESPONSES} to enumerate"),
              ("--policy", cfg.policy, cfg.policy in POLICIES, f"must be one of {POLICIES}"),
              ("--reward", cfg.reward, cfg.reward in REWARDS, f"must be one of {REWARDS}"),
              ("--min-len", cfg.min_len, 1 <= cfg.min_len <= cfg.T, f"must be in 1..T ({cfg.T})"),
              ("--hidden", cfg.hidden, cfg.hidden >= 2, "must be >= 2"),
              ("--eos-bias", cfg.eos_bias, abs(cfg.eos_bias) < 1e6, "must be a finite number"),
              ("--init-scale", cfg.init_scale, 0 <= cfg.init_scale < 1e6, "must be finite and >= 0")]
    for flag, value, ok, why in checks:
        if not ok:
            raise ValueError(f"{flag} {value} {why}")


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
    token_rewards = torch.zeros_like(mask)  # r_t, (M, T)
    token_rewards[torch.arange(len(R)), last] = R  # R at each response's last token
    G = token_rewards.flip(-1).cumsum(-1).flip(-1) * mask  # G_t, (M, T)

    lp, logits = token_log_probs(policy, tokens, mask)  # (M, T), (M, T, K)
    pi = lp.sum(-1).exp()  # pi(tau), (M,)
    J = (pi * R).sum()  # J(theta) = sum_tau pi(tau) R(tau)
    grads = torch.autograd.grad(J, list(policy.parameters()))
    grad_J = torch.cat([g.reshape(-1) for g in grads])  # (P,)

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
# Exact checks used by the tests, the notebook and the printed summary
# =====================================================================================

def martingale_sides(en):
    """(E||S_<=t||^2, E[W_t]) per position with exact norms, both (T,): equal, cross terms vanish."""
    return en.expect(en.prefix_sq), en.expect(en.w_exact.cumsum(-1))


def proxy_correlation(en):
    """pi-weighted Pearson correlation of the proxy with the exact ||s_t||^2 over valid tokens: an exact
    expectation under pi over the enumerated responses, not a statistic of a sample, so it is written in
    torch like the file's other exact quantities rather than taken from a statistics library."""
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


