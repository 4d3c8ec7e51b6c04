"""The GPU presets never fall back to the CPU silently, and the preflight's failures are one line.

--preset gpu and gpu_tool on a machine where --device auto finds no CUDA (no GPU, or a driver that
does not match the installed CUDA wheel) stop before anything is loaded or created: one line, exit
status 2. Given --device cpu explicitly, they run there (the tests of the preset do exactly that).
Where CUDA is available they sample with the compiled decoder; elsewhere with the plain loop.
"""

import pytest
import torch

import train
from lab import models
from lab import parse_options, train_cli


@pytest.mark.parametrize("preset", ["gpu", "gpu_tool"])
def test_a_gpu_preset_without_cuda_stops_with_one_line(preset, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loaded.append(a))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        train.main(["--preset", preset, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"--preset {preset} needs a CUDA GPU" in err and "--device cpu" in err, err
    assert not loaded and not out.exists()  # nothing loaded, nothing created


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_an_explicit_device_runs_the_preset_there(device, tmp_path, monkeypatch, capsys):
    """--device cpu: the model loads on the CPU, with a note; --device auto stops (the test above)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "load_model", lambda name, task, dev, **k: ("model", dev))
    cfg = parse_options.parse(["--preset", "gpu", "--device", device, "--out", str(tmp_path)], train.Config,
                          train_cli.PRESETS)
    if device == "auto":
        with pytest.raises(train_cli.UsageError, match="needs a CUDA GPU"):
            train_cli.load(cfg, torch.device("cpu"))
        return
    assert train_cli.load(cfg, torch.device("cpu")) == ("model", torch.device("cpu"))
    assert "note: --preset gpu is sized for one CUDA GPU" in capsys.readouterr().err


def test_the_gpu_preset_samples_with_the_compiled_decoder_where_cuda_is_available():
    """On CUDA the compiled decode step (one CUDA-graph replay a step) is the preset's; elsewhere, where the
    preset runs as a smoke check, the plain loop; --compile-decode false turns it off on a GPU."""
    parse = lambda *argv: parse_options.parse_config(list(argv), train.Config, train_cli.PRESETS)  # noqa: E731
    assert parse("--preset", "gpu").compile_decode == torch.cuda.is_available()
    assert parse("--preset", "gpu_tool").compile_decode == torch.cuda.is_available()
    assert parse("--preset", "gpu", "--compile-decode", "false").compile_decode is False
    assert parse("--preset", "gpu", "--compile-decode").compile_decode is True
