"""Typed errors of the bundled trainer and the exit statuses it ends with.

They are the training library's (`mljob.training.errors`), so `trainer.task.main`
reports the library's errors and the trainer's own (bad data files) alike.
"""
from mljob.cluster import ClusterConfigError
from mljob.errors import EXIT_FAILED, EXIT_OK, EXIT_PEER_UNAVAILABLE, EXIT_PREEMPTED, \
    EXIT_USAGE
from mljob.training.errors import PeerUnavailableError, UsageError
from mljob.training.errors import TrainingError as TrainerError


class DataError(UsageError):
    """A data file is missing, truncated or inconsistent."""


__all__ = ["ClusterConfigError", "TrainerError", "UsageError", "DataError",
           "PeerUnavailableError", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE",
           "EXIT_PEER_UNAVAILABLE", "EXIT_PREEMPTED"]
