"""Snapshots: a sandbox's /work, working directory and spec, as one file a caller can keep."""

from __future__ import annotations

import io
import json
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.errors import SandboxError

FORMAT = "sandboxes.snapshot/1"


@dataclass(frozen=True)
class Snapshot:
    """``spec`` is ``SandboxSpec.to_dict()``; ``work_archive`` an uncompressed tar of /work."""

    spec: dict[str, Any]
    cwd: str
    work_archive: bytes
    image_digest: str | None = None
    created_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        meta = {
            "format": FORMAT,
            "spec": self.spec,
            "cwd": self.cwd,
            "image_digest": self.image_digest,
            "created_at": self.created_at,
        }
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, payload in (
                ("snapshot.json", json.dumps(meta, sort_keys=True).encode()),
                ("work.tar", self.work_archive),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                info.mtime = int(self.created_at)
                tar.addfile(info, io.BytesIO(payload))
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                meta_file = tar.extractfile("snapshot.json")
                work_file = tar.extractfile("work.tar")
                if meta_file is None or work_file is None:
                    raise SandboxError("not a sandbox snapshot: members missing")
                meta = json.loads(meta_file.read())
                work = work_file.read()
        except (tarfile.TarError, KeyError, ValueError) as exc:
            raise SandboxError(f"not a sandbox snapshot: {exc}") from exc
        if meta.get("format") != FORMAT:
            raise SandboxError(f"unknown snapshot format {meta.get('format')!r}")
        return cls(
            spec=meta["spec"],
            cwd=meta["cwd"],
            work_archive=work,
            image_digest=meta.get("image_digest"),
            created_at=meta.get("created_at", 0.0),
        )

    def save(self, path: str | Path) -> Path:
        """Writes the snapshot atomically (a crash never leaves half a file under ``path``)."""
        target = Path(path)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(self.to_bytes())
        partial.replace(target)
        return target

    @classmethod
    def load(cls, path: str | Path) -> Snapshot:
        return cls.from_bytes(Path(path).read_bytes())
