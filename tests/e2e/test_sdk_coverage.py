"""Every operation of today's official Python SDK (kernel==0.131.0) under `browsers` (and
its sub-resources), `profiles`, `extensions`, `proxies`, `browser_pools`,
`auth.connections`, `auth.context`, `api_keys`, `audit_logs`, `organization`, `credentials`, `credential_providers`, `apps`, `deployments` and
`invocations` is either served (it is in /openapi.json, and the tests call it) or
listed in the API overview's (docs/api/overview.md) "not supported by this server" table, whose routes answer 404 with
a message that says so. Read from the SDK's source, so a new SDK release shows its new
routes here."""

from __future__ import annotations

import ast
import re

import httpx
import pytest

from harness import REPO

SDK = REPO / ".venv-sdk131" / "lib"
RESOURCES = ["browsers", "profiles.py", "extensions.py", "proxies.py", "browser_pools.py",
             "auth/connections.py", "auth/context.py", "api_keys.py", "audit_logs", "organization", "projects",
             "credentials.py", "credential_providers.py", "apps.py",
             "deployments.py", "invocations.py"]
HTTP_CALLS = {"_get": "GET", "get_api_list": "GET", "_post": "POST", "_put": "PUT", "_patch": "PATCH",
              "_delete": "DELETE"}


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def sdk_operations() -> set[tuple[str, str]]:
    """(method, path shape) of every call the synchronous resource classes make."""
    package = next(SDK.glob("python3*/site-packages/kernel"))
    operations = set()
    for resource in RESOURCES:
        base = package / "resources" / resource
        for source in [base] if base.is_file() else sorted(base.rglob("*.py")):
            tree = ast.parse(source.read_text())
            classes = [node for node in tree.body if isinstance(node, ast.ClassDef)
                       and node.name.endswith("Resource") and not node.name.startswith("Async")]
            for node in (n for cls in classes for n in ast.walk(cls)):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in HTTP_CALLS and node.args):
                    continue
                target = node.args[0]
                if isinstance(target, ast.Call) and target.args:
                    target = target.args[0]  # path_template("…", …)
                if isinstance(target, ast.Constant):
                    operations.add((HTTP_CALLS[node.func.attr], _shape(target.value)))
    return operations


def readme_unsupported() -> set[tuple[str, str]]:
    """The routes of the API overview's table of operations this server does not serve."""
    readme = (REPO / "docs" / "api" / "overview.md").read_text()
    section = readme.split("## Operations of today's SDK not served here", 1)[1]
    # Its paragraph, then its table if it has one (the next block is another's otherwise).
    blocks = section.strip("\n").split("\n\n")
    table = blocks[1] if len(blocks) > 1 and blocks[1].startswith("| route | what it is |") else ""
    return {(method, _shape(path)) for method, path in re.findall(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/[^`]+)` \|",
                                                                   table, re.M)}


@pytest.fixture(scope="module")
def served(control_plane) -> set[tuple[str, str]]:
    document = httpx.get(f"{control_plane.base_url}/openapi.json", timeout=30).json()
    return {(method.upper(), _shape(path)) for path, item in document["paths"].items() for method in item}


def test_every_sdk_operation_is_served_or_listed_as_not_supported(served):
    operations = sdk_operations()
    assert len(operations) > 70, operations
    unsupported = readme_unsupported()
    missing = sorted(operations - served - unsupported)
    assert missing == [], f"neither served nor in the docs' table: {missing}"


def test_routes_not_supported_answer_404_saying_so(control_plane):
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    for method, shape in sorted(readme_unsupported()):
        path = shape.replace("{}", "x")
        answer = httpx.request(method, f"{control_plane.base_url}{path}", headers=auth, json={}, timeout=30)
        assert answer.status_code == 404, (method, path, answer.text)
        assert "not supported by this server" in answer.json()["message"], (method, path, answer.text)
