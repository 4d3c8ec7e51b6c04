"""The statistics toolkit: how the saved studies judge an estimator and put intervals on the result.

The comparisons (lab/compare.py), the preflight's seed plan, toy_harness.py and the experiments in
benchmarks/ import these; a training step never does:

    scale_free    scale-free measures of an estimator: normalised variance, alpha, cosine (shrinking the
                  gradient earns nothing)
    resampling    intervals: the bootstrap over prompts, test-inversion sets for ratios near zero, seeds as strata
    stats         scipy and statsmodels over seeds: random effects, t intervals, a paired test's power, seeds
                  needed, exact tests of paired differences, Holm's correction
    compact       the sweeps' saved sufficient statistics, stored as only what the analysis reads (stats.npz)
"""
