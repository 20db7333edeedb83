# SPDX-License-Identifier: Apache-2.0
"""devstage's failures as Python exceptions: one class per status code, each carrying the
library's message (which operation, which sizes, which backend)."""


class Error(Exception):
    """A devstage call that did not return DEVSTAGE_OK. `status` is the code's name
    ("busy", "out_of_memory", ...); str(error) is the library's message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class OutOfMemory(Error, MemoryError):
    """The backend (or a cap) could not provide the bytes asked for."""


class InvalidArgument(Error, ValueError):
    """The caller passed something the contract forbids."""


class Busy(Error):
    """In use by a live run, or every pipeline slot is held."""


class BackendFailure(Error):
    """The backend failed (a runtime call, or a callback that returned non-zero)."""


class HostFunctionError(BackendFailure):
    """A Python host function (launch_host_function) raised; reported by the next wait() or
    synchronize() of its stream."""


class UnknownPointer(Error, ValueError):
    """A pointer never handed out, or already given back."""


class NotSupported(Error):
    """The backend or stager lacks the capability."""


class LibraryNotFound(Error, ImportError):
    """libdevstage_c, or a runtime library it loads (libcudart, libascendcl), is missing."""


class Leaked(Error):
    """Memory was still held when its owner went away (it was freed then)."""


# Index: devstage_status value.
_BY_CODE = (None, OutOfMemory, InvalidArgument, Busy, BackendFailure, UnknownPointer, NotSupported,
            LibraryNotFound, Leaked)


def error_of(status):
    """The exception of a devstage_status that is not DEVSTAGE_OK, with this thread's last
    message (take it right after the call, on the same thread)."""
    from ._lib import lib
    message = lib.devstage_last_message().decode(errors="replace")
    name = lib.devstage_status_name(status).decode()
    cls = _BY_CODE[status] if 0 < status < len(_BY_CODE) else Error
    return cls(name, message)


def check(status):
    """Raises the exception of a devstage_status that is not DEVSTAGE_OK."""
    if status != 0:
        raise error_of(status)
