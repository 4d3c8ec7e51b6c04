"""Argument types shared by the benchmark scripts: a bad value stops argparse with one line
(`error: argument --steps: must be an integer >= 1, got '0'`, exit status 2) before anything
is run or written."""
import argparse


def at_least(low):
    """An int option that must be >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def int_list(low):
    """A comma-separated list of ints, each >= low; the text is returned unchanged."""
    def parse(text):
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {low}, got {text!r}")
        return text
    parse.__name__ = f"list of integers >= {low}"
    return parse


def device_option(text):
    """auto, cpu or cuda; cuda only where torch can see a CUDA device."""
    import torch
    if text not in ("auto", "cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be auto, cpu or cuda, got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"cuda is not available on this machine (torch {torch.__version__})")
    return text
