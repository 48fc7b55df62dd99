"""Typed errors of the replica program and the exit statuses it ends with.

Library code raises these; `trainer.task.main` alone turns them into a one-line message
and an exit status. The launcher's restart policy reads the statuses: as in Kubeflow's
TFJob `ExitCode` policy, 1-127 are permanent failures and 128-255 are retryable.
"""
from mljob import errors as _core
from mljob.cluster import ClusterConfigError
from mljob.errors import EXIT_FAILED, EXIT_OK, EXIT_PEER_UNAVAILABLE, EXIT_PREEMPTED, \
    EXIT_USAGE


class TrainerError(_core.MljobError):
    """Base of the trainer's errors; `exit_status` says how the process ends."""

    exit_status = EXIT_FAILED


class UsageError(TrainerError, _core.UsageError):
    """The user's input is wrong (flags, data files, URLs); the message says the fix."""

    exit_status = EXIT_USAGE


class DataError(UsageError):
    """A data file is missing, truncated or inconsistent."""


class PeerUnavailableError(TrainerError):
    """A member of the cluster stopped answering; retryable."""

    exit_status = EXIT_PEER_UNAVAILABLE


__all__ = ["ClusterConfigError", "TrainerError", "UsageError", "DataError",
           "PeerUnavailableError", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE",
           "EXIT_PEER_UNAVAILABLE", "EXIT_PREEMPTED"]
