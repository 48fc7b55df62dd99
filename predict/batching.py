"""`--enable-batching`: concurrent requests merged into one signature call, as TF
Serving's batching session does.

A request's decoded batch joins the queue of its (loaded version, signature). One
thread per queue takes the first waiting batch, then waits up to `timeout_s` for more
until `max_batch_size` instances are gathered, concatenates the inputs along the batch
dimension, calls the signature once and hands every request its own rows of the
outputs. A request larger than `max_batch_size` runs alone, as it would unbatched. A
queue's thread ends after IDLE_S without work, so an unloaded version is not kept
alive by it.

Off by default: on 2 cores, merging trades a little latency at low load for fewer,
larger model calls under concurrency (bench/serving_bench.py measures both).
"""
from __future__ import annotations

import queue
import threading

import numpy as np

IDLE_S = 5.0


class _Item:
    __slots__ = ("batch", "rows", "done", "result", "error")

    def __init__(self, batch: dict, rows: int):
        self.batch = batch
        self.rows = rows
        self.done = threading.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None


class Batcher:
    def __init__(self, *, max_batch_size: int = 64, timeout_s: float = 0.001, metrics=None):
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._lock = threading.Lock()
        self._queues: dict = {}  # (id(model), signature) -> queue.Queue
        self._stopped = False

    def wrap(self, model, model_name: str) -> "BatchedModel":
        return BatchedModel(self, model, model_name)

    def predict(self, model, model_name: str, batch: dict, signature_name: str) -> dict:
        rows = len(next(iter(batch.values())))
        if rows >= self.max_batch_size or self._stopped:
            return model.predict(batch, signature_name)
        item = _Item(batch, rows)
        key = (id(model), signature_name)
        with self._lock:
            work = self._queues.get(key)
            if work is None:
                work = self._queues[key] = queue.Queue()
                threading.Thread(target=self._worker, args=(key, work, model, model_name,
                                                            signature_name),
                                 name="batcher", daemon=True).start()
            work.put(item)
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None  # the worker sets a result or an error
        return item.result

    def _worker(self, key, work: queue.Queue, model, model_name: str, signature: str):
        import time
        carry = None
        while True:
            if carry is None:
                try:
                    first = work.get(timeout=IDLE_S)
                except queue.Empty:
                    with self._lock:
                        if work.empty():  # nothing raced in: retire this queue
                            del self._queues[key]
                            return
                    continue
            else:
                first, carry = carry, None
            items, rows = [first], first.rows
            deadline = time.monotonic() + self.timeout_s
            while rows < self.max_batch_size:
                remaining = deadline - time.monotonic()
                try:
                    item = work.get(timeout=remaining) if remaining > 0 else \
                        work.get_nowait()
                except queue.Empty:
                    break
                if rows + item.rows > self.max_batch_size:
                    carry = item  # starts the next batch
                    break
                items.append(item)
                rows += item.rows
            self._run(model, model_name, signature, items, rows)

    def _run(self, model, model_name: str, signature: str, items: list, rows: int) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.labels(model_name).observe(rows)
        try:
            if len(items) == 1:
                items[0].result = model.predict(items[0].batch, signature)
            else:
                merged = {name: np.concatenate([i.batch[name] for i in items])
                          for name in items[0].batch}
                outputs = model.predict(merged, signature)
                if any(len(np.shape(v)) == 0 or len(v) != rows for v in outputs.values()):
                    for item in items:  # outputs without a batch dimension: one by one
                        item.result = model.predict(item.batch, signature)
                else:
                    start = 0
                    for item in items:
                        item.result = {name: value[start:start + item.rows]
                                       for name, value in outputs.items()}
                        start += item.rows
        except Exception as exc:  # the model refused the merged batch: tell each request
            for item in items:
                item.error = exc
        finally:
            for item in items:
                item.done.set()

    def stop(self) -> None:
        self._stopped = True


class BatchedModel:
    """A loaded model whose `predict` goes through the batcher."""

    def __init__(self, batcher: Batcher, model, model_name: str):
        self._batcher = batcher
        self._model = model
        self._name = model_name
        self.signatures = model.signatures
        self.source = model.source

    def signature(self, name: str | None = None):
        return self._model.signature(name)

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        sig = self._model.signature(signature_name)
        return self._batcher.predict(self._model, self._name, batch, sig.name)


__all__ = ["Batcher", "BatchedModel"]
