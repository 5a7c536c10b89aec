"""par_ray.cli_args: the shared argument types and ``exit_with``, the command lines' quiet exit when the reader of
their output goes away (``python -m par_ray.planner --table | head``)."""

import argparse
import subprocess
import sys

import pytest

from par_ray.cli_args import positive_float, positive_floats, positive_int, positive_ints


def _closed_reader(argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` with standard output a pipe whose reading end is closed at once (what ``head`` does after its
    lines); returns (exit status, standard error)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "from par_ray.cli_args import exit_with; exit_with(lambda: print('x' * 10**6) or 0)"],
    [sys.executable, "-m", "par_ray.planner", "--table"],
], ids=["exit_with", "planner"])
def test_a_closed_reader_ends_the_command_quietly(argv):
    status, err = _closed_reader(argv)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert status == 1


def test_exit_with_passes_the_status_on():
    code = "from par_ray.cli_args import exit_with; exit_with(lambda: print('table') or 3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "table\n", "")


@pytest.mark.parametrize("parse,text,value", [
    (positive_int, "256", 256), (positive_float, "2.5", 2.5), (positive_ints, "6,12", (6, 12)),
    (positive_floats, "1,1.5", (1.0, 1.5))])
def test_types_take_good_values(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse,text", [
    (positive_int, "0"), (positive_int, "x"), (positive_float, "-1"), (positive_float, "nan"),
    (positive_ints, "6,x"), (positive_floats, "1,0")])
def test_types_refuse_bad_values_naming_them(parse, text):
    with pytest.raises(argparse.ArgumentTypeError, match="got"):
        parse(text)
