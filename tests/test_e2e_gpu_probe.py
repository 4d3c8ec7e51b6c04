"""benchmarks/gpu_probe.py end to end on the CPU, at a tiny shape: every part runs, and the JSON it writes
holds each key with a value of the right type and range.

The compile backend is aot_eager here (dynamo traces the whole decode step, as inductor's would be; the
code generation is left out, as in the other fast compile tests), so inductor's cache counters do not
move and each compile reads "none". With random weights the probe says so and skips the real model's
part; with a saved model folder (the tiny shape saved with save_pretrained, its stand-in tokenizer and
chat template) it measures that model's initial success, length and mismatch too.
"""
import json
import math

import pytest
import torch

from benchmarks import gpu_probe
from benchmarks.common import smollm2_shaped
from lab import fast_decode

pytestmark = pytest.mark.compile_path  # .ci/run: again under the lowest torch (conftest.py)

TINY = ["--device", "cpu", "--max-new-tokens", "8", "--rounds", "1", "--repeats", "1"]


@pytest.fixture
def traced(monkeypatch):
    """The decode step traced with aot_eager, and dynamo's caches empty, as in the fresh process the probe
    runs in (its first graph of the decode step is then no recompile)."""
    monkeypatch.setattr(fast_decode, "BACKEND", "aot_eager")
    monkeypatch.setattr(fast_decode, "_compiled", {})
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def read(out):
    files = list(out.glob("gpu_probe-*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def check(r, group_sizes, prompts_per_step):
    """The keys every probe writes, and their values' types and ranges."""
    assert r["device"] == "cpu" and r["machine"]["torch"] == torch.__version__ and r["machine"]["cuda"] is None
    assert r["command"].startswith("python benchmarks/gpu_probe.py") and r["seconds"] > 0
    assert r["hooks_on_embeddings"]["after_checkpointing"] == 0 == r["hooks_on_embeddings"]["at_the_end"]
    assert [c["rows"] for c in r["compile"]] == [prompts_per_step * g for g in group_sizes]
    for c in r["compile"]:
        assert c["cache"] == "none" and c["fx_cache_hits"] == 0 == c["fx_cache_misses"]  # aot_eager: no inductor
        assert c["graphs_added"] == 1 and c["cudagraph_skips"] == 0 and c["decode_steps"] == 8
        assert c["first_call_seconds"] > 0 and 0 <= c["compile_seconds"] <= c["first_call_seconds"]
        assert c["steady_ms_per_decode_step"] > 0 and len(c["steady_seconds"]) == 1
    assert [c["recompiles"] for c in r["compile"]] == [0] + [1] * (len(group_sizes) - 1)  # a new batch size
    alt = r["alternating"]
    assert [(s["round"], s["group_size"]) for s in alt["steps"]] == [(0, g) for g in group_sizes]
    assert (alt["graphs"], alt["recompiles"], alt["cudagraph_skips"]) == (0, 0, 0)  # every shape compiled in part 3
    for s in alt["steps"]:
        assert s["rows"] == prompts_per_step * s["group_size"] and 1 <= s["decode_steps"] <= 8
        assert s["seconds_rollout"] > 0 and s["seconds_learn"] > 0 and 0 <= s["success"] <= 1
        assert 0 < s["mean_response_length"] <= 8 and s["peak_bytes_rollout"] > 0 and s["peak_bytes_learn"] > 0
    assert r["dtypes_in_learn"] == dict(log_pi="torch.float32", sum_pi_sq="torch.float32", advantage="torch.float32")
    a = r["plain_vs_compiled"]
    assert a["rows"] == prompts_per_step * min(group_sizes) and a["positions"] == a["rows"] * 8
    assert 0 <= a["positions_equal"] <= a["positions"] and a["fraction_equal"] == a["positions_equal"] / a["positions"]
    assert 0 <= a["rows_identical"] <= a["rows"] and (a["rows_identical"] == a["rows"]) == (a["fraction_equal"] == 1)
    assert a["fraction_equal"] > 0.9  # float32 on a CPU: the same tokens up to rare rounding ties
    assert a["plain_ms_per_decode_step"] > 0 and a["compiled_ms_per_decode_step"] > 0


def test_the_probe_runs_end_to_end_on_random_weights_and_says_so(tmp_path, traced):
    r = gpu_probe.main(["--tiny", "--prompts-per-step", "2", "--group-sizes", "2,4", "--prompts", "8",
                        "--out", str(tmp_path), *TINY])
    assert read(tmp_path) == json.loads(json.dumps(r))  # what it returns is what it wrote
    check(r, [2, 4], 2)
    assert r["model"]["model"] == "random" and "random weights" in r["model"]["weights"]
    assert (r["model"]["hidden"], r["model"]["layers"], r["model"]["vocabulary"]) == (18, 1, 512)
    assert r["real_model"] is None and r["inductor_cache"] == "an empty folder (cold)"
    assert r["settings"]["autocast"] == "none (float32)" and r["settings"]["prompt_tokens"][0] > 30


def test_a_model_folder_gets_its_initial_success_length_and_mismatch(tmp_path, traced):
    tok = gpu_probe.stand_in_tokenizer(512)
    model = smollm2_shaped(18, 1, "cpu", vocab=512)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 2
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    r = gpu_probe.main(["--model", str(tmp_path / "model"), "--prompts-per-step", "4", "--group-sizes", "2",
                        "--prompts", "64", "--out", str(tmp_path / "out"), *TINY])
    check(read(tmp_path / "out"), [2], 4)
    m = r["real_model"]
    assert m["prompts"] == 64 and 0 <= m["successes"] <= 64 and m["success"] == m["successes"] / 64
    lo, hi = m["wilson_95"]
    assert 0 <= lo <= m["success"] <= hi <= 1 and hi - lo > 0
    assert 0 < m["mean_response_length"] <= 8 and m["recompiles"] == 0  # batches of the compiled 8 rows
    assert 0 <= m["mismatch_mean_abs"] <= m["mismatch_max_abs"] < 1e-4  # float32 sampler and trainer on a CPU
    assert r["model"]["path"] == str(tmp_path / "model") and not math.isnan(r["seconds"])


def test_the_stand_in_tokenizer_has_smollm2s_layout_where_the_count_task_looks():
    """Its special tokens at SmolLM2's ids, every digit, comma and space a token of its own, the count
    task's prompt in known words, and filler words that hold no digit."""
    import tasks
    tok = gpu_probe.stand_in_tokenizer(49152)
    assert len(tok) == 49152 and (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids, answers = tasks.prompt_batch(tasks.CountTask(), tok, 0, 0, 4)
    for row, answer in zip(ids, answers):
        assert tok.unk_token_id not in row and 35 <= len(row) <= 50
        text = tok.decode(row)
        a, b = answer.split(", ")[0], answer.split(", ")[-1]
        assert f"List the numbers from {a} to {b}, separated by commas." in text
        assert [tok.decode([i]) for i in tok(f" {b},", add_special_tokens=False)["input_ids"]] == [" ", *b, ","]
    fillers = tok.convert_ids_to_tokens(list(range(100, 49152, 97)))
    assert all(t.startswith(" q") and not any(c.isdigit() for c in t) for t in fillers)


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "100"], "--prompts: must be a multiple of the smallest batch size (8 prompts x N = 4: 32)"),
    (["--prompts", "32"], "--prompts: at least 64 for a success rate"),
    (["--group-sizes", "4,0"], "--group-sizes: must be comma-separated integers >= 1"),
    (["--rounds", "0"], "--rounds: must be an integer >= 1"),
    (["--tiny", "--model", "smollm2"], "--tiny: only with --model random"),
    (["--device", "tpu"], "--device: must be auto, cpu or cuda"),
    (["--prompts", "64"], "--device: auto found no CUDA GPU")])  # on a machine without one, as CI is
def test_a_bad_option_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        gpu_probe.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1], err


def test_help_explains_every_option(capsys):
    options = [a for a in gpu_probe.options_parser()._actions if a.dest != "help"]
    assert len(options) == 11 and all(a.help and len(a.help.split()) >= 5 for a in options)
    with pytest.raises(SystemExit):
        gpu_probe.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(a.option_strings[0] in shown and " ".join(a.help.split()[:4]) in shown for a in options)
