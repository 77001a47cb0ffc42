"""One module per scenario, each with `run(work_dir, report)`."""

import contextlib
import http.client as http_client
from pathlib import Path

import httpx

from harness import ControlPlane


def api_client(server, timeout: float = 60) -> httpx.Client:
    """A client of `server`'s API, with its key."""
    return httpx.Client(base_url=server.base_url, timeout=timeout,
                        headers={"Authorization": f"Bearer {server.api_key}"})


def kept_alive(server) -> tuple[http_client.HTTPConnection, dict[str, str]]:
    """One kept-alive connection to `server` with the standard library's client, the
    cheapest way for a client to make a call (so that a figure is the service's, not the
    client's), and the headers of a JSON call with the server's key."""
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    return http_client.HTTPConnection("127.0.0.1", server.port), headers


def alternate(ours, reference, runs: int, warmup: int) -> tuple[list[float], list[float]]:
    """Samples of `ours()` and of `reference()` (each answers its seconds): `warmup` of
    each first, then `runs` of each in turn, so that both meet the same machine state."""
    for _ in range(warmup):
        ours()
        reference()
    ours_samples, reference_samples = [], []
    for _ in range(runs):
        ours_samples.append(ours())
        reference_samples.append(reference())
    return ours_samples, reference_samples


def rotate_in_blocks(methods, runs: int, warmup: int, block: int) -> list[list[float]]:
    """Samples of each method (each answers its seconds), in the order given: `warmup` of
    each first, then blocks of `block` runs per method, the methods' order rotating every
    round, so that all meet the same machine state and drift while none directly follows
    another's block twice in a row."""
    samples: dict = {method: [] for method in methods}
    for method in methods:
        for _ in range(warmup):
            method()
    for round_index in range(runs // block):
        shift = round_index % len(methods)
        for method in methods[shift:] + methods[:shift]:
            samples[method].extend(method() for _ in range(block))
    return [samples[method] for method in methods]


@contextlib.contextmanager
def one_browser(work_dir: Path, create: dict):
    """A control plane with one browser, created with `create`: yields the session (as
    created) with a kept-alive connection and its headers. Once the block is done the
    browser is deleted; whatever happens, the control plane and its VMs are reaped."""
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server)
        session = http.post("/browsers", json=create).raise_for_status().json()
        connection, headers = kept_alive(server)
        yield session, connection, headers
        connection.close()
        http.delete(f"/browsers/{session['session_id']}").raise_for_status()
    finally:
        server.reap_everything()
