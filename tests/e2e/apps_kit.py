"""Helpers of the apps tests: app archives, event streams, processes of app sandboxes."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

APPS = Path(__file__).resolve().parent / "apps"


def zip_of(files: dict[str, str], folder: str | None = None) -> bytes:
    """A ZIP holding `files` (path → text), under `folder` when given."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(f"{folder}/{name}" if folder else name, text)
    return buffer.getvalue()


def python_app(requirements: str = "kernel==0.131.0\n") -> bytes:
    return zip_of({
        "main.py": (APPS / "python_app.py").read_text(),
        "requirements.txt": requirements,
    }, folder="e2e-python")


def follow(stream) -> list:
    """Every event of an SDK `follow` stream until it ends, as JSON dicts."""
    events = []
    for event in stream:
        events.append(event.to_dict(mode="json") if hasattr(event, "to_dict") else dict(event))
    return events


def app_processes_left() -> list[str]:
    """Command lines of processes still running an app's build or action."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "/run/app/" in command or "app-sandbox" in command:
            found.append(command)
    return found


def data_file(control_plane, name: str) -> str:
    return os.fspath(control_plane.data_dir / name)
