"""The horizon sweep's aggregation (benchmarks/horizon_sweep.py) on hand-made rows."""
import math

import pytest

from benchmarks import horizon_sweep as hs


def row(est, nvar, seed, n=64, N=4):
    return dict(estimator=est, N=N, n=n, seed=seed, nvar=nvar)


def test_gain_is_the_nvar_ratio_per_seed_then_averaged():
    rows = [row("group_mean", 10.0, 0), row("otb", 2.0, 0), row("group_mean", 6.0, 1), row("otb", 3.0, 1)]
    g = {(s["estimator"], s["N"], s["n"]): s for s in hs.gains(rows)}
    assert g[("otb", 4, 64)]["per_seed"] == [5.0, 2.0]
    assert g[("otb", 4, 64)]["gain"] == pytest.approx(3.5)
    assert g[("otb", 4, 64)]["gain_se"] == pytest.approx(1.5)  # sd 2.121 / sqrt(2)
    assert g[("group_mean", 4, 64)]["gain"] == 1.0


def test_a_seed_without_measurable_signal_is_left_out_not_divided_by_zero():
    rows = [row("group_mean", 10.0, 0), row("otb", 0.0, 0), row("group_mean", 6.0, 1), row("otb", 3.0, 1)]
    g = {(s["estimator"], s["N"], s["n"]): s for s in hs.gains(rows)}
    assert math.isnan(g[("otb", 4, 64)]["per_seed"][0]) and g[("otb", 4, 64)]["gain"] == 2.0
