"""The Ray job's entrypoint: runs one mljob job inside a Ray cluster.

`--runner ray` ships this file, the job's description (`job.json`) and the staged
archives as the Ray job's working_dir; the runtime_env pip-installs the archives into
the job's environment on every node, and this driver runs there as
`python ray_driver.py job.json`. It imports only the standard library and Ray (it is not
inside any installed package), so the module can also be imported by the runner for its
pure parts (`fit`, `log_line`; `submit.runners.ray` reads the lines it prints).

What it does (docs/engine-ray.md tells it in full): one placement group for the job, one
bundle per replica (`fit`: the machine type's CPU, memory and GPUs, capped at the largest
node's; STRICT_SPREAD for a ps job when there is a node per replica, else PACK; a job that
can never fit fails at once in one line); one actor per replica in its bundle, reporting
its node's address and a free port, from which TF_CONFIG is built; each actor runs its
replica as a process and this driver prints every line in the local runner's log format
(`SEVERITY<TAB>time<TAB>label<TAB>text`). The chief exiting 0 ends the job SUCCEEDED; a
replica that exits non-zero (or whose actor dies with its node: status 137) is restarted
by its type's restart policy in the same bundle (every replica restarts with the new
TF_CONFIG if its address changed). SIGTERM (`ray job stop`) stops every replica in
STOP_ORDER (the chief first, saving while the ps serve). In a tuning trial
(`hp_metric_file` in job.json) every new cloudml-hypertune report line is relayed as
`hypertune LABEL {json}`, so the tuner reads a trial's metric from the Ray job's log.
Replica processes die with their actor (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

LAUNCHER = "mljob.fitting.launch"  # mljob.fitting.LAUNCHER (this file imports no mljob)
SERVICE = "service"
EVENT = "replica "          # `replica LABEL state=... restarts=N exit=S node=IP`
RESULT = "job "             # `job SUCCEEDED` / `job FAILED: why`
METRIC = "hypertune "       # `hypertune LABEL {"global_step": ..., "<tag>": ...}`
HP_METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"  # mljob.contracts' (this file imports none)
STOP_GRACE_S = 5.0
# mljob.contracts' (this file imports none; tests/submit/test_runner_ray.py compares them)
STOP_ORDER = (("chief", "master"), ("worker", "evaluator"), ("ps",))
STOP_DEADLINE_ENV, STOP_DEADLINE_SECONDS = "MLJOB_STOP_DEADLINE", 60.0
POLL_S = 0.5
PLACEMENT_WAIT_S = 120.0    # a placement group that fits the cluster but waits for room
LOST_STATUS = 137           # a replica whose actor died with its node, as a SIGKILL
GIB = 1024 ** 3
PR_SET_PDEATHSIG = 1


def log_line(label: str, text: str, severity: str = "INFO") -> str:
    """submit.logs.format_line's format (this file imports nothing of mljob's)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime())
    return f"{severity}\t{stamp}\t{label}\t{text}"


def fit(bundles: list[dict], nodes: list[dict], spread: bool) -> tuple[list[dict], str]:
    """The bundles as the cluster can take them, and the strategy; ValueError (one line)
    when it never can. `nodes`: the alive nodes' resources ({"CPU": 2.0, "memory": ...}).
    CPU and memory asks are capped at the largest node's (each replica then takes a whole
    node); GPUs never are. STRICT_SPREAD when asked and there is a node per replica."""
    if not nodes:
        raise ValueError("the Ray cluster has no alive node")
    most = {key: max(n.get(key, 0.0) for n in nodes) for key in ("CPU", "memory")}
    capped = []
    for bundle in bundles:
        b = dict(bundle)
        for key in ("CPU", "memory"):
            if key in b and most[key] > 0:
                b[key] = min(b[key], most[key])
        capped.append(b)
    strategies = (["STRICT_SPREAD"] if spread and len(capped) > 1 and
                  len(nodes) >= len(capped) else []) + ["PACK"]
    for strategy in strategies:
        missing = _place(capped, nodes, strategy == "STRICT_SPREAD")
        if missing is None:
            return capped, strategy
    assert missing is not None
    need = ", ".join(f"{_amount(k, v)} {k}" for k, v in capped[missing].items() if v)
    have = "; ".join(", ".join(f"{_amount(k, n.get(k, 0.0))} {k}" for k in
                               ("CPU", "GPU", "memory") if k in capped[missing])
                     for n in nodes)
    raise ValueError(f"the Ray cluster cannot place the job's {len(capped)} replicas "
                     f"(replica {missing + 1} needs {need}; its {len(nodes)} node(s) "
                     f"have {have}): add nodes or CPUs, or ask for fewer or smaller "
                     "replicas (machine types)")


def _place(bundles: list[dict], nodes: list[dict], distinct: bool) -> int | None:
    """First fit, largest bundles first; the index of a bundle that finds no room."""
    free = [dict(n) for n in nodes]
    taken: set[int] = set()
    for i, b in sorted(enumerate(bundles), key=lambda ib: -ib[1].get("CPU", 0)):
        for k, node in enumerate(free):
            if (distinct and k in taken) or not all(
                    node.get(key, 0.0) + 1e-9 >= v for key, v in b.items()):
                continue
            for key, v in b.items():
                node[key] = node.get(key, 0.0) - v
            taken.add(k)
            break
        else:
            return i
    return None


def _amount(key: str, value: float) -> str:
    return f"{value / GIB:.1f} GiB" if key == "memory" else f"{value:g}"


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class ReplicaActor:
    """One replica's process on the node its bundle is on (made a Ray actor in main)."""

    def __init__(self, label: str, patterns: dict | None = None):
        self.label = label
        # submit.logs' patterns (job.json carries them): start-up noise, severities
        self.patterns = {k: re.compile(v) for k, v in (patterns or {}).items()}
        self.proc: subprocess.Popen | None = None
        self.lines: collections.deque = collections.deque()
        self.readers: list[threading.Thread] = []
        self.metric_file: str | None = None

    def where(self, port: int | None) -> tuple[str, str, int]:
        """(node id, node address, a free port there: `port` when it is free)."""
        import ray
        address = ray.util.get_node_ip_address()
        chosen = 0
        for candidate in ([port] if port else []) + [0]:
            with socket.socket() as s:
                # as TensorFlow's gRPC server binds: a machine that came back still has
                # its lost replica's connections in TIME_WAIT on the old port, which
                # that server can take (a listening socket there still refuses)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((address, candidate))
                except OSError:
                    continue
                chosen = s.getsockname()[1]
                break
        return ray.get_runtime_context().get_node_id(), address, chosen

    def start(self, module: str, args: list[str], env: dict, folder: str,
              metric_file: str | None = None) -> int:
        cwd = os.path.join(os.getcwd(), folder)  # the job's working_dir on this node
        os.makedirs(cwd, exist_ok=True)
        full = {k: v for k, v in os.environ.items()}
        full.update(env)
        if metric_file:  # a tuning trial's reports: a file of this replica's, here
            self.metric_file = full[HP_METRIC_FILE_ENV] = os.path.join(cwd, metric_file)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", LAUNCHER, module, *args], cwd=cwd, env=full,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=_die_with_parent)
        self.readers = [threading.Thread(target=self._read, args=(pipe, stream), daemon=True)
                        for pipe, stream in ((self.proc.stdout, "stdout"),
                                             (self.proc.stderr, "stderr"))]
        for reader in self.readers:
            reader.start()
        return self.proc.pid

    def _read(self, pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if "quiet" in self.patterns and self.patterns["quiet"].match(text):
                continue
            self.lines.append(log_line(self.label, text, self.severity(text, stream)))
        pipe.close()

    def severity(self, text: str, stream: str) -> str:
        """submit.logs.severity, with the patterns it was given."""
        glog = self.patterns.get("glog")
        match = glog.match(text) if glog else None
        if match:
            return {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}[match[1]]
        python = self.patterns.get("python")
        match = python.match(text) if python else None
        if match:
            return match[1]
        error = self.patterns.get("error")
        return "ERROR" if stream == "stderr" and error and error.search(text) else "INFO"

    def poll(self) -> tuple[list[str], int | None]:
        """New output lines, and the exit status once the process ended and its output
        was read."""
        status = None
        if self.proc is not None and self.proc.poll() is not None and \
                not any(r.is_alive() for r in self.readers):
            code = self.proc.returncode
            status = 128 - code if code < 0 else code
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out, status

    def metrics(self) -> list[str]:
        """The report lines in this replica's metrics file ([] before the first)."""
        if not self.metric_file:
            return []
        try:
            with open(self.metric_file, encoding="utf-8", errors="replace") as f:
                return [line.strip() for line in f if line.strip()]
        except OSError:
            return []

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    self.proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        code = self.proc.returncode
        return None if code is None else (128 - code if code < 0 else code)


def stop_deadline(env: dict) -> float:
    """MLJOB_STOP_DEADLINE as a replica reads it: the chief's time to save when stopped."""
    try:
        seconds = float(env.get(STOP_DEADLINE_ENV) or 0)
    except ValueError:
        seconds = 0.0
    return seconds if 0 < seconds < float("inf") else STOP_DEADLINE_SECONDS


def should_restart(policy: str, status: int) -> bool:
    """`submit.local.supervisor.should_restart`, the same rule, copied: this driver runs
    on the cluster with the standard library and Ray only (tests/submit/test_runner_ray.py
    checks the two agree)."""
    if status == 0 or policy == "Never":
        return False
    if policy == "ExitCode":
        return 128 <= status <= 255
    return policy in ("OnFailure", "Always")


class Driver:
    def __init__(self, job: dict):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        self.ray, self.job = ray, job
        self.replicas = job["replicas"]
        self.stopping = threading.Event()
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.bundles, strategy = fit([r["bundle"] for r in self.replicas], nodes,
                                     spread=job["spread"])
        self.event(f"placement group: {len(self.bundles)} bundles, {strategy}, on "
                   f"{len(nodes)} node(s)")
        self.pg = placement_group(self.bundles, strategy=strategy,
                                  name=f"mljob-{job['job_id']}")
        wait = job.get("max_wait_time") or PLACEMENT_WAIT_S
        ready, _ = ray.wait([self.pg.ready()], timeout=wait)
        if not ready:
            raise ValueError(f"the placement group was not placed within {wait:g}s (the "
                             "cluster is busy); retry later or set "
                             "trainingInput.scheduling.maxWaitTime")
        self.strategy_of = PlacementGroupSchedulingStrategy
        self.actor_class = ray.remote(ReplicaActor)
        self.actors: list = [None] * len(self.replicas)
        self.addresses: list[tuple[str, int]] = [("", 0)] * len(self.replicas)
        self.nodes: list[str] = [""] * len(self.replicas)
        self.restarts = [0] * len(self.replicas)
        self.pids: list[int | None] = [None] * len(self.replicas)
        self.ended: set[int] = set()   # exited for good or stopped: never signalled again
        self.peer_lost = False         # a replica failed for good: the chief cannot save
        self.relayed: list[set[str]] = [set() for _ in self.replicas]  # report lines

    def event(self, text: str) -> None:
        print(log_line(SERVICE, text), flush=True)

    def note(self, i: int, state: str, status: int | None = None) -> None:
        r = self.replicas[i]
        self.event(f"{EVENT}{r['label']} state={state} restarts={self.restarts[i]} "
                   f"exit={'-' if status is None else status} "
                   f"node={self.addresses[i][0] or '-'} node_id={self.nodes[i] or '-'}")

    def place(self, i: int) -> None:
        """(Re-)create replica i's actor in its bundle; keep its old port if it can.

        Until Ray marks a lost node dead (its health checks, some seconds), the bundle
        still names that node and an actor created there dies before it runs: it is
        created again, until the bundle is re-placed or the wait runs out."""
        bundle = self.bundles[i]
        wait = self.job.get("max_wait_time") or PLACEMENT_WAIT_S
        deadline = time.monotonic() + wait
        while True:
            actor: Any = self.actor_class.options(
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                memory=bundle.get("memory") or None, max_restarts=0, max_concurrency=4,
                scheduling_strategy=self.strategy_of(
                    placement_group=self.pg, placement_group_bundle_index=i)
            ).remote(self.replicas[i]["label"], self.job.get("patterns"))
            try:
                node_id, ip, port = self.ray.get(
                    actor.where.remote(self.addresses[i][1] or None),
                    timeout=max(1.0, deadline - time.monotonic()))
                break
            except self.ray.exceptions.GetTimeoutError:
                pass
            except self.ray.exceptions.RayActorError:  # created on a node that died
                if time.monotonic() < deadline:
                    time.sleep(POLL_S)
                    continue
            raise ValueError(f"{self.replicas[i]['label']} found no room in the cluster "
                             f"within {wait:g}s (its bundle was not placed again); add a "
                             "node or retry the job")
        self.actors[i], self.nodes[i], self.addresses[i] = actor, node_id, (ip, port)

    def tf_config(self, i: int) -> str:
        cluster: dict[str, list[str]] = {}
        for r, (ip, port) in zip(self.replicas, self.addresses, strict=True):
            if r["task_type"] != "evaluator":
                cluster.setdefault(r["task_type"], []).append(f"{ip}:{port}")
        r = self.replicas[i]
        task = {"type": r["task_type"], "index": r["index"]}
        if self.job.get("trial"):  # a tuning trial's id, as Cloud ML's TF_CONFIG had it
            task["trial"] = self.job["trial"]
        return json.dumps({"cluster": cluster, "task": task,
                           "job": self.job["training_input"], "environment": "cloud"},
                          sort_keys=True)

    def start(self, i: int) -> None:
        r = self.replicas[i]
        env = {**self.job["env"], "TF_CONFIG": self.tf_config(i)}
        if self.job.get("size_threads", True):  # TensorFlow's pool: the bundle's CPUs
            env.setdefault("TF_NUM_INTRAOP_THREADS",
                           str(max(1, int(self.bundles[i].get("CPU", 1)))))
        self.pids[i] = self.ray.get(self.actors[i].start.remote(
            self.job["module"], self.job["args"], env, os.path.join("replicas", r["label"]),
            self.job.get("hp_metric_file")))
        self.note(i, "RUNNING")

    def stop(self, which, final: bool = True) -> None:
        """Stop the replicas' processes (SIGTERM, grace, SIGKILL) stage by stage in
        STOP_ORDER: the chief first, with its stop deadline unless a peer was lost (it
        saves while the ps serve), then workers and evaluators, then the ps."""
        which = [i for i in which if self.actors[i] is not None and i not in self.ended]
        for types in STOP_ORDER:
            stage = [i for i in which if self.replicas[i]["task_type"] in types]
            saving = "chief" in types and not self.peer_lost
            grace = STOP_GRACE_S + (stop_deadline(self.job["env"]) if saving else 0)
            refs = [(i, self.actors[i].stop.remote(grace)) for i in stage]
            for i, ref in refs:
                try:
                    status = self.ray.get(ref, timeout=grace * 2 + STOP_GRACE_S)
                except Exception:  # a lost actor has nothing to stop
                    status = None
                if final:
                    self.ended.add(i)
                    self.note(i, "STOPPED", status)

    def run(self) -> tuple[str, str | None]:
        for i in range(len(self.replicas)):
            self.place(i)
        for i in range(len(self.replicas)):
            self.start(i)
        chief = next(i for i, r in enumerate(self.replicas) if r["is_chief"])
        deadline = None if not self.job.get("max_running_time") else \
            time.monotonic() + self.job["max_running_time"]
        done: set[int] = set()
        while not self.stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return "FAILED", (f"The job exceeded its maximum running time of "
                                  f"{self.job['max_running_time']:g}s "
                                  "(trainingInput.scheduling.maxRunningTime) and was stopped.")
            polls = {i: self.actors[i].poll.remote() for i in range(len(self.replicas))
                     if i not in done}
            for i, ref in polls.items():
                try:
                    lines, status = self.ray.get(ref, timeout=60)
                except (self.ray.exceptions.RayActorError,
                        self.ray.exceptions.GetTimeoutError):
                    lines, status = [], LOST_STATUS
                    self.event(f"{self.replicas[i]['label']} lost its actor (node "
                               f"{self.addresses[i][0]} gone)")
                for line in lines:
                    print(line, flush=True)
                if self.job.get("hp_metric_file") and status != LOST_STATUS:
                    self.relay(i)  # after the poll: an ended replica's file is whole
                if status is None:
                    continue
                r = self.replicas[i]
                if i == chief and status == 0:
                    self.note(i, "EXITED", 0)
                    self.ended.add(i)
                    self.stop([j for j in range(len(self.replicas)) if j != chief])
                    return "SUCCEEDED", None
                if self.restarts[i] < r["max_restarts"] and \
                        should_restart(r["restart_policy"], status):
                    self.note(i, "RESTARTING", status)
                    self.restart(i, status)
                    continue
                self.note(i, "EXITED", status)
                done.add(i)
                self.ended.add(i)
                self.peer_lost = status != 0
                if status != 0:
                    return "FAILED", (f"The replica {r['label']} exited with a non-zero "
                                      f"status of {status}.")
            time.sleep(POLL_S)
        return "CANCELLED", None

    def relay(self, i: int) -> None:
        """Replica i's new tuning reports, as service lines."""
        try:
            lines = self.ray.get(self.actors[i].metrics.remote(), timeout=60)
        except Exception:  # a lost actor's reports are lost with its node
            return
        for line in lines:
            if line not in self.relayed[i]:
                self.relayed[i].add(line)
                self.event(f"{METRIC}{self.replicas[i]['label']} {line}")

    def restart(self, i: int, status: int) -> None:
        r = self.replicas[i]
        delay = min(2.0 ** self.restarts[i], 30.0)
        self.event(f"{r['label']} exited with status {status}; restarting in {delay:.0f} s "
                   f"(restart {self.restarts[i] + 1} of {r['max_restarts']}, policy "
                   f"{r['restart_policy']})")
        time.sleep(delay)
        self.restarts[i] += 1
        old = self.addresses[i]
        if status == LOST_STATUS:
            try:
                self.ray.kill(self.actors[i])
            except Exception:  # already gone with its node
                pass
            self.place(i)  # waits until Ray has re-placed the bundle
        if self.addresses[i] != old:
            self.event(f"{r['label']} moved from {old[0]}:{old[1]} to "
                       f"{self.addresses[i][0]}:{self.addresses[i][1]}; every replica "
                       "restarts with the new TF_CONFIG")
            others = [j for j in range(len(self.replicas))
                      if j != i and j not in self.ended]
            self.stop(others, final=False)
            for j in others:
                self.start(j)
        self.start(i)

    def close(self) -> None:
        self.stop(range(len(self.replicas)))
        for actor in self.actors:
            if actor is not None:
                try:
                    self.ray.kill(actor)
                except Exception:
                    pass
        from ray.util.placement_group import remove_placement_group
        remove_placement_group(self.pg)


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    import ray
    ray.init(log_to_driver=False)
    driver = None

    def cancelled(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, cancelled)
    try:
        driver = Driver(job)
        state, why = driver.run()
    except ValueError as exc:
        state, why = "FAILED", str(exc)
    except KeyboardInterrupt:
        state, why = "CANCELLED", None
    finally:
        if driver is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            driver.close()
    print(log_line(SERVICE, f"{RESULT}{state}" + (f": {why}" if why else "")), flush=True)
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
