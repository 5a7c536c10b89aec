"""``python -m analysis --experiment NAME [--parent-run ID] [--tracking-uri URI] --out DIR``.

Parse, call :func:`analysis.report.analyze`, print the main table and where the files went. Bad input (unknown
experiment or parent run, no trial runs, a tracking URI that is no store or a server that does not answer, an --out
that cannot be a folder) ends with one ``error: --flag: ...`` line and exit status 2; a write that fails, with one
``error:`` line and status 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from analysis.load import AnalysisError
from analysis.report import analyze
from par_ray.cli_args import exit_with
from par_ray.tracking import check_store, sqlite_file


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m analysis`` argument parser, built without running anything (flags in groups, one example)."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog="python -m analysis", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Analyse a finished sweep from its MLflow runs: paper-style tables and accuracy-by-depth plots.",
        epilog="Accuracy by test depth, d50 and G over the seeds of each configuration, written to --out as\n"
               "Markdown, CSV and LaTeX tables and PNG figures, and logged to the sweep's parent run under\n"
               "analysis/. A sweep runs this at its end already; rerun it to analyse again or elsewhere.\n"
               "\nexample:\n  python -m analysis --experiment par_ray/backbone_scaling \\\n"
               "      --tracking-uri sqlite:///runs/backbone_scaling/mlflow.db --out runs/backbone_scaling/analysis")
    source = parser.add_argument_group("which runs")
    source.add_argument("--experiment", required=True, help="MLflow experiment name, e.g. par_ray/ablations")
    source.add_argument("--parent-run", default=None,
                        help="sweep (parent) run id; default: every trial of the experiment, logged to its newest "
                             "sweep run")
    source.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI, e.g. sqlite:///runs/<sweep>/mlflow.db (default: "
                             "$MLFLOW_TRACKING_URI; one of the two is required)")
    out = parser.add_argument_group("where the tables and figures go")
    out.add_argument("--out", required=True, help="output folder for tables (md/csv/tex) and figures (png)")
    out.add_argument("--no-log", action="store_true", help="do not log the outputs to the parent run")
    return parser


def _unwritable_folder(path: str) -> str | None:
    """Why ``path`` cannot be (made) a folder to write in, or ``None``: it is a file, or the nearest folder that
    exists on its way is not writable (nothing is created here)."""
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        return f"{path} is a file, not a folder"
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write in {existing}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Parse, analyse, print the main table and where the files went; bad input → one ``error:`` line, status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        # MLflow's own default is sqlite:///mlflow.db in the working directory: it would create an empty store there
        parser.error("--tracking-uri: required (or set MLFLOW_TRACKING_URI), e.g. "
                     "--tracking-uri sqlite:///runs/backbone_scaling/mlflow.db")
    uri = args.tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
    if (store := sqlite_file(uri)) is not None and not store.exists():
        # MLflow would create the folder and an empty store there, then report no such experiment
        flag = "--tracking-uri" if args.tracking_uri else "MLFLOW_TRACKING_URI"
        parser.error(f"{flag}: no MLflow store at {uri} (a sweep's is sqlite:///<its --storage>/mlflow.db)")
    try:  # a server that does not answer (MLflow would retry it for minutes), a path, a file that is no store
        check_store(uri)
    except ValueError as e:
        parser.error(f"{'--tracking-uri' if args.tracking_uri else 'MLFLOW_TRACKING_URI'}: {e}")
    out_problem = _unwritable_folder(args.out)
    if out_problem:
        parser.error(f"--out: {out_problem}")
    try:
        result = analyze(args.experiment, args.parent_run, args.tracking_uri, args.out,
                         log_artifacts=not args.no_log)
    except AnalysisError as e:
        parser.error(str(e))
    except OSError as e:  # the tables could not be written (a full disk, a folder the OS refuses)
        print(f"error: {e.strerror or e}: {e.filename or args.out}", file=sys.stderr)
        return 1
    print(result["main_table"])
    if "plan_vs_actual" in result["tables"]:  # the sweep's planned vs actual cost (analysis.cost)
        print(result["tables"]["plan_vs_actual"]["md"].read_text(encoding="utf-8"))
    for w in result["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{result['n_trials']} trials ({result['n_finished']} FINISHED); wrote {len(result['tables'])} tables, "
          f"{len(result['figures'])} figures to {result['out_dir']}")
    if result["parent_run_id"]:
        print(f"logged to run {result['parent_run_id']} under artifacts/analysis/")
    elif args.no_log:
        print("not logged to MLflow (--no-log)")
    else:
        print("no sweep run found: outputs not logged to MLflow")
    return 0


if __name__ == "__main__":
    exit_with(main)
