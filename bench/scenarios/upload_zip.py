"""`POST /browsers/{id}/fs/upload_zip` of a ~200 MB archive of mixed files (compressible
text and incompressible binary, 4 KiB to 4 MiB) until the answer, next to `unzip -q` of
the same archive on the same disk. Ours includes the upload itself (HTTP, gRPC, scratch
file); unzip reads the archive from disk."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

from harness import ControlPlane, vm_root
from scenarios import api_client

RUNS = 3
TARGET_COMPRESSED_BYTES = 200 * 1024 * 1024


def build_archive(path: Path) -> tuple[int, int]:
    """Writes the archive; answers (entries, expanded bytes)."""
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)]
    entries = expanded = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        while path.stat().st_size < TARGET_COMPRESSED_BYTES:
            size = int(2 ** rng.uniform(12, 22))
            if rng.random() < 0.5:
                name, data = f"data/bin/{entries:05}.bin", rng.randbytes(size)
            else:
                text = b" ".join(rng.choices(words, k=size // 6)) + b"\n"
                name, data = f"docs/{entries % 50:02}/{entries:05}.txt", text[:size]
            archive.writestr(name, data)
            entries += 1
            expanded += len(data)
    return entries, expanded


def run(work_dir: Path, report) -> None:
    archive = work_dir / "mixed.zip"
    entries, expanded = build_archive(archive)
    size = archive.stat().st_size
    print(f"archive: {size / 2**20:.0f} MiB, {entries} entries, {expanded / 2**20:.0f} MiB expanded")
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server, timeout=600)
        sid = http.post("/browsers", json={"headless": True}).raise_for_status().json()["session_id"]
        root = vm_root(server, sid)
        unzip_dir = work_dir / "unzipped"
        ours, reference = [], []
        for index in range(RUNS):
            with archive.open("rb") as upload:
                started = time.perf_counter()
                http.post(f"/browsers/{sid}/fs/upload_zip", data={"dest_path": f"/extracted{index}"},
                          files={"zip_file": ("mixed.zip", upload, "application/zip")}).raise_for_status()
                ours.append(time.perf_counter() - started)
            assert (root / f"extracted{index}/data").is_dir()
            shutil.rmtree(root / f"extracted{index}")

            shutil.rmtree(unzip_dir, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run(["unzip", "-q", str(archive), "-d", str(unzip_dir)], check=True)
            reference.append(time.perf_counter() - started)
        shutil.rmtree(unzip_dir, ignore_errors=True)
        report(f"upload_zip of {size / 2**20:.0f} MiB until the answer", ours, {"unzip -q": reference})
        print(f"throughput: ours {size / 2**20 / sorted(ours)[len(ours) // 2]:.0f} MiB/s, "
              f"unzip {size / 2**20 / sorted(reference)[len(reference) // 2]:.0f} MiB/s (archive bytes)")
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        server.reap_everything()
