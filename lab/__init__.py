"""The lab bench: everything the learner's files use but a learner need not read.

The repository root holds the concepts (otb.py, toy_env.py, rollout.py, tasks.py, tool_use.py) and the commands
a reader runs (train.py, toy_harness.py, otb_trl.py). What only those files import lives here, so
that following one training step never leads into it:

    train_cli     train.py's options: their fields and presets, what they mean, the model they name
    parse_options how a command line becomes those options: parsed, checked, or read back by --resume
    runs          the run folder around training: checkpoints, Ctrl-C / SIGTERM, --resume
    progress      what a run shows while it runs: its progress bar and a comparison's time left
    logbook       what a step logs: the metrics.jsonl row, the readable line, a run's summary row
    models        the tiny character-level Llama, its cached supervised warm-up, pretrained loading
    compare       a comparison's runs, its table and plot, paired seeds, the learning-rate pilot
    preflight     one step at the largest shape: memory, time and disk of the whole run
    lr_schedule   learning-rate schedules (the length-triggered rule and two fixed clocks)
    diagnostics   forward-only noise diagnostics logged with every step
    fast_decode   decoders that are not bound by Python (a static KV cache, a compiled step)
    resampling    intervals: the bootstrap over prompts, ratios near zero, seeds as strata
    stats         closed forms over seeds: random effects, the t interval, power, seeds needed
    scale_free    scale-free measures of an estimator (normalised variance, alpha, cosine)
    plumbing      small helpers every command line shares (atomic writes, disk errors, ...)
    machine       the fingerprint of the machine a saved result was made on (its numbers depend on the CPU)

The direction of imports is one way: modules here may import the concept modules at the root, and
no concept module imports this package (tests/test_e2e_layout.py walks the imports to keep it so).
"""
