"""One error base for every mljob package, the exit statuses, and the one-line form of
an exception that every message quotes.

Library code raises subclasses of `MljobError`; each CLI's top layer alone turns them
into `error: ...` and `exit_status`. The statuses follow Kubeflow's TFJob `ExitCode`
policy, which the launcher's restart policies read: 1-127 are permanent failures,
128-255 retryable.
"""
from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILED = 1              # a bug or an unrecoverable error: do not retry
EXIT_USAGE = 2               # bad flags, config, data or URLs: the user must fix them
EXIT_CANCELLED = 130         # as a shell reports a command stopped by Ctrl-C
EXIT_PREEMPTED = 143         # SIGTERM (128 + 15): checkpoint saved, restart and resume
EXIT_PEER_UNAVAILABLE = 200  # a ps/worker/chief became unreachable: restart and resume


class MljobError(Exception):
    """Base of every mljob error; `exit_status` says how the command ends."""

    exit_status = EXIT_FAILED


class UsageError(MljobError):
    """The user's input is wrong; the message names it and the fix."""

    exit_status = EXIT_USAGE


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (its type's name when it has
    none), at most `limit` characters: enough to name a cause in a one-line error."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(exc).__name__


def too_many_digits(exc: BaseException) -> str | None:
    """For Python's refusal to read an integer longer than its string conversion limit
    (a ValueError from json, yaml and int()), a message naming the problem; else None."""
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return (f"an integer of more than {sys.get_int_max_str_digits()} digits; no value "
                "here is that large")
    return None
