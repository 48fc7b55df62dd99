"""Leaving a multi-worker cluster together.

Under MultiWorkerMirroredStrategy TensorFlow's coordination service (hosted by the chief)
takes a task whose heartbeats stop for a crashed one: a worker that ends its run a few
seconds before the chief (while the chief writes its export, or runs the rest of its
script) makes the chief log "The tasks have crashed...", and a chief that ends first
makes the worker log that the leader died. A normal end is neither: every task that
trained waits for the others at a barrier of the coordination service before it exits.

Imports TensorFlow only when the process already has it, and does nothing where the
coordination service is not MultiWorkerMirrored's (one node, parameter servers).
"""
from __future__ import annotations

import sys

# How long a task waits for the slowest one to end (the chief's export, the rest of a
# user's script). A dead task fails the barrier sooner, through its missed heartbeats.
END_TIMEOUT_SECONDS = 3600


def leave_together(name: str, timeout_seconds: float = END_TIMEOUT_SECONDS) -> bool:
    """Wait at the barrier `name` until every coordinated task reaches it. Returns whether
    this process is in a coordinated cluster and the barrier passed; a failed barrier (a
    peer that died, the time out) is not this task's failure, so it returns False."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context
    ctx = context.context()
    config = ctx.coordination_service
    jobs = {job.name for job in config.coordinated_job_list} if config is not None else set()
    # MultiWorkerMirrored's (chief and workers). Under parameter servers the coordinated
    # tasks are the servers, which never end on their own: no barrier there.
    if not jobs or not jobs <= {"chief", "worker"}:
        return False
    try:
        ctx.wait_at_barrier(name, int(timeout_seconds * 1000))
    except Exception:  # a peer's end, reported by the peer's own status
        return False
    return True


__all__ = ["END_TIMEOUT_SECONDS", "leave_together"]
