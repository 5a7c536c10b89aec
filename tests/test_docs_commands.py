"""Every command the docs show parses with its entry point's own argument parser (STYLE rule 19).

Collects the shell commands of README.md and docs/*.md that start a project entry point — ``python -m par_ray…``,
``python sweeps/….py``, ``python -m analysis``, ``python benchmarks/….py``, ``python scripts/….py``,
``benchmarks/gpu_check.sh`` — and ``python -m pytest`` commands:

- in fenced code blocks (bash, sh, console or no language): the whole command is parsed by the entry point's
  ``build_parser()`` (the sweeps: ``par_ray.sweep.cli.parse_args``), as ``main`` would, and every ``--set
  SECTION.FIELD=VALUE`` must name a config field whose value converts (``par_ray.config.from_flat``); a pytest
  command's test files must exist;
- in inline code spans (prose and tables, where a command may be elided with ``…``): every ``--flag`` must be one
  the entry point knows. Not in docs/experiments.md, whose inline commands record what ran at a given commit.

A command is unwrapped first: line continuations joined, comments dropped, ``time`` and ``VAR=value`` prefixes
removed, ``ray job submit … -- CMD`` reduced to CMD, and ``sweeps/<name>.py`` expanded to every sweep. Nothing runs:
no Ray start, no training; the whole file takes seconds (imports of torch, Ray and MLflow).

Also checked here: every entry point's ``--help`` says in one line what it does, groups its flags and shows an
example (its epilog), and the docs' relative links point at files that exist.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import io
import re
import shlex
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.py") if not p.name.startswith("_"))
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
HISTORY = "docs/experiments.md"
"""The lab notebook: its inline commands are a record of what ran then, so only its code blocks are checked."""
MODULES = {"par_ray.train", "par_ray.tracking", "par_ray.mlflow_ui", "par_ray.planner", "par_ray.hardware",
           "analysis", "pytest"}
"""``python -m`` entry points the docs may show; any other ``python -m par_ray…`` / ``analysis…`` fails the test."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One command as a doc shows it: where, its words after unwrapping, and whether it came from a fenced block."""

    where: str
    argv: tuple[str, ...]
    fenced: bool
    job: bool = False
    """Shown as the command of a ``ray job submit``."""

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


# ----------------------------------------------------------------------------------------------------------------------
# collecting

_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```", re.M | re.S)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_STARTS = re.compile(r"^(?:(?:time|\w+=\S*)\s+)*(?:ray job submit\b.*\s--\s+)?"
                     r"(?:python3?\s+(?:-m\s+(?:par_ray|analysis|pytest)\b|(?:sweeps|benchmarks|scripts)/)"
                     r"|benchmarks/gpu_check\.sh\b)")


def _unwrap(words: list[str]) -> tuple[list[str], bool]:
    """Drop ``time`` and ``VAR=value`` prefixes; ``ray job submit … -- CMD`` → CMD; and whether it was a job's."""
    while words and (words[0] == "time" or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        words = words[1:]
    if words[:3] == ["ray", "job", "submit"] and "--" in words:
        return _unwrap(words[words.index("--") + 1:])[0], True
    return words, False


def _split(line: str) -> list[list[str]]:
    """A shell line → its commands (``&&``, ``;``, ``|`` separate them), a trailing ``# comment`` dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""  # "#" only starts a comment at a word's start, as in bash
    commands, words = [], []
    for word in lexer:
        if word.startswith("#"):
            break
        if word and set(word) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(word)
    return [c for c in commands + [words] if c]


def _expand(argv: list[str]) -> list[list[str]]:
    """``python sweeps/<name>.py …`` (a placeholder) → the same command for every sweep."""
    if len(argv) > 1 and argv[1] == "sweeps/<name>.py":
        return [[argv[0], f"sweeps/{name}.py", *argv[2:]] for name in SWEEPS]
    return [argv]


def collect(path: Path) -> list[Command]:
    """The entry-point commands of one Markdown file: fenced shell blocks, then inline code spans."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT).as_posix()
    found: list[Command] = []
    fenced_spans = []
    for m in _FENCE.finditer(text):
        fenced_spans.append(m.span())
        if m.group("lang") not in SHELL_LANGS:
            continue
        first = text.count("\n", 0, m.start("body")) + 1
        lines = m.group("body").split("\n")
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a line continuation
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            for words in _split(line.strip()):
                words, job = _unwrap(words)
                if words and _STARTS.match(shlex.join(words)):
                    found += [Command(f"{name}:{first + start}", tuple(w), True, job) for w in _expand(words)]
    for m in _INLINE.finditer(text) if name != HISTORY else ():
        if any(a <= m.start() < b for a, b in fenced_spans):
            continue
        span = m.group(1).strip()
        if not _STARTS.match(span):
            continue
        line = text.count("\n", 0, m.start()) + 1
        words = span.replace("…", " … ").split()  # an elided command need not be valid shell
        words, job = _unwrap([w for w in words if w != "\\"])
        found += [Command(f"{name}:{line}", tuple(w), False, job) for w in _expand(words)]
    return found


COMMANDS = [c for doc in DOCS for c in collect(doc)]


# ----------------------------------------------------------------------------------------------------------------------
# entry points

def _load(path: Path):
    """Import a script (``sweeps/x.py``, ``benchmarks/x.py``, ``scripts/x.py``) by path, without running its main."""
    spec = importlib.util.spec_from_file_location(f"_docs_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def entry_point(key: str) -> tuple[argparse.ArgumentParser, typing.Callable[[list[str]], object]]:
    """The parser of an entry point (``par_ray.train``, ``sweeps/ablations.py``, ...) and the function that parses
    argv the way its ``main`` does (``--set`` values included). Abbreviated flags are refused: the docs spell them."""
    from par_ray.config import from_flat, parse_overrides

    extra: typing.Callable[[list[str]], object] = lambda argv: None  # noqa: E731
    if key.startswith("sweeps/"):
        from par_ray.sweep.cli import build_parser, parse_args

        spec = _load(ROOT / key).SPEC
        parser = build_parser(spec)
        extra = lambda argv: from_flat(dict(parse_args(spec, argv).overrides))  # noqa: E731
    elif key.startswith(("benchmarks/", "scripts/")):
        parser = _load(ROOT / key).build_parser()
    elif key in ("par_ray.tracking", "par_ray.mlflow_ui"):
        from par_ray.mlflow_ui import build_parser

        parser = build_parser(f"python -m {key}{' ui' if key == 'par_ray.tracking' else ''}")
    elif key == "par_ray.train":
        from par_ray.train.__main__ import build_parser

        parser = build_parser()
        extra = lambda argv: from_flat(parse_overrides(parser.parse_args(argv).set))  # noqa: E731
    else:
        parser = importlib.import_module("analysis.__main__" if key == "analysis" else key).build_parser()
    parser.allow_abbrev = False

    def parse(argv: list[str]) -> None:
        parser.parse_args(argv)
        extra(argv)

    return parser, parse


def _key(argv: typing.Sequence[str]) -> tuple[str, list[str]]:
    """(entry point, its arguments) of a command; ``AssertionError`` for one the project does not have."""
    if argv[0] == "benchmarks/gpu_check.sh":  # passes its arguments to gpu_check.py, adding --out
        return "benchmarks/gpu_check.py", [*argv[1:], "--out", "gpu_check.json"]
    assert re.fullmatch(r"python3?(\.\d+)?", argv[0]), f"not a python command: {argv[0]}"
    if argv[1] == "-m":
        module, args = argv[2], list(argv[3:])
        assert module in MODULES, f"python -m {module}: not an entry point of this project ({sorted(MODULES)})"
        if module == "par_ray.tracking":
            assert args[:1] == ["ui"], "python -m par_ray.tracking: the command is `ui`"
            args = args[1:]
        return module, args
    script = argv[1]
    assert (ROOT / script).is_file(), f"{script}: no such file"
    return script, list(argv[2:])


def check(command: Command) -> None:
    """Parse ``command`` with its entry point's parser (fenced) or check its flags exist (inline); raise
    ``AssertionError`` with argparse's message."""
    key, args = _key(command.argv)
    if key == "pytest":  # the test files it names exist
        for a in args:
            if a.startswith("tests/"):
                assert (ROOT / a.split("::")[0]).exists(), f"{a}: no such test file"
        return
    parser, parse = entry_point(key)
    if not command.fenced:
        known = parser._option_string_actions
        unknown = [a for a in args if a.startswith("-") and a != "-" and a.split("=")[0] not in known
                   and not re.fullmatch(r"-\d.*", a)]
        assert not unknown, f"{key} has no option {unknown}"
        return
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(args)
    except SystemExit as e:
        assert e.code in (0, None), f"{key} refuses it: {err.getvalue().strip().splitlines()[-1]}"
    except ValueError as e:  # a --set field that does not exist or whose value does not convert
        raise AssertionError(f"{key}: {e}") from None


# ----------------------------------------------------------------------------------------------------------------------
# tests

def test_the_docs_show_commands():
    """The guide and the docs hold commands of every kind of entry point (so a broken collector cannot pass)."""
    fenced = [c for c in COMMANDS if c.fenced]
    assert len(fenced) >= 20, [str(c) for c in fenced]
    shown = {_key(c.argv)[0].split("/")[0] for c in COMMANDS}
    assert {"par_ray.train", "sweeps", "analysis", "par_ray.tracking", "par_ray.planner", "par_ray.hardware",
            "benchmarks", "scripts", "pytest"} <= shown
    readme = [c for c in COMMANDS if c.where.startswith("README.md") and c.fenced]
    assert ("python", "sweeps/backbone_scaling.py") in {c.argv for c in readme}  # the main job
    assert ("python", "-m", "pytest", "-q") in {c.argv for c in readme}  # the test command .ci/run runs


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_parses(command):
    check(command)


def test_the_jobs_the_docs_submit_write_where_their_results_outlive_the_job(monkeypatch):
    """Every ``ray job submit`` command the docs show gives a sweep's ``--storage`` or a single trial's ``--out`` as an
    absolute path or a bucket: inside a job a relative one (the default too) is refused, since the job runs in a
    temporary copy of its working directory (``par_ray.train.cluster.check_outlives_job``; ``$PWD`` expands on the
    submitting machine)."""
    from par_ray.train.cluster import check_outlives_job

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    checked = 0
    for c in (c for c in COMMANDS if c.job and c.fenced):
        key, args = _key(c.argv)
        flag = "--out" if key == "par_ray.train" else "--storage" if key.startswith("sweeps/") else None
        if flag is None or "--dry-run" in args:
            continue
        assert flag in args, f"{c}: a job needs {flag} (the default is relative)"
        check_outlives_job(flag, args[args.index(flag) + 1].replace("$PWD", str(ROOT)), buckets=True)
        checked += 1
    assert checked >= 4  # the README's sweep, docs/gpu.md's sweeps and single trial


MISSPELT_FLAGS = [
    ("python", "sweeps/backbone_scaling.py", "--smoke-tests"),
    ("python", "-m", "par_ray.planner", "--backbone", "qwen2.5-7b", "--strategy", "fsdp", "--world", "8"),
    ("python", "-m", "analysis", "--experiment", "x", "--output", "y"),
    ("python", "benchmarks/bench_memory.py", "--shape", "tiny"),
]


@pytest.mark.parametrize("argv", [
    *MISSPELT_FLAGS,
    ("python", "-m", "par_ray.train", "--steps", "10", "--set", "train.lrate=1e-3"),  # no such config field
    ("python", "-m", "par_ray.train", "--steps", "ten"),  # not an integer
    ("python", "-m", "par_ray.trainer", "--steps", "10"),  # no such module
    ("python", "scripts/probe.py", "runs/x"),  # no such script
])
def test_a_wrong_command_fails(argv):
    """The check itself: a misspelt flag, config field, value or entry point in a code block is an error."""
    with pytest.raises(AssertionError):
        check(Command("example", argv, True))


@pytest.mark.parametrize("argv", MISSPELT_FLAGS)
def test_a_wrong_flag_in_prose_fails(argv):
    with pytest.raises(AssertionError):
        check(Command("example", argv, False))


def test_collecting_unwraps_shell():
    """``time``, environment prefixes, continuations, comments and ``ray job submit … --`` are unwrapped."""
    text = ("```bash\n"
            "time PAR_RAY_FULL=1 python -m pytest -q tests/test_docs_commands.py   # a comment\n"
            "ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\\n"
            "    python sweeps/backbone_scaling.py --storage \"$PWD/runs/x\"\n"
            "cd /tmp && python -m par_ray.planner --table\n"
            "```\n"
            "and `python sweeps/<name>.py --dry-run …` inline\n")
    path = ROOT / "tests" / "_docs_example.md"
    try:
        path.write_text(text)
        got = collect(path)
    finally:
        path.unlink()
    assert [(c.argv, c.job) for c in got if c.fenced] == [
        (("python", "-m", "pytest", "-q", "tests/test_docs_commands.py"), False),
        (("python", "sweeps/backbone_scaling.py", "--storage", "$PWD/runs/x"), True),
        (("python", "-m", "par_ray.planner", "--table"), False)]
    assert [c.argv for c in got if not c.fenced] == [("python", f"sweeps/{s}.py", "--dry-run", "…") for s in SWEEPS]


ENTRY_POINTS = ["par_ray.train", "analysis", "par_ray.tracking", "par_ray.planner", "par_ray.hardware",
                *(f"sweeps/{s}.py" for s in SWEEPS),
                *(p.relative_to(ROOT).as_posix() for d in ("benchmarks", "scripts") for p in sorted(
                    (ROOT / d).glob("*.py")))]


@pytest.mark.parametrize("key", ENTRY_POINTS)
def test_help_reads_like_the_readme(key):
    """Each entry point's ``--help``: one line on what it does, its flags in groups, and an example."""
    parser, _ = entry_point(key)
    assert parser.description and "\n" not in parser.description.strip(), parser.description
    groups = [g for g in parser._action_groups if g.title not in ("options", "optional arguments",
                                                                  "positional arguments") and g._group_actions]
    assert groups, f"{key}: flags not grouped"
    assert parser.epilog and "example" in parser.epilog, f"{key}: no example in the epilog"
    assert isinstance(parser.formatter_class, type) and issubclass(
        parser.formatter_class, argparse.RawDescriptionHelpFormatter), "the example's line breaks would be lost"


_LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.M)


def _anchors(doc: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown file: lower case, punctuation dropped, spaces → hyphens."""
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_exist(doc):
    """Every relative link (files, images, reference definitions) of README.md and docs/*.md points at a file of the
    repository, and a link into a Markdown file's heading at a heading it has."""
    broken = []
    for inline, reference in _LINK.findall(doc.read_text(encoding="utf-8")):
        target = inline or reference
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = doc.parent / path if path else doc
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, broken


def test_readme_is_a_guide():
    """README.md stays a few screens for a new user; history and internal names live in docs/experiments.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    jargon = re.findall(r"§|\bsessions?\b|\brounds?\b|\bexperiments? \d+", text, re.I)
    assert not jargon, jargon
