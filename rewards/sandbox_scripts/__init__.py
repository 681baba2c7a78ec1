"""Scripts the code criteria copy into a sandbox and run there with ``python3 -I``.

They use the standard library only (the sandbox's Python is the system's) and are read as
text with `script_text`; nothing here is imported by the host side.

A script run as ``__main__`` is compiled at every start (Python caches only imported
modules), which for the judge costs more than the tests it runs; `script_bytecode` compiles
it once on the host and `BOOT` runs that bytecode when the sandbox's Python has the same
bytecode version (its magic number), else compiles the source as before.
"""

from __future__ import annotations

import functools
import importlib.util
import marshal
from pathlib import Path

BOOT = """\
import marshal, sys
with open(sys.argv[1], "rb") as file:
    data = file.read()
if data[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER:
    code = marshal.loads(memoryview(data)[16:])
else:
    with open(sys.argv[2], encoding="utf-8") as file:
        code = compile(file.read(), sys.argv[2], "exec")
del sys.argv[1:3]
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@functools.cache
def script_text(name: str) -> str:
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


@functools.cache
def script_bytecode(name: str) -> bytes:
    """The script compiled by the host's Python, in the layout of a ``.pyc`` file."""
    code = compile(script_text(name), name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)
