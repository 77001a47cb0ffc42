"""Every shell command the README and docs/ show a reader is run by a test, as printed
but for what a test must choose itself (ports, directories, the build profile). The table
below says which test runs each; a command the documents gain without a runner fails
`test_every_documented_command_has_a_test_that_runs_it`. The commands with no other home
are run here: the start script, the documented `serve` line and the project-key line."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading

import httpx
import pytest
from kernel import Kernel

from docs_kit import block_with, documented_commands
from harness import CONTROL_PLANE, REPO, ControlPlane, free_port, make_traversable, wait_until
from sdk import SEED_ERA, items

E2E = REPO / "tests" / "e2e"

# (the document, its command as a pattern) → the test that runs it, as `file::function`.
RUNNERS = {
    ("README.md", r"deploy/start\.sh"):
        "test_docs_commands.py::test_the_start_script_serves_with_the_embedded_defaults",
    ("docs/getting-started.md", r"deploy/start\.sh"):
        "test_docs_commands.py::test_the_start_script_serves_with_the_embedded_defaults",
    # What CI runs (.ci/run calls it): this very suite.
    ("README.md", r"deploy/test\.sh"): "test_docs_commands.py::test_every_documented_command_has_a_test_that_runs_it",
    ("docs/getting-started.md", r"deploy/test\.sh"):
        "test_docs_commands.py::test_every_documented_command_has_a_test_that_runs_it",
    ("README.md", r"target/release/control-plane serve .*"):
        "test_docs_commands.py::test_the_documented_serve_command_serves",
    ("docs/getting-started.md", r"target/release/control-plane api-keys create --org acme --data-dir ./data"):
        "test_docs_examples.py::test_the_command_that_makes_more_keys_makes_one_that_works",
    # The same line as Getting started's, which that test runs.
    ("docs/organizations/api-keys.md", r"target/release/control-plane api-keys create --org acme --data-dir ./data"):
        "test_docs_examples.py::test_the_command_that_makes_more_keys_makes_one_that_works",
    ("docs/organizations/projects.md",
     r"target/release/control-plane api-keys create --org acme --project \S+ --data-dir ./data"):
        "test_docs_commands.py::test_the_project_key_command_makes_a_key_confined_to_it",
    ("docs/operating/backups-and-upgrades.md", r"target/release/control-plane (backup|restore) .*"):
        "test_backup.py::test_a_backup_taken_while_serving_restores_everything",
    # Benchmarks need a release build and minutes each: the test checks that every
    # documented one names a scenario and every scenario is documented; `bench/run.sh`
    # itself runs them.
    ("README.md", r"bench/run\.sh( \w+)?"): "test_docs_commands.py::test_every_benchmark_is_documented",
    ("docs/benchmarks.md", r"(SOAK_MINUTES=\d+ )?bench/run\.sh( \w+)?"):
        "test_docs_commands.py::test_every_benchmark_is_documented",
    # The agents' certificates and their Secret: test_kubernetes.py's certificates are
    # made by running this page's block as printed (the Secret printed with --dry-run:
    # no cluster here); the test below checks that the block is all the page has.
    ("docs/operating/kubernetes.md", r"(openssl|echo|kubectl) .*"):
        "test_kubernetes.py::test_an_agent_whose_certificate_is_not_trusted_is_refused",
}


def only_once():
    """The commands do not depend on the SDK: run them in one phase of the suite."""
    if SEED_ERA:
        pytest.skip("run in the phase of today's SDK")


def test_every_documented_command_has_a_test_that_runs_it():
    commands = documented_commands()
    assert len(commands) > 20, commands
    unrun = [(document, command) for document, command in commands
             if not any(document == where and re.fullmatch(pattern, command) for where, pattern in RUNNERS)]
    assert not unrun, f"documented commands no test runs (add a runner to RUNNERS): {unrun}"
    for runner in set(RUNNERS.values()):
        file, function = runner.split("::")
        assert re.search(rf"^def {function}\(", (E2E / file).read_text(), re.M), f"{runner} is gone"
    # The Kubernetes page's commands are exactly the block test_kubernetes.py runs.
    kubernetes = [c for d, c in commands if d == "docs/operating/kubernetes.md"]
    assert kubernetes == block_with(REPO / "docs" / "operating" / "kubernetes.md", "openssl req -x509")


def test_every_benchmark_is_documented():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    documented = set(re.findall(r"^(?:SOAK_MINUTES=\d+ )?bench/run\.sh (\w+)", page, re.M))
    scenarios = {path.stem for path in (REPO / "bench" / "scenarios").glob("*.py") if path.stem != "__init__"}
    assert documented == scenarios, {"documented, no scenario": documented - scenarios,
                                     "scenario, not documented": scenarios - documented}
    # Each section of the page that gives a scenario's figure names it.
    for scenario in scenarios:
        assert f"`{scenario}`" in page, f"docs/benchmarks.md says nothing of {scenario}"


def documented_line(document: str, prefix: str) -> list[str]:
    """The words of the one documented command of `document` that starts with `prefix`."""
    [command] = [c for d, c in documented_commands() if d == document and c.startswith(prefix)]
    return shlex.split(command)


def reap(process: subprocess.Popen, data_dir) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    ControlPlane(data_dir).reap_everything()


def listening_url(process: subprocess.Popen, lines: list[str]) -> str:
    """Reads the server's output up to its `listening on <url>` line (the rest is read
    and dropped, so that the server never blocks on a full pipe)."""
    while line := process.stdout.readline():
        lines.append(line)
        if line.startswith("listening on "):
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return line.split(" ", 2)[2].strip()
    raise AssertionError(f"the server exited before it listened: {lines}")


def test_the_start_script_serves_with_the_embedded_defaults(tmp_path):
    """`deploy/start.sh`, twice on one data directory: the first start makes the bootstrap
    key, the second prints it, and a browser made with it runs. Only the address (a
    free port, not 8080), the data directory and the build profile (the debug binaries
    the suite has built) are chosen here."""
    only_once()
    [script] = documented_line("README.md", "deploy/start.sh")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make_traversable(data_dir)
    env = {**os.environ, "BUILD_PROFILE": "dev", "CONTROL_PLANE_DATA_DIR": str(data_dir)}
    for start in ("first", "second"):
        process = subprocess.Popen([str(REPO / script), "--listen", f"127.0.0.1:{free_port()}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            lines: list[str] = []
            base_url = listening_url(process, lines)
            key = (data_dir / "bootstrap-api-key").read_text().strip()
            if start == "second":
                assert f"API key (organization default): {key}\n" in lines, lines
                client = Kernel(api_key=key, base_url=base_url, max_retries=0)
                browser = client.browsers.create(headless=True)
                assert [b.session_id for b in client.browsers.list()] == [browser.session_id]
                client.browsers.delete_by_id(browser.session_id)
        finally:
            reap(process, data_dir)


def test_the_documented_serve_command_serves(tmp_path):
    """The README's `serve` line, with its address's port free and its data in a
    temporary directory: it serves, with the capacity it names, and makes a browser."""
    only_once()
    words = documented_line("README.md", "target/release/control-plane serve")
    assert words[0] == "target/release/control-plane"
    listen = words.index("--listen")
    host, _ = words[listen + 1].rsplit(":", 1)
    words[listen + 1] = f"{host}:{free_port()}"
    capacity = int(words[words.index("--capacity-browsers") + 1])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make_traversable(data_dir)
    process = subprocess.Popen([str(CONTROL_PLANE), *words[1:], "--data-dir", str(data_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
    try:
        listening_url(process, [])
        # The public URL is the example's; the service is reached where it listens.
        local = f"http://127.0.0.1:{words[listen + 1].rsplit(':', 1)[1]}"
        ready = httpx.get(f"{local}/readyz", timeout=30).json()
        assert ready["admission"]["capacity_browsers"] == capacity, ready
        key = (data_dir / "bootstrap-api-key").read_text().strip()
        client = Kernel(api_key=key, base_url=local, max_retries=0)
        browser = client.browsers.create(headless=True)
        assert browser.cdp_ws_url.startswith(words[words.index("--public-url") + 1].replace("https", "wss"))
        client.browsers.delete_by_id(browser.session_id)
        wait_until(lambda: list(client.browsers.list()) == [], timeout=30)
    finally:
        reap(process, data_dir)


def test_the_project_key_command_makes_a_key_confined_to_it(control_plane):
    """docs/organizations/projects.md's command makes a key bound to the project it
    names (made, being new), and the key's browsers run."""
    only_once()
    words = documented_line("docs/organizations/projects.md", "target/release/control-plane api-keys create")
    project = words[words.index("--project") + 1]
    words[words.index("--data-dir") + 1] = str(control_plane.data_dir)
    run = subprocess.run([str(CONTROL_PLANE), *words[1:]], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    bound = Kernel(api_key=run.stdout.strip(), base_url=control_plane.base_url, max_retries=0)
    context = bound.auth.context.retrieve()
    assert context.authorization.credential_scope.project_id == bound.projects.retrieve(project).id
    assert [p.name for p in items(bound.projects.list())] == [project]
    browser = bound.browsers.create(headless=True)
    assert [b.session_id for b in items(bound.browsers.list())] == [browser.session_id]
    bound.browsers.delete_by_id(browser.session_id)
