"""Errors raised by the sandboxes library. Every one derives from :class:`SandboxError`."""

from __future__ import annotations

from collections.abc import Mapping


class SandboxError(Exception):
    """Anything that went wrong while creating, running or tearing down a sandbox."""


class SandboxSpecError(SandboxError, ValueError):
    """A spec with bad fields; ``errors`` maps each bad field to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]):
        self.errors = dict(errors)
        detail = "; ".join(f"{name}: {problem}" for name, problem in self.errors.items())
        super().__init__(f"invalid sandbox spec: {detail}")


class WeakerIsolationError(SandboxError):
    """The kernel or the machine cannot provide a defence the spec did not allow to be missing.

    ``missing`` names each defence (see ``sandboxes.spec.DEFENCES``) and ``reasons`` says why.
    """

    def __init__(self, reasons: Mapping[str, str]):
        self.missing = sorted(reasons)
        self.reasons = dict(reasons)
        detail = "; ".join(f"{name} ({why})" for name, why in sorted(self.reasons.items()))
        super().__init__(
            "refusing to start a sandbox without these defences: "
            f"{detail}. Pass allow_weaker=[...] naming them to run with weaker isolation."
        )


class SandboxPathError(SandboxError, ValueError):
    """A path given to write_files/read_file that leaves the sandbox or crosses a symlink."""


class EngineUnavailableError(SandboxError):
    """No container engine (podman/docker) answers on this machine."""


class ImageBuildError(SandboxError):
    """An image's setup script failed; the message carries the tail of its output."""
