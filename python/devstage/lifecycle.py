# SPDX-License-Identifier: Apache-2.0
"""What is alive at interpreter exit, and the order it ends in.

At exit, before Python stops its threads, every stager ends first (its pending work waited for
while the threads of a Python runtime's streams can still run it), then every backend waits for
its device, so that no host function is left to call into a stopping interpreter. Stagers and
backends register here when they are made; each module keeps its own state private.
"""
import atexit
import weakref
from typing import Any

_stagers: "weakref.WeakSet[Any]" = weakref.WeakSet()
_backends: "weakref.WeakSet[Any]" = weakref.WeakSet()


def stager_made(stager: Any) -> None:
    """`stager` ends at exit through its _shutdown()."""
    _stagers.add(stager)


def backend_made(backend: Any) -> None:
    """`backend` waits for its device at exit through its _synchronize_quietly()."""
    _backends.add(backend)


def stream_users(backend: Any, handle: int) -> int:
    """How many runs of `backend`'s stagers are bound on the stream `handle`, or wait to finish
    on it, and have not ended (Stream.close is refused while any)."""
    count = 0
    for stager in list(_stagers):
        if stager.backend is backend:
            count += sum(1 for _, holder in stager._holders() if holder._on_stream(handle))  # pylint: disable=protected-access
    return count


@atexit.register
def _at_exit() -> None:
    for stager in list(_stagers):
        stager._shutdown()  # pylint: disable=protected-access
    for backend in list(_backends):
        backend._synchronize_quietly()  # pylint: disable=protected-access
