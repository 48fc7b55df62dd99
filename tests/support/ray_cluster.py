"""A real Ray cluster for the tests: `ray start --head` (and workers) on this machine,
each node stopped by PID.

A node is `ray start --block` in a session of its own: every process it starts (GCS,
raylet, dashboard and its modules, agents, workers, actors) is in that session.
`ray stop` would look for Ray processes by name, machine-wide (other tests' clusters
too); `RayNode.stop` signals exactly the processes of its session, and their
descendants that left it (the replicas' trainers), by PID: SIGTERM, a grace period,
SIGKILL, and it reaps `ray start`. Every port is given (free ones), so
parallel runs never meet, and the node's temp dir is the test's.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import urllib.error
import urllib.request

import psutil

from mljob.procs import free_ports

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
START_TIMEOUT_S = 180.0


def skip_reason() -> str | None:
    try:
        import ray
        import ray.job_submission  # noqa: F401
    except ImportError as exc:
        return f"Ray is not installed ({exc}); pip install -e '.[ray]'"
    if not os.path.exists(RAY):
        return f"the `ray` command is not beside {sys.executable}"
    return None


class RayNode:
    """One Ray node (head or worker) started by `ray start --block`."""

    def __init__(self, proc: subprocess.Popen, address: str, dashboard: str | None,
                 log_path: str, link: str | None = None):
        self.proc, self.address, self.dashboard, self.log_path = proc, address, dashboard, \
            log_path
        self.link = link  # the short name of the temp dir (a symlink), removed at stop
        self._seen: dict[int, psutil.Process] = {}  # the node's processes found so far

    def pids(self) -> list[int]:
        """Every live process of the node, `ray start` first: those of its session and
        their descendants in sessions of their own (a replica's trainer, which its actor
        starts with start_new_session), remembered once seen, so that they are still
        found once their parents are gone."""
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getsid(p.pid) == self.proc.pid:
                    self._seen.setdefault(p.pid, p)
                    for child in p.children(recursive=True):
                        self._seen.setdefault(child.pid, child)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        found = []
        for pid, p in list(self._seen.items()):
            try:  # is_running() also checks the start time: a reused PID is not ours
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)   # (a zombie is dead, unreaped)
                    continue
            except psutil.Error:
                pass
            del self._seen[pid]
        return sorted(found, key=lambda pid: pid != self.proc.pid)

    def _send(self, sig: int) -> None:
        for pid in self.pids():
            try:
                self._seen[pid].send_signal(sig)
            except (KeyError, psutil.Error):
                pass

    def kill(self) -> None:
        """The node dies at once, as a machine that loses power: SIGKILL to each PID
        (Ray's processes and the replicas' processes they started)."""
        self._send(signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 10  # SIGKILL is sent, not yet done
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        self._send(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        self._send(signal.SIGKILL)
        deadline = time.monotonic() + 10  # SIGKILL is sent, not yet done
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if self.link and os.path.islink(self.link):
            os.unlink(self.link)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]


def start_node(temp_dir: str, *, attempts: int = 3, **kwargs) -> RayNode:
    """`_start_node`, tried again when Ray gives up on its own start-up (its raylet waits
    a fixed 15 s for its agents and `ray start` 30 s for the raylet: a loaded machine
    can miss both)."""
    for attempt in range(attempts):
        try:
            return _start_node(os.path.join(temp_dir, str(attempt)) if attempt else temp_dir,
                               **kwargs)
        except _SlowStart:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class _SlowStart(RuntimeError):
    pass


def _start_node(temp_dir: str, *, ip: str = "127.0.0.1", head_address: str | None = None,
                num_cpus: int = 2, wrap=None, env: dict | None = None,
                port: int | None = None) -> RayNode:
    """Start a head (head_address None) or a worker joining head_address, on `ip`.
    `wrap` turns the command into the one to run (a network namespace's `ip netns
    exec`); ports are free ones on this machine (each namespace has its own ports, so
    they are free there too)."""
    os.makedirs(temp_dir, exist_ok=True)
    # Ray's sockets live under the temp dir and AF_UNIX paths end at 107 bytes: a test's
    # tmp folder is reached through a short symlink in the system's temp folder.
    link = os.path.join(tempfile.gettempdir(), f"mljob-ray-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    os.symlink(temp_dir, link)
    ports = free_ports(9)
    args = [RAY, "start", "--block", "--disable-usage-stats", f"--node-ip-address={ip}",
            f"--num-cpus={num_cpus}", "--num-gpus=0",
            f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
            f"--metrics-export-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
            f"--dashboard-agent-listen-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}"]  # workers: Ray's 10002-19999
    # every node its own temp dir, as on separate machines (nodes sharing one would
    # build the same runtime_env folders at once)
    args.append(f"--temp-dir={link}")
    dashboard = None
    if head_address is None:
        gcs = port or ports[7]
        dashboard = f"http://{ip}:{ports[8]}"
        args += ["--head", f"--port={gcs}",
                 f"--dashboard-host={ip}", f"--dashboard-port={ports[8]}",
                 "--include-dashboard=true", f"--ray-client-server-port={free_ports(1)[0]}"]
        address = f"{ip}:{gcs}"
    else:
        args += [f"--address={head_address}"]
        address = head_address
    log_path = os.path.join(temp_dir, f"ray-start-{ip}-{ports[0]}.log")
    # Ray 2.60 turns token authentication on for a cluster when a token exists on the
    # machine (~/.ray/auth_token, left by any local `ray.init()`): the test clusters are
    # reached only from this machine and their own namespaces, so they say which mode.
    child_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                 **(env or {})}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(wrap(args) if wrap else args, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=child_env)
    node = RayNode(proc, address, dashboard, log_path, link)
    try:
        _wait_ready(node, dashboard, wrap)
    except BaseException:
        node.stop(grace=2)
        raise
    return node


def _wait_ready(node: RayNode, dashboard: str | None, wrap=None) -> None:
    """`ray start` said the runtime started and, on a head, the dashboard answers (asked
    from the node's own network: a namespace's address is not reachable from outside)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            slow = ("timed out during startup", "Failed to get node info")
            kind = _SlowStart if any(s in node.log() for s in slow) else RuntimeError
            raise kind(f"ray start exited {node.proc.returncode}:\n{node.log()}")
        if "Ray runtime started" in node.log() and (
                dashboard is None or _answers(f"{dashboard}/api/version", wrap)):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Ray node did not start in {START_TIMEOUT_S:.0f}s:\n{node.log()}")


def _answers(url: str, wrap=None) -> bool:
    """The URL answers (an HTTP error is an answer too: a dashboard that asks for its
    token is up)."""
    if wrap is None:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
    probe = ("import sys, urllib.request, urllib.error\ntry:\n"
             "    urllib.request.urlopen(sys.argv[1], timeout=2)\n"
             "except urllib.error.HTTPError:\n    pass")
    done = subprocess.run(wrap([sys.executable, "-c", probe, url]), capture_output=True,
                          timeout=30)
    return done.returncode == 0


@contextlib.contextmanager
def head(temp_dir: str, *, num_cpus: int = 3):
    """A head node for a module's (or session's) tests, stopped by PID at the end and
    checked gone; tests reach it at `.dashboard`."""
    node = start_node(temp_dir, num_cpus=num_cpus)
    try:
        yield node
    finally:
        node.stop()
        assert node.pids() == []


def job_processes(job_id: str) -> list[int]:
    """Replica processes of a job still alive on this machine (CLOUD_ML_JOB_ID)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("CLOUD_ML_JOB_ID") == job_id and p.pid != os.getpid():
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def alive_nodes(dashboard: str) -> list[dict]:
    import json
    with urllib.request.urlopen(f"{dashboard}/nodes?view=summary", timeout=10) as reply:
        summary = json.load(reply)["data"]["summary"]
    return [n for n in summary if (n.get("raylet") or {}).get("state") == "ALIVE"]
