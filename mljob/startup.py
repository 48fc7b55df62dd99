"""What a replica does before its first training step: marks to measure it, and the
imports it can skip.

- `mark(phase)`: with `MLJOB_STARTUP_MARKS=1` in its environment, a replica prints
  `startup PHASE UNIX_TIME` on stdout as it reaches each phase (its process start
  first; for a pre-started process, `mljob.prestart`, the moment it became the replica,
  after a `prestarted` mark with its real start), which `bench/startup.py` reads from
  the job's logs. Without it, nothing.
- `tensorflow_for_a_server()`: a parameter server, or a worker under
  ParameterServerStrategy, runs only TensorFlow's gRPC server; the chief's coordinator
  sends it graphs, never Python. TensorFlow's `__init__` imports the whole of Keras
  (`keras.src.optimizers`, for the SavedModel registry) and Keras imports IPython and
  matplotlib where they are installed: a third of TensorFlow's import time, for a
  process that never builds a layer. Such a server imports TensorFlow without Keras
  (TensorFlow catches the ImportError and goes on; `tf.keras` stays a lazy loader).
- `lean_imports()`: around a training replica's first import of Keras, IPython and
  matplotlib are left out (Keras keeps None for them and uses them only to display in
  a notebook and to plot image galleries: `keras.visualization`): 0.3-0.4 CPU-s of the
  3.4-3.7 a chief's imports take. The user's code imports either as usual afterwards;
  only Keras's own galleries (`keras.visualization.plot_*`) then need
  MLJOB_QUICK_START=0.

- `library_seen()`: called when `mljob.training` is imported; in a tuning trial it
  tells the launcher (a file in the folder `MLJOB_LIBRARY_SEEN` names) that the
  replica's trainer uses the library, so that the processes started ahead for the next
  trial (`mljob.prestart`) import it too.

`MLJOB_QUICK_START=0` turns both shortcuts off (for a side-by-side measurement). No
TensorFlow at import time.
"""
from __future__ import annotations

import contextlib
import json
import importlib.abc
import os
import sys
import time
from collections.abc import Iterator

MARKS_ENV = "MLJOB_STARTUP_MARKS"
QUICK_ENV = "MLJOB_QUICK_START"
LEFT_OUT = ("IPython", "matplotlib")  # what Keras imports for notebooks and plots
_marked: list[str] = []
_handed_over: list[float] = []  # a pre-started process (mljob.prestart): when it became one


def handed_over(when: float) -> None:
    """This pre-started process became its replica at `when`: its marks count from
    then (its `process` mark), and a `prestarted` mark gives its real start."""
    _handed_over[:] = [when]


# A folder a tuning job's launcher names (submit.local.prestart): importing mljob.training
# there leaves a file named for the replica's role (`seen_name`), so that processes
# started ahead import the library (and make its kernel choice before TensorFlow) only
# for trainers that use it.
LIBRARY_ENV = "MLJOB_LIBRARY_SEEN"


def cluster_and_task(environ) -> tuple[dict, dict]:
    """TF_CONFIG's `cluster` and `task`, read leniently for these hints (empty where it is
    missing or malformed: `mljob.cluster` is what judges it)."""
    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        if isinstance(cluster, dict) and isinstance(task, dict):
            return cluster, task
    except (ValueError, AttributeError):
        pass
    return {}, {}


def seen_name(environ) -> str:
    """The file a replica importing mljob.training leaves: its task type and index."""
    task = cluster_and_task(environ)[1]
    try:
        return f"{task.get('type') or 'master'}-{int(task.get('index') or 0)}"
    except (ValueError, TypeError):
        return "master-0"


def library_seen() -> None:
    """Called when mljob.training is imported: leave this replica's file in the folder
    LIBRARY_ENV names, if any (never a reason to fail)."""
    folder = os.environ.get(LIBRARY_ENV)
    if folder:
        try:
            with open(os.path.join(folder, seen_name(os.environ)), "a"):
                pass
        except OSError:
            pass


def quick() -> bool:
    return os.environ.get(QUICK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def mark(phase: str) -> None:
    """`startup PHASE TIME` on stdout when MLJOB_STARTUP_MARKS=1 (the process's start
    time before the first)."""
    if os.environ.get(MARKS_ENV) != "1":
        return
    if not _marked:
        started = _process_start()
        if _handed_over and started is not None:
            print(f"startup prestarted {started:.3f}", flush=True)
        if _handed_over:
            started = _handed_over[0]
        if started is not None:
            print(f"startup process {started:.3f}", flush=True)
    _marked.append(phase)
    print(f"startup {phase} {time.time():.3f}", flush=True)


def _process_start() -> float | None:
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # a measurement aid: never a reason to fail
        return None


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses to import the named packages with their submodules; a name ending in a
    dot refuses the submodules alone."""

    def __init__(self, *names: str):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        for name in self.names:
            if fullname.startswith(name if name.endswith(".") else name + ".") \
                    or fullname == name:
                raise ImportError(f"{fullname} is not imported in this replica")
        return None


@contextlib.contextmanager
def _refusing(*names: str) -> Iterator[None]:
    finder = _Refuse(*names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def tensorflow_for_a_server():
    """TensorFlow, imported without Keras unless Keras is already in or quick() is off.

    Only Keras's submodules are refused: TensorFlow looks for the top-level package
    (`find_spec("keras")`) to point `tf.keras` at it, which imports nothing."""
    if "tensorflow" in sys.modules or "keras" in sys.modules or not quick():
        import tensorflow
        return tensorflow
    with _refusing("keras.", "tf_keras."):
        import tensorflow
    for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
        del sys.modules[name]  # half-imported by TensorFlow's caught attempt
    return tensorflow


def tensorflow_quietly():
    """TensorFlow, imported with its start-up notices (contracts.TF_STARTUP_NOISE) kept
    off this process's stderr, everything else it prints passed on: a command's error is
    then its one line. TF_CPP_MIN_LOG_LEVEL 0 (asked for TensorFlow's info) keeps them."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        import tensorflow
        return tensorflow
    import tempfile

    from mljob.contracts import TF_STARTUP_NOISE
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode("utf-8", "replace").splitlines()
                    if not TF_STARTUP_NOISE.match(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()
    return tensorflow


@contextlib.contextmanager
def lean_imports() -> Iterator[None]:
    """Around a training replica's first import of Keras or TensorFlow: without IPython
    and matplotlib (each left out only when nothing imported it before)."""
    if not quick() or "keras" in sys.modules:
        yield
        return
    with _refusing(*(name for name in LEFT_OUT if name not in sys.modules)):
        yield


__all__ = ["mark", "handed_over", "cluster_and_task", "seen_name", "library_seen",
           "LIBRARY_ENV", "quick", "tensorflow_for_a_server", "lean_imports", "MARKS_ENV",
           "QUICK_ENV"]
