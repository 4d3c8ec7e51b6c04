"""A saved result against a fresh re-analysis of its saved statistics: the same record.

The last bits of a float sum depend on the CPU's kernels (another SIMD width adds in another order,
MKL picks its code by CPU): the same code re-analysing the same saved statistics on another CPU moves
a float by about 1e-16 relative. So neither kind of saved file is compared byte for byte:

- ``same_record``, for the JSON records, which keep floats to their last bit: everything a changed
  analysis would move exactly (keys, order of rows, strings, integers, verdicts, None), floats to
  ``rel`` = 1e-9, a billion times that rounding and far below any digit a table or a doc shows;
- ``same_text``, for the tables a script writes (``table.md``, ``summary.md``), which round every
  number: the words and integers exactly, and each rounded number as printed or one unit of its last
  digit away (a value within the last bits of a rounding boundary prints either way:
  ``lab.machine.rounding_moves``).

A test that holds a committed file's text against text computed at test time uses one of these, never
``==`` (test_exact_saved_records.py's guard finds one that does), and is marked ``saved_results``.
"""
import math

from lab.machine import rounding_moves


def same_text(got, want, where="text"):
    """Raise AssertionError naming the first line where two rounded texts differ by more than rounding."""
    if rounding_moves(want, got) is not None:
        return
    a, b = want.splitlines(), got.splitlines()
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if rounding_moves(x, y) is None), min(len(a), len(b)))
    line = lambda lines: repr(lines[k]) if k < len(lines) else "(no such line)"  # noqa: E731
    raise AssertionError(f"{where}, line {k + 1}: {line(b)} against the saved {line(a)}")


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
