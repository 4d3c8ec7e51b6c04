"""A saved result against a fresh re-analysis of its saved statistics: the same record.

The tables a script writes (``table.md``, ``summary.md``) round every number, so they are compared
byte for byte. The JSON records keep floats to their last bit, and the last bits of a float sum
depend on the CPU's kernels (another SIMD width adds in another order): the same code re-analysing
the same ``stats.npz`` on another CPU moves them by about 1e-16 relative. ``same_record`` therefore
holds the JSON to everything a changed analysis would move (keys, order of rows, strings, integers,
verdicts, None) and floats to ``rel`` = 1e-9, a billion times that rounding and far below any digit
a table or a doc shows.
"""
import math


def same_record(got, want, rel=1e-9, where="record"):
    """Raise AssertionError naming the first place where JSON values ``got`` and ``want`` differ."""
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool), \
            f"{where}: {got!r} against {want!r}"
        if math.isnan(want) or math.isnan(got):
            assert math.isnan(want) and math.isnan(got), f"{where}: {got!r} against {want!r}"
        else:
            assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-300), f"{where}: {got!r} against {want!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: keys {list(got)} against {list(want)}"
        for k in want:
            same_record(got[k], want[k], rel, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {len(got)} items against {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            same_record(g, w, rel, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} against {want!r}"
