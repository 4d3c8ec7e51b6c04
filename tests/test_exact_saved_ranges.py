"""Exact tier: every number saved under benchmarks/results lies in its mathematical range, or is
flagged. A cosine lies in [-1, 1], a rescaled MSE and a success rate in [0, 1], a gain, a normalised
or raw variance and a squared bias in [0, inf). A value outside (an unbiased estimate of a bias^2
can be negative, a cosine from estimated norms can exceed 1) is allowed only where the dict that
holds it lists the metric in ``out_of_range``, which the printed tables turn into a mark."""
import json
import math
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
RANGES = {"cosine": (-1.0, 1.0), "rmse": (0.0, 1.0), "success": (0.0, 1.0), "gain": (0.0, math.inf),
          "nvar": (0.0, math.inf), "variance": (0.0, math.inf), "bias2": (0.0, math.inf)}


def metric_of(key):
    """The ranged metric a key holds ('cosine_hi' -> cosine, 'raw_variance' -> variance), or None."""
    if key.endswith("_se"):
        return None  # a standard error, not a value of the metric
    base = key[:-3] if key.endswith(("_lo", "_hi")) else key
    return base if base in RANGES else base.rsplit("_", 1)[-1] if base.rsplit("_", 1)[-1] in RANGES else None


def numbers(x):
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield float(x)
    elif isinstance(x, list):
        for v in x:
            yield from numbers(v)


def violations(x, path=""):
    """(path, value) of every ranged number outside its range that its dict does not flag."""
    if isinstance(x, dict):
        flagged = set(x.get("out_of_range", []))
        for k, v in x.items():
            m = metric_of(str(k))
            if m is not None and m not in flagged and str(k)[:-3] not in flagged:
                lo, hi = RANGES[m]
                yield from ((f"{path}/{k}", y) for y in numbers(v) if not math.isnan(y) and not lo <= y <= hi)
            yield from violations(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from violations(v, f"{path}[{i}]")


def test_metric_names_and_flags():
    assert [metric_of(k) for k in ("cosine_hi", "raw_variance", "gain", "bias2_se", "alpha", "success_rate")] == \
        ["cosine", "variance", "gain", None, None, None]
    assert list(violations({"rows": [{"cosine": [1.2, 0.9, 1.3], "bias2": -1e-6, "alpha": 7.0}]})) == \
        [("/rows[0]/cosine", 1.2), ("/rows[0]/cosine", 1.3), ("/rows[0]/bias2", -1e-6)]
    assert not list(violations({"cosine": [1.2, 0.9, 1.3], "bias2": -1.0, "out_of_range": ["cosine", "bias2"]}))
    assert not list(violations({"gain": [3.0, 1.5, math.inf], "nvar": [math.nan] * 3}))


@pytest.mark.parametrize("path", sorted(RESULTS.rglob("*.json")), ids=lambda p: str(p.relative_to(RESULTS)))
def test_saved_values_are_in_range_or_flagged(path):
    bad = list(violations(json.loads(path.read_text())))
    assert not bad, f"{len(bad)} values out of range and not flagged, e.g. {bad[:3]}"


@pytest.mark.parametrize("path", sorted(RESULTS.rglob("*.md")), ids=lambda p: str(p.relative_to(RESULTS)))
def test_no_printed_p_value_is_nan(path):
    """A probability is printed in [0, 1], or replaced by words where it has no value ("- (one seed)"): a
    "p nan" in a table is a number outside its range with no mark."""
    bad = [line[:120] for line in path.read_text().splitlines() if re.search(r"\(p nan\)|\bp = nan\b", line)]
    assert not bad, f"{len(bad)} printed lines with p nan, e.g. {bad[:2]}"
