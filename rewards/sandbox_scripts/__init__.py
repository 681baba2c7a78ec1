"""Scripts the code criteria copy into a sandbox and run there with ``python3 -I``.

They use the standard library only (the sandbox's Python is the system's) and are read as
text with `script_text`; nothing here is imported by the host side.
"""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def script_text(name: str) -> str:
    return (Path(__file__).parent / name).read_text(encoding="utf-8")
