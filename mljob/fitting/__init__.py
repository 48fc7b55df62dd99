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

On the evaluator replica (a job whose config has `evaluatorCount`; not part of the
training cluster) `fit` does not train: it evaluates the epochs the chief publishes
(`mljob.fitting.sidecar`), and the script's ParameterServerStrategy or
MultiWorkerMirroredStrategy is the default strategy there (TensorFlow's would join the
training cluster: the first connects as the chief, the second fails).

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
from collections.abc import Mapping, Sequence
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
    """Whether the environment's cluster has other tasks to train with, or the job has
    an evaluator (which follows the chief's epochs, even a chief alone's). A malformed
    cluster is left to the script (its strategy says what is wrong)."""
    from mljob import cluster
    try:
        info = cluster.from_environment(environ)
    except cluster.ClusterConfigError:
        return False
    return not info.is_single_node or info.has_evaluator


def install(environ: Mapping[str, str] = os.environ, args: Sequence[str] = ()) -> None:
    """Patch `keras.Model.fit` now if Keras's model module is loaded, else when it is;
    on the evaluator replica, also the strategies that would join the training cluster
    (`args`: the script's, where its `--job-dir` is; see `mljob.fitting.sidecar`)."""
    from mljob import cluster
    try:
        info = cluster.from_environment(environ)
    except cluster.ClusterConfigError:
        info = cluster.ClusterInfo()
    _CONTEXT.update(info=info, environ=dict(environ), args=tuple(args))
    hooks = {MODEL_MODULE: lambda module: patch(module.Model)}
    if info.is_evaluator:
        hooks.update(_EVALUATOR_HOOKS)
    _HOOKS.update(hooks)
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    """Undo `install` (for tests and for a process that wants Keras's fit back)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    _HOOKS.clear()
    _CONTEXT.clear()
    for name, class_name in _STRATEGIES.items():
        module = sys.modules.get(name)
        made = getattr(module, class_name, None) if module is not None else None
        if made is not None and getattr(vars(made).get("__new__"), _PATCHED, None):
            delattr(made, "__new__")
    module = sys.modules.get(MODEL_MODULE)
    if module is None:
        return
    for name in ("fit", "evaluate"):
        method = module.Model.__dict__.get(name)
        if method is not None and hasattr(method, _PATCHED):
            delattr(module.Model, name)


def local_on_evaluator(strategy_class, public_name: str) -> None:
    """`strategy_class(...)` on the evaluator replica gives the default strategy: the
    evaluator is not in the training cluster, and TensorFlow's strategy there would join
    it (a ParameterServerStrategy connects as the chief, taking the chief's address; a
    MultiWorkerMirroredStrategy fails on a cluster without the evaluator)."""
    current = vars(strategy_class).get("__new__")
    if getattr(current, _PATCHED, None):
        return
    said: list[bool] = []

    def local(cls, *args, **kwargs):
        import tensorflow as tf
        if not said:
            said.append(True)
            print(f"evaluator: the script's {public_name} is the default strategy on this "
                  "replica (the evaluator is not part of the training cluster); its "
                  "model.fit evaluates the chief's epochs", flush=True)
        return tf.distribute.get_strategy()

    wrapped = staticmethod(local)
    setattr(wrapped, _PATCHED, True)
    strategy_class.__new__ = wrapped


_STRATEGIES = {  # module: class, of the strategies an evaluator must not build
    "tensorflow.python.distribute.parameter_server_strategy_v2": "ParameterServerStrategyV2",
    "tensorflow.python.distribute.collective_all_reduce_strategy":
        "CollectiveAllReduceStrategy",
}
_PUBLIC = {"ParameterServerStrategyV2": "ParameterServerStrategy",
           "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
_EVALUATOR_HOOKS = {
    name: (lambda module, c=class_name: local_on_evaluator(getattr(module, c), _PUBLIC[c]))
    for name, class_name in _STRATEGIES.items()}
_HOOKS: dict = {}      # module name: what to do once it is loaded
_CONTEXT: dict = {}    # this replica's ClusterInfo, environment and script arguments


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules `_HOOKS` names as the other finders do, and runs their hook
    once loaded."""

    def find_spec(self, fullname, path, target=None):
        hook = _HOOKS.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Patching(spec.loader, hook)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, inner, hook):
        self._inner, self._hook = inner, hook

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._hook(module)

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


def _fit(model, original, args: tuple, kwargs: dict, sidecar_epochs: bool = True):
    info = _CONTEXT.get("info")
    if info is not None and info.is_evaluator:
        from mljob.fitting import sidecar
        arguments = fit_arguments(original, model, args, kwargs)
        raise SystemExit(sidecar.follow(
            model, _epochs_url(), arguments, summaries=sidecar.summaries_url(
                _CONTEXT.get("environ", {}), _CONTEXT.get("args", ()))))
    kind = strategy_kind(model.distribute_strategy)
    publish = sidecar_epochs and info is not None and info.has_evaluator and (
        kind != "keras" or info.is_chief)
    if kind == "keras" and not publish:
        return original(model, *args, **kwargs)
    arguments = fit_arguments(original, model, args, kwargs)
    if publish:
        arguments["callbacks"] = _with_publisher(model, arguments.get("callbacks"))
    if kind == "keras":  # a chief alone with its evaluator: Keras's fit, and the epochs
        return original(model, **arguments)
    if kind == "multiworker":
        from mljob.fitting import mirrored
        return mirrored.fit(model, original, **arguments)
    from mljob.fitting import ps_fit
    return ps_fit.fit(model, model.distribute_strategy, **arguments)


def _epochs_url() -> str | None:
    from mljob.fitting import sidecar
    return sidecar.epochs_url(_CONTEXT.get("environ", {}), _CONTEXT.get("args", ()))


def _with_publisher(model, callbacks):
    """The callbacks, and last the chief's publisher of its epochs for the evaluator
    (`mljob.fitting.sidecar`); as given on the other workers."""
    from mljob.fitting import sidecar
    from mljob.fitting.mirrored_callbacks import is_chief
    import keras
    if strategy_kind(model.distribute_strategy) == "multiworker" and \
            not is_chief(model.distribute_strategy):
        return callbacks
    url = _epochs_url()
    if url is None:
        print("warning: the job has an evaluator, but no --job-dir (nor "
              "AIP_CHECKPOINT_DIR) to publish the epochs in; the evaluator will say so",
              file=sys.stderr, flush=True)
        return callbacks
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    given = list(keras.tree.flatten(callbacks)) if callbacks else []
    return [*given, sidecar.Publisher(url, _CONTEXT.get("environ", os.environ))]


def dispatch_fit(model, **kwargs):
    """`model.fit(**kwargs)` as the patched `fit` runs it, whether the patch is
    installed or not (`mljob.training`'s epoch mode calls this; its evaluator replica
    follows the library's own per-epoch checkpoints, so no epochs are published for a
    sidecar)."""
    import keras
    original = getattr(keras.Model.fit, _PATCHED, keras.Model.fit)
    return _fit(model, original, (), kwargs, sidecar_epochs=False)


def _evaluate(model, original, args: tuple, kwargs: dict):
    if strategy_kind(model.distribute_strategy) == "multiworker":
        from mljob.fitting import mirrored
        mirrored.prepare(model)
    return original(model, *args, **kwargs)


__all__ = ["LAUNCHER", "SWITCH", "FitRefused", "enabled", "in_cluster", "install",
           "uninstall", "patch", "strategy_kind", "fit_arguments", "dispatch_fit"]
