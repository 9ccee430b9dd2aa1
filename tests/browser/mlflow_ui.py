"""The MLflow UI in a real browser, on a store that `rlhf run` made: headless Chromium opens the views a
user compares runs in, checks what they show and saves a screenshot of each.

    python tests/browser/mlflow_ui.py http://127.0.0.1:5000 OUT_DIR

The server is `rlhf ui` (or `mlflow ui --backend-store-uri ...`) on a store holding a pipeline run that
reused every stage (`rlhf run` twice), and best a newest one with one changed setting (`rlhf run rm.lr=5e-4`):
Compare shows the two newest pipeline runs, and "Show diff only" the metrics that setting changed. It needs Playwright's Python package
(`pip install playwright`, in any environment: it is no dependency of the pipeline) and Debian's Chromium
(`apt-get install chromium`), which Playwright drives through `executable_path`, never its own browser
download. Checks, each failing with the view and what is missing:
  - the runs list names the pipeline runs by config and outcome (`tiny · ... ran`, `tiny · all cached`);
  - Compare on the two newest pipeline runs shows their headline metrics side by side (not "Nothing to compare!");
  - the cached pipeline run's page lists a `· cached` child run per reused stage, and its description
    links the stage runs;
  - the experiment's Models tab lists the checkpoints as logged models, with their registered versions;
  - a registered version's page shows its origin (pipeline run, fingerprint, data) and schema.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

EXPERIMENT = "rlhf-pipeline"
ML_VIEW = "workflowType=machine_learning"  # MLflow 3's UI opens on its GenAI view otherwise
CHROMIUM = "/usr/bin/chromium"
SETTLE_MS = 1000
READY_MS = 60_000  # the first view loads the UI's scripts


def install_chromium() -> subprocess.Popen | None:
    """Debian's Chromium where it is missing (a new machine has none): the started `apt-get`, to wait for
    before the browser is needed, or None when it is there."""
    if Path(CHROMIUM).is_file():
        return None
    command = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium"
    return subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def login() -> dict[str, str] | None:
    """The server's basic-auth login, as MLflow's client takes it from the environment (None: no login)."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    return {"username": user, "password": password} if user and password else None


def api(base: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if (credentials := login()) is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{credentials['username']}:{credentials['password']}".encode()).decode()
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def pipeline_runs(base: str, experiment_id: str) -> list[dict]:
    """The pipeline runs, newest first (the REST API the UI reads too)."""
    found = api(base, "runs/search", {"experiment_ids": [experiment_id], "filter": "tags.`rlhf.kind` = 'pipeline'",
                                      "order_by": ["attributes.start_time DESC"], "max_results": 10})
    return found.get("runs", [])


def check(page, text: str, view: str) -> None:
    if text not in page.inner_text("body"):
        raise AssertionError(f"{view}: no {text!r} on the page")


SCROLL_JS = """([anchor, step]) => {
    let box = document.querySelector('[data-scrolled-list]');
    if (step === 0 && box && box.isConnected) {
        box.scrollTop = 0;  // the list found before: its first rows again
        return true;
    }
    if (step === 0) {
        if (box) delete box.dataset.scrolledList;
        const cells = [...document.querySelectorAll('a, span, div, td')].filter(e => e.textContent.trim() === anchor);
        box = cells.length ? cells[cells.length - 1] : null;  // the table's row, not a chart's label
        while (box && !(box.scrollHeight > box.clientHeight + 2)) box = box.parentElement;
        if (!box) return false;
        box.dataset.scrolledList = '1';
        box.scrollTop = 0;
        return true;
    }
    if (!box || box.scrollTop + box.clientHeight >= box.scrollHeight) return false;
    box.scrollTop += box.clientHeight / 2;
    return true;
}"""


def scroll_to(page, text: str, within: str, view: str, turns: int = 60) -> None:
    """Scroll the list that holds the text `within` (the UI draws only the rows in sight) until `text` shows."""
    if not page.evaluate(SCROLL_JS, [within, 0]):
        raise AssertionError(f"{view}: no list holding {within!r}")
    for _ in range(turns):
        page.wait_for_timeout(150)
        if text in page.inner_text("body"):
            return
        if not page.evaluate(SCROLL_JS, [within, 1]):
            break
    raise AssertionError(f"{view}: no {text!r} in the list")


def visit(page, url: str, shot: Path, ready: str) -> None:
    """Open a view and wait until it shows `ready` (the UI draws after its REST calls return; it polls,
    so the network never idles), then a moment for its charts before the screenshot."""
    page.goto(url)
    with contextlib.suppress(Exception):  # noqa: BLE001 - the check that follows names what is missing
        page.get_by_text(ready).first.wait_for(timeout=READY_MS)
    page.wait_for_timeout(SETTLE_MS)
    for label in ("Close", "Got it"):  # the assistant panel and first-visit hints, not part of the views
        with contextlib.suppress(Exception):  # noqa: BLE001 - not shown
            page.get_by_role("button", name=label).first.click(timeout=300)
    page.screenshot(path=str(shot))
    print(f"  {shot.name}: {page.url}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the MLflow UI, e.g. http://127.0.0.1:5000")
    parser.add_argument("out", type=Path, help="folder for the screenshots")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    base = args.url.rstrip("/")
    experiment_id = api(base, f"experiments/get-by-name?experiment_name={EXPERIMENT}")["experiment"]["experiment_id"]
    runs = pipeline_runs(base, experiment_id)
    cached = next((r for r in runs if " · all cached" in r["info"]["run_name"]), None)
    cold = next((r for r in runs if " ran" in r["info"]["run_name"]), None)
    if cached is None or cold is None:
        raise AssertionError(f"{EXPERIMENT}: needs a pipeline run that ran stages and one that reused them all "
                             f"(found {[r['info']['run_name'] for r in runs]})")
    names = {r["info"]["run_id"]: r["info"]["run_name"] for r in (cold, cached)}
    compared = [r["info"]["run_id"] for r in runs if r["info"]["status"] == "FINISHED"][:2]
    version = api(base, "registered-models/get-latest-versions", {"name": "rlhf-sft"})["model_versions"][0]
    args.out.mkdir(parents=True, exist_ok=True)
    home = f"{base}/#/experiments/{experiment_id}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1440, "height": 900}, http_credentials=login()).new_page()

        visit(page, f"{home}/runs?{ML_VIEW}", args.out / "runs.png", next(iter(names.values()))[:30])
        for name in names.values():
            check(page, name[:30], "runs list")

        compare = f"{base}/#/compare-runs?runs={json.dumps(compared)}&experiments={json.dumps([experiment_id])}&{ML_VIEW}"
        visit(page, compare, args.out / "compare.png", "Metrics")
        if "Nothing to compare" in page.inner_text("body"):
            raise AssertionError("compare view: 'Nothing to compare!' for two pipeline runs")
        page.get_by_text("Metrics", exact=True).first.scroll_into_view_if_needed()
        for key in ("data_prep/rows/sft_data/train", "eval/sft/accuracy", "sft/eval/loss"):  # in the list's order
            scroll_to(page, key, "data_prep/rows/pref_data/eval", "compare view")
        visit(page, compare, args.out / "compare.png", "Metrics")  # the lists back at their first rows, keys and values in line
        page.get_by_role("switch").nth(1).click()  # "Show diff only" of the sections Parameters, Metrics, Tags
        page.wait_for_timeout(1000)
        page.get_by_text("Metrics", exact=True).first.scroll_into_view_if_needed()
        page.screenshot(path=str(args.out / "compare-metrics.png"))

        visit(page, f"{home}/runs/{cached['info']['run_id']}?{ML_VIEW}", args.out / "cached-pipeline-run.png", "sft · cached")
        for text in ("sft · cached", "eval · cached", "Description"):
            check(page, text, "cached pipeline run")
        links = page.eval_on_selector_all("a[href*='/runs/']", "els => els.map(e => e.getAttribute('href'))")
        if not any(version["run_id"] in link for link in links):  # the SFT run it reused
            raise AssertionError(f"cached pipeline run: its description links no stage run it reused (links: {links[:10]})")

        visit(page, f"{home}/models?{ML_VIEW}", args.out / "models.png", "rlhf-sft")
        for text in ("sft_model", "rlhf-sft"):
            check(page, text, "Models tab")

        visit(page, f"{base}/#/models/rlhf-sft/versions/{version['version']}?{ML_VIEW}", args.out / "model-version.png",
              "fingerprint")
        for text in ("made by stage run", "fingerprint", "Inputs (1)"):
            check(page, text, "registered version")
        browser.close()
    print(f"MLflow UI views checked; screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
