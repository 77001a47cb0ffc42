"""Several control-plane replicas on one PostgreSQL database behind a test load balancer.

The balancer sends each HTTP request to the next replica in turn (it closes every
connection after one answer, so a client's keep-alive cannot pin it to one replica),
passes WebSocket upgrades through, and skips a replica that refuses connections, as a
load balancer with health checks would.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import threading
import uuid
from pathlib import Path

from harness import CONTROL_PLANE, ControlPlane, free_port

METRICS_TOKEN = "metrics-token-for-tests"


def database_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    assert url, "TEST_DATABASE_URL must name a PostgreSQL database (deploy/test.sh sets it)"
    return url


def fresh_schema_url() -> str:
    """A URL whose connections use a new, empty schema of the test database."""
    url = database_url()
    schema = f"replicas_{uuid.uuid4().hex[:12]}"
    subprocess.run(["psql", url, "-q", "-c", f"CREATE SCHEMA {schema}"], check=True)
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


class LoadBalancer:
    """Round-robin, one request per connection, WebSockets passed through."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.backends: list[int] = []
        self.requests_by_backend: dict[int, int] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def close(self) -> None:
        """Stops listening for good. Closing the socket alone is not enough: a thread blocked
        in accept() keeps a closed listener alive (and its port taken), and a thread about to
        call accept() on the freed descriptor number could take the connections of whatever
        socket is given that number next (a later test's page server: its page would load as
        this balancer's 502). shutdown() wakes the accept; only then is the socket closed."""
        self._closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._accepting.join(timeout=5)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._closed:
                client.close()
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> tuple[socket.socket, int] | None:
        with self._lock:
            start = next(self._turn)
        for offset in range(len(self.backends)):
            port = self.backends[(start + offset) % len(self.backends)]
            try:
                backend = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            backend.settimeout(None)
            with self._lock:
                self.requests_by_backend[port] = self.requests_by_backend.get(port, 0) + 1
            return backend, port
        return None

    def _serve(self, client: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, rest = head.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            upgrade = any(line.lower().startswith(b"upgrade:") for line in lines[1:])
            if not upgrade:
                lines = [lines[0]] + [line for line in lines[1:]
                                      if not line.lower().startswith(b"connection:")]
                lines.append(b"Connection: close")
            connected = self._connect()
            if connected is None:
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            backend, _ = connected
            backend.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + rest)
            upstream = threading.Thread(target=_pipe, args=(client, backend), daemon=True)
            upstream.start()
            _pipe(backend, client)
            upstream.join(timeout=1)
            backend.close()
        except OSError:
            pass
        finally:
            client.close()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Replicas:
    """Two control planes sharing a data directory and a PostgreSQL schema, behind a
    `LoadBalancer`. Offers what tests use of a `ControlPlane` (`base_url`, `api_key`,
    `data_dir`, `create_api_key`, `stop`, `start`, `reap_everything`)."""

    def __init__(self, data_dir: Path, count: int = 2, extra_args: list[str] | None = None, **options):
        self.data_dir = data_dir
        self.database_url = fresh_schema_url()
        self.balancer = LoadBalancer()
        self.base_url = self.balancer.url
        args = ["--database-url", self.database_url, "--public-url", self.base_url,
                "--metrics-token", METRICS_TOKEN, *(extra_args or [])]
        self.members = [
            ControlPlane(data_dir, port=free_port(),
                         extra_args=[*args, "--replica-id", f"replica-{index}"], **options)
            for index in range(count)
        ]

    def start(self) -> "Replicas":
        # One after the other: the first creates the schema and the bootstrap key.
        for member in self.members:
            if member.process is None or member.process.poll() is not None:
                member.start()
        self.balancer.backends = [member.port for member in self.members]
        return self

    @property
    def api_key(self) -> str:
        return (self.data_dir / "bootstrap-api-key").read_text().strip()

    def create_api_key(self, org: str) -> str:
        out = subprocess.run(
            [str(CONTROL_PLANE), "api-keys", "create", "--org", org, "--data-dir", str(self.data_dir),
             "--database-url", self.database_url],
            check=True, capture_output=True, text=True,
        )
        return out.stdout.strip()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for member in self.members:
            member.stop(sig)

    def kill(self, member: ControlPlane) -> None:
        """kill -9 of one replica (its browsers' processes live on)."""
        member.stop(signal.SIGKILL)

    def reap_everything(self) -> None:
        for member in self.members:
            member.reap_everything()
        self.balancer.close()


def replicated_for_module(tmp_path_factory, **options):
    deployment = Replicas(tmp_path_factory.mktemp("replicas") / "data", **options).start()
    yield deployment
    deployment.reap_everything()
