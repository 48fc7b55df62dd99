"""Small calls of a served signature, compiled (`--compile_small_calls`).

A small model's call at one instance is mostly TensorFlow's executor stepping through
the graph one op at a time (some 100 us for the 17 ops of the bundled MLP) and the
eager runtime around it (tensors made from the arrays, the kernel looked up): code
that runs slower still between requests than back to back, its caches gone cold. For
each input shape that comes back (seen twice) and whose call took under SMALL_CALL_S,
the signature is compiled for exactly that shape in the background, on one thread;
until it is ready, and for every other shape, calls go through TensorFlow's executor
as before. Two compilers, the first that answers right is kept:

- TensorFlow Lite (`ai-edge-litert`'s interpreter on the signature converted once to
  TensorFlow Lite's built-in ops, one interpreter of one thread for each shape): the
  arrays go in and out as they are, no tensors made, some 20 us for the bundled MLP
  back to back and 25-50 us between requests (TF Serving serves TensorFlow Lite
  models too, `--prefer_tflite_model`). Not for a signature that needs ops outside
  TensorFlow Lite's built-in ones, nor for one past LITE_MAX_BYTES converted;
- XLA (the signature compiled with `jit_compile` into one executable, called through
  the eager runtime: 36 us back to back).

A compiled call is used only after it answered the request that asked for it as the
executor did: same dtypes and shapes, integers, booleans and strings equal, floats
within RTOL/ATOL (both compilers fuse ops, so the last bits of a float can differ, as
they do between batch sizes); otherwise, or when neither can compile the graph
(strings, ops without a kernel there), the signature is left to the executor for good,
with one log line. TensorFlow Lite that answers otherwise, or is slower than the
executor was, leaves the signature to XLA. Large calls are never compiled: their time
is the kernels', not the executor's, and compiling a large graph costs seconds of CPU
beside the requests.

The batches predict.batching merges from several requests (`Model.predict_merged`)
hold as many rows as the queue had, one count of many: XLA compiling each count cost a
fresh server seconds of CPU, so they run on TensorFlow Lite only, on one interpreter
of their own resized to each batch's rows (some 12 us a resize, against 0.4 ms for a
new interpreter and 300 us or more for the executor's call on a few rows). Each row
count is used only after it answered a merged batch of that count as the executor did
and no slower than the executor's call; a slower count stays with the executor, and one
that answers otherwise leaves every merged batch of the signature to it.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)

SMALL_CALL_S = 0.002   # calls slower than this are left to the executor
MAX_ROWS = 64          # nor are batches of more rows
MAX_SHAPES = 8         # shapes compiled per signature at most
MAX_COUNTED = 64       # shapes counted per signature at most (the counts stay small)
MAX_MERGED_ROWS = 1024  # merged batches of more rows stay with the executor
RTOL, ATOL = 1e-4, 1e-6
LITE_MAX_BYTES = 64 * 1024 * 1024  # a larger converted model is XLA's (an interpreter
#                                    a shape, each with the weights laid out its way)
LITE_SLOWER = 1.5      # TensorFlow Lite this many times the executor's call: XLA's
LITE = "TensorFlow Lite"

_compiler: ThreadPoolExecutor | None = None
_compiler_lock = threading.Lock()


def _background(job) -> None:
    global _compiler
    with _compiler_lock:
        if _compiler is None:
            _compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="small-calls-compile")
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
    arrays are given, `tensor_of` for each the maker of its eager tensor from an array
    (predict.model), `outputs` the output names a call answers (the executor's call's
    keys), `owner` what keeps fn's variables alive (the loaded SavedModel). `call(key)`
    -> a compiled call (a list of arrays of the signature's dtypes -> {output name:
    array}) or None; `seen(key, tensors, answer, seconds)` after an executor call (may
    start a compile)."""

    def __init__(self, fn, names: list, outputs: list, label: str, *,
                 tensor_of: list | None = None, owner=None):
        self._fn = fn
        self._names = list(names)
        self._tensor_of = tensor_of
        self._owner = owner
        self._outputs = sorted(outputs)
        self._label = label
        self._calls: dict = {}      # shape key -> compiled call
        self._counts: dict = {}     # shape key -> executor calls seen
        self._lock = threading.Lock()
        self.off: str | None = None  # why this signature is left to the executor
        self.lite_off: str | None = None  # why TensorFlow Lite is not used for it
        self._lite_model: bytes | None = None  # the signature converted, once
        self._small_call_s = SMALL_CALL_S
        self._merged_call = None     # TensorFlow Lite resized to each merged batch
        self._merged_ok: set = set()     # merged shape keys it answered right and fast
        self._merged_tried: set = set()  # merged shape keys checked or being checked
        self.merged_off: str | None = None  # why merged batches stay with the executor

    def call(self, key):
        return self._calls.get(key)

    @property
    def engines(self) -> dict:
        """shape key -> LITE or "XLA", of the compiled calls."""
        return {key: getattr(call, "engine", None) for key, call in list(self._calls.items())}

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
        arrays = [t.numpy() for t in tensors]
        _background(lambda: self._compile(key, arrays, want, seconds))

    def merged(self, key):
        """The compiled call for a batch predict.batching merged, of these shapes, or
        None."""
        return self._merged_call if self.off is None and self.merged_off is None and \
            key in self._merged_ok else None

    def merged_seen(self, key, tensors: list, answer: dict, seconds: float) -> None:
        """After the executor answered a merged batch: check TensorFlow Lite on it (in
        the background, once a shape key)."""
        if self.off is not None or self.lite_off is not None or \
                self.merged_off is not None or not key or any(not s for s in key) or \
                key[0][0] > MAX_MERGED_ROWS:
            return
        with self._lock:
            if key in self._merged_tried or len(self._merged_tried) >= MAX_COUNTED:
                return
            self._merged_tried.add(key)
        want = {name: value.numpy() for name, value in answer.items()}
        arrays = [t.numpy() for t in tensors]
        _background(lambda: self._check_merged(key, arrays, want, seconds))

    def _check_merged(self, key, arrays: list, want: dict, seconds: float) -> None:
        if self.off is not None or self.lite_off is not None or self.merged_off is not None:
            return
        call = self._merged_call
        if call is None:
            call = self._try(LITE, lambda a: self._build_lite(a, resizes=True), arrays, want)
        else:
            try:
                differs = _difference(want, call(arrays))
            except Exception as exc:
                differs = f"an error ({_first_line(exc)})"
            if differs:
                call = f"it answered {differs}"
        if isinstance(call, str):
            self.merged_off = call
            log.info("%s: merged batches are left to TensorFlow's executor: %s",
                     self._label, call)
            return
        self._merged_call = call
        if _best_of(call, arrays) <= seconds:  # else this count stays the executor's
            self._merged_ok.add(key)

    def failed(self, exc: BaseException) -> None:
        """A compiled call raised where the executor answered: the executor's for good."""
        self._stop(f"a compiled call failed ({_first_line(exc)})")

    def _compile(self, key, arrays: list, want: dict, seconds: float = 0.0) -> None:
        if self.off is not None:
            return
        lite_off = self.lite_off
        if lite_off is None:
            call = self._try(LITE, self._build_lite, arrays, want)
            if isinstance(call, str):
                lite_off = call
            else:
                took = _best_of(call, arrays)
                if not seconds or took <= seconds * LITE_SLOWER:
                    self._keep(key, call, LITE)
                    return
                lite_off = (f"{took * 1e6:.0f} us a call against the executor's "
                            f"{seconds * 1e6:.0f}")
        call = self._try("XLA", self._build, arrays, want)
        if isinstance(call, str):  # one line says why neither
            self._stop(f"{call}; {LITE}: {lite_off}" if lite_off else call)
            return
        if self.lite_off is None and lite_off is not None:
            self.lite_off = lite_off  # one line says why XLA
            log.info("%s: small calls are compiled with XLA, not %s: %s", self._label,
                     LITE, lite_off)
        self._keep(key, call, "XLA")

    def _try(self, engine: str, build, arrays: list, want: dict):
        """build(arrays) checked against the executor's answer: the call, or why not."""
        try:
            call = build(arrays)
            got = call(arrays)
        except Exception as exc:  # both refuse many graphs; the executor keeps them
            verb = "cannot convert it" if engine == LITE else "cannot compile it"
            return f"{engine} {verb} ({_first_line(exc)})"
        differs = _difference(want, got)
        if differs:
            return f"the compiled call answered {differs}" if engine == "XLA" \
                else f"it answered {differs}"
        return call

    def _keep(self, key, call, engine: str) -> None:
        if self.off is None:
            call.engine = engine
            self._calls[key] = call
            log.debug("%s: compiled with %s for input shapes %s", self._label, engine, key)

    def _build_lite(self, arrays: list, resizes: bool = False):
        """One TensorFlow Lite interpreter (one thread) sized for these arrays' shapes;
        one that `resizes` is sized again for each call's shapes when they differ."""
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise RuntimeError("ai-edge-litert is not installed") from None
        if self._lite_model is None:
            import tensorflow as tf
            converter = tf.lite.TFLiteConverter.from_concrete_functions(
                [self._fn], self._owner)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            model = converter.convert()
            if len(model) > LITE_MAX_BYTES:
                raise RuntimeError(f"converted, it is {len(model) >> 20} MB, past "
                                   f"{LITE_MAX_BYTES >> 20} MB")
            self._lite_model = model
        interpreter = Interpreter(model_content=self._lite_model, num_threads=1)
        signatures = interpreter.get_signature_list()
        if len(signatures) != 1:
            raise RuntimeError(f"converted, it has {len(signatures)} signatures")
        runner = interpreter.get_signature_runner(next(iter(signatures)))
        ins, outs = runner.get_input_details(), runner.get_output_details()
        del runner  # it holds the interpreter, which refuses a resize while anything does
        if sorted(ins) != sorted(self._names) or sorted(outs) != self._outputs:
            raise RuntimeError("its inputs or outputs are not the signature's")
        # the converted model's only graph is its signature's: its tensor indices are
        # the interpreter's own
        places = [(ins[name]["index"], np.dtype(ins[name]["dtype"])) for name in self._names]
        for (index, _), array in zip(places, arrays, strict=True):
            interpreter.resize_tensor_input(index, array.shape, strict=True)
        interpreter.allocate_tensors()
        answers = [(name, outs[name]["index"]) for name in self._outputs]
        set_tensor, get_tensor, invoke = (interpreter.set_tensor, interpreter.get_tensor,
                                          interpreter.invoke)
        lock = threading.Lock()  # an interpreter answers one call at a time
        sized = [[a.shape for a in arrays]]

        def call(inputs: list) -> dict:
            with lock:
                if resizes and [a.shape for a in inputs] != sized[0]:
                    sized[0] = [a.shape for a in inputs]
                    for (index, _), shape in zip(places, sized[0], strict=True):
                        interpreter.resize_tensor_input(index, shape, strict=True)
                    interpreter.allocate_tensors()
                for (index, dtype), array in zip(places, inputs, strict=True):
                    set_tensor(index, array if array.dtype == dtype else
                               np.asarray(array, dtype))
                invoke()  # without the GIL
                return {name: get_tensor(index) for name, index in answers}
        call.keep = interpreter  # type: ignore[attr-defined]
        return call

    def _build(self, arrays: list):
        """The signature compiled with XLA for these arrays' shapes."""
        import tensorflow as tf
        from tensorflow.python.eager import context

        fn, names = self._fn, self._names
        compiled = tf.function(lambda *args: fn(**dict(zip(names, args, strict=True))),
                               jit_compile=True, autograph=False)
        concrete = compiled.get_concrete_function(
            *[tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in arrays])
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
        tensor_of = self._tensor_of or [tf.constant] * len(names)

        def call(inputs: list) -> dict:
            tensors = [make(a) for make, a in zip(tensor_of, inputs, strict=True)]
            return {name: value.numpy() for name, value in zip(
                outputs, call_function(name, tensors + captured, count), strict=True)}
        # the first call compiles it and registers it with the runtime, and the runtime
        # forgets a function once its Python objects are collected
        call.keep = (compiled, concrete, atomic)  # type: ignore[attr-defined]
        return call

    def _stop(self, why: str) -> None:
        self.off = why
        self._calls.clear()
        log.info("%s: small calls are left to TensorFlow's executor: %s", self._label, why)


def _best_of(call, arrays: list, times: int = 3) -> float:
    best = float("inf")
    for _ in range(times):
        began = time.perf_counter()
        call(arrays)
        best = min(best, time.perf_counter() - began)
    return best


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


__all__ = ["CompiledCalls", "drain", "state_changes", "SMALL_CALL_S", "MAX_ROWS", "MAX_SHAPES",
           "LITE"]
