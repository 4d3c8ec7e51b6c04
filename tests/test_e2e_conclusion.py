"""A short comparison of train.py (tiny model, 4 steps) ends, in summary.md and on the screen, with
sentences computed from its runs: each one's final success against the first configuration's, paired
by step, whether its interval excludes 0, and that this is about these runs, not the methods. The numbers are recomputed here from the runs'
metrics.jsonl with the interval written out (tests/test_exact_compare.py holds the hand-made cases,
one difference resolved and one not)."""
import json
import math

from tiny_runs import metrics, run

T3 = 3.182446305284263  # t(0.975, 3): the 95% t interval over 4 paired steps


def test_a_short_comparison_ends_with_what_its_runs_show(out, capsys):
    run(out, "cmp", "--compare", "otb:2,group_mean:2,rloo:2", "--steps", "4")
    folder = out / "cmp"
    printed = capsys.readouterr().out
    summary = (folder / "summary.md").read_text()
    names = [r["run"] for r in json.loads((folder / "summary.json").read_text())["runs"]]
    assert names == ["otb-n2", "group_mean-n2", "rloo-n2"]
    success = {n: [r["success"] for r in metrics(folder / n)] for n in names}
    shown, resolved = [], []
    for n in names[1:]:
        d = [a - b for a, b in zip(success["otb-n2"], success[n])]  # 4 steps, the same prompts at each
        mean = sum(d) / 4
        half = T3 * math.sqrt(sum((x - mean) ** 2 for x in d) / 3) / 2
        shown.append(f"{n} {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]")
        resolved.append(mean - half > 0 or mean + half < 0)
    last = summary.rstrip("\n").splitlines()[-1]
    assert last.startswith("Final success of otb-n2 minus each other run, paired by step over the last 4 steps")
    assert "; ".join(shown) + "." in last
    if not any(resolved):
        assert "In these runs every interval contains 0." in last
    elif all(resolved):
        assert "In these runs every interval excludes 0." in last
    else:
        assert f"In these runs the interval excludes 0 for {names[1 + resolved.index(True)]}" in last
    assert "Each interval is about these runs, not about the methods" in last
    assert last.endswith("in docs/reproduction.md (equal sampled tokens) and docs/stability.md (collapse), over "
                         "paired seeds.")
    assert printed.rstrip("\n").endswith(last)  # the screen ends with the same sentences
