"""Signal handlers take no lock: a second signal arriving inside the first handler (the
parent-death SIGTERM and another SIGTERM together) once deadlocked a parameter server in
`threading.Event.set`, so it outlived its launcher."""
from __future__ import annotations

import os
import signal
import threading
import time

from mljob.procs import SignalFlag
from mljob.training.signals import StopSignal


class _NoLocks:
    """Stands where the handler must not go: any call is the bug."""

    def __getattr__(self, name):
        raise AssertionError(f"the signal handler called {name}() of a locked object")


def test_the_stop_handler_only_notes_the_signal():
    stop = StopSignal(environ={})
    event, stop._event = stop._event, _NoLocks()
    stop._handle(signal.SIGTERM, None)          # what the interpreter runs on SIGTERM
    stop._handle(signal.SIGTERM, None)          # and again, "inside" the first
    stop._event = event
    assert stop.requested() and stop.reason() == "got SIGTERM"


def test_two_signals_at_once_stop_a_waiting_server():
    stop = StopSignal(environ={})
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, stop._handle)
        signal.signal(signal.SIGINT, stop._handle)

        def send():
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=send, daemon=True).start()
        started = time.monotonic()
        assert stop.wait(30)                      # a server's wait, woken by the signals
        assert time.monotonic() - started < 10
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_flag_is_a_plain_attribute():
    flag = SignalFlag()
    assert not flag.is_set()
    flag.set(signal.SIGINT, None)                 # called as a handler
    flag.set()
    assert flag.is_set()
