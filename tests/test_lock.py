"""The virtual environment is exactly requirements.lock, and the lock satisfies pyproject.toml.

Two machines that bootstrap a week apart must run the same software, so "it learned on my
machine" can only mean the machine. `make lock` refreshes the lock; bootstrap installs it.
"""

from __future__ import annotations

import re
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# pip's own tools, which bootstrap upgrades before it installs the lock, and the project.
NOT_LOCKED = {"pip", "wheel", "post-training-console"}


def locked() -> dict[str, str]:
    pins = re.findall(
        r"^([A-Za-z0-9._-]+)==(\S+) \\$", (ROOT / "requirements.lock").read_text(), re.M
    )
    return {canonicalize_name(name): version for name, version in pins}


def installed() -> dict[str, str]:
    """What the environment installed: distributions in its site-packages. Once imported,
    setuptools puts its vendored copies (packaging, platformdirs, ...) on sys.path, and an
    earlier test in the same process may have imported it; those copies are not installed."""
    site = {
        Path(p).resolve() for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))
    }
    return {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in metadata.distributions()
        if canonicalize_name(dist.metadata["Name"]) not in NOT_LOCKED
        and Path(str(dist.locate_file(""))).resolve() in site
    }


def test_every_locked_package_carries_a_sha256_hash():
    text = (ROOT / "requirements.lock").read_text()
    pins = len(locked())
    assert pins > 100
    assert len(re.findall(r"^    --hash=sha256:[0-9a-f]{64}$", text, re.M)) == pins


def test_the_environment_holds_exactly_the_locked_versions():
    pins, present = locked(), installed()
    wrong = {n: (v, pins[n]) for n, v in present.items() if n in pins and pins[n] != v}
    assert not wrong, f"installed (version, locked version): {wrong}; run scripts/bootstrap.sh"
    unlocked = sorted(set(present) - set(pins))
    assert not unlocked, f"installed but not locked: {unlocked}; run `make lock`"
    missing = sorted(set(pins) - set(present))
    assert not missing, f"locked but not installed: {missing}; run scripts/bootstrap.sh"


def test_the_lock_satisfies_every_requirement_in_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    unmet = [
        str(r)
        for r in requirements
        if canonicalize_name(r.name) not in pins
        or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not unmet, f"pyproject.toml asks for what the lock lacks: {unmet}; run `make lock`"
