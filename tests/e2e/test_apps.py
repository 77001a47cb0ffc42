"""Apps as code: deployments of a Python app (ZIP upload), its actions invoked by name in
sandboxes of their own, with a short-lived key; builds and invocations followed as
events. Real parts: the control plane, bubblewrap sandboxes, pip from the registry, real
browsers the actions create, and the official SDK on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import kernel
import pytest
from kernel import Kernel

from apps_kit import app_processes_left, follow, python_app, zip_of
from conftest import TEST_PAGE_TITLE
from harness import control_plane_for_module, wait_until
from sdk import once

GREETING = "bonjour-7f3a9c"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(
        tmp_path_factory, extra_args=["--max-running-invocations", "3"]
    )


@pytest.fixture(scope="module")
def client(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)


@pytest.fixture(scope="module")
def deployed(client):
    """The Python app, deployed at version 1, with its build's events."""
    created = client.deployments.create(
        file=("app.zip", python_app(), "application/zip"),
        entrypoint_rel_path="main.py",
        version="1",
        env_vars={"GREETING": GREETING},
    )
    assert created.status == "queued"
    events = follow(client.deployments.follow(created.id))
    return created, events


def invoke(client, action: str, payload=None, **options):
    return client.invocations.create(
        app_name="e2e-python", action_name=action, version="1",
        payload=json.dumps(payload) if payload is not None else kernel.omit, **options,
    )


def test_a_zip_deploys_and_its_build_is_followed(client, deployed):
    created, events = deployed
    kinds = [event["event"] for event in events if event["event"] != "sse_heartbeat"]
    states = [e["deployment"]["status"] for e in events if e["event"] == "deployment_state"]
    assert states[0] == "queued" and states[-2:] == ["in_progress", "running"][-2:], states
    assert kinds[-1] == "deployment_state" and states[-1] == "running"
    logs = "\n".join(e["message"] for e in events if e["event"] == "log")
    assert "Successfully installed" in logs and "kernel-0.131.0" in logs, logs[-2000:]
    summary = next(e for e in events if e["event"] == "app_version_summary")
    assert summary["app_name"] == "e2e-python" and summary["version"] == "1"
    assert {a["name"] for a in summary["actions"]} >= {"hello", "page-title", "sleepy", "boom"}

    deployment = client.deployments.retrieve(created.id)
    assert deployment.status == "running" and deployment.source_type == "file"
    assert deployment.env_vars == {"GREETING": ""}
    assert len(deployment.source_checksum or "") == 64
    apps = [app for app in client.apps.list() if app.app_name == "e2e-python"]
    assert len(apps) == 1 and apps[0].version == "1" and apps[0].deployment == created.id
    assert apps[0].env_vars == {"GREETING": ""}
    assert {a.name for a in apps[0].actions} >= {"hello", "page-title"}
    assert [d.id for d in client.deployments.list(app_name="e2e-python")] == [created.id]
    assert list(client.deployments.list(app_name="nope")) == []


def test_a_synchronous_invocation_answers_the_actions_output(client, deployed):
    result = invoke(client, "hello", {"name": "Ada"})
    assert result.status == "succeeded", result
    output = json.loads(result.output)
    # The deployment's variable reaches the action (and only it).
    assert output == {"greeting": f"{GREETING} Ada", "invocation_id": result.id}
    again = client.invocations.retrieve(result.id)
    assert again.status == "succeeded" and again.finished_at and again.payload == '{"name": "Ada"}'
    events = follow(client.invocations.follow(result.id))
    assert f"hello from {result.id}" in [e.get("message") for e in events]
    assert events[-1]["event"] == "invocation_state"
    assert events[-1]["invocation"]["status"] == "succeeded"


def test_an_action_drives_a_browser_that_ends_with_it(client, deployed, test_page_url):
    result = invoke(client, "page-title", {"url": test_page_url})
    assert result.status == "succeeded", result
    output = json.loads(result.output)
    assert output["title"] == TEST_PAGE_TITLE, output
    # The browser carried the invocation, and ended with it.
    assert output["listed"] == [output["session_id"]]
    assert client.invocations.list_browsers(result.id).browsers == []
    live = [b.session_id for b in client.browsers.list()]
    assert output["session_id"] not in live
    assert app_processes_left() == []


@once
def test_an_async_invocation_times_out_and_its_browsers_end(client, deployed):
    queued = invoke(client, "sleepy", {"seconds": 300}, async_=True, async_timeout_seconds=10)
    assert queued.status == "queued"
    # Its browser starts, and is listed as the invocation's.
    assert wait_until(lambda: len(client.invocations.list_browsers(queued.id).browsers) == 1, 30)
    session_id = client.invocations.list_browsers(queued.id).browsers[0].session_id
    events = follow(client.invocations.follow(queued.id))
    states = [e["invocation"]["status"] for e in events if e["event"] == "invocation_state"]
    assert states == ["queued", "running", "failed"], states
    assert any("started " + session_id in (e.get("message") or "") for e in events)
    final = client.invocations.retrieve(queued.id)
    assert final.status == "failed" and "timed out after 10 seconds" in final.status_reason
    assert client.invocations.list_browsers(queued.id).browsers == []
    assert session_id not in [b.session_id for b in client.browsers.list()]
    assert wait_until(lambda: app_processes_left() == [], 10), app_processes_left()


def test_a_failing_action_gives_its_traceback_and_a_generic_reason(client, deployed):
    result = invoke(client, "boom")
    assert result.status == "failed"
    assert "Traceback" in result.output and "ValueError: the secret sauce is 42" in result.output
    assert result.status_reason and "secret sauce" not in result.status_reason


def test_an_action_can_be_ended_and_the_first_end_wins(client, deployed):
    queued = invoke(client, "sleepy", {"seconds": 300}, async_=True, async_timeout_seconds=600)
    assert wait_until(lambda: client.invocations.retrieve(queued.id).status == "running", 30)
    ended = client.invocations.update(queued.id, status="failed", output='"stopped by the test"')
    assert ended.status == "failed" and ended.output == '"stopped by the test"'
    with pytest.raises(kernel.ConflictError):
        client.invocations.update(queued.id, status="succeeded")
    assert client.invocations.retrieve(queued.id).status == "failed"
    assert wait_until(lambda: app_processes_left() == [], 10), app_processes_left()
    assert wait_until(lambda: client.invocations.list_browsers(queued.id).browsers == [], 10)


@once
@pytest.mark.parametrize("action", ["hog", "memfd_hog"])
def test_an_action_past_its_memory_limit_fails_saying_so(client, deployed, action):
    # Mapped memory, or a memfd no process maps (which only the run's control group sees).
    result = invoke(client, action)
    assert result.status == "failed"
    assert "more memory than its limit" in result.status_reason, result.status_reason
    assert app_processes_left() == []


@once
def test_the_apps_variables_reach_only_the_action_not_the_sandboxes_starter(client, deployed):
    """bubblewrap runs on the host before any namespace exists: the app's variables (an
    LD_PRELOAD of its own, say) must never be in its environment."""
    queued = invoke(client, "sleepy", {"seconds": 300}, async_=True)
    try:
        assert wait_until(lambda: client.invocations.retrieve(queued.id).status == "running", 30)
        assert wait_until(lambda: len(client.invocations.list_browsers(queued.id).browsers) == 1, 30)
        environments = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if any(b"/run/app/boot.py" in part for part in command):
                environments[Path(command[0].decode()).name] = environ
        assert "bwrap" in environments and "browser-agent" in environments, environments.keys()
        assert GREETING.encode() not in environments["bwrap"]
        assert GREETING.encode() not in environments["browser-agent"]
        assert b"ik_" not in environments["bwrap"]
        assert any(GREETING.encode() in environ for name, environ in environments.items()
                   if name.startswith("python")), environments.keys()
    finally:
        client.invocations.update(queued.id, status="failed")
    assert wait_until(lambda: app_processes_left() == [], 10), app_processes_left()


@once
def test_concurrent_builds_are_limited_per_organization(client):
    broken = ("broken.zip", python_app("no-such-package-e2e-2718==1.0\n"), "application/zip")
    building = [client.deployments.create(file=broken, entrypoint_rel_path="main.py",
                                          version=f"limit-{n}") for n in range(2)]
    with pytest.raises(kernel.RateLimitError):
        client.deployments.create(file=broken, entrypoint_rel_path="main.py", version="limit-3")
    for deployment in building:
        assert follow(client.deployments.follow(deployment.id))[-1]["deployment"]["status"] == "failed"


@once
def test_concurrent_invocations_are_limited_per_organization(client, deployed):
    running = [invoke(client, "sleepy", {"seconds": 300}, async_=True) for _ in range(3)]
    with pytest.raises(kernel.RateLimitError):
        invoke(client, "hello", {"name": "late"})
    for invocation in running:
        client.invocations.update(invocation.id, status="failed")
    assert wait_until(lambda: app_processes_left() == [], 10), app_processes_left()
    assert invoke(client, "hello", {"name": "again"}).status == "succeeded"


@once
def test_a_deployment_whose_dependencies_do_not_install_fails_with_the_installers_words(client):
    created = client.deployments.create(
        file=("broken.zip", python_app("no-such-package-e2e-3141==9.9\n"), "application/zip"),
        entrypoint_rel_path="main.py",
        version="broken",
    )
    events = follow(client.deployments.follow(created.id))
    assert events[-1]["event"] == "deployment_state"
    assert events[-1]["deployment"]["status"] == "failed"
    logs = "\n".join(e["message"] for e in events if e["event"] == "log")
    assert "No matching distribution found for no-such-package-e2e-3141" in logs, logs[-2000:]
    failed = client.deployments.retrieve(created.id)
    assert failed.status == "failed" and "build failed" in failed.status_reason
    assert [a for a in client.apps.list() if a.version == "broken"] == []


@once
def test_an_entrypoint_that_raises_fails_the_build(client):
    created = client.deployments.create(
        file=("raises.zip", zip_of({"main.py": "import kernel\nraise RuntimeError('nope at import')\n",
                                    "requirements.txt": "kernel==0.131.0\n"}), "application/zip"),
        entrypoint_rel_path="main.py", version="raises",
    )
    events = follow(client.deployments.follow(created.id))
    assert events[-1]["deployment"]["status"] == "failed"
    assert "nope at import" in events[-1]["deployment"]["status_reason"]


def test_redeploying_a_version_needs_force(client, deployed):
    again = client.deployments.create(
        file=("app.zip", python_app(), "application/zip"),
        entrypoint_rel_path="main.py", version="2",
    )
    assert follow(client.deployments.follow(again.id))[-1]["deployment"]["status"] == "running"
    same = client.deployments.create(
        file=("app.zip", python_app(), "application/zip"),
        entrypoint_rel_path="main.py", version="2",
    )
    events = follow(client.deployments.follow(same.id))
    final = events[-1]["deployment"]
    # On failure, the events hold the build's output.
    assert final["status"] == "failed" and "force" in final["status_reason"], events
    forced = client.deployments.create(
        file=("app.zip", python_app(), "application/zip"),
        entrypoint_rel_path="main.py", version="2", force=True,
    )
    assert follow(client.deployments.follow(forced.id))[-1]["deployment"]["status"] == "running"
    assert client.deployments.retrieve(again.id).status == "stopped"
    apps = [a for a in client.apps.list() if a.version == "2"]
    assert [a.deployment for a in apps] == [forced.id]
    # Deleting a deployment unpublishes its apps.
    client.deployments.delete(forced.id)
    with pytest.raises(kernel.NotFoundError):
        client.deployments.retrieve(forced.id)
    with pytest.raises(kernel.NotFoundError):
        client.invocations.create(app_name="e2e-python", action_name="hello", version="2")


@once
def test_actions_are_confined_and_their_keys_die_with_them(client, control_plane, deployed):
    paths = [
        "/etc/shadow",
        "/root",
        str(control_plane.data_dir),
        str(control_plane.data_dir / "control-plane.db"),
        # Where every deployment's files are: only its own are mounted, at /app.
        str(control_plane.data_dir / "apps" / "deployments"),
    ]
    result = invoke(client, "snoop", {"paths": paths})
    assert result.status == "succeeded", result.output
    seen = json.loads(result.output)
    assert seen["uid"] == 1000
    for path in paths:
        assert str(seen[path]).startswith("error:"), (path, seen[path])
    # Its root shows no host directories beyond the system's.
    assert "root" not in seen["root"] and "work" not in seen["root"]
    # Its own PID namespace: the sandbox's starter, the loader, nothing of the host.
    assert len(seen["processes"]) <= 3, seen["processes"]
    # The key worked only while the invocation ran.
    stale = Kernel(api_key=seen["key"], base_url=control_plane.base_url, max_retries=0)
    with pytest.raises(kernel.AuthenticationError):
        stale.browsers.list()
    assert invoke(client, "write-app").output == '"error: OSError"'


def test_organizations_see_only_their_own_apps(client, control_plane, deployed, test_page_url):
    created, _ = deployed
    other = Kernel(api_key=control_plane.create_api_key("apps-other"),
                   base_url=control_plane.base_url, max_retries=0)
    assert list(other.apps.list()) == []
    assert list(other.deployments.list()) == []
    with pytest.raises(kernel.NotFoundError):
        other.deployments.retrieve(created.id)
    with pytest.raises(kernel.NotFoundError):
        other.invocations.create(app_name="e2e-python", action_name="hello", version="1")
    mine = invoke(client, "hello", {"name": "x"})
    with pytest.raises(kernel.NotFoundError):
        other.invocations.retrieve(mine.id)
    with pytest.raises(kernel.NotFoundError):
        other.invocations.update(mine.id, status="failed")
    with pytest.raises(kernel.NotFoundError):
        other.invocations.list_browsers(mine.id)
    with pytest.raises(kernel.NotFoundError):
        other.invocations.delete_browsers(mine.id)
    with pytest.raises(kernel.NotFoundError):
        follow(other.invocations.follow(mine.id))
    with pytest.raises(kernel.NotFoundError):
        follow(other.deployments.follow(created.id))
    assert [i.id for i in other.invocations.list()] == []
    with pytest.raises(kernel.NotFoundError):
        other.deployments.delete(created.id)
    # An action's key cannot reach another organization's browser.
    foreign = other.browsers.create(headless=True)
    try:
        reached = invoke(client, "other-org", {"session_id": foreign.session_id})
        assert reached.output == '"not found"'
    finally:
        other.browsers.delete_by_id(foreign.session_id)


def test_env_var_values_never_come_back(client, control_plane, deployed):
    created, events = deployed
    answers = [
        httpx.get(f"{control_plane.base_url}{path}",
                  headers={"Authorization": f"Bearer {control_plane.api_key}"}).text
        for path in ["/deployments", f"/deployments/{created.id}", "/apps",
                     f"/deployments/{created.id}/events"]
    ]
    assert all(GREETING not in answer for answer in answers)
    assert GREETING not in json.dumps(events)


def test_bad_input_is_refused_clearly(client, control_plane):
    app = ("app.zip", python_app(), "application/zip")
    bad = [
        dict(entrypoint_rel_path="main.py"),  # no file
        dict(file=app),  # no entrypoint
        dict(file=app, entrypoint_rel_path="main.rb"),
        dict(file=app, entrypoint_rel_path="../main.py"),
        dict(file=app, entrypoint_rel_path="missing.py"),
        dict(file=app, entrypoint_rel_path="main.py", version="bad version"),
        dict(file=app, entrypoint_rel_path="main.py", env_vars={"KERNEL_API_KEY": "x"}),
        dict(file=app, entrypoint_rel_path="main.py", env_vars={"1BAD": "x"}),
        dict(file=("x.zip", b"not a zip", "application/zip"), entrypoint_rel_path="main.py"),
    ]
    for options in bad:
        with pytest.raises(kernel.BadRequestError):
            client.deployments.create(**options)
    with pytest.raises(kernel.BadRequestError):
        client.invocations.create(app_name="e2e-python", action_name="hello", version="1",
                                  payload="{not json")
    with pytest.raises(kernel.BadRequestError):
        client.invocations.create(app_name="e2e-python", action_name="hello", version="1",
                                  async_=True, async_timeout_seconds=5)
    with pytest.raises(kernel.NotFoundError):
        client.invocations.create(app_name="nope", action_name="hello", version="1")
    with pytest.raises(kernel.NotFoundError):
        client.invocations.retrieve("inv_nope")
    with pytest.raises(kernel.BadRequestError):
        client.invocations.list(status="sleeping")
    with pytest.raises(kernel.BadRequestError):
        client.deployments.follow("dep_x", since="yesterday")
    # Nothing half-written is left: no deployment came of the refused requests.
    assert all(d.status != "queued" for d in client.deployments.list())
