"""`POST /browsers/{id}/playwright/execute` of `return await page.title()` (until the
answer, on a warm executor) next to the same work done from outside: Playwright connects
over the session's `cdp_ws_url`, reads the title and disconnects (its driver started
once, before the clock). Measured alternately in the same run. Goal: at most 0.3x."""

from __future__ import annotations

import json
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from scenarios import alternate, one_browser

RUNS = 100
WARMUP = 10
TITLE = "bench page"


def run(work_dir: Path, report) -> None:
    with one_browser(work_dir, {"headless": True}) as (session, connection, headers):
        sid = session["session_id"]

        def execute(code: str) -> dict:
            connection.request("POST", f"/browsers/{sid}/playwright/execute", json.dumps({"code": code}), headers)
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200 and answer["success"], answer
            return answer

        execute(f"await page.setContent('<title>{TITLE}</title>')")

        def inside() -> float:
            started = time.perf_counter()
            assert execute("return await page.title()")["result"] == TITLE
            return time.perf_counter() - started

        with sync_playwright() as playwright:
            def outside() -> float:
                started = time.perf_counter()
                browser = playwright.chromium.connect_over_cdp(session["cdp_ws_url"])
                assert browser.contexts[0].pages[0].title() == TITLE
                browser.close()
                return time.perf_counter() - started

            ours, references = alternate(inside, outside, RUNS, WARMUP)
        report("playwright_execute: page.title() run in the VM", ours,
               {"connect_over_cdp + title + close": references}, percentiles=(50, 99))
