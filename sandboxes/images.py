"""Sandbox images for the bwrap driver: the host's base system plus a setup script, run once.

An :class:`ImageSpec` names files to copy into ``/image`` and a shell script that runs (once,
inside a sandbox, with ``/image`` writable and the spec's network mode) to fill it, e.g.::

    ImageSpec(name="py-tools", setup="python3 -m venv /image/venv && "
              "/image/venv/bin/pip install --no-index --find-links /image/wheels ruff",
              files={"wheels/ruff-....whl": b"..."},
              env={"PATH": "/image/venv/bin:/usr/bin:/bin"})

The result is cached under ``SANDBOXES_IMAGE_CACHE`` (default ``/var/tmp/sandboxes-images``)
by a digest of every input and of the base system (``/etc/os-release`` and the system
Python), and every later sandbox mounts it read-only at ``/image``; each ExecResult records
the digest. There is no internet here, so a setup script installs from files it was given.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.errors import ImageBuildError, SandboxError, SandboxSpecError
from sandboxes.workspace import ensure_private_dir

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class ImageSpec:
    name: str
    setup: str = ""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    network: str = "none"
    build_timeout_s: float = 600.0
    build_memory_mb: int = 2048
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        errors: dict[str, str] = {}
        if not isinstance(self.name, str) or not self.name or not set(self.name) <= _NAME_CHARS:
            errors["name"] = "must be a non-empty name of letters, digits, '.', '_' or '-'"
        if not isinstance(self.setup, str):
            errors["setup"] = "must be a shell script (a string)"
        if not isinstance(self.files, Mapping) or any(
            not isinstance(p, str)
            or not p
            or p.startswith("/")
            or ".." in p.split("/")
            or not isinstance(c, str | bytes)
            for p, c in self.files.items()
        ):
            errors["files"] = "must map relative paths (no '..') to str or bytes"
        if not isinstance(self.env, Mapping) or any(
            not isinstance(k, str) or not isinstance(v, str) for k, v in self.env.items()
        ):
            errors["env"] = "must map names to strings"
        if self.network not in ("none", "loopback"):
            errors["network"] = "must be none or loopback"
        if errors:
            raise SandboxSpecError({f"image.{k}": v for k, v in errors.items()})
        object.__setattr__(self, "files", dict(self.files))
        object.__setattr__(self, "env", dict(self.env))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageSpec:
        known = {name for name, f in cls.__dataclass_fields__.items() if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SandboxSpecError({f"image.{k}": "unknown field" for k in unknown})
        values = dict(data)
        if isinstance(values.get("files"), Mapping):
            values["files"] = {
                p: base64.b64decode(c["base64"]) if isinstance(c, Mapping) else c
                for p, c in values["files"].items()
            }
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "setup": self.setup,
            "files": {
                p: c if isinstance(c, str) else {"base64": base64.b64encode(c).decode()}
                for p, c in self.files.items()
            },
            "env": dict(self.env),
            "network": self.network,
            "build_timeout_s": self.build_timeout_s,
            "build_memory_mb": self.build_memory_mb,
        }

    def digest(self) -> str:
        """sha256 of everything that decides the image's contents (not its name).

        Computed once per object: an image's files can be large and every sandbox start asks.
        """
        if self._digest is not None:
            return self._digest
        inputs = {
            "base": base_system_identity(),
            "setup": self.setup,
            "files": {
                p: hashlib.sha256(c.encode() if isinstance(c, str) else c).hexdigest()
                for p, c in sorted(self.files.items())
            },
            "env": dict(sorted(self.env.items())),
            "network": self.network,
        }
        raw = json.dumps(inputs, sort_keys=True).encode()
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        object.__setattr__(self, "_digest", digest)
        return digest


@dataclass(frozen=True)
class BuiltImage:
    name: str
    digest: str
    path: Path
    env: dict[str, str]


def base_system_identity() -> str:
    """What the host's read-only base contributes: the OS release and the system Python."""
    parts = []
    for path in ("/etc/os-release", "/usr/bin/python3"):
        try:
            real = os.path.realpath(path)
            info = os.stat(real)
            parts.append(f"{real}:{info.st_size}:{int(info.st_mtime)}")
        except OSError:
            parts.append(f"{path}:absent")
    with contextlib.suppress(OSError):
        parts.append(Path("/etc/os-release").read_text())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def image_cache_dir() -> Path:
    return Path(os.environ.get("SANDBOXES_IMAGE_CACHE", "/var/tmp/sandboxes-images"))  # noqa: S108


_registry: dict[str, ImageSpec] = {}
_built: dict[str, BuiltImage] = {}
_build_lock = threading.Lock()


def register_image(image: ImageSpec) -> ImageSpec:
    """Makes ``SandboxSpec(image="<name>")`` resolve to this image in this process."""
    _registry[image.name] = image
    return image


def resolve_image(image: str | ImageSpec) -> BuiltImage:
    if isinstance(image, str):
        if image not in _registry:
            known = ", ".join(sorted(_registry)) or "none registered"
            raise SandboxError(f"unknown image {image!r} (known: {known})")
        image = _registry[image]
    return build_image(image)


def build_image(image: ImageSpec) -> BuiltImage:
    """Builds the image unless a build with the same digest is cached; returns where it is."""
    digest = image.digest()
    with _build_lock:
        if digest in _built and _built[digest].path.is_dir():
            return _built[digest]
        cache = image_cache_dir()
        ensure_private_dir(cache)
        os.chmod(cache, 0o711)  # noqa: S103 - sandboxes must reach their image
        final = cache / digest.replace(":", "-")
        _remove_abandoned_builds(cache)
        with open(cache / f"{final.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per digest across processes
            if not (final / ".complete").exists():
                _build_into(image, digest, cache, final)
        built = BuiltImage(image.name, digest, final / "root", dict(image.env))
        _built[digest] = built
        return built


def _build_into(image: ImageSpec, digest: str, cache: Path, final: Path) -> None:
    from sandboxes.bwrap import BwrapDriver, sandbox_ids
    from sandboxes.sandbox import new_sandbox_name
    from sandboxes.spec import SandboxSpec

    staging = cache / f"build-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    root = staging / "root"
    root.mkdir(parents=True)
    os.chmod(staging, 0o711)  # noqa: S103 - the builder sandbox must reach it
    uid, gid = sandbox_ids()
    try:
        for rel, content in image.files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
        if uid is not None and gid is not None:
            _chown_tree(root, uid, gid)
        if image.setup.strip():
            spec = SandboxSpec(
                memory_mb=image.build_memory_mb,
                pids=256,
                disk_mb=1024,
                timeout_s=image.build_timeout_s,
                network=image.network,
                cpu=float(os.cpu_count() or 1),
            )
            driver = BwrapDriver(
                spec, new_sandbox_name(), image_path=root, writable_image=True, image_digest=digest
            )
            driver.start()
            try:
                result = driver.run(
                    ["/bin/sh", "-ec", image.setup],
                    stdin=None,
                    timeout=image.build_timeout_s,
                    cwd="/image",
                    env=dict(image.env),
                    on_stdout=None,
                    on_stderr=None,
                )
            finally:
                driver.close()
            if not result.ok:
                raise ImageBuildError(
                    f"setup of image {image.name!r} failed (exit {result.exit_code}, "
                    f"timed out {result.timed_out}, OOM {result.oom_killed}):\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
                )
        if os.geteuid() == 0:
            _chown_tree(root, 0, 0)  # the image belongs to root: sandboxes only read it
        (staging / "manifest.json").write_text(
            json.dumps({"digest": digest, "image": image.to_dict()}, indent=1)
        )
        (staging / ".complete").touch()
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _remove_abandoned_builds(cache: Path) -> None:
    """Staging dirs ``build-<pid>-...`` of builders that died mid-build."""
    from sandboxes.janitor import owner_alive

    for entry in cache.iterdir():
        if entry.name.startswith("build-") and not owner_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)
