"""Screenshot a page of the Dagster UI (default: the global asset graph) in headless chromium.

    python scripts/screenshot_ui.py docs/asset-graph.png
    python scripts/screenshot_ui.py runs.png --page /runs

Starts the webserver over the same instance `bridge` and `make ui` use
(<data lake>/dagster_home unless DAGSTER_HOME is set) on a free 127.0.0.1 port, waits for it,
opens the page in Debian's chromium (BRIDGE_CHROMIUM points at another build) and stops the
server again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--page", default="/asset-groups", help="UI path (default: the asset graph)")
    parser.add_argument("--width", type=int, default=1800)
    parser.add_argument("--height", type=int, default=1100)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds to let the graph lay out")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from bridge_assets.orchestration.runs import instance
    from bridge_assets.orchestration.webserver import dagster_webserver

    instance()  # sets DAGSTER_HOME to the data lake's instance when unset
    chromium = os.environ.get("BRIDGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with dagster_webserver() as url:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(url + args.page, wait_until="networkidle", timeout=120_000)
            time.sleep(args.settle)
            skip = page.get_by_role("button", name="Skip")  # the first-visit newsletter dialog
            if skip.count():
                skip.first.click()
                time.sleep(1)
            args.output.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.output))
            browser.close()
    print(f"{url}{args.page} -> {args.output}")


if __name__ == "__main__":
    main()
