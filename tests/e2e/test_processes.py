"""Processes in the browser's VM (`/browsers/{id}/process/exec`): commands run inside the
VM's sandbox, as its user or as a root that is root only in a namespace of its own, with
the VM's environment and way out, bounded in time."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time

import httpx
import kernel
import pytest
from kernel import Kernel

from harness import wait_until
from sdk import SEED_ERA


def exec_in(client: Kernel, session_id: str, **body) -> dict:
    """`browsers.process.exec` today; the seed-era SDK has no such method, so it sends the
    request through the client's generic `post`."""
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/process/exec", body=body, cast_to=object)
    return client.browsers.process.exec(session_id, **body).to_dict(mode="json")


def out(result: dict, stream: str = "stdout") -> str:
    return base64.b64decode(result[f"{stream}_b64"]).decode()


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300)
    yield session
    client.browsers.delete_by_id(session.session_id)


def test_exec_runs_in_the_vm_as_its_user_and_answers_output_and_exit_code(client, browser):
    sid = browser.session_id
    who = exec_in(client, sid, command="id", args=["-u"])
    assert (who["exit_code"], out(who)) == (0, "1000\n")
    host = exec_in(client, sid, command="cat /etc/hostname")
    assert out(host) == "browser-vm\n" != socket.gethostname() + "\n"
    failed = exec_in(client, sid, command="echo to-stderr >&2; exit 7")
    assert (failed["exit_code"], out(failed, "stderr")) == (7, "to-stderr\n")
    assert failed["duration_ms"] >= 0
    # The VM's environment: its home (the filesystem API's /), display and way out.
    env = exec_in(client, sid, command="pwd; echo $HOME; echo $DISPLAY; echo $HTTPS_PROXY",
                  env={"EXTRA": "x"})
    cwd, home, display, proxy = out(env).splitlines()
    assert cwd == home == "/home/kernel" and display.startswith(":") and proxy.startswith("http://127.0.0.1:")
    exec_in(client, sid, command="echo written-by-exec > note.txt")
    assert client.browsers.fs.read_file(sid, path="/note.txt").read() == b"written-by-exec\n"
    assert out(exec_in(client, sid, command="echo $EXTRA", env={"EXTRA": "given"})) == "given\n"
    # Nothing of the agent's own environment.
    assert "BROWSER_AGENT" not in out(exec_in(client, sid, command="env"))


def test_tools_reach_the_web_through_the_browsers_egress(client, browser, test_page_url):
    fetched = exec_in(client, browser.session_id, command="python3", args=[
        "-c", f"import urllib.request; print(urllib.request.urlopen({test_page_url!r}).read().decode())"])
    assert fetched["exit_code"] == 0, out(fetched, "stderr")
    assert "<h1>hello</h1>" in out(fetched)


def test_a_command_past_its_timeout_is_killed_with_its_group(client, browser):
    sid = browser.session_id
    result = exec_in(client, sid, command="(sleep 3; touch late-child) & sleep 60", timeout_sec=1)
    assert result["exit_code"] == 137 and result.get("timed_out") is True
    assert result["duration_ms"] < 3000
    time.sleep(3.5)
    assert exec_in(client, sid, command="test -e late-child")["exit_code"] == 1, "the child died with it"


def test_as_root_is_root_in_the_vm_only(client, browser, control_plane):
    sid = browser.session_id
    assert out(exec_in(client, sid, command="id -u", as_root=True)) == "0\n"
    assert out(exec_in(client, sid, command="id -u", as_user="root")) == "0\n"
    # The host's secrets and processes stay out of reach.
    shadow = exec_in(client, sid, command="cat /etc/shadow", as_root=True)
    assert shadow["exit_code"] != 0 and out(shadow) == ""
    host_pid = control_plane.process.pid
    kill = exec_in(client, sid, command=f"kill -9 {host_pid}", as_root=True)
    assert kill["exit_code"] != 0
    assert control_plane.process.poll() is None, "the control plane lives"
    os.kill(host_pid, 0)
    # The host's system files are read-only even to this root.
    assert exec_in(client, sid, command="touch /usr/bin/planted", as_root=True)["exit_code"] != 0
    assert not os.path.exists("/usr/bin/planted")


def test_bad_input_is_a_400_and_another_organization_gets_404(client, browser, control_plane):
    sid = browser.session_id
    for body, needle in [({"command": ""}, "command"),
                         ({"command": "true", "as_user": "alice"}, "as_user"),
                         ({"command": "true", "timeout_sec": 0}, "timeout_sec"),
                         ({"command": "true", "cwd": "relative/dir"}, "cwd"),
                         ({"command": "true", "cwd": "/no/such/dir"}, "cwd"),
                         ({"command": "/no/such/program", "args": ["x"]}, "cannot run"),
                         ({"command": "true", "env": {"A=B": "x"}}, "env"),
                         ({"command": "true", "unknown": 1}, "unknown")]:
        with pytest.raises(kernel.BadRequestError) as bad:
            client.post(f"/browsers/{sid}/process/exec", body=body, cast_to=object)
        text = bad.value.body["message"] + " ".join(d["message"] for d in bad.value.body.get("details") or [])
        assert needle in text, (body, bad.value.body)
    other = Kernel(api_key=control_plane.create_api_key("org-processes-b"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        exec_in(other, sid, command="id")
    with pytest.raises(kernel.NotFoundError):
        exec_in(client, "no-such-browser", command="id")


class Output:
    """Follows a spawned process's `stdout/stream` in the background."""

    def __init__(self, control_plane, session_id: str, process_id: str):
        self.events: list[dict] = []
        url = f"{control_plane.base_url}/browsers/{session_id}/process/{process_id}/stdout/stream"
        headers = {"Authorization": f"Bearer {control_plane.api_key}"}

        def follow():
            with httpx.stream("GET", url, headers=headers, timeout=60) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))

        self.thread = threading.Thread(target=follow, daemon=True)
        self.thread.start()

    def text(self, stream: str = "stdout") -> str:
        return "".join(base64.b64decode(e["data_b64"]).decode(errors="replace")
                       for e in list(self.events) if e.get("stream") == stream)

    def exit_code(self):
        return next((e["exit_code"] for e in list(self.events) if e.get("event") == "exit"), None)


def spawn(client: Kernel, session_id: str, **body) -> dict:
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/process/spawn", body=body, cast_to=object)
    return client.browsers.process.spawn(session_id, **body).to_dict(mode="json")


def status(client: Kernel, session_id: str, process_id: str) -> dict:
    if SEED_ERA:
        return client.get(f"/browsers/{session_id}/process/{process_id}/status", cast_to=object)
    return client.browsers.process.status(process_id, id_or_name=session_id).to_dict(mode="json")


def stdin(client: Kernel, session_id: str, process_id: str, text: str) -> dict:
    data = base64.b64encode(text.encode()).decode()
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/process/{process_id}/stdin", body={"data_b64": data},
                           cast_to=object)
    return client.browsers.process.stdin(process_id, id_or_name=session_id, data_b64=data).to_dict(mode="json")


def kill(client: Kernel, session_id: str, process_id: str, signal: str) -> dict:
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/process/{process_id}/kill", body={"signal": signal},
                           cast_to=object)
    return client.browsers.process.kill(process_id, id_or_name=session_id, signal=signal).to_dict(mode="json")


def resize(client: Kernel, session_id: str, process_id: str, cols: int, rows: int) -> dict:
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/process/{process_id}/resize",
                           body={"cols": cols, "rows": rows}, cast_to=object)
    return client.browsers.process.resize(process_id, id_or_name=session_id, cols=cols,
                                          rows=rows).to_dict(mode="json")


def test_a_spawned_process_takes_input_streams_output_and_dies_by_signal(client, control_plane, browser):
    sid = browser.session_id
    started = spawn(client, sid, command="cat; echo done >&2")
    assert started["process_id"] and started["pid"] > 1
    pid = started["process_id"]
    running = status(client, sid, pid)
    assert running["state"] == "running" and running.get("exit_code") is None and running["mem_bytes"] > 0
    output = Output(control_plane, sid, pid)
    assert stdin(client, sid, pid, "hello\n")["written_bytes"] == 6
    assert wait_until(lambda: output.text() == "hello\n", 5), output.events
    assert kill(client, sid, pid, "TERM") == {"ok": True}
    # The whole group got it: cat and the shell around it.
    assert wait_until(lambda: output.exit_code() is not None, 5), output.events
    assert output.exit_code() == 143 and "done" not in output.text("stderr")
    ended = status(client, sid, pid)
    assert (ended["state"], ended["exit_code"]) == ("exited", 143)
    # A late reader gets what it wrote, then the exit.
    late = Output(control_plane, sid, pid)
    late.thread.join(10)
    assert late.text() == "hello\n" and late.exit_code() == 143
    # An ended process takes no more input or signals.
    for call_ in (lambda: stdin(client, sid, pid, "more"), lambda: kill(client, sid, pid, "KILL")):
        with pytest.raises(kernel.BadRequestError):
            call_()


def test_a_terminal_is_a_real_tty_and_follows_resizes(client, control_plane, browser):
    sid = browser.session_id
    pid = spawn(client, sid, command="/bin/sh", args=["-i"], allocate_tty=True, cols=80, rows=24)["process_id"]
    output = Output(control_plane, sid, pid)
    stdin(client, sid, pid, "stty size; tty\n")
    assert wait_until(lambda: "24 80" in output.text() and "/dev/pts/" in output.text(), 5), output.text()
    assert resize(client, sid, pid, 120, 40) == {"ok": True}
    stdin(client, sid, pid, "stty size; exit 5\n")
    assert wait_until(lambda: output.exit_code() is not None, 5), output.text()
    assert "40 120" in output.text() and output.exit_code() == 5


def test_a_spawned_process_past_its_timeout_is_killed(client, browser):
    sid = browser.session_id
    pid = spawn(client, sid, command="sleep 30", timeout_sec=1)["process_id"]
    assert wait_until(lambda: status(client, sid, pid)["state"] == "exited", 5)
    assert status(client, sid, pid)["exit_code"] == 137


def test_bad_process_calls_are_clear(client, control_plane, browser):
    sid = browser.session_id
    pid = spawn(client, sid, command="sleep 30")["process_id"]
    try:
        for path, body, needle in [(f"{pid}/kill", {"signal": "STOP"}, "signal"),
                                   (f"{pid}/resize", {"cols": 80, "rows": 24}, "no terminal"),
                                   (f"{pid}/resize", {"cols": 0, "rows": 24}, "cols"),
                                   (f"{pid}/stdin", {"data_b64": "not base64!"}, "base64"),
                                   ("spawn", {"command": "true", "cols": 5000}, "cols")]:
            with pytest.raises(kernel.BadRequestError) as bad:
                client.post(f"/browsers/{sid}/process/{path}", body=body, cast_to=object)
            text = bad.value.body["message"] + " ".join(d["message"] for d in bad.value.body.get("details") or [])
            assert needle in text, (path, body, bad.value.body)
        with pytest.raises(kernel.NotFoundError):
            status(client, sid, "proc_999999")
        other = Kernel(api_key=control_plane.create_api_key("org-processes-c"), base_url=control_plane.base_url,
                       max_retries=0)
        for call_ in (lambda: status(other, sid, pid), lambda: kill(other, sid, pid, "KILL"),
                      lambda: spawn(other, sid, command="id")):
            with pytest.raises(kernel.NotFoundError):
                call_()
    finally:
        kill(client, sid, pid, "KILL")
