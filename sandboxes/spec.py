"""SandboxSpec: what a sandbox may use, validated field by field."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandboxes.errors import SandboxSpecError

DRIVERS = ("bwrap", "podman", "docker")
NETWORK_MODES = ("none", "loopback")

#: Defences that a machine may be unable to provide. A spec names the ones it can live without
#: in ``allow_weaker``; a sandbox missing any other one refuses to start.
DEFENCES = (
    "cgroup_memory",  # memory limit and OOM kill through a memory cgroup
    "cgroup_pids",  # process-count limit through a pids cgroup
    "cgroup_cpu",  # CPU quota through a cpu cgroup
    "cgroup_kill",  # killing every process of the sandbox through its cgroup (freezer/kill)
    "disk_limit",  # a size-limited private filesystem for the work directory
    "privilege_drop",  # running as an unprivileged uid (when the caller is root)
    "seccomp",  # the syscall filter (sandboxes.seccomp) and, with network "none", no IP sockets
)

WORK_DIR = "/work"
TMP_DIR = "/tmp"  # noqa: S108 - the sandbox's own private /tmp, not the host's

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LimitBounds:
    """The accepted range of one numeric sandbox limit, both ends included.

    ``whole`` limits take integers only. Every layer that checks a limit (the rubric schema,
    the console's forms, API and database) reads these, so none accepts what a sandbox refuses.
    """

    minimum: float
    maximum: float
    default: float
    unit: str
    description: str
    whole: bool = True

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.whole and not isinstance(value, int):
            return False
        return self.minimum <= value <= self.maximum  # False for NaN

    def message(self) -> str:
        kind = "an integer" if self.whole else "a number"
        low, high = _bound(self.minimum), _bound(self.maximum)
        return f"must be {kind} between {low} and {high} ({self.unit})"

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "integer" if self.whole else "number",
            "minimum": self.minimum,
            "maximum": self.maximum,
            "default": self.default,
            "description": f"{self.description} ({self.unit})",
            "x-message": self.message(),
        }


def _bound(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


#: The one definition of each numeric limit's range; ``SandboxSpec``'s defaults are these.
LIMITS: dict[str, LimitBounds] = {
    # cgroup CPU quotas under ~0.05 of a core starve even the sandbox's own init.
    "cpu": LimitBounds(0.05, 256, 1.0, "cores", "CPU quota", whole=False),
    "memory_mb": LimitBounds(16, 2_097_152, 512, "MB", "memory of each run"),
    # bwrap's init, the supervisor and the command's first process already count.
    "pids": LimitBounds(4, 1_000_000, 64, "processes", "processes and threads alive at once"),
    "disk_mb": LimitBounds(1, 16_777_216, 256, "MB", "size of /work and /tmp together"),
    # Fractions of a second are fine here; the console stores whole seconds.
    "timeout_s": LimitBounds(
        0.1, 86_400, 10.0, "seconds", "wall-clock limit of a run", whole=False
    ),
    "output_limit_bytes": LimitBounds(
        0, 1 << 30, 1024 * 1024, "bytes", "stdout and stderr kept, each"
    ),
    "open_files": LimitBounds(16, 1 << 20, 256, "files", "open file descriptors per process"),
}


@dataclass(frozen=True)
class SandboxSpec:
    """Limits and contents of one sandbox. Invalid values raise :class:`SandboxSpecError`.

    ``image`` is ``None`` (the host's read-only ``/usr``), the name of a registered image, or an
    :class:`sandboxes.images.ImageSpec` (bwrap), or an OCI reference (podman/docker).
    ``allow_weaker`` is ``False`` (refuse to start without every defence), ``True`` (run with
    whatever the machine offers) or names from :data:`DEFENCES`.
    """

    driver: str = "bwrap"
    image: Any = None
    cpu: float = LIMITS["cpu"].default
    memory_mb: int = int(LIMITS["memory_mb"].default)
    pids: int = int(LIMITS["pids"].default)
    disk_mb: int = int(LIMITS["disk_mb"].default)
    timeout_s: float = LIMITS["timeout_s"].default
    network: str = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    allow_weaker: Any = False
    output_limit_bytes: int = int(LIMITS["output_limit_bytes"].default)
    open_files: int = int(LIMITS["open_files"].default)

    def __post_init__(self) -> None:
        errors = _validate(self)
        if errors:
            raise SandboxSpecError(errors)
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "files", dict(self.files))
        object.__setattr__(self, "allow_weaker", _normalise_weaker(self.allow_weaker))
        if isinstance(self.image, Mapping):
            from sandboxes.images import ImageSpec

            object.__setattr__(self, "image", ImageSpec.from_dict(self.image))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        """Builds a spec from plain data (JSON), naming every unknown or bad field at once."""
        if not isinstance(data, Mapping):
            raise SandboxSpecError({"spec": f"must be a mapping, not {type(data).__name__}"})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        kwargs = {k: v for k, v in data.items() if k in known}
        if isinstance(kwargs.get("files"), Mapping):
            kwargs["files"] = {
                path: _decode_file(content) for path, content in kwargs["files"].items()
            }
        try:
            return cls(**kwargs)
        except SandboxSpecError as exc:
            errors = dict(exc.errors)
        else:
            errors = {}
        for name in unknown:
            errors[name] = "unknown field"
        raise SandboxSpecError(errors)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; ``from_dict(spec.to_dict()) == spec``."""
        image: Any = self.image
        if image is not None and not isinstance(image, str):
            image = image.to_dict()
        weaker: Any = self.allow_weaker
        if isinstance(weaker, frozenset):
            weaker = sorted(weaker)
        return {
            "driver": self.driver,
            "image": image,
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "timeout_s": self.timeout_s,
            "network": self.network,
            "env": dict(self.env),
            "files": {
                path: (content if isinstance(content, str) else {"base64": _b64(content)})
                for path, content in self.files.items()
            },
            "allow_weaker": weaker,
            "output_limit_bytes": self.output_limit_bytes,
            "open_files": self.open_files,
        }

    def allows_weaker(self, defence: str) -> bool:
        return self.allow_weaker is True or (
            isinstance(self.allow_weaker, frozenset) and defence in self.allow_weaker
        )


def _b64(content: bytes) -> str:
    import base64

    return base64.b64encode(content).decode("ascii")


def _decode_file(content: Any) -> Any:
    """JSON cannot hold bytes: binary files travel as ``{"base64": "..."}``."""
    if isinstance(content, Mapping) and set(content) == {"base64"}:
        import base64
        import binascii

        try:
            return base64.b64decode(str(content["base64"]), validate=True)
        except binascii.Error:
            return content  # left as is, so validation names the file
    return content


def _normalise_weaker(value: Any) -> bool | frozenset[str]:
    if isinstance(value, bool):
        return value
    return frozenset(value)


def relative_sandbox_path(path: str) -> str:
    """Normalises a path given relative to /work (or absolute under /work or /tmp).

    Returns a path relative to the sandbox's filesystem root, e.g. ``work/src/a.py``; raises
    ValueError for anything outside, with ``..`` components, or with NUL bytes.
    """
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError("must be a non-empty string without NUL bytes")
    if any(part == ".." for part in path.split("/")):
        raise ValueError("must not contain '..'")
    absolute = path if path.startswith("/") else posixpath.join(WORK_DIR, path)
    absolute = posixpath.normpath(absolute)
    for top in (WORK_DIR, TMP_DIR):
        if absolute == top:
            raise ValueError(f"names the directory {top} itself, not a file in it")
        if absolute.startswith(top + "/"):
            return absolute.lstrip("/")
    raise ValueError(f"must lie under {WORK_DIR} or {TMP_DIR}")


def _validate(spec: SandboxSpec) -> dict[str, str]:
    errors: dict[str, str] = {}
    if spec.driver not in DRIVERS:
        errors["driver"] = f"must be one of {', '.join(DRIVERS)}"
    if spec.image is not None and not isinstance(spec.image, str | Mapping):
        from sandboxes.images import ImageSpec

        if not isinstance(spec.image, ImageSpec):
            errors["image"] = "must be null, an image name, or an image definition"
    if isinstance(spec.image, str) and not spec.image.strip():
        errors["image"] = "must not be empty"
    if isinstance(spec.image, Mapping):
        from sandboxes.images import ImageSpec

        try:
            ImageSpec.from_dict(spec.image)
        except SandboxSpecError as exc:
            errors["image"] = str(exc)
    for name, bounds in LIMITS.items():
        if not bounds.accepts(getattr(spec, name)):
            errors[name] = bounds.message()
    if spec.network not in NETWORK_MODES:
        errors["network"] = f"must be one of {', '.join(NETWORK_MODES)}"
    if not isinstance(spec.env, Mapping):
        errors["env"] = "must be a mapping of names to strings"
    else:
        bad = [
            str(k)
            for k, v in spec.env.items()
            if not isinstance(k, str)
            or not _ENV_NAME.match(k)
            or not isinstance(v, str)
            or "\x00" in v
        ]
        if bad:
            errors["env"] = (
                f"bad variables {', '.join(sorted(bad))}: names must match "
                "[A-Za-z_][A-Za-z0-9_]* and values be strings without NUL"
            )
    if not isinstance(spec.files, Mapping):
        errors["files"] = "must be a mapping of paths to str or bytes"
    else:
        problems = []
        for path, content in spec.files.items():
            try:
                relative_sandbox_path(path)
            except ValueError as exc:
                problems.append(f"{path!r} {exc}")
                continue
            if not isinstance(content, str | bytes):
                problems.append(f"{path!r} content must be str or bytes")
        if problems:
            errors["files"] = "; ".join(problems)
    weaker = spec.allow_weaker
    if not isinstance(weaker, bool):
        if isinstance(weaker, str) or not isinstance(weaker, Iterable):
            errors["allow_weaker"] = "must be true, false or a list of defence names"
        else:
            unknown = sorted(str(name) for name in weaker if name not in DEFENCES)
            if unknown:
                errors["allow_weaker"] = (
                    f"unknown defences {', '.join(unknown)}; known: {', '.join(DEFENCES)}"
                )
    return errors


def default_max_active() -> int:
    return max(1, os.cpu_count() or 1)
