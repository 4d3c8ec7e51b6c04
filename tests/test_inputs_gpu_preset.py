"""The GPU presets never fall back to the CPU silently, and the preflight's failures are one line.

--preset gpu and gpu_tool on a machine where --device auto finds no CUDA (no GPU, or a driver that
does not match the installed CUDA wheel) stop before anything is loaded or created: one line, exit
status 2. Given --device cpu explicitly, they run there (the tests of the preset do exactly that).
On CUDA they sample with the compiled decoder; on any other device with the plain loop. On CUDA the
plain loop (any run without --compile-decode) samples with cuDNN's attention turned off.
"""

import pytest
import torch

import train
from lab import models
from lab import parse_options, options


@pytest.mark.parametrize("preset", ["gpu", "gpu_tool"])
def test_a_gpu_preset_without_cuda_stops_with_one_line(preset, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loaded.append(a))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        train.main(["--preset", preset, "--out", str(out)])
    printed = capsys.readouterr()
    err = printed.err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"--preset {preset} needs a CUDA GPU" in err and "--device cpu" in err, err
    assert printed.out == ""  # no plan announced (with an output folder) for a run that does not start
    assert not loaded and not out.exists()  # nothing loaded, nothing created


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_an_explicit_device_runs_the_preset_there(device, tmp_path, monkeypatch, capsys):
    """--device cpu: the model loads on the CPU, with a note; --device auto stops (the test above)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "load_model", lambda name, task, dev, **k: ("model", dev))
    cfg = parse_options.parse(["--preset", "gpu", "--device", device, "--out", str(tmp_path)], train.Config,
                          options.PRESETS)
    if device == "auto":
        with pytest.raises(options.UsageError, match="needs a CUDA GPU"):
            options.load(cfg, torch.device("cpu"))
        return
    assert options.load(cfg, torch.device("cpu")) == ("model", torch.device("cpu"))
    assert "note: --preset gpu is sized for one CUDA GPU" in capsys.readouterr().err


def test_the_gpu_preset_samples_with_the_compiled_decoder_on_cuda_only():
    """On CUDA the compiled decode step (one CUDA-graph replay a step) is the preset's; on any other
    device, where the preset runs as a smoke check, the plain loop; a given --compile-decode wins on both."""
    def on(device, *argv):
        cfg = parse_options.parse_config(list(argv), train.Config, options.PRESETS)
        return options.for_device(cfg, torch.device(device), parse_options.given_options(list(argv))).compile_decode
    for preset in ("gpu", "gpu_tool"):
        assert on("cuda", "--preset", preset) is True and on("cpu", "--preset", preset) is False
        assert on("mps", "--preset", preset) is False
    assert on("cuda", "--preset", "gpu", "--compile-decode", "false") is False
    assert on("cpu", "--preset", "gpu", "--compile-decode") is True
    assert on("cuda") is False and on("cuda", "--compile-decode") is True  # without a preset: off unless given


def test_a_gpu_preset_run_on_the_cpu_records_the_plain_loop(tmp_path, monkeypatch):
    """train.py --preset gpu --device cpu: the resolved option is the one the run uses and stores."""
    class Loaded(Exception):
        pass

    def load(cfg, device):  # where the model would load: the options as the run holds them
        seen.append(cfg)
        raise Loaded

    seen = []
    monkeypatch.setattr(parse_options, "load", load)
    with pytest.raises(Loaded):
        parse_options.start(["--preset", "gpu", "--device", "cpu", "--out", str(tmp_path)], train.Config)
    assert seen[0].compile_decode is False and seen[0].preset == "gpu"


@pytest.mark.parametrize("argv, device, cudnn_off", [
    (["--preset", "gpu"], "cuda", False),  # the compiled step: one cache length, cuDNN's attention kept
    (["--preset", "gpu", "--compile-decode", "false"], "cuda", True),  # the plain fallback
    (["--estimator", "otb"], "cuda", True),  # plain by default
    (["--estimator", "otb", "--compile-decode"], "cuda", False),
    (["--estimator", "otb"], "cpu", False),  # never on another device
    (["--preset", "gpu", "--device", "cpu"], "cpu", False)])
def test_the_plain_loop_on_cuda_samples_without_cudnn_attention(argv, device, cudnn_off, tmp_path, monkeypatch):
    """Where train.py sets up the run's device (parse_options.start): on CUDA without --compile-decode, cuDNN's
    scaled-dot-product attention is turned off (it plans anew for every new key/value length, and the
    plain loop's cache grows every token); otherwise the setting is not touched. A fake CUDA device: the
    run stops where the model would load, and torch's setter is replaced by a recorder."""
    class Loaded(Exception):
        pass

    def load(cfg, dev):
        raise Loaded
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    monkeypatch.setattr(parse_options, "pick_device", lambda name: torch.device(device))
    monkeypatch.setattr(parse_options, "load", load)
    with pytest.raises(Loaded):
        parse_options.start(argv + ["--out", str(tmp_path)], train.Config)
    assert calls == ([False] if cudnn_off else [])
    calls.clear()  # the function itself, as the preflight and a benchmark would call it
    cfg = parse_options.parse(argv, train.Config, options.PRESETS)
    options.plain_loop_attention(options.for_device(cfg, torch.device(device), parse_options.given_options(argv)),
                                 torch.device(device))
    assert calls == ([False] if cudnn_off else [])
