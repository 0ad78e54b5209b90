"""The exceptions spin_dsa raises: one per library StatusCode (include/spin/status.h).

Each carries the library's own message. They also derive from the closest built-in exception, so
``except ValueError`` catches bad arguments as a Python user expects.
"""


class SpinError(Exception):
    """Base of every error the spin library reports."""


class InvalidArgument(SpinError, ValueError):
    """A shape, size, pointer or value the call does not support (StatusCode::kInvalidArgument)."""


class InvalidType(InvalidArgument, TypeError):
    """An argument of the wrong kind: a float, bool or string array where integers are expected, a
    list where an array is, a wrong dtype, non-contiguous or negative strides on a big array. It is
    an InvalidArgument (so a SpinError and a ValueError) and a TypeError."""


class OutOfRange(SpinError, IndexError):
    """An index (slot, layer, page, block, position) outside what exists."""


class ResourceExhausted(SpinError, MemoryError):
    """A pool or budget ran out (e.g. a context longer than the serving object was sized for)."""


class FailedPrecondition(SpinError, RuntimeError):
    """The call is valid, but not in the object's current state (protocol order, free slot)."""


class DataLoss(SpinError, ValueError):
    """A file is truncated or corrupt."""


class IoError(SpinError, OSError):
    """The operating system refused a read or write."""


__all__ = ["SpinError", "InvalidArgument", "InvalidType", "OutOfRange", "ResourceExhausted",
           "FailedPrecondition", "DataLoss", "IoError"]
