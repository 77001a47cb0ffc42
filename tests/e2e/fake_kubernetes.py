"""A fake Kubernetes API server and test kubelets, for testing the Kubernetes runtime
without a cluster (none can run on these machines).

The API server implements, as the Kubernetes API documents them, the pod operations the
runtime uses: create (201; 409 AlreadyExists), get (404 NotFound as a Status), list with
label and field selectors, watch (chunked JSON events from a resourceVersion; 410 Expired
for one too old), delete (graceful: deletionTimestamp first, gone once the kubelet has
stopped the pod) and the status subresource (409 Conflict on a stale resourceVersion).
Every object has a `uid`, a `resourceVersion` and a `creationTimestamp`. It also
schedules: a new pod goes to the Ready node matching its nodeSelector with the fewest
pods.

A `Kubelet` is a "node": it watches the pods bound to it through the API, and runs each
pod's container as real processes in a network namespace of the pod's own (a veth pair
to this host; the pod IP is its end), as the pod's `runAsUser` (a host uid), in a
bubblewrap mount namespace made from the "image" (this host's /usr, read-only, plus the
image's files) and the pod's emptyDir volumes (memory-backed when asked). It reports the
phase, the pod IP and the container's state through the status subresource. It does not
apply seccomp profiles or resource limits. `kill()` is a node lost: its processes die at
once; as Kubernetes' node lifecycle controller does, its pods are marked not ready, then
evicted once their toleration of `node.kubernetes.io/unreachable` runs out (300 s unless
the pod says otherwise): deleted, with a `DisruptionTarget` condition, and Terminating
until deleted without grace, since no kubelet will confirm it.
"""

from __future__ import annotations

import copy
import datetime
import http.server
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from harness import descendants, send_json

POD_PATH = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)/pods(?:/([a-z0-9.-]+))?(/status)?$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# Events kept for watches; a watch from an older resourceVersion gets 410 Gone.
KEPT_EVENTS = 1000


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def matches_labels(pod: dict, selector: str) -> bool:
    labels = pod["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


FIELDS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "spec.nodeName": lambda pod: pod["spec"].get("nodeName", ""),
    "status.phase": lambda pod: pod.get("status", {}).get("phase", ""),
}


def matches_fields(pod: dict, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        negate = "!=" in term
        key, value = re.split(r"!=|==|=", term, maxsplit=1)
        if key not in FIELDS:
            raise ValueError(f"field label not supported: {key}")
        if (FIELDS[key](pod) == value) == negate:
            return False
    return True


class FakeApiServer:
    """The pods of every namespace, with their history for watches, behind HTTP."""

    def __init__(self, token: str):
        self.token = token
        self.lock = threading.Condition()
        self.pods: dict[tuple[str, str], dict] = {}
        self.version = 0
        self.events: list[tuple[int, str, dict]] = []
        self.nodes: dict[str, dict] = {}  # name -> {"labels": {...}, "ready": bool}
        # Secrets that pods mount, by (namespace, name): {key: bytes}. Set by the test
        # (the runtime never reads or writes secrets).
        self.secrets: dict[tuple[str, str], dict[str, bytes]] = {}
        self.requests: list[tuple[str, str]] = []
        # Watches from a version below this get 410 Gone (see `expire_watches`).
        self.expired_before = 0
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        """A kubeconfig for this server (YAML is a superset of JSON)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "runtime", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "runtime",
                                                      "namespace": namespace}}],
        }))
        return path

    # The store: every change bumps the resourceVersion and is kept for watches.

    def _record(self, kind: str, pod: dict) -> None:
        self.version += 1
        pod["metadata"]["resourceVersion"] = str(self.version)
        self.events.append((self.version, kind, copy.deepcopy(pod)))
        del self.events[:-KEPT_EVENTS]
        self.lock.notify_all()

    def create(self, namespace: str, pod: dict) -> tuple[int, dict]:
        metadata = pod.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name", "")
        if not NAME.match(name):
            return 422, status_object(422, "Invalid", f"Pod {name!r} is invalid: metadata.name")
        if not (pod.get("spec") or {}).get("containers"):
            return 422, status_object(422, "Invalid", "Pod is invalid: spec.containers: Required value")
        with self.lock:
            if (namespace, name) in self.pods:
                return 409, status_object(409, "AlreadyExists", f'pods "{name}" already exists')
            metadata.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now())
            metadata.pop("deletionTimestamp", None)
            pod["status"] = {"phase": "Pending"}
            self._schedule(pod)
            self.pods[(namespace, name)] = pod
            self._record("ADDED", pod)
            return 201, copy.deepcopy(pod)

    def _schedule(self, pod: dict) -> None:
        wanted = pod["spec"].get("nodeSelector") or {}
        load = {name: 0 for name, node in self.nodes.items() if node["ready"]
                and all(node["labels"].get(key) == value for key, value in wanted.items())}
        for other in self.pods.values():
            if other["spec"].get("nodeName") in load:
                load[other["spec"]["nodeName"]] += 1
        if not load:
            pod["status"]["conditions"] = [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": f"0/{len(self.nodes)} nodes are available"}]
            return
        pod["spec"]["nodeName"] = min(load, key=lambda name: (load[name], name))
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]

    def get(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod else None

    def list(self, namespace: str, labels: str, fields: str) -> tuple[list[dict], int]:
        with self.lock:
            return [copy.deepcopy(pod) for (ns, _), pod in sorted(self.pods.items())
                    if ns == namespace and matches_labels(pod, labels)
                    and matches_fields(pod, fields)], self.version

    def delete(self, namespace: str, name: str, grace: int | None) -> tuple[int, dict]:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, status_object(404, "NotFound", f'pods "{name}" not found')
            if not pod["spec"].get("nodeName") or grace == 0:
                # Never scheduled, or deleted without grace: gone at once.
                del self.pods[(namespace, name)]
                self._record("DELETED", pod)
            elif "deletionTimestamp" not in pod["metadata"]:
                pod["metadata"]["deletionTimestamp"] = now()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
                self._record("MODIFIED", pod)
            return 200, copy.deepcopy(pod)

    def finalize(self, namespace: str, name: str) -> None:
        """The kubelet stopped a deleted pod: it is gone."""
        with self.lock:
            pod = self.pods.pop((namespace, name), None)
            if pod is not None:
                self._record("DELETED", pod)

    def replace_status(self, namespace: str, name: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, status_object(404, "NotFound", f'pods "{name}" not found')
            version = (body.get("metadata") or {}).get("resourceVersion")
            if version and version != pod["metadata"]["resourceVersion"]:
                return 409, status_object(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the object has been modified')
            pod["status"] = body.get("status") or {}
            self._record("MODIFIED", pod)
            return 200, copy.deepcopy(pod)

    def add_node(self, name: str, labels: dict | None = None) -> None:
        with self.lock:
            self.nodes[name] = {"labels": {"kubernetes.io/hostname": name, **(labels or {})},
                                "ready": True}

    def node_lost(self, name: str) -> None:
        """The node lifecycle controller: a node stopped reporting. Its pods are marked
        not ready, and evicted when their toleration of an unreachable node runs out."""
        with self.lock:
            self.nodes[name]["ready"] = False
            for pod in self.pods.values():
                if pod["spec"].get("nodeName") != name:
                    continue
                for condition in pod["status"].get("conditions", []):
                    if condition["type"] == "Ready":
                        condition.update(status="False", reason="NodeNotReady")
                self._record("MODIFIED", pod)
                after = next((toleration.get("tolerationSeconds", 300)
                              for toleration in pod["spec"].get("tolerations") or []
                              if toleration.get("key") == "node.kubernetes.io/unreachable"), 300)
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                timer = threading.Timer(after, self._evict, args=key)
                timer.daemon = True
                timer.start()

    def _evict(self, namespace: str, name: str) -> None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None or "deletionTimestamp" in pod["metadata"]:
                return
            pod["metadata"]["deletionTimestamp"] = now()
            pod["metadata"]["deletionGracePeriodSeconds"] = 30
            pod["status"].setdefault("conditions", []).append({
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint"})
            self._record("MODIFIED", pod)

    def expire_watches(self) -> None:
        """Compacts the history: open watches end with 410 Gone, as after an etcd
        compaction, and must list again."""
        with self.lock:
            self.events.clear()
            # A revision of its own (as a compaction is), which lists return from now on.
            self.version += 1
            self.expired_before = self.version
            self.lock.notify_all()

    def watch(self, write, namespace: str, labels: str, fields: str, since: int, timeout: float) -> None:
        """Streams the changes after `since`; from 0, the current pods first (as ADDED).
        A watch whose next change is no longer kept gets 410 Gone."""
        def wanted(pod: dict) -> bool:
            return pod["metadata"]["namespace"] == namespace and matches_labels(pod, labels) \
                and matches_fields(pod, fields)

        deadline = time.monotonic() + timeout
        with self.lock:
            position = since
            if since == 0:
                position = self.version
                current = [copy.deepcopy(pod) for pod in self.pods.values() if wanted(pod)]
        if since == 0:
            for pod in current:
                write({"type": "ADDED", "object": pod})
        expired = {"type": "ERROR", "object": status_object(410, "Expired", f"too old resource version: {since}")}
        while time.monotonic() < deadline:
            with self.lock:
                oldest = self.events[0][0] if self.events else self.version + 1
                if position + 1 < oldest or position < self.expired_before:
                    pending = None
                else:
                    pending = [event for event in self.events if event[0] > position]
                    if not pending:
                        self.lock.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                        continue
            if pending is None:
                write(expired)
                return
            for version, kind, pod in pending:
                position = version
                if wanted(pod):
                    write({"type": kind, "object": pod})

    def _handler(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, code: int, body: dict) -> None:
                send_json(self, code, body)

            def _body(self) -> dict:
                length = int(self.headers.get("content-length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _route(self):
                url = urlparse(self.path)
                api.requests.append((self.command, url.path))
                if self.headers.get("authorization") != f"Bearer {api.token}":
                    self._reply(401, status_object(401, "Unauthorized", "Unauthorized"))
                    return None
                match = POD_PATH.match(url.path)
                if not match:
                    self._reply(404, status_object(404, "NotFound", "the server could not find the requested resource"))
                    return None
                query = {key: values[-1] for key, values in parse_qs(url.query).items()}
                return match.group(1), match.group(2), bool(match.group(3)), query

            def do_GET(self):
                route = self._route()
                if route is None:
                    return
                namespace, name, _, query = route
                if name:
                    pod = api.get(namespace, name)
                    if pod is None:
                        self._reply(404, status_object(404, "NotFound", f'pods "{name}" not found'))
                    else:
                        self._reply(200, pod)
                    return
                labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
                try:
                    matches_fields({"metadata": {"name": "", "namespace": ""}, "spec": {}}, fields)
                except ValueError as error:
                    self._reply(400, status_object(400, "BadRequest", str(error)))
                    return
                if query.get("watch") in ("true", "1"):
                    self._watch(namespace, labels, fields, query)
                    return
                items, version = api.list(namespace, labels, fields)
                limit = int(query.get("limit") or 0)
                self._reply(200, {"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(version)},
                                  "items": items[:limit] if limit else items})

            def _watch(self, namespace, labels, fields, query):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

                def write(event):
                    data = json.dumps(event).encode() + b"\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                try:
                    since = int(query.get("resourceVersion") or 0)
                    api.watch(write, namespace, labels, fields, since,
                              float(query.get("timeoutSeconds") or 1800))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def do_POST(self):
                route = self._route()
                if route is None:
                    return
                namespace, name, _, _ = route
                if name:
                    self._reply(405, status_object(405, "MethodNotAllowed", "method not allowed"))
                    return
                self._reply(*api.create(namespace, self._body()))

            def do_DELETE(self):
                route = self._route()
                if route is None:
                    return
                namespace, name, _, query = route
                body = self._body()
                grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                self._reply(*api.delete(namespace, name, None if grace is None else int(grace)))

            def do_PUT(self):
                route = self._route()
                if route is None:
                    return
                namespace, name, status, _ = route
                if not (name and status):
                    self._reply(405, status_object(405, "MethodNotAllowed", "only the status subresource can be replaced"))
                    return
                self._reply(*api.replace_status(namespace, name, self._body()))

        return Handler


class Image:
    """A container image's files on this host: /usr and chosen /etc entries of the host
    (read-only) plus `files` (target path -> host path), copied once to a directory
    every pod user can read (a "pull")."""

    ETC = ["alternatives", "ca-certificates", "chromium.d", "fonts", "host.conf", "hosts",
           "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types",
           "nsswitch.conf", "ssl", "X11", "xdg"]

    def __init__(self, files: dict[str, Path]):
        self.dir = Path(tempfile.mkdtemp(prefix="fake-image-"))
        os.chmod(self.dir, 0o755)
        self.binds: list[tuple[Path, str]] = []
        for index, (target, source) in enumerate(files.items()):
            copy_to = self.dir / str(index)
            if source.is_dir():
                shutil.copytree(source, copy_to, symlinks=True)
            else:
                shutil.copy2(source, copy_to)
            self.binds.append((copy_to, target))
        (self.dir / "passwd").write_text("root:x:0:0::/root:/bin/sh\nkernel:x:1000:1000::/home/kernel:/bin/sh\n")
        (self.dir / "group").write_text("root:x:0:\nkernel:x:1000:\n")
        subprocess.run(["chmod", "-R", "a+rX", str(self.dir)], check=True)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Kubelet:
    """One node: runs the pods the API server binds to it."""

    _addresses = itertools.count(1)

    def __init__(self, api: FakeApiServer, name: str, images: dict[str, Image], node_index: int,
                 namespace: str):
        self.api, self.name, self.images, self.index = api, name, images, node_index
        self.namespace = namespace
        self.stopping: set[tuple[str, str]] = set()
        # Pod addresses: /30 blocks of 10.244.<node index>.0/24.
        self.free_slots = list(range(64))
        self.waiting: dict[tuple[str, str], str] = {}
        self.retry_at: dict[tuple[str, str], float] = {}
        self.pods: dict[tuple[str, str], dict] = {}  # running pods: process, netns, dirs
        self.lock = threading.Lock()
        self.alive = True
        self.dir = Path(tempfile.mkdtemp(prefix=f"fake-node-{name}-"))
        os.chmod(self.dir, 0o755)
        api.add_node(name)
        self.thread = threading.Thread(target=self._sync_loop, daemon=True)
        self.thread.start()

    # The API as a client: the kubelet learns of its pods by polling its node's pods (a
    # list with a field selector) and reports through the status subresource.

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.api.url + path, method=method, data=json.dumps(body).encode() if body else None,
            headers={"authorization": f"Bearer {self.api.token}", "content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def _report(self, pod: dict, status: dict) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for _ in range(5):
            code, current = self._request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            if code != 200:
                return
            current["status"] = {**current.get("status", {}), **status}
            code, _ = self._request("PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", current)
            if code != 409:
                return

    def _sync_loop(self) -> None:
        while self.alive:
            code, listed = self._request(
                "GET", f"/api/v1/namespaces/{self.namespace}/pods?fieldSelector=spec.nodeName%3D{self.name}")
            if code == 200 and self.alive:
                for pod in listed["items"]:
                    try:
                        self._sync(pod)
                    except Exception as error:  # noqa: BLE001 - a kubelet keeps going
                        print(f"kubelet {self.name}: {pod['metadata']['name']}: {error!r}", flush=True)
            self._watch_processes()
            time.sleep(0.1)

    def _sync(self, pod: dict) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self.lock:
            running = self.pods.get(key)
        if "deletionTimestamp" in pod["metadata"]:
            if running is None:
                self.api.finalize(*key)
            elif key not in self.stopping:
                self.stopping.add(key)
                grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
                threading.Thread(target=self._stop, args=(key, grace), daemon=True).start()
        elif running is None and pod["status"].get("phase") == "Pending":
            self._start(key, pod)

    def _watch_processes(self) -> None:
        with self.lock:
            running = list(self.pods.items())
        for key, state in running:
            code = state["process"].poll()
            if code is not None and not state.get("reported_exit"):
                state["reported_exit"] = True
                self._report(state["pod"], {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [self._container_status(state["pod"], terminated={
                        "exitCode": code if code >= 0 else 128 - code,
                        "reason": "Completed" if code == 0 else "Error"})]})

    @staticmethod
    def _container_status(pod: dict, **state) -> dict:
        container = pod["spec"]["containers"][0]
        return {"name": container["name"], "image": container["image"], "imageID": "",
                "ready": "running" in state, "restartCount": 0, "state": state}

    def _waiting(self, key: tuple[str, str], pod: dict, reason: str, message: str) -> None:
        """Reports why a pod's container is not running (once per reason), and tries
        again in a second at the earliest."""
        self.retry_at[key] = time.monotonic() + 1
        if self.waiting.get(key) != reason:
            self.waiting[key] = reason
            self._report(pod, {"containerStatuses": [self._container_status(
                pod, waiting={"reason": reason, "message": message})]})

    def _start(self, key: tuple[str, str], pod: dict) -> None:
        if time.monotonic() < self.retry_at.get(key, 0):
            return
        container = pod["spec"]["containers"][0]
        image = self.images.get(container["image"])
        if image is None:
            self._waiting(key, pod, "ErrImagePull", f"image {container['image']} not found")
            return
        for volume in pod["spec"].get("volumes") or []:
            name = (volume.get("secret") or {}).get("secretName")
            if name and (key[0], name) not in self.api.secrets:
                self._waiting(key, pod, "CreateContainerConfigError", f'secret "{name}" not found')
                return
        if not self.free_slots:
            self._waiting(key, pod, "NetworkNotReady", "no pod address left on this node")
            return
        slot = self.free_slots.pop(0)
        number = next(Kubelet._addresses)
        # Unique across test runs on this host too (at most 15 characters for a link).
        tag = f"{os.getpid() % 1000}x{number}"
        netns = f"kp{tag}"
        host_ip = f"10.244.{self.index}.{slot * 4 + 1}"
        pod_ip = f"10.244.{self.index}.{slot * 4 + 2}"
        pod_dir = self.dir / pod["metadata"]["uid"]
        pod_dir.mkdir(exist_ok=True)
        os.chmod(pod_dir, 0o755)
        try:
            for command in [
                ["ip", "netns", "add", netns],
                ["ip", "link", "add", f"kvh{tag}", "type", "veth", "peer", "name", f"kvp{tag}"],
                ["ip", "link", "set", f"kvp{tag}", "netns", netns],
                ["ip", "addr", "add", f"{host_ip}/30", "dev", f"kvh{tag}"],
                ["ip", "link", "set", f"kvh{tag}", "up"],
                ["ip", "-n", netns, "addr", "add", f"{pod_ip}/30", "dev", f"kvp{tag}"],
                ["ip", "-n", netns, "link", "set", f"kvp{tag}", "up"],
                ["ip", "-n", netns, "link", "set", "lo", "up"],
                ["ip", "-n", netns, "route", "add", "default", "via", host_ip],
            ]:
                subprocess.run(command, check=True, capture_output=True)
            security = {**(pod["spec"].get("securityContext") or {}), **(container.get("securityContext") or {})}
            uid, gid = security.get("runAsUser", 0), security.get("runAsGroup", security.get("runAsUser", 0))
            argv = ["ip", "netns", "exec", netns,
                    "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
                    "bwrap", "--unshare-user", "--uid", str(uid), "--gid", str(gid),
                    "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", pod["metadata"]["name"][:63],
                    "--new-session", "--proc", "/proc", "--dev", "/dev", "--ro-bind", "/usr", "/usr"]
            for link, target in [("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")]:
                argv += ["--symlink", target, link]
            for entry in Image.ETC:
                if Path("/etc", entry).exists():
                    argv += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
            argv += ["--ro-bind", str(image.dir / "passwd"), "/etc/passwd",
                     "--ro-bind", str(image.dir / "group"), "/etc/group"]
            for source, target in image.binds:
                argv += ["--ro-bind", str(source), target]
            volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
            for mount in container.get("volumeMounts") or []:
                volume = volumes[mount["name"]]
                if "secret" in volume:
                    data = self.api.secrets[(key[0], volume["secret"]["secretName"])]
                    host_dir = pod_dir / mount["name"]
                    host_dir.mkdir(exist_ok=True)
                    items = volume["secret"].get("items") or [{"key": name, "path": name} for name in data]
                    for item in items:
                        (host_dir / item["path"]).write_bytes(data[item["key"]])
                        os.chmod(host_dir / item["path"], volume["secret"].get("defaultMode", 0o644))
                    argv += ["--ro-bind", str(host_dir), mount["mountPath"]]
                elif (volume.get("emptyDir") or {}).get("medium") == "Memory":
                    argv += ["--perms", "1777", "--tmpfs", mount["mountPath"]]
                else:
                    host_dir = pod_dir / mount["name"]
                    host_dir.mkdir(exist_ok=True)
                    os.chown(host_dir, uid, gid)
                    argv += ["--bind", str(host_dir), mount["mountPath"]]
            if security.get("readOnlyRootFilesystem"):
                argv += ["--remount-ro", "/"]
            argv += ["--", *(container.get("command") or []), *(container.get("args") or [])]
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOSTNAME": pod["metadata"]["name"]}
            env.update({var["name"]: var.get("value", "") for var in container.get("env") or []})
            log = open(pod_dir / "container.log", "wb")
            process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
        except (OSError, subprocess.CalledProcessError, KeyError) as error:
            self._clean_network(netns)
            shutil.rmtree(pod_dir, ignore_errors=True)
            self.free_slots.append(slot)
            self._waiting(key, pod, "CreateContainerError", repr(error))
            return
        with self.lock:
            self.pods[key] = {"process": process, "netns": netns, "dir": pod_dir, "pod": pod,
                              "log": log, "slot": slot}
        self.waiting.pop(key, None)
        self._report(pod, {
            "phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "hostIP": host_ip,
            "startTime": now(),
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [self._container_status(pod, running={"startedAt": now()})]})

    def pod_processes(self, key: tuple[str, str]) -> set[int]:
        """Every process of a running pod (bwrap and what it started)."""
        with self.lock:
            state = self.pods.get(key)
        return descendants(state["process"].pid) | {state["process"].pid} if state else set()

    def _stop(self, key: tuple[str, str], grace: float) -> None:
        with self.lock:
            state = self.pods.get(key)
        if state is None:
            return
        process = state["process"]
        # Everything of the container, taken now: what outlives the command is reparented
        # away from it, and a container runtime kills all of a container's processes
        # when it ends (they share its cgroup and PID namespace).
        container = {pid: _started(pid) for pid in descendants(process.pid)}
        # SIGTERM to the container's command (under bwrap's init in the pod's PID
        # namespace), then SIGKILL to everything after the grace period.
        for init in children(process.pid):
            for pid in children(init):
                signal_quietly(pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            for pid in descendants(process.pid) | {process.pid}:
                signal_quietly(pid, signal.SIGKILL)
            process.wait(timeout=10)
        for pid, started in container.items():
            # The same process still, not another that took its pid since.
            if started is not None and _started(pid) == started:
                signal_quietly(pid, signal.SIGKILL)
        self._clean(key)
        self.stopping.discard(key)
        self.api.finalize(*key)

    def _clean(self, key: tuple[str, str]) -> None:
        with self.lock:
            state = self.pods.pop(key, None)
        if state is None:
            return
        state["log"].close()
        self._clean_network(state["netns"])
        shutil.rmtree(state["dir"], ignore_errors=True)
        self.free_slots.append(state["slot"])

    @staticmethod
    def _clean_network(netns: str) -> None:
        # The veth pair goes with the namespace.
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)

    def kill(self) -> None:
        """The node is lost: its processes die now, and it reports nothing more."""
        self.alive = False
        self.thread.join(timeout=10)
        with self.lock:
            keys = list(self.pods)
        for key in keys:
            with self.lock:
                state = self.pods.get(key)
            if state is None:
                continue
            process = state["process"]
            for pid in descendants(process.pid) | {process.pid}:
                signal_quietly(pid, signal.SIGKILL)
            process.wait(timeout=10)
            self._clean(key)
        self.api.node_lost(self.name)

    def close(self) -> None:
        if self.alive:
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _started(pid: int) -> int | None:
    """When the process started (clock ticks after boot), if it is there."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def children(parent: int) -> list[int]:
    """The direct children of a process."""
    return [pid for pid in descendants(parent) if _parent_of(pid) == parent]


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
