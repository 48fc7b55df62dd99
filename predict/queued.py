"""REST requests that wait in their batch queue on the event loop (predict.server's
`_predict_queued`, with --enable_batching).

A small :predict is decoded on the loop and put in its queue with a future
(`Batcher.enqueue`); the loop goes on reading other requests while it waits. The
thread that runs a batch hands the answers back: a batch the loop ran itself settles
its futures at once; one a batcher thread ran puts them in a queue and wakes the loop
once for the whole batch. Past the timeout the request is answered 504 and its batch
still runs. A model that is not batched (its version, a request of max_batch_size
rows or more) is called in the pool.
"""
from __future__ import annotations

import asyncio
import collections
import threading

from predict.batching import BatchedModel


class LoopAnswers:
    """The answers of one event loop's queued requests, on their way back to it."""

    def __init__(self):
        self._answers: collections.deque = collections.deque()  # (future, batched item)
        self._due = False  # the loop is woken to settle them

    async def call(self, model, batch: dict, signature: str, *, timeout_s: float,
                   timeout_error, pool) -> dict:
        """model's outputs for batch, waited for on the running loop; timeout_error()
        is raised past timeout_s."""
        running = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        waiter = running.create_future()
        waiter.add_done_callback(_retrieved)

        def answered(item) -> None:  # on the thread that ran the batch
            if threading.get_ident() == loop_thread:  # the loop ran it
                _settle(waiter, item)
                return
            self._answers.append((waiter, item))
            if not self._due:  # one wake of the loop for a batch's answers
                self._due = True
                try:
                    running.call_soon_threadsafe(self._settle_all)
                except RuntimeError:  # the loop closed: the server is stopping
                    pass
        if isinstance(model, BatchedModel) and model.enqueue(batch, signature, answered,
                                                             running):
            timer = running.call_later(timeout_s, _expire, waiter, timeout_error)
            try:
                return await waiter
            finally:
                timer.cancel()
        future = running.run_in_executor(pool, model.predict, batch, signature)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            raise timeout_error() from None

    def idle(self) -> bool:
        """No answer is on its way back (tests)."""
        return not self._answers and not self._due

    def _settle_all(self) -> None:
        """The answers into their futures, on the loop (the flag is cleared first: an
        answer added meanwhile is taken here or wakes it again)."""
        self._due = False
        answers = self._answers
        while answers:
            _settle(*answers.popleft())


def _settle(future: asyncio.Future, item) -> None:
    """A batched request's answer (predict.batching's item) into its future."""
    if not future.done():
        if item.error is not None:
            future.set_exception(item.error)
        else:
            future.set_result(item.result)


def _expire(future: asyncio.Future, error) -> None:
    """The request's timeout: error() into its future, unless answered already."""
    if not future.done():
        future.set_exception(error())


def _retrieved(future: asyncio.Future) -> None:
    """An error nobody awaits any more (the request timed out) is not reported again."""
    if not future.cancelled():
        future.exception()


__all__ = ["LoopAnswers"]
