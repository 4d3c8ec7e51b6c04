"""Saved sufficient statistics in a compact form: what a variance sweep keeps of each prompt, small
enough to commit, and everything a re-analysis reads.

A sweep saves, per cell (n, seed) and per (estimator, N), the gram_stats of scale_free.py over its U
prompts: V (U,), and three U x U matrices, gram <m_u, m_v>, cross <m_u, r_v> and ref_gram <r_u, r_v>.
The analysis reads less than that, and this module stores only what it reads:

1. **ref_gram is the cell's, not the estimator's.** Every estimator of a cell has the same references
   r_u, so their ref_gram matrices are equal: stored once per cell (per estimator where they differ).
2. **Only the symmetric part of cross is read.** Every use of a matrix M is a pair sum
   sum_{u != v} w_u w_v M_uv (scale_free.pairs) or C + C^T (scale_free.pooled_reference), and both see
   only (M + M^T) / 2. So cross is stored as its symmetric part; gram and ref_gram are symmetric.
   A symmetric matrix is stored as its upper triangle, U (U + 1) / 2 numbers.
3. **gram and cross are read only where E g is not known.** For an estimator with a known factor
   (scale_free.FACTORS: E g = c grad J), evaluate() takes the signal from the references, so its gram
   and cross are never read, except reinforce's, which pooled_reference combines into ||grad J||^2.
4. **The matrices are stored in 16-bit floats, scaled.** Each matrix is divided by its largest
   absolute entry (kept in float64) and rounded to float16: every entry is kept within 2^-11 of the
   matrix's largest entry (float16 has 11 significant bits). The pair sums the analysis takes average
   U (U - 1) such errors, which are not systematic, so a gain moves far less than that; V, the
   per-prompt variances, stay float64. docs/variance.md gives what re-analysing the committed sweeps
   from this form moved.

No library stores "a Gram matrix of which only the symmetric part and some blocks are read": the
choice of what to keep follows from this project's analysis, so it is written here.
"""
import numpy as np
import torch

from lab.analysis import scale_free

FORMAT = "gram-stats-compact-1"


def needs_signal(estimator):
    """True when the analysis reads the estimator's gram and cross (its E g is not known, or it is
    reinforce, whose matrices give ||grad J||^2)."""
    return estimator not in scale_free.FACTORS or estimator == "reinforce"


def scaled(x):
    """Numbers -> (them divided by their largest absolute value, in float16; that value in float64): each
    kept within 2^-11 of the largest (the scale is 0 for all zeros, which are kept as they are)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    scale = x.abs().max().item()
    return (x / scale if scale > 0 else x).numpy().astype(np.float16), np.float64(scale)


def unscaled(values, scale):
    """The inverse of scaled, in float64."""
    return torch.from_numpy(np.asarray(values, dtype=np.float64)) * float(scale)


def pack(M):
    """A matrix (U, U) -> (its symmetric part's upper triangle as scaled float16 (U (U + 1) / 2,), scale)."""
    M = torch.as_tensor(M, dtype=torch.float64)
    S = (M + M.T) / 2  # the part that pair sums read
    i, j = torch.triu_indices(len(S), len(S))
    return scaled(S[i, j])


def unpack(values, scale, U):
    """The inverse of pack: a symmetric (U, U) float64 matrix."""
    i, j = torch.triu_indices(U, U)
    M = torch.zeros(U, U, dtype=torch.float64)
    v = unscaled(values, scale)
    M[i, j] = v
    M[j, i] = v
    return M


def save(path, grams_by_cell):
    """{(n, seed): {(estimator, N): gram_stats}} -> one .npz: per cell 'n64_seed0/ref_gram' (when every
    estimator's is the same) and per (estimator, N) 'n64_seed0/otb/N4/V', and '.../gram', '.../cross' where
    ``needs_signal``; each matrix as its packed values and '<key>.scale'."""
    arrays = {"format": np.array(FORMAT)}

    def put(key, M):
        arrays[key], arrays[key + ".scale"] = pack(M)
    for (n, seed), grams in grams_by_cell.items():
        cell = f"n{n}_seed{seed}"
        refs = [s["ref_gram"] for s in grams.values()]
        shared = all(torch.equal(r, refs[0]) for r in refs)
        if shared:
            put(f"{cell}/ref_gram", refs[0])
        for (e, N), s in grams.items():
            arrays[f"{cell}/{e}/N{N}/V"] = s["V"].numpy()
            if not shared:
                put(f"{cell}/{e}/N{N}/ref_gram", s["ref_gram"])
            if needs_signal(e):
                put(f"{cell}/{e}/N{N}/gram", s["gram"])
                put(f"{cell}/{e}/N{N}/cross", s["cross"])
    np.savez_compressed(path, **arrays)


def load(path):
    """The inverse of save: {(n, seed): {(estimator, N): {V, ref_gram[, gram, cross]}}} in float64."""
    out, shared = {}, {}
    with np.load(path) as data:
        if "format" not in data.files or str(data["format"]) != FORMAT:
            raise ValueError(f"{path}: not a compact statistics file ({FORMAT}); lab.analysis.compact.load_full "
                             "reads the full format")
        keys = [k for k in data.files if k != "format" and not k.endswith(".scale")]
        for key in sorted(keys, key=lambda k: k.count("/")):  # a cell's shared ref_gram first
            parts = key.split("/")
            n, seed = (int(x) for x in parts[0][1:].split("_seed"))
            if len(parts) == 2:
                shared[(n, seed)] = (data[key], data[key + ".scale"])
                continue
            _, e, N, k = parts
            stats = out.setdefault((n, seed), {}).setdefault((e, int(N[1:])), {})
            if k == "V":
                stats["V"] = torch.from_numpy(data[key])
            else:
                stats[k] = (data[key], data[key + ".scale"])
    for cell, grams in out.items():
        for s in grams.values():
            U = s["V"].shape[0]
            if "ref_gram" not in s:
                s["ref_gram"] = shared[cell]
            for k in ("ref_gram", "gram", "cross"):
                if k in s:
                    s[k] = unpack(*s[k], U)
    return out


def load_full(path):
    """A statistics file in the full format (every matrix of every estimator in float64, keys
    'n64_seed0/otb/N4/gram'): {(n, seed): {(estimator, N): gram_stats}}."""
    out = {}
    with np.load(path) as data:
        for key in data.files:
            cell, e, N, k = key.split("/")
            n, seed = (int(x) for x in cell[1:].split("_seed"))
            out.setdefault((n, seed), {}).setdefault((e, int(N[1:])), {})[k] = torch.from_numpy(data[key])
    return out
