"""`--enable_batching`: concurrent requests merged into one signature call, as TF
Serving's batching session does, with its BatchingParameters (predict.runtime.protos).

A request's decoded batch joins the queue of its model, *version* and signature (a
queue per loaded version: after a swap the new version's requests never share a call
with the old one's). The queue holds batches: a request joins the open batch when its
rows fit (at most `max_batch_size`), else it opens a new one; past
`max_enqueued_batches` waiting batches the request is refused with Unavailable (HTTP
503, gRPC UNAVAILABLE), TF Serving's back-pressure. `num_batch_threads` threads a
queue take the oldest batch once it is full or `batch_timeout_micros` after its first
request, concatenate the inputs along the batch dimension, pad the batch up to the
next of `allowed_batch_sizes` (copies of the first row, as TF Serving pads), call the
signature once and hand every request its own rows. With
`pad_variable_length_inputs`, inputs whose other dimensions differ are padded to the
largest with their first element's value (TF Serving's rule); without it such requests
run in separate calls. A request larger than `max_batch_size` runs alone (TF Serving
refuses it). A queue's threads end after IDLE_S without work, so an unloaded version is
not kept alive by them.

Of a queue's threads, one at a time waits out the first batch's timeout; the others
wake when a batch opens or fills up. A batch is called through the model's own
`predict`: TensorFlow's executor, as for a request alone.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from predict.errors import PredictError
from predict.runtime.protos import BatchingParameters

IDLE_S = 5.0


class Unavailable(PredictError):
    """The batch queue is full (max_enqueued_batches): HTTP 503, gRPC UNAVAILABLE."""


class _Item:
    __slots__ = ("batch", "rows", "done", "result", "error")

    def __init__(self, batch: dict, rows: int):
        self.batch = batch
        self.rows = rows
        self.done = threading.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None


class _Batch:
    __slots__ = ("items", "rows", "opened", "closed")

    def __init__(self, item: _Item):
        self.items = [item]
        self.rows = item.rows
        self.opened = time.monotonic()
        self.closed = False


class _Queue:
    def __init__(self):
        self.batches: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.threads = 0
        self.timer: int | None = None  # the thread waiting for the first batch's timeout


class Batcher:
    def __init__(self, params: BatchingParameters | None = None, *, metrics=None,
                 max_batch_size: int | None = None, timeout_s: float | None = None):
        params = params or BatchingParameters()
        if max_batch_size is not None:
            params = _replace(params, max_batch_size=max_batch_size)
        if timeout_s is not None:
            params = _replace(params, batch_timeout_micros=int(timeout_s * 1e6))
        self.params = params
        self.max_batch_size = params.max_batch_size
        self.timeout_s = params.batch_timeout_micros / 1e6
        self.metrics = metrics
        self._lock = threading.Lock()
        self._queues: dict = {}  # (model name, version, signature) -> _Queue
        self._stopped = False

    def wrap(self, model, model_name: str, version: int = 0) -> "BatchedModel":
        return BatchedModel(self, model, model_name, version)

    def predict(self, model, model_name: str, batch: dict, signature_name: str,
                version: int = 0) -> dict:
        rows = len(next(iter(batch.values())))
        if rows >= self.max_batch_size or self._stopped:
            return model.predict(batch, signature_name)
        item = _Item(batch, rows)
        self._put(item, model, model_name, signature_name, version)
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None  # the worker sets a result or an error
        return item.result

    def _put(self, item: _Item, model, model_name: str, signature_name: str,
             version: int) -> None:
        """item into its queue, a batcher thread started or told."""
        key = (model_name, version, signature_name)
        with self._lock:
            work = self._queues.get(key)
            if work is None:
                work = self._queues[key] = _Queue()
            with work.cond:
                wake = self._enqueue(work, item)
                if work.threads < self.params.num_batch_threads:
                    work.threads += 1
                    threading.Thread(target=self._worker, args=(key, work, model,
                                                                model_name, signature_name),
                                     name="batcher", daemon=True).start()
                if wake:
                    work.cond.notify()

    def _enqueue(self, work: _Queue, item: _Item) -> bool:
        """item into the open batch, or a new one; -> whether a batcher thread must look
        again (a batch opened or filled up: one waiting out a timeout need not)."""
        last = work.batches[-1] if work.batches else None
        if last is not None and not last.closed and \
                last.rows + item.rows <= self.max_batch_size and _fits(last, item, self.params):
            last.items.append(item)
            last.rows += item.rows
            return last.rows >= self.max_batch_size
        if len(work.batches) >= self.params.max_enqueued_batches:
            raise Unavailable(f"the batch queue is full ({self.params.max_enqueued_batches} "
                              "batches waiting, max_enqueued_batches); retry later")
        if last is not None:
            last.closed = True
        work.batches.append(_Batch(item))
        return True

    def _worker(self, key, work: _Queue, model, model_name: str, signature: str):
        me = threading.get_ident()
        while True:
            with work.cond:
                idle_until = time.monotonic() + IDLE_S
                while True:
                    first = work.batches[0] if work.batches else None
                    now = time.monotonic()
                    if first is not None:
                        due = first.opened + self.timeout_s
                        if self._ready(work, first, now):
                            batch = work.batches.popleft()
                            batch.closed = True
                            if work.timer == me:  # another thread times the next one
                                work.timer = None
                                if work.batches:
                                    work.cond.notify()
                            break
                        if work.timer in (None, me):  # one thread waits out the timeout
                            work.timer = me
                            work.cond.wait(due - now)
                        else:  # the others wake when a batch opens or fills up
                            work.cond.wait(IDLE_S)
                        continue
                    if work.timer == me:  # no batch to time
                        work.timer = None
                    if now >= idle_until:
                        batch = None
                        break
                    else:
                        work.cond.wait(idle_until - now)
            if batch is None:
                with self._lock, work.cond:  # the order predict() takes them in
                    if not work.batches:
                        work.threads -= 1
                        if work.threads == 0 and self._queues.get(key) is work:
                            del self._queues[key]
                        return
                continue
            self._run(model, model_name, signature, batch.items, batch.rows)

    def _ready(self, work: _Queue, first: _Batch, now: float) -> bool:
        """Whether the batch at work's head runs now: closed, full, past its timeout,
        or with another behind it."""
        return first.closed or first.rows >= self.max_batch_size or \
            now >= first.opened + self.timeout_s or len(work.batches) > 1

    def _run(self, model, model_name: str, signature: str, items: list, rows: int) -> None:
        try:
            self._call(model, model_name, signature, items, rows)
        finally:
            for item in items:
                item.done.set()

    def _call(self, model, model_name: str, signature: str, items: list, rows: int) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.labels(model_name).observe(rows)
        try:
            if len(items) == 1 and not self.params.allowed_batch_sizes:
                items[0].result = model.predict(items[0].batch, signature)
                return
            merged = {name: _concat([i.batch[name] for i in items])
                      for name in items[0].batch}
            size = next((s for s in self.params.allowed_batch_sizes if s >= rows), rows)
            if size > rows:  # pad with copies of the first row, as TF Serving does
                merged = {name: np.concatenate([value, np.repeat(value[:1], size - rows, 0)])
                          for name, value in merged.items()}
            outputs = model.predict(merged, signature)
            if any(len(np.shape(v)) == 0 or len(v) != size for v in outputs.values()):
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

    def stop(self) -> None:
        self._stopped = True


def _fits(batch: _Batch, item: _Item, params: BatchingParameters) -> bool:
    """Same non-batch dimensions, or padding allowed."""
    if params.pad_variable_length_inputs:
        return True
    first = batch.items[0].batch
    return all(np.shape(first[k])[1:] == np.shape(v)[1:] for k, v in item.batch.items())


def _concat(values: list) -> np.ndarray:
    shapes = {np.shape(v)[1:] for v in values}
    if len(shapes) == 1:
        return np.concatenate(values)
    rank = len(next(iter(shapes)))
    widest = tuple(max(s[d] for s in shapes) for d in range(rank))
    padded = []
    for value in values:
        pad = [(0, 0)] + [(0, w - s) for w, s in zip(widest, np.shape(value)[1:], strict=True)]
        fill = value.flat[0] if value.size else 0
        padded.append(np.pad(value, pad, constant_values=fill))
    return np.concatenate(padded)


def _replace(params: BatchingParameters, **changes) -> BatchingParameters:
    import dataclasses
    return dataclasses.replace(params, **changes)


PER_MODEL_FILE = "batching_params.pbtxt"  # TF Serving's name, in a version's folder


class PerModelBatchers:
    """`--enable_per_model_batching_parameters`, as TF Serving: a version whose folder
    holds `batching_params.pbtxt` batches with those parameters (a Batcher of its own),
    one without it is not batched; only num_batch_threads comes from the global
    parameters. Each version's file is read and checked when the version loads
    (`prepare`, the loader's step): a file that cannot be read or holds values out of
    range fails that version's load, with the reason in its status."""

    def __init__(self, common: BatchingParameters, *, metrics=None):
        self.common = common
        self.metrics = metrics
        self._lock = threading.Lock()
        self._by_source: dict = {}  # the version's URL -> Batcher, or None: no file

    def prepare(self, source: str) -> None:
        """Read and check the version's file (UsageError naming what is wrong)."""
        batcher = self._read(source)
        with self._lock:
            old = self._by_source.get(source)
            self._by_source[source] = batcher
        if old is not None:
            old.stop()

    def batcher_for(self, source: str) -> Batcher | None:
        with self._lock:
            known = source in self._by_source
            batcher = self._by_source.get(source)
        if not known:  # a model not loaded through prepare (tests)
            self.prepare(source)
            return self.batcher_for(source)
        return batcher

    def _read(self, source: str) -> Batcher | None:
        from mljob import storage
        from predict.runtime import protos
        url = storage.join(source, PER_MODEL_FILE)
        try:
            if not storage.exists(url):
                return None
        except (OSError, storage.StorageError) as exc:
            raise PredictError(f"{PER_MODEL_FILE}: cannot read {url}: {exc}") from None
        params = protos.read_batching(url, self.common.num_batch_threads,
                                      flag=PER_MODEL_FILE)
        params = _replace(params, num_batch_threads=self.common.num_batch_threads)
        return Batcher(params, metrics=self.metrics)

    def wrap(self, model, model_name: str, version: int = 0):
        batcher = self.batcher_for(model.source)
        return model if batcher is None else BatchedModel(batcher, model, model_name,
                                                          version)

    def stop(self) -> None:
        with self._lock:
            for batcher in self._by_source.values():
                if batcher is not None:
                    batcher.stop()


class BatchedModel:
    """A loaded model whose `predict` goes through the batcher."""

    def __init__(self, batcher: Batcher, model, model_name: str, version: int = 0):
        self._batcher = batcher
        self._model = model
        self._name = model_name
        self._version = version
        self.signatures = model.signatures
        self.source = model.source

    def signature(self, name: str | None = None):
        return self._model.signature(name)

    def predict(self, batch: dict, signature_name: str | None = None) -> dict:
        sig = self._model.signature(signature_name)
        return self._batcher.predict(self._model, self._name, batch, sig.name,
                                     self._version)


__all__ = ["Batcher", "BatchedModel", "PerModelBatchers", "Unavailable"]
