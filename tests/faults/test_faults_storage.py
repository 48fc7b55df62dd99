"""Fault: the job dir's storage fails mid-run.

A real GCS emulator (its own process, on-disk so that objects survive a restart) is
stopped under a process that uploads checkpoints the way the chief does. A short outage
is ridden out by storage's retries with back-off; an outage longer than the retry budget
ends in a one-line StorageError naming the URL, and what was published before it (the
export, the last complete checkpoint) is still whole when the storage comes back.

The uploader runs as a separate process, as the chief does: gcsfs keeps its endpoint and
connections in process-wide caches, and MLJOB_STORAGE_REQUEST_RETRIES is read at import.
It waits for a line on stdin before each checkpoint, so the test decides exactly which
upload meets the outage.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from tests.support.common import reset_gcsfs, free_ports, start_gcs_emulator
from mljob import storage

BUCKET = "mljob-faults"
JOB = f"gs://{BUCKET}/job"
MODEL_FILES = {"saved_model.pb": b"graph" * 100, "variables/variables.index": b"idx",
               "variables/variables.data-00000-of-00001": os.urandom(50_000)}

UPLOADER = r"""
import logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # storage reports each failure
from mljob import storage
job, scratch, model_src = sys.argv[1:4]
try:
    storage.publish_dir(model_src, storage.join(job, "model"), marker="saved_model.pb")
    print("published model", flush=True)
    step = 0
    for _ in sys.stdin:
        step += 1
        local = os.path.join(scratch, f"ckpt{step}")
        os.makedirs(local)
        for name, data in ((f"ckpt-{step}.index", b"i%d" % step),
                           (f"ckpt-{step}.data-00000-of-00001", os.urandom(20_000)),
                           ("checkpoint", b"model_checkpoint_path: \"ckpt-%d\"" % step)):
            with open(os.path.join(local, name), "wb") as f:
                f.write(data)
        storage.upload_tree(local, storage.join(job, "checkpoints"), last=["checkpoint"])
        print(f"uploaded {step}", flush=True)
except storage.StorageError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(1)
print("done", flush=True)
"""


class Emulator:
    """gcp-storage-emulator storing under `workdir` (it keeps objects below its cwd when
    not --in-memory), restartable on the same port."""

    def __init__(self, reaper, workdir):
        self.reaper = reaper
        self.workdir = str(workdir)
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        # On disk (not --in-memory), so the bucket's objects survive a restart.
        self.proc = start_gcs_emulator(self.reaper.popen, self.port, BUCKET,
                                       in_memory=False, cwd=self.workdir)

    def stop(self):
        # It rewrites its whole index (.meta) in place after each change, and a SIGTERM
        # mid-write leaves a file it cannot read back at the next start. It serves one
        # request at a time, so once it answers this one, no earlier request is still
        # writing (one it is still reading from a frozen client writes nothing).
        try:
            urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
        except OSError:
            pass
        self.reaper.stop(self.proc)


class Uploader:
    """The UPLOADER script in its own process, its stdout and stderr read by threads."""

    def __init__(self, reaper, emulator, tmp_path, attempts, delay):
        model_src = tmp_path / "model-src"
        for rel, data in MODEL_FILES.items():
            (model_src / rel).parent.mkdir(parents=True, exist_ok=True)
            (model_src / rel).write_bytes(data)
        (tmp_path / "scratch").mkdir()
        env = dict(os.environ, STORAGE_EMULATOR_HOST=emulator.url,
                   MLJOB_STORAGE_RETRIES=str(attempts),
                   MLJOB_STORAGE_RETRY_DELAY=str(delay),
                   MLJOB_STORAGE_REQUEST_RETRIES="1")
        self.proc = reaper.python("-c", UPLOADER, JOB, str(tmp_path / "scratch"),
                                  str(model_src), env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, bufsize=1)
        self.out, self.err = queue.Queue(), queue.Queue()
        self.err_lines: list[str] = []
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=_pump, args=(stream, lines), daemon=True).start()

    def expect(self, line, timeout=60):
        got = self.out.get(timeout=timeout)
        assert got == line, (got, self.stderr())

    def go(self):
        self.proc.stdin.write("go\n")

    def wait_for_retries(self, count, timeout=60):
        deadline = time.time() + timeout
        while sum("retry" in line for line in self.err_lines) < count:
            assert time.time() < deadline and self.proc.poll() is None, self.stderr()
            try:
                self.err_lines.append(self.err.get(timeout=0.5))
            except queue.Empty:
                pass

    def finish(self, timeout=120) -> int:
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        code = self.proc.wait(timeout)
        time.sleep(0.2)  # let the pump threads drain
        return code

    def stderr(self) -> str:
        while not self.err.empty():
            self.err_lines.append(self.err.get())
        return "\n".join(self.err_lines)

    def stdout_rest(self) -> list[str]:
        lines = []
        while not self.out.empty():
            lines.append(self.out.get())
        return lines


def _pump(stream, lines):
    for line in stream:
        lines.put(line.rstrip("\n"))


@pytest.fixture
def emulator(reaper, tmp_path, monkeypatch):
    """Our own emulator (the session one must not be stopped); this process's gcsfs is
    pointed at it for the checks and back at the session's one afterwards."""
    workdir = tmp_path / "emulator"
    workdir.mkdir()
    emu = Emulator(reaper, workdir)
    emu.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    reset_gcsfs()
    yield emu
    reset_gcsfs()


def job_tree(tmp_path, rel, name) -> dict[str, bytes]:
    """What the job dir holds under rel, read back through storage (fresh client)."""
    reset_gcsfs()
    out = tmp_path / name
    storage.download_tree(storage.join(JOB, rel), str(out))
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_short_outage_is_retried_with_back_off_and_uploads_complete(emulator, reaper,
                                                                     tmp_path):
    uploader = Uploader(reaper, emulator, tmp_path, attempts=10, delay=0.2)
    uploader.expect("published model")
    uploader.go()
    uploader.expect("uploaded 1")

    emulator.stop()
    uploader.go()                      # checkpoint 2 meets the outage
    uploader.wait_for_retries(3)       # refused three times, backing off
    emulator.start()                   # same port, same on-disk store
    uploader.expect("uploaded 2")
    uploader.go()
    uploader.expect("uploaded 3")
    assert uploader.finish() == 0, uploader.stderr()
    assert uploader.stdout_rest() == ["done"]

    warnings = [line for line in uploader.stderr().splitlines() if "retry" in line]
    # aiohttp's refused connection, as gcsfs raises it, is classified transient ...
    assert all(f"upload to {JOB}/checkpoints failed" in w for w in warnings[:3]), warnings
    assert "Cannot connect to host 127.0.0.1" in warnings[0]
    # ... and retried with doubling pauses, each with up to half of it again at random.
    pauses = [w.split("), ")[-1] for w in warnings[:3]]
    assert [p.split(" in ")[0] for p in pauses] == ["retry 1/9", "retry 2/9", "retry 3/9"]
    for pause, fixed in zip(pauses, (0.2, 0.4, 0.8), strict=True):
        assert fixed - 0.05 <= float(pause.split(" in ")[1].rstrip("s")) <= fixed * 1.5 + 0.05

    checkpoints = job_tree(tmp_path, "checkpoints", "ckpts")
    assert checkpoints["checkpoint"] == b'model_checkpoint_path: "ckpt-3"'
    assert {f"ckpt-{s}.index" for s in (1, 2, 3)} <= set(checkpoints)
    assert job_tree(tmp_path, "model", "model") == MODEL_FILES  # survived the restart


def test_outage_beyond_the_budget_fails_clearly_and_keeps_what_was_published(
        emulator, reaper, tmp_path):
    uploader = Uploader(reaper, emulator, tmp_path, attempts=3, delay=0.1)
    uploader.expect("published model")
    uploader.go()
    uploader.expect("uploaded 1")

    emulator.stop()
    uploader.go()
    assert uploader.finish() == 1
    errors = [line for line in uploader.stderr().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, uploader.stderr()
    assert f"cannot upload to {JOB}/checkpoints after 3 attempts" in errors[0]
    assert "check that the storage is reachable" in errors[0]
    assert "Traceback" not in uploader.stderr()

    emulator.start()
    assert job_tree(tmp_path, "model", "model") == MODEL_FILES
    checkpoints = job_tree(tmp_path, "checkpoints", "ckpts")
    # The state file still names the last checkpoint that was uploaded whole.
    assert checkpoints["checkpoint"] == b'model_checkpoint_path: "ckpt-1"'
    assert "ckpt-1.data-00000-of-00001" in checkpoints


# --- the real checkpoint store under the outage --------------------------------------

CHECKPOINTER = r"""
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
import numpy as np
import tensorflow as tf
from mljob import storage
from mljob.training.checkpoints import CheckpointStore
store = CheckpointStore(sys.argv[1], keep=3, writer=True)
values = tf.Variable(np.zeros(4_000_000, np.float32))   # a 16 MB data file
step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(values=values, step=step)
try:
    for line in sys.stdin:
        n = int(line)
        values.assign(np.full(4_000_000, n, np.float32))
        step.assign(n)
        store.save(checkpoint, n)
        print(f"saved {n}", flush=True)
except storage.StorageError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(1)
"""


def _objects(emulator, prefix: str) -> dict[str, str]:
    """name -> generation of the bucket's objects under prefix, asked of the emulator."""
    import json
    import urllib.parse
    import urllib.request
    query = urllib.parse.urlencode({"prefix": prefix})
    with urllib.request.urlopen(f"{emulator.url}/storage/v1/b/{BUCKET}/o?{query}",
                                timeout=5) as answer:
        items = json.load(answer).get("items", [])
    return {item["name"]: str(item.get("generation")) for item in items}


def test_real_checkpoint_store_cut_off_mid_save_leaves_only_whole_checkpoints(
        emulator, reaper, tmp_path):
    """The trainer's own CheckpointStore uploads checkpoint 2 when the storage goes
    away right after the first of its objects lands. Whatever landed, every index has
    its data, the state file names a whole checkpoint, and restore reads it back (an
    index or state file written before the data would be caught here)."""
    from tests.support.common import ROOT
    env = dict(os.environ, STORAGE_EMULATOR_HOST=emulator.url, MLJOB_STORAGE_RETRIES="3",
               MLJOB_STORAGE_RETRY_DELAY="0.1", MLJOB_STORAGE_REQUEST_RETRIES="1",
               PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    url = storage.join(JOB, "checkpoints")
    proc = reaper.python("-c", CHECKPOINTER, url, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         bufsize=1)
    out, err = queue.Queue(), queue.Queue()
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_pump, args=(stream, lines), daemon=True).start()
    proc.stdin.write("1\n")
    assert out.get(timeout=240) == "saved 1"
    before = _objects(emulator, "job/checkpoints/")
    assert {"job/checkpoints/checkpoint", "job/checkpoints/ckpt-1.index"} <= set(before)

    proc.stdin.write("2\n")
    deadline = time.time() + 120
    while _objects(emulator, "job/checkpoints/") == before:
        assert time.time() < deadline and proc.poll() is None, "checkpoint 2 never started"
        time.sleep(0.005)
    # The outage, right after the first new object: the checkpointer is frozen while
    # the emulator stops (a SIGKILLed emulator may leave its own index half-written).
    os.kill(proc.pid, signal.SIGSTOP)
    emulator.stop()
    os.kill(proc.pid, signal.SIGCONT)
    proc.stdin.close()
    assert proc.wait(120) == 1
    time.sleep(0.2)
    errors = []
    while not err.empty():
        errors.append(err.get())
    assert [e for e in errors if e.startswith("error: ")], errors
    assert "Traceback" not in "\n".join(errors)

    emulator.start()
    reset_gcsfs()
    tree = job_tree(tmp_path, "checkpoints", "after")
    for name in [n for n in tree if n.endswith(".index")]:
        data = name.replace(".index", ".data-00000-of-00001")
        assert data in tree and len(tree[data]) >= 16_000_000, (name, sorted(tree))
    named = tree["checkpoint"].decode().splitlines()[0]
    newest = int(named.split('"ckpt-')[1].rstrip('"'))
    assert f"ckpt-{newest}.index" in tree, (named, sorted(tree))

    import numpy as np
    import tensorflow as tf
    from mljob.training.checkpoints import CheckpointStore
    values = tf.Variable(np.zeros(4_000_000, np.float32))
    step = tf.Variable(0, dtype=tf.int64)
    store = CheckpointStore(url, keep=3, writer=False)
    try:
        restored = store.restore(tf.train.Checkpoint(values=values, step=step))
    finally:
        store.close()
    assert restored in (1, 2) and int(step.numpy()) == restored
    assert float(values.numpy().min()) == float(values.numpy().max()) == restored
