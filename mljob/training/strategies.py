"""The distribution strategies and what the training loop needs around them.

- `make_strategy`: the strategy (and, under ps, the coordinator) for a kind chosen by
  `ClusterInfo.strategy_kind`, built from `ClusterInfo.tf_config()` (master renamed to
  chief, evaluators left out), never from the raw TF_CONFIG.
- `make_partitioner`: how `--ps-shards` shards variables over the parameter servers.
- `weight_parts` / `weights_numpy`: Keras 3 variables that may hold a ShardedVariable.
- `peer_named_in`: which replica a gRPC error is about, for the exit-200 message.
"""
from __future__ import annotations

import contextlib
import re
import socket
import time

import keras
import numpy as np
import tensorflow as tf

from mljob.cluster import CHIEF, PS, WORKER, ClusterInfo
from mljob.training.errors import PeerUnavailableError, UsageError
from mljob.training.signals import StopSignal

# Variables at least this big are split over the ps when --ps-shards is 0 (automatic):
# below it, one more gRPC round trip per shard costs more than the bandwidth it spreads.
MIN_SHARD_BYTES = 256 << 10
PEER_WAIT_SECONDS = 120.0  # how long the chief waits for the ps and workers to come up
PEER_POLL_SECONDS = 0.1    # a connect to a peer's port costs ~0.1 ms: look often


def check_collectives_can_start() -> None:
    """MultiWorkerMirroredStrategy configures TensorFlow's collectives, which it can do
    only before TensorFlow first runs in the process: a Keras metric object (or any
    variable) made before training.main has already started it, and TensorFlow's own
    answer is a traceback about program startup. Asked before a replica waits for its
    peers too: a replica that will fail must not wait two minutes for a chief that failed
    the same way first."""
    from tensorflow.python.eager import context
    if context.context()._initialized:
        raise UsageError(
            "TensorFlow already ran in this process before MultiWorkerMirroredStrategy "
            "could configure its collectives (a Keras metric, a variable or a tf.data "
            "dataset made before training.main does that); pass metrics as names and "
            "validation_data as a function, or return a model compiled with its metric "
            "objects from model_fn")


def make_strategy(kind: str, info: ClusterInfo, ps_shards: int = 0):
    """(strategy, coordinator or None) for a strategy kind from ClusterInfo.strategy_kind."""
    if kind == "single":
        return tf.distribute.get_strategy(), None
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy(), None
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(info.tf_config()["cluster"]), task_type=info.task_type,
        task_id=info.task_index, rpc_layer="grpc")
    if kind == "multiworker":
        check_collectives_can_start()
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver), None
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=make_partitioner(ps_shards, info.num_ps))
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def make_partitioner(ps_shards: int, num_ps: int):
    """--ps-shards: 0 automatic (MinSizePartitioner over the ps), 1 none, N fixed."""
    partitioners = tf.distribute.experimental.partitioners
    if ps_shards == 1 or (ps_shards == 0 and num_ps < 2):
        return None
    if ps_shards == 0:
        return partitioners.MinSizePartitioner(min_shard_bytes=MIN_SHARD_BYTES,
                                               max_shards=num_ps)
    return partitioners.FixedShardsPartitioner(num_shards=ps_shards)


def wait_for_peers(info: ClusterInfo, stop: StopSignal,
                   timeout: float = PEER_WAIT_SECONDS) -> bool:
    """Block until every ps and worker accepts TCP connections: they may start after the
    chief, and the strategy fails at once on a peer that is not listening yet. False when
    a stop was requested meanwhile."""
    waiting = [a for job in (PS, WORKER) for a in info.cluster.get(job, ())]
    deadline = time.monotonic() + timeout
    while waiting:
        waiting = [a for a in waiting if not _listening(a)]
        if not waiting:
            return True
        if time.monotonic() > deadline:
            raise PeerUnavailableError(
                f"{', '.join(waiting)} did not come up within {timeout:.0f}s; check that "
                "every ps and worker replica is running, then restart the job")
        if stop.wait(PEER_POLL_SECONDS):
            return False
    return True


def wait_for_leader(info: ClusterInfo, stop: StopSignal,
                    timeout: float = PEER_WAIT_SECONDS) -> bool:
    """A MultiWorkerMirrored replica that is not the cluster's leader (the chief, else
    worker 0) waits here, where SIGTERM is seen, until the leader listens: inside the
    strategy TensorFlow's coordination service waits for it with its own SIGTERM
    handler, which swallowed the signal for as long as the chief was missing. False when
    a stop was requested; past the timeout the strategy's own wait takes over."""
    leader = next(iter(info.cluster.get(CHIEF) or info.cluster.get(WORKER) or ()), None)
    if leader is None or leader == info.address:
        return True
    deadline = time.monotonic() + timeout
    if not _listening(leader):
        print(f"{info.task_name} waiting for the chief at {leader}", flush=True)
    while not _listening(leader) and time.monotonic() < deadline:
        if stop.wait(PEER_POLL_SECONDS):
            return False
    return True


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def weight_parts(variable) -> list:
    """The tf.Variables behind a Keras variable: its shards when the ps sharded it.

    Keras 3 cannot take gradients of, or apply an optimizer to, a ShardedVariable, so the
    tape and the optimizer work on the shards; the layers still read the whole variable.
    """
    inner = variable.value
    if isinstance(inner, tf.__internal__.distribute.ShardedVariable):
        return list(inner.variables)
    return [variable]


def weights_numpy(model: keras.Model) -> list[np.ndarray]:
    """The model's weights in get_weights() order, shards concatenated: what the
    single-node export and the histograms take."""
    out = []
    for w in model.weights:
        parts = weight_parts(w)
        out.append(np.concatenate([p.numpy() for p in parts], axis=0)
                   if len(parts) > 1 else np.asarray(w.numpy()))
    return out


def peer_named_in(text: str, info: ClusterInfo) -> str:
    """The replica a gRPC error names ('ps-replica-0 (host:port)'): a parameter server
    when one is named, since a ps is what the coordinator cannot do without."""
    named = re.findall(r"/job:(ps|worker|chief)/replica:[0-9]+/task:([0-9]+)", text)
    named.sort(key=lambda jt: jt[0] != PS)
    for job, index in named:
        hosts = info.cluster.get(job, ())
        if int(index) < len(hosts):
            return f"{job}-replica-{index} ({hosts[int(index)]})"
    return "a member of the cluster"


@contextlib.contextmanager
def peers_answering(info: ClusterInfo, kind: str, then: str):
    """TensorFlow's errors of a peer that stopped answering, under ps and multiworker,
    as one PeerUnavailableError naming the peer and what to do (`then`)."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError) as exc:
        if kind not in ("ps", "multiworker"):
            raise
        raise PeerUnavailableError(
            f"{peer_named_in(str(exc), info)} stopped answering; {then}") from None


__all__ = ["MIN_SHARD_BYTES", "PEER_WAIT_SECONDS", "check_collectives_can_start",
           "make_strategy", "make_partitioner", "wait_for_peers", "weight_parts",
           "weights_numpy", "peer_named_in", "peers_answering"]
