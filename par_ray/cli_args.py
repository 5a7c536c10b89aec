"""What the command lines share: argument types (``argparse`` ``type=``: a bad value is argparse's one ``error:``
line naming the flag, exit 2, never a traceback from deep in the run), and :func:`exit_with`, their ``sys.exit``
that stays quiet when the reader of their output goes away (``python -m par_ray.planner --table | head``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exit_with(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())``, except that a closed standard output (the command piped into ``head``, a pager quit)
    ends the process with status 1 and no ``BrokenPipeError`` traceback, as Python's ``signal`` documentation
    recommends (standard output is pointed at ``os.devnull`` so the interpreter's final flush cannot raise again).
    SIGPIPE keeps Python's disposition: a socket closed under the command still raises where it happens."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(status)


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
