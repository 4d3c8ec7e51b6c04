"""The lab bench: everything the learner's files use but a learner need not read.

The repository root holds the concepts (otb.py, toy_env.py, rollout.py, tasks.py, tool_use.py) and
the commands a reader runs (train.py, toy_harness.py, otb_trl.py). What only those files import lives
here, so that following one training step never leads into it:

    options       train.py's options: their fields and presets, what they mean (the tasks by name), the
                  model they name, the device; UsageError, the one-line error of a bad option
    parse_options how a command line becomes those options: parsed, checked (output folders writable), or
                  read back by --resume; train.py's start: the header, the model, the run folder
    runs          the runs a command makes (a comparison's configurations, seeds, run names) and the run
                  folder around training: config.json, checkpoints, metrics.jsonl, Ctrl-C / SIGTERM, --resume
    progress      what a run shows while it runs: its progress bar and a comparison's time left
    logbook       what a step logs: the metrics.jsonl row, the readable line, a run's summary row
    models        the tiny character-level Llama, its cached supervised warm-up, pretrained loading, weights
                  saved whole or not at all
    compare       a comparison's runs, its table and plot, paired seeds, the learning-rate pilot
    preflight     the largest step's memory, one real step per batch size: time and disk of the whole run
    lr_schedule   learning-rate schedules (the length-triggered rule and two fixed clocks)
    diagnostics   forward-only noise diagnostics logged with every step
    fast_decode   a sampler for a GPU: a static KV cache, a compiled decode step, draws without host syncs
    machine       the machine a result was made on: the fingerprint its numbers depend on, what a benchmark
                  records, the commit; the code a run records as it starts (provenance.json, code.diff)
    analysis/     the statistics toolkit (scale_free, resampling, stats): lab/analysis/__init__.py

The direction of imports is one way: modules here may import the concept modules at the root, and
no concept module imports this package (tests/test_e2e_layout.py walks the imports to keep it so).
"""
