"""One error base for every mljob package, the exit statuses, and the one-line form of
an exception that every message quotes.

Library code raises subclasses of `MljobError`; one error boundary (`boundary`), which
every command-line program (`python -m submit`, `python -m predict`,
`tensorflow_model_server`, `python -m trainer.task` and a trainer calling
`mljob.training.main`) runs its body in, alone turns them into `error: ...` and
`exit_status`. The statuses follow Kubeflow's TFJob `ExitCode`
policy, which the launcher's restart policies read: 1-127 are permanent failures,
128-255 retryable.
"""
from __future__ import annotations

import os
import select
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

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


def ascii_digits(text: str) -> bool:
    """Whether int() can take text as it is written and every other reader reads it the
    same: ASCII digits only. str.isdigit() also takes "²" (int() fails on it) and
    isdecimal() "３" and "٣" (int() reads them, TensorFlow and HTTP do not)."""
    return text.isascii() and text.isdecimal()


def too_many_digits(exc: BaseException) -> str | None:
    """For Python's refusal to read an integer longer than its string conversion limit
    (a ValueError from json, yaml and int()), a message naming the problem; else None."""
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return (f"an integer of more than {sys.get_int_max_str_digits()} digits; no value "
                "here is that large")
    return None


def boundary(call: Callable[[], int | None], *, program: str) -> int:
    """Run a command-line program's body and return its exit status; what escapes it
    becomes one line on stderr:

    - an `MljobError` (a usage error, a typed failure): `error: MESSAGE`, its
      `exit_status` (2 for the user's mistakes);
    - Ctrl-C: `error: interrupted`, 130;
    - output closed by its reader (`... | head`): nothing more, 0;
    - any other `OSError` (a storage failure after its retries, a file the system
      refused): `error: MESSAGE`, 1;
    - anything else is a bug: its traceback, then `error: PROGRAM failed with an
      unexpected error (traceback above)`, 1.

    `call` returns the status (None for 0); a `SystemExit` passes through."""
    try:
        status = call()
        return EXIT_OK if status is None else int(status)
    except MljobError as exc:
        say(str(exc))
        return exc.exit_status
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_CANCELLED
    except BrokenPipeError as exc:
        if _reader_gone():
            return EXIT_OK
        say(str(exc))
        return EXIT_FAILED
    except OSError as exc:
        say(str(exc))
        return EXIT_FAILED
    except Exception:  # a bug: keep the traceback, it is what a report needs
        traceback.print_exc()
        say(f"{program} failed with an unexpected error (traceback above)")
        return EXIT_FAILED


def needs_extra(exc: ModuleNotFoundError, program: str, extra: str) -> NoReturn:
    """A program started from an install without its extra: one line naming the missing
    module and the install that brings it, exit 2. A module of ours missing is a bug:
    re-raised."""
    top = (exc.name or "").split(".")[0]
    if not top or top in ("mljob", "trainer", "submit", "predict"):
        raise exc
    say(f"{program} needs {top}, which mljob's `{extra}` extra installs: pip install "
        f"'mljob[{extra}]'")
    raise SystemExit(EXIT_USAGE)


def say(message: str) -> None:
    """`error: MESSAGE` on stderr, as one line (a message's own line breaks would read
    as several errors)."""
    try:
        print("error: " + " ".join(message.split()), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed too: nobody to tell
        pass


def _reader_gone() -> bool:
    """True when stdout's reader has gone (the broken pipe was ours to write); stdout is
    then pointed at /dev/null, so the interpreter's last flush does not fail again."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(event & select.POLLERR for _, event in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no such stream, or no poll here
        return False
    return True
