"""The slips students make in the exercises, each with the words its check's verdict must contain.

Teachers only: this file sits next to the solutions because a slip is a right answer with one thing
changed, so it gives the answers away (``handout.py`` leaves it out of a class copy). Two things use it:

* the tests (tests/test_notebooks_exercises.py, tests/test_notebooks_teaching_slips.py): every slip is
  run through its check, which must say NOT YET and name the slip;
* ``notebooks/exercises/ta_table.py``, which writes the teaching assistants' table slip -> hint
  (notebooks/exercises/ta_table.md) from what the checks print for each slip.

Every implementation is written from the formulas, row by row where that is clearer, so that a slip
is one visible change.
"""
import contextlib
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent  # notebooks/exercises/solutions
ROOT = Path(os.environ.get("OTB_ROOT", HERE.parent.parent.parent))
for path in (ROOT, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402

import check  # noqa: E402
import otb  # noqa: E402


@dataclass
class Slip:
    exercise: str  # "1a" ... "5c"
    what: str  # the slip, in a teaching assistant's words
    check: str  # the name of the check function in check.py
    answer: object  # the wrong implementation (a pair of functions for 5b)
    words: list  # what the verdict must contain
    kwargs: dict = field(default_factory=dict)  # passed on to the check
    toy: bool = False  # the check takes the toy bandit's enumeration after the answer
    named_in: str = ""  # the issue or test that asked for it, if any


def run(slip, en=None):
    """(ok, printed verdict) of the slip's check on the slip's answer."""
    fn = getattr(check, slip.check)
    answers = slip.answer if isinstance(slip.answer, tuple) else (slip.answer,)
    args = answers + ((en,) if slip.toy else ())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = fn(*args, **slip.kwargs)
    return ok, buf.getvalue()


# =====================================================================================
# Plain implementations with a switch for each slip
# =====================================================================================

def groups(g, B):
    gid, _ = otb.group_ids(g, B)
    return [gid == gid[i] for i in range(B)]  # the rows of row i's group, (B,) bool each


def group_estimator(kind):
    """Group baselines, correct ('mean', 'loo') or with a slip."""
    def f(r, m, g):
        mm = torch.ones_like(m) if kind == "no_mask" else m
        R = (r * mm).sum(-1)  # R_i, (B,)
        L = m.sum(-1)  # each row's number of valid tokens, (B,)
        A = torch.zeros_like(R)
        for i, same in enumerate(groups(g, len(R))):
            n = int(same.sum())
            others = R[same].sum() - R[i]
            if kind == "by_tokens" and n > 1:  # the mean of R over the group's valid tokens
                b = (R[same] * L[same]).sum() / L[same].sum()
            elif kind == "loo_by_tokens" and n > 1:
                b = ((R[same] * L[same]).sum() - R[i] * L[i]) / (L[same].sum() - L[i])
            elif kind == "batch_mean":
                b = R.mean()
            elif kind == "batch_loo":
                b = (R.sum() - R[i]) / (len(R) - 1)
            elif kind == "loo_no_singleton_rule":
                b = others / (n - 1)
            elif n == 1:
                b = 0.0
            else:
                b = {"mean": R[same].mean(), "no_mask": R[same].mean(), "flipped": others / (n - 1),
                     "loo": others / (n - 1), "over_n": others / n, "no_adv_mask": R[same].mean(),
                     "grpo": R[same].mean(), "rloo_std": others / (n - 1), "last_only": R[same].mean(),
                     "rloo_no_adv_mask": others / (n - 1), "loo_per_row": others / (n - 1)}[kind]
            A[i] = b - R[i] if kind == "flipped" else R[i] - b
            if kind in ("grpo", "rloo_std") and n > 1:
                A[i] = A[i] / (R[same].std() + 1e-6)
        if kind in ("no_adv_mask", "rloo_no_adv_mask"):
            return A[:, None] * torch.ones_like(m)
        if kind == "loo_per_row":  # one advantage per row, not broadcast over the tokens
            return A
        if kind == "last_only":
            last = torch.zeros_like(m)
            last[torch.arange(len(R)), (m.sum(-1) - 1).long()] = 1.0
            return A[:, None] * last
        return A[:, None] * m
    return f


def overwritten_group_mean(r, m, g):
    """The loop over groups of the solution with ``baseline[:] = ...``: the last group's mean in every row."""
    R = (r * m).sum(-1)  # R_i, (B,)
    gid, n_groups = otb.group_ids(g, len(R))
    baseline = torch.zeros_like(R)
    for k in range(n_groups):
        rows = gid == k
        if rows.sum() > 1:
            baseline[:] = R[rows].mean()
    return (R - baseline)[:, None] * m


def naive_group_mean(r, m, g):
    """Group mean with contiguous equal groups assumed (reshape), padding handled correctly."""
    R = (r * m).sum(-1)
    n = len(set(g.tolist() if isinstance(g, torch.Tensor) else g))
    return (R - R.reshape(n, -1).mean(1).repeat_interleave(len(R) // n))[:, None] * m


def paired_group_mean(r, m, g):
    """Group mean with the rows taken as consecutive pairs (reshape(-1, 2)), padding handled correctly."""
    R = (r * m).sum(-1)  # R_i, (B,)
    return (R - R.reshape(-1, 2).mean(1).repeat_interleave(2))[:, None] * m


def otb_rebinding_B(r, m, g, lp, s, leave_one_out=False, eps=1e-8):
    """The notebook's loop over groups with ``B = ...`` instead of ``B[rows] = ...`` (3c)."""
    m = m.float()
    G, W = reward_to_go()(r, m), realized_energy()(lp, s, m) * m  # G_t, W_t, (B, T)
    gid, n_groups = otb.group_ids(g, m.shape[0])
    B = torch.zeros_like(m)
    for k in range(n_groups):
        rows = gid == k
        if rows.sum() > 1:
            B = (G[rows] * W[rows]).sum(0) / (W[rows].sum(0) + eps)  # (T,): one group's B_t
    return (G - B) * m


def group_mean_by_objects(r, m, g):
    """Group mean with the ids used as dict keys: right for a list, but a tensor's elements are distinct
    objects, so with a tensor every row is its own group."""
    R = (r * m).sum(-1)  # R_i, (B,)
    rows = {}
    for i, x in enumerate(g):
        rows.setdefault(x, []).append(i)
    b = torch.zeros_like(R)
    for idx in rows.values():
        if len(idx) > 1:
            b[idx] = R[idx].mean()
    return (R - b)[:, None] * m


def sorted_reshape_group_mean(r, m, g):
    """Group mean with the rows sorted by id, then reshape(n_groups, -1): right only for equal group sizes."""
    R = (r * m).sum(-1)  # R_i, (B,)
    gid, n_groups = otb.group_ids(g, len(R))
    order = torch.argsort(gid, stable=True)
    b = torch.empty_like(R)
    b[order] = R[order].reshape(n_groups, -1).mean(1).repeat_interleave(len(R) // n_groups)
    return (R - b)[:, None] * m


def loo_of_the_mean(r, m, g):
    """RLOO with the group's mean where its sum is meant: b_i = (mean of the group - R_i) / (n - 1)."""
    R = (r * m).sum(-1)  # R_i, (B,)
    A = torch.zeros_like(R)
    for i, same in enumerate(groups(g, len(R))):
        n = int(same.sum())
        A[i] = R[i] - ((R[same].mean() - R[i]) / (n - 1) if n > 1 else 0.0)
    return A[:, None] * m


def token_mean_baseline(r, m, g):
    """Group mean with b_i = the group's mean reward per valid token, sum r m / sum m, not its mean score."""
    R = (r * m).sum(-1)  # R_i, (B,)
    A = torch.zeros_like(R)
    for i, same in enumerate(groups(g, len(R))):
        A[i] = R[i] - ((r * m)[same].sum() / m[same].sum() if same.sum() > 1 else 0.0)
    return A[:, None] * m


def runs_of_ids(kind):
    """2b ('mean') or 2c ('loo') with a group taken as a run of equal neighbouring ids, a new group whenever
    the id changes (itertools.groupby): right only where each group's rows stand together."""
    import itertools

    def f(r, m, g):
        R = (r * m).sum(-1)  # R_i, (B,)
        b, start = torch.zeros_like(R), 0
        for _, run in itertools.groupby(g.tolist() if isinstance(g, torch.Tensor) else g):
            rows = slice(start, start + len(list(run)))
            n, start = rows.stop - rows.start, rows.stop
            if n > 1:
                b[rows] = R[rows].mean() if kind == "mean" else (R[rows].sum() - R[rows]) / (n - 1)
        return (R - b)[:, None] * m
    return f


def loo_by_score(r, m, g):
    """RLOO with the others found by their score, not their row: every row of the group whose score equals
    R_i is left out of b_i, not only row i (0 where no other score differs)."""
    R = (r * m).sum(-1)  # R_i, (B,)
    A = torch.zeros_like(R)
    for i, same in enumerate(groups(g, len(R))):
        others = R[same & (R != R[i])]
        A[i] = R[i] - (others.mean() if same.sum() > 1 and len(others) else 0.0)
    return A[:, None] * m


def integer_baseline_group_mean(r, m, g):
    """The solution's loop with the baseline started from torch.zeros_like(gid): a long tensor, so every
    group mean written into it is truncated toward 0, silently."""
    R = (r * m).sum(-1)  # R_i, (B,)
    gid, n_groups = otb.group_ids(g, len(R))
    baseline = torch.zeros_like(gid)  # torch.long, like gid
    for k in range(n_groups):
        rows = gid == k
        if rows.sum() > 1:
            baseline[rows] = R[rows].mean()
    return (R - baseline)[:, None] * m


def mean_including_singletons(r, m, g):
    R = (r * m).sum(-1)
    gid, n = otb.group_ids(g, len(R))
    means = torch.stack([R[gid == k].mean() for k in range(n)])
    return (R - means[gid])[:, None] * m


def reward_to_go(kind="right"):
    """G_t, right or with a slip; 'never_masked': neither the rewards nor G_t multiplied by the mask."""
    def f(r, m):
        rm = r if kind in ("no_mask", "never_masked") else r * m
        G = {"right": lambda: rm.flip(-1).cumsum(-1).flip(-1), "no_mask": lambda: rm.flip(-1).cumsum(-1).flip(-1),
             "never_masked": lambda: rm.flip(-1).cumsum(-1).flip(-1),
             "exclusive": lambda: rm.flip(-1).cumsum(-1).flip(-1) - rm, "forward": lambda: rm.cumsum(-1),
             "no_flip_back": lambda: rm.flip(-1).cumsum(-1),
             "over_rows": lambda: rm.flip(0).cumsum(0).flip(0)}[kind]()  # dim=0: summed down the batch
        return G if kind == "never_masked" else G * m
    return f


def realized_energy(kind="right"):
    def f(lp, s, m):
        w = (1 - 2 * lp.exp() + s).clamp(0, 2) * m  # w_t
        if kind == "one_minus_pi_sq":
            w = (1 - lp.exp()) ** 2 * m
        return {"right": lambda: w.cumsum(-1), "one_minus_pi_sq": lambda: w.cumsum(-1), "w": lambda: w,
                "reverse": lambda: w.flip(-1).cumsum(-1).flip(-1), "rows": lambda: w.cumsum(0)}[kind]()
    return f


def otb_plain(weight="W", own=(True, True), eps=1e-8, ignore_mask=False, singletons=False, guard=True,
              G_fn=None, W_fn=None, mask_out=True, sign=1, batch=False, singleton_own=False, alone_own=False,
              own_by_w=False, eps_num=False):
    """OTB row by row. weight: 'W' (right), '1', 'w', 'W2', '1/W'; own: whether leave-one-out removes the
    row's own term from (numerator, denominator); guard: B = 0 where no other row is active (3d);
    singletons: treat every row as its own group; batch: one group for the whole batch; singleton_own: a
    singleton group keeps its own return as baseline (with leave-one-out too: it is left out only in groups of 2+); alone_own: with leave-one-out, a row with no other active
    row keeps its own return G_t as baseline (instead of 0); own_by_w: leave-one-out removes G_t w_t and w_t (the
    token's energy, not W_t); eps_num: eps added to the numerator too; G_fn, W_fn: the 3a and 3b in use."""
    G_fn, W_fn = G_fn or reward_to_go(), W_fn or realized_energy()

    def f(r, m, g, lp, s, leave_one_out=False):
        m = torch.ones_like(m) if ignore_mask else m
        G = G_fn(r, m)  # G_t
        W = W_fn(lp, s, m) * m  # W_t
        w = (1 - 2 * lp.exp() + s).clamp(0, 2) * m  # w_t
        V = {"W": W, "1": torch.ones_like(W), "w": w, "W2": W ** 2,
             "1/W": torch.where(W > 0, 1 / W, 0.0)}[weight] * m
        B = torch.zeros_like(G)
        ids = list(range(len(r))) if singletons else [0] * len(r) if batch else g
        for i, same in enumerate(groups(ids, len(r))):
            num, den = (G[same] * V[same]).sum(0) + (eps if eps_num else 0.0), V[same].sum(0)
            if leave_one_out and not (singleton_own and same.sum() == 1):
                active = m[same].sum(0) - m[i] > 0
                Vi = w[i] if own_by_w else V[i]  # the row's own weight
                num, den = num - own[0] * G[i] * Vi, den - own[1] * Vi
                alone = G[i] if alone_own else 0.0  # B_t where no other row of the group is active
                B[i] = torch.where(active, num / (den.clamp(min=0) + eps), alone) if guard else num / (den + eps)
            elif same.sum() > 1 or singleton_own:
                B[i] = num / (den + eps)
        A = sign * (G - B)
        return A * m if mask_out else A
    return f


def stable_idx(m):
    return torch.argsort(m == 0, dim=-1, stable=True)


def unstable_argsort(m):
    return torch.argsort(m == 0, dim=-1)


def sort_descending(m):
    return torch.sort(m, descending=True).indices


def to_actions(idx_fn, gather_mask=True):
    return lambda x, m: (x.gather(-1, idx_fn(m)), m.gather(-1, idx_fn(m)) if gather_mask else m)


def from_actions(idx_fn, mask=True):
    return lambda y, m: torch.zeros_like(y).scatter(-1, idx_fn(m), y) * (m if mask else 1)


def aligned(pass_loo=True, mask_k=True, scatter=True, groups_as=None, gather_lp=True, always_loo=False,
            gather_r=True):
    to, back = to_actions(stable_idx), from_actions(stable_idx)

    def f(r, m, g, lp, s, leave_one_out=False):
        (r_k, m_k), (s_k, _) = to(r, m), to(s, m)
        r_k = r_k if gather_r else r
        lp_k = to(lp, m)[0] if gather_lp else lp
        A_k = otb.optimal_token_baseline(r_k, m_k if mask_k else m, groups_as(g) if groups_as else g, lp_k, s_k,
                                         leave_one_out=always_loo or (leave_one_out and pass_loo))[0]
        return back(A_k, m) if scatter else A_k
    return f


def batch_gradients(kind="right"):
    def f(en, A, rows, N):
        g = torch.einsum("bt,btp->bp", A, en.scores[rows])  # (G*N, P)
        if kind == "token_mean":  # a mean over the T positions instead of the sum
            g = g / A.shape[1]
        elif kind == "product_of_sums":  # (sum_t A_t)(sum_t s_t)
            g = A.sum(-1, keepdim=True) * en.scores[rows].sum(1)
        elif kind == "over_groups":  # the group's sum divided by the number of groups
            return g.reshape(-1, N, g.shape[-1]).sum(1) / (len(rows) // N)
        elif kind == "all_rows":  # one mean over every row of the batch
            return g.mean(0, keepdim=True)
        if kind == "transposed":
            return g.reshape(N, -1, g.shape[-1]).mean(0)
        out = g.reshape(-1, N, g.shape[-1]).mean(1)
        return N * out if kind == "sum" else out
    return f


def bias_and_variance(kind="right"):
    def f(g_hat, grad_J):
        G = len(g_hat)
        dev_sq = ((g_hat - g_hat.mean(0)) ** 2).sum()
        var = dev_sq / (G - 1)
        naive = ((g_hat.mean(0) - grad_J) ** 2).sum()
        bias2 = naive - var / G
        if kind == "clip":
            bias2 = bias2.clamp(min=0.0)
        elif kind == "naive":
            bias2 = naive
        elif kind == "minus_var":
            bias2 = naive - var
        elif kind == "over_G":
            var = dev_sq / G
        elif kind == "mean_coord":
            var = var / g_hat.shape[1]
        elif kind == "over_coords":  # each group's variance over its P coordinates, summed over the groups
            var = g_hat.var(1).sum()
        elif kind == "mean_of_squares":  # the mean of ||g_hat - grad J||^2, not the square of the mean's distance
            bias2 = ((g_hat - grad_J) ** 2).sum(1).mean() - var / G
        elif kind == "per_coordinate":  # summed over the groups only: one variance per coordinate, (P,)
            var = ((g_hat - g_hat.mean(0)) ** 2).sum(0) / (G - 1)
            return naive - var / G, var  # tensors of P values each (a .item() would raise)
        out = (bias2.item(), var.item())
        return out[::-1] if kind == "swapped" else out
    return f


def measure(kind="right", bg=None, bv=None):
    import toy_harness
    bg, bv = bg or batch_gradients(), bv or bias_and_variance()

    def f(en, name, N, groups, seed):
        gen = torch.Generator() if kind == "unseeded" else torch.Generator().manual_seed(seed + (kind == "seed"))
        rows, gid = toy_harness.sample_groups(en, *((groups, N) if kind == "swapped_args" else (N, groups)), gen)
        estimator = otb.ESTIMATORS["group_mean" if kind == "ignore_name" else name]
        A = estimator(**en.batch(rows), group_index=rows if kind == "rows_as_groups" else gid)[kind == "returns"]
        out = bv(bg(en, A, rows, N), en.grad_J)
        return out[::-1] if kind == "swapped" else out[1] if kind == "variance_only" else out
    return f


def energy_in(dtype, back=True):
    """1b computed in ``dtype`` (bf16, float16), returned as float32 (``back``) or in that dtype."""
    def f(lp, s):
        w = (1 - 2 * lp.to(dtype).exp() + s.to(dtype)).clamp(0, 2)
        return w.float() if back else w
    return f


def _harness_measure(en, name, N, groups, seed):
    import toy_harness
    r = toy_harness.measure(en, Ns=(N,), groups=groups, seed=seed, names=[name])[0]
    return r["bias2"], r["variance"]


def _sum_pi_sq(kind):
    def f(z):
        if kind in ("fp16", "bf16_to_fp16"):  # float16 arithmetic (for every half input, or for bf16 only)
            half = z.dtype != torch.float64 if kind == "fp16" else z.dtype == torch.bfloat16
            zz = z.half() if half else z.double() if z.dtype == torch.float64 else z.float()
            out = torch.exp(torch.logsumexp(2 * zz, -1) - 2 * torch.logsumexp(zz, -1))
            return out.double() if z.dtype == torch.float64 else out.float()
        if kind == "fp16_out":
            return (z.half().softmax(-1) ** 2).sum(-1)
        if kind == "bf16_all":  # every step in the input's dtype, the result upcast
            return torch.exp(torch.logsumexp(2 * z, -1) - 2 * torch.logsumexp(z, -1)).float()
        if kind == "bf16_softmax":
            return (z.softmax(-1).float() ** 2).sum(-1)
        zz = z.double() if z.dtype == torch.float64 else z.float()
        if kind == "float64_out":
            zz = z.double()
        if kind == "no_exp":
            return torch.logsumexp(2 * zz, -1) - 2 * torch.logsumexp(zz, -1)
        if kind == "one_lse":
            return torch.exp(torch.logsumexp(2 * zz, -1) - torch.logsumexp(zz, -1))
        if kind == "dim0":
            return torch.exp(torch.logsumexp(2 * zz, 0) - 2 * torch.logsumexp(zz, 0))
        if kind == "keepdim":
            return torch.exp(torch.logsumexp(2 * zz, -1, keepdim=True) - 2 * torch.logsumexp(zz, -1, keepdim=True))
        return torch.exp(torch.logsumexp(2 * zz, -1) - 2 * torch.logsumexp(zz, -1))
    return f


_OTB_ARGS = "(token_rewards, response_mask, group_index, log_probs, sum_pi_sq)"
LOO = {"leave_one_out": True}

# =====================================================================================
# The catalogue: (exercise, slip, check, wrong answer, words the verdict must contain)
# =====================================================================================

SLIPS = [
    # ---- 1a: sum pi^2
    Slip("1a", "exponentiates raw logits (sum exp(2z) / (sum exp z)^2)", "ex1a_sum_pi_squared",
         lambda z: (z.exp() ** 2).sum(-1) / z.exp().sum(-1) ** 2, ["huge", "logsumexp"]),
    Slip("1a", "softmax in the input's dtype, returned in bf16", "ex1a_sum_pi_squared",
         lambda z: (z.softmax(-1) ** 2).sum(-1), ["bf16", "float32"]),
    Slip("1a", "always float32, also for float64 input", "ex1a_sum_pi_squared",
         lambda z: (z.float().softmax(-1) ** 2).sum(-1), ["float64"]),
    Slip("1a", "everything computed in bf16, only the result upcast", "ex1a_sum_pi_squared", _sum_pi_sq("bf16_all"),
         ["moderately confident bf16", "*before* any arithmetic", "0.9432"], named_in="#42"),
    Slip("1a", "a bf16 softmax, then upcast and squared in float32", "ex1a_sum_pi_squared",
         _sum_pi_sq("bf16_softmax"), ["moderately confident bf16", "*before* any arithmetic"], named_in="#42"),
    Slip("1a", "float64 result for float32 input (z.double())", "ex1a_sum_pi_squared", _sum_pi_sq("float64_out"),
         ["small float32", "dtype torch.float64", "z.float(), not z.double()"], named_in="#42"),
    Slip("1a", "returns log sum pi^2 (the exp forgotten)", "ex1a_sum_pi_squared", _sum_pi_sq("no_exp"),
         ["the exp is missing"]),
    Slip("1a", "logsumexp(2z) - logsumexp(z) (the factor 2 forgotten)", "ex1a_sum_pi_squared", _sum_pi_sq("one_lse"),
         ["factor 2 in front of logsumexp(z)"]),
    Slip("1a", "reduces over dim 0", "ex1a_sum_pi_squared", _sum_pi_sq("dim0"), ["shape", "dim=-1"]),
    Slip("1a", "reduces over dim 1, right only for 2-d logits", "ex1a_sum_pi_squared",
         lambda z: ((z.float() if z.dtype in (torch.bfloat16, torch.float16) else z).softmax(1) ** 2).sum(1),
         ["batched logits", "whatever the number of leading dimensions"], named_in="#58"),
    Slip("1a", "keeps the reduced dimension (keepdim=True)", "ex1a_sum_pi_squared", _sum_pi_sq("keepdim"),
         ["shape", "keepdim=True"]),
    Slip("1a", "returns sum pi (always 1)", "ex1a_sum_pi_squared", lambda z: z.float().softmax(-1).sum(-1),
         ["differ", "logsumexp(2z) - 2 logsumexp(z)"]),
    Slip("1a", "returns a Python float", "ex1a_sum_pi_squared", lambda z: 0.5, ["not a tensor"]),
    Slip("1a", "upcast to float16 (z.half()), the result returned as float32", "ex1a_sum_pi_squared",
         _sum_pi_sq("fp16"), ["rounding of float16", "not .half()", "10 stored + 1 implicit"], named_in="#51"),
    Slip("1a", "bf16 input upcast to float16, not float32", "ex1a_sum_pi_squared", _sum_pi_sq("bf16_to_fp16"),
         ["moderately confident bf16", "rounding of float16", "not .half()"], named_in="#51"),
    Slip("1a", "a float16 result for float32 input", "ex1a_sum_pi_squared", _sum_pi_sq("fp16_out"),
         ["dtype torch.float16", "not torch.float16", "significant bits"], named_in="#51"),
    # ---- 1b: the Logit-Gradient Proxy
    Slip("1b", "no clamp", "ex1b_token_energy", lambda lp, s: 1 - 2 * lp.exp() + s, ["clamp"]),
    Slip("1b", "the factor 2 of the cross term forgotten", "ex1b_token_energy", lambda lp, s: 1 - lp.exp() + s,
         ["factor 2"]),
    Slip("1b", "(1 - pi(y))^2: only the y-th component", "ex1b_token_energy", lambda lp, s: (1 - lp.exp()) ** 2,
         ["y-th component", "term by term"]),
    Slip("1b", "the log-prob used as a probability", "ex1b_token_energy",
         lambda lp, s: (1 - 2 * lp + s).clamp(0, 2), ["log-prob used as a probability", "log_probs.exp()"]),
    Slip("1b", "the cross term added instead of subtracted", "ex1b_token_energy",
         lambda lp, s: (1 + 2 * lp.exp() + s).clamp(0, 2), ["sign of the cross term"]),
    Slip("1b", "clamped to [0, 1]", "ex1b_token_energy", lambda lp, s: (1 - 2 * lp.exp() + s).clamp(0, 1),
         ["clamped to [0, 1]", "up to 2"]),
    Slip("1b", "summed over positions", "ex1b_token_energy",
         lambda lp, s: (1 - 2 * lp.exp() + s).clamp(0, 2).sum(-1), ["shape"]),
    Slip("1b", "computed in bf16, returned as float32", "ex1b_token_energy", energy_in(torch.bfloat16),
         ["rounding of bfloat16", "not bf16", "7 stored + 1 implicit"], named_in="#51"),
    Slip("1b", "computed and returned in bf16", "ex1b_token_energy", energy_in(torch.bfloat16, back=False),
         ["dtype torch.bfloat16", "in float32, not bf16"], named_in="#51"),
    Slip("1b", "computed in float16, returned as float32", "ex1b_token_energy", energy_in(torch.float16),
         ["rounding of float16", "not .half()"], named_in="#51"),
    Slip("1b", "pi(y) = exp(-log_probs)", "ex1b_token_energy", lambda lp, s: (1 - 2 * (-lp).exp() + s).clamp(0, 2),
         ["exp(-log_probs)", "without a minus sign"], named_in="#51"),
    Slip("1b", "pi(y) = exp(-log_probs), without the clamp", "ex1b_token_energy",
         lambda lp, s: 1 - 2 * (-lp).exp() + s, ["exp(-log_probs)", "without a minus sign", "negative"],
         named_in="#58"),
    Slip("1b", "returns torch.zeros_like(log_probs) (a placeholder left in)", "ex1b_token_energy",
         lambda lp, s: torch.zeros_like(lp), ["0 at every position", "placeholder"], named_in="#58"),
    Slip("1b", "pi(y) from a softmax of the log-probs", "ex1b_token_energy",
         lambda lp, s: (1 - 2 * lp.softmax(-1) + s).clamp(0, 2), ["softmax of the log-probs", "element by element"],
         named_in="#51"),
    Slip("1b", "sum pi^2 squared again", "ex1b_token_energy", lambda lp, s: (1 - 2 * lp.exp() + s ** 2).clamp(0, 2),
         ["squared again", "add it as it is"]),
    Slip("1b", "the norm, not its square (a square root)", "ex1b_token_energy",
         lambda lp, s: (1 - 2 * lp.exp() + s).clamp(0, 2).sqrt(), ["square root", "*squared* norm"]),
    Slip("1b", "(1 - pi(y))^2 + sum pi^2", "ex1b_token_energy", lambda lp, s: ((1 - lp.exp()) ** 2 + s).clamp(0, 2),
         ["counted twice", "leaves pi(y)^2 out"]),
    Slip("1b", "the 1 of the expansion left out", "ex1b_token_energy", lambda lp, s: (s - 2 * lp.exp()).clamp(0, 2),
         ["the 1 is missing"]),
    Slip("1b", "a mean over positions (a token mean)", "ex1b_token_energy",
         lambda lp, s: (1 - 2 * lp.exp() + s).clamp(0, 2).mean(-1), ["shape", "one number per token"],
         named_in="#51"),
    # ---- 2a: sequence scores
    Slip("2a", "padding not masked", "ex2a_sequence_scores", lambda r, m: r.sum(-1), ["padding"]),
    Slip("2a", "mean over positions instead of the sum", "ex2a_sequence_scores",
         lambda r, m: (r * m).sum(-1) / m.shape[-1], ["outcome reward", "sum_t r_t m_t"]),
    Slip("2a", "the last position's reward only", "ex2a_sequence_scores", lambda r, m: r[:, -1], ["padding"]),
    Slip("2a", "the last valid token's reward only", "ex2a_sequence_scores",
         lambda r, m: r.gather(-1, (m.sum(-1) - 1).long()[:, None])[:, 0], ["dense", "all valid token rewards"],
         named_in="#58"),
    Slip("2a", "minus the sum (the rewards read as costs)", "ex2a_sequence_scores", lambda r, m: -(r * m).sum(-1),
         ["opposite sign everywhere"], named_in="#58"),
    Slip("2a", "the blank not filled in (return None)", "ex2a_sequence_scores", lambda r, m: None,
         ["not filled in", "`return None`"], named_in="#58"),
    Slip("2a", "a sum over a dimension the rewards do not have (dim=2)", "ex2a_sequence_scores",
         lambda r, m: (r * m).sum(2), ["IndexError", "read the traceback"], named_in="#58"),
    Slip("2a", "keeps the position dimension", "ex2a_sequence_scores", lambda r, m: (r * m).sum(-1, keepdim=True),
         ["shape"]),
    Slip("2a", "a sum over the rows (dim=0), not the positions", "ex2a_sequence_scores", lambda r, m: (r * m).sum(0),
         ["outcome reward at the last valid token", "R_i = sum_t r_t m_t"], named_in="#58"),
    # ---- 2b: the group mean
    Slip("2b", "rewards not masked before the sum", "ex2b_group_mean", group_estimator("no_mask"),
         ["padding", "junk"]),
    Slip("2b", "groups assumed contiguous (reshape)", "ex2b_group_mean", naive_group_mean, ["interleaved"]),
    Slip("2b", "the baseline is the group's mean reward per token (sum r m / sum m)", "ex2b_group_mean",
         token_mean_baseline, ["one group of 4 rows", "the mean score of row i's group"], named_in="#58"),
    Slip("2b", "a singleton group's baseline is its own score", "ex2b_group_mean", mean_including_singletons,
         ["singleton"]),
    Slip("2b", "leave-one-out instead of the group mean", "ex2b_group_mean", group_estimator("loo"),
         ["leave-one-out", "row i included"]),
    Slip("2b", "b - R instead of R - b", "ex2b_group_mean", lambda r, m, g: -group_estimator("mean")(r, m, g),
         ["opposite sign", "R - b"]),
    Slip("2b", "advantage not masked (padding keeps it)", "ex2b_group_mean", group_estimator("no_adv_mask"),
         ["padding", "not 0 on padding", "multiply the advantage by response_mask"], named_in="#42"),
    Slip("2b", "divided by the group's standard deviation (GRPO)", "ex2b_group_mean", group_estimator("grpo"),
         ["standard deviation", "GRPO"], named_in="#42"),
    Slip("2b", "the advantage on the last token only", "ex2b_group_mean", group_estimator("last_only"),
         ["last valid token only", "every"]),
    Slip("2b", "one baseline for the whole batch", "ex2b_group_mean", group_estimator("batch_mean"),
         ["whole batch", "own group"]),
    Slip("2b", "returns one advantage per row, (B,)", "ex2b_group_mean",
         lambda r, m, g: group_estimator("mean")(r, m, g)[:, 0], ["shape (B,)", "A[:, None] * response_mask"]),
    Slip("2b", "a length-weighted (token-level) mean", "ex2b_group_mean", group_estimator("by_tokens"),
         ["mean over the group's tokens", "*responses*"], named_in="#51"),
    Slip("2b", "baseline[:] = ... in the loop over groups (every row overwritten)", "ex2b_group_mean",
         overwritten_group_mean, ["one group's baseline in every row", "baseline[rows] = ..."], named_in="#51"),
    Slip("2b", "groups taken as consecutive pairs (reshape(-1, 2))", "ex2b_group_mean", paired_group_mean,
         ["consecutive blocks of 2 rows", "same group_index"], named_in="#58"),
    Slip("2b", "the advantage divided by the group size, (R - b) / n", "ex2b_group_mean",
         lambda r, m, g: group_estimator("mean")(r, m, g) / torch.bincount(otb.group_ids(g, len(r))[0])[
             otb.group_ids(g, len(r))[0]][:, None], ["0.25 times the expected", "constant factor"], named_in="#58"),
    Slip("2b", "the ids used as dict keys (a tensor's elements never equal as keys)", "ex2b_group_mean",
         group_mean_by_objects, ["its own group", "group_index may be a tensor"], named_in="#58"),
    Slip("2b", "rows sorted by id, then reshape(n_groups, -1)", "ex2b_group_mean", sorted_reshape_group_mean,
         ["sizes 3 and 5", "different sizes"], named_in="#58"),
    Slip("2b", "no baseline (A = R)", "ex2b_group_mean", lambda r, m, g: (r * m).sum(-1)[:, None] * m,
         ["no baseline subtracted"]),
    Slip("2b", "groups as runs of equal neighbouring ids (itertools.groupby)", "ex2b_group_mean", runs_of_ids("mean"),
         ["interleaved", "its own group", "group by id, not by position"], named_in="#58"),
    Slip("2b", "the mask never used (rewards and advantage)", "ex2b_group_mean",
         lambda r, m, g: group_estimator("mean")(r, torch.ones_like(m), g), ["junk", "only valid tokens count"],
         named_in="#58"),
    Slip("2b", "the baseline started from torch.zeros_like(gid), a long tensor (the means truncated)",
         "ex2b_group_mean", integer_baseline_group_mean, ["or one that is 0 in every row", "integer tensor"],
         named_in="#58"),
    # ---- 2c: RLOO
    Slip("2c", "the group mean (own score left in)", "ex2c_rloo", group_estimator("mean"),
         ["own score", "leave row i out", "n - 1"]),
    Slip("2c", "the others' sum divided by n", "ex2c_rloo", group_estimator("over_n"), ["divided", "n - 1 other rows"]),
    Slip("2c", "b - R instead of R - b", "ex2c_rloo", group_estimator("flipped"), ["opposite sign", "R - b"]),
    Slip("2c", "divided by the group's standard deviation", "ex2c_rloo", group_estimator("rloo_std"),
         ["standard deviation", "GRPO"], named_in="#42"),
    Slip("2c", "advantage not masked", "ex2c_rloo", group_estimator("rloo_no_adv_mask"),
         ["not 0 on padding"], named_in="#42"),
    Slip("2c", "a singleton divided by n - 1 = 0", "ex2c_rloo", group_estimator("loo_no_singleton_rule"),
         ["singleton", "non-finite", "baseline 0"]),
    Slip("2c", "one leave-one-out baseline over the whole batch", "ex2c_rloo", group_estimator("batch_loo"),
         ["whole batch"]),
    Slip("2c", "one advantage per row, not broadcast over the tokens", "ex2c_rloo", group_estimator("loo_per_row"),
         ["shape (B,)", "A[:, None] * response_mask"], named_in="#51"),
    Slip("2c", "one advantage per row of shape (B, 1), not broadcast over the tokens", "ex2c_rloo",
         lambda r, m, g: group_estimator("loo_per_row")(r, m, g)[:, None], ["shape (B, 1)", "response_mask"],
         named_in="#58"),
    Slip("2c", "the group's mean where its sum is meant, (mean - R_i) / (n - 1)", "ex2c_rloo", loo_of_the_mean,
         ["*other* rows", "(sum of the group - R_i) / (n - 1)"], named_in="#58"),
    Slip("2c", "a length-weighted (token-level) leave-one-out mean", "ex2c_rloo", group_estimator("loo_by_tokens"),
         ["mean over the group's tokens", "*responses*"]),
    Slip("2c", "groups as runs of equal neighbouring ids (itertools.groupby)", "ex2c_rloo", runs_of_ids("loo"),
         ["interleaved", "its own group", "group by id, not by position"], named_in="#58"),
    Slip("2c", "the others found by score (R_j != R_i), so rows with an equal score are left out too", "ex2c_rloo",
         loo_by_score, ["whose score equals R_i", "j != i"]),
    Slip("2c", "the mask never used (rewards and advantage)", "ex2c_rloo",
         lambda r, m, g: group_estimator("loo")(r, torch.ones_like(m), g), ["junk", "only valid tokens count"],
         named_in="#58"),
    # ---- 3a: reward-to-go
    Slip("3a", "one score for the whole row", "ex3a_reward_to_go", lambda r, m: (r * m).sum(-1, keepdim=True) * m,
         ["dense", "reversed cumulative"]),
    Slip("3a", "sum over u > t: off by one", "ex3a_reward_to_go", reward_to_go("exclusive"),
         ["off by one", "G_t includes r_t"], named_in="#42"),
    Slip("3a", "cumulative sum from the start", "ex3a_reward_to_go", reward_to_go("forward"),
         ["from the start", "to the *end*"]),
    Slip("3a", "reversed sum not flipped back", "ex3a_reward_to_go", reward_to_go("no_flip_back"),
         ["without flipping back", "flip the result back"]),
    Slip("3a", "rewards not masked before the sum", "ex3a_reward_to_go", reward_to_go("no_mask"),
         ["junk", "*before* the cumulative sum"]),
    Slip("3a", "the mask never used (rewards and G_t)", "ex3a_reward_to_go", reward_to_go("never_masked"),
         ["junk", "mask the rewards before the cumulative sum"], named_in="#58"),
    Slip("3a", "the reversed cumulative sum over the rows (dim=0)", "ex3a_reward_to_go", reward_to_go("over_rows"),
         ["outcome reward only", "G_t = R at every valid position"], named_in="#58"),
    # ---- 3b: realized energy
    Slip("3b", "w_t, not its running sum", "ex3b_realized_energy", realized_energy("w"),
         ["w_t itself", "w.cumsum(-1)"]),
    Slip("3b", "transposed to cumsum over dim 0, not transposed back", "ex3b_realized_energy",
         lambda lp, s, m: ((1 - 2 * lp.exp() + s).clamp(0, 2) * m).T.cumsum(0), ["transposed", "rows first"],
         named_in="#58"),
    Slip("3b", "a running mean of w_t, not a running sum", "ex3b_realized_energy",
         lambda lp, s, m: ((1 - 2 * lp.exp() + s).clamp(0, 2) * m).cumsum(-1) / torch.arange(1, m.shape[-1] + 1),
         ["w_0 + ... + w_t", "cumulative sum"], named_in="#58"),
    Slip("3b", "a running sum from the end", "ex3b_realized_energy", realized_energy("reverse"),
         ["from the end", "*up to* t"]),
    Slip("3b", "cumulative sum over rows", "ex3b_realized_energy", realized_energy("rows"), ["over the rows"]),
    Slip("3b", "energy (1 - pi(y))^2", "ex3b_realized_energy", realized_energy("one_minus_pi_sq"),
         ["sum pi^2 left out", "otb.token_energy"]),
    # ---- 3c: the baseline
    Slip("3c", "no eps (0 / 0 on certain tokens)", "ex3c_optimal_token_baseline", otb_plain(eps=0.0),
         ["certain", "eps"]),
    Slip("3c", "B = ... in the loop over groups (one group's baseline in every row)", "ex3c_optimal_token_baseline",
         otb_rebinding_B, ["one group", "B[rows] = ..."], named_in="#58"),
    Slip("3c", "uses a 3a that is still a blank (returns None)", "ex3c_optimal_token_baseline",
         otb_plain(G_fn=lambda r, m: None), ["NoneType", "finish the earlier blanks"], named_in="#58"),
    Slip("3c", "the mask ignored", "ex3c_optimal_token_baseline", otb_plain(ignore_mask=True), ["padding", "active"]),
    Slip("3c", "every row its own group", "ex3c_optimal_token_baseline", otb_plain(singletons=True),
         ["one group of 4"]),
    Slip("3c", "an unweighted mean of G_t", "ex3c_optimal_token_baseline", otb_plain(weight="1"),
         ["unweighted mean", "realized energy W_t"]),
    Slip("3c", "weights w_t instead of W_t", "ex3c_optimal_token_baseline", otb_plain(weight="w"),
         ["weights w_t", "running sum"]),
    Slip("3c", "weights W_t^2", "ex3c_optimal_token_baseline", otb_plain(weight="W2"), ["W_t^2", "not by its square"]),
    Slip("3c", "weights 1 / W_t", "ex3c_optimal_token_baseline", otb_plain(weight="1/W"),
         ["1 / W_t", "W_t multiplies"]),
    Slip("3c", "B_t - G_t instead of G_t - B_t", "ex3c_optimal_token_baseline", otb_plain(sign=-1),
         ["opposite sign", "A_t = G_t - B_t"]),
    Slip("3c", "A_t not masked on padding", "ex3c_optimal_token_baseline", otb_plain(mask_out=False),
         ["not 0 on padding", "multiply A_t"]),
    Slip("3c", "a singleton group keeps its own return as baseline", "ex3c_optimal_token_baseline",
         otb_plain(singleton_own=True), ["singleton", "B_t = 0"]),
    Slip("3c", "eps added to the numerator too: (num + eps) / (den + eps)", "ex3c_optimal_token_baseline",
         otb_plain(eps_num=True), ["all certain", "sum_i W_t = 0"], named_in="#58"),
    Slip("3c", "one baseline over the whole batch", "ex3c_optimal_token_baseline", otb_plain(batch=True),
         ["interleaved", "same id"]),
    Slip("3c", "uses a 3a that is off by one", "ex3c_optimal_token_baseline",
         otb_plain(G_fn=reward_to_go("exclusive")), ["your reward_to_go (3a)", "fix 3a first"],
         kwargs={"reward_to_go": reward_to_go("exclusive"), "realized_energy": realized_energy()}, named_in="#42"),
    Slip("3c", "uses a 3b that returns w_t", "ex3c_optimal_token_baseline", otb_plain(W_fn=realized_energy("w")),
         ["your realized_energy (3b)", "fix 3b first"],
         kwargs={"reward_to_go": reward_to_go(), "realized_energy": realized_energy("w")}),
    # ---- 3d: leave-one-out
    Slip("3d", "the row's own term left in both sums", "ex3c_optimal_token_baseline",
         lambda *a, **k: otb_plain()(*a[:5]), ["own term left in both sums", "leave row i out"], kwargs=LOO),
    Slip("3d", "own term removed with w_t, not W_t", "ex3c_optimal_token_baseline", otb_plain(own_by_w=True),
         ["one group of 4 rows", "row i's own term leaves both sums"], kwargs=LOO, named_in="#58"),
    Slip("3d", "a singleton group keeps its own return as baseline (leave-one-out only in groups of 2+)",
         "ex3c_optimal_token_baseline", otb_plain(singleton_own=True), ["a singleton group", "no other", "active"],
         kwargs=LOO, named_in="#58"),
    Slip("3d", "eps added to the numerator too: (num + eps) / (den + eps)", "ex3c_optimal_token_baseline",
         otb_plain(eps_num=True), ["all certain", "the other rows' sum of W_t is 0"], kwargs=LOO, named_in="#58"),
    Slip("3d", "own term removed from the numerator only", "ex3c_optimal_token_baseline", otb_plain(own=(True, False)),
         ["numerator only", "denominator as well"], kwargs=LOO),
    Slip("3d", "own term removed from the denominator only", "ex3c_optimal_token_baseline",
         otb_plain(own=(False, True)), ["denominator only", "numerator as well"], kwargs=LOO),
    Slip("3d", "no eps and no 'other rows' guard", "ex3c_optimal_token_baseline", otb_plain(eps=0.0, guard=False),
         ["0 / 0", "Keep eps", "torch.where(others > 0"], kwargs=LOO, named_in="#42"),
    Slip("3d", "the guard but no eps", "ex3c_optimal_token_baseline", otb_plain(eps=0.0),
         ["certain", "0 / 0", "eps"], kwargs=LOO),
    Slip("3d", "weights w_t in the leave-one-out sums", "ex3c_optimal_token_baseline", otb_plain(weight="w"),
         ["weights w_t", "(leave-one-out)", "running sum"], kwargs=LOO, named_in="#42"),
    Slip("3d", "an unweighted leave-one-out mean", "ex3c_optimal_token_baseline", otb_plain(weight="1"),
         ["unweighted mean", "(leave-one-out)"], kwargs=LOO),
    Slip("3d", "weights W_t^2 in the leave-one-out sums", "ex3c_optimal_token_baseline", otb_plain(weight="W2"),
         ["W_t^2", "(leave-one-out)"], kwargs=LOO),
    Slip("3d", "A_t not masked on padding", "ex3c_optimal_token_baseline", otb_plain(mask_out=False),
         ["not 0 on padding"], kwargs=LOO),
    Slip("3d", "the row's own return as baseline where no other row is active", "ex3d_leave_one_out",
         otb_plain(alone_own=True), ["no other row of the group is active", "keeps its return G_t"],
         named_in="#51"),
    Slip("3d", "uses a 3a that is off by one", "ex3c_optimal_token_baseline",
         otb_plain(G_fn=reward_to_go("exclusive")), ["fix 3a first"],
         kwargs={**LOO, "reward_to_go": reward_to_go("exclusive"), "realized_energy": realized_energy()},
         named_in="#42"),
    # ---- 3e: the OTB of 3c in train.py (each slip costs a training run or two)
    Slip("3e", "returns (A, G), the pair otb.optimal_token_baseline returns", "ex3e_trains",
         lambda *a: (otb_plain()(*a),) * 2, ["'tuple'", "the same shape as token_rewards"], named_in="#58"),
    Slip("3e", "no eps (0 / 0 where a group has no valid token)", "ex3e_trains", otb_plain(eps=0.0),
         ["NaN or inf", "divide by (sum W_t + eps)"], named_in="#58"),
    Slip("3e", "uses a 3a that is still a blank (returns None)", "ex3e_trains", otb_plain(G_fn=lambda r, m: None),
         ["raised TypeError", "run check.ex3c_optimal_token_baseline first"], named_in="#58"),
    Slip("3e", "calls the reference through train.py's table, otb.ESTIMATORS['otb']", "ex3e_trains",
         lambda r, m, g, lp, s: otb.ESTIMATORS["otb"](token_rewards=r, response_mask=m, group_index=g,
                                                      log_probs=lp, sum_pi_sq=s)[0],
         ["otb.ESTIMATORS['otb']", "calls itself", "write this step yourself"]),
    Slip("3e", "B_t - G_t instead of G_t - B_t", "ex3e_trains", otb_plain(sign=-1),
         ["at training step", "your advantages differ"], named_in="#58"),  # step 1 unless its rewards are all 0
    # ---- 4a: one gradient per group
    Slip("4a", "the sum over the group, not the mean", "ex4a_batch_gradients", batch_gradients("sum"),
         ["times too large", "*mean*"], toy=True),
    Slip("4a", "zeros of the right shape", "ex4a_batch_gradients",
         lambda en, A, rows, N: torch.zeros(len(rows) // N, en.scores.shape[-1], dtype=en.scores.dtype),
         ["0 everywhere", "not 0"], toy=True),
    Slip("4a", "scores of responses 0..G*N-1, not the sampled rows", "ex4a_batch_gradients",
         lambda en, A, rows, N: torch.einsum("bt,btp->bp", A, en.scores[: len(rows)]).reshape(
             -1, N, en.scores.shape[-1]).mean(1), ["en.scores[:len(rows)]", "en.scores[rows]"], toy=True),
    Slip("4a", "rows grouped as (N, groups) instead of (groups, N)", "ex4a_batch_gradients",
         batch_gradients("transposed"), ["different groups", "group after group"], toy=True),
    Slip("4a", "a mean over the positions t (a token mean)", "ex4a_batch_gradients", batch_gradients("token_mean"),
         ["mean over the T positions", "*sum* over positions"], toy=True, named_in="#51"),
    Slip("4a", "(sum_t A_t)(sum_t s_t)", "ex4a_batch_gradients", batch_gradients("product_of_sums"),
         ["product of two sums", "multiply A_t and s_t at each position t first"], toy=True, named_in="#51"),
    Slip("4a", "the group's sum divided by the number of groups", "ex4a_batch_gradients",
         batch_gradients("over_groups"), ["times the expected", "constant factor"], toy=True),
    Slip("4a", "one mean over every row of the batch", "ex4a_batch_gradients", batch_gradients("all_rows"),
         ["shape", "one row per group"], toy=True),
    # ---- 4b: bias^2 and variance
    Slip("4b", "bias^2 without the variance / G correction", "ex4b_bias_and_variance", bias_and_variance("naive"),
         ["variance / G"]),
    Slip("4b", "variance divided by G", "ex4b_bias_and_variance", bias_and_variance("over_G"), ["G - 1"]),
    Slip("4b", "bias^2 clipped at 0", "ex4b_bias_and_variance", bias_and_variance("clip"),
         ["negative", "do not clip"], named_in="#42"),
    Slip("4b", "the whole variance subtracted from bias^2", "ex4b_bias_and_variance", bias_and_variance("minus_var"),
         ["whole variance", "variance / G"]),
    Slip("4b", "the variance over each group's coordinates (var(1)), summed over the groups",
         "ex4b_bias_and_variance", bias_and_variance("over_coords"), ["your variance is", "sum over coordinates"],
         named_in="#58"),
    Slip("4b", "bias^2 from the mean of ||g_hat - grad J||^2, not ||mean g_hat - grad J||^2",
         "ex4b_bias_and_variance", bias_and_variance("mean_of_squares"),
         ["your bias2 is", "||mean over groups of g_hat - grad J||^2"], named_in="#58"),
    Slip("4b", "the variance averaged over coordinates", "ex4b_bias_and_variance", bias_and_variance("mean_coord"),
         ["mean over the coordinates", "*sum*"]),
    Slip("4b", "the pair in the wrong order", "ex4b_bias_and_variance", bias_and_variance("swapped"),
         ["(variance, bias2)", "order"]),
    Slip("4b", "returns one number", "ex4b_bias_and_variance", lambda g, j: 0.0, ["pair"]),
    Slip("4b", "the squared deviations summed over the groups only (.sum(0)): one variance per coordinate",
         "ex4b_bias_and_variance", bias_and_variance("per_coordinate"), ["a tensor of shape (6,)", "not .sum(0)"],
         named_in="#58"),
    # ---- 4c: measure two estimators (small runs: N = 2, 500 groups)
    Slip("4c", "different groups than asked for (seed + 1)", "ex4c_measure", measure("seed"),
         ["other groups", "seeded with seed itself"],
         kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "returns the variance only, not the pair", "ex4c_measure", measure("variance_only"),
         ["returned", "the pair (bias2, variance)"], kwargs={"Ns": (2,), "groups": 500}, toy=True, named_in="#58"),
    Slip("4c", "calls toy_harness.measure", "ex4c_measure", _harness_measure, ["calls toy_harness.measure"],
         kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "a generator that was never seeded", "ex4c_measure", measure("unseeded"),
         ["other groups", "not an unseeded generator"],
         kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "always the group mean, whatever the name", "ex4c_measure", measure("ignore_name"),
         ["same numbers as for group_mean", "otb.ESTIMATORS[name]"], kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "uses a 4a that sums over the group", "ex4c_measure", measure(bg=batch_gradients("sum")),
         ["your batch_gradients (4a)", "fix 4a first"],
         kwargs={"Ns": (2,), "groups": 500, "batch_gradients": batch_gradients("sum"),
                 "bias_and_variance": bias_and_variance()}, toy=True, named_in="#42"),
    Slip("4c", "returns (variance, bias2)", "ex4c_measure", measure("swapped"), ["(variance, bias2)", "order"],
         kwargs={"Ns": (2,), "groups": 500}, toy=True, named_in="#51"),
    Slip("4c", "group_index=rows", "ex4c_measure", measure("rows_as_groups"), ["group_index=rows", "group_index=gid"],
         kwargs={"Ns": (2,), "groups": 500}, toy=True, named_in="#51"),
    Slip("4c", "the estimator's returns ([1]), not its advantages", "ex4c_measure", measure("returns"),
         ["returns", "take [0]"], kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "sample_groups(en, groups, N, ...): the arguments swapped", "ex4c_measure", measure("swapped_args"),
         ["swapped", "sample_groups(en, N, groups, generator)"], kwargs={"Ns": (2,), "groups": 500}, toy=True),
    Slip("4c", "uses a 4b that divides the variance by G", "ex4c_measure", measure(bv=bias_and_variance("over_G")),
         ["your bias_and_variance (4b)", "fix 4b first"],
         kwargs={"Ns": (2,), "groups": 500, "batch_gradients": batch_gradients(),
                 "bias_and_variance": bias_and_variance("over_G")}, toy=True, named_in="#42"),
    # ---- 5a: the action index
    Slip("5a", "the position t", "ex5a_action_index", lambda m: torch.where(m.bool(), torch.arange(m.shape[1]), -1),
         ["position t"]),
    Slip("5a", "counts from 1", "ex5a_action_index", lambda m: torch.where(m.bool(), m.long().cumsum(-1), -1),
         ["starts at 1"]),
    Slip("5a", "cumsum - 1 without -1 on masked positions", "ex5a_action_index", lambda m: m.long().cumsum(-1) - 1,
         ["right on the actions", "not -1", "torch.where"]),
    Slip("5a", "cumulative sum over rows", "ex5a_action_index",
         lambda m: torch.where(m.bool(), m.long().cumsum(0) - 1, -1), ["differ", "cumsum(-1) - 1"]),
    Slip("5a", "floats, not long integers", "ex5a_action_index",
         lambda m: torch.where(m.bool(), m.cumsum(-1) - 1, -1.0), ["dtype torch.float32", "torch.long"],
         named_in="#51"),
    # ---- 5b: gather and scatter
    Slip("5b", "an unstable argsort in to_actions", "ex5b_compaction",
         (to_actions(unstable_argsort), from_actions(stable_idx)), ["long responses", "stable=True"]),
    Slip("5b", "a descending sort of the mask in from_actions", "ex5b_compaction",
         (to_actions(stable_idx), from_actions(sort_descending)), ["long responses", "stable=True"]),
    Slip("5b", "holes not set to 0 in from_actions", "ex5b_compaction",
         (to_actions(stable_idx), lambda y, m: from_actions(stable_idx)(y, m) + (1 - m)),
         ["holds 1, not 0", "multiply the scattered values by response_mask"]),
    Slip("5b", "from_actions never zeroes the masked positions", "ex5b_compaction",
         (to_actions(stable_idx), from_actions(stable_idx, mask=False)),
         ["not 0", "multiply the scattered values by response_mask"], named_in="#51"),
    Slip("5b", "the mask returned as it was (m, not m_k)", "ex5b_compaction",
         (to_actions(stable_idx, gather_mask=False), from_actions(stable_idx)), ["m_k", "right padding, no holes"]),
    Slip("5b", "an ascending argsort (masked positions first)", "ex5b_compaction",
         (to_actions(lambda m: torch.argsort(m, dim=-1, stable=True)), from_actions(stable_idx)), ["differ"]),
    Slip("5b", "returns x_k only", "ex5b_compaction",
         (lambda x, m: x.gather(-1, stable_idx(m)), from_actions(stable_idx)), ["not a pair"]),
    # ---- 5c: OTB aligned by action
    Slip("5c", "leave_one_out=True whatever the flag says", "ex5c_action_aligned_otb", aligned(always_loo=True),
         ["no holes", "otb.optimal_token_baseline exactly"], named_in="#58"),
    Slip("5c", "aligned by position", "ex5c_action_aligned_otb", lambda *a, **k: otb.optimal_token_baseline(*a, **k)[0],
         ["by position", "to_actions"]),
    Slip("5c", "leave_one_out not passed on", "ex5c_action_aligned_otb", aligned(pass_loo=False), ["leave_one_out"]),
    Slip("5c", "the mask with holes passed to OTB (m, not m_k)", "ex5c_action_aligned_otb", aligned(mask_k=False),
         ["raised inside otb.py, line", "called from your code", "otb.py rejected the arguments"]),
    Slip("5c", "calls otb.action_aligned_otb", "ex5c_action_aligned_otb",
         lambda *a, **k: otb.action_aligned_otb(*a, **k)[0],
         ["calls otb.action_aligned_otb", "the project's reference"]),
    Slip("5c", "advantages left over k (not scattered back)", "ex5c_action_aligned_otb", aligned(scatter=False),
         ["indexed by action k", "from_actions"]),
    Slip("5c", "every row in one group", "ex5c_action_aligned_otb", aligned(groups_as=lambda g: [0] * len(g)),
         ["interleaved", "group_index"]),
    Slip("5c", "log-probs not gathered", "ex5c_action_aligned_otb", aligned(gather_lp=False),
         ["log_probs must be finite", "otb.py rejected the arguments"]),
    Slip("5c", "token_rewards not gathered (left at their positions t)", "ex5c_action_aligned_otb",
         aligned(gather_r=False), ["rewards at their positions t", "gather token_rewards"], named_in="#58"),
]
