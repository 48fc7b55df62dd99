"""The gRPC port's front end: which server reads the calls, and which thread runs them.

By default (`--grpc_native_front`) pygrpc-native's server: the same `grpc.Server`, with
HTTP/2, flow control, deadlines and message framing done in Rust threads outside the
GIL, which hand Python the calls in batches on one dispatching thread. grpcio's own
server (`--grpc_native_front=false`, or an install without pygrpc-native) does HTTP/2
in its C core and hands Python every call's events one at a time under the GIL.

Either way the servicers run on a thread pool. On the native front that pool is
`Calls`, which runs a call on the dispatching thread itself when a hand-off would only
cost time: a unary call of the serving API (`INLINE_METHODS`) whose last run took at
most `INLINE_S`, while no other call is in flight and batching is off, as the REST
port's fast path does (predict.server): nothing waits behind it, and it saves the two
thread switches of the hand-off (a third of a small model's call at one client).
Every other call (a config reload, a health watch, a slow model, any call while
another runs) goes to the pool as before.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from predict.server import INLINE_S

log = logging.getLogger("predict.grpc")

INLINE_METHODS = frozenset(
    [f"/tensorflow.serving.PredictionService/{name}" for name in
     ("Predict", "Classify", "Regress", "MultiInference", "GetModelMetadata")] +
    ["/tensorflow.serving.ModelService/GetModelStatus", "/grpc.health.v1.Health/Check"])


class Calls(ThreadPoolExecutor):
    """The servicers' pool, running a call on the submitting thread when it is fast and
    nothing else runs (the module docstring says when)."""

    def __init__(self, max_workers: int, *, inline: bool):
        super().__init__(max_workers=max_workers, thread_name_prefix="grpc")
        self.inline = inline
        self._lock = threading.Lock()
        self._busy = 0  # unary calls between their submit and their end
        self._recent: dict = {}  # method -> seconds its last run took

    def submit(self, fn, /, *args, **kwargs):
        method, streaming = _call_of(args)
        counted = not streaming  # a health watch stays open: it holds no thread's work
        if self.inline and method in INLINE_METHODS and not streaming and \
                self._recent.get(method, INLINE_S + 1) <= INLINE_S:
            with self._lock:
                idle = self._busy == 0
                if idle:
                    self._busy += 1
            if idle:
                return self._run_here(method, fn, args, kwargs)
        if counted:
            with self._lock:
                self._busy += 1

        def timed():
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if method is not None:
                    self._recent[method] = time.perf_counter() - began
                if counted:
                    with self._lock:
                        self._busy -= 1
        return super().submit(timed)

    def _run_here(self, method: str, fn, args, kwargs) -> Future:
        future: Future = Future()
        began = time.perf_counter()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as the pool would: the future holds it
            future.set_exception(exc)
        finally:
            self._recent[method] = time.perf_counter() - began
            with self._lock:
                self._busy -= 1
        return future


def _call_of(args: tuple) -> tuple[str | None, bool]:
    """(method, streaming) of a call pygrpc-native's dispatcher submits as
    `submit(context.run, run, call, payload)`; (None, False) for anything else (its
    grpcio fallback server's work), which the pool runs."""
    call = args[1] if len(args) == 3 else None
    method = getattr(call, "method", None)
    if not isinstance(method, str):
        return None, False
    return method, bool(getattr(call, "streaming", True))


def server(threads: int, options: list, *, native: bool, batching: bool) -> grpc.Server:
    """The gRPC server: pygrpc-native's on `Calls` (inline only with batching off: a
    batched call waits for its batch, and others must reach the queue meanwhile), or
    grpcio's own on a plain pool."""
    if native:
        try:
            import pygrpc_native
        except ImportError:  # an install without it: grpcio's server answers the same
            log.info("gRPC: pygrpc-native is not installed; grpcio's server serves "
                     "(pip install pygrpc-native)")
        else:
            return pygrpc_native.server(Calls(threads, inline=not batching),
                                        options=options)
    return grpc.server(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
                       options=options)


__all__ = ["Calls", "INLINE_METHODS", "server"]
