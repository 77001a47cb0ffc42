"""Apps from other sources and languages: a TypeScript app (ZIP upload, compiled as it
loads, with the official `@onkernel/sdk`), and the same app fetched with git from a
repository the test serves (a private one: the token is required)."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import shutil
import subprocess

import kernel
import pytest

from apps_kit import APPS, app_processes_left, follow, zip_of
from conftest import TEST_PAGE_TITLE
from harness import serve

TOKEN = "ghp_e2e-token-5150"


def ts_files() -> dict[str, str]:
    root = APPS / "ts_app"
    return {str(path.relative_to(root)): path.read_text()
            for path in root.rglob("*") if path.is_file()}


class PrivateRepository(http.server.SimpleHTTPRequestHandler):
    """Serves a bare repository over git's dumb HTTP protocol, to holders of the token."""

    seen_authorization: list[str] = []

    def do_GET(self):
        given = self.headers.get("Authorization", "")
        self.seen_authorization.append(given)
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        if given != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="repo"')
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The TypeScript app under `apps/ts` of a repository on branch `main`, served on
    loopback; yields its URL."""
    work = tmp_path_factory.mktemp("repo")
    source = work / "source"
    shutil.copytree(APPS / "ts_app", source / "apps" / "ts")
    (source / "README.md").write_text("not the app\n")
    git = ["git", "-c", "user.email=e2e@example.com", "-c", "user.name=e2e"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(source)], check=True)
    subprocess.run([*git, "-C", str(source), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(source), "commit", "-q", "-m", "app"], check=True)
    served = work / "served"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(served / "app.git")], check=True)
    subprocess.run(["git", "-C", str(served / "app.git"), "update-server-info"], check=True)
    handler = functools.partial(PrivateRepository, directory=str(served))
    server = serve(handler)
    yield f"http://127.0.0.1:{server.server_address[1]}/app.git"
    server.shutdown()


def test_a_typescript_app_deploys_and_its_actions_run(client, test_page_url):
    created = client.deployments.create(
        file=("ts.zip", zip_of(ts_files()), "application/zip"),
        entrypoint_rel_path="src/index.ts",
        version="ts-1",
    )
    events = follow(client.deployments.follow(created.id))
    assert events[-1]["deployment"]["status"] == "running", events[-3:]
    logs = "\n".join(e["message"] for e in events if e["event"] == "log")
    assert "added 1 package" in logs, logs
    apps = [a for a in client.apps.list() if a.app_name == "e2e-typescript"]
    assert [sorted(a.name for a in app.actions) for app in apps] == [["fail", "page-title"]]

    result = client.invocations.create(
        app_name="e2e-typescript", action_name="page-title", version="ts-1",
        payload=json.dumps({"url": test_page_url}),
    )
    assert result.status == "succeeded", result.output
    assert json.loads(result.output) == {"title": TEST_PAGE_TITLE, "invocation_id": result.id}
    assert client.invocations.list_browsers(result.id).browsers == []

    failed = client.invocations.create(app_name="e2e-typescript", action_name="fail", version="ts-1")
    assert failed.status == "failed"
    assert "Error: typescript says no" in failed.output and "index.ts" in failed.output
    assert "typescript says no" not in failed.status_reason
    assert app_processes_left() == []


def test_an_app_is_fetched_from_a_private_git_repository(client, repository, test_page_url):
    PrivateRepository.seen_authorization.clear()
    created = client.deployments.create(
        source={
            "type": "github", "url": repository, "ref": "main", "path": "apps/ts",
            "entrypoint": "src/index.ts",
            "auth": {"method": "github_token", "token": TOKEN},
        },
        version="git-1",
    )
    assert created.source_type == "github" and created.source_url == repository
    events = follow(client.deployments.follow(created.id))
    final = events[-1]["deployment"]
    assert final["status"] == "running", [e.get("message") for e in events]
    assert final["source_ref"] == "main" and final["source_path"] == "apps/ts"
    assert len(final["source_checksum"]) == 64
    assert PrivateRepository.seen_authorization and all(PrivateRepository.seen_authorization)
    # The token is never returned.
    assert TOKEN not in json.dumps(events)
    assert TOKEN not in client.deployments.retrieve(created.id).to_json()

    result = client.invocations.create(
        app_name="e2e-typescript", action_name="page-title", version="git-1",
        payload=json.dumps({"url": test_page_url}),
    )
    assert result.status == "succeeded", result.output
    assert json.loads(result.output)["title"] == TEST_PAGE_TITLE


def test_a_wrong_token_or_ref_fails_with_gits_words(client, repository):
    for source, words in [
        ({"ref": "main", "auth": {"method": "github_token", "token": "wrong"}}, "fatal:"),
        ({"ref": "no-such-branch"}, "no-such-branch"),
    ]:
        created = client.deployments.create(
            source={"type": "github", "url": repository, "entrypoint": "apps/ts/src/index.ts",
                    **source},
            version="git-bad",
        )
        events = follow(client.deployments.follow(created.id))
        assert events[-1]["deployment"]["status"] == "failed"
        logs = "\n".join(e["message"] for e in events if e["event"] == "log")
        assert words in logs, logs
    for bad in [
        {"type": "github", "url": "file:///etc", "ref": "main", "entrypoint": "a.py"},
        {"type": "github", "url": repository.replace("http://", f"http://x:{TOKEN}@"),
         "ref": "main", "entrypoint": "a.py"},
        {"type": "github", "url": repository, "ref": "--upload-pack=x", "entrypoint": "a.py"},
        {"type": "github", "url": repository, "ref": "main", "entrypoint": "a.py", "path": "../x"},
        {"type": "gitlab", "url": repository, "ref": "main", "entrypoint": "a.py"},
    ]:
        with pytest.raises(kernel.BadRequestError):
            client.deployments.create(source=bad, version="git-bad")
    with pytest.raises(kernel.BadRequestError):
        client.deployments.create(
            source={"type": "github", "url": repository, "ref": "main", "entrypoint": "a.py"},
            file=("a.zip", zip_of({"a.py": ""}), "application/zip"), entrypoint_rel_path="a.py",
        )
