"""The training library's typed errors; `exit_status` says how the replica ends.

Library code raises these; one top layer (`mljob.training.main`, or a trainer's own
`main`, like the bundled `trainer.task`) turns them into a one-line message and an exit
status. The launcher's restart policy reads the statuses: as in Kubeflow's TFJob
`ExitCode` policy, 1-127 are permanent failures and 128-255 are retryable.
"""
from mljob import errors as _core
from mljob.errors import EXIT_FAILED, EXIT_PEER_UNAVAILABLE, EXIT_PREEMPTED, EXIT_USAGE


class TrainingError(_core.MljobError):
    """Base of the training library's errors."""

    exit_status = EXIT_FAILED


class UsageError(TrainingError, _core.UsageError):
    """The user's input is wrong (flags, data, URLs, the model); the message says the fix."""

    exit_status = EXIT_USAGE


class PeerUnavailableError(TrainingError):
    """A member of the cluster stopped answering; retryable."""

    exit_status = EXIT_PEER_UNAVAILABLE


class Preempted(TrainingError):
    """Stopped by SIGTERM/SIGINT or the launcher's death, after saving a checkpoint."""

    exit_status = EXIT_PREEMPTED


__all__ = ["TrainingError", "UsageError", "PeerUnavailableError", "Preempted"]
