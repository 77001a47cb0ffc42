"""A trivial action's synchronous invocation (`POST /invocations`, until the answer) of a
warm deployment, next to running the same Python function in a fresh local `python3 -c`
process (the deployment's own virtual environment, importing the app's module as the
action does), measured back to back in the same run. Goal: at most 1.5x."""

from __future__ import annotations

import io
import json
import subprocess
import time
import zipfile
from pathlib import Path

from harness import ControlPlane
from scenarios import alternate, api_client

RUNS = 30
WARMUP = 3

APP = '''
import kernel

app = kernel.App("bench")


@app.action("echo")
def echo(ctx, payload):
    return payload
'''


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server, timeout=120)
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as zip_file:
            zip_file.writestr("main.py", APP)
            zip_file.writestr("requirements.txt", "kernel==0.131.0\n")
        deployment = http.post(
            "/deployments",
            files={"file": ("app.zip", archive.getvalue(), "application/zip")},
            data={"entrypoint_rel_path": "main.py", "version": "1"},
        ).raise_for_status().json()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = http.get(f"/deployments/{deployment['id']}").raise_for_status().json()["status"]
            if status in ("running", "failed"):
                break
            time.sleep(0.5)
        assert status == "running", status
        app_dir = server.data_dir / "apps" / "deployments" / deployment["id"] / "app"
        payload = {"n": 1}
        body = {"app_name": "bench", "action_name": "echo", "version": "1",
                "payload": json.dumps(payload)}

        def invoke() -> float:
            started = time.perf_counter()
            answer = http.post("/invocations", json=body).raise_for_status().json()
            elapsed = time.perf_counter() - started
            assert answer["status"] == "succeeded" and json.loads(answer["output"]) == payload, answer
            return elapsed

        local = (
            "import json, kernel, main; "
            "print(json.dumps(main.echo(kernel.KernelContext(invocation_id='local'), "
            f"{payload!r})))"
        )

        def reference() -> float:
            started = time.perf_counter()
            output = subprocess.run([str(app_dir / ".venv" / "bin" / "python"), "-c", local],
                                    cwd=app_dir, check=True, capture_output=True, text=True)
            elapsed = time.perf_counter() - started
            assert json.loads(output.stdout) == payload
            return elapsed

        ours, references = alternate(invoke, reference, RUNS, WARMUP)
        report("invocation: a trivial action, invoked synchronously", ours,
               {"fresh local python3 -c": references}, percentiles=(50, 90))
    finally:
        server.reap_everything()
