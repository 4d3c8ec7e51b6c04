"""The teaching figure of docs/tool_use.md: one group's baselines by position (otb) and by action (otb_tir).

Two responses to one prompt, each with a tool reply inside it, of different lengths:

    t       0 1 2 3 4 5 6 7 8 9 10 11
    row 0   a a a [t t] a a a a a  a         R = 1   (3 actions, a 2-token reply, 6 actions)
    row 1   a a a [t t t t t] a a  a  a      R = 0   (3 actions, a 5-token reply, 4 actions)

Every action has the same energy w_t = 0.5 (pi(y_t) = 0.5 and sum_k pi_k^2 = 0.5 in eq. (7) of
otb.py), so what the figure shows comes from the alignment alone. By action (``otb_tir``) the two
rows' k-th actions share one baseline, B_k = (1 W_k + 0 W_k) / (2 W_k) = 0.5, for k = 1..7, the
actions both rows have; row 0's 8th and 9th actions have no partner, their baseline is their own
return (as after any row's end). By position (``otb``): at t = 5..7 row 0's 4th-6th actions meet
row 1's tool reply, so only row 0 is active, B = its own return and its advantage is 0; at
t = 8..10 row 0's 7th-9th actions are pooled with row 1's 4th-6th, whose energy W_t is smaller, so
B leans towards row 0's return (0.64 to 0.60 instead of 0.5); at t = 11 row 1's last action has no
partner. The baselines are read from the estimators as B_t = G_t - A_t.

    python benchmarks/alignment_figure.py                     # writes runs/alignment/
    python benchmarks/alignment_figure.py --out benchmarks/results/alignment   # the committed figure
"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import otb  # noqa: E402
from benchmarks import cli  # noqa: E402

ROWS = [(3, 2, 6, 1.0), (3, 5, 4, 0.0)]  # per row: actions, tool tokens, actions, outcome reward R


def group():
    """The two rows as right-padded (B, T) tensors: the estimators' keyword arguments."""
    T = max(a + h + b for a, h, b, _ in ROWS)
    mask, rewards = torch.zeros(len(ROWS), T), torch.zeros(len(ROWS), T)
    for i, (a, h, b, R) in enumerate(ROWS):
        mask[i, :a] = 1
        mask[i, a + h:a + h + b] = 1
        rewards[i, a + h + b - 1] = R  # the outcome reward on the last action
    return dict(token_rewards=rewards, response_mask=mask, group_index=torch.zeros(len(ROWS), dtype=torch.long),
                log_probs=torch.full((len(ROWS), T), 0.5).log(), sum_pi_sq=torch.full((len(ROWS), T), 0.5))


def baselines():
    """{estimator: B_t = G_t - A_t, (B, T), nan where the row has no action}, and the mask."""
    x = group()
    m = x["response_mask"]
    out = {}
    for name in ("otb", "otb_tir"):
        A, G = otb.ESTIMATORS[name](**x)
        out[name] = torch.where(m.bool(), G - A, torch.nan)
    return out, m


def plot(out, m, path):
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(ROWS), 1, figsize=(8, 2.4 * len(ROWS)), sharex=True)
    T = m.shape[1]
    for i, ax in enumerate(axes):
        a, h, b, R = ROWS[i]
        ax.axvspan(a - 0.5, a + h - 0.5, color="0.85", label="tool reply (mask 0)")
        ax.axvspan(a + h + b - 0.5, T - 0.5, facecolor="0.95", hatch="//", edgecolor="0.8", label="padding")
        t = torch.arange(T)
        ax.plot(t, out["otb"][i], "o-", color="C3", label="by position (otb)")
        ax.plot(t, out["otb_tir"][i], "s--", color="C0", label="by action (otb_tir)")
        ax.axhline(R, color="k", lw=0.8, ls=":", label=f"own return R = {R:g}")
        ax.set(ylim=(-0.1, 1.1), ylabel="baseline B_t", title=f"row {i}: {a} actions, a {h}-token tool reply, "
               f"{b} actions; R = {R:g}")
        ax.title.set_fontsize(9)
    axes[-1].set(xlabel="position t in the response", xticks=range(T))
    axes[0].legend(fontsize=7, ncol=3, loc="lower left")
    fig.suptitle("One group of two responses: OTB's baseline pooled by position or by action", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("--out", type=cli.out_folder, default=str(cli.RUNS / "alignment"), help="the folder to write")
    args = p.parse_args(argv)
    out, m = baselines()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    plot(out, m, folder / "alignment.png")
    values = {name: [[None if v != v else round(v, 6) for v in row] for row in b.tolist()] for name, b in out.items()}
    (folder / "baselines.json").write_text(json.dumps(dict(rows=ROWS, baselines=values), indent=1) + "\n")
    print(f"wrote {folder}/alignment.png and baselines.json")
    return out, m


if __name__ == "__main__":
    main()
