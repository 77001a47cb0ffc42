"""One module per scenario, each with `run(work_dir, report)`."""

import http.client as http_client

import httpx


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
