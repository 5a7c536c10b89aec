"""Argument types the command lines share (``argparse`` ``type=``): a bad value is argparse's one ``error:`` line
naming the flag, exit 2, never a traceback from deep in the run."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1 (``-n 256``, ``--max-depth 32``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (``--seconds 2``, a price)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def positive_ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1 (``--depths 6,12,24``)."""
    try:
        return tuple(positive_int(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 like 6,12,24, got {text!r}") from None


def positive_floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers > 0 (``--slack 1,1.5,2``)."""
    try:
        return tuple(positive_float(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0 like 1,1.5,2, got {text!r}") from None
