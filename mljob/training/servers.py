"""The ps and worker replicas of a ParameterServerStrategy job.

Under ParameterServerStrategy only the chief runs Python training code; parameter servers
and workers run a `tf.distribute.Server` that the chief's coordinator drives over gRPC.
TensorFlow gives such servers no way to stop (`server.join()` blocks forever, and that is
why Cloud ML's and Kubeflow's parameter servers famously outlived their jobs), so here the
main thread waits on the replica's `StopSignal` (`mljob.training.signals`: SIGTERM,
SIGINT, the launcher's death) instead, and the process ends with `os._exit`.

A server stopped this way exits 143 (EXIT_PREEMPTED, as SIGTERM's default would): a ps
or worker has no work of its own to finish, so it never exits 0, and a launcher's
restart policy (ExitCode, OnFailure) brings back one stopped from outside while the job
runs; a replica that exits 0 finished and is never restarted.
"""
from __future__ import annotations

import sys

from mljob import startup
from mljob.cluster import ClusterInfo
from mljob.errors import EXIT_PREEMPTED
from mljob.training.signals import StopSignal, exit_now, say


def serve(info: ClusterInfo, stop: StopSignal) -> int:
    """Run this replica's gRPC server until stopped; never returns normally (os._exit),
    since TensorFlow's server threads would keep the interpreter from exiting."""
    tf = startup.tensorflow_for_a_server()  # without Keras: a server runs no Python model
    startup.mark("tensorflow")
    cluster = tf.train.ClusterSpec(info.tf_config()["cluster"])
    tf.distribute.Server(cluster, job_name=info.task_type, task_index=info.task_index,
                         protocol="grpc", start=True)
    startup.mark("server")
    stop.install()  # after the server: TensorFlow's runtime may set its own handlers
    print(f"{info.task_name} serving {info.task_type} {info.task_index} at {info.address}",
          flush=True)
    while not stop.wait(3600):
        pass
    say(f"{info.task_name} stopping: {stop.reason()}", sys.stdout)
    exit_now(EXIT_PREEMPTED)


__all__ = ["serve"]
