"""The local supervisor: one process per replica on 127.0.0.1, supervised until the job
ends. An attached job (the default, streaming) is supervised in the submitting process,
a detached one (`--async`) by a `python -m submit _supervise` process of its own, whose
PID the record keeps (`submit.local.entry` starts either; `submit.runners.local` is the
runner's verbs above it).

A supervisor loop polls the replica processes. The job succeeds when the chief exits 0
and fails when the chief (or, with no restart left, any replica) fails; either way every
other replica is then stopped by PID: SIGTERM to its process group, a grace period, then
SIGKILL. SIGINT or SIGTERM to the supervising process cancels the job (CANCELLING, then
CANCELLED). Replicas cannot outlive the supervisor even when it is SIGKILLed: each runs
in its own session with PR_SET_PDEATHSIG=SIGTERM, and has MLJOB_PARENT_PID to watch.

Deadlines (trainingInput.scheduling): a job still running `maxRunningTime` after it
started RUNNING fails, every replica stopped; one that took longer than `maxWaitTime`
from submission to RUNNING (building its package environment) fails before any replica
starts. The wait is judged when preparation ends: a pip install is not interrupted.

Restart policies, per replica type (as Kubeflow's TFJob names them): Never; OnFailure
(any non-zero exit); ExitCode (exit statuses 128-255, the trainer's retryable ones: 143
preempted, 200 peer unavailable, and deaths by signal; 1-127 are permanent); Always (as
OnFailure). A replica that exits 0 finished its work and is never restarted, under any
policy and strategy, as Cloud ML did (a ps server stopped from outside exits 143). Each
replica may restart its type's `max_restarts` times (6 when a policy is given without a
maximum), after a back-off of 1, 2, 4 ... 30 seconds.

The record keeps each replica's restarts and the exit status of every run (`exit_codes`,
137 for a SIGKILL); every supervisor event (a replica started, exited, restarting, the
job's state) is a `service` line in `<log dir>/service.log`, which `jobs stream-logs`
follows with the replicas' logs.
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from mljob import contracts, procs
from submit import jobs, logs
from submit.local import containers, usage
from submit.local.joblife import JobLife
from submit.local.plan import JobPlan, ReplicaPlan
from submit.local.prestart import Pool
from submit.packaging.package import Package, ensure_environment

log = logging.getLogger(__name__)
STOP_GRACE_S = 5.0         # SIGTERM to SIGKILL (the chief: its stop deadline, below)
CONTAINER_TEARDOWN_S = 30.0  # for a container that stopped in time, its engine's `run`
CHIEF_EXIT_S = 5.0         # beyond the chief's own stop deadline, for it to exit
EVALUATOR_DRAIN_S = 60.0   # evaluators may finish their last evaluation after the chief
MIRROR_EVERY_S = 5.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
# Set by cluster engines where `submit` itself may run (a Vertex AI notebook or job):
# inherited, they would redirect a local job's outputs or cluster, so replicas never get them.
ENGINE_VARIABLES = contracts.ENGINE_VARIABLES

try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def exit_status(returncode: int) -> int:
    """Popen's -N (killed by signal N) as a shell reports it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def should_restart(policy: str, status: int) -> bool:
    """Whether a replica that ended with `status` runs again: never after 0 (it finished)."""
    if status == 0 or policy == "Never":
        return False
    if policy == "ExitCode":
        return 128 <= status <= 255
    return policy in ("OnFailure", "Always")


class Replica:
    """A replica's current process, its log file and its restart bookkeeping."""

    def __init__(self, plan: ReplicaPlan, terminal: logs.Terminal):
        self.plan = plan
        self.terminal = terminal
        self.proc: subprocess.Popen | None = None
        self.readers: list[threading.Thread] = []
        self.restarts = 0
        self.restart_at: float | None = None
        self.quiet = False             # TensorFlow's start-up lines dropped
        self.prestarted = False        # its process was a ready one (submit.local.prestart)
        self.finished = False          # exited and not to be restarted
        self.reaped = False            # stopped and waited for: never signal its PID again
        self._sampled_pid: int | None = None  # a container's PID on this machine
        self._file_lock = threading.Lock()
        self._file: TextIO | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, cwd: str, parent_pid: int, pool: Pool | None = None) -> None:
        """Start the replica's process, or hand the replica to a ready one of `pool`."""
        os.makedirs(os.path.dirname(self.plan.log_file), exist_ok=True)
        if self._file is None:
            self._file = open(self.plan.log_file, "a", encoding="utf-8", buffering=1)
        env, self.quiet = replica_env(self.plan.env, parent_pid)
        command = containers.command(self.plan)
        self.proc = pool.take(command, cwd, env) if pool is not None else None
        self.prestarted = self.proc is not None
        if self.proc is None:
            self.proc = spawn(command, cwd, env, subprocess.DEVNULL)
        self.restart_at = None
        self.reaped = False
        self._sampled_pid = None
        self.readers = [threading.Thread(target=self._read, args=(pipe, name), daemon=True)
                        for pipe, name in ((self.proc.stdout, "stdout"),
                                           (self.proc.stderr, "stderr"))]
        for reader in self.readers:
            reader.start()

    def _read(self, pipe, stream: str) -> None:
        label = self.plan.label

        def emit(text: str, like: str) -> None:
            line = logs.format_line(label, text, logs.severity(like, stream))
            with self._file_lock:
                if self._file is not None:
                    self._file.write(line + "\n")
            self.terminal.line(label, text, line)

        repeats = logs.Repeats(emit)  # TensorFlow's storms are on stderr
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if self.quiet and logs.startup_noise(text):
                continue
            if stream == "stderr":
                repeats.feed(text)
            else:
                emit(text, text)
        repeats.flush()
        pipe.close()

    def usage_pid(self) -> int | None:
        """The process its resource figures are read from: its own, or its container's
        (the engine's `run` is a client; the container's processes are not its children)."""
        if self.proc is None or not self.plan.container:
            return self.proc.pid if self.proc else None
        if self._sampled_pid is None:
            self._sampled_pid = containers.host_pid(self.plan)
        return self._sampled_pid

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the replica and anything it started
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL:
            containers.kill(self.plan)  # its container too (the engine's run is gone)

    def close(self) -> None:
        for reader in self.readers:
            reader.join(timeout=5)
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def replica_env(plan_env: Mapping[str, str], parent_pid: int) -> tuple[dict[str, str], bool]:
    """A replica's environment: this process's (without a cluster engine's variables),
    the plan's, TensorFlow quietened unless the user chose its level, and the PID of
    the supervisor it dies with; and whether it was quietened (its start-up lines
    are dropped from the log)."""
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_VARIABLES}
    env.update(plan_env)
    quiet = logs.quiet_env(env)
    env.update(quiet)
    env[contracts.PARENT_PID_ENV] = str(parent_pid)
    return env, bool(quiet)


def spawn(command, cwd: str, env: Mapping[str, str], stdin) -> subprocess.Popen:
    """A replica's process (or one pre-started for it, `submit.local.prestart`): its own
    session, its output on pipes, dying with this process (the one that started it)."""
    return subprocess.Popen(
        list(command), cwd=cwd, env=dict(env), stdin=stdin, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=die_with_parent(int(env[contracts.PARENT_PID_ENV])))


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def stop_stages(replicas: list[Replica]) -> list[list[Replica]]:
    """The replicas in the order they are stopped (contracts.STOP_ORDER), stage by stage."""
    stages = [[r for r in replicas if r.plan.task_type in types]
              for types in contracts.STOP_ORDER]
    ordered = {id(r) for stage in stages for r in stage}
    stages.append([r for r in replicas if id(r) not in ordered])  # none today: never left
    return [stage for stage in stages if stage]


def chief_deadline(stage: list[Replica]) -> float:
    """How long a stage holding a running chief may take: the chief's own stop deadline
    (MLJOB_STOP_DEADLINE, after which it exits by itself) and a little for its exit; 0
    for any other stage."""
    chief = next((r for r in stage if r.plan.is_chief and r.running), None)
    if chief is None:
        return 0.0
    text = {**os.environ, **chief.plan.env}.get(contracts.STOP_DEADLINE_ENV, "")
    try:  # as the chief reads it: a value that is not a positive number is the default
        seconds = float(text) if text else 0.0
    except ValueError:
        seconds = 0.0
    ok = math.isfinite(seconds) and seconds > 0
    return (seconds if ok else contracts.STOP_DEADLINE_SECONDS) + CHIEF_EXIT_S


class Supervisor(JobLife):
    """Runs a JobPlan to its end; `publish(record)` is called after each change."""

    def __init__(self, plan: JobPlan, record: jobs.JobRecord, *,
                 publish: Callable[[jobs.JobRecord], None],
                 terminal: logs.Terminal | None = None, grace: float = STOP_GRACE_S,
                 pool: Pool | None = None):
        super().__init__(plan, record, publish=publish, terminal=terminal)
        self.grace = grace
        self.pool = pool  # ready processes reserved for this trial (submit.local.prestart)
        self.replicas = [Replica(r, self.terminal) for r in plan.replicas]
        self.usage = usage.Sampler(os.path.join(plan.run_dir, usage.FILE), lambda: {
            r.plan.label: pid for r in self.replicas
            if r.proc and r.running and (pid := r.usage_pid()) is not None})

    def _live(self) -> tuple[str, str | None]:
        self._prepare()
        if self._cancel.is_set():
            return jobs.CANCELLED, None
        waited = time.time() - self.record.create_time
        if self.plan.max_wait_time is not None and waited > self.plan.max_wait_time:
            return jobs.FAILED, (
                f"The job did not start running within its maximum wait time of "
                f"{self.plan.max_wait_time:g}s (trainingInput.scheduling.maxWaitTime); "
                f"it waited {waited:.0f}s.")
        for replica in self.replicas:
            self._start(replica)
        if self.pool is not None:
            self.pool.close()  # what this trial did not take (restarts start afresh)
        self._set(jobs.RUNNING)
        self.usage.start()
        return self._supervise()

    def _prepare(self) -> None:
        self._prepare_folders(self.plan.run_dir, self.plan.log_dir, self.plan.cwd)
        if self.plan.containers is not None:
            self._event(containers.prepare(self.plan))
        if self.plan.mode == "cloud":
            # Before any replica starts: a package that cannot be installed fails the job.
            key = self.plan.env_key
            assert key is not None  # a cloud-mode plan names its package environment
            self._event(f"package environment {key[:12]}: installing "
                        f"{', '.join(p['file_name'] for p in self.plan.packages)}")
            started = time.monotonic()
            _, created = ensure_environment(
                [Package(p["file_name"], p["sha256"], "", url=p["url"])
                 for p in self.plan.packages], key, root=self.plan.env_root,
                cancelled=self._cancel.is_set)
            what = "created" if created else "reused"
            self._event(f"package environment {key[:12]} {what} in "
                        f"{time.monotonic() - started:.1f} s")

    def _supervise(self) -> tuple[str, str | None]:
        chief = next(r for r in self.replicas if r.plan.is_chief)
        next_mirror = time.monotonic() + MIRROR_EVERY_S
        limit = self.plan.max_running_time
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            if self._cancel.is_set():
                return jobs.CANCELLED, None
            if deadline is not None and time.monotonic() >= deadline:
                return jobs.FAILED, (f"The job exceeded its maximum running time of "
                                     f"{limit:g}s (trainingInput.scheduling.maxRunningTime) "
                                     "and was stopped.")
            for replica in self.replicas:
                if replica.finished or replica.restart_at is not None or replica.running:
                    continue
                assert replica.proc is not None  # every replica started before supervision
                status = exit_status(replica.proc.returncode)
                self.record.replica(replica.plan.label).exit_codes.append(status)
                self._note_replica(replica, "EXITED", status)
                if replica is chief and status == 0:
                    self._event(f"{replica.plan.label} exited with status 0")
                    self._drain_evaluators()
                    return jobs.SUCCEEDED, None
                if (replica.restarts < replica.plan.max_restarts and should_restart(
                        replica.plan.restart_policy, status)):
                    delay = min(2.0 ** replica.restarts, 30.0)
                    replica.restart_at = time.monotonic() + delay
                    self._event(f"{replica.plan.label} exited with status {status}; "
                                f"restarting in {delay:.0f} s (restart "
                                f"{replica.restarts + 1} of {replica.plan.max_restarts}, "
                                f"policy {replica.plan.restart_policy})")
                    self._note_replica(replica, "RESTARTING", status)
                    continue
                self._event(f"{replica.plan.label} exited with status {status}")
                replica.finished = True
                if status != 0:
                    return jobs.FAILED, (f"The replica {replica.plan.label} exited with a "
                                         f"non-zero status of {status}.")
            now = time.monotonic()
            for replica in self.replicas:
                if replica.restart_at is not None and now >= replica.restart_at:
                    replica.restarts += 1
                    self._start(replica)
            if now >= next_mirror:
                self._mirror(final=False)
                next_mirror = now + MIRROR_EVERY_S
            time.sleep(POLL_S)

    def _drain_evaluators(self) -> None:
        """The chief is done: stop ps and workers now, let evaluators finish briefly."""
        self._stop([r for r in self.replicas if r.plan.task_type != "evaluator"])
        evaluators = [r for r in self.replicas if r.plan.task_type == "evaluator"]
        deadline = time.monotonic() + EVALUATOR_DRAIN_S
        while any(r.running for r in evaluators) and time.monotonic() < deadline \
                and not self._cancel.is_set():
            time.sleep(POLL_S)

    def _stop(self, replicas: list[Replica]) -> None:
        """Stop in contracts.STOP_ORDER, one stage after the other: SIGTERM the stage's
        groups, wait (the chief its stop deadline while its peers serve, the others the
        grace period), SIGKILL the stage's groups and reap; then the next stage."""
        live = [r for r in replicas if r.proc is not None and not r.reaped]
        stopped = [r for r in live if r.running]  # the others ended by themselves
        for stage in stop_stages(live):
            running = [r for r in stage if r.running]
            if running:  # a service line per stage: the order shows in stream-logs
                self._event(f"stopping {', '.join(r.plan.label for r in running)} (SIGTERM)")
            for r in running:
                r.signal_group(signal.SIGTERM)
            started = time.monotonic()
            chief_wait = max(self.grace, chief_deadline(stage))
            while any(r.running for r in stage):
                waited = time.monotonic() - started
                if waited >= chief_wait or (waited >= self.grace and not self._peers_up()):
                    if waited < chief_wait + CONTAINER_TEARDOWN_S and all(
                            containers.stopped(r.plan) for r in stage if r.running):
                        time.sleep(0.2)  # stopped in time: its engine's `run` is ending
                        continue
                    break
                time.sleep(0.05)
            for r in stage:
                self._kill_and_reap(r, stopped)
                if r in running and r.proc is not None:
                    self._event(f"{r.plan.label} stopped with status "
                                f"{exit_status(r.proc.returncode)}")

    def _peers_up(self) -> bool:
        """Whether every ps and worker still runs: a chief can save only with them."""
        return all(r.running for r in self.replicas
                   if r.plan.task_type in (contracts.PS, contracts.WORKER))

    def _kill_and_reap(self, r: Replica, stopped: list[Replica]) -> None:
        proc = r.proc
        assert proc is not None  # live replicas have a process
        r.signal_group(signal.SIGKILL)
        try:
            proc.wait(timeout=10)
            r.reaped = True
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) did not die after SIGKILL", r.plan.label, proc.pid)
        r.restart_at = None
        rec = self.record.replica(r.plan.label)
        if rec.state == "RUNNING":  # a RESTARTING one's last run is counted already
            rec.exit_codes.append(exit_status(proc.returncode))
        if rec.state in ("RUNNING", "RESTARTING"):
            rec.state = "STOPPED" if r in stopped else "EXITED"
            rec.exit_code = exit_status(proc.returncode)

    def _stop_everything(self) -> None:
        if self.pool is not None:
            self.pool.close()
        self.record.usage = self.usage.stop() or self.record.usage
        self._stop(self.replicas)
        containers.clean_up(self.plan)  # no container or network outlives the job
        for replica in self.replicas:
            replica.close()  # all output is in the log files before the last copy

    def _start(self, replica: Replica) -> None:
        replica.start(self.plan.cwd, os.getpid(), self.pool)
        assert replica.proc is not None  # start made it
        again = f", restart {replica.restarts}" if replica.restarts else ""
        ready = ", pre-started" if replica.prestarted else ""
        self._event(f"{replica.plan.label} started (pid {replica.proc.pid}{again}{ready})")
        self._note_replica(replica, "RUNNING")

    def _note_replica(self, replica: Replica, state: str, status: int | None = None) -> None:
        rec = self.record.replica(replica.plan.label)
        rec.pid = replica.proc.pid if replica.proc else None
        if state == "RUNNING" and replica.proc:
            rec.stamp = procs.stamp(replica.proc.pid)
        rec.state, rec.exit_code, rec.restarts = state, status, replica.restarts
        self._save()
