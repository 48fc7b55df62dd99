"""What `model.compile` takes, resolved as Keras resolves it, for the loop's own steps.

`Objective` is the run's loss and metrics: from `fit`'s arguments, or from the model when
`model_fn()` returns a compiled model (the arguments, when given, win). It takes what
`compile` takes: a loss, a list of losses or a dict of them by output name with
`loss_weights`; metrics as names, functions or Keras metric objects, per output as a
list of lists or a dict by output name; `weighted_metrics`; and `class_weight` as
`fit` takes it. Names are resolved by Keras's own `CompileLoss` and `CompileMetrics`
(`"accuracy"` is binary, sparse categorical or categorical by the labels' and outputs'
shapes), with one correction Keras lacks: where an output's loss is a binary
cross-entropy `from_logits=True`, a named `accuracy`/`binary_accuracy` thresholds the
logits at 0 and a named `auc` takes logits, rather than treating logits as
probabilities.

The metrics are Keras metric objects used statelessly: a step returns their *states*
(sums, counts, confusion matrices, AUC's buckets), never their values. The states of the
replicas (all-reduced under MultiWorkerMirroredStrategy) and of the ps workers' functions
(summed by the chief) are merged by each variable's own aggregation, then the metric's
`result()` is computed once from the merged state, as Keras's distributed metrics do. So
AUC, Precision or MeanIoU over two workers is the metric over both workers' examples, not
an average of two values.

A plain function given as a loss is called as `model.compile`'s wrapper calls it
(`keras.losses.LossFunctionWrapper`): labels and outputs as float tensors, the labels
first brought to the outputs' rank (`(batch,)` labels against `(batch, 1)` outputs become
`(batch, 1)`, never a `(batch, batch)` broadcast), then what it returns (per-example
losses or already a mean) reduced over the batch with the sample weights; a Keras loss
object or name is used as Keras uses it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mljob.training.errors import UsageError
from mljob.training.keras_private import LossFunctionWrapper, auc_from_logits, \
    compile_utils, flat_losses, flat_metrics, get_object_name, tree

PerExample = Callable[[Any, Any], Any]
# How the metric states of several replicas (in a chunk) or chunks (at a log line) merge,
# by each state variable's Keras aggregation: the one table every path uses. Sums add
# (counts, totals, confusion matrices), means average, a first replica's value is kept.
MERGE_RULES = {"sum": "sum", "mean": "mean", "only_first_replica": "first",
               "none": "first"}


def merge_rule(aggregation: str) -> str:
    """MERGE_RULES' rule for an aggregation ("VariableAggregation.SUM" or "sum")."""
    return MERGE_RULES.get(str(aggregation).rsplit(".", 1)[-1].lower(), "first")
_BINARY_CE = (keras.losses.BinaryCrossentropy, keras.losses.BinaryFocalCrossentropy)


def _wrap_loss(loss):
    if loss is None or isinstance(loss, (str, keras.losses.Loss)):
        if isinstance(loss, str) and loss.lower() not in ("crossentropy", "ce"):
            try:
                keras.losses.get(loss)
            except ValueError:
                raise UsageError(f"unknown loss {loss!r}; give a Keras loss name, a "
                                 "keras.losses.Loss or a function (labels, outputs) -> "
                                 "per-example losses") from None
        return loss
    if callable(loss):  # as compile wraps a function (compile_utils.get_loss)
        return LossFunctionWrapper(loss, name=get_object_name(loss))
    raise UsageError(f"loss must be a Keras loss or a function (labels, outputs) -> "
                     f"per-example losses, a list of them or a dict by output name, not "
                     f"{type(loss).__name__}")


def compiled_config(model) -> dict:
    """What `model.compile` was given ({} for a model never compiled)."""
    if not getattr(model, "compiled", False):
        return {}
    return dict(getattr(getattr(model, "_compile_config", None), "config", {}) or {})


def one_replica(spec):
    """A dataset's element spec for one replica (a PerReplica spec holds one each)."""
    return tree.map_structure(lambda s: s._value_specs[0] if hasattr(s, "_value_specs")
                              else s, spec)


def compiled_optimizer(model) -> keras.optimizers.Optimizer:
    """The optimizer `model.compile` was given (made in model_fn, inside the scope)."""
    optimizer = getattr(model, "optimizer", None) if getattr(model, "compiled", False) \
        else None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise UsageError("no optimizer: pass optimizer=... (a name or a function "
                         "returning a new Keras optimizer), or compile the model model_fn "
                         "returns with one")
    return optimizer


def _check_name(name) -> None:
    if not name or not isinstance(name, str) or name == "loss" or "/" in name:
        raise UsageError(f"metric {name!r}: give metrics as names, Keras metrics or "
                         "{name: function}; a name other than 'loss', without '/'")


def _check_metric_name(name) -> None:
    if not isinstance(name, str) or name.lower() in ("accuracy", "acc"):
        return
    try:
        keras.metrics.get(name)
    except ValueError:
        raise UsageError(f"unknown metric {name!r}; give a Keras metric name (accuracy, "
                         "auc, precision, recall, mae...), a keras.metrics.Metric or a "
                         "function (labels, outputs) -> per-example values") from None


def _keras_tensor(spec):
    shape = tuple(spec.shape.as_list()) if spec.shape.rank is not None else None
    return keras.KerasTensor(shape, dtype=spec.dtype.name,
                             ragged=isinstance(spec, tf.RaggedTensorSpec),
                             sparse=isinstance(spec, tf.SparseTensorSpec))


def _fresh(metric):
    """A new, unused copy of a Keras metric object (made outside any strategy scope, so
    its variables are plain ones); other metrics as they are."""
    if not isinstance(metric, keras.metrics.Metric):
        return metric
    try:
        return type(metric).from_config(metric.get_config())
    except Exception:  # a custom metric without a round-tripping config: it, reset
        metric.reset_state()
        return metric


def unpack(data):
    """(x, y, sample_weight) of a dataset element, as Keras's `fit` unpacks it."""
    if isinstance(data, list):
        data = tuple(data)
    if not isinstance(data, tuple):
        return data, None, None
    if len(data) == 1:
        return data[0], None, None
    if len(data) == 2:
        return data[0], data[1], None
    if len(data) == 3:
        return data
    raise UsageError(f"a dataset element is a tuple of {len(data)}; give (features, "
                     "labels) or (features, labels, sample_weight)")


def as_floats(values) -> dict[str, float]:
    """Metric values by name as Python floats; a per-class metric (F1Score without
    average) as one value each, `name_0`, `name_1`..."""
    out: dict[str, float] = {}
    for name, value in dict(values).items():
        array = np.asarray(value).reshape(-1)
        if array.size == 1:
            out[name] = float(array[0])
        else:
            out.update({f"{name}_{i}": float(v) for i, v in enumerate(array)})
    return out


class Objective:
    """The loss and metrics of a run (see the module doc); `build` before use."""

    def __init__(self, loss, metrics=None, *, loss_weights=None, weighted_metrics=None,
                 class_weight: Mapping[int, float] | None = None, output_names=None):
        if loss is None:
            raise UsageError("no loss: pass loss=... (a Keras loss, its name or a function "
                             "(labels, outputs) -> per-example losses), or return a model "
                             "compiled with one from model_fn")
        self.user_loss = tree.map_structure(_wrap_loss, loss) \
            if isinstance(loss, (list, tuple, dict)) else _wrap_loss(loss)
        self.output_names = list(output_names or [])
        self.names: list[str] | None = None  # the {name: metric} form's names
        if isinstance(metrics, Mapping) and not (
                len(self.output_names) > 1 and set(metrics) <= set(self.output_names)):
            for name in metrics:
                _check_name(name)
            self.names = list(metrics)
            metrics = [m if isinstance(m, (str, keras.metrics.Metric)) or not callable(m)
                       else keras.metrics.MeanMetricWrapper(m, name=name)
                       for name, m in metrics.items()]
        for name in tree.flatten([metrics, weighted_metrics]):
            _check_metric_name(name)
        if isinstance(metrics, tuple):
            metrics = list(metrics)
        if isinstance(weighted_metrics, tuple):
            weighted_metrics = list(weighted_metrics)
        self.user_metrics = tree.map_structure(_fresh, metrics) \
            if metrics is not None else None
        self.user_weighted = tree.map_structure(_fresh, weighted_metrics) \
            if weighted_metrics is not None else None
        self.loss_weights = loss_weights
        self.class_weight = dict(class_weight) if class_weight else None
        if self.class_weight is not None:
            bad = [k for k in self.class_weight if not isinstance(k, (int, np.integer))
                   or isinstance(k, bool) or k < 0]
            if bad:
                raise UsageError(f"class_weight keys must be class indices (integers >= "
                                 f"0), got {bad[0]!r}")
        self.built = False

    @classmethod
    def of(cls, model, *, loss=None, metrics=None, loss_weights=None,
           weighted_metrics=None, class_weight=None) -> "Objective":
        """The arguments given, else what `model.compile` was given."""
        compiled = compiled_config(model)

        def pick(given, key):
            return given if given is not None else compiled.get(key)
        return cls(pick(loss, "loss"), pick(metrics, "metrics"),
                   loss_weights=pick(loss_weights, "loss_weights"),
                   weighted_metrics=pick(weighted_metrics, "weighted_metrics"),
                   class_weight=class_weight,
                   output_names=getattr(model, "output_names", None))

    # ---- building from the data's and the model's shapes ---------------------------

    def build(self, model, element_spec) -> None:
        """Resolve names against the labels' spec (from the dataset) and the outputs'
        (the model's symbolic call on the features' spec)."""
        if self.built:
            return
        x_spec, y_spec, w_spec = unpack(element_spec)
        if y_spec is None:
            raise UsageError("the dataset gives no labels; give (features, labels) or "
                             "(features, labels, sample_weight) batches")
        if self.class_weight is not None and w_spec is not None:
            raise UsageError("class_weight and sample weights in the dataset cannot be "
                             "used together (as in Keras's fit); give one of them")
        if self.class_weight is not None and len(tree.flatten(y_spec)) != 1:
            raise UsageError("class_weight is for a model with one output; for several, "
                             "give sample weights in the dataset")
        y_true = tree.map_structure(_keras_tensor, y_spec)
        y_pred = model.compute_output_spec(tree.map_structure(_keras_tensor, x_spec),
                                           training=False)
        self.compile_loss = compile_utils.CompileLoss(
            self.user_loss, self.loss_weights, output_names=self.output_names or None)
        try:
            self.compile_loss.build(*self._aligned(y_true, y_pred))
            self.metrics = compile_utils.CompileMetrics(
                self.user_metrics, self.user_weighted,
                output_names=self.output_names or None)
            self.metrics.build(y_true, y_pred)
        except ValueError as exc:
            raise UsageError(f"loss or metrics do not fit the model's outputs: "
                             f"{str(exc).splitlines()[0]}") from None
        self._respect_logits()
        if self.names is not None:
            flat = [m for mls in flat_metrics(self.metrics)[0] if mls for m in mls.metrics]
            for metric, name in zip(flat, self.names, strict=False):
                metric.name = name
        losses = flat_losses(self.compile_loss)
        self.loss_means = [keras.metrics.Mean(name=f"{entry[3]}_loss")
                           for entry in losses] if len(losses) > 1 else []
        self.loss_mean = keras.metrics.Mean(name="loss")
        try:
            self._warm(y_true, y_pred, w_spec)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"a metric does not fit the labels or outputs: "
                             f"{str(exc).splitlines()[0]}") from None
        self.variables = list(self.metrics.variables) + [
            v for m in [*self.loss_means, self.loss_mean] for v in m.variables]
        self.initial = [np.array(v.numpy()) for v in self.variables]
        self.aggregations = [str(getattr(v, "aggregation", "sum")) for v in self.variables]
        self.built = True

    def _aligned(self, y_true, y_pred):
        if isinstance(y_true, dict) and isinstance(y_pred, (list, tuple)) and \
                self.output_names and set(y_true) == set(self.output_names):
            y_true = [y_true[n] for n in self.output_names]
        return y_true, y_pred

    def _respect_logits(self) -> None:
        """A named accuracy or AUC on an output whose loss is a binary cross-entropy
        from logits: threshold the logits at 0 (see the module doc)."""
        given = {id(m) for m in tree.flatten(self.user_metrics or []) +
                 tree.flatten(self.user_weighted or [])}
        losses = self._loss_per_output()
        for lists in flat_metrics(self.metrics):
            for index, mls in enumerate(lists):
                loss = losses[index] if index < len(losses) else None
                if not mls or not (isinstance(loss, _BINARY_CE) and loss.from_logits):
                    continue
                for j, metric in enumerate(mls.metrics):
                    if id(metric) in given:
                        continue
                    if isinstance(metric, keras.metrics.BinaryAccuracy):
                        mls.metrics[j] = keras.metrics.BinaryAccuracy(name=metric.name,
                                                                      threshold=0.0)
                    elif isinstance(metric, keras.metrics.AUC) and not auc_from_logits(metric):
                        mls.metrics[j] = keras.metrics.AUC(name=metric.name,
                                                           from_logits=True)

    def _loss_per_output(self) -> list:
        loss = self.user_loss
        if isinstance(loss, dict):
            return [loss.get(n) for n in self.output_names]
        if isinstance(loss, (list, tuple)):
            return list(loss)
        return [loss] * max(1, len(self.output_names))

    def _warm(self, y_true, y_pred, w_spec) -> None:
        """Create every metric's variables now (some make them on first use), eagerly,
        outside any strategy scope, then reset them."""
        def zeros(kt):
            shape = [1 if d is None else d for d in kt.shape]
            if kt.dtype == "string":
                return tf.fill(shape, "")
            return tf.zeros(shape, kt.dtype)
        yt, yp = tree.map_structure(zeros, y_true), tree.map_structure(zeros, y_pred)
        weights = None if w_spec is None else tree.map_structure(
            lambda s: tf.ones([1] + s.shape.as_list()[1:], s.dtype), w_spec)
        with tf.init_scope():
            self.metrics.update_state(yt, yp, sample_weight=weights)
            self.metrics.reset_state()

    # ---- in a step ---------------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def loss(self, y_true, y_pred, sample_weight=None):
        """(the total loss: each output's batch mean, weighted and added; each
        output's unweighted batch mean)."""
        y_true, y_pred = self._aligned(y_true, y_pred)

        def resolve(path, obj):
            for key in path:
                obj = obj[key]
            return obj
        total, each = [], []
        nested = tree.is_nested(y_true) or tree.is_nested(y_pred)
        for path, loss_fn, weight, _ in flat_losses(self.compile_loss):
            y_t = resolve(path, y_true) if nested else y_true
            y_p = resolve(path, y_pred) if nested else y_pred
            sw = resolve(path, sample_weight) if nested and tree.is_nested(sample_weight) \
                else sample_weight
            value = tf.cast(loss_fn(y_t, y_p, sw), tf.float32)
            each.append(value)
            total.append(value * weight if weight is not None else value)
        return tf.add_n(total), each

    @tf.autograph.experimental.do_not_convert
    def class_weights(self, labels):
        """Keras's class_weight as sample weights: the class is the label (integer,
        rounded) or its arg-max (one-hot); classes not given weigh 1."""
        assert self.class_weight is not None
        labels = tf.convert_to_tensor(labels)
        if labels.shape.rank and labels.shape.rank > 1:
            labels = tf.argmax(labels, axis=-1) if labels.shape[-1] != 1 else \
                tf.squeeze(labels, -1)
        index = tf.cast(tf.round(tf.cast(labels, tf.float32)), tf.int64)
        table = np.ones(max(self.class_weight) + 1, np.float32)
        for k, v in self.class_weight.items():
            table[int(k)] = v
        inside = (index >= 0) & (index < len(table))
        return tf.where(inside, tf.gather(tf.constant(table), tf.clip_by_value(
            index, 0, len(table) - 1)), tf.ones_like(index, tf.float32))

    def zero_state(self) -> list:
        return [tf.constant(v) for v in self.initial]

    @tf.autograph.experimental.do_not_convert
    def update(self, state, y_true, y_pred, sample_weight, each_loss, total_loss) -> list:
        """The metric states after one batch (stateless: `state` is a list of tensors
        matching `self.variables`)."""
        n = len(self.metrics.variables)
        y_true, y_pred = self._aligned(y_true, y_pred)
        new = list(self.metrics.stateless_update_state(
            state[:n], y_true, y_pred, sample_weight=sample_weight))
        batch = tf.shape(tree.flatten(y_pred)[0])[0]
        at = n
        values = [*each_loss, total_loss] if self.loss_means else [total_loss]
        for mean, value in zip([*self.loss_means, self.loss_mean], values, strict=True):
            k = len(mean.variables)
            new += mean.stateless_update_state(state[at:at + k], value, sample_weight=batch)
            at += k
        return [tf.cast(v, s.dtype) for v, s in zip(new, state, strict=True)]

    def results(self, state) -> tuple[float, dict[str, float]]:
        """(loss, {metric name: value}) of a merged state, as Python floats."""
        n = len(self.metrics.variables)
        values = dict(self.metrics.stateless_result(state[:n]) if n else {})
        at = n
        for mean in self.loss_means:
            k = len(mean.variables)
            values[mean.name] = mean.stateless_result(state[at:at + k])
            at += k
        loss = float(self.loss_mean.stateless_result(state[at:]))
        return loss, as_floats(values)

    def merge(self, states: Sequence[Sequence]) -> list[np.ndarray]:
        """Several states (of replicas' or functions' batches) as one, by each
        variable's aggregation (MERGE_RULES)."""
        merged = []
        for i, how in enumerate(self.aggregations):
            values = [np.asarray(s[i]) for s in states]
            rule = merge_rule(how)
            # "first" (a first replica's value) across chunks is the newest chunk's.
            merged.append(np.sum(values, axis=0) if rule == "sum" else
                          np.mean(values, axis=0) if rule == "mean" else values[-1])
        return merged


__all__ = ["MERGE_RULES", "merge_rule", "as_floats", "Objective", "compiled_config",
           "compiled_optimizer", "one_replica", "unpack", "PerExample"]
