"""Typed errors of the launcher; `submit.__main__` alone turns them into `error: ...` lines.

Usage errors (exit status 2) are found before anything is built, staged or started: the
user must change a flag, config.yaml or the package. Job errors (exit status 1) happen
while preparing or running a job that was valid.
"""

from mljob import errors as _core
from mljob.errors import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_USAGE  # noqa: F401


class SubmitError(_core.MljobError):
    """Base of the launcher's errors; `exit_status` says how the command ends."""

    exit_status = EXIT_FAILED


class UsageError(SubmitError, _core.UsageError):
    """A flag, config key or value is wrong; the message names it and the fix."""

    exit_status = EXIT_USAGE


class ConfigError(UsageError):
    """config.yaml (or JSON) is unreadable, too big, or has unknown keys or wrong types."""


class PackageError(SubmitError):
    """The package cannot be built, staged, downloaded or installed."""


class PackageUsageError(UsageError):
    """The package path is wrong (no setup.py) or an archive is unsafe to extract."""


class JobNotFoundError(UsageError):
    """No job of that id is in the local index."""


class JobFailed(SubmitError):
    """The job ended FAILED; the message names the replica and its exit status."""


class JobCancelled(SubmitError):
    """The job ended CANCELLED (Ctrl-C, SIGTERM or `jobs cancel`)."""

    exit_status = EXIT_CANCELLED
