"""A batch prediction job on this machine: up to N worker processes share its shards.

The job lives as every local job does (`submit.local.joblife.JobLife`: PREPARING, RUNNING, an
ending state, everything stopped on every way out, the record published after each
change), supervised in the foreground or by a detached `_supervise prediction` process
holding the job's lock, so `jobs list/describe/stream-logs/cancel` work on it unchanged.

Each worker (`python -m predict.batch_worker`) loads the export once and is handed
shards one at a time on its stdin, so a fast worker takes more of them; it publishes
each shard's files itself and says so on stdout. A worker that dies takes its shard
with it: the shard goes back to the queue and a new worker starts, up to
MAX_SHARD_ATTEMPTS tries a shard; then the job fails, naming the shard and the worker's
last error line. A worker that exits with status 2 (an export that cannot load, an
input it may not read) fails the job at once: no retry mends that. A bad instance is
only an error line.

The output path is claimed with a marker (`.mljob-job.json`, the job id) before any
shard is written: a path holding another job's predictions is refused, and `--resume`
(same job, same output path) skips the shards already published (a shard's results
file is published last, so its presence means the shard is whole).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, cast

import psutil

from mljob import contracts, procs, storage
from mljob.errors import EXIT_USAGE
from submit import jobs, logs
from submit.local.joblife import JobLife
from submit.prediction.output import claim_output, count_lines
from submit.local.supervisor import STOP_GRACE_S, die_with_parent

log = logging.getLogger(__name__)
MAX_SHARD_ATTEMPTS = 3
WORKER_MEMORY = 1 << 30        # what one worker may hold: TensorFlow and one export
PROGRESS_EVERY_S = 2.0
POLL_S = 0.1


@dataclasses.dataclass
class PredictionPlan:
    """Everything the job's supervisor and workers read (`<run dir>/prediction.json`)."""

    job_id: str
    model_dir: str
    output_path: str
    data_format: str
    shards: list[dict]
    workers: int
    batch_size: int = 64
    signature_name: str | None = None
    run_dir: str = ""
    log_dir: str = ""
    prediction_input: dict = dataclasses.field(default_factory=dict)
    mirrors: tuple = ()          # JobLife's: nothing is mirrored

    @property
    def job_file(self) -> str:
        return os.path.join(self.run_dir, "prediction.json")

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.pop("mirrors")
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "PredictionPlan":
        return cls(**json.loads(text))


def machine_workers() -> tuple[int, str]:
    """How many workers this machine holds (cores, and memory at WORKER_MEMORY each)."""
    cores = procs.usable_cores()
    memory = psutil.virtual_memory().available
    most = max(1, min(cores, memory // WORKER_MEMORY))
    return most, f"{cores} cores, {memory / (1 << 30):.1f} GiB available"


class _Worker:
    """One worker process, the shard it holds, its log file."""

    def __init__(self, slot: int, plan: PredictionPlan, events: queue.Queue,
                 terminal: logs.Terminal, threads: int):
        self.slot, self.plan, self.events, self.terminal = slot, plan, events, terminal
        self.label = contracts.replica_label("worker", slot)
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.shard: int | None = None
        self.started = 0.0
        self.last_words = ""
        self.restarts = -1
        self.log_file = os.path.join(plan.log_dir, f"{self.label}.log")
        self.readers: list[threading.Thread] = []

    def start(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {k: v for k, v in os.environ.items() if k not in contracts.ENGINE_VARIABLES}
        env.update({contracts.JOB_ID_ENV: self.plan.job_id,
                    contracts.PARENT_PID_ENV: str(os.getpid()),
                    "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "predict.batch_worker", "--job-file", self.plan.job_file,
             "--worker", str(self.slot), "--threads", str(self.threads)],
            cwd=self.plan.run_dir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()))
        self.started = time.monotonic()
        self.restarts += 1
        self.shard = None
        proc = self.proc
        self.readers = [threading.Thread(target=self._stdout, args=(proc,), daemon=True),
                        threading.Thread(target=self._stderr, args=(proc,), daemon=True)]
        for reader in self.readers:
            reader.start()

    def give(self, index: int) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        self.shard = index
        try:
            self.proc.stdin.write(f"{index}\n".encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False  # it died: the exit is seen by the supervisor, which re-queues

    def finish_input(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _stdout(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if isinstance(message, dict):
                self.events.put((self, proc, message))

    def _stderr(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        with open(self.log_file, "a", encoding="utf-8", buffering=1) as out:
            quiet = logs.TF_LOG_LEVEL_ENV not in os.environ  # as training replicas
            for raw in iter(proc.stderr.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if quiet and logs.startup_noise(text):
                    continue  # TensorFlow's start-up lines its log level does not silence
                if logs.ERROR_LINE.search(text):
                    self.last_words = text  # the reason a worker gives when it fails
                line = logs.format_line(self.label, text, logs.severity(text, "stderr"))
                out.write(line + "\n")
                self.terminal.line(self.label, text, line)

    def stop(self, grace: float) -> None:
        if self.proc is not None:
            self.finish_input()
            procs.stop_process(self.proc, grace)
        for reader in self.readers:
            reader.join(timeout=5)

    def running_seconds(self) -> float:
        return time.monotonic() - self.started if self.proc is not None else 0.0


class PredictionJob(JobLife):
    """Runs a PredictionPlan to its end; `publish(record)` after each change."""

    def __init__(self, plan: PredictionPlan, record: jobs.JobRecord, *, publish,
                 terminal: logs.Terminal | None = None, grace: float = STOP_GRACE_S):
        super().__init__(cast(Any, plan), record, publish=publish, terminal=terminal)
        self.pplan = plan
        self.grace = grace
        self.events: queue.Queue = queue.Queue()
        self.workers: list[_Worker] = []
        self.node_seconds = 0.0
        self.sizes = [s.get("size", 0) for s in plan.shards]
        self.shard_bytes: dict[int, int] = {}
        self.shard_instances: dict[int, int] = {}
        self.counts = {"predictionCount": 0, "errorCount": 0}
        self.done: set[int] = set()
        self.started = time.monotonic()
        self.instances_before = 0       # published before this run (--resume)
        self.fraction_before = 0.0

    # --- the life ---------------------------------------------------------------------

    def _live(self) -> tuple[str, str | None]:
        from predict.batch_worker import published  # numpy: not for every command line
        plan = self.pplan
        self._prepare_folders(plan.run_dir, plan.log_dir)
        claim_output(plan.output_path, plan.job_id)
        total = len(plan.shards)
        pending = []
        for index in range(total):
            if published(plan.output_path, index, total):
                self._count_published(index)
            else:
                pending.append(index)
        if self.done:
            self._note(f"resuming: {len(self.done)} of {total} shards already published "
                       "are skipped")
        self.instances_before = sum(self.counts.values())
        self.fraction_before = sum(self.shard_bytes.values()) / (sum(self.sizes) or 1)
        most, why = machine_workers()
        count = max(1, min(plan.workers, most, len(pending) or 1))
        threads = max(1, procs.usable_cores() // count)  # the cores this job may use
        self._note(f"{total} shards, {len(pending)} to predict, with {count} workers "
                   f"(--max-worker-count {plan.workers}; this machine holds {most}: {why})")
        self.record.replicas = []
        self.workers = [_Worker(k, plan, self.events, self.terminal, threads)
                        for k in range(count)] if pending else []
        attempts = dict.fromkeys(pending, 0)
        for worker in self.workers:
            worker.start()
            self._note_worker(worker, "RUNNING")
        self._set(jobs.RUNNING)
        return self._supervise(pending, attempts)

    def _supervise(self, pending: list[int], attempts: dict) -> tuple[str, str | None]:
        queue_ = list(pending)
        next_progress = time.monotonic() + PROGRESS_EVERY_S
        for worker in self.workers:
            self._hand_out(worker, queue_, attempts)
        while True:
            if self._cancel.is_set():
                return jobs.CANCELLED, None
            self._drain_events(queue_, attempts)
            if len(self.done) == len(self.pplan.shards):
                self._let_workers_exit()
                return jobs.SUCCEEDED, None
            for worker in self.workers:
                proc = worker.proc
                if proc is None or proc.poll() is None:
                    continue
                self._drain_events(queue_, attempts)  # its last words may be queued
                if worker.proc is not proc:
                    continue
                status = local_exit_status(proc.returncode)
                self.node_seconds += worker.running_seconds()
                lost = worker.shard
                for reader in worker.readers:
                    reader.join(timeout=5)
                if lost is None:
                    if queue_:  # an idle worker gone while work remains: another
                        worker.start()
                        self._note_worker(worker, "RUNNING")
                        self._hand_out(worker, queue_, attempts)
                    else:
                        worker.proc = None
                        self._note_worker(worker, "EXITED", status)
                    continue
                attempts[lost] += 1
                said = f": {worker.last_words}" if worker.last_words else ""
                if status == EXIT_USAGE:  # the export or a file refused: no retry mends it
                    self._note_worker(worker, "EXITED", status)
                    return jobs.FAILED, (f"shard {lost} cannot be predicted; "
                                         f"{worker.label} exited with status "
                                         f"{status}{said}")
                if attempts[lost] >= MAX_SHARD_ATTEMPTS:
                    self._note_worker(worker, "EXITED", status)
                    return jobs.FAILED, (f"shard {lost} failed {attempts[lost]} times; "
                                         f"{worker.label} exited with status "
                                         f"{status}{said}")
                self._note(f"{worker.label} exited with status {status} on shard {lost}"
                           f"{said}; the shard goes back to the queue (try "
                           f"{attempts[lost] + 1} of {MAX_SHARD_ATTEMPTS})")
                queue_.insert(0, lost)
                worker.start()
                self._note_worker(worker, "RESTARTING", status)
                self._hand_out(worker, queue_, attempts)
            now = time.monotonic()
            if now >= next_progress:
                self._progress()
                next_progress = now + PROGRESS_EVERY_S
            time.sleep(POLL_S)

    def _let_workers_exit(self) -> None:
        """All shards are done: each worker's input ends, and it exits by itself."""
        for worker in self.workers:
            worker.finish_input()
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(
                w.proc is not None and w.proc.poll() is None for w in self.workers):
            time.sleep(POLL_S)
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is not None:
                self.node_seconds += worker.running_seconds()
                for reader in worker.readers:
                    reader.join(timeout=5)
                self._note_worker(worker, "EXITED", local_exit_status(worker.proc.returncode))
                worker.proc = None

    def _hand_out(self, worker: _Worker, queue_: list[int], attempts: dict) -> None:
        if queue_:
            worker.give(queue_.pop(0))
        else:
            worker.shard = None
            worker.finish_input()  # nothing more: it exits when its stdin ends

    def _drain_events(self, queue_: list[int], attempts: dict) -> None:
        while True:
            try:
                worker, proc, message = self.events.get_nowait()
            except queue.Empty:
                return
            if worker.proc is not proc:
                continue  # a message from a process since replaced
            if "done" in message and message["done"] == worker.shard:
                index = worker.shard
                self.done.add(index)
                self.counts["predictionCount"] += int(message.get("predicted", 0))
                self.counts["errorCount"] += int(message.get("failed", 0))
                self.shard_bytes[index] = self.sizes[index]
                self.shard_instances.pop(index, None)
                self._hand_out(worker, queue_, attempts)
            elif "progress" in message and message["progress"] == worker.shard:
                self.shard_bytes[worker.shard] = int(message.get("bytes", 0))
                self.shard_instances[worker.shard] = int(message.get("instances", 0))

    # --- what the job reports -------------------------------------------------------------

    def _count_published(self, index: int) -> None:
        from predict.batch_worker import shard_names
        results, errors = shard_names(index, len(self.pplan.shards))
        self.counts["predictionCount"] += count_lines(storage.join(self.pplan.output_path,
                                                                   results))
        self.counts["errorCount"] += count_lines(storage.join(self.pplan.output_path,
                                                              errors))
        self.done.add(index)
        self.shard_bytes[index] = self.sizes[index]

    def _progress(self, final: bool = False) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        instances = sum(self.counts.values()) + sum(self.shard_instances.values())
        fresh = instances - self.instances_before
        total_bytes = sum(self.sizes) or 1
        done_bytes = min(sum(self.shard_bytes.values()), total_bytes)
        fraction = 1.0 if final else done_bytes / total_bytes
        estimate = round(instances / fraction) if fraction > 0 else None
        rate = fresh / elapsed
        gained = fraction - self.fraction_before  # of the input, in this run
        left = (1 - fraction) * elapsed / gained if gained > 0 else None
        progress = {"instancesDone": instances,
                    "instancesTotal": instances if final else estimate,
                    "shardsDone": len(self.done), "shards": len(self.pplan.shards),
                    "bytesDone": done_bytes, "bytes": sum(self.sizes),
                    "instancesPerSecond": round(rate, 1),
                    "etaSeconds": 0 if final else (round(left) if left is not None else None)}
        self.record.prediction_output = {
            "outputPath": self.pplan.output_path, **{k: str(v) for k, v in self.counts.items()},
            "nodeHours": round(self._node_hours(), 6), "progress": progress}
        total = "" if estimate is None else f" of ~{progress['instancesTotal']}"
        eta = progress["etaSeconds"]
        self._note(f"progress: {instances}{total} instances ({100 * fraction:.1f}%), "
                   f"{self.counts['predictionCount']} predicted, "
                   f"{self.counts['errorCount']} errors, {rate:.0f} instances/s, "
                   f"shards {len(self.done)}/{len(self.pplan.shards)}"
                   + (f", ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta is not None
                      and not final else ""))
        self._save()

    def _node_hours(self) -> float:
        live = sum(w.running_seconds() for w in self.workers
                   if w.proc is not None and w.proc.poll() is None)
        return (self.node_seconds + live) / 3600

    def _note(self, text: str) -> None:
        self._event(text)  # a service line, as every supervisor event is

    def _note_worker(self, worker: _Worker, state: str, status: int | None = None) -> None:
        rec = self.record.replica(worker.label)
        rec.pid = worker.proc.pid if worker.proc else rec.pid
        if state in ("RUNNING", "RESTARTING") and worker.proc:
            rec.stamp = procs.stamp(worker.proc.pid)
        rec.state, rec.exit_code, rec.restarts = state, status, max(worker.restarts, 0)
        self._save()

    # --- stopping ---------------------------------------------------------------------------

    def _stop_everything(self) -> None:
        for worker in self.workers:
            if worker.proc is not None:
                running = worker.proc.poll() is None
                if running:
                    self.node_seconds += worker.running_seconds()
                worker.stop(self.grace)
                rec = self.record.replica(worker.label)
                if rec.state in ("RUNNING", "RESTARTING"):
                    rec.state = "STOPPED" if running else "EXITED"
                    rec.exit_code = local_exit_status(worker.proc.returncode)
                worker.proc = None

    def _wind_up(self) -> None:
        if self.record.prediction_output or self.done:
            self._progress(final=len(self.done) == len(self.pplan.shards))
        if storage.is_local(self.pplan.output_path):
            import glob
            import shutil
            folder = storage.local_path(self.pplan.output_path)
            for scratch in glob.glob(os.path.join(folder, f".prediction-tmp-"
                                                          f"{self.pplan.job_id}-*")):
                shutil.rmtree(scratch, ignore_errors=True)

    def _copy_out(self) -> None:
        """Nothing to copy: workers publish each shard as it ends."""


def run(plan: PredictionPlan, record: jobs.JobRecord, *, stream: bool) -> str:
    """Run a batch prediction job to its end in this process, its supervisor (the
    local wing's `supervise`: the job's lock held, the record adopted); the final state
    (also in `record`)."""
    from submit.local.entry import supervise
    return supervise(record, lambda terminal: PredictionJob(
        plan, record, publish=jobs.save, terminal=terminal).run(), stream=stream)


def local_exit_status(returncode: int | None) -> int:
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode
