"""Screenshots of MLflow's views of a finished sweep's trials, taken with headless Chromium.

Starts ``mlflow server`` on 127.0.0.1 over the sweep's store (``par_ray.mlflow_ui.local_server``) and saves three PNGs:

- ``--out``: ``#/compare-runs`` for the child runs of one sweep (the newest, or ``--parent-run``), assistant panel
  closed, only the parameters that differ between runs (backbone, seed, searched knobs), the parallel coordinates of
  those parameters against G and the accuracy at the longest test depth;
- ``<out>_experiment.png``: the experiment page as a user opens it (``par_ray.mlflow_ui.ui_url``: the "Model
  training" workflow, whose first tab is the runs table), the sweep's parent run expanded and its trial runs ticked,
  which brings up MLflow's Compare button;
- ``<out>_acc_by_depth.png``: the line chart that a click on ``acc_by_depth`` in the comparison view opens
  (``#/metric/acc_by_depth``): accuracy against test depth (x-axis "Step" = d), one line per run.

Chromium runs headless from a fresh profile and reaches nothing but loopback (every other host resolves to nothing);
it is driven through its DevTools protocol on a loopback port with aiohttp (installed with ray[default]).
Needs Debian's ``chromium`` package (``apt-get install chromium``).

    python scripts/mlflow_screenshot.py --storage /tmp/sweep --out /tmp/compare.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from par_ray import mlflow_ui
from par_ray import tracking_schema as schema

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
WIDTH, HEIGHT = 1600, 1980
SHORT_HEIGHT = 1000
"""Viewport height of the experiment page and the chart (the comparison view is taller)."""


def build_parser() -> argparse.ArgumentParser:
    """This script's argument parser, built without running anything (grouped flags, one example)."""
    p = argparse.ArgumentParser(
        prog="python scripts/mlflow_screenshot.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Save PNG screenshots of MLflow's views of a finished sweep (needs Debian's chromium).",
        epilog="Saves the runs table, the comparison view of the sweep's trials and the acc_by_depth chart.\n"
               "\nexample:\n  python scripts/mlflow_screenshot.py --storage runs/backbone_scaling")
    store = p.add_argument_group("which sweep")
    store.add_argument("--storage", default=None, help="the sweep's --storage (default runs/<sweep>)")
    store.add_argument("--backend-store-uri", default=None, help="default: sqlite:///<storage>/mlflow.db")
    store.add_argument("--artifacts", default=None,
                       help="artifact directory the server serves (default <storage>/mlartifacts)")
    store.add_argument("--sweep", default="backbone_scaling", help="sweep name (experiment par_ray/<sweep>)")
    store.add_argument("--parent-run", default=None,
                       help="the sweep's parent run id (default: the newest sweep run)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default=None,
                     help="PNG path of the comparison view (default <storage>/screenshots/<sweep>_compare.png); the "
                          "experiment page and the acc_by_depth chart go beside it as <stem>_experiment.png and "
                          "<stem>_acc_by_depth.png")
    out.add_argument("--chromium", default=None, help="browser binary (default: chromium on PATH)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse this script's flags (:func:`build_parser`)."""
    return build_parser().parse_args(argv)


def compare_url(server: str, sweep: str, parent_run: str | None) -> tuple[str, list[str], list[str], str, str]:
    """URL of the comparison view of the sweep's child runs, their run ids, the metrics to plot, the experiment id and
    the parent run id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server)
    exp = client.get_experiment_by_name(schema.experiment_name(sweep))
    if exp is None:
        raise SystemExit(f"error: --sweep: no experiment {schema.experiment_name(sweep)!r} in this store")
    if parent_run is None:
        parents = client.search_runs([exp.experiment_id], f"tags.`{schema.TAG_ROLE}` = '{schema.ROLE_SWEEP}'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
        if not parents:
            raise SystemExit("error: --parent-run: no sweep run in this experiment")
        parent_run = parents[0].info.run_id
    runs = client.search_runs([exp.experiment_id], f"tags.`{schema.TAG_PARENT}` = '{parent_run}'",
                              order_by=["tags.`par_ray.backbone` ASC", "tags.`par_ray.seed` ASC"], max_results=200)
    if not runs:
        raise SystemExit(f"error: --parent-run: sweep run {parent_run} has no trial runs")
    ids = [r.info.run_id for r in runs]
    depths = sorted({int(k[5:]) for r in runs for k in r.data.metrics if k.startswith("acc_d")})
    metrics = ["G"] + ([f"acc_d{depths[-1]}"] if depths else [])
    q = urllib.parse.quote
    url = (f"{server}/#/compare-runs?runs={q(json.dumps(ids))}&experiments={q(json.dumps([exp.experiment_id]))}"
           "&workflowType=machine_learning")
    return url, ids, metrics, exp.experiment_id, parent_run


def metric_url(server: str, metric: str, run_ids: list[str], experiment_id: str) -> str:
    """The metric page of ``metric`` for ``run_ids`` (what a metric name in the comparison view links to), points
    shown, x-axis the metric's step."""
    q = urllib.parse.quote
    return (f"{server}/#/metric/{q(metric)}?runs={q(json.dumps(run_ids))}&metric={q(json.dumps(metric))}"
            f"&experiments={q(json.dumps([experiment_id]))}&plot_metric_keys={q(json.dumps([metric]))}"
            "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true"
            "&deselected_curves=%5B%5D&last_linear_y_axis_range=%5B%5D&workflowType=machine_learning")


# JavaScript run in the page. The MLflow 3 UI labels its switches and its assistant's close button with aria-labels.
_READY = "document.body.innerText.includes('Show diff only') && document.body.innerText.includes('Comparing')"
_CLOSE_ASSISTANT = "(() => { const b = document.querySelector('button[aria-label=\"Close\"]'); if (b) b.click(); " \
                   "return !!b; })()"
_DIFF_PARAMS = "(() => { const s = document.querySelector('button[aria-label=\"Parameters - Show diff only\"]'); " \
               "if (s && s.getAttribute('aria-checked') !== 'true') s.click(); return !!s; })()"
_CLEAR_PLOT_METRICS = """(() => {
  const selects = document.querySelectorAll('.du-bois-light-select-multiple');
  if (selects.length < 2) return false;
  selects[1].querySelectorAll('.du-bois-light-select-selection-item-remove').forEach(x => x.click());
  const box = selects[1].querySelector('.du-bois-light-select-selector');
  box.dispatchEvent(new MouseEvent('mousedown', {bubbles: true}));
  return true; })()"""


_SHOW_PLOTS = """(() => {
  const nodes = document.querySelectorAll('[data-testid="artifact-tree-node"][artifact-name="accuracy_by_depth.png"]');
  nodes.forEach(n => n.click());
  return nodes.length; })()"""


def _type_in_metrics(text: str) -> str:
    """Type ``text`` into the plot's metric search box (its option list is virtualised: options appear when typed)."""
    return ("(() => { const i = document.querySelectorAll('.du-bois-light-select-multiple')[1].querySelector('input');"
            " const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;"
            f" i.focus(); set.call(i, {json.dumps(text)}); i.dispatchEvent(new Event('input', {{bubbles: true}}));"
            " return true; })()")


def _pick_option(name: str) -> str:
    return ("(() => { const o = Array.from(document.querySelectorAll('.du-bois-light-select-item-option'))"
            f".find(x => x.getAttribute('title') === {json.dumps(name)}); if (o) o.click(); return !!o; }})()")


class _Page:
    """One Chromium tab driven through the DevTools protocol."""

    def __init__(self, ws):
        self.ws, self.counter = ws, iter(range(1, 1 << 30))

    async def call(self, method: str, **params):
        mid = next(self.counter)
        await self.ws.send_json({"id": mid, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=120)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expr: str):
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")

    async def open(self, url: str, ready: str, what: str, timeout_s: int = 120) -> None:
        await self.call("Page.navigate", url=url)
        for _ in range(timeout_s):
            await asyncio.sleep(1)
            if await self.js(ready):
                return
        raise RuntimeError(f"{what} did not load within {timeout_s} s")

    async def size(self, height: int) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1,
                        mobile=False)

    async def save(self, out: str) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))


# The experiment page is ready when the sweep's parent run is listed; its expander shows the trial runs.
_EXPAND_PARENT = """(() => {
  const b = document.querySelector('button[data-component-id$="runnamecellrenderer.tsx_46"]');
  if (b) b.click(); return !!b; })()"""


# Tick the selection checkbox of every trial run (rows other than the header and the parent's): MLflow then shows its
# Compare button.
def _tick_trials(parent_name: str) -> str:
    return ("(() => { let n = 0; document.querySelectorAll('.ag-row').forEach(r => {"
            " const box = r.querySelector('.ag-checkbox-input-wrapper input[type=checkbox]');"
            f" if (box && !r.innerText.includes({json.dumps(parent_name)})"
            " && !box.checked) { box.click(); n += 1; } }); return n; })()")


async def _screenshots(chromium: str, shots: dict[str, str], compare: str, experiment: str, chart: str,
                       metrics: list[str], parent_name: str) -> None:
    import aiohttp

    port = mlflow_ui.free_port()
    profile = tempfile.mkdtemp(prefix="chromium_profile_")
    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
                             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    targets = json.load(r)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{chromium} did not open its DevTools port") from None
                time.sleep(0.3)
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
            page = _Page(ws)
            await page.call("Page.enable")
            await page.size(SHORT_HEIGHT)

            # (1) the experiment page, as a user opens it
            await page.open(experiment, f"document.body.innerText.includes({json.dumps(parent_name)})",
                            "the experiment page")
            await asyncio.sleep(2)
            await page.js(_CLOSE_ASSISTANT)
            await page.js(_EXPAND_PARENT)
            await asyncio.sleep(2)
            await page.js(_tick_trials(parent_name))
            await asyncio.sleep(1)
            await page.js(_CLOSE_ASSISTANT)
            await page.save(shots["experiment"])

            # (2) the comparison view
            await page.size(HEIGHT)
            await page.open(compare, _READY, "the comparison view")
            await asyncio.sleep(2)
            await page.js(_CLOSE_ASSISTANT)
            await page.js(_DIFF_PARAMS)
            if await page.js(_CLEAR_PLOT_METRICS):
                for m in metrics:
                    await page.js(_type_in_metrics(m))
                    await asyncio.sleep(0.7)
                    await page.js(_pick_option(m))
                await page.js("document.activeElement && document.activeElement.blur(); "
                              "document.body.dispatchEvent(new MouseEvent('mousedown', {bubbles: true})); true")
            await page.js(_SHOW_PLOTS)
            await asyncio.sleep(3)
            await page.save(shots["compare"])

            # (3) the acc_by_depth line chart of the compared runs
            await page.size(SHORT_HEIGHT)
            await page.open(chart, "!!document.querySelector('.js-plotly-plot .scatterlayer .trace')",
                            "the acc_by_depth chart")
            await asyncio.sleep(2)
            await page.js(_CLOSE_ASSISTANT)
            await asyncio.sleep(1)
            await page.save(shots["chart"])
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        shutil.rmtree(profile, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    storage = os.path.abspath(os.path.expanduser(args.storage or f"runs/{args.sweep}"))
    backend = args.backend_store_uri or f"sqlite:///{storage}/mlflow.db"
    if backend.startswith("sqlite:///") and not os.path.exists(backend[len("sqlite:///"):]):
        print(f"error: --storage: no MLflow store at {backend}", file=sys.stderr)
        return 2
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("error: --chromium: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out or f"{storage}/screenshots/{args.sweep}_compare.png")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    stem = os.path.splitext(out)[0]
    shots = {"compare": out, "experiment": f"{stem}_experiment.png", "chart": f"{stem}_acc_by_depth.png"}
    with mlflow_ui.local_server(backend, args.artifacts or f"{storage}/mlartifacts") as server:
        url, ids, metrics, exp_id, parent = compare_url(server, args.sweep, args.parent_run)
        from mlflow.tracking import MlflowClient

        parent_name = MlflowClient(server).get_run(parent).info.run_name
        asyncio.run(_screenshots(chromium, shots, url, mlflow_ui.ui_url(server, exp_id),
                                 metric_url(server, schema.CURVE_BY_DEPTH, ids, exp_id), metrics, parent_name))
    print(f"wrote {out} ({len(ids)} runs; parallel coordinates: differing params vs {', '.join(metrics)}), "
          f"{shots['experiment']} (experiment page) and {shots['chart']} ({schema.CURVE_BY_DEPTH} by test depth)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
