"""`--enable_batching`: concurrent requests merged into one signature call, as TF
Serving's batching session does, with its BatchingParameters (predict.protos).

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

A caller that must not block (the REST event loop) puts its request in the queue with
`enqueue` and is called back from the thread that ran the batch; every other caller
waits in `predict`. Once a queue's last batch ran within LOOP_S (a small model, or
merged batches on TensorFlow Lite), a batch the loop opens is timed and run by the loop
itself (its timers have a millisecond's grain, as TF Serving's batch threads, which
look again every millisecond): a batcher thread waking for it and taking the GIL from
the loop cost some twenty thread switches a batch, as much CPU as the requests'
decoding. A thread's request that joins such a batch is answered by the loop's run; a
batch that runs longer sends the next ones back to the threads. Of a queue's threads,
one at a time waits out the first batch's timeout; the others wake when a batch opens
or fills up.

With `--batch_when_idle` (ours) a batch does not wait out `batch_timeout_micros` for
requests that are not there (`Arrivals`): the server counts each predict request a
pool thread carries from when it is read until it joins a queue (or is answered
without one; a REST :predict queued from the event loop joins as it is read), and once
none is on its way to any queue the thread of the request that arrived last runs what
waits in its queue (no batcher thread between), the other queues' threads run theirs. TF
Serving waits the whole timeout even at one client (3 ms a request at
`batch_timeout_micros=2000`, where the call takes 0.1); under load requests keep
coming and batches fill or time out as before.
"""
from __future__ import annotations

import collections
import threading
import time
import weakref

import numpy as np

from predict.errors import PredictError
from predict.protos import BatchingParameters

IDLE_S = 5.0
LOOP_S = 0.001  # a queue whose last batch ran within this runs an event loop's on it


class Unavailable(PredictError):
    """The batch queue is full (max_enqueued_batches): HTTP 503, gRPC UNAVAILABLE."""


class _Item:
    __slots__ = ("batch", "rows", "done", "on_done", "loop", "result", "error")

    def __init__(self, batch: dict, rows: int, on_done=None, loop=None):
        self.batch = batch
        self.rows = rows
        self.on_done = on_done  # called with the item once answered, else done is set
        self.loop = loop  # the event loop that queued it, which may run its batch
        self.done = threading.Event() if on_done is None else None
        self.result: dict | None = None
        self.error: BaseException | None = None


class _Batch:
    __slots__ = ("items", "rows", "opened", "closed", "on_loop")

    def __init__(self, item: _Item):
        self.items = [item]
        self.rows = item.rows
        self.opened = time.monotonic()
        self.closed = False
        self.on_loop = False  # timed and run by the event loop that opened it


class Arrivals:
    """The server's predict requests on their way to a batch queue: `coming()` as a
    request is read (any thread), `carry()` on the thread that will decode it and call
    the model, `gone()` on that thread after its answer; a Batcher told of them counts a
    request as arrived when it joins a queue, and runs a batch early once none is
    coming."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self._local = threading.local()
        self._batchers: weakref.WeakSet = weakref.WeakSet()  # a swapped-out version's go

    def coming(self) -> None:
        with self._lock:
            self.count += 1

    def carry(self) -> None:
        self._local.carrying = True

    def arrived(self) -> bool:
        """The request this thread carries joined a queue (under its lock): True when
        it was the last one coming."""
        if getattr(self._local, "carrying", False):
            self._local.carrying = False
            with self._lock:
                self.count -= 1
                return self.count == 0
        return False

    def gone(self) -> None:
        """The request this thread carried was answered; if it never joined a queue and
        was the last one coming, the open batches need not wait for it."""
        if getattr(self._local, "carrying", False):
            self._local.carrying = False
            with self._lock:
                self.count -= 1
                last = self.count == 0
            if last:
                self.wake()

    def wake(self) -> None:
        with self._lock:
            batchers = list(self._batchers)
        for batcher in batchers:
            batcher.wake()

    def watch(self, batcher: "Batcher") -> None:
        with self._lock:
            self._batchers.add(batcher)


class _Queue:
    def __init__(self):
        self.batches: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.threads = 0
        self.recent: float | None = None  # seconds the last batch's run took
        self.timer: int | None = None  # the thread waiting for the first batch's timeout


class Batcher:
    def __init__(self, params: BatchingParameters | None = None, *, metrics=None,
                 max_batch_size: int | None = None, timeout_s: float | None = None,
                 arrivals: Arrivals | None = None):
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
        self.arrivals = arrivals
        if arrivals is not None:
            arrivals.watch(self)

    def wrap(self, model, model_name: str, version: int = 0) -> "BatchedModel":
        return BatchedModel(self, model, model_name, version)

    def predict(self, model, model_name: str, batch: dict, signature_name: str,
                version: int = 0) -> dict:
        rows = len(next(iter(batch.values())))
        if rows >= self.max_batch_size or self._stopped:
            return model.predict(batch, signature_name)
        item = _Item(batch, rows)
        for ready in self._put(item, model, model_name, signature_name, version):
            self._run(model, model_name, signature_name, ready.items, ready.rows)
        assert item.done is not None
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None  # the worker sets a result or an error
        return item.result

    def enqueue(self, model, model_name: str, batch: dict, signature_name: str,
                version: int, on_done, loop=None) -> bool:
        """predict() without waiting, for a caller that must not block (the REST event
        loop): the request joins its queue and on_done(item) is called, on the thread
        that ran its batch, once item.result or item.error is set. When the queue's
        last batch ran within LOOP_S, a due batch holding a request of `loop` is run by
        that loop (module docstring). False, and nothing queued, for a request predict()
        would not batch (the caller calls the model). Unavailable when the queue is
        full."""
        rows = len(next(iter(batch.values())))
        if rows >= self.max_batch_size or self._stopped:
            return False
        self._put(_Item(batch, rows, on_done, loop), model, model_name, signature_name,
                  version)
        return True

    def _put(self, item: _Item, model, model_name: str, signature_name: str,
             version: int) -> list:
        """item into its queue, a batcher thread started or told; -> the batches this
        thread is to run itself (with --batch_when_idle, when its request was the last
        one coming)."""
        key = (model_name, version, signature_name)
        last, ready = False, []
        with self._lock:
            work = self._queues.get(key)
            if work is None:
                work = self._queues[key] = _Queue()
            with work.cond:
                wake = self._enqueue(work, item) or self.arrivals is not None
                if item.loop is not None and work.recent is not None and \
                        work.recent <= LOOP_S:  # its loop times and runs the batch
                    self._on_loop_soon(work, item, model, model_name, signature_name)
                    return []
                if self.arrivals is not None and item.on_done is None:
                    last = self.arrivals.arrived()
                if last:  # nothing else is coming: this thread runs what waits here
                    while work.batches:
                        ready.append(work.batches.popleft())
                        ready[-1].closed = True
                elif work.threads < self.params.num_batch_threads:
                    work.threads += 1
                    threading.Thread(target=self._worker, args=(key, work, model,
                                                                model_name, signature_name),
                                     name="batcher", daemon=True).start()
                if wake:
                    work.cond.notify()
        if last and self.arrivals is not None:  # nor need the other queues' batches
            self.arrivals.wake()
        return ready

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
                    if first is not None and first.on_loop:  # the loop's to run
                        if work.timer == me:
                            work.timer = None
                        work.cond.wait(IDLE_S)
                        continue
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
            self._run(model, model_name, signature, batch.items, batch.rows, work)

    def _ready(self, work: _Queue, first: _Batch, now: float) -> bool:
        """Whether the batch at work's head runs now: closed, full, past its timeout,
        with another behind it, or (--batch_when_idle) nothing else coming."""
        return first.closed or first.rows >= self.max_batch_size or \
            now >= first.opened + self.timeout_s or len(work.batches) > 1 or \
            (self.arrivals is not None and self.arrivals.count == 0)

    def _on_loop_soon(self, work: _Queue, item: _Item, model, model_name: str,
                      signature: str) -> None:
        """(under work.cond) item, from an event loop, just joined work's last batch: a
        batch it opened is timed on the loop, one ready now is run there soon."""
        loop, last = item.loop, work.batches[-1]
        args = (work, model, model_name, signature, loop)
        if len(work.batches) > 1 or last.rows >= self.max_batch_size or (
                self.arrivals is not None and self.arrivals.count == 0):
            loop.call_soon(self._on_loop, None, *args)
        if last.items[0] is item:
            last.on_loop = True
            loop.call_later(self.timeout_s, self._on_loop, last, *args)

    def _on_loop(self, timed: _Batch | None, work: _Queue, model, model_name: str,
                 signature: str, loop) -> None:
        """On the event loop, at `timed`'s timeout (or at once when a batch filled up or
        was closed): run the batches at the queue's head that are ready, as a batcher
        thread would; a timer that came early (the loop's clock has a millisecond's
        grain) comes back when `timed` is due."""
        while True:
            with work.cond:
                first = work.batches[0] if work.batches else None
                if first is None:
                    return
                now = time.monotonic()
                if not self._ready(work, first, now):
                    if timed is not None and first is timed:
                        loop.call_later(first.opened + self.timeout_s - now, self._on_loop,
                                        timed, work, model, model_name, signature, loop)
                    return
                batch = work.batches.popleft()
                batch.closed = True
                if not batch.on_loop or (work.batches and not work.batches[0].on_loop):
                    work.cond.notify_all()  # the threads time a head that is theirs
            self._run(model, model_name, signature, batch.items, batch.rows, work)

    def _run(self, model, model_name: str, signature: str, items: list, rows: int,
             work: _Queue | None = None) -> None:
        began = time.perf_counter()
        try:
            self._call(model, model_name, signature, items, rows)
        finally:
            if work is not None:  # the model's time, not the answers' hand-off below
                work.recent = time.perf_counter() - began
            for item in items:
                if item.on_done is not None:
                    item.on_done(item)
                else:
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
            merged_call = getattr(model, "predict_merged", model.predict)
            outputs = merged_call(merged, signature)
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

    def wake(self) -> None:
        """Every queue's threads look again at their open batch (Arrivals.gone)."""
        with self._lock:
            queues = list(self._queues.values())
        for work in queues:
            with work.cond:
                work.cond.notify_all()

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
    parameters. Each version's file is read once, at its first request."""

    def __init__(self, common: BatchingParameters, *, metrics=None,
                 arrivals: Arrivals | None = None):
        self.common = common
        self.metrics = metrics
        self.arrivals = arrivals
        self._lock = threading.Lock()
        self._by_source: dict = {}  # the version's URL -> Batcher, or None: no file

    def batcher_for(self, source: str) -> Batcher | None:
        with self._lock:
            if source not in self._by_source:
                self._by_source[source] = self._read(source)
            return self._by_source[source]

    def _read(self, source: str) -> Batcher | None:
        from mljob import storage
        from predict import protos
        url = storage.join(source, PER_MODEL_FILE)
        try:
            if not storage.exists(url):
                return None
        except (OSError, storage.StorageError):
            return None
        params = protos.read_batching(url, self.common.num_batch_threads)
        params = _replace(params, num_batch_threads=self.common.num_batch_threads)
        return Batcher(params, metrics=self.metrics, arrivals=self.arrivals)

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

    def enqueue(self, batch: dict, signature_name: str, on_done, loop=None) -> bool:
        """Batcher.enqueue for this model's version (signature_name as the signature
        has it)."""
        return self._batcher.enqueue(self._model, self._name, batch, signature_name,
                                     self._version, on_done, loop)


__all__ = ["Arrivals", "Batcher", "BatchedModel", "PerModelBatchers", "Unavailable"]
