"""Small calls of a served signature, compiled with XLA (`--compile_small_calls`).

A small model's call at one instance is mostly TensorFlow's executor stepping through
the graph one op at a time (some 100 us for the 17 ops of the bundled MLP, against 36 us
for the same graph compiled into one XLA executable). For each input shape that comes
back (seen twice) and whose call took under SMALL_CALL_S, the signature is compiled
for exactly that shape in the background, on one thread; until it is ready, and for
every other shape, calls go through TensorFlow's executor as before.

A compiled call is used only after it answered the request that asked for it as the
executor did: same dtypes and shapes, integers, booleans and strings equal, floats
within RTOL/ATOL (XLA fuses ops, so the last bits of a float can differ, as they do
between batch sizes); otherwise, or when XLA cannot compile the graph (strings, ops
without an XLA kernel), the signature is left to the executor for good, with one log
line. Large calls are never compiled: their time is the kernels', not the executor's,
and compiling a large graph costs seconds of CPU beside the requests. Nor are the
batches predict.batching merges from several requests (`Model.predict_merged`): their
row counts are many, and a compile for each cost a fresh server seconds of CPU.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)

SMALL_CALL_S = 0.002   # calls slower than this are left to the executor
MAX_ROWS = 64          # nor are batches of more rows
MAX_SHAPES = 8         # shapes compiled per signature at most
MAX_COUNTED = 64       # shapes counted per signature at most (the counts stay small)
RTOL, ATOL = 1e-4, 1e-6

_compiler: ThreadPoolExecutor | None = None
_compiler_lock = threading.Lock()


def _background(job) -> None:
    global _compiler
    with _compiler_lock:
        if _compiler is None:
            _compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xla-compile")
    _compiler.submit(job)


def drain(timeout: float = 120.0) -> None:
    """Wait until every compile asked for so far has ended (tests; warm-up)."""
    with _compiler_lock:
        compiler = _compiler
    if compiler is not None:
        compiler.submit(lambda: None).result(timeout)


class CompiledCalls:
    """The compiled calls of one signature function, by input shapes.

    `fn` is the signature's ConcreteFunction, `names` its inputs in the order the
    tensors are given, `outputs` the output names a call answers (the executor's
    call's keys). `call(key)` -> a compiled call or None; `seen(key, tensors, answer,
    seconds)` after an executor call (may start a compile)."""

    def __init__(self, fn, names: list, outputs: list, label: str):
        self._fn = fn
        self._names = list(names)
        self._outputs = sorted(outputs)
        self._label = label
        self._calls: dict = {}      # shape key -> compiled call
        self._counts: dict = {}     # shape key -> executor calls seen
        self._lock = threading.Lock()
        self.off: str | None = None  # why this signature is left to the executor
        self._small_call_s = SMALL_CALL_S

    def call(self, key):
        return self._calls.get(key)

    def seen(self, key, tensors: list, answer: dict, seconds: float) -> None:
        if self.off is not None or seconds > self._small_call_s or not key or \
                any(not shape for shape in key) or key[0][0] > MAX_ROWS:
            return  # scalars, lists (no shape) and large calls stay with the executor
        with self._lock:
            if key not in self._counts and len(self._counts) >= MAX_COUNTED:
                return  # many shapes (variable lengths): the executor's, counting none
            count = self._counts.get(key, 0) + 1
            self._counts[key] = count
            if count != 2 or len(self._calls) >= MAX_SHAPES:
                return
        want = {name: value.numpy() for name, value in answer.items()}
        _background(lambda: self._compile(key, list(tensors), want))

    def failed(self, exc: BaseException) -> None:
        """A compiled call raised where the executor answered: the executor's for good."""
        self._stop(f"a compiled call failed ({_first_line(exc)})")

    def _compile(self, key, tensors: list, want: dict) -> None:
        if self.off is not None:
            return
        try:
            call = self._build(tensors)
            got = {name: value.numpy() for name, value in call(tensors).items()}
        except Exception as exc:  # XLA refuses many graphs; the executor keeps them
            self._stop(f"XLA cannot compile it ({_first_line(exc)})")
            return
        differs = _difference(want, got)
        if differs:
            self._stop(f"the compiled call answered {differs}")
            return
        self._calls[key] = call
        log.debug("%s: compiled for input shapes %s", self._label, key)

    def _build(self, tensors: list):
        import tensorflow as tf
        from tensorflow.python.eager import context

        fn, names = self._fn, self._names
        compiled = tf.function(lambda *args: fn(**dict(zip(names, args, strict=True))),
                               jit_compile=True, autograph=False)
        concrete = compiled.get_concrete_function(
            *[tf.TensorSpec(t.shape, t.dtype) for t in tensors])
        concrete(*tensors)  # the first call compiles it and registers it with the runtime
        structured = concrete.structured_outputs
        if not isinstance(structured, dict) or sorted(structured) != self._outputs:
            raise ValueError("its outputs are not the signature's")
        atomic = concrete._inference_function
        name, captured = atomic.name, list(concrete.captured_inputs)
        count = len(atomic.cached_definition.signature.output_arg)
        outputs = self._outputs
        if count != len(outputs):
            raise ValueError("its outputs are not the signature's")
        call_function = context.context().call_function

        def call(inputs: list) -> dict:
            return dict(zip(outputs, call_function(name, inputs + captured, count),
                            strict=True))
        # the runtime forgets a function once its Python objects are collected
        call.keep = (compiled, concrete, atomic)  # type: ignore[attr-defined]
        return call

    def _stop(self, why: str) -> None:
        self.off = why
        self._calls.clear()
        log.info("%s: small calls are left to TensorFlow's executor: %s", self._label, why)


# Ops that change state or draw random numbers: a signature holding one is never
# compiled, since the check runs a request twice (once each way).
_STATEFUL = ("Assign", "ResourceApply", "ResourceScatter", "ResourceSparseApply",
             "Random", "StatelessRandom", "Multinomial", "TruncatedNormal",
             "Stateful", "RngSkip", "RngReadAndSkip", "Print", "WriteFile",
             "Enqueue", "Dequeue", "InitializeTable", "LookupTableInsert",
             "LookupTableRemove", "Save", "Restore", "PyFunc", "EagerPyFunc")


def state_changes(fn) -> str | None:
    """The first op of a signature function (its graph and the functions it calls)
    that changes state, draws random numbers or calls back into Python, or None."""
    try:
        graph = fn.graph.as_graph_def()
    except AttributeError:  # another TensorFlow's ConcreteFunction
        return "its graph cannot be read"
    nodes = list(graph.node)
    for function in graph.library.function:
        nodes.extend(function.node_def)
    for node in nodes:
        if node.op in ("StatefulPartitionedCall", "StatelessRandomGetKeyCounter"):
            continue
        if node.op.startswith(_STATEFUL):
            return node.op
    return None


def _difference(want: dict, got: dict) -> str | None:
    """None when got answers as want (floats within RTOL/ATOL), else what differs."""
    if set(want) != set(got):
        return "other outputs"
    for name, a in want.items():
        b = got[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name} as {b.dtype}{list(b.shape)}, not {a.dtype}{list(a.shape)}"
        if a.dtype.kind in "fc":
            if not np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True):
                return f"{name} off by up to {float(np.nanmax(np.abs(a - b))):.3g}"
        elif not np.array_equal(a, b):
            return f"{name} with other values"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


__all__ = ["CompiledCalls", "drain", "state_changes", "SMALL_CALL_S", "MAX_ROWS", "MAX_SHAPES"]
