"""The variance sweep of a pretrained model (benchmarks/horizon_sweep.py --model ... --task count) at a
tiny shape on the CPU, and the projection it measures through (benchmarks/common.sketch).

The model is SmolLM2-135M's architecture (9 heads, 3 key-value heads, tied embeddings;
common.smollm2_shaped) at width 72 and 2 layers over the character tokenizer with a chat template,
warmed up on counting until some sampled lists are right (about 10 s), so that every estimator has
signal. The real model's command and its projected GPU time are in docs/variance.md.
"""
import json
import math
from datetime import datetime, timezone

import pytest
import torch

import rollout
import tasks
from benchmarks import common
from benchmarks import decomposition, horizon_sweep as hs
from benchmarks import sweep_records as records
from lab.analysis import compact
from lab.models import char_tokenizer, warm_up

CHAT = "{% for m in messages %}{{ m['content'] | lower }}{% endfor %}{% if add_generation_prompt %}={% endif %}"


def shaped_model():
    """SmolLM2's architecture at width 72, 2 layers, on the character tokenizer (random weights)."""
    tok = char_tokenizer()
    tok.chat_template = CHAT  # tasks.CountTask writes its prompt through the chat template
    model = common.smollm2_shaped(hidden=72, layers=2, vocab=len(tok))
    model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id = (
        tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    return model, tok


@pytest.fixture(scope="module")
def counting_model(tmp_path_factory):
    """A save_pretrained folder: the shaped model warmed up on counting 4 numbers to sampled success 0.3."""
    model, tok = shaped_model()
    task = tasks.CountTask(horizon=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        history = warm_up(model, tok, task, temperature=0.7, max_new=task.max_new_tokens(), max_steps=400,
                          target=0.3, seed=0, batch=32, n_eval=64, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert history and history[-1][1] >= 0.3, f"the warm-up must reach success 0.3: {history[-3:]}"
    folder = tmp_path_factory.mktemp("counting_model")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def sampled_gradients(model, tok, rows=6):
    """Full gradients (rows, D) of the shaped model: grad of sum_t A_i log pi(y_t^i), a random A_i per row."""
    task = tasks.CountTask(horizon=3)
    prompts, _ = tasks.prompt_batch(task, tok, 0, 0, 2)
    ro = rollout.sample(model, prompts, group_size=rows // 2, max_new_tokens=8, temperature=1.0,
                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    A = torch.randn(rows, 1, generator=torch.Generator().manual_seed(1)) * ro.response_mask  # (B, T)
    return torch.stack([common.weighted_score_gradient(model, ro, [i], A, 1.0) for i in range(rows)]).double()


def test_sketch_keeps_inner_products_in_expectation():
    """Over the draw of P (300 seeds, k = 8: a large error per draw, so the test sees it), the mean of
    <P a, P b> is <a, b> within 4 standard errors, for the real gradients of the shaped model, and so
    are tr Var and the squared norm of the mean of those gradients (what nvar is made of). The standard
    errors are below 6% of the values: a projection off by a factor, or one that kept only its own
    terms in some other proportion, fails. Each coordinate lands in one bucket with sign +-1, and P is
    linear: both checked exactly."""
    model, tok = shaped_model()
    G = sampled_gradients(model, tok)  # (6, D), full
    D, k = G.shape[1], 8
    full = dict(gram=G @ G.T, tr_var=((G - G.mean(0)) ** 2).sum() / (len(G) - 1), mean_sq=(G.mean(0) ** 2).sum())
    draws = {key: [] for key in full}
    params = [p for p in model.parameters()]
    shapes = [p.shape for p in params]

    def as_grads(v):  # a (D,) vector as the per-parameter gradients project() takes
        out, i = [], 0
        for s in shapes:
            out.append(v[i:i + math.prod(s)].view(s))
            i += math.prod(s)
        return out
    for seed in range(300):
        project = common.sketch(model, k, seed)
        PG = torch.stack([project(as_grads(g.float())) for g in G]).double()  # (6, k)
        draws["gram"].append(PG @ PG.T)
        draws["tr_var"].append(((PG - PG.mean(0)) ** 2).sum() / (len(PG) - 1))
        draws["mean_sq"].append((PG.mean(0) ** 2).sum())
    for key, value in full.items():
        d = torch.stack(draws[key])  # (300, ...)
        mean, se = d.mean(0), d.std(0) / math.sqrt(len(d))
        assert ((mean - value).abs() <= 4 * se).all(), (key, mean, value, se)
        if key != "gram":
            assert se < 0.06 * value, (key, se, value)  # tight enough to catch a wrong scale
    project = common.sketch(model, k, 0)
    e = torch.zeros(D)
    e[D // 3] = 2.5
    assert project(as_grads(e)).abs().tolist().count(2.5) == 1 and project(as_grads(e)).abs().sum() == 2.5
    a, b = G[0].float(), G[1].float()
    assert torch.allclose(project(as_grads(a + 3 * b)), project(as_grads(a)) + 3 * project(as_grads(b)), atol=1e-5)


def sweep(folder, out, project, replicates=200, resume=False):
    hs.main(["--resume"] * resume + ["--model", str(folder), "--task", "count", "--horizons", "2,4", "--seeds", "0", "--prompts", "4",
             "--pool", "8", "--ref-pool", "8", "--group-sizes", "2,4", "--estimators", "reinforce,group_mean,rloo,otb",
             "--project", str(project), "--sample-prompts", "2", "--device", "cpu", "--replicates", str(replicates),
             "--out", str(out)])
    return json.loads((out / "results.json").read_text())


def test_count_sweep_on_a_smollm2_shaped_model_projected_and_exact(counting_model, tmp_path):
    """The sweep runs end to end at 2 horizons with the gradients projected to k = 1024 and exact (the same
    sampled pools: the projection draws nothing from the sampler's generators). Checked: every gain of the
    table; rloo's gain over the group mean is 1 (RLOO is the group mean times N / (N - 1) sample by sample,
    and a projection is linear); the projected per-prompt tr Var and the Gram matrices agree with the exact
    ones within the sketch's own error (5 x sqrt(2 / k) relative, per estimator and N, summed over prompts);
    (stats.npz keeps gram only where the analysis reads it: lab/analysis/compact.py);
    the projected GPU time is its own formula of the counts it returns; --from-saved rewrites table.md
    byte for byte."""
    k = 1024
    projected = sweep(counting_model, tmp_path / "projected", k)
    exact = sweep(counting_model, tmp_path / "exact", 0)
    assert {c["n"] for c in projected["checkpoints"]} == {2, 4}
    assert [c["success"] for c in projected["checkpoints"]] == [c["success"] for c in exact["checkpoints"]]
    assert all(0 < c["success"] < 1 for c in projected["checkpoints"])  # signal, and not solved
    cells = {(g["estimator"], g["N"], g["n"]) for g in projected["gains"] if "gain" in g}
    assert cells == {(e, N, n) for e in ("reinforce", "rloo", "otb") for N in (2, 4) for n in (2, 4)}
    for g in projected["gains"]:
        if g["estimator"] == "rloo":
            assert g["gain"][0] == pytest.approx(1.0, rel=1e-6)
    P, E = records.load_grams(tmp_path / "projected" / "stats.npz"), records.load_grams(tmp_path / "exact" / "stats.npz")
    tol = 5 * math.sqrt(2 / k)
    for cell, by_estimator in E.items():
        for key, s in by_estimator.items():
            p = P[cell][key]
            assert p["V"].sum().item() == pytest.approx(s["V"].sum().item(), rel=tol), (cell, key)
            for m in ("gram", "ref_gram") if compact.needs_signal(key[0]) else ("ref_gram",):
                scale = torch.diagonal(s[m]).sum().item()  # differences relative to the norms involved
                assert (p[m] - s[m]).abs().max().item() <= tol * scale, (cell, key, m)
    g = projected["args"]["gpu_projection"]
    assert g["seconds"] == pytest.approx([g["decode_steps"] * t + g["passes"] * g["pass_launches"] * t
                                          + g["flops"] / g["flops_per_second"] for t in g["decode_seconds"]])
    assert g["passes"] == 2 * 4 * (8 + 4 + 1 * (8 // 2 + 8 // 4))  # horizons x prompts x (M + 4 + otb's groups)
    assert "gpu_projection" not in exact["args"] or exact["args"]["gpu_projection"]["passes"] == g["passes"]
    table = (tmp_path / "projected" / "table.md").read_text()
    assert "gradients projected to k = 1024" in table
    hs.main(["--from-saved", str(tmp_path / "projected"), "--out", str(tmp_path / "again"), "--replicates", "200"])
    assert (tmp_path / "again" / "table.md").read_text() == table


def test_a_sweep_stopped_and_resumed_saves_what_a_run_straight_through_saves(counting_model, tmp_path, monkeypatch):
    """Stopped twice (after 2 recorded prompts, inside the first cell, and after 3 more, inside the second),
    each time resumed with --resume, the sweep saves the same stats.npz, bit for bit, and the same pool
    success and lengths as a run straight through: the resumed run reads its recorded prompts back and
    draws the same pools, groups and projection for the rest. While it is stopped, --from-saved analyses
    the prompts recorded so far, and a new run into the same folder without --resume is refused."""
    straight = sweep(counting_model, tmp_path / "straight", 64)
    real_save, budget = records.save_prompt, {"left": 2}

    def save_then_stop(*args, **kwargs):
        real_save(*args, **kwargs)
        budget["left"] -= 1
        if budget["left"] == 0:
            raise KeyboardInterrupt  # a stop right after a prompt is recorded
    monkeypatch.setattr(hs, "save_prompt", save_then_stop)
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        sweep(counting_model, out, 64)
    assert not (out / "results.json").exists() and len(list(out.glob("prompts/n2_seed0/p*.npz"))) == 2
    hs.main(["--from-saved", str(out), "--out", str(tmp_path / "interim"), "--replicates", "200"])
    interim = json.loads((tmp_path / "interim" / "results.json").read_text())
    assert [(c["n"], c["prompts"], c["partial"]) for c in interim["checkpoints"]] == [(2, 2, True)]
    assert records.load_grams(tmp_path / "interim" / "stats.npz")[(2, 0)][("otb", 2)]["V"].shape == (2,)
    with pytest.raises(SystemExit):
        sweep(counting_model, out, 64)  # without --resume: refused, nothing recorded is lost
    assert len(list(out.glob("prompts/n2_seed0/p*.npz"))) == 2
    budget["left"] = 3
    with pytest.raises(KeyboardInterrupt):
        sweep(counting_model, out, 64, resume=True)
    assert [c["n"] for c in json.loads((out / "results.json").read_text())["checkpoints"]] == [2]
    budget["left"] = -1
    resumed = sweep(counting_model, out, 64, resume=True)
    assert not (out / "prompts").exists() and not (out / "sweep.json").exists()
    got, want = records.load_grams(out / "stats.npz"), records.load_grams(tmp_path / "straight" / "stats.npz")
    assert got.keys() == want.keys() == {(2, 0), (4, 0)}
    for cell in want:
        for key, stats in want[cell].items():
            for name, value in stats.items():
                assert torch.equal(got[cell][key][name], value), (cell, key, name)
    for c, d in zip(resumed["checkpoints"], straight["checkpoints"]):
        assert (c["n"], c["success"], c["ref_success"], c["mean_length"]) == (
            d["n"], d["success"], d["ref_success"], d["mean_length"])


def test_the_gpu_window_command_runs_end_to_end_at_a_tiny_shape(counting_model, tmp_path):
    """benchmarks/gpu_variance.py, the one command of a GPU window, on the CPU at the tiny shape: train.py's
    gpu preset (its preflight, then 2 steps of each configuration), the weights' success before RL (Wilson's
    interval around it) and the sweep with the decomposition's estimators, each part written to
    gpu_variance.json as it ends. With room in its budget the sweep finishes (results.json, summary.md);
    stopped after its first prompt (--stop-after passed through to the sweep), it keeps that prompt
    recorded, says so, and --resume finishes it with the stats.npz of the run straight through."""
    from benchmarks import gpu_variance as gv
    tiny = ["--model", str(counting_model), "--device", "cpu", "--horizons", "2,4", "--success-horizon", "4",
            "--success-prompts", "8", "--prompts", "4", "--budget", "900"]
    sweep_args = ["--pool", "8", "--ref-pool", "8", "--group-sizes", "2,4", "--project", "64", "--sample-prompts",
                  "2", "--replicates", "200"]
    # --train-seconds as long as the budget: a loaded CI machine must not stop the smoke by its clock
    record = gv.main(tiny + ["--train-steps", "2", "--train-seconds", "900", "--train-args", "--horizon 4",
                             "--out", str(tmp_path / "full"), "--"] + sweep_args)
    parts = json.loads((tmp_path / "full" / "gpu_variance.json").read_text())["parts"]
    assert list(parts) == ["train", "load", "success", "sweep"] and record["decode"] == "plain"  # compiled on a GPU only
    train = parts["train"]  # the gpu preset's preflight, then 2 steps of each of its configurations
    assert train["preflight"]["exit_code"] == 0 and "--preset gpu" in train["preflight"]["command"]
    assert train["steps"]["exit_code"] == 0 and train["steps"]["last_step"] == {"otb:4": 2, "group_mean:4": 2,
                                                                                "group_mean:16": 2}
    assert parts["sweep"]["arguments"][parts["sweep"]["arguments"].index("--estimators") + 1] == gv.ESTIMATORS
    assert abs(datetime.now(timezone.utc) - datetime.fromisoformat(record["started"])).total_seconds() < 3600
    s = parts["success"]
    assert s["prompts"] == 8 and s["success"] == s["successes"] / 8 and s["wilson_95"][0] <= s["success"] <= s["wilson_95"][1]
    assert parts["sweep"]["finished"] and [c[0] for c in parts["sweep"]["cells_finished"]] == [2, 4]
    assert (tmp_path / "full" / "sweep" / "summary.md").is_file()
    hs.LOADED.clear()
    gv.main(tiny + ["--train-steps", "0", "--out", str(tmp_path / "stopped"), "--"] + sweep_args
            + ["--stop-after", "0.001"])
    parts = json.loads((tmp_path / "stopped" / "gpu_variance.json").read_text())["parts"]
    assert not parts["sweep"]["finished"] and parts["sweep"]["prompts_recorded_in_unfinished_cells"] == {"n2_seed0": 1}
    hs.LOADED.clear()
    arguments = parts["sweep"]["arguments"]
    limits = [i for i, a in enumerate(arguments) if a == "--stop-after"]
    hs.main([a for i, a in enumerate(arguments) if not any(i in (j, j + 1) for j in limits)] + ["--resume"])
    got, want = (records.load_grams(tmp_path / x / "sweep" / "stats.npz") for x in ("stopped", "full"))
    assert all(torch.equal(got[c][k][m], want[c][k][m]) for c in want for k in want[c] for m in want[c][k])


def test_the_sweep_cost_benchmark_and_the_projection_it_replaced(counting_model, tmp_path):
    """benchmarks/bench_sweep_cost.py at the tiny shape: every part timed, its FLOPs counted as run, the
    one-prompt total the sum of the sweep's parts; and the projection computed as a gather through the
    permutation (as before) is the scatter-add's P: the same numbers up to float32 rounding."""
    from benchmarks import bench_sweep_cost as bc
    result = bc.main(["--model", str(counting_model), "--horizon", "4", "--pool", "8", "--project", "64",
                      "--repeats", "1", "--out", str(tmp_path)])
    parts = result["parts"]
    assert set(parts) == {"reference", "score", "scores_S", "otb_N4", "plain", "project", "project_gather"}  # N = 16 > M / 2
    sweep = ("reference", "score", "scores_S", "otb_N4")
    assert result["one_prompt_without_sampling"]["gflop"] == pytest.approx(sum(parts[p]["gflop"] for p in sweep))
    assert parts["plain"]["of_plain"] == pytest.approx(1.0) and (tmp_path / "bench_sweep_cost.md").is_file()
    model, tok = shaped_model()
    grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) for i, p in enumerate(model.parameters())]
    for k in (8, 100):
        a, b = common.sketch(model, k)(grads), bc.gather_projection(model, k)(grads)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item()), k


DECOMPOSITION = "reinforce,group_mean,rloo,otb,otb_loo,otb_zero_tail,opo,opo_loo,seq_proxy,seq_proxy_loo,seq_exact,seq_exact_loo"


def test_the_decomposition_estimators_on_the_same_responses(counting_model, tmp_path):
    """Every estimator of docs/smollm2_decomposition_protocol.md in one sweep at a tiny shape, gradients exact
    (--project 0): the sequence-level ones go through the S_i (no backward pass of their own), the token-level
    ones share each group's forward pass. Checked: every estimator has a gain; the known factors hold where
    they are exact (rloo's gain is 1); the saved per-response numbers are those of the pool (||S_i||^2 of the
    exact S_i, the length, W_T recomputed from a fresh scoring pass); the lesson group has exactly one success
    and each token's advantage is the estimator's on that group."""
    out = tmp_path / "decomposition"
    hs.main(["--model", str(counting_model), "--task", "count", "--horizons", "4", "--seeds", "0", "--prompts", "4",
             "--pool", "8", "--ref-pool", "8", "--group-sizes", "4", "--estimators", DECOMPOSITION, "--project", "0",
             "--sample-prompts", "2", "--device", "cpu", "--replicates", "200", "--out", str(out)])
    result = json.loads((out / "results.json").read_text())
    gains = {g["estimator"]: g for g in result["gains"] if "gain" in g}
    assert set(gains) == set(DECOMPOSITION.split(",")) - {"group_mean"}
    assert gains["rloo"]["gain"][0] == pytest.approx(1.0, rel=1e-6)
    responses = records.read_responses(out)[(4, 0)]
    assert responses["S_sq"].shape == responses["length"].shape == responses["W_T"].shape == (4, 8)
    assert torch.allclose(responses["PS_sq"], responses["S_sq"], rtol=1e-4)  # no projection: the same norm
    assert (responses["S_sq"] > 0).all() and (responses["W_T"] > 0).all()
    assert sorted(responses["perm"][0].long().tolist()) == list(range(8))
    assert responses["R"].shape == (4, 8) and set(responses["R"].unique().tolist()) <= {0.0, 1.0}
    timing = {k for k in responses if k.startswith("timing.")}
    assert {"timing.N4/backward/otb", "timing.N4/backward/otb_loo", "timing.N4/backward/otb_zero_tail"} <= timing
    assert not any(k.startswith("timing.N4/backward/seq") or k.startswith("timing.N4/backward/opo") for k in timing)
    lesson = out / "lesson_n4_seed0.json"
    if lesson.is_file():
        saved = json.loads(lesson.read_text())
        assert sum(row["reward"] == 1 for row in saved["rows"]) == 1 and len(saved["rows"]) == 4
        for row in saved["rows"]:
            assert set(row["advantages"]) == {"group_mean", "otb", "otb_loo"}
            assert all(len(a) == len(row["tokens"]) for a in row["advantages"].values())
            assert len(set(row["advantages"]["group_mean"])) == 1  # one number per response
    else:  # no N = 4 group with exactly one success in this pool
        perm = responses["perm"].long()
        assert all(int(sum(responses["R"][p][perm[p][g * 4:(g + 1) * 4]].tolist())) != 1
                   for p in range(4) for g in range(2))
    report = json.loads((out / "decomposition.json").read_text())
    primary = [c for c in report["contrasts"] if c["role"] == "primary"]
    assert [(c["a"], c["b"], c["N"]) for c in primary] == [("otb_loo", "otb", 4)]
    assert sum(c["role"] == "secondary" and c["tested"] for c in report["contrasts"]) == 5
    assert "## The primary question, n = 4, N = 4" in (out / "decomposition.md").read_text()
    d = report["descriptive"]["n4_seed0"]
    assert d["responses"] == 32 and -1 <= d["proxy_vs_exact"]["spearman"] <= 1
    again = decomposition.main(["--from-saved", str(out), "--out", str(tmp_path / "again"), "--replicates", "200",
                                "--replay-of", str(out)])  # the same responses: tr Var equal
    assert all(v["max_relative_difference"] == 0 for by in again["replay"].values() for v in by.values())
    hs.main(["--from-saved", str(out), "--out", str(tmp_path / "elsewhere"), "--replicates", "200"])
    assert (tmp_path / "elsewhere" / "decomposition.md").is_file()  # the responses travel with the statistics
    assert torch.equal(records.read_responses(tmp_path / "elsewhere")[(4, 0)]["S_sq"], responses["S_sq"])
