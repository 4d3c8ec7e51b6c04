"""Judging a gradient estimator without rewarding a smaller gradient: scale-free metrics.

A baseline changes two things about the policy-gradient estimate g: its noise, and, for the
biased ones, its expected value. OTB includes the row's own return in its baseline, GRPO divides
by the group's standard deviation, Dr.GRPO's group mean includes the row itself: each shrinks or
rescales E g. A raw variance or a raw mean squared error then counts a *smaller* gradient as a
*better* one, although Adam (or a learning rate tuned per method) undoes any constant rescaling.
What matters is noise per unit of signal. With r the true gradient (exact on the toy bandit, a
large separate unbiased pool on a language model):

    alpha   = <E g, r> / ||r||^2                          (1) how much of r survives, on average
    cosine  = <E g, r> / (||E g|| ||r||)                  (2) direction of the mean (bias, not scale)
    nvar    = tr Var(g) / ||E g||^2                       (3) normalised variance: noise per signal
    rmse    = min_c E||c g - r||^2 / ||r||^2              (4) MSE after the best single rescaling
            = 1 - <E g, r>^2 / (||r||^2 E||g||^2)   with E||g||^2 = tr Var(g) + ||E g||^2

When the estimate of ||E g||^2 is not positive (the signal is lost in the noise of the samples),
(2) and (3) are returned as nan rather than a meaningless number. (1) scales with g, (2)-(4) do not: multiplying g by any c > 0 leaves them unchanged. Estimators
that differ only by a constant factor (RLOO is exactly N / (N - 1) times the group mean, sample by
sample) have equal (2)-(4) although RLOO's raw variance is (N / (N - 1))^2 times larger. For an
unbiased estimator (E g = r) alpha = cosine = 1 and nvar is the raw variance in units of ||r||^2.
The raw variance and raw MSE are still returned, labelled ``raw_``: never read them as quality.

Estimating them from samples
----------------------------
Samples come in *units* u = 1..U (a prompt of a language model, or a block of groups on the
toy); unit u gives K_u i.i.d. gradient samples with mean m_u and unbiased tr Var V_u. Then

    E g  ~  m = (1/U) sum_u m_u                     tr Var(g)  ~  V = (1/U) sum_u V_u
    ||E g||^2  ~  ||m||^2 - (1/U^2) sum_u V_u / K_u           (5) unbiased: removes the noise of m

and (1)-(4) are formed from these. ``ref_var`` does the same for a reference that is itself an
estimate (||r||^2 ~ ||r_hat||^2 - ref_var; if that is not positive, r is noise and alpha, cosine
and rmse are returned as nan). Standard errors: delete-one-unit jackknife. Everything
is computed from the U x U Gram matrix of the unit means and their dot products with r, so
million-parameter gradients cost U^2 dot products, not U copies.
"""
import math

import torch


def unit_summary(samples):
    """One unit's i.i.d. gradient samples (K, D) -> (mean (D,), unbiased tr Var, K)."""
    samples = torch.as_tensor(samples, dtype=torch.float64)
    if samples.dim() != 2 or samples.shape[0] < 2:
        raise ValueError(f"samples must be (K, D) with K >= 2, got shape {tuple(samples.shape)}")
    mean = samples.mean(0)  # m_u, (D,)
    var = ((samples - mean) ** 2).sum().item() / (samples.shape[0] - 1)  # V_u
    return mean, var, samples.shape[0]


def _metrics(gram, dots, V, inv_counts, ref_sq, weights):
    """(1)-(4) for unit weights ``weights`` (U,): m = sum_u weights_u m_u."""
    signal_dot = (weights @ dots).item()  # <m, r>
    mean_sq = (weights @ gram @ weights).item()  # ||m||^2
    variance = (weights @ V).item() / weights.sum().item()  # V = mean_u V_u
    mean_sq_unbiased = mean_sq - ((weights ** 2) @ (V * inv_counts)).item()  # eq. (5)
    second_moment = variance + mean_sq_unbiased  # E||g||^2
    raw_mse = second_moment - 2 * signal_dot + ref_sq  # E||g - r||^2
    signal = mean_sq_unbiased > 0  # else ||E g||^2 is lost in the noise: (2) and (3) are nan
    return dict(alpha=signal_dot / ref_sq,  # (1)
                cosine=signal_dot / math.sqrt(mean_sq_unbiased * ref_sq) if signal else math.nan,  # (2)
                nvar=variance / mean_sq_unbiased if signal else math.nan,  # (3)
                rmse=1 - signal_dot ** 2 / (ref_sq * second_moment) if second_moment > 0 else math.nan,  # (4)
                raw_variance=variance, raw_mse=raw_mse, mean_sq_norm=mean_sq_unbiased)


def scale_free_metrics(means, variances, counts, ref, ref_var=0.0):
    """Eqs. (1)-(5) with delete-one-unit jackknife standard errors.

    means (U, D): per-unit mean gradients m_u; variances (U,): V_u; counts (U,): K_u; ref (D,): r;
    ref_var: variance of r if r is itself an estimate (0 for an exact gradient).
    Returns {name: value, name + "_se": jackknife s.e.} for alpha, cosine, nvar, rmse and the raw
    variance / raw MSE (both in the units of ||g||^2, not divided by anything).
    """
    means = torch.as_tensor(means, dtype=torch.float64)  # (U, D)
    ref = torch.as_tensor(ref, dtype=torch.float64)  # (D,)
    if means.dim() != 2 or ref.shape != means.shape[1:]:
        raise ValueError(f"means must be (U, D) and ref (D,), got {tuple(means.shape)} and {tuple(ref.shape)}")
    U = means.shape[0]
    V = torch.as_tensor(variances, dtype=torch.float64).reshape(U)  # V_u
    inv_counts = 1.0 / torch.as_tensor(counts, dtype=torch.float64).reshape(U)  # 1 / K_u
    ref_sq = (ref @ ref).item() - ref_var  # ||r||^2, debiased; <= 0: r is pure noise
    if ref_sq <= 0:
        ref_sq = float("nan")  # alpha, cosine and rmse are then undefined (nan); nvar is not
    gram, dots = means @ means.T, means @ ref  # (U, U), (U,)
    full = _metrics(gram, dots, V, inv_counts, ref_sq, torch.full((U,), 1.0 / U, dtype=torch.float64))
    out = dict(full)
    if U >= 2:  # jackknife: drop one unit at a time
        drops = [_metrics(gram, dots, V, inv_counts, ref_sq,
                          torch.where(torch.arange(U) == u, 0.0, 1.0 / (U - 1)).double()) for u in range(U)]
        for k in full:
            vals = torch.tensor([d[k] for d in drops], dtype=torch.float64)
            out[k + "_se"] = math.sqrt((U - 1) / U * ((vals - vals.mean()) ** 2).sum().item())
    else:
        out.update({k + "_se": float("nan") for k in full})
    return out


def metrics_from_samples(samples, ref, units=20, ref_var=0.0):
    """i.i.d. samples (K, D) of one estimator -> scale_free_metrics, with ``units`` blocks of samples."""
    samples = torch.as_tensor(samples, dtype=torch.float64)
    K = samples.shape[0]
    units = min(units, K // 2)
    if units < 1:
        raise ValueError(f"need at least 2 samples, got {K}")
    blocks = [unit_summary(b) for b in samples[: K - K % units].chunk(units)]  # equal blocks
    return scale_free_metrics(torch.stack([b[0] for b in blocks]), [b[1] for b in blocks],
                              [b[2] for b in blocks], ref, ref_var)
