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


def record_path(records, p):
    """The file of prompt p's statistics in a cell's folder of records."""
    return Path(records) / f"p{p:04d}.npz"


def save_prompt(path, units, ref, R, R_ref, length, seconds):
    """One prompt's statistics, all that the analysis needs of it: per (estimator, N) its mean group
    gradient m_p, tr Var V_p and the number of groups K; its reference gradient r_p; the rewards of its
    pool and of its reference pool; the pool's mean response length and the seconds it took. The vectors
    m_p and r_p are stored as compact.scaled stores numbers, divided by their largest entry and rounded to
    float16 (within 2^-11 of it; a run straight through reads them back the same way, so a resumed run
    gives the same statistics). Written to a temporary file and then renamed, so a stop while
    writing leaves no half-written record."""
    arrays = {}
    for (e, N), (mean, var, K) in units.items():
        arrays[f"{e}/N{N}/mean"], arrays[f"{e}/N{N}/mean.scale"] = compact.scaled(mean)
        arrays[f"{e}/N{N}/var"], arrays[f"{e}/N{N}/K"] = np.float64(var), np.int64(K)
    arrays["ref"], arrays["ref.scale"] = compact.scaled(ref)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, R=R.numpy(), R_ref=R_ref.numpy(), length=np.float64(length), seconds=np.float64(seconds), **arrays)
    tmp.replace(path)


def load_prompt(path):
    """The inverse of save_prompt: dict(units={(e, N): (mean, var, K)}, ref, R, R_ref, length, seconds), the
    vectors in float32 (a record written without scales holds them in float32 as they are)."""
    with np.load(path) as data:
        def vector(key):
            if key + ".scale" not in data.files:
                return torch.from_numpy(data[key])
            return compact.unscaled(data[key], data[key + ".scale"]).float()
        out = dict(units={}, ref=vector("ref"), **{k: torch.from_numpy(data[k]) for k in ("R", "R_ref")},
                   length=float(data["length"]), seconds=float(data["seconds"]))
        for key in data.files:
            if key.count("/") == 2 and not key.endswith(".scale"):
                e, N, k = key.split("/")
                out["units"].setdefault((e, int(N[1:])), {})[k] = vector(key) if k == "mean" else data[key]
    out["units"] = {key: (u["mean"], float(u["var"]), int(u["K"])) for key, u in out["units"].items()}
    return out


def grams_of(done):
    """{(estimator, N): scale_free.gram_stats} over the recorded prompts ``done`` (load_prompt's, in order)."""
    refs = torch.stack([d["ref"] for d in done]).float()  # r_p, (P, D)
    return {key: scale_free.gram_stats(torch.stack([d["units"][key][0] for d in done]),
                                       [d["units"][key][1] for d in done], refs)
            for key in done[0]["units"]}


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
        n, seed = (int(x) for x in folder.name[1:].split("_seed"))
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
