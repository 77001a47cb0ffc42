"""Log streams of a browser's VM (`/browsers/{id}/logs/stream`): a file followed like
`tail -f`, and the logs of the VM's own services (Chromium, the agent)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import kernel
import pytest
from kernel import Kernel

from harness import wait_until
from sdk import SEED_ERA


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300)
    yield session
    client.browsers.delete_by_id(session.session_id)


def read_log(client: Kernel, control_plane, session_id: str, **query) -> list[dict]:
    """Every event of a stream that ends by itself (no `follow`)."""
    if not SEED_ERA:
        return [e.to_dict(mode="json") for e in client.browsers.logs.stream(session_id, **query)]
    answer = httpx.get(f"{control_plane.base_url}/browsers/{session_id}/logs/stream", params=query,
                       headers={"Authorization": f"Bearer {control_plane.api_key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]


def exec_in(client: Kernel, session_id: str, command: str) -> None:
    client.post(f"/browsers/{session_id}/process/exec", body={"command": command}, cast_to=object)


def test_a_followed_file_shows_each_appended_line_within_a_second(client, control_plane, browser):
    sid = browser.session_id
    exec_in(client, sid, "echo first > app.log")
    seen: list[tuple[float, str]] = []
    url = f"{control_plane.base_url}/browsers/{sid}/logs/stream"
    params = {"source": "path", "path": "/app.log", "follow": "true"}
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}

    def follow():
        with httpx.stream("GET", url, params=params, headers=headers, timeout=30) as answer:
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    assert event["event"] == "log" and event["timestamp"]
                    seen.append((time.monotonic(), event["message"]))

    threading.Thread(target=follow, daemon=True).start()
    assert wait_until(lambda: [m for _, m in seen] == ["first"], 5), seen
    for index in range(3):
        written = time.monotonic()
        exec_in(client, sid, f"echo appended-{index} >> app.log")
        assert wait_until(lambda: any(m == f"appended-{index}" for _, m in seen), 2), seen
        at = next(t for t, m in seen if m == f"appended-{index}")
        assert at - written < 1.0, at - written

    # Without follow the stream ends with the file.
    lines = [e["message"] for e in read_log(client, control_plane, sid, source="path", path="/app.log")]
    assert lines == ["first", "appended-0", "appended-1", "appended-2"]


def test_the_vms_services_logs_are_streamable(client, control_plane, browser):
    sid = browser.session_id
    chromium = [e["message"] for e in read_log(client, control_plane, sid, source="supervisor",
                                                supervisor_process="chromium")]
    assert any("DevTools listening on ws://" in line for line in chromium), chromium[:20]
    agent = [e["message"] for e in read_log(client, control_plane, sid, source="supervisor",
                                             supervisor_process="agent")]
    assert any("listening" in line for line in agent), agent[:20]


def test_bad_log_requests_are_clear_and_other_organizations_get_404(client, control_plane, browser):
    sid = browser.session_id
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    url = f"{control_plane.base_url}/browsers/{sid}/logs/stream"
    for params, status, needle in [({}, 400, "source"),
                                   ({"source": "files"}, 400, "source"),
                                   ({"source": "path"}, 400, "path is required"),
                                   ({"source": "supervisor"}, 400, "supervisor_process"),
                                   ({"source": "supervisor", "supervisor_process": "sshd"}, 400, "supervisor_process"),
                                   ({"source": "path", "path": "/no/such.log"}, 404, "no/such.log"),
                                   ({"source": "path", "path": "/../../etc/passwd"}, 400, ""),
                                   ({"source": "path", "path": "/x", "since": "1h"}, 400, "since")]:
        answer = httpx.get(url, params=params, headers=headers, timeout=10)
        assert answer.status_code == status, (params, answer.text)
        assert needle in answer.json()["message"] + json.dumps(answer.json().get("details")), (params, answer.text)
    other = Kernel(api_key=control_plane.create_api_key("org-logs-b"), base_url=control_plane.base_url, max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        other.get(f"/browsers/{sid}/logs/stream", options={"params": {"source": "supervisor",
                                                                       "supervisor_process": "agent"}},
                  cast_to=object)
