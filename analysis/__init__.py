"""Analysis of par_ray sweeps: MLflow runs → polars frames → seed aggregates, d50 / G → paper tables and figures.

    from analysis import analyze
    analyze("par_ray/ablations", out_dir="results/ablations")     # or: python -m analysis --experiment ... --out ...

Modules: :mod:`analysis.load` (MLflow → frames), :mod:`analysis.aggregate` (statistics over seeds),
:mod:`analysis.tables` (Markdown / CSV / LaTeX), :mod:`analysis.plots` (PNG), :mod:`analysis.report` (the pipeline).
"""

from analysis.aggregate import Summary, summarize
from analysis.load import AnalysisError, SweepFrames, load_sweep
from analysis.report import analyze

__all__ = ["AnalysisError", "Summary", "SweepFrames", "analyze", "load_sweep", "summarize"]
