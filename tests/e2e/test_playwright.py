"""Server-side Playwright (`/browsers/{id}/playwright/*`): code runs in executors inside
the browser's VM (Node.js with the real playwright-core, next to Chromium); named
executors keep state and a tab of their own, run concurrently with each other and one
call at a time each, and are stopped at their timeout."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import kernel
import pytest
from kernel import Kernel

from conftest import TEST_PAGE_TITLE
from harness import wait_until
from sdk import SEED_ERA


def execute(client: Kernel, session_id: str, code: str, **options) -> dict:
    """`browsers.playwright.execute` today; the seed-era SDK has no such method, so it
    sends the request through the client's generic `post`."""
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/playwright/execute",
                           body={"code": code, **options}, cast_to=object)
    return client.browsers.playwright.execute(session_id, code=code, **options).to_dict(mode="json")


def executors(client: Kernel, session_id: str) -> list[dict]:
    if SEED_ERA:
        return client.get(f"/browsers/{session_id}/playwright/executors", cast_to=object)["executors"]
    listed = client.browsers.playwright.executors.list(session_id)
    return [executor.to_dict(mode="json") for executor in listed.executors]


def delete_executor(client: Kernel, session_id: str, name: str, close_tab: bool = True) -> None:
    if SEED_ERA:
        client.delete(f"/browsers/{session_id}/playwright/executors/{name}",
                      options={"params": {"close_tab": str(close_tab).lower()}}, cast_to=object)
    else:
        client.browsers.playwright.executors.delete(name, id_or_name=session_id, close_tab=close_tab)


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300)
    yield session
    client.browsers.delete_by_id(session.session_id)


def test_code_drives_the_browsers_page_and_returns_its_result(client, browser, test_page_url):
    sid = browser.session_id
    answer = execute(client, sid, f"""
        console.log('navigating');
        await page.goto({json.dumps(test_page_url)});
        return {{ title: await page.title(), heading: await page.textContent('h1') }};
    """)
    assert answer["success"] is True, answer
    assert answer["result"] == {"title": TEST_PAGE_TITLE, "heading": "hello"}
    assert answer["stdout"] == "navigating\n"
    # The default executor binds the browser's own (active) tab: the one CDP clients see.
    assert answer["tab"]["created"] is False and answer["tab"]["target_id"]
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        cdp = p.chromium.connect_over_cdp(browser.cdp_ws_url)
        assert [page.url for page in cdp.contexts[0].pages] == [test_page_url]
        cdp.close()
    # TypeScript is compiled; what cannot be JSON comes back as inspected text.
    typed = execute(client, sid, "const t: string = await page.title(); enum E { A, B } return [t, E.B];")
    assert typed["result"] == [TEST_PAGE_TITLE, 1], typed
    circular = execute(client, sid, "const a = { name: 'a' }; a.self = a; return a")["result"]
    assert isinstance(circular, str) and "name: 'a'" in circular and "Circular" in circular


def test_a_named_executor_keeps_its_state_and_its_own_tab(client, browser):
    sid = browser.session_id
    first = execute(client, sid, "globalThis.counter = 41; await page.goto('data:text/html,<title>mine</title>');"
                    " return page.url()", executor="keeper")
    assert first["success"] and first["tab"]["created"] is True, first
    second = execute(client, sid, "return [++globalThis.counter, await page.title()]", executor="keeper")
    assert second["result"] == [42, "mine"] and second["tab"] == {**first["tab"], "created": False}
    # Another executor is another process: it does not see the first one's globals.
    assert execute(client, sid, "return typeof globalThis.counter", executor="other")["result"] == "undefined"
    listed = {executor["name"]: executor for executor in executors(client, sid)}
    assert list(listed)[0] == "default" and "target_id" not in listed["default"]
    assert listed["keeper"]["target_id"] == first["tab"]["target_id"]
    assert listed["keeper"]["url"].startswith("data:text/html") and listed["keeper"]["busy"] is False
    # Deleted: its tab closes, and the name starts afresh.
    delete_executor(client, sid, "keeper")
    def tab_closed() -> bool:
        urls = execute(client, sid, "return context.pages().map(p => p.url())")["result"]
        return not any(url.startswith("data:text/html,<title>mine") for url in urls)
    assert wait_until(tab_closed, timeout=5), "the deleted executor's tab stayed open"
    again = execute(client, sid, "return typeof globalThis.counter", executor="keeper")
    assert again["result"] == "undefined" and again["tab"]["created"] is True
    for name in ("keeper", "other"):
        delete_executor(client, sid, name)
    assert [executor["name"] for executor in executors(client, sid)] == ["default"]


def test_executors_run_concurrently_and_each_one_call_at_a_time(client, browser):
    sid = browser.session_id
    nap = "const t0 = Date.now(); await new Promise(r => setTimeout(r, 1500)); return [t0, Date.now()]"
    for name in ("left", "right"):  # warm: each executor's process is started once
        execute(client, sid, "return 1", executor=name)

    def run_all(names: list[str]) -> tuple[float, list[dict]]:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            answers = list(pool.map(lambda name: execute(client, sid, nap, executor=name), names))
        return time.monotonic() - started, answers

    elapsed, answers = run_all(["left", "right"])
    assert all(answer["success"] for answer in answers), answers
    assert elapsed < 2.7, f"two executors took {elapsed:.2f} s: they did not run at once"
    elapsed, answers = run_all(["left", "left"])
    (start_a, end_a), (start_b, end_b) = sorted(answer["result"] for answer in answers)
    assert start_b >= end_a and elapsed >= 3.0, "calls on one executor overlapped"
    for name in ("left", "right"):
        delete_executor(client, sid, name)


def test_failures_are_answered_with_the_error(client, browser):
    sid = browser.session_id
    thrown = execute(client, sid, "console.error('about to fail'); throw new Error('boom at step 3')")
    assert thrown["success"] is False and "boom at step 3" in thrown["error"]
    assert "about to fail" in thrown["stderr"]
    syntax = execute(client, sid, "return (1 +")
    assert syntax["success"] is False and "SyntaxError" in syntax["error"]
    assert execute(client, sid, "return 2 + 2")["result"] == 4


def test_a_call_past_its_timeout_is_stopped_and_the_executor_goes_on(client, browser):
    sid = browser.session_id
    started = time.monotonic()
    answer = execute(client, sid, "await new Promise(r => setTimeout(r, 30000)); return 'late'",
                     executor="slow", timeout_sec=1)
    assert answer["success"] is False and "timed out" in answer["error"]
    assert time.monotonic() - started < 5
    # Same process (its state stays), with a new browser connection.
    assert execute(client, sid, "globalThis.kept = 'yes'; return await page.evaluate(() => 1 + 1)",
                   executor="slow")["result"] == 2
    # A blocked event loop cannot even answer: the agent stops the process, and the next
    # call runs on a new one.
    started = time.monotonic()
    blocked = execute(client, sid, "while (true) {}", executor="slow", timeout_sec=1)
    assert blocked["success"] is False and "blocked" in blocked["error"], blocked
    assert time.monotonic() - started < 8
    assert execute(client, sid, "return typeof globalThis.kept", executor="slow")["result"] == "undefined"
    delete_executor(client, sid, "slow")


def test_deleting_an_executor_ends_its_running_call(client, browser):
    sid = browser.session_id
    execute(client, sid, "return 1", executor="doomed")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(execute, client, sid, "await new Promise(r => setTimeout(r, 20000))",
                              executor="doomed")
        time.sleep(1)
        assert [e["busy"] for e in executors(client, sid) if e["name"] == "doomed"] == [True]
        delete_executor(client, sid, "doomed")
        answer = running.result(timeout=10)
    assert answer["success"] is False and "deleted" in answer["error"]


def test_at_most_eight_named_executors(client, browser):
    sid = browser.session_id
    names = [f"e{index}" for index in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda name: execute(client, sid, "return 1", executor=name), names))
    with pytest.raises(kernel.ConflictError) as refused:
        execute(client, sid, "return 1", executor="ninth")
    assert "e0" in str(refused.value)
    for name in names:
        delete_executor(client, sid, name, close_tab=True)


def test_bad_input_is_a_400_and_another_organization_gets_404(client, browser, control_plane):
    sid = browser.session_id
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    url = f"{control_plane.base_url}/browsers/{sid}/playwright/execute"
    for body, needle in [({}, "code"),
                         ({"code": ""}, "code"),
                         ({"code": "return 1", "executor": "no spaces"}, "executor"),
                         ({"code": "return 1", "timeout_sec": 0}, "timeout_sec"),
                         ({"code": "return 1", "surprise": True}, "surprise")]:
        answer = httpx.post(url, json=body, headers=headers, timeout=10)
        assert answer.status_code == 400, (body, answer.text)
        assert needle in json.dumps(answer.json()), (body, answer.text)
    missing = httpx.delete(f"{control_plane.base_url}/browsers/{sid}/playwright/executors/nobody",
                           headers=headers, timeout=10)
    assert missing.status_code == 404 and "nobody" in missing.json()["message"]
    other = Kernel(api_key=control_plane.create_api_key("org-playwright-b"), base_url=control_plane.base_url,
                   max_retries=0)
    for call in (lambda: execute(other, sid, "return 1"),
                 lambda: executors(other, sid),
                 lambda: delete_executor(other, sid, "default")):
        with pytest.raises(kernel.NotFoundError):
            call()
