"""Screenshot of MLflow's run-comparison view of a finished sweep's trials, taken with headless Chromium.

Starts ``mlflow server`` on 127.0.0.1 over the sweep's store (``par_ray.tracking.local_server``), opens
``#/compare-runs`` for the child runs of one sweep (the newest, or ``--parent-run``), closes the assistant panel,
shows only the parameters that differ between runs (backbone, seed, searched knobs), plots the parallel coordinates
of those parameters against G and the accuracy at the longest test depth, and saves a PNG.

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

from par_ray import tracking

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
WIDTH, HEIGHT = 1600, 1980


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default=None, help="the sweep's --storage (default runs/<sweep>)")
    p.add_argument("--backend-store-uri", default=None, help="default: sqlite:///<storage>/mlflow.db")
    p.add_argument("--artifacts", default=None,
                   help="artifact directory the server serves (default <storage>/mlartifacts)")
    p.add_argument("--sweep", default="backbone_scaling", help="sweep name (experiment par_ray/<sweep>)")
    p.add_argument("--parent-run", default=None, help="the sweep's parent run id (default: the newest sweep run)")
    p.add_argument("--out", default=None, help="PNG path (default <storage>/screenshots/<sweep>_compare.png)")
    p.add_argument("--chromium", default=None, help="browser binary (default: chromium on PATH)")
    return p.parse_args(argv)


def compare_url(server: str, sweep: str, parent_run: str | None) -> tuple[str, list[str], list[str]]:
    """URL of the comparison view of the sweep's child runs, their run ids, and the metrics to plot."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server)
    exp = client.get_experiment_by_name(tracking.experiment_name(sweep))
    if exp is None:
        raise SystemExit(f"error: --sweep: no experiment {tracking.experiment_name(sweep)!r} in this store")
    if parent_run is None:
        parents = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_ROLE}` = 'sweep'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
        if not parents:
            raise SystemExit("error: --parent-run: no sweep run in this experiment")
        parent_run = parents[0].info.run_id
    runs = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PARENT}` = '{parent_run}'",
                              order_by=["tags.`par_ray.backbone` ASC", "tags.`par_ray.seed` ASC"], max_results=200)
    if not runs:
        raise SystemExit(f"error: --parent-run: sweep run {parent_run} has no trial runs")
    ids = [r.info.run_id for r in runs]
    depths = sorted({int(k[5:]) for r in runs for k in r.data.metrics if k.startswith("acc_d")})
    metrics = ["G"] + ([f"acc_d{depths[-1]}"] if depths else [])
    q = urllib.parse.quote
    url = f"{server}/#/compare-runs?runs={q(json.dumps(ids))}&experiments={q(json.dumps([exp.experiment_id]))}"
    return url, ids, metrics


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


async def _screenshot(chromium: str, url: str, metrics: list[str], out: str) -> None:
    import aiohttp

    port = tracking.free_port()
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
            counter = iter(range(1, 1 << 30))

            async def call(method: str, **params):
                mid = next(counter)
                await ws.send_json({"id": mid, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json(timeout=120)
                    if msg.get("id") == mid:
                        if "error" in msg:
                            raise RuntimeError(f"{method}: {msg['error']}")
                        return msg.get("result", {})

            async def js(expr: str):
                r = await call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
                return r.get("result", {}).get("value")

            await call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                       mobile=False)
            await call("Page.enable")
            await call("Page.navigate", url=url)
            for _ in range(120):
                await asyncio.sleep(1)
                if await js(_READY):
                    break
            else:
                raise RuntimeError("the comparison view did not load within 120 s")
            await asyncio.sleep(2)
            await js(_CLOSE_ASSISTANT)
            await js(_DIFF_PARAMS)
            if await js(_CLEAR_PLOT_METRICS):
                for m in metrics:
                    await js(_type_in_metrics(m))
                    await asyncio.sleep(0.7)
                    await js(_pick_option(m))
                await js("document.activeElement && document.activeElement.blur(); "
                         "document.body.dispatchEvent(new MouseEvent('mousedown', {bubbles: true})); true")
            await js(_SHOW_PLOTS)
            await asyncio.sleep(3)
            shot = await call("Page.captureScreenshot", format="png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
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
    with tracking.local_server(backend, args.artifacts or f"{storage}/mlartifacts") as server:
        url, ids, metrics = compare_url(server, args.sweep, args.parent_run)
        asyncio.run(_screenshot(chromium, url, metrics, out))
    print(f"wrote {out} ({len(ids)} runs; parallel coordinates: differing params vs {', '.join(metrics)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
