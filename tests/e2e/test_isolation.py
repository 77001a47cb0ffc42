"""What keeps one browser VM, and the service's own secrets, out of reach of the rest of
the host (private files, an agent reachable only through a socket in its browser's
directory), and one organization from taking the whole host (its live-browser limit)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import httpx
import pytest
from kernel import BadRequestError, ConflictError, Kernel, PermissionDeniedError, RateLimitError

from conftest import TEST_PAGE_TITLE
from harness import CONTROL_PLANE, ControlPlane, read_page, session_processes, wait_until
from sdk import field, once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _listening_tcp_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (from the socket inodes it holds)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture(scope="module")
def strict_client(tmp_path_factory):
    """A client of a control plane whose operator allowed no internal destination."""
    server = ControlPlane(tmp_path_factory.mktemp("strict") / "data", egress_allow=()).start()
    yield Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
    server.reap_everything()


def test_secrets_are_private_and_the_agent_listens_on_no_port(control_plane, client, test_page_url):
    created = client.browsers.create(headless=True)
    try:
        data = control_plane.data_dir
        # Others may pass through (the sandboxes, to mount their own directories), never
        # list or read.
        assert _mode(data) & 0o066 == 0 and _mode(data / "browsers") & 0o066 == 0
        for secret in ("control-plane.db", "bootstrap-api-key", "credential.key"):
            assert _mode(data / secret) == 0o600, secret
        session_dir = data / "browsers" / created.session_id
        assert _mode(session_dir) & 0o066 == 0
        assert _mode(session_dir / "agent.log") == 0o600
        # The agent's sockets were bound by the control plane in a directory of its own,
        # outside the VM: nothing of them is in the VM's run directory.
        control = session_dir / "control"
        assert control.lstat().st_uid == os.getuid() and _mode(control) == 0o700
        for name in ("agent.sock", "devtools.sock"):
            assert stat.S_ISSOCK((control / name).lstat().st_mode), name
            assert not (session_dir / "run" / name).exists(), name

        (agent,) = session_processes(control_plane, created.session_id)["agent"]
        # Whatever the agent listens on (the VM's egress forwarder) is on the VM's own
        # network, not the host's.
        assert os.readlink(f"/proc/{agent}/ns/net") != os.readlink("/proc/self/ns/net")
        # Everything still goes through the control plane to the agent.
        title = read_page(created.cdp_ws_url, test_page_url, lambda page: page.title())
        assert title == TEST_PAGE_TITLE
    finally:
        client.browsers.delete_by_id(created.session_id)


def test_agents_are_reached_under_a_data_directory_of_any_depth(tmp_path, test_page_url):
    # Deeper than a socket address can name (108 bytes) once the browser's directory and
    # the socket's name are added.
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "data"
    server = ControlPlane(deep).start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url)
        created = client.browsers.create(headless=True)
        socket = deep / "browsers" / created.session_id / "control" / "agent.sock"
        assert len(str(socket)) > 108
        title = read_page(created.cdp_ws_url, test_page_url, lambda page: page.title())
        assert title == TEST_PAGE_TITLE
        client.browsers.delete_by_id(created.session_id)
    finally:
        server.reap_everything()


def test_an_organization_at_its_live_browser_limit_is_told_when_to_retry(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=["--max-live-browsers", "2"]).start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        first = client.browsers.create(headless=True)
        client.browsers.create(headless=True)

        refused = httpx.post(
            f"{server.base_url}/browsers",
            headers={"Authorization": f"Bearer {server.api_key}"},
            json={"headless": True},
            timeout=30,
        )
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["code"] == "limit_reached"
        with pytest.raises(RateLimitError):
            client.browsers.create(headless=True)
        # Nothing was started for the refused requests.
        assert len(list((server.data_dir / "browsers").iterdir())) == 2

        # Another organization has a limit of its own.
        other = Kernel(api_key=server.create_api_key("other"), base_url=server.base_url, max_retries=0)
        other.browsers.create(headless=True)
        # Ending a browser frees its place.
        client.browsers.delete_by_id(first.session_id)
        client.browsers.create(headless=True)
    finally:
        server.reap_everything()


def test_a_data_directory_the_vm_user_cannot_pass_through_still_works(tmp_path, test_page_url):
    """A data directory and a build under a directory only root may enter (as under
    /root): VM directories and the agent binary move where the VM user reaches them."""
    if os.geteuid() != 0:
        pytest.skip("the VM user is another user only when the service runs as root")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    agent = private / "bin" / "browser-agent"
    agent.parent.mkdir()
    shutil.copy(Path(CONTROL_PLANE).parent / "browser-agent", agent)
    server = ControlPlane(private / "data", traversable=False, extra_args=["--agent-binary", str(agent)]).start()
    bases = set()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        created = client.browsers.create(headless=True)
        assert not (server.data_dir / "browsers").exists()
        bases = {p.parent.parent for p in Path("/var/lib/browser-vms").glob(f"*/browsers/{created.session_id}")}
        assert len(bases) == 1
        assert read_page(created.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE
        client.browsers.delete_by_id(created.session_id)
        assert wait_until(lambda: not any((base / "browsers" / created.session_id).exists() for base in bases), 5)
    finally:
        server.reap_everything()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


def test_an_organization_at_its_memory_limit_is_told_when_to_retry(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=["--max-live-memory-gib", "3"]).start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        first = client.browsers.create(headless=True, extra_body={"memory": "2GiB"})
        client.browsers.create(headless=True)  # 1GiB by default: 3 GiB in all
        refused = httpx.post(f"{server.base_url}/browsers", json={"headless": True}, timeout=30,
                             headers={"Authorization": f"Bearer {server.api_key}"})
        assert refused.status_code == 429 and refused.json()["code"] == "limit_reached", refused.text
        assert "memory" in refused.json()["message"] and int(refused.headers["retry-after"]) >= 1
        client.browsers.delete_by_id(first.session_id)
        client.browsers.create(headless=True)
    finally:
        server.reap_everything()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "0.0.0.0", "169.254.169.254", "10.0.0.1"])
def test_custom_proxies_cannot_point_inside_the_host(strict_client, host):
    client = strict_client
    # Well-formed, but the operator's egress policy forbids it: 403.
    with pytest.raises(PermissionDeniedError) as refused:
        client.proxies.create(type="custom", config={"host": host, "port": 3128})
    assert "--egress-allow" in str(refused.value)
    assert host not in [getattr(proxy.config, "host", None) for proxy in client.proxies.list()]


def test_a_proxy_name_is_judged_by_what_it_resolves_to_when_used(client):
    # A public address is fine; a name that does not resolve is kept (it may later), but
    # no browser starts with it and its check says why.
    public = client.proxies.create(type="custom", config={"host": "203.0.113.10", "port": 3128})
    assert public.id
    unresolved = client.proxies.create(type="custom", config={"host": "proxy.example.invalid", "port": 3128})
    # The proxy exists but cannot be used now: a conflict with its state.
    with pytest.raises(ConflictError) as refused:
        client.browsers.create(headless=True, proxy_id=unresolved.id)
    assert "does not resolve" in str(refused.value)
    checked = client.proxies.check(unresolved.id)
    assert checked.status == "unavailable"
    assert "does not resolve" in field(checked, "check_error")


def test_readiness_names_every_protection_this_host_does_not_enforce(control_plane):
    ready = httpx.get(f"{control_plane.base_url}/readyz", timeout=10).json()
    assert ready["status"] == "ready"
    isolation = ready["isolation"]
    assert set(isolation["host"]) == {"user_namespaces", "bubblewrap", "cgroup_v2_memory"}
    assert isolation["sandboxed"] is True
    assert any("bubblewrap sandbox" in protection for protection in isolation["enforced"])
    assert any("Unix sockets" in protection for protection in isolation["enforced"])
    # This host (hybrid hierarchy, root) has the v1 controllers and loop devices: the
    # report names the controllers in use and the disk quota.
    (cgroups,) = [p for p in isolation["enforced"] if "control group" in p]
    assert "cgroup v1 controllers memory, pids and cpu" in cgroups, cgroups
    assert any("8 GiB" in p and "loop-mounted" in p for p in isolation["enforced"])
    assert isolation["not_enforced"] == []


def test_readiness_says_which_kernel_limit_is_off(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=["--vm-disk-gib", "0"]).start()
    try:
        isolation = httpx.get(f"{server.base_url}/readyz", timeout=10).json()["isolation"]
        unenforced = {item["protection"]: item["reason"] for item in isolation["not_enforced"]}
        assert "--vm-disk-gib 0" in unenforced["a disk quota per browser"]
        log = (server.data_dir / "control-plane.log").read_text()
        assert "NOT ENFORCED" in log and "disk quota" in log
    finally:
        server.reap_everything()


def test_without_a_sandbox_the_service_says_so_loudly(tmp_path, test_page_url):
    server = ControlPlane(tmp_path / "data", extra_args=["--isolation", "none"]).start()
    try:
        isolation = httpx.get(f"{server.base_url}/readyz", timeout=10).json()["isolation"]
        assert isolation["sandboxed"] is False
        assert any(item["protection"] == "browser sandbox" for item in isolation["not_enforced"])
        log = (server.data_dir / "control-plane.log").read_text()
        assert "WITHOUT A SANDBOX" in log
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        created = client.browsers.create(headless=True)
        assert read_page(created.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE
        with pytest.raises(BadRequestError, match="chrome_policy needs"):
            client.browsers.create(headless=True, extra_body={"chrome_policy": {"URLBlocklist": ["x"]}})
        client.browsers.delete_by_id(created.session_id)
    finally:
        server.reap_everything()
