"""deploy/kubernetes: valid against the official Kubernetes schemas (offline, with
`kubernetes-validate`), and consistent with the control plane it deploys."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from harness import CONTROL_PLANE, REPO

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

MANIFESTS = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"


def validate(*paths: Path) -> subprocess.CompletedProcess:
    validator = Path(sys.executable).parent / "kubernetes-validate"
    return subprocess.run([str(validator), "--strict", "-k", KUBERNETES_VERSION, *map(str, paths)],
                          capture_output=True, text=True)


def resources() -> list[dict]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(kind: str, name: str) -> dict:
    return next(doc for doc in resources() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_every_manifest_validates_against_the_kubernetes_schemas(tmp_path):
    files = [path for path in sorted(MANIFESTS.glob("*.yaml")) if path.name != "kustomization.yaml"]
    checked = validate(*files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every resource was checked, none skipped for an unknown kind.
    passed = re.findall(r"passed for resource", checked.stdout + checked.stderr)
    assert len(passed) == len(resources()), checked.stdout + checked.stderr

    # The validator does reject what Kubernetes would (strict: an unknown field).
    broken = tmp_path / "broken.yaml"
    broken.write_text((MANIFESTS / "browser-pod.yaml").read_text().replace(
        "automountServiceAccountToken: false", "automountServiceAccountTokens: false"))
    assert validate(broken).returncode != 0


def test_the_kustomization_names_files_that_exist():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    named = kustomization["resources"] + kustomization["configMapGenerator"][0]["files"]
    assert all((MANIFESTS / name).is_file() for name in named), named
    assert "secret.example.yaml" not in named


def test_the_deployment_matches_the_control_plane_and_the_pod_template():
    deployment = one("Deployment", "control-plane")
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    env = {var["name"]: var for var in container["env"]}
    # Every setting is one the control plane reads.
    known = set(re.findall(r"env: (CONTROL_PLANE_[A-Z0-9_]+)",
                           subprocess.run([str(CONTROL_PLANE), "serve", "--help"], capture_output=True,
                                          text=True, check=True).stdout))
    settings = {name for name in env if name.startswith("CONTROL_PLANE_")}
    assert settings <= known, settings - known
    assert env["CONTROL_PLANE_RUNTIME"]["value"] == "kubernetes"
    # The pod template is mounted where the control plane is told to read it.
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-template")
    volume = next(v for v in pod_spec["volumes"] if v["name"] == "pod-template")
    assert volume["configMap"]["name"] == "browser-pod-template"
    assert env["CONTROL_PLANE_KUBERNETES_POD_TEMPLATE"]["value"] == f"{mount['mountPath']}/browser-pod.yaml"
    # Secrets come from the Secret, never from the manifest.
    for name in ("CONTROL_PLANE_DATABASE_URL", "CONTROL_PLANE_CREDENTIAL_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "browser-service"

    # The service account may do with pods what the runtime does, in its namespace only.
    role = one("Role", "browser-pods")
    assert role["metadata"]["namespace"] == env["CONTROL_PLANE_KUBERNETES_NAMESPACE"]["value"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["create", "get", "list", "watch", "delete"]}]
    assert not [doc for doc in resources() if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_network_policy_admits_only_the_control_plane_to_the_agent():
    template = yaml.safe_load((MANIFESTS / "browser-pod.yaml").read_text())
    agent_port = template["spec"]["containers"][0]["ports"][0]["containerPort"]
    policy = one("NetworkPolicy", "browser-pods")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "browser-service"}
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": agent_port, "protocol": "TCP"}]
    assert ingress["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "control-plane"}}}]
    public = [rule for rule in policy["spec"]["egress"] if "ipBlock" in rule["to"][0]][0]
    v4 = public["to"][0]["ipBlock"]
    assert v4["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(v4["except"])
