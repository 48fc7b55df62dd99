"""A replica's process started before its job needs it: `python -m mljob.prestart MODULE`.

A tuning job runs its trials one after another (or a few at a time), and each trial's
replicas pay their interpreter's start and TensorFlow's and Keras's import (3.5-5 CPU-s
each) before their first step. The local tuner (`submit.local.prestart`) starts the next
trial's processes while the current trial trains, for the replicas an earlier trial's
process showed to load TensorFlow: each imports what its replica would (with `--library`,
for a trainer seen importing mljob's training library: the library, which picks
TensorFlow's CPU kernels, then TensorFlow, and Keras unless it is a server (`is_server`),
leaving out what `mljob.startup` leaves out; else `import tensorflow` alone), then waits
on its standard input for its order, one JSON line:

    {"module": "trainer.task", "args": [...], "env": {...}, "cwd": "..."}

and becomes that replica: the environment is the order's (plus what the imports above set
there, as they would have in a fresh process), the working directory the order's,
standard input /dev/null, and MODULE runs as `python -m MODULE ARGS` runs it (as
`__main__`, `sys.argv[0]` its file). Its output goes where the launcher pointed it when it
started. The launcher hands over an order only when the replica's environment matches the
one the process started with, but for the variables a trial changes (`HANDED_OVER`):
everything TensorFlow reads when it loads is the same.

End of input before an order (the launcher is gone, or needs it no more) ends the
process quietly; so does an import that fails here (the launcher then starts the replica
afresh, and the user sees that import's own error). Nothing here imports TensorFlow
before `main()`.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time

from mljob.startup import cluster_and_task

# The variables a trial's replica may get that its pre-started process did not start
# with: its cluster (new ports, the trial's id) and the trial's metric file and tag.
HANDED_OVER = frozenset({"TF_CONFIG", "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_TAG",
                         "CLOUD_ML_HP_METRIC_FILE"})
# auto (unset, the default): where a core is left over by the trials' processes (a
# trial's imports then run beside the trials, not in their place); 1/true/yes/on: always;
# 0/false/no/off: never, every trial's replica starts afresh
ENV = "MLJOB_PRESTART"
AUTO = "auto"
EXIT_NOT_USED = 3       # an import failed here: the launcher starts the replica afresh
LIBRARY_FLAG = "--library"  # the trainer uses mljob's training library (startup.library_seen)


def setting(environ=None) -> bool | str:
    """MLJOB_PRESTART as False (never), True (always) or AUTO (anything else)."""
    value = (os.environ if environ is None else environ).get(ENV, AUTO).strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    return True if value in ("1", "true", "yes", "on") else AUTO


def core_left_over(processes: int, cores: int) -> bool:
    """AUTO's rule: the trials running at once (their processes) leave a core free."""
    return processes < cores


def role(environ) -> str:
    """The replica's task type in TF_CONFIG ('master' when there is none)."""
    return str(cluster_and_task(environ)[1].get("type") or "master")


def is_server(environ) -> bool:
    """A parameter server, or a worker beside parameter servers: under mljob's training
    library (whose `auto` strategy is ParameterServerStrategy when the cluster has a ps)
    it runs TensorFlow's gRPC server alone, without Keras."""
    cluster, task = cluster_and_task(environ)
    return task.get("type") == "ps" or (task.get("type") == "worker" and
                                        bool(cluster.get("ps")))


def warm(server: bool, library: bool) -> None:
    """Import what the replica's own start would. A trainer on mljob's training library:
    the library first (its kernel choice, before TensorFlow), then TensorFlow, with Keras
    (without what `mljob.startup` leaves out) but for a server (`is_server`; one that
    turns out to need Keras imports it when it does). Any other trainer: TensorFlow, as
    `import tensorflow` does."""
    if not library:
        import tensorflow
        return
    from mljob import startup, training  # noqa: F401  (sets its variables before TF)
    if server:
        startup.tensorflow_for_a_server()
        return
    with startup.lean_imports():
        import keras  # noqa: F401
        import tensorflow  # noqa: F401


def become(order: dict, warmed: dict[str, str]) -> str:
    """Turn this process into the ordered replica; the module to run."""
    env = dict(order["env"])
    for key, value in warmed.items():  # what the imports set, unless the order sets it
        env.setdefault(key, value)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(order["cwd"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.argv = ["-m", *order["args"]]
    return str(order["module"])


def main() -> None:
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], [LIBRARY_FLAG]):
        sys.stderr.write(f"usage: python -m mljob.prestart MODULE [{LIBRARY_FLAG}] "
                         "(its order on stdin)\n")
        raise SystemExit(2)
    expected = sys.argv[1]
    before = dict(os.environ)
    try:
        warm(is_server(os.environ), library=sys.argv[2:] == [LIBRARY_FLAG])
    except Exception:  # the replica started afresh shows the user this import's error
        os._exit(EXIT_NOT_USED)
    warmed = {k: v for k, v in os.environ.items() if before.get(k) != v}
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)  # nobody came
    order = json.loads(line)
    if order.get("module") != expected:
        sys.stderr.write(f"mljob.prestart: ordered to run {order.get('module')!r}, "
                         f"started for {expected!r}\n")
        os._exit(EXIT_NOT_USED)
    from mljob import startup
    startup.handed_over(time.time())
    module = become(order, warmed)
    runner = getattr(runpy, "_run_module_as_main", None)  # what `python -m` itself calls
    if runner is not None:
        runner(module, alter_argv=True)
    else:  # pragma: no cover - every CPython since 2.7 has it
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()


__all__ = ["HANDED_OVER", "ENV", "AUTO", "EXIT_NOT_USED", "LIBRARY_FLAG", "setting",
           "core_left_over", "role", "is_server", "warm", "become", "main"]
