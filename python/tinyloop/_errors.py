"""tinyloop.Error: a failed library call, with its status and the calling thread's message."""

import enum

from . import _capi


class Status(enum.IntEnum):
    """tl_status values of capi/include/tinyloop.h; the header's name is "TL_ERR_" + the member's name."""

    OK = 0
    INVALID_ARGUMENT = -1
    OUT_OF_MEMORY = -2
    IO = -3
    FORMAT = -4
    UNSUPPORTED = -5
    NO_DEVICE = -6
    CUDA = -7
    INTERNAL = -8
    BUFFER_TOO_SMALL = -9
    NOT_FOUND = -10
    CANCELLED = -11


class Error(Exception):
    """A library call failed.

    status: a Status (an int; a value this package does not know, from a newer library, stays a plain int);
    status_name: the header's name ("TL_ERR_IO"); message: tl_last_error_message() read right after the failing
    call on the same thread (it names the argument, tensor or file at fault); function: the C function."""

    def __init__(self, function, status, message):
        try:
            self.status = Status(status)
        except ValueError:
            self.status = int(status)
        self.status_name = _capi.STATUS_NAMES.get(int(status), f"unknown status {int(status)}")
        self.message = message
        self.function = function
        super().__init__(f"{function}: {self.status_name} ({int(status)}): {message}")

    def __reduce__(self):
        return (type(self), (self.function, int(self.status), self.message))


def check(lib, function, status):
    """Raises Error for a failed status, with the message of this thread's last call (the one that failed)."""
    if status != _capi.TL_OK:
        message = lib.tl_last_error_message().decode("utf-8", "replace")
        if not message:
            message = lib.tl_status_string(status).decode("utf-8", "replace")
        raise Error(function, status, message)
