"""One retry budget for gs://: the requests a GCS outage receives are counted at the
server's door (a proxy in front of the real GCS emulator that answers 503 while told to),
so gcsfs retrying on its own inside mljob's attempts shows up as extra requests.

With MLJOB_STORAGE_REQUEST_RETRIES=1 and MLJOB_STORAGE_RETRIES=N every failing read,
write, listing and download reaches the server exactly N times, on both filesystem
classes gcsfs may register for gs:// (its extended one overrides the download methods).
"""
from __future__ import annotations

import os
import subprocess

import pytest
import tenacity

from mljob import storage
from tests.support.common import ROOT
from tests.support.flaky_gcs import FlakyGcs

# Reads one operation a line, runs it, answers one line: how the process sees it.
CHILD = r"""
import logging, sys
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
from mljob import storage
for line in sys.stdin:
    op, arg = line.split()
    try:
        if op == "write":
            storage.write_bytes("gs://mljob-test/budget/f", b"payload")
        elif op == "read":
            storage.read_bytes("gs://mljob-test/budget/f")
        elif op == "list":
            storage.download_tree("gs://mljob-test/budget", arg)
        elif op == "download":
            storage.download_tree("gs://mljob-test/budget", arg)
        print("ok", flush=True)
    except FileNotFoundError:
        print("missing", flush=True)
    except storage.StorageError as exc:
        print("error:", exc, flush=True)
"""

# (operation, the requests it makes that the outage answers)
OUTAGES = [("read", r"^GET .*alt=media"), ("write", r"^POST /upload/"),
           ("list", r"^GET /storage/v1/b/mljob-test/o\?"),
           ("download", r"^GET .*alt=media")]


@pytest.fixture
def flaky(gcs_emulator):
    proxy = FlakyGcs(gcs_emulator)
    yield proxy
    proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("extended", ["false", "true"])
def test_a_gcs_outage_gets_exactly_the_budget_of_requests(flaky, reaper, tmp_path,
                                                          extended):
    env = dict(os.environ, STORAGE_EMULATOR_HOST=flaky.url, MLJOB_STORAGE_RETRIES="3",
               MLJOB_STORAGE_RETRY_DELAY="0", MLJOB_STORAGE_REQUEST_RETRIES="1",
               GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=extended, PYTHONPATH=ROOT)
    child = reaper.python("-c", CHILD, env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          bufsize=1)

    def run(op: str) -> str:
        child.stdin.write(f"{op} {tmp_path / op}\n")
        return child.stdout.readline().strip()

    assert run("write") == "ok"  # the object the reads and downloads fail on
    for op, requests in OUTAGES:
        flaky.fail(requests, 503)
        answer = run(op)
        assert answer.startswith("error: cannot ") and "after 3 attempts" in answer, \
            (op, answer)
        assert flaky.count(requests) == 3, (op, flaky.seen)
        flaky.heal()
    flaky.fail(r"^GET .*alt=media", 404)  # not transient: one request, no retry
    assert run("read") == "missing" and flaky.count("alt=media") == 1
    flaky.heal()
    assert run("read") == "ok"


class _State:
    """The part of tenacity's RetryCallState a wait strategy reads."""

    def __init__(self, attempt: int):
        self.attempt_number = attempt


def test_two_retriers_do_not_pause_in_lock_step():
    first, second = storage.backoff(0.5), storage.backoff(0.5)
    pauses = [[wait(_State(n)) for n in range(1, 8)] for wait in (first, second)]
    assert pauses[0] != pauses[1]
    for row in pauses:
        for n, pause in enumerate(row, start=1):
            fixed = min(0.5 * 2 ** (n - 1), storage.RETRY_MAX_DELAY)
            assert fixed <= pause <= fixed * 1.5  # doubling, capped, jitter on top
    assert all(row[-1] != row[-2] for row in pauses)  # jitter holds past the cap
    assert isinstance(first, tenacity.wait.wait_base)
    assert storage.backoff(0)(_State(3)) == 0
