"""Keras's own `model.fit`, distributed where Keras 3's is not.

Every replica mljob starts runs the user's module through `mljob.fitting.launch`
(`python -m mljob.fitting.launch MODULE ARGS...`, which runs it exactly as
`python -m MODULE ARGS...` would). When TF_CONFIG (or Vertex AI's CLUSTER_SPEC) puts the
replica in a cluster of several tasks, the launcher calls `install()`: the moment the
script imports Keras, `keras.Model.fit` (and `evaluate`) get a dispatch by the model's
distribution strategy:

- the default strategy, MirroredStrategy, a one-task MultiWorkerMirroredStrategy:
  Keras's own `fit`, nothing of ours in between;
- MultiWorkerMirroredStrategy over several tasks: Keras's own `fit` loop and steps, with
  what Keras 3 lacks under it (`mljob.fitting.mirrored`);
- ParameterServerStrategy: the coordinator's loop (`mljob.fitting.ps_fit.fit`).

A script that never imports Keras pays nothing (the patch waits for Keras's model
module to load); a single node, and a script run outside mljob, are untouched.
`MLJOB_KERAS_FIT=0` (or false/no/off) turns the patch off.

Nothing here imports TensorFlow or Keras until the script does.
"""
from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any

from mljob.fitting.errors import FitRefused

LAUNCHER = "mljob.fitting.launch"  # python -m LAUNCHER MODULE ARGS...: every replica
SWITCH = "MLJOB_KERAS_FIT"   # "0", "false", "no" or "off": Keras's fit, never ours
MODEL_MODULE = "keras.src.models.model"  # where keras.Model is defined
_OFF = ("0", "false", "no", "off")
_PATCHED = "_mljob_original"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the switch leaves the patch on (it is on unless set to an off value)."""
    return environ.get(SWITCH, "").strip().lower() not in _OFF


def in_cluster(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment's cluster has other tasks to train with. A malformed
    cluster is left to the script (its strategy says what is wrong)."""
    from mljob import cluster
    try:
        info = cluster.from_environment(environ)
    except cluster.ClusterConfigError:
        return False
    return not info.is_single_node


def install() -> None:
    """Patch `keras.Model.fit` now if Keras's model module is loaded, else when it is."""
    module = sys.modules.get(MODEL_MODULE)
    if module is not None:
        patch(module.Model)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    """Undo `install` (for tests and for a process that wants Keras's fit back)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    module = sys.modules.get(MODEL_MODULE)
    if module is None:
        return
    for name in ("fit", "evaluate"):
        method = module.Model.__dict__.get(name)
        if method is not None and hasattr(method, _PATCHED):
            delattr(module.Model, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds Keras's model module as the other finders do, and patches it once loaded."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODEL_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Patching(spec.loader)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        patch(module.Model)

    def __getattr__(self, name):  # get_source, get_filename... as the module's loader
        return getattr(self._inner, name)


def patch(model_class) -> None:
    """`model_class.fit` and `.evaluate` dispatched by the model's strategy (once)."""
    for name, run in (("fit", _fit), ("evaluate", _evaluate)):
        original = getattr(model_class, name)
        if not hasattr(original, _PATCHED):
            setattr(model_class, name, _dispatcher(original, run))


def _dispatcher(original, run):
    def dispatching(self, *args, **kwargs):
        return run(self, original, args, kwargs)

    functools.update_wrapper(dispatching, original)
    setattr(dispatching, _PATCHED, original)
    return dispatching


def strategy_kind(strategy) -> str:
    """"multiworker" for a MultiWorkerMirroredStrategy over several tasks, "ps" for a
    ParameterServerStrategy, "keras" for every strategy Keras's own fit runs under."""
    import tensorflow as tf
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
        tasks = sum(len(spec.get(job, ())) for job in ("chief", "worker"))
        return "multiworker" if tasks > 1 else "keras"
    if isinstance(strategy, (tf.distribute.ParameterServerStrategy,
                             tf.distribute.experimental.ParameterServerStrategy)):
        return "ps"
    return "keras"


def fit_arguments(original, model, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by Keras's names, defaults filled in (a wrong argument is
    Keras's own TypeError)."""
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    extra = arguments.pop("kwargs", None)
    if extra:
        arguments.update(extra)
    return arguments


def _fit(model, original, args: tuple, kwargs: dict):
    kind = strategy_kind(model.distribute_strategy)
    if kind == "multiworker":
        from mljob.fitting import mirrored
        return mirrored.fit(model, original, **fit_arguments(original, model, args, kwargs))
    if kind == "ps":
        from mljob.fitting import ps_fit
        return ps_fit.fit(model, model.distribute_strategy,
                          **fit_arguments(original, model, args, kwargs))
    return original(model, *args, **kwargs)


def dispatch_fit(model, **kwargs):
    """`model.fit(**kwargs)` as the patched `fit` runs it, whether the patch is
    installed or not (`mljob.training`'s epoch mode calls this)."""
    import keras
    original = getattr(keras.Model.fit, _PATCHED, keras.Model.fit)
    return _fit(model, original, (), kwargs)


def _evaluate(model, original, args: tuple, kwargs: dict):
    if strategy_kind(model.distribute_strategy) == "multiworker":
        from mljob.fitting import mirrored
        mirrored.prepare(model)
    return original(model, *args, **kwargs)


__all__ = ["LAUNCHER", "SWITCH", "FitRefused", "enabled", "in_cluster", "install",
           "uninstall", "patch", "strategy_kind", "fit_arguments", "dispatch_fit"]
