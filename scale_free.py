"""Judging a gradient estimator without rewarding a smaller gradient: scale-free metrics.

A baseline changes two things about the policy-gradient estimate g: its noise, and, for the
biased ones, its expected value. OTB includes the row's own return in its baseline, GRPO divides
by the group's standard deviation, Dr.GRPO's group mean includes the row itself: each shrinks or
rescales E g. A raw variance or a raw mean squared error then counts a *smaller* gradient as a
*better* one, although Adam (or a learning rate tuned per method) undoes any constant rescaling.
What matters is noise per unit of signal. With r the true gradient grad J (exact on the toy
bandit, an unbiased estimate from a separate pool of responses on a language model):

    alpha   = <E g, r> / ||r||^2                          (1) how much of r survives, on average
    cosine  = <E g, r> / (||E g|| ||r||)                  (2) direction of the mean, in [-1, 1]
    nvar    = tr Var(g) / ||E g||^2                       (3) normalised variance: noise per signal
    rmse    = min_c E||c g - r||^2 / ||r||^2              (4) MSE after the best rescaling, in [0, 1]
            = 1 - <E g, r>^2 / (||r||^2 E||g||^2)   with E||g||^2 = tr Var(g) + ||E g||^2

(1) scales with g, (2)-(4) do not. For an unbiased estimator alpha = cosine = 1.

Known expectations
------------------
For some estimators E g is known exactly, as a multiple of r = grad J (``FACTORS``):
reinforce, rloo and otb_loo (no baseline, or one built from the *other* responses) have
E g = grad J; the group mean includes the row's own reward with weight 1/N, whose score has mean
0 against everything but itself, so E g = (1 - 1/N) grad J. For those alpha = c and cosine = 1
exactly, and two of them compare without any estimated signal:

    nvar(a) / nvar(b) = (tr Var(g_a) / c_a^2) / (tr Var(g_b) / c_b^2)                     (5)

Estimating from samples
-----------------------
Samples come in *units* u = 1..U: a prompt of a language model, or a block of groups on the toy.
Unit u gives K_u i.i.d. gradient samples with mean m_u and unbiased within-unit tr Var V_u, and a
reference r_u (an estimate for that prompt, or the exact r for every unit). With unit weights
w_u (1/U; a bootstrap draw in ``stats.py`` reweights them):

    tr Var(g)  ~  V = sum_u w_u V_u                                                      (6)
    ||E g||^2 ~ P(m, m),   <E g, r> ~ P(m, r),   ||r||^2 ~ P(r, r)                        (7)
    P(a, b) = sum_{u != v} w_u w_v <a_u, b_v> / sum_{u != v} w_u w_v      (pairs of *different* units)

For the estimators whose E g = c grad J is known, only ||grad J||^2 is needed, and any
unbiased per-prompt estimate of grad J serves; ``pooled_reference`` averages two independent ones
(the reference pool's r_u and REINFORCE's m_u on the pool); where the two are about equally
noisy, that halves the response noise of each prompt's estimate (not the spread between prompts):

    ||E g||^2 = c^2 ||grad J||^2 ~ c^2 P(j, j),   j_u = (r_u + m_u^reinforce) / 2               (8)

Different units are independent, so each product in (7) and (8) is unbiased for the population
quantity: ||E g||^2 over the distribution of prompts, not only over the sampled ones (keeping
u = v would add each unit's own noise and the spread of the prompts' own gradients). The
estimate of ||E g||^2 can still come out <= 0 when the signal is lost in the noise: then (2), (3)
are nan, and ``stats.py`` prints "unresolved". V (6) is the noise *within* a prompt, the part a
baseline acts on; nvar leaves out the spread between prompts' mean gradients, which a training
batch of several prompts also carries. Everything is computed from U x U Gram matrices of the
unit means and references (``gram_stats``), so million-parameter gradients cost U^2 dot products,
and the Gram matrices are what a results file saves for anyone to re-bootstrap.
"""
import math

import torch

import stats

# E g = c(N) grad J exactly (see "Known expectations"); absent: E g is unknown and estimated.
FACTORS = {"reinforce": lambda N: 1.0, "rloo": lambda N: 1.0, "otb_loo": lambda N: 1.0,
           "group_mean": lambda N: 1.0 - 1.0 / N}
METRICS = ("alpha", "cosine", "nvar", "rmse", "raw_variance", "signal")
RANGE = {"cosine": (-1.0, 1.0), "rmse": (0.0, 1.0), "nvar": (0.0, math.inf), "raw_variance": (0.0, math.inf),
         "gain": (0.0, math.inf)}  # where each metric can lie; printing never leaves it


def unit_summary(samples):
    """One unit's i.i.d. gradient samples (K, D) -> (mean (D,), unbiased tr Var, K)."""
    samples = torch.as_tensor(samples, dtype=torch.float64)
    if samples.dim() != 2 or samples.shape[0] < 2:
        raise ValueError(f"samples must be (K, D) with K >= 2, got shape {tuple(samples.shape)}")
    mean = samples.mean(0)  # m_u, (D,)
    var = ((samples - mean) ** 2).sum().item() / (samples.shape[0] - 1)  # V_u
    return mean, var, samples.shape[0]


def gram_stats(means, variances, refs):
    """The sufficient statistics of one estimator: means (U, D), variances (U,), refs (U, D) or an
    exact (D,) -> dict(gram (U, U) <m_u, m_v>, cross (U, U) <m_u, r_v>, ref_gram (U, U), V (U,))."""
    means = torch.as_tensor(means, dtype=torch.float64)  # (U, D)
    refs = torch.as_tensor(refs, dtype=torch.float64)
    if means.dim() != 2 or means.shape[0] < 2:
        raise ValueError(f"means must be (U, D) with U >= 2 units, got shape {tuple(means.shape)}")
    U = means.shape[0]
    if refs.dim() == 1:
        refs = refs.expand(U, -1)  # the exact r, the same for every unit
    if refs.shape != means.shape:
        raise ValueError(f"refs must be (D,) or (U, D) like means {tuple(means.shape)}, got {tuple(refs.shape)}")
    V = torch.as_tensor(variances, dtype=torch.float64).reshape(U)  # V_u
    return dict(gram=means @ means.T, cross=means @ refs.T, ref_gram=refs @ refs.T, V=V)


def pairs(M, w):
    """Eq. (7): P = sum_{u != v} w_u w_v M_uv / sum_{u != v} w_u w_v for weights w (R, U) -> (R,)."""
    full = torch.einsum("ru,uv,rv->r", w, M, w)
    diag = (w ** 2) @ torch.diagonal(M)
    return (full - diag) / (1 - (w ** 2).sum(-1))  # rows of w sum to 1


def pooled_reference(unbiased):
    """Eq. (8): the Gram matrix (U, U) of j_u = (r_u + m_u) / 2 from the gram_stats of an estimator
    whose E g = grad J (its means m_u and references r_u are independent samples of each prompt)."""
    R, C, G = unbiased["ref_gram"], unbiased["cross"], unbiased["gram"]  # <r, r>, <m, r>, <m, m>
    return (R + C + C.T + G) / 4


def evaluate(s, w, factor=None, j_gram=None):
    """Eqs. (1)-(8) for unit weights w (R, U), from gram_stats ``s``. factor: the known c of E g = c r,
    or None (estimated); j_gram: eq. (8)'s Gram matrix for ||grad J||^2 (default: the references').
    Returns {metric: (R,) tensor}; nan where the signal is not positive."""
    variance = w @ s["V"]  # (6), (R,)
    ref_sq = pairs(s["ref_gram"], w)  # ||r||^2
    if factor is None:
        signal, dot = pairs(s["gram"], w), pairs(s["cross"], w)  # ||E g||^2, <E g, r>
    else:
        J_sq = ref_sq if j_gram is None else pairs(j_gram, w)  # ||grad J||^2, eq. (8)
        signal, dot, ref_sq = factor ** 2 * J_sq, factor * J_sq, J_sq
    nan = torch.full_like(variance, math.nan)
    ok, ref_ok = signal > 0, ref_sq > 0
    second = variance + signal  # E||g||^2
    return dict(alpha=torch.where(ref_ok, dot / ref_sq, nan),  # (1)
                cosine=torch.where(ok & ref_ok, dot / (signal * ref_sq).clamp_min(1e-300).sqrt(), nan),  # (2)
                nvar=torch.where(ok, variance / signal, math.inf),  # (3); no signal: unbounded
                rmse=torch.where(ref_ok & (second > 0), 1 - dot ** 2 / (ref_sq * second), nan),  # (4)
                raw_variance=variance, signal=signal, ref_sq=ref_sq)


def bootstrap(units, factors=None, baseline=None, replicates=2000, seed=0, level=0.95, j_gram=None):
    """Every metric of every estimator with a paired bootstrap interval over units (stats.py).

    units: {name: gram_stats(...)}, all over the same units (the same prompts). factors: {name: c}
    for the estimators whose E g = c r is known; their ||grad J||^2 comes from j_gram (eq. (8); None: the
    references). baseline: a name; adds ``gain`` = nvar(baseline) /
    nvar(e) = snr(e) / snr(baseline) with snr = 1 / nvar (exact ratio of variances by (5) when both
    factors are known; "unresolved" (nan) when the baseline's signal is not resolved).
    Returns {name: {metric: (value, lo, hi)}}; a metric whose signal is not resolved is nan.
    """
    factors = factors or {}
    U = next(iter(units.values()))["V"].shape[0]
    w_point = torch.full((1, U), 1.0 / U, dtype=torch.float64)
    w_boot = stats.bootstrap_weights(U, replicates, seed)  # (R, U): the same draws for every estimator
    point = {e: evaluate(s, w_point, factors.get(e), j_gram) for e, s in units.items()}
    boot = {e: evaluate(s, w_boot, factors.get(e), j_gram) for e, s in units.items()}
    out = {}
    for e in units:
        sig_lo, sig_hi = stats.interval(boot[e]["signal"], level)
        ref_lo, ref_hi = stats.interval(boot[e]["ref_sq"], level)
        row = {}
        for k in METRICS:
            p = point[e][k].item()
            needs = dict(alpha=[(ref_lo, ref_hi)], cosine=[(ref_lo, ref_hi), (sig_lo, sig_hi)],
                         nvar=[(sig_lo, sig_hi)], rmse=[(ref_lo, ref_hi)]).get(k, [])
            if any(stats.covers_zero(lo, hi) for lo, hi in needs) or not math.isfinite(p):
                row[k] = (math.nan, math.nan, math.nan)  # unresolved
            else:  # a resolved quantity is undefined in few replicates (< 2.5%): left out
                reps = boot[e][k]
                row[k] = (p, *stats.interval(reps[~reps.isnan()], level))
        out[e] = row
    if baseline is not None:
        for e in units:
            out[e]["gain"] = gain(point, boot, e, baseline, factors, level)
    return out


def cell(key, interval, factor=None, digits=2, exact=".3g"):
    """One metric for a table: alpha = c and cosine = 1 marked "(exact)" where E g = c grad J is known
    (``factor``), else "value [lo, hi]" from interval = (value, lo, hi), printed inside RANGE[key]."""
    if key in ("alpha", "cosine") and factor is not None:
        return f"{factor if key == 'alpha' else 1.0:{exact}} (exact)"
    low, high = RANGE.get(key, (-math.inf, math.inf))
    return stats.fmt(*interval, digits=digits, low=low, high=high)


def gain(point, boot, e, b, factors, level=0.95):
    """snr(e) / snr(b) = nvar(b) / nvar(e), with snr = signal / tr Var: (value, lo, hi) or nan."""
    def snr_ratio(ev):
        num = ev[e]["signal"] / ev[e]["raw_variance"]
        if e in factors and b in factors:  # eq. (5): no estimated signal at all
            return (factors[e] / factors[b]) ** 2 * ev[b]["raw_variance"] / ev[e]["raw_variance"]
        return num * ev[b]["raw_variance"] / ev[b]["signal"]
    if e in factors and b in factors:
        den_lo = den_hi = 1.0  # known: always resolved
    else:
        den_lo, den_hi = stats.interval(boot[b]["signal"], level)
    return stats.ratio(snr_ratio(point).item(), snr_ratio(boot), den_lo, den_hi, level)
