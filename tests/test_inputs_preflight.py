"""--preflight: every failure is one line naming the phase and what lowers it; peaks per phase; the
default limit is the memory free on the device; checkpoint saves are in the projection; one real step
per batch size, each configuration projected with its own; with --compile-decode each batch size's step
is compiled before it is timed, its compile reported cold or warm and projected; the projected total
is the formula on recorded timings; --preset gpu's goal is printed beside the projection.

An out-of-memory error is simulated on the CPU: rollout.sample (the rollout) or rollout.score (learn:
score and update) raises torch.OutOfMemoryError, as CUDA's allocator does.
"""
import json
import logging
import os
import time

import pytest
import torch

import rollout
import tasks
import train
from lab import preflight
from lab import parse_options, options
from tiny_runs import TINY

ARGS = TINY + ["--compare", "otb:2,group_mean:4", "--token-budget", "200", "--preflight"]  # largest: 4 x 4 = 16 rows


def preflight_run(out, name, *extra):
    return train.main(ARGS + ["--out", str(out), "--name", name, *extra])


@pytest.fixture
def out(out):
    """The --out folder, with the tiny model's warm-up done (it samples: the patches below must not see it)."""
    cfg = parse_options.parse(TINY + ["--out", str(out)], train.Config, options.PRESETS)
    options.load(cfg, torch.device("cpu"))
    return out


def out_of_memory(*a, **k):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def stops(out, name, capsys, *extra):
    """Exit status 2 and one line on stderr; returns (the line, preflight.json)."""
    with pytest.raises(SystemExit) as stop:
        preflight_run(out, name, *extra)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    return err, json.loads((out / name / "preflight.json").read_text())


def test_out_of_memory_in_the_rollout_names_the_rollout_and_prompts_per_step(out, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "sample", out_of_memory)
    err, r = stops(out, "oom-rollout", capsys)
    assert "the rollout ran out of memory" in err and "--prompts-per-step 2 (now 4" in err, err
    assert "--micro-batch-rows" not in err and "Traceback" not in err
    assert r["out_of_memory"] and r["out_of_memory_phase"] == "rollout" and "runs" not in r
    assert set(r["peaks"]) == {"learn_full_length"}  # measured before the rollout failed


def test_out_of_memory_in_learn_names_learn_and_its_options(out, monkeypatch, capsys):
    """In the full-length update (the first phase) and in the real step's update (after a rollout)."""
    monkeypatch.setattr(rollout, "score", out_of_memory)
    err, r = stops(out, "oom-learn", capsys)
    assert "the learn (score and update) ran out of memory" in err and r["out_of_memory_phase"] == "learn", err
    assert "--micro-batch-rows 8 (now 16 rows per pass)" in err and "--activation-checkpointing" in err
    assert "--chunk-size" in err and "--prompts-per-step" not in err
    monkeypatch.undo()
    sampled, score = [], rollout.score

    def score_after_a_rollout(*a, **k):
        if sampled:
            out_of_memory()
        return score(*a, **k)
    real_sample = rollout.sample
    monkeypatch.setattr(rollout, "sample", lambda *a, **k: sampled.append(1) or real_sample(*a, **k))
    monkeypatch.setattr(rollout, "score", score_after_a_rollout)
    err, r = stops(out, "oom-learn-real", capsys, "--micro-batch-rows", "4", "--activation-checkpointing")
    assert ("the learn (score and update) ran out of memory" in err
            and "--micro-batch-rows 2 (now 4 rows per pass)" in err), err
    assert "--activation-checkpointing" not in err.split("with", 1)[1]  # already on: not proposed
    assert set(r["peaks"]) == {"learn_full_length", "rollout"}


def test_no_option_is_proposed_at_a_value_that_changes_nothing():
    cfg = parse_options.parse(TINY + ["--compare", "group_mean:4", "--micro-batch-rows", "32"], train.Config,
                          options.PRESETS)
    # 16 rows with --micro-batch-rows 32 run 16 per pass: halving the option's value would change nothing
    assert preflight.fixes(cfg, "learn", 16, 8)[0] == "--micro-batch-rows 8 (now 16 rows per pass)"
    assert preflight.fixes(cfg, "learn", 16, 8)[1] == "--chunk-size 4 (now 8)"  # 8 positions: 32 would be all
    floor = parse_options.parse(TINY + ["--compare", "group_mean:4", "--micro-batch-rows", "1", "--chunk-size", "1",
                                    "--activation-checkpointing", "--prompts-per-step", "1"], train.Config,
                            options.PRESETS)
    assert preflight.fixes(floor, "learn", 4, 8) == [] and preflight.fixes(floor, "rollout", 4, 8) == []
    r = dict(out_of_memory=True, out_of_memory_phase="rollout", memory_limit=None, largest="group_mean:4",
             positions=20)
    assert "no option lowers the rollout further" in preflight.too_big(floor, r, 4, 8)


def test_peaks_are_split_where_train_steps_rollout_ends(out, monkeypatch):
    """A fake allocator peak: 111 during the rollout, 222 during learn (reset_peak does nothing), so each
    phase's peak is the value at its end only if the split falls between rollout.sample and the scoring
    pass (where train_step writes its "score" record)."""
    level = [50]
    monkeypatch.setattr(preflight, "reset_peak", lambda device: None)
    monkeypatch.setattr(preflight, "peak", lambda device: level[0])
    sample, score = rollout.sample, rollout.score

    def sampling(*a, **k):
        level[0] = 111
        return sample(*a, **k)

    def scoring(*a, **k):
        level[0] = 222 if level[0] == 111 or level[0] == 222 else 50
        return score(*a, **k)
    monkeypatch.setattr(rollout, "sample", sampling)
    monkeypatch.setattr(rollout, "score", scoring)
    r = preflight_run(out, "peaks", "--memory-limit", "1000")
    assert r["peaks"] == {"learn_full_length": 50, "rollout": 111, "learn": 222} and r["peak_memory"] == 222


def test_the_phases_are_timed_from_the_steps_own_records_and_add_up_to_it(out, monkeypatch):
    """timed_step reads the records train_step writes on its step log as each phase begins: the four
    phases in the step's order, each from its record to the next (the rollout to the scoring pass's start,
    as rollout.score sees it), adding up to the step's seconds measured outside it. train.py's names are
    untouched (nothing of it is replaced while the step runs), and the log is left as it was: unheard,
    its records reaching no handler above it while heard."""
    cfg = parse_options.parse(TINY + ["--out", str(out), "--estimator", "otb"], train.Config, options.PRESETS)
    model, tok, _ = options.load(cfg, torch.device("cpu"))
    task, estimator = options.make_task(cfg), train.make_estimator("otb", False)
    names, heard_above = dict(vars(train)), []
    scoring_began, score = [], rollout.score

    def scoring(*a, **k):
        scoring_began.append(time.perf_counter())
        return score(*a, **k)
    monkeypatch.setattr(rollout, "score", scoring)
    rollout_ended = []
    above = preflight.Listening(logging.getLogger("train"), heard_above.append)
    with above:
        t0 = time.perf_counter()
        s, t = preflight.timed_step(train, cfg, model, model, torch.optim.AdamW(model.parameters()), task, tok,
                                    estimator, 0, lambda: rollout_ended.append(time.perf_counter()))
        step = time.perf_counter() - t0
    assert list(t) == ["rollout", "score", "estimate", "update"] and all(v > 0 for v in t.values())
    assert sum(t.values()) == pytest.approx(step, rel=0.05) and sum(t.values()) <= step
    assert t0 < rollout_ended[0] <= scoring_began[0] and t0 + t["rollout"] <= scoring_began[0]
    assert len(s.ro.response) == 16 and heard_above == []
    assert all(vars(train)[k] is v for k, v in names.items())
    assert train.step_log.handlers == [] and not train.step_log.isEnabledFor(logging.DEBUG)
    assert train.step_log.propagate


@pytest.mark.parametrize("extra", [[], ["--micro-batch-rows", "4"]])
def test_the_full_length_phase_learns_as_the_step_does(out, extra):
    """score_estimate_update, the preflight's learning half for its own batch, is train_step after its
    rollout: on the batch a real step sampled, from the same weights and a fresh optimizer, it leaves the
    weights the step left (one pass over the batch, and micro-batches of 4 rows)."""
    cfg = parse_options.parse(TINY + ["--out", str(out), "--estimator", "otb", *extra], train.Config,
                              options.PRESETS)
    model, tok, _ = options.load(cfg, torch.device("cpu"))
    task, estimator = options.make_task(cfg), train.make_estimator("otb", False)
    adamw = lambda: torch.optim.AdamW(model.parameters(), lr=cfg.lr)  # noqa: E731
    init = {k: v.clone() for k, v in model.state_dict().items()}
    s = train.train_step(cfg, model, model, adamw(), task, tok, estimator, 0)
    stepped = {k: v.clone() for k, v in model.state_dict().items()}
    assert any(not torch.equal(init[k], v) for k, v in stepped.items())  # the step did change the weights
    model.load_state_dict(init)
    answers = tasks.prompt_batch(task, tok, cfg.seed, 0, cfg.prompts_per_step)[1]
    _, token_rewards, _ = tasks.rewards(task, tok, s.ro, answers, cfg.group_size)
    preflight.score_estimate_update(train, cfg, model, adamw(), s.ro, token_rewards, estimator)
    assert all(torch.equal(stepped[k], v) for k, v in model.state_dict().items())


def test_over_the_limit_names_each_phase_over_it(out, capsys, monkeypatch):
    monkeypatch.setattr(preflight, "reset_peak", lambda device: None)
    # learn at full length; then the real step of each batch size, smallest first: its rollout, its learn
    values = iter([0.5e9, 1e9, 0.8e9, 3e9, 1e9])
    monkeypatch.setattr(preflight, "peak", lambda device: next(values))
    err, r = stops(out, "over", capsys, "--memory-limit", "2")
    assert "the rollout peaked at 3.00 GB, above --memory-limit (2.00 GB)" in err, err
    assert "lower the rollout with --prompts-per-step 2" in err and "--micro-batch-rows" not in err
    assert r["peak_memory"] == 3e9 and not r["out_of_memory"]


def test_the_default_limit_is_the_free_memory_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (7_000_000_000, 80_000_000_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1_500_000_000)
    assert preflight.device_memory(torch.device("cuda")) == 8_500_000_000  # free + what this process holds


def test_checkpoint_saves_are_in_the_time_and_disk_projection(out, capsys):
    r = preflight_run(out, "saves", "--checkpoint-minutes", "0")  # a checkpoint after every step
    P = sum(p.numel() for p in options.load(parse_options.parse(TINY, train.Config, options.PRESETS),
                                              torch.device("cpu"))[0].parameters())
    assert r["checkpoint_saves"] == sum(x["runs"] * x["steps"] for x in r["runs"])
    assert 12 * P <= r["checkpoint_bytes"] <= 12 * P + 200_000  # float32 weights and AdamW's two moments
    assert r["projected_bytes_written"] == r["checkpoint_saves"] * r["checkpoint_bytes"]
    steps_time = sum(x["runs"] * x["steps"] * x["seconds_per_step"] for x in r["runs"])
    assert r["projected_seconds"] == pytest.approx(steps_time + r["checkpoint_saves"] * r["seconds_checkpoint"])
    assert not (out / "saves" / "preflight_checkpoint.pt").exists()
    shown = capsys.readouterr().out
    assert f"{r['checkpoint_saves']} checkpoint saves of" in shown
    r = preflight_run(out, "saves-every-hour", "--checkpoint-minutes", "60")
    for x in r["runs"]:  # seconds per step are well under an hour: after the first step and after the last
        assert x["saves"] == min(x["steps"], 2)


def test_the_real_steps_success_and_mismatch_are_reported(out, capsys, monkeypatch):
    """success is each real step's fraction of rewarded responses (the report's own: the largest's), and on
    the CPU (float32 sampler and trainer) the mismatch is float32 rounding. One rollout per batch size."""
    seen = []
    real = rollout.sample
    monkeypatch.setattr(rollout, "sample", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    r = preflight_run(out, "success")
    shown = capsys.readouterr().out
    assert 0 <= r["success"] <= 1 and r["success"] * 16 == pytest.approx(round(r["success"] * 16))
    assert r["mismatch_max_abs"] < 1e-4 and 0 <= r["mismatch_mean_abs"] <= r["mismatch_max_abs"]
    assert f"success {r['success']:.3f}" in shown and "sampler / trainer mismatch" in shown
    assert [ro.response.shape[0] for ro in seen] == [8, 16]  # otb:2, then group_mean:4 at 4 prompts
    for m, ro in zip(r["measured"], seen):
        assert (m["rows"] == len(ro.response)
                and m["success"] * m["rows"] == pytest.approx(round(m["success"] * m["rows"])))
        assert m["mean_response_length"] == pytest.approx(ro.response_mask.sum(-1).mean().item())
    assert r["success"] == r["measured"][-1]["success"]


@pytest.mark.compile_path
def test_each_batch_size_is_compiled_before_its_timed_step_and_its_compile_projected(out, capsys, monkeypatch):
    """--compile-decode: the real step of each batch size (otb:2 and group_mean:4 at 4 prompts: 8 and 16
    rows) runs twice from the initial weights (the first, untimed, compiles the decode step), and the
    projection adds each batch size's compile, at its untimed rollout's seconds less its timed one's,
    once (not per seed). The rollout's time is its decode steps x its seconds per decode step."""
    from lab import fast_decode
    monkeypatch.setattr(fast_decode, "BACKEND", "aot_eager")  # traced, not code-generated: seconds
    monkeypatch.setattr(fast_decode, "_compiled", {})
    weights, rows, real = [], [], fast_decode.sample  # the sampler of --compile-decode

    def sample(model, prompts, **k):
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
        rows.append(len(prompts) * k["group_size"])
        return real(model, prompts, **k)
    monkeypatch.setattr(fast_decode, "sample", sample)
    r = preflight_run(out, "compiled", "--compile-decode", "--seeds", "0,1")
    assert rows == [8, 8, 16, 16] and all(torch.equal(w, weights[0]) for w in weights)  # each from the initial weights
    assert r["compiles"] == 2 and [m["rows"] for m in r["measured"]] == [8, 16]
    for m in r["measured"]:
        assert m["seconds_compile"] >= 0 and m["compile_cache"] == "none"  # aot_eager: inductor built nothing
        assert m["compiled"]["graphs"] == 1 and m["compiled"]["decode_step_graphs"] == 1  # one graph per batch size
        assert m["seconds_per_decode_step"] * m["decode_steps"] == pytest.approx(m["seconds_rollout"])
    compiling = sum(m["seconds_compile"] for m in r["measured"])
    assert r["seconds_compiling"] == pytest.approx(compiling)
    for x in r["runs"]:  # each configuration at its own batch size's measured step
        m = next(m for m in r["measured"] if m["group_size"] == x["group_size"])
        assert x["seconds_per_step"] == m["seconds_rollout"] + m["seconds_score_update"]
    steps_time = sum(x["runs"] * x["steps"] * x["seconds_per_step"] for x in r["runs"])
    assert r["projected_seconds"] == pytest.approx(steps_time + r["checkpoint_saves"] * r["seconds_checkpoint"]
                                                   + compiling)
    need = r["seeds_plan"]  # compiling is paid once, not per seed
    assert need["projected_seconds_needed"] == pytest.approx(
        compiling + need["seeds_needed"] * need["seconds_per_seed"])
    shown = capsys.readouterr().out
    assert "2 compiles of the decode step" in shown and "8 rows (otb:2)" in shown and "16 rows (group_mean:4)" in shown
    plain = preflight_run(out, "plain")
    assert plain["compiles"] == 0 and "goal_hours" not in plain  # the goal is the GPU preset's
    assert all(m["seconds_compile"] is None for m in plain["measured"])


def measured_step(run, rows, L, rollout, learn, compile_seconds, cache):
    """A step_record as the preflight stores it, with recorded (here: made up) timings."""
    return dict(run=run, rows=rows, mean_response_length=L, seconds_rollout=rollout, seconds_score_update=learn,
                decode_steps=280, seconds_per_decode_step=rollout / 280, success=0.25, mismatch_mean_abs=7e-3,
                mismatch_max_abs=0.1, seconds_compile=compile_seconds, compile_cache=cache, compiled=None)


def test_the_projected_total_is_the_formula_on_recorded_timings(capsys):
    """--preset gpu's plan (a pilot of 4 rates at group_mean:4 on B / 4 = 80,000 tokens, then 6 seeds of
    otb:4, group_mean:4 and group_mean:16 at 320,000) on recorded timings of one step per batch size,
    computed here by hand from the formula in lab/preflight.py's docstring; the stored and the printed
    totals must be this."""
    cfg = parse_options.parse(["--preset", "gpu", "--device", "cpu"], train.Config, options.PRESETS)
    measured = {4: measured_step("group_mean:4", 32, 124.0, 1.2, 0.4, 40.0, "cold"),
                16: measured_step("group_mean:16", 128, 124.0, 2.5, 1.4, 45.0, "warm")}
    r = preflight.project(cfg, "group_mean", 16, 128, 327, [[0] * 46] * 8, measured, {"learn": 7e9}, 2.0,
                          (1.6, 1.61e9), 134_515_008)
    r["memory_limit"], r["device"] = None, "cuda"
    # steps = ceil(B / (8 x N x L)): N = 4: ceil(320,000 / 3,968) = 81; N = 16: ceil(320,000 / 15,872) = 21;
    # the pilot's N = 4 at 80,000: ceil(80,000 / 3,968) = 21. Seconds per step: 1.2 + 0.4 = 1.6 and 2.5 + 1.4 = 3.9.
    assert [(x["run"], x["runs"], x["steps"]) for x in r["runs"]] == [
        ("pilot group_mean:4", 4, 21), ("otb:4", 6, 81), ("group_mean:4", 6, 81), ("group_mean:16", 6, 21)]
    # saves (every 2 minutes): an N = 4 run of 81 x 1.6 = 129.6 s saves after step 1 (1.6 s), step 76 (121.6 s,
    # the first 120 s after the last save) and step 81 (the last): 3; the N = 16 run (81.9 s) and each pilot
    # run (33.6 s) after their first and last steps: 2. In all 6 x (3 + 3 + 2) + 4 x 2 = 56.
    assert [x["saves"] for x in r["runs"]] == [2, 3, 3, 2] and r["checkpoint_saves"] == 56
    # 6 x (81 x 1.6 + 81 x 1.6 + 21 x 3.9) + 4 x 21 x 1.6 + 56 x 1.6 + (40 + 45)
    #   = 6 x 341.1 + 134.4 + 89.6 + 85 = 2,355.6 s = 39.26 min
    assert r["projected_seconds"] == pytest.approx(2355.6) and r["seconds_compiling"] == 85.0
    shown = preflight.describe(r)
    assert "projected: 39.3 min (0.65 h)" in shown and "projected here 0.65 h" in shown, shown
    assert "compiling it 40.0 s, cold" in shown and "compiling it 45.0 s, warm (inductor read its kernels" in shown
    assert "32 rows (group_mean:4): 1.2 s + 0.4 s, 124 tokens, 280 decode steps of 4.3 ms" in shown


def test_a_compile_is_cold_where_inductors_cache_missed(monkeypatch):
    """fast_decode.compiled_since on made-up counter readings: a miss makes it cold (kernels built), hits
    alone warm, neither none; the decode step's first graph is no recompile, a second one is."""
    from lab import fast_decode
    zero = dict(graphs=0, decode_step_graphs=0, cudagraph_skips=0, fx_cache_hits=0, fx_cache_misses=0)
    for now, cache, recompiles in [(dict(graphs=1, decode_step_graphs=1, fx_cache_misses=2), "cold", 0),
                                   (dict(graphs=1, decode_step_graphs=1, fx_cache_hits=2), "warm", 0),
                                   (dict(graphs=1, decode_step_graphs=1, fx_cache_hits=1, fx_cache_misses=1),
                                    "cold", 0),
                                   (dict(graphs=1, decode_step_graphs=1), "none", 0)]:
        monkeypatch.setattr(fast_decode, "compile_counts", lambda now=now: dict(zero, **now))
        added = fast_decode.compiled_since(zero)
        assert (added["cache"], added["recompiles"], added["graphs"]) == (cache, recompiles, 1)
    monkeypatch.setattr(fast_decode, "compile_counts", lambda: dict(zero, decode_step_graphs=2, graphs=1))
    assert fast_decode.compiled_since(dict(zero, decode_step_graphs=1))["recompiles"] == 1  # a new batch size


@pytest.mark.compile_path
@pytest.mark.skipif(not (os.environ.get("OTB_SLOW_TESTS") or os.environ.get("CI")),
                    reason="inductor's first compile in a process takes 10-20 s on a 2-core CPU; CI runs it")
def test_inductors_cache_counters_tell_a_cold_compile_from_a_warm_one(tmp_path, monkeypatch):
    """The counters compile_counts reads exist and move on this torch: a function compiled with inductor
    into an empty cache folder is cold, compiled again from that folder after dynamo forgets it is warm,
    and cold again in another empty folder."""
    from lab import fast_decode

    def f(x):
        return torch.sin(x) * 2 + x.sum()

    def compile_once():
        torch._dynamo.reset()
        before = fast_decode.compile_counts()
        torch.compile(f, backend="inductor", fullgraph=True)(torch.randn(8))
        return fast_decode.compiled_since(before)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a"))
    first, second = compile_once(), compile_once()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "b"))
    assert (first["cache"], second["cache"], compile_once()["cache"]) == ("cold", "warm", "cold")
    assert first["graphs"] == 1 and first["fx_cache_misses"] >= 1 and second["fx_cache_hits"] >= 1
    torch._dynamo.reset()


def test_the_gpu_presets_goal_is_printed_beside_the_projection(out, capsys):
    """--preset gpu on the tiny model and task: the preset's settings with a step that takes seconds."""
    r = preflight_run(out, "goal", "--preset", "gpu", "--model", "tiny", "--task", "reverse", "--device", "cpu",
                      "--temperature", "1.0")
    assert r["goal_hours"] == [("one H100", 1.0), ("a 24 GB card", 2.0)]
    assert f"goal for this preset (docs/training.md): 1 h on one H100, 2 h on a 24 GB card; projected here " \
           f"{r['projected_seconds'] / 3600:.2f} h" in capsys.readouterr().out
