"""The two figures a lecturer projects with docs/teaching.md's two-hour path.

1. ``baselines.png``: the baseline over positions t on the toy bandit (``toy_env.py``, tabular
   policy, exact expectations): OTB's population baseline B*_t = E[G_t W_t] / E[W_t] (eq. (4) of
   otb.py), the exact per-position optimum (notebook 01, section 4; on the tabular policy it is
   E[G_t w_t] / E[w_t], the same formula weighted by w_t instead of W_t), and the classic optimal
   constant b* = E[||S||^2 R] / E[||S||^2]. The grey bars give the share of responses still running
   at t, which is what a group estimate of B_t has to work with.
2. ``masks.png``: a group of three responses as the estimators see it, by position t (right padding,
   tool output as holes inside a response) and by action k (eq. (8): each row's actions gathered to
   the left), with each action labelled by its k.

    python notebooks/teaching_figures.py                      # writes docs/figures/*.png
    python notebooks/teaching_figures.py --out /tmp/figures   # anywhere else

Notebook 01 draws the first figure with ``plot_baselines`` and prints ``energy_by_outcome``; the test suite runs ``main`` into a
temporary folder and checks the numbers behind the first figure against toy_env.
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import toy_env  # noqa: E402

OUT = ROOT / "docs" / "figures"
MASKS = ["1110001111100", "1111111110000", "1100000011110"]  # actions 1, tool output or padding 0
TOOL = [(3, 6), (), (2, 8)]  # [start, end) of each row's tool output; every other 0 is padding


def baselines_by_position(en):
    """{name: (T,) tensor} for the figure: the three baselines and the share of responses active at t."""
    w = en.w_proxy * en.mask  # w_t (exact on the tabular policy), (M, T)
    oracle = toy_env.oracle_baselines(en)
    return {
        "otb": oracle["otb_population"],  # B*_t = E[G_t W_t] / E[W_t], eq. (4), (T,)
        "w_weighted": en.expect(en.G * w) / en.expect(w),  # the same with w_t, (T,)
        "optimum": oracle["opt_per_position"],  # the exact per-position optimum, (T,)
        "b_star": oracle["b_star"],  # the classic constant, (T,)
        "active": en.expect(en.mask),  # P(the response is still running at t), (T,)
    }


def energy_by_outcome(en, t):
    """Among the responses still running at position t: the share that succeed, and the mean w_t and
    W_t of the failures (R = 0) and of the successes (R = 1), pi-weighted. What tells the w_t- and the
    W_t-weighted baselines apart at t."""
    w = en.w_proxy * en.mask  # w_t, (M, T)
    W = w.cumsum(-1) * en.mask  # W_t, (M, T)
    running = en.pi * en.mask[:, t]  # pi(tau) for responses running at t, 0 elsewhere, (M,)
    out = {"success_share": ((running * en.R).sum() / running.sum()).item()}
    for name, x in (("w", w[:, t]), ("W", W[:, t])):
        out[name] = tuple(((running * (en.R == r) * x).sum() / (running * (en.R == r)).sum()).item() for r in (0, 1))
    return out


def plot_baselines(en):
    """Draw the baselines of ``baselines_by_position`` against t on a new figure; returns its axes."""
    import matplotlib.pyplot as plt
    b = baselines_by_position(en)
    _, ax = plt.subplots(figsize=(6.4, 3.8))
    t = list(range(len(b["otb"])))
    share = ax.twinx()
    share.bar(t, b["active"].tolist(), color="0.85", width=0.6, zorder=0)
    share.set_ylabel("share of responses still running at t", color="0.45")
    share.set_ylim(0, 1.05)
    ax.set_zorder(share.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot(t, b["otb"].tolist(), "o-", lw=2.4, label="OTB: E[G_t W_t] / E[W_t]  (weights W_t)")
    ax.plot(t, b["optimum"].tolist(), "s--", label="exact optimum: E[G_t w_t] / E[w_t]  (weights w_t)")
    ax.plot(t, b["b_star"].tolist(), ":", c="k", label="b* (one number per response)")
    ax.set_xlabel("position t (counted from 0)")
    ax.set_ylabel("baseline")
    ax.set_title("Toy bandit, tabular policy: the baseline at each position")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_masks():
    """Draw ``MASKS`` by position t and by action k on the two axes of a new figure; returns them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    m = torch.tensor([[float(c) for c in s] for s in MASKS])  # m_t, (B, T)
    k = torch.where(m.bool(), m.long().cumsum(-1) - 1, -1)  # k_t, eq. (8), (B, T)
    idx = torch.argsort(m == 0, dim=-1, stable=True)  # t_k: where the k-th action sits, (B, T)
    m_k = m.gather(-1, idx)  # the right-padded mask over k, (B, T)
    _, axes = plt.subplots(1, 2, figsize=(11, 2.6))
    colours = {"action": "#4c72b0", "tool": "#dd8452", "pad": "0.88"}
    B, T = m.shape
    for ax, by_action in zip(axes, (False, True)):
        for i in range(B):
            for t in range(T):
                if by_action:
                    kind, label = ("action", str(t)) if m_k[i, t] else ("pad", "")
                else:
                    tool = TOOL[i] and TOOL[i][0] <= t < TOOL[i][1]
                    kind = "action" if m[i, t] else "tool" if tool else "pad"
                    label = str(int(k[i, t])) if m[i, t] else "tool" if tool and t == TOOL[i][0] else ""
                ax.add_patch(Rectangle((t, B - 1 - i), 0.94, 0.9, color=colours[kind]))
                ax.text(t + 0.47, B - 1 - i + 0.45, label, ha="center", va="center", fontsize=8,
                        color="white" if kind != "pad" else "0.3")
        ax.set_xlim(0, T)
        ax.set_ylim(0, B)
        ax.set_yticks([B - 1 - i + 0.45 for i in range(B)], [f"row {i}" for i in range(B)])
        ax.set_xticks([t + 0.47 for t in range(T)], [str(t) for t in range(T)])
        ax.set_xlabel("action index k" if by_action else "position t")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[0].set_title("by position t: B_t pools column t (labels: k_t)", fontsize=10)
    axes[1].set_title("by action k (otb_tir): B_k pools each row's k-th action", fontsize=10)
    axes[1].legend(handles=[Patch(color=colours["action"], label="action (mask 1)"),
                            Patch(color=colours["tool"], label="tool output (mask 0)"),
                            Patch(color=colours["pad"], label="padding (mask 0)")],
                   fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return axes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"folder to write baselines.png and masks.png into (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: exists and is not a folder")
    import matplotlib
    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
    args.out.mkdir(parents=True, exist_ok=True)
    ax = plot_baselines(toy_env.enumerate_toy(toy_env.ToyConfig()))
    ax.figure.tight_layout()
    ax.figure.savefig(args.out / "baselines.png", dpi=120)
    axes = plot_masks()
    axes[0].figure.tight_layout()
    axes[0].figure.savefig(args.out / "masks.png", dpi=120)
    plt.close("all")
    for name in ("baselines.png", "masks.png"):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
