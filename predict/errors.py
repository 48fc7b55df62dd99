"""Typed errors of the predictor and the exit statuses the CLI ends with.

Library code raises these; `predict.__main__` alone turns them into a one-line
`error: ...` message and an exit status, and the server into an HTTP status.
"""
from mljob import errors as _core
from mljob.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE


class PredictError(_core.MljobError):
    """Base of the predictor's errors; `exit_status` says how the CLI ends."""

    exit_status = EXIT_FAILED


class UsageError(PredictError, _core.UsageError):
    """Flags, files or URLs are wrong; the message says the fix."""

    exit_status = EXIT_USAGE


class ModelLoadError(UsageError):
    """The model dir holds no export we can read, or restoring it failed."""


class InputError(UsageError):
    """An input line or request is malformed; `where` names it (`line 3`, `instance 2`)."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class InstanceError(ValueError):
    """One instance does not fit the signature; raised per instance, without its index
    (the caller knows where the instance came from and names it)."""


MAX_MESSAGE_CHARS = 1000  # an error answer never echoes a client's megabyte back


def shown(value, limit: int = 60) -> str:
    """A client's name (an input, a key, a signature) as an error quotes it: its repr,
    cut to `limit` characters with its full length said."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} chars)"


def clip(message: str) -> str:
    """An error answer's text, at most MAX_MESSAGE_CHARS."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} chars)"


__all__ = ["shown", "clip", "MAX_MESSAGE_CHARS", "PredictError", "UsageError",
           "ModelLoadError", "InputError", "InstanceError", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE"]
