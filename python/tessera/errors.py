"""Tessera's exceptions: one base class carrying the gRPC status code.

Every failure of a call raises a subclass of :class:`Error`; those that
Python users would catch by their builtin kind also derive from it
(``NotFoundError`` is a ``KeyError``, ``InvalidArgumentError`` a
``ValueError``, ``OutOfRangeError`` an ``IndexError``).
"""

from __future__ import annotations

__all__ = [
    "Error",
    "NotFoundError",
    "AlreadyExistsError",
    "InvalidArgumentError",
    "OutOfRangeError",
    "UnavailableError",
    "DeadlineExceededError",
    "DataLossError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "AbortedError",
]

# absl::StatusCode (the gRPC codes) by number.
_CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failed Tessera call: ``code`` (the gRPC code's name, e.g.
    ``"NOT_FOUND"``), ``code_value`` (its number) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        self.code_value = int(code)
        self.code = _CODE_NAMES.get(self.code_value, str(code))
        self.message = message
        super().__init__(f"{self.code}: {message}")

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class NotFoundError(Error, KeyError):
    """An unknown tensor, shard or checkpoint."""


class AlreadyExistsError(Error):
    """A name already taken."""


class InvalidArgumentError(Error, ValueError):
    """A bad size, dtype, spec, region or argument."""


class OutOfRangeError(Error, IndexError):
    """A region outside the tensor."""


class UnavailableError(Error):
    """A daemon is dead, shutting down, re-forming or refilling."""


class DeadlineExceededError(Error):
    """The call's deadline passed. For a create, delete, reshard, save or
    load the message says whether it was logged and names its request id:
    ``Client.operation(id)`` tells whether it ran."""


class DataLossError(Error):
    """Bytes arrived corrupted (a checksum mismatch) or a reply was
    malformed."""


class FailedPreconditionError(Error):
    """The cluster's state does not allow the call (a degraded tensor, a
    layout the operation does not support...)."""


class ResourceExhaustedError(Error):
    """A request too large for a daemon's memory budget or limits."""


class PermissionDeniedError(Error):
    """The token's role does not allow the call."""


class UnauthenticatedError(Error):
    """No token, or an unknown one."""


class AbortedError(Error):
    """A conflict with another operation under way, applying nothing: a
    write into a tensor being resharded, or a reshard while a version is
    open (asked again until the timeout first). The call can be made
    again."""


_CLASSES: dict[int, type[Error]] = {
    3: InvalidArgumentError,
    4: DeadlineExceededError,
    5: NotFoundError,
    6: AlreadyExistsError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    10: AbortedError,
    11: OutOfRangeError,
    14: UnavailableError,
    15: DataLossError,
    16: UnauthenticatedError,
}


def from_status(code: int, message: str) -> Error:
    """The exception for an absl/gRPC status (used by the C++ module)."""
    return _CLASSES.get(int(code), Error)(code, message)
