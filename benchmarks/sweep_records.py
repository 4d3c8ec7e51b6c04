"""What a variance sweep saves, and how it reads it back: a long sweep survives a stop.

benchmarks/horizon_sweep.py measures cell by cell ((n, seed): one checkpoint, --prompts prompts). What it
writes into its folder OUT:

- ``OUT/prompts/nN_seedS/pNNNN.npz``: one prompt's statistics as soon as the prompt is measured
  (``save_prompt``: per (estimator, N) the mean group gradient, its tr Var and the number of groups; the
  reference gradient; the rewards; the mean length), written to a temporary file and then renamed;
- ``OUT/sweep.json``: the run's record while it is unfinished (``progress_file``), rewritten after every
  prompt: what ``--resume`` checks its settings against and continues;
- ``OUT/stats.npz``: every finished cell's sufficient statistics (``save_grams``, the compact form of
  lab/analysis/compact.py); a cell's prompt records are removed once it is there;
- ``OUT/results.json``: the finished run's record, the analysis beside it.

``read_saved`` gives a saved sweep's record and cells, finished and still measuring, for ``--from-saved``;
``resumed`` what an earlier run of the same settings had finished, for ``--resume``.
"""
import json
from pathlib import Path

import numpy as np
import torch

from lab.analysis import compact, scale_free
from lab.machine import kept_provenance


def cell_of(name):
    """A cell's folder or key name, 'n30_seed0', as (n, seed): (30, 0)."""
    n, seed = name[1:].split("_seed")
    return int(n), int(seed)


def record_path(records, p):
    """The file of prompt p's statistics in a cell's folder of records."""
    return Path(records) / f"p{p:04d}.npz"


def save_prompt(path, units, ref, R, R_ref, length, seconds, responses=None, timing=None):
    """One prompt's statistics, all that the analysis needs of it: per (estimator, N) its mean group
    gradient m_p, tr Var V_p and the number of groups K; its reference gradient r_p; the rewards of its
    pool and of its reference pool; the pool's mean response length and the seconds it took. The vectors
    m_p and r_p are stored as compact.scaled stores numbers, divided by their largest entry and rounded to
    float16 (within 2^-11 of it; a run straight through reads them back the same way, so a resumed run
    gives the same statistics); m_p only where the analysis reads it (compact.needs_signal: not for an
    estimator whose E g is known, whose signal comes from the references). ``responses``: {name: (M,)
    tensor} of per-response numbers of the pool, kept as they are (float64); ``timing``: {phase: seconds}. Written to a temporary file and then renamed, so a
    stop while writing leaves no half-written record."""
    arrays = {}
    for (e, N), (mean, var, K) in units.items():
        if compact.needs_signal(e):  # an estimator whose E g is known: the analysis never reads its m_p
            arrays[f"{e}/N{N}/mean"], arrays[f"{e}/N{N}/mean.scale"] = compact.scaled(mean)
        arrays[f"{e}/N{N}/var"], arrays[f"{e}/N{N}/K"] = np.float64(var), np.int64(K)
    arrays["ref"], arrays["ref.scale"] = compact.scaled(ref)
    arrays.update({f"response.{k}": torch.as_tensor(v).numpy() for k, v in (responses or {}).items()})
    if timing is not None:
        arrays["timing"] = np.array(json.dumps(timing))
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, R=R.numpy(), R_ref=R_ref.numpy(), length=np.float64(length), seconds=np.float64(seconds), **arrays)
    tmp.replace(path)


def load_prompt(path):
    """The inverse of save_prompt: dict(units={(e, N): (mean or None, var, K)}, ref, R, R_ref, length, seconds,
    responses={name: (M,)}, timing={phase: seconds}), the vectors in float32 (a record written without scales
    holds them in float32 as they are; one written without responses or timing has them empty)."""
    with np.load(path) as data:
        def vector(key):
            if key + ".scale" not in data.files:
                return torch.from_numpy(data[key])
            return compact.unscaled(data[key], data[key + ".scale"]).float()
        out = dict(units={}, ref=vector("ref"), **{k: torch.from_numpy(data[k]) for k in ("R", "R_ref")},
                   length=float(data["length"]), seconds=float(data["seconds"]),
                   responses={k[len("response."):]: torch.from_numpy(data[k]) for k in data.files
                              if k.startswith("response.")},
                   timing=json.loads(str(data["timing"])) if "timing" in data.files else {})
        for key in data.files:
            if key.count("/") == 2 and not key.endswith(".scale"):
                e, N, k = key.split("/")
                out["units"].setdefault((e, int(N[1:])), {})[k] = vector(key) if k == "mean" else data[key]
    out["units"] = {key: (u.get("mean"), float(u["var"]), int(u["K"])) for key, u in out["units"].items()}
    return out


def responses_path(out):
    """Where a sweep keeps its finished cells' per-response numbers (``save_responses``)."""
    return Path(out) / "responses.npz"


def save_responses(out, cell, done):
    """Add cell (n, seed)'s per-response numbers, stacked over its recorded prompts ``done`` (load_prompt's),
    to OUT/responses.npz (``write_responses``); nothing for records without them."""
    if done and done[0]["responses"]:
        write_responses(out, {cell: stacked(done)})


def stacked(done):
    """{name: (P, M)} of recorded prompts: their per-response numbers, the rewards ('R'), the seconds of each
    prompt ('seconds') and of each of its phases ('timing.<phase>', nan where a prompt has not that phase)."""
    cell = {name: torch.stack([d["responses"][name] for d in done]) for name in done[0]["responses"]}
    cell["R"] = torch.stack([d["R"] for d in done]).double()
    cell["seconds"] = torch.tensor([d["seconds"] for d in done], dtype=torch.float64)
    for phase in done[0]["timing"]:
        cell[f"timing.{phase}"] = torch.tensor([d["timing"].get(phase, float("nan")) for d in done], dtype=torch.float64)
    return cell


def write_responses(out, cells):
    """Add {(n, seed): {name: tensor}} to OUT/responses.npz (keys 'n30_seed0/S_sq' and so on), written to a
    temporary file and renamed."""
    path = responses_path(out)
    arrays = dict(np.load(path)) if path.is_file() else {}
    for (n, seed), cell in cells.items():
        arrays.update({f"n{n}_seed{seed}/{name}": torch.as_tensor(v).numpy() for name, v in cell.items()})
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def read_responses(out):
    """Every cell's per-response numbers: the finished cells' from responses.npz, an unfinished cell's from
    its prompt records. {(n, seed): {name: (P, M) tensor}}."""
    cells = {}
    if responses_path(out).is_file():
        with np.load(responses_path(out)) as data:
            for k in data.files:
                cell, name = k.split("/", 1)
                n, seed = cell_of(cell)
                cells.setdefault((n, seed), {})[name] = torch.from_numpy(data[k])
    for folder in sorted((Path(out) / "prompts").glob("n*_seed*")):
        n, seed = cell_of(folder.name)
        done = [load_prompt(f) for f in sorted(folder.glob("p[0-9][0-9][0-9][0-9].npz"))]
        if (n, seed) not in cells and done and done[0]["responses"]:
            cells[(n, seed)] = stacked(done)
    return cells


def save_lesson(path, tok, sub, groups, adv, R, p, n, seed, show=("group_mean", "otb", "otb_loo")):
    """The first of the (K, 4) ``groups`` with exactly one success (R = 1), as JSON: per response its tokens
    (as the tokenizer decodes each), its reward and each token's advantage under the estimators ``show``
    (those in ``adv``); nothing is written when no group has exactly one success."""
    lone = [g for g in groups.tolist() if sum(R[i].item() == 1 for i in g) == 1]
    if not lone:
        return
    rows = []
    for i in lone[0]:
        valid = sub.response_mask[i] > 0
        ids = sub.response[i][valid].tolist()
        rows.append(dict(tokens=[tok.decode([t]) for t in ids], reward=R[i].item(),
                         advantages={e: adv[e][i][valid].tolist() for e in show if e in adv}))
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(n=n, seed=seed, prompt=p, rows=rows), indent=1))
    tmp.replace(path)


def grams_of(done):
    """{(estimator, N): scale_free.gram_stats} over the recorded prompts ``done`` (load_prompt's, in order)."""
    refs = torch.stack([d["ref"] for d in done]).float()  # r_p, (P, D)

    def means(key):  # m_p, (P, D); zeros where not recorded (never read: compact.needs_signal)
        return torch.stack([torch.zeros_like(d["ref"]) if d["units"][key][0] is None else d["units"][key][0]
                            for d in done])
    return {key: scale_free.gram_stats(means(key), [d["units"][key][1] for d in done], refs) for key in done[0]["units"]}


def info_of(done):
    """A cell's pool success, reference-pool success and mean response length over its recorded prompts."""
    return dict(success=torch.cat([d["R"] for d in done]).mean().item(),
                ref_success=torch.cat([d["R_ref"] for d in done]).mean().item(),
                mean_length=sum(d["length"] for d in done) / len(done))


def recorded_cells(out, finished=()):
    """The cells of ``out`` with prompts recorded but not yet in stats.npz (a sweep stopped mid-cell):
    {(n, seed): [load_prompt records, in prompt order]}, those with at least 2 prompts."""
    cells = {}
    for folder in sorted((Path(out) / "prompts").glob("n*_seed*")):
        n, seed = cell_of(folder.name)
        done = [load_prompt(f) for f in sorted(folder.glob("p[0-9][0-9][0-9][0-9].npz"))]
        if (n, seed) not in finished and len(done) >= 2:
            cells[(n, seed)] = done
    return cells


def save_grams(path, grams_by_cell):
    """{(n, seed): {(estimator, N): gram_stats}} -> one .npz in the compact form of lab/analysis/compact.py
    (only what the analysis reads; matrices in scaled float16)."""
    compact.save(path, grams_by_cell)


def load_grams(path):
    """The inverse of save_grams; a file saved in the full float64 format is read as it is."""
    with np.load(path) as data:
        full = "format" not in data.files
    return compact.load_full(path) if full else compact.load(path)


SAME = ("prompts", "pool", "ref_pool", "group_sizes", "warmup_target", "task", "estimators", "model", "project",
        "temperature")  # cells that mix


def settings(saved, estimators):
    """The settings of a saved sweep that its cells share with any cell analysed beside them."""
    args = {"task": "periodic", "estimators": estimators, "model": "tiny", "project": 0, "temperature": 1.0,
            **saved["args"]}  # older sweeps
    return {k: args[k] for k in SAME}


def progress_file(out):
    """An unfinished sweep's record: results.json's fields (command, args, machine, provenance, seconds,
    the finished cells' checkpoints), rewritten after every prompt; removed when the sweep is done."""
    return Path(out) / "sweep.json"


def read_record(folder):
    """A saved sweep's record: sweep.json while it is unfinished, else results.json."""
    folder = Path(folder)
    path = progress_file(folder) if progress_file(folder).is_file() else folder / "results.json"
    return json.loads(path.read_text())


def read_saved(folder):
    """A saved sweep: its record (sweep.json while it is unfinished, else results.json) and its cells, the
    finished ones of stats.npz and every unfinished one with at least 2 prompts recorded (``recorded_cells``;
    their checkpoints say ``prompts`` and ``partial``)."""
    folder = Path(folder)
    saved = read_record(folder)
    grams = load_grams(folder / "stats.npz") if (folder / "stats.npz").is_file() else {}
    for (n, seed), done in recorded_cells(folder, grams).items():
        grams[(n, seed)] = grams_of(done)
        saved["checkpoints"] = saved["checkpoints"] + [dict(n=n, seed=seed, model=saved["args"].get("model", "tiny"),
                                                            prompts=len(done), partial=True, **info_of(done))]
    return saved, grams


def resumed(out, args):
    """What an earlier run saved in ``out``: its finished cells (stats.npz), their checkpoints, the seconds
    it measured for and the code it ran under (a list of provenances). Its prompts recorded in unfinished
    cells stay where they are: measure_checkpoint reads them back."""
    saved = read_record(out)
    if settings(saved, args.estimators) != {k: getattr(args, k) for k in SAME}:
        raise SystemExit(f"--resume: {out} was measured with other settings "
                         f"({settings(saved, args.estimators)}); use another --out")
    grams = load_grams(out / "stats.npz") if (out / "stats.npz").is_file() else {}
    earlier = kept_provenance(saved)
    return grams, saved["checkpoints"], saved["seconds"], earlier if isinstance(earlier, list) else [earlier]
