"""Every answer leaves a keep-alive connection usable or says `Connection: close`:
errors included (404, 405, 401, 400), and whether or not the handler read the body."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


class RawConnection:
    """One HTTP/1.1 connection, spoken by hand so that nothing reconnects silently."""

    def __init__(self, base_url: str):
        url = urlparse(base_url)
        self.address = (url.hostname, url.port)
        self.sock = socket.create_connection(self.address, timeout=10)
        self.buffer = b""

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.address[0]}", f"Content-Length: {len(body)}",
                "Content-Type: application/json"]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        try:
            self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            return self._response()
        except (BrokenPipeError, ConnectionResetError):
            return None  # the server had closed the connection

    def _read_more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def _response(self):
        while b"\r\n\r\n" not in self.buffer:
            if not self._read_more():
                return None  # closed before answering
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            if not self._read_more():
                return None
        self.buffer = self.buffer[length:]
        return status, headers

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("rounds", [100])
def test_error_answers_keep_the_connection_or_say_close(control_plane, rounds):
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    small = b'{"a": 1}'
    large = b"x" * (256 * 1024)
    requests = [
        ("POST", "/no/such/route", small, auth, 404),
        ("PUT", "/browsers", small, auth, 405),
        ("POST", "/browsers", small, {"Authorization": "Bearer sk_wrong"}, 401),
        ("PATCH", "/browsers/nobody", b'{"name": "x"}', auth, 404),
        ("POST", "/profiles", b'{"name": 5}', auth, 400),
        ("GET", "/healthz", b"", {}, 200),
        ("POST", "/no/such/route", large, auth, 404),
    ]
    connection = RawConnection(control_plane.base_url)
    closes = 0
    try:
        for index in range(rounds * len(requests)):
            method, path, body, headers, expected = requests[index % len(requests)]
            answer = connection.request(method, path, body, headers)
            assert answer is not None, f"closed without Connection: close after {index} requests"
            status, response_headers = answer
            assert status == expected, (method, path, status)
            if response_headers.get("connection", "").lower() == "close":
                closes += 1
                connection.close()
                connection = RawConnection(control_plane.base_url)
    finally:
        connection.close()
    # Only the large body the handler never read closes the connection.
    assert closes <= rounds
