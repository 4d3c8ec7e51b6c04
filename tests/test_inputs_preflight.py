"""--preflight: every failure is one line naming the phase and what lowers it; peaks per phase; the
default limit is the memory free on the device; checkpoint saves are in the projection; with
--compile-decode the step is compiled before it is timed and each batch size's compile is projected;
--preset gpu's goal is printed beside the projection.

An out-of-memory error is simulated on the CPU: rollout.sample (the rollout) or rollout.score (learn:
score and update) raises torch.OutOfMemoryError, as CUDA's allocator does.
"""
import json
import math

import pytest
import torch

import rollout
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
    assert "the learn (score and update) ran out of memory" in err and "--micro-batch-rows 2 (now 4 rows per pass)" in err, err
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


def test_peaks_are_split_where_train_step_enters_learn(out, monkeypatch):
    """A fake allocator peak: 111 during the rollout, 222 during learn (reset_peak does nothing), so each
    phase's peak is the value at its end only if the split falls between rollout.sample and learn."""
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
    assert not [f for f in vars(train).values() if "calls_first" in getattr(f, "__qualname__", "")]  # put back


def test_over_the_limit_names_each_phase_over_it(out, capsys, monkeypatch):
    monkeypatch.setattr(preflight, "reset_peak", lambda device: None)
    values = iter([0.5e9, 3e9, 1e9])  # learn at full length, rollout, learn of the real step
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
    for x in r["runs"]:  # seconds per step are well under an hour: the last save only
        assert x["saves"] == math.floor(x["steps"] * x["seconds_per_step"] / 3600) + 1 == 1


def test_the_real_steps_success_and_mismatch_are_reported(out, capsys, monkeypatch):
    """success is the real step's fraction of rewarded responses, and on the CPU (float32 sampler and
    trainer) the mismatch is float32 rounding."""
    seen = []
    real = rollout.sample
    monkeypatch.setattr(rollout, "sample", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    r = preflight_run(out, "success")
    shown = capsys.readouterr().out
    assert 0 <= r["success"] <= 1 and r["success"] * 16 == pytest.approx(round(r["success"] * 16))
    assert r["mismatch_max_abs"] < 1e-4 and 0 <= r["mismatch_mean_abs"] <= r["mismatch_max_abs"]
    assert f"success {r['success']:.3f}" in shown and "sampler / trainer mismatch" in shown
    assert len(seen) == 1 and seen[0].response.shape[0] == 16


@pytest.mark.compile_path
def test_compiled_decoding_is_compiled_before_the_timed_step_and_projected_once_per_batch_size(out, capsys,
                                                                                              monkeypatch):
    """--compile-decode: the real step runs twice from the initial weights (the first, untimed, compiles
    the decode step), and the projection adds one compile per batch size (otb:2 and group_mean:4 at 4
    prompts: 8 and 16 rows), at the untimed rollout's seconds less the timed one's. The rollout's time
    is its decode steps x its seconds per decode step."""
    from lab import fast_decode
    monkeypatch.setattr(fast_decode, "BACKEND", "aot_eager")  # traced, not code-generated: seconds
    weights, real = [], fast_decode.sample  # the sampler of --compile-decode

    def sample(model, *a, **k):
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
        return real(model, *a, **k)
    monkeypatch.setattr(fast_decode, "sample", sample)
    r = preflight_run(out, "compiled", "--compile-decode", "--seeds", "0,1")
    assert len(weights) == 2 and torch.equal(weights[0], weights[1])  # the timed step starts where the first did
    assert r["compiles"] == 2 and r["seconds_compile"] >= 0
    steps_time = sum(x["runs"] * x["steps"] * x["seconds_per_step"] for x in r["runs"])
    assert r["projected_seconds"] == pytest.approx(steps_time + r["checkpoint_saves"] * r["seconds_checkpoint"]
                                                   + 2 * r["seconds_compile"])
    need = r["seeds_plan"]  # compiling is paid once, not per seed
    assert need["projected_seconds_needed"] == pytest.approx(2 * r["seconds_compile"]
                                                             + need["seeds_needed"] * need["seconds_per_seed"])
    assert r["seconds_per_decode_step"] * r["decode_steps"] == pytest.approx(r["seconds_rollout"])
    assert "2 compiles of the decode step, one per batch size" in capsys.readouterr().out
    plain = preflight_run(out, "plain")
    assert plain["compiles"] == 0 and "goal_hours" not in plain  # the goal is the GPU preset's


def test_the_gpu_presets_goal_is_printed_beside_the_projection(out, capsys):
    """--preset gpu on the tiny model and task: the preset's settings with a step that takes seconds."""
    r = preflight_run(out, "goal", "--preset", "gpu", "--model", "tiny", "--task", "reverse", "--device", "cpu",
                      "--temperature", "1.0")
    assert r["goal_hours"] == [("one H100", 1.0), ("a 24 GB card", 2.0)]
    assert f"goal for this preset (docs/training.md): 1 h on one H100, 2 h on a 24 GB card; projected here " \
           f"{r['projected_seconds'] / 3600:.2f} h" in capsys.readouterr().out
