"""The order a local job's replicas are stopped in, with real processes and no TensorFlow:
a cancelled job stops its chief first, while the ps still answers, so the chief can save;
then the workers and the evaluator; the ps last (contracts.STOP_ORDER). Every route that
stops a job (`jobs cancel`, the console's Cancel, maxRunningTime, an early-stopped trial,
a failure) goes through the one `Supervisor._stop` these tests drive."""
from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from mljob import contracts
from submit import jobs
from submit.local.plan import JobPlan, ReplicaPlan
from submit.local.supervisor import CHIEF_EXIT_S, Supervisor, chief_deadline
from tests.support.common import pid_alive

# A replica that notes each event with the time; on SIGTERM the chief "saves", which
# needs the ps (it connects to the ps's port, as a chief reads variables from a ps),
# then exits 143 as the trainer does. Workers, the evaluator and the ps exit at once.
REPLICA = r'''
import os, signal, socket, sys, time
role, notes, ps_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def note(text):
    with open(notes, "a") as f:
        f.write(f"{time.time():.4f} {role} {text}\n")
def stop(*_):
    note("SIGTERM")
    if role == "chief":
        time.sleep(0.3)  # the save takes a while
        try:
            socket.create_connection(("127.0.0.1", ps_port), timeout=2).close()
            note("saved")
        except OSError:
            note("ps stopped answering")
            os._exit(200)
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
if role == "ps":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", ps_port))
    server.listen(8)
note("ready")
while True:
    time.sleep(0.05)
'''


def _plan(tmp_path, notes: str, env: dict | None = None,
          max_running_time: float | None = None) -> JobPlan:
    from mljob.procs import free_ports
    port = free_ports(1)[0]
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    replicas = tuple(ReplicaPlan(
        label=contracts.replica_label(role, 0), task_type=role, index=0, address=None,
        command=(sys.executable, str(script), role, notes, str(port)), env=env or {},
        tf_config={}, log_file=str(tmp_path / "logs" / f"{role}.log"))
        for role in ("ps", "worker", "chief", "evaluator"))   # the start order
    return JobPlan(job_id="order", mode="local", scale_tier="CUSTOM", job_dir=None,
                   replica_job_dir=None, run_dir=str(tmp_path / "run"),
                   log_dir=str(tmp_path / "logs"), mirrors=(), package_url=None,
                   package_sha256=None, package_top_dir=None, python_path="",
                   cwd=str(tmp_path), module="replica", trainer_args=(), cluster={},
                   training_input={}, replicas=replicas, max_running_time=max_running_time)


def _events(notes: str) -> list[tuple[float, str, str]]:
    with open(notes) as f:
        return [(float(t), role, text) for t, role, text in
                (line.rstrip("\n").split(" ", 2) for line in f)]


def _cancel_when_ready(supervisor: Supervisor, notes: str) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(notes) and \
                    sum(text == "ready" for _, _, text in _events(notes)) == 4:
                supervisor.cancel()  # what SIGTERM to the supervisor (`jobs cancel`) does
                return
            time.sleep(0.05)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("route", ["cancel", "maxRunningTime"])
def test_a_stopped_job_stops_the_chief_first_then_workers_then_the_ps(tmp_path, route):
    """`jobs cancel` (SIGTERM to the supervisor: its cancel flag, as the console's Cancel
    and an early-stopped trial set it) and scheduling.maxRunningTime."""
    notes = str(tmp_path / "notes")
    plan = _plan(tmp_path, notes, max_running_time=4.0 if route != "cancel" else None)
    record = jobs.JobRecord("order")
    supervisor = Supervisor(plan, record, publish=lambda r: None)
    if route == "cancel":
        watcher = _cancel_when_ready(supervisor, notes)
        assert supervisor.run() == jobs.CANCELLED
        watcher.join(5)
    else:
        assert supervisor.run() == jobs.FAILED
        assert "maximum running time of 4s" in (record.error_message or "")
    events = _events(notes)
    at = {(role, text): t for t, role, text in events}
    # the chief saved with the ps still answering, and exited 143 (preempted, resumable)
    assert ("chief", "saved") in at, events
    exits = {r.label: r.exit_codes for r in record.replicas}
    assert exits["master-replica-0"] == [143], exits
    # then the workers and the evaluator, then the ps: each stage after the one before
    assert at[("chief", "SIGTERM")] < at[("chief", "saved")] < at[("worker", "SIGTERM")]
    assert at[("chief", "saved")] < at[("evaluator", "SIGTERM")]
    assert max(at[("worker", "SIGTERM")], at[("evaluator", "SIGTERM")]) < at[("ps", "SIGTERM")]
    assert {r.state for r in record.replicas} == {"STOPPED"}
    assert [r.pid for r in record.replicas if pid_alive(r.pid)] == []


def test_a_chief_whose_peers_are_gone_gets_only_the_grace_period(tmp_path):
    """A failed job (here: the ps killed before the stop) does not wait the chief's whole
    stop deadline: without its peers it cannot save, so it gets the plain grace."""
    notes = str(tmp_path / "notes")
    plan = _plan(tmp_path, notes, env={contracts.STOP_DEADLINE_ENV: "30"})
    record = jobs.JobRecord("order")
    supervisor = Supervisor(plan, record, publish=lambda r: None, grace=1.0)
    for replica in supervisor.replicas:
        supervisor._start(replica)
    try:
        deadline = time.monotonic() + 60
        while not (os.path.exists(notes) and len(_events(notes)) == 4):
            assert time.monotonic() < deadline, "the replicas never became ready"
            time.sleep(0.05)
        chief = next(r for r in supervisor.replicas if r.plan.is_chief)
        os.kill(chief.proc.pid, 19)  # SIGSTOP: a chief stuck in a step that never ends
        ps = next(r for r in supervisor.replicas if r.plan.task_type == "ps")
        ps.signal_group(9)
        ps.proc.wait(10)
        started = time.monotonic()
        supervisor._stop(supervisor.replicas)
        assert time.monotonic() - started < 15   # the grace, not 35 s
    finally:
        supervisor._stop_everything()
    assert [r.pid for r in record.replicas if pid_alive(r.pid)] == []


def test_the_ray_driver_stops_in_the_same_order():
    """The driver on a Ray cluster (standard library only, so its own copy of the order):
    each stage's actors are asked to stop, and waited for, before the next stage's; the
    chief with its stop deadline, unless a replica failed for good."""
    from submit.runners import ray_driver
    assert ray_driver.STOP_ORDER == contracts.STOP_ORDER
    assert (ray_driver.STOP_DEADLINE_ENV, ray_driver.STOP_DEADLINE_SECONDS) == (
        contracts.STOP_DEADLINE_ENV, contracts.STOP_DEADLINE_SECONDS)
    calls: list[tuple[str, str, float]] = []

    class Ref:
        def __init__(self, label):
            self.label = label

    class Stop:
        def __init__(self, label):
            self.label = label

        def remote(self, grace):
            calls.append(("stop", self.label, grace))
            return Ref(self.label)

    class Actor:
        def __init__(self, label):
            self.stop = Stop(label)

    class Ray:
        @staticmethod
        def get(ref, timeout):
            calls.append(("waited", ref.label, timeout))
            return 143

    roles = ["chief", "worker", "worker", "ps", "evaluator"]
    driver = object.__new__(ray_driver.Driver)
    driver.ray, driver.job = Ray, {"env": {contracts.STOP_DEADLINE_ENV: "30"}}
    driver.replicas = [{"label": f"{role}-{i}", "task_type": role}
                       for i, role in enumerate(roles)]
    driver.actors = [Actor(r["label"]) for r in driver.replicas]
    driver.ended, driver.peer_lost = set(), False
    driver.note = lambda *args: None
    driver.stop(range(len(roles)))
    assert [(what, label) for what, label, _ in calls] == [
        ("stop", "chief-0"), ("waited", "chief-0"),
        ("stop", "worker-1"), ("stop", "worker-2"), ("stop", "evaluator-4"),
        ("waited", "worker-1"), ("waited", "worker-2"), ("waited", "evaluator-4"),
        ("stop", "ps-3"), ("waited", "ps-3")]
    assert calls[0][2] == 30 + ray_driver.STOP_GRACE_S   # the chief's stop deadline
    assert {grace for what, _, grace in calls[2:] if what == "stop"} == {
        ray_driver.STOP_GRACE_S}
    calls.clear()
    driver.ended, driver.peer_lost = set(), True          # a failed job: no save to wait for
    driver.stop([0])
    assert calls[0] == ("stop", "chief-0", ray_driver.STOP_GRACE_S)


@pytest.mark.parametrize("text,seconds", [
    ("30", 30.0), ("0.5", 0.5), ("", 60.0), ("soon", 60.0), ("0", 60.0), ("-5", 60.0),
    ("nan", 60.0), ("inf", 60.0), ("1e400", 60.0), ("\u00b2", 60.0)])
def test_the_chiefs_deadline_is_read_as_the_chief_reads_it(text, seconds):
    """How long the supervisor waits for a stopping chief follows the chief's own stop
    deadline (MLJOB_STOP_DEADLINE), bad values falling back to the same 60 s; never
    unbounded (`inf` once left the chief's watchdog without a deadline at all)."""
    from mljob.training.signals import StopSignal
    env = {contracts.STOP_DEADLINE_ENV: text}
    chief = SimpleNamespace(plan=SimpleNamespace(is_chief=True, env=env), running=True)
    assert chief_deadline([chief]) == seconds + CHIEF_EXIT_S
    assert StopSignal(environ=env)._deadline == seconds
    assert chief_deadline([SimpleNamespace(plan=SimpleNamespace(is_chief=False, env=env),
                                           running=True)]) == 0
