# SPDX-License-Identifier: Apache-2.0
"""devstage's failures as Python exceptions: one class per status code of the C interface, each
carrying its message (which call, which sizes, which backend). A leaf: it imports nothing of the
package, so every module may raise these."""
from typing import Optional, Type


class Error(Exception):
    """A devstage call that failed. `status` is the code's name ("busy", "out_of_memory", ...);
    str(error) is the message."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class OutOfMemory(Error, MemoryError):
    """The backend (or a cap) could not provide the bytes asked for."""


class InvalidArgument(Error, ValueError):
    """The caller passed something the contract forbids."""


class Busy(Error):
    """In use: every pipeline slot is held, a run or stream is in use, or memory the engine still
    views would be freed. The message names what holds it."""


class BackendFailure(Error):
    """The backend failed (a runtime call, or a callback that returned non-zero)."""


class HostFunctionError(BackendFailure):
    """A Python host function (launch_host_function) raised; reported by the wait() of the run it
    was launched for, or by the synchronize() of its stream."""


class UnknownPointer(Error, ValueError):
    """A pointer never handed out, or already given back."""


class NotSupported(Error):
    """The backend or stager lacks the capability."""


class LibraryNotFound(Error, ImportError):
    """libdevstage_c, or a runtime library it loads (libcudart, libascendcl), is missing."""


class Leaked(Error):
    """Memory was still held when its owner went away (it was freed then)."""


# Index: devstage_status value (devstage_status_name's names, and each code's class).
STATUS_NAMES = ("ok", "out_of_memory", "invalid_argument", "busy", "backend_failure", "unknown_pointer",
                "not_supported", "library_not_found", "leaked")
_CLASSES = (Error, OutOfMemory, InvalidArgument, Busy, BackendFailure, UnknownPointer, NotSupported, LibraryNotFound,
            Leaked)


def error_class(status: int) -> Type[Error]:
    """The exception class of a devstage_status value (Error for a value outside the list)."""
    return _CLASSES[status] if 0 < status < len(_CLASSES) else Error


def status_name(status: int) -> str:
    return STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "unknown"


def make(status: int, message: str, cls: Optional[Type[Error]] = None) -> Error:
    """The exception of a devstage_status that is not DEVSTAGE_OK, with `message`."""
    return (cls or error_class(status))(status_name(status), message)


def busy(message: str) -> Busy:
    return Busy("busy", message)


def invalid(message: str) -> InvalidArgument:
    return InvalidArgument("invalid_argument", message)
