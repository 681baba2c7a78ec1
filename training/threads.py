"""The process's torch CPU thread budget, settable whatever has patched ``torch.set_num_threads``.

vLLM's CPU worker replaces ``torch.set_num_threads`` with a function that only logs a warning
(it binds its OpenMP threads once and wants nobody to change them). Its engine runs in the
trainer's process here, so after the first vLLM engine starts, every later
``torch.set_num_threads`` in the process silently does nothing: a run's ``cpu_threads`` was not
given back at the end, and the engine's own restore after start-up was a no-op. The patch
rebinds the name ``torch.set_num_threads``, not the function in ``torch._C`` it names; this
module calls that function, and everything in ``training`` sets threads through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["cpu_threads", "set_cpu_threads"]

# torch.set_num_threads is this binding re-exported; vLLM rebinds the name in the torch module,
# not the binding in torch._C.
_set_num_threads = torch._C.set_num_threads


def set_cpu_threads(count: int) -> int:
    """Sets torch's intra-op CPU threads to ``count`` (> 0); returns the count before."""
    if count < 1:
        raise ValueError(f"thread count must be >= 1, got {count}")
    before = torch.get_num_threads()
    _set_num_threads(count)
    return before


@contextlib.contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """``count`` threads inside the block (``None`` or 0: unchanged), the previous count after."""
    if not count:
        yield
        return
    before = set_cpu_threads(count)
    try:
        yield
    finally:
        _set_num_threads(before)
