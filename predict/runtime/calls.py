"""How a request's model call runs, for REST and gRPC alike: the one place that decides.

- With `--enable_batching` (or, with `--enable_per_model_batching_parameters`, for a
  version whose folder holds `batching_params.pbtxt`) the version's model is wrapped so
  that its `predict` joins the batch queue of its model, version and signature and
  waits there for its rows of the merged call (predict.runtime.batching); otherwise it calls
  the signature itself (`model_for`).
- A REST request's work (its JSON decoded and checked, the call, the answer encoded)
  runs on the pool, `--rest_api_num_threads` threads, while the event loop goes on
  reading other requests; past `--rest_api_timeout_in_ms` the client is answered 504
  (DEADLINE_EXCEEDED) and the call finishes on its own (`rest`).
- A gRPC call runs on the gRPC server's threads (`grpc_pool`, the same count), as
  grpcio hands it over.

Whichever way, the call is TensorFlow's own: the SavedModel's signature, as TF Serving
calls it (or, with `--prefer_tflite_model`, the version's model.tflite). Nothing runs
on the event loop, and which way a request goes depends on the flags and the version's
folder, never on how long a call took.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from predict.errors import PredictError


class DeadlineExceeded(PredictError):
    """A REST request ran past --rest_api_timeout_in_ms: HTTP 504."""


class Calls:
    def __init__(self, threads: int, *, batcher=None, timeout_s: float = 30.0):
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="predict")
        self._grpc: ThreadPoolExecutor | None = None

    def model_for(self, model, name: str, version: int = 0):
        """The version's model as a request calls it: through its batch queue, or
        itself."""
        return model if self.batcher is None else self.batcher.wrap(model, name, version)

    async def rest(self, fn, *args):
        """fn(*args) on the pool, awaited on the event loop; DeadlineExceeded past the
        timeout (the call goes on, its answer dropped)."""
        future = asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"the request took longer than "
                                   f"{self.timeout_s * 1000:g} ms "
                                   "(--rest_api_timeout_in_ms)") from None

    def grpc_pool(self) -> ThreadPoolExecutor:
        """The threads gRPC calls run on (grpcio's server hands each call to one)."""
        if self._grpc is None:
            self._grpc = ThreadPoolExecutor(max_workers=self.threads,
                                            thread_name_prefix="grpc")
        return self._grpc

    def close(self) -> None:
        """Both pools, once the servers stopped (their calls ended or were cut)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self._grpc is not None:
            self._grpc.shutdown(wait=True, cancel_futures=True)


__all__ = ["Calls", "DeadlineExceeded"]
