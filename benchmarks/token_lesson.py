"""One group of four responses, token by token: where OTB's per-token baseline parts from the group's.

The variance sweep saves, for its first N = 4 group with exactly one success, each response's tokens and
each token's advantage under the group mean, OTB and OTB without the row's own term
(``lesson_n30_seed0.json``, sweep_records.save_lesson). This draws it: one panel per estimator, one row per
response, each token a cell coloured by its advantage (a diverging scale around 0, the same for every
panel), and a line where the success becomes the only row still active. From there on OTB's baseline at
the success's positions is its own return (eq. 6 of otb.py with one row: lambda = 1), so its advantage is
0; the group mean keeps R - mean on every token, and otb_loo, with no other row left, keeps the return.

    python benchmarks/token_lesson.py benchmarks/results/smollm2_decomposition/lesson_n30_seed0.json
"""
import argparse
import json
import math
from pathlib import Path

import numpy as np


def load(path):
    """A saved lesson group: dict(n, seed, prompt, rows=[dict(tokens, reward, advantages={estimator: [...]})])."""
    return json.loads(Path(path).read_text())


def alone_from(lesson):
    """The position from which the group's one success runs alone: the longest other row's length."""
    others = [len(r["tokens"]) for r in lesson["rows"] if r["reward"] != 1]
    return max(others) if others else 0


def draw(lesson, path=None, estimators=("group_mean", "otb", "otb_loo")):
    """The figure (and, with ``path``, a PNG there). Returns the matplotlib figure."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = lesson["rows"]
    T = max(len(r["tokens"]) for r in rows)
    shown = [e for e in estimators if all(e in r["advantages"] for r in rows)]
    top = max(abs(a) for r in rows for e in shown for a in r["advantages"][e]) or 1.0
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 1.4 + 1.3 * len(shown) * len(rows) / 4), sharex=True,
                             squeeze=False, layout="constrained")
    for ax, e in zip(axes[:, 0], shown):
        grid = np.full((len(rows), T), math.nan)  # A_t per row and position, NaN past the row's end
        for i, r in enumerate(rows):
            grid[i, :len(r["tokens"])] = r["advantages"][e]
        image = ax.imshow(grid, aspect="auto", cmap="PuOr", vmin=-top, vmax=top, interpolation="nearest")
        ax.axvline(alone_from(lesson) - 0.5, color="k", lw=1, ls="--")
        ax.set_yticks(range(len(rows)), [f"{'success' if r['reward'] == 1 else 'failure'}, {len(r['tokens'])} tokens"
                                         for r in rows], fontsize=8)
        ax.set_title(e, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("token position t (dashed: from here the success is the only row still active)")
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="advantage A_t", shrink=0.9)
    fig.suptitle(f"one group of 4 with one success, counting to n = {lesson['n']} (prompt {lesson['prompt']})",
                 fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def summary(lesson):
    """Numbers the figure shows: per estimator, the mean advantage of the success's tokens while other rows are
    active and from the position where it runs alone; and the success's own weight in OTB's baseline,
    lambda_t = 1 - A_otb / A_loo (the identity A_otb = (1 - lambda_t) A_loo of docs/variance.md), averaged
    over the same two stretches (its tokens with A_loo != 0)."""
    cut = alone_from(lesson)
    win = next(r for r in lesson["rows"] if r["reward"] == 1)

    def means(values):
        before, after = [v for t, v in values if t < cut], [v for t, v in values if t >= cut]
        return dict(shared=sum(before) / len(before) if before else math.nan,
                    alone=sum(after) / len(after) if after else math.nan)
    out = dict(alone_from=cut, success_tokens=len(win["tokens"]),
               mean_advantage={e: means(list(enumerate(a))) for e, a in win["advantages"].items()})
    a = win["advantages"]
    if "otb" in a and "otb_loo" in a:
        out["self_weight"] = means([(t, 1 - x / y) for t, (x, y) in enumerate(zip(a["otb"], a["otb_loo"])) if y != 0])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lesson", help="a lesson_*.json that the variance sweep saved")
    p.add_argument("--out", default="", help="the PNG (default: beside the lesson, .png)")
    args = p.parse_args(argv)
    if not Path(args.lesson).is_file():
        p.error(f"{args.lesson}: no such file (the sweep writes it at its first prompt with a one-success group)")
    out = args.out or str(Path(args.lesson).with_suffix(".png"))
    lesson = load(args.lesson)
    draw(lesson, out)
    print(json.dumps(summary(lesson), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
