"""Browsers as Kubernetes pods (`--runtime kubernetes`), against the fake API server and
two test kubelets of `fake_kubernetes.py` (no cluster can run on these machines): the
control plane creates a pod per browser from deploy/kubernetes/browser-pod.yaml, a
kubelet runs its agent in a network namespace of its own, and every call reaches the
agent over TCP at the pod's IP."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import sqlite3
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kernel import APIStatusError, BadRequestError, Kernel
from playwright.sync_api import sync_playwright

from docs_kit import block_with
from extensions_kit import make_extension
from fake_kubernetes import FakeApiServer, Image, Kubelet
from harness import BIN_DIR, REPO, ControlPlane, serve_html, wait_until
from sdk import on_browser, once, update_browser

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

NAMESPACE = "browsers"
IMAGE = "browser-service/browser-vm:dev"
TITLE = "served to a pod"
# One address of this host that every pod reaches (through its veth and default route),
# so that pages have one origin whichever node a browser runs on.
PAGE_HOST = "10.244.0.1"
EVICTION_SECONDS = 2


# The commands docs/operating/kubernetes.md gives for agents' certificates and their
# Secret: the tests' certificates are made by running them as printed.
CERTIFICATE_COMMANDS = block_with(REPO / "docs" / "operating" / "kubernetes.md", "openssl req -x509")


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a certificate it signed for the name agents present (browser-agent)."""
    for command in CERTIFICATE_COMMANDS:
        if not command.startswith("kubectl "):
            subprocess.run(["bash", "-euo", "pipefail", "-c", command], check=True, capture_output=True,
                           cwd=directory)
    return {name: directory / name for name in ("ca.crt", "tls.crt", "tls.key")}


def documented_secret(directory: Path) -> dict[str, bytes]:
    """The Secret the documentation's `kubectl create secret` makes of the files in
    `directory`: printed (`--dry-run=client -o json`) rather than sent, as the fake API
    server is not the cluster that command names."""
    [create] = [command for command in CERTIFICATE_COMMANDS if command.startswith("kubectl ")]
    printed = subprocess.run(["bash", "-c", f"{create} --dry-run=client -o json"], cwd=directory,
                             env={**os.environ, "KUBECONFIG": "/nonexistent"}, check=True,
                             capture_output=True, text=True)
    secret = json.loads(printed.stdout)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "browser-agent-tls", secret
    return {name: base64.b64decode(value) for name, value in secret["data"].items()}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certificates):
    api = FakeApiServer(token=secrets.token_hex(16))
    # The Secret deploy/kubernetes/browser-pod.yaml mounts.
    api.secrets[(NAMESPACE, "browser-agent-tls")] = documented_secret(certificates["ca.crt"].parent)
    image = Image({
        "/opt/browser-agent/browser-agent": BIN_DIR / "browser-agent",
        "/opt/browser-agent/node": REPO / "browser-agent" / "node",
    })
    nodes = [Kubelet(api, f"node-{index}", {IMAGE: image}, index, NAMESPACE) for index in (1, 2)]
    subprocess.run(["ip", "addr", "replace", f"{PAGE_HOST}/32", "dev", "lo"], check=True)
    yield api, nodes
    subprocess.run(["ip", "addr", "del", f"{PAGE_HOST}/32", "dev", "lo"], check=False)
    for node in nodes:
        node.close()
    image.close()
    api.close()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, cluster, certificates):
    api, _ = cluster
    data = tmp_path_factory.mktemp("k8s") / "data"
    data.mkdir(parents=True)
    kubeconfig = api.kubeconfig(data.parent / "kubeconfig", NAMESPACE)
    # deploy/kubernetes's template, evicting from a lost node after 2 s instead of 30.
    template = yaml.safe_load((REPO / "deploy" / "kubernetes" / "browser-pod.yaml").read_text())
    for toleration in template["spec"]["tolerations"]:
        toleration["tolerationSeconds"] = EVICTION_SECONDS
    template_file = data.parent / "browser-pod.json"
    template_file.write_text(json.dumps(template))
    server = ControlPlane(data, extra_args=[
        "--runtime", "kubernetes",
        "--kubernetes-pod-template", str(template_file),
        "--max-pooled-browsers", "4",
        "--agent-tls-ca", str(certificates["ca.crt"]),
    ], env={"KUBECONFIG": str(kubeconfig)}).start()
    yield server
    server.reap_everything()
    # The control plane is gone: what it left running would outlive the test.
    for pod in api.list(NAMESPACE, "", "")[0]:
        api.delete(NAMESPACE, pod["metadata"]["name"], 0)


@pytest.fixture(scope="module")
def client(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)


@pytest.fixture(scope="module")
def page_server():
    """A page on every address of this host: pods reach it through their veth."""
    body = f"<!doctype html><title>{TITLE}</title><p id=p>hello pod</p>".encode()
    server = serve_html(lambda path: body, host="0.0.0.0")
    yield server.server_address[1]
    server.shutdown()


def pod_of(api: FakeApiServer, session_id: str) -> dict | None:
    return api.get(NAMESPACE, f"browser-{session_id}")


def end_reason(control_plane, session_id: str) -> str | None:
    with sqlite3.connect(control_plane.data_dir / "control-plane.db") as db:
        row = db.execute("SELECT end_reason FROM browser_sessions WHERE id = ?", (session_id,)).fetchone()
    return row[0] if row else None


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def test_a_browser_is_a_pod_on_a_node_reached_over_the_network(cluster, control_plane, client, page_server,
                                                              certificates):
    api, nodes = cluster
    browser = client.browsers.create(timeout_seconds=300)
    pod = pod_of(api, browser.session_id)
    assert pod is not None and pod["status"]["phase"] == "Running", pod
    labels = pod["metadata"]["labels"]
    assert labels["browser-service/session"] == browser.session_id
    assert labels["app.kubernetes.io/managed-by"] == "browser-service"
    container = pod["spec"]["containers"][0]
    assert "--listen=0.0.0.0:50051" in container["args"]
    assert pod["spec"]["restartPolicy"] == "Never"
    node = next(node for node in nodes if node.name == pod["spec"]["nodeName"])
    processes = node.pod_processes((NAMESPACE, pod["metadata"]["name"]))
    agents = [pid for pid in processes if Path(f"/proc/{pid}/comm").read_text().strip() == "browser-agent"]
    assert agents, processes
    # The pod's user, in the pod's own network namespace, not this host's.
    assert uid_of(agents[0]) == 1000
    assert os.readlink(f"/proc/{agents[0]}/ns/net") != os.readlink("/proc/self/ns/net")

    # The agent speaks only TLS, with the certificate the operator gave it.
    pod_ip = pod["status"]["podIP"]
    trusting = ssl.create_default_context(cafile=str(certificates["ca.crt"]))
    trusting.set_alpn_protocols(["h2"])
    with socket.create_connection((pod_ip, 50051), timeout=5) as raw:
        with trusting.wrap_socket(raw, server_hostname="browser-agent") as tls:
            assert tls.selected_alpn_protocol() == "h2"
    with socket.create_connection((pod_ip, 50051), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="browser-agent")

    # Playwright over the browser's cdp_ws_url: the control plane tunnels to the pod.
    url = f"http://{PAGE_HOST}:{page_server}/"
    with sync_playwright() as playwright:
        remote = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
        page = remote.contexts[0].pages[0] if remote.contexts[0].pages else remote.contexts[0].new_page()
        page.goto(url)
        assert page.title() == TITLE
        assert page.inner_text("#p") == "hello pod"
        remote.close()
    # The computer controls and the filesystem reach the same agent.
    shot = client.browsers.computer.capture_screenshot(browser.session_id)
    assert shot.read()[:8] == b"\x89PNG\r\n\x1a\n"
    client.browsers.fs.write_file(browser.session_id, contents=b"in a pod", path="/tmp/k8s.txt")
    assert client.browsers.fs.read_file(browser.session_id, path="/tmp/k8s.txt").read() == b"in a pod"

    client.browsers.delete_by_id(browser.session_id)
    assert wait_until(lambda: pod_of(api, browser.session_id) is None, 20), pod_of(api, browser.session_id)
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in processes), 10), [
        pid for pid in processes if Path(f"/proc/{pid}").exists()]


def test_extensions_and_settings_reach_the_pod_over_grpc(cluster, control_plane, client, page_server):
    """The archive of an extension loaded at creation travels over the agent's gRPC
    stream: the pod has no path of the control plane's host."""
    api, _ = cluster
    library = client.extensions.upload(file=("marker.zip", make_extension("in-pod")), name="in-pod")
    browser = client.browsers.create(extensions=[{"name": "in-pod"}], viewport={"width": 1024, "height": 768},
                                     timeout_seconds=300)
    try:
        pod = pod_of(api, browser.session_id)
        args = pod["spec"]["containers"][0]["args"]
        assert "--width=1024" in args and "--height=768" in args
        assert not any(str(control_plane.data_dir) in arg or "--extension" in arg for arg in args), args
        with sync_playwright() as playwright:
            remote = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = remote.contexts[0].new_page()
            page.goto(f"http://{PAGE_HOST}:{page_server}/")
            assert page.evaluate("document.documentElement.getAttribute('data-in-pod')") == "loaded"
            assert page.evaluate("[screen.width, screen.height]") == [1024, 768]
            remote.close()
    finally:
        client.browsers.delete_by_id(browser.session_id)
        client.extensions.delete(library.id)


def test_a_recording_in_a_pod_is_collected_over_grpc(cluster, client, tmp_path):
    api, _ = cluster
    browser = client.browsers.create(timeout_seconds=300)
    try:
        replay = client.browsers.replays.start(browser.session_id)
        time.sleep(2)
        client.browsers.replays.stop(replay.replay_id, **on_browser(browser.session_id))
        video = tmp_path / "pod.mp4"
        video.write_bytes(client.browsers.replays.download(replay.replay_id, **on_browser(browser.session_id)).read())
        probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
                                str(video)], check=True, capture_output=True, text=True)
        assert 1.0 <= float(probe.stdout) <= 6.0, probe.stdout
        # Started again and the browser ended with it running: collected before the pod
        # goes, since nothing of a pod is on the control plane's host.
        again = client.browsers.replays.start(browser.session_id)
        time.sleep(1)
    finally:
        client.browsers.delete_by_id(browser.session_id)
    assert wait_until(lambda: pod_of(api, browser.session_id) is None, 20)
    last = {r.replay_id: r for r in client.browsers.replays.list(browser.session_id)}[again.replay_id]
    assert last.finished_at is not None
    kept = client.browsers.replays.download(again.replay_id, **on_browser(browser.session_id)).read()
    assert kept[4:8] == b"ftyp", kept[:16]


def test_a_profile_saved_from_one_pod_starts_the_next(client, page_server):
    """The profile leaves a pod over the agent's export stream and enters the next over
    its load stream."""
    client.profiles.create(name="k8s-profile")

    def on_page(session, script: str):
        with sync_playwright() as playwright:
            remote = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
            page = remote.contexts[0].new_page()
            page.goto(f"http://{PAGE_HOST}:{page_server}/")
            result = page.evaluate(script)
            remote.close()
        return result

    first = client.browsers.create(headless=True, profile={"name": "k8s-profile", "save_changes": True})
    on_page(first, "localStorage.setItem('where', 'saved in a pod')")
    client.browsers.delete_by_id(first.session_id)
    second = client.browsers.create(headless=True, profile={"name": "k8s-profile"})
    try:
        assert on_page(second, "localStorage.getItem('where')") == "saved in a pod"
    finally:
        client.browsers.delete_by_id(second.session_id)


def test_a_pod_deleted_behind_the_services_back_ends_its_browser_after_a_lost_watch(cluster, control_plane,
                                                                                    client):
    """The API server compacts its history (watches end with 410 Gone): the runtime lists
    again, and a pod someone deletes meanwhile still ends its browser, with why."""
    api, _ = cluster
    browser = client.browsers.create(headless=True, timeout_seconds=300)
    api.expire_watches()
    api.delete(NAMESPACE, f"browser-{browser.session_id}", 0)
    assert wait_until(lambda: end_reason(control_plane, browser.session_id) is not None, 15)
    assert end_reason(control_plane, browser.session_id) == "its pod was deleted"
    # And browsers start as before.
    again = client.browsers.create(headless=True, timeout_seconds=300)
    client.browsers.delete_by_id(again.session_id)


def test_egress_rules_are_refused_with_a_reason(client):
    with pytest.raises(BadRequestError) as refused:
        # As a body field: the seed-era SDK has no `network` argument.
        client.browsers.create(headless=True, extra_body={"network": {"allowed_hosts": ["example.com"]}})
    assert "NetworkPolicy" in str(refused.value)
    # Nor can a live browser be given an allowlist.
    browser = client.browsers.create(headless=True, timeout_seconds=300)
    try:
        with pytest.raises(BadRequestError) as refused:
            update_browser(client, browser.session_id, network={"allowed_hosts": ["example.com"]})
        assert "NetworkPolicy" in str(refused.value)
    finally:
        client.browsers.delete_by_id(browser.session_id)


def test_an_agent_whose_certificate_is_not_trusted_is_refused(cluster, control_plane, tmp_path_factory):
    """A control plane trusting another CA does not talk to the agent: the launch fails
    with why, and its pod goes."""
    api, _ = cluster
    other_ca = make_certificates(tmp_path_factory.mktemp("other-ca"))["ca.crt"]
    args = control_plane.extra_args
    template = args[args.index("--kubernetes-pod-template") + 1]
    data = tmp_path_factory.mktemp("k8s-untrusting") / "data"
    data.mkdir(parents=True)
    distrustful = ControlPlane(data, extra_args=[
        "--runtime", "kubernetes", "--kubernetes-pod-template", template, "--agent-tls-ca", str(other_ca),
    ], env={"KUBECONFIG": str(api.kubeconfig(data.parent / "kubeconfig", NAMESPACE))}).start()
    try:
        client = Kernel(api_key=distrustful.api_key, base_url=distrustful.base_url, max_retries=0)
        with pytest.raises(APIStatusError) as refused:
            client.browsers.create(headless=True)
        assert refused.value.status_code == 503
        assert "certificate" in str(refused.value), refused.value
        assert wait_until(lambda: not any(pod["metadata"]["labels"].get("browser-service/session") not in
                                          _live_sessions(control_plane)
                                          for pod in api.list(NAMESPACE, "", "")[0]), 20)
    finally:
        distrustful.reap_everything()


def _live_sessions(control_plane) -> set[str]:
    with sqlite3.connect(control_plane.data_dir / "control-plane.db") as db:
        return {row[0] for row in db.execute("SELECT id FROM browser_sessions WHERE ended_at IS NULL")}


def test_readyz_reports_the_pod_templates_protections(control_plane):
    with urllib.request.urlopen(f"{control_plane.base_url}/readyz") as response:
        report = json.loads(response.read())["isolation"]
    assert report["sandboxed"] is True
    enforced = " ".join(report["enforced"])
    for protection in ("runAsNonRoot", "seccomp", "read-only root", "/dev/shm", "API token", "TLS"):
        assert protection in enforced, enforced
    assert [item["protection"] for item in report["not_enforced"]] == [
        "per-browser egress rules (network.allowed_hosts, proxies)",
        "tenant code runs apart from the agent (another uid in the VM)"]


def test_a_lost_node_ends_its_browsers_with_a_reason_and_pools_refill(cluster, control_plane, client):
    api, nodes = cluster
    pool = client.browser_pools.create(size=2, fill_rate_per_minute=6000, headless=True)

    def pool_pods() -> list[dict]:
        return [pod for pod in api.list(NAMESPACE, "", "")[0]
                if pod["status"].get("phase") == "Running" and "deletionTimestamp" not in pod["metadata"]]

    assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 2, 90)
    browser = client.browsers.create(headless=True, timeout_seconds=300)
    by_node: dict[str, list[str]] = {}
    for pod in pool_pods():
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["labels"]["browser-service/session"])
    # The scheduler spread them: both nodes run browsers.
    assert len(by_node) == 2, by_node
    lost = next(node for node in nodes if node.name == pod_of(api, browser.session_id)["spec"]["nodeName"])
    lost_sessions = by_node[lost.name]

    # As Kubernetes does, the pods of the lost node are evicted once their toleration of
    # an unreachable node runs out; their browsers end with why.
    lost.kill()
    for session_id in lost_sessions:
        assert wait_until(lambda: end_reason(control_plane, session_id) is not None, EVICTION_SECONDS + 15), session_id
        assert "evicted (DeletionByTaintManager" in end_reason(control_plane, session_id), \
            end_reason(control_plane, session_id)
    # The pool is whole again, on the node that is left.
    assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 2, 90), \
        client.browser_pools.retrieve(pool.id)
    assert {pod["spec"]["nodeName"] for pod in pool_pods()} == {node.name for node in nodes if node is not lost}
    leased = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=30)
    with sync_playwright() as playwright:
        remote = playwright.chromium.connect_over_cdp(leased.cdp_ws_url)
        context = remote.contexts[0]
        page = context.pages[0] if context.pages else context.new_page()
        assert page.evaluate("1 + 1") == 2
        remote.close()
    client.browser_pools.delete(pool.id, force=True)
