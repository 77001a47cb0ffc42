"""The examples a reader copies from the README and Getting started run as printed: each
Python example pinned to this phase's SDK (`# pip install kernel==<version>` on its first
line) runs unchanged in a fresh process, from a directory holding `data/bootstrap-api-key`
as the server's first start leaves it, with only the server's address and the page it
opens (no internet here) put in; and the command that makes more keys makes a key that
works. What it asserts is what the reader would see: the page's title printed, and no
browser left running."""

from __future__ import annotations

import re
import subprocess
import sys

import kernel
import pytest
from kernel import Kernel

from conftest import TEST_PAGE_TITLE
from harness import CONTROL_PLANE, REPO

DOCUMENTS = [REPO / "README.md", REPO / "docs" / "getting-started.md"]
PINNED = re.compile(r"^# pip install kernel==(\S+)")


def python_examples() -> list[tuple[str, str, str]]:
    """(document, version, code) of every pinned Python example."""
    examples = []
    for document in DOCUMENTS:
        for code in re.findall(r"```python\n(.*?)```", document.read_text(), re.S):
            pinned = PINNED.match(code)
            if pinned:
                examples.append((document.relative_to(REPO).as_posix(), pinned.group(1), code))
    return examples


def test_the_documents_have_examples_for_both_sdk_generations():
    versions = {version for _, version, _ in python_examples()}
    assert versions == {"0.40.0", "0.131.0"}, versions


@pytest.mark.parametrize("document, version, code", python_examples(),
                         ids=[f"{doc}-{version}" for doc, version, _ in python_examples()])
def test_a_python_example_runs_as_printed(control_plane, test_page_url, tmp_path, document, version, code):
    if kernel.__version__ != version:
        pytest.skip(f"the example is for kernel=={version}; this phase runs {kernel.__version__}")
    assert '"http://127.0.0.1:8080"' in code and "https://example.com" in code, "the example changed shape"
    runnable = code.replace('"http://127.0.0.1:8080"', repr(control_plane.base_url))
    runnable = runnable.replace("https://example.com", test_page_url)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bootstrap-api-key").write_text(control_plane.api_key + "\n")
    run = subprocess.run([sys.executable, "-c", runnable], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"{document}'s example failed:\n{run.stderr}"
    assert run.stdout.strip().splitlines()[-1] == TEST_PAGE_TITLE, run.stdout
    client = Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)
    assert [b.session_id for b in client.browsers.list()] == [], "the example left a browser running"


def test_the_command_that_makes_more_keys_makes_one_that_works(control_plane):
    document = (REPO / "docs" / "getting-started.md").read_text()
    command = re.search(r"^target/release/control-plane (api-keys create .*)$", document, re.M).group(1)
    assert command == "api-keys create --org acme --data-dir ./data", command
    run = subprocess.run([str(CONTROL_PLANE), *command.split()[:-1], str(control_plane.data_dir)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    key = run.stdout.strip()
    acme = Kernel(api_key=key, base_url=control_plane.base_url, max_retries=0)
    assert list(acme.browsers.list()) == []
    with pytest.raises(kernel.AuthenticationError):
        Kernel(api_key=key + "x", base_url=control_plane.base_url, max_retries=0).browsers.list()


def test_the_server_serves_its_documentation(control_plane):
    """`/docs` is the docs/ tree, rendered by the server itself, without a key."""
    import httpx
    base = control_plane.base_url
    redirect = httpx.get(f"{base}/docs", timeout=30)
    assert redirect.status_code == 308 and redirect.headers["location"] == "/docs/"
    home = httpx.get(f"{base}/docs/", timeout=30)
    assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
    assert "<h1 id=\"self-hosted-browser-service\">Self-hosted browser service</h1>" in home.text
    assert 'href="/docs/api/browsers.html"' in home.text, "the navigation leads to the pages"
    browsers = httpx.get(f"{base}/docs/api/browsers.html", timeout=30)
    assert browsers.status_code == 200 and "<code>POST /browsers</code>" in browsers.text
    assert "script-src" not in browsers.headers["content-security-policy"]
    flags = httpx.get(f"{base}/docs/reference/flags.html", timeout=30).text
    assert "<code>--capacity-browsers</code>" in flags
    assert httpx.get(f"{base}/docs/style.css", timeout=30).headers["content-type"].startswith("text/css")
    missing = httpx.get(f"{base}/docs/nowhere.html", timeout=30)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert httpx.get(f"{base}/docs/SUMMARY.html", timeout=30).status_code == 404
