"""``python -m analysis --experiment NAME [--parent-run ID] [--tracking-uri URI] --out DIR``.

Parse, call :func:`analysis.report.analyze`, print the main table and where the files went. Bad input (unknown
experiment or parent run, no trial runs) ends with one ``error: --flag: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from analysis.load import AnalysisError
from analysis.report import analyze


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Analyse a par_ray sweep from its MLflow runs: accuracy by test depth, d50 and G over\n"
                    "the seeds of each configuration, written to --out as paper-layout tables (Markdown,\n"
                    "CSV, LaTeX) and PNG figures, and logged to the sweep's parent run under analysis/.",
        epilog="example:\n  python -m analysis --experiment par_ray/backbone_scaling \\\n"
               "      --tracking-uri sqlite:///runs/backbone_scaling/mlflow.db --out runs/backbone_scaling/analysis")
    parser.add_argument("--experiment", required=True, help="MLflow experiment name, e.g. par_ray/ablations")
    parser.add_argument("--parent-run", default=None,
                        help="sweep (parent) run id; default: every trial of the experiment, logged to its newest "
                             "sweep run")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI, e.g. sqlite:///runs/<sweep>/mlflow.db (default: "
                             "$MLFLOW_TRACKING_URI; one of the two is required)")
    parser.add_argument("--out", required=True, help="output folder for tables (md/csv/tex) and figures (png)")
    parser.add_argument("--no-log", action="store_true", help="do not log the outputs to the parent run")
    args = parser.parse_args(argv)
    if not args.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        # MLflow's own default is sqlite:///mlflow.db in the working directory: it would create an empty store there
        parser.error("--tracking-uri: required (or set MLFLOW_TRACKING_URI), e.g. "
                     "--tracking-uri sqlite:///runs/backbone_scaling/mlflow.db")
    try:
        result = analyze(args.experiment, args.parent_run, args.tracking_uri, args.out,
                         log_artifacts=not args.no_log)
    except AnalysisError as e:
        parser.error(str(e))
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
    sys.exit(main())
