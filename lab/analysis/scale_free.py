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
reinforce, rloo, otb_loo and the sequence-level optimal baselines over the other rows (opo_loo,
seq_proxy_loo, seq_exact_loo: no baseline, or one built from the *other* responses) have E g = grad J; the group mean includes the row's own reward with weight 1/N, whose score has mean
0 against everything but itself, so E g = (1 - 1/N) grad J. For those alpha = c and cosine = 1
exactly, and two of them compare without any estimated signal:

    nvar(a) / nvar(b) = (tr Var(g_a) / c_a^2) / (tr Var(g_b) / c_b^2)                     (5)

Estimating from samples
-----------------------
Samples come in *units* u = 1..U: a prompt of a language model, or a block of groups on the toy.
Unit u gives K_u i.i.d. gradient samples with mean m_u and unbiased within-unit tr Var V_u, and a
reference r_u (an estimate for that prompt, or the exact r for every unit). With unit weights
w_u (1/U; a bootstrap draw in ``resampling.py`` reweights them):

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
estimate of ||E g||^2 can still come out <= 0 when the signal is lost in the noise: then (2) is
nan ("unresolved"), and (3), a ratio with that signal as denominator, gets ``resampling.py``'s eq. (4')
set, which is then one-sided (nvar at least so much) or says nothing. V (6) is the noise *within* a prompt, the part a
baseline acts on; nvar leaves out the spread between prompts' mean gradients, which a training
batch of several prompts also carries. Everything is computed from U x U Gram matrices of the
unit means and references (``gram_stats``), so million-parameter gradients cost U^2 dot products,
and the Gram matrices are what a results file saves for anyone to re-bootstrap.
"""
import math

import torch

from lab.analysis import resampling

# E g = c(N) grad J exactly (see "Known expectations"); absent: E g is unknown and estimated.
FACTORS = {"reinforce": lambda N: 1.0, "rloo": lambda N: 1.0, "otb_loo": lambda N: 1.0,
           "group_mean": lambda N: 1.0 - 1.0 / N,
           # the sequence-level optimal baseline over the other rows (otb eq. 9), whatever the energy
           "opo_loo": lambda N: 1.0, "seq_proxy_loo": lambda N: 1.0, "seq_exact_loo": lambda N: 1.0}
METRICS = ("alpha", "cosine", "nvar", "rmse", "raw_variance", "signal")
RANGE = {"cosine": (-1.0, 1.0), "rmse": (0.0, 1.0), "nvar": (0.0, math.inf), "raw_variance": (0.0, math.inf),
         "gain": (0.0, math.inf)}  # where each metric can lie; printing never leaves it without a mark
SETS = ("nvar", "gain")  # ratios reported as resampling.py's eq. (4') sets


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
                raw_variance=variance, signal=signal, ref_sq=ref_sq, dot=dot)


def evaluations(units, factors=None, replicates=2000, seed=0, j_gram=None):
    """Eqs. (1)-(8) of every estimator at the point (w_u = 1/U) and on R bootstrap draws of the units
    (resampling.py), the same draws for every estimator: (point {name: {metric: (1,)}}, boot {name: {metric: (R,)}})."""
    factors = factors or {}
    U = next(iter(units.values()))["V"].shape[0]
    w_point = torch.full((1, U), 1.0 / U, dtype=torch.float64)
    w_boot = resampling.bootstrap_weights(U, replicates, seed)  # (R, U): the same draws for every estimator
    return ({e: evaluate(s, w_point, factors.get(e), j_gram) for e, s in units.items()},
            {e: evaluate(s, w_boot, factors.get(e), j_gram) for e, s in units.items()})


def gain_parts(evals, e, b, factors=None):
    """The gain nvar(b) / nvar(e) = (S_e / V_e) / (S_b / V_b) as a ratio num / den, over one or more
    strata (seeds): evals = [(point, boot), ...] from ``evaluations``, each seed with its own draws.
    Summed over strata (resampling.py eq. (5)): num = sum S_e * sum V_b, den = sum V_e * sum S_b, with S the
    signal ||E g||^2 and V = tr Var; with both factors known, num = c_e^2 sum V_b, den = c_b^2 sum V_e
    (eq. (5): no estimated signal). Returns (num, den, num (R,), den (R,))."""
    factors = factors or {}

    def total(name, key):  # (sum of the points, sum of the replicates)
        return resampling.stratified([(pt[name][key].item(), bt[name][key]) for pt, bt in evals])
    (Ve, Ve_r), (Vb, Vb_r) = total(e, "raw_variance"), total(b, "raw_variance")
    if e in factors and b in factors:
        ce, cb = factors[e] ** 2, factors[b] ** 2
        return ce * Vb, cb * Ve, ce * Vb_r, cb * Ve_r
    (Se, Se_r), (Sb, Sb_r) = total(e, "signal"), total(b, "signal")
    return Se * Vb, Ve * Sb, Se_r * Vb_r, Ve_r * Sb_r


def bootstrap(units, factors=None, baseline=None, replicates=2000, seed=0, level=0.95, j_gram=None,
              evals=None):
    """Every metric of every estimator with a paired bootstrap interval over units (resampling.py).

    units: {name: gram_stats(...)}, all over the same units (the same prompts). factors: {name: c}
    for the estimators whose E g = c r is known; their ||grad J||^2 comes from j_gram (eq. (8); None: the
    references). baseline: a name; adds ``gain`` = nvar(baseline) / nvar(e) = snr(e) / snr(baseline)
    with snr = 1 / nvar (exact ratio of variances by (5) when both factors are known).
    nvar and gain are ratios whose denominator can be weak: their interval is resampling.py's eq. (4') set
    within [0, inf) (an end at 0 or inf is open: a one-sided bound). alpha, cosine and rmse take the
    percentile interval, nan (unresolved) where a quantity they divide by is not resolved.
    evals: (point, boot) from ``evaluations`` with these arguments, when the caller has them already.
    Returns {name: {metric: (value, lo, hi)}}, values as estimated, plus ``out_of_range``: the metrics
    whose value or interval end lies outside RANGE (a table prints them clipped and marked), and with a
    baseline ``verdict``: the gain above 1, below, around it, or at the edge (resampling.replicate_verdict).
    """
    factors = factors or {}
    point, boot = evals or evaluations(units, factors, replicates, seed, j_gram)
    out = {}
    for e in units:
        ref_lo, ref_hi = resampling.interval(boot[e]["ref_sq"], level)
        sig_lo, sig_hi = resampling.interval(boot[e]["signal"], level)
        row = {}
        for k in METRICS:
            p = point[e][k].item()
            needs = dict(alpha=[(ref_lo, ref_hi)], cosine=[(ref_lo, ref_hi), (sig_lo, sig_hi)],
                         rmse=[(ref_lo, ref_hi)]).get(k, [])
            if k == "nvar":  # V / S, eq. (4') within [0, inf); no signal at the point: nvar is unbounded
                V, S = point[e]["raw_variance"].item(), point[e]["signal"].item()
                lo, hi = resampling.inverted_set(boot[e]["raw_variance"], boot[e]["signal"], V, S, level=level, low=0.0)
                row[k] = (V / S if S > 0 else math.inf, lo, hi)
            elif any(resampling.covers_zero(lo, hi) for lo, hi in needs) or not math.isfinite(p):
                row[k] = (math.nan, math.nan, math.nan)  # unresolved
            else:  # a resolved quantity is undefined in few replicates (< 2.5%): left out
                reps = boot[e][k]
                row[k] = (p, *resampling.interval(reps[~reps.isnan()], level))
        out[e] = row
    for e in units:
        if baseline is not None:
            out[e]["gain"] = gain([(point, boot)], e, baseline, factors, level)
            out[e]["verdict"] = gain_verdict([(point, boot)], e, baseline, factors, level) if e != baseline else "-"
        out[e]["out_of_range"] = [k for k, v in out[e].items() if k in RANGE and resampling.clip(*v, *RANGE[k])[3]]
    return out


def cell(key, interval, factor=None, digits=2, exact=".3g", moved=False):
    """One metric for a table: alpha = c and cosine = 1 marked "(exact)" where E g = c grad J is known
    (``factor``); nvar and gain, eq. (4') sets, as "value [lo, hi]", a one-sided bound or "unresolved"
    (resampling.fmt_set); the others as "value [lo, hi]" inside RANGE[key], each clipped number marked *
    (``moved``: the value was clipped before it was stored)."""
    if key in ("alpha", "cosine") and factor is not None:
        return f"{factor if key == 'alpha' else 1.0:{exact}} (exact)"
    low, high = RANGE.get(key, (-math.inf, math.inf))
    if key in SETS:
        return resampling.fmt_set(*interval, digits=digits, low=low, high=high)
    return resampling.fmt(*interval, digits=digits, low=low, high=high, moved=moved)


def gain(evals, e, b, factors, level=0.95):
    """snr(e) / snr(b) = nvar(b) / nvar(e), with snr = signal / tr Var, over the strata ``evals``
    (``gain_parts``): (value, lo, hi), the eq. (4') set of resampling.py within [0, inf)."""
    return resampling.ratio_set(*gain_parts(evals, e, b, factors), level=level, low=0.0)


def gain_verdict(evals, e, b, factors, level=0.95):
    """Whether the gain lies above 1, below 1, around it, or at the Monte Carlo edge (resampling.replicate_verdict)."""
    _, _, num_r, den_r = gain_parts(evals, e, b, factors)
    return resampling.replicate_verdict(num_r, den_r, level=level)
