"""`--runner ray` on a Ray cluster of three machines: a head and two workers, each in a
network namespace of its own with its own address (tests/support/netns.py: veths on a
bridge), started with `ray start` and stopped by PID.

A ps job (master, worker, ps; one vCPU each, one CPU per node) is submitted through
Ray's job submission API to the head's dashboard, from the head's machine. Ray's own
placement group table (its state API) must show the job's three bundles on three
different nodes (STRICT_SPREAD). Mid-run, the worker machine holding the worker (else
the ps) dies: every process of that Ray node (raylet, agents, workers, the replica's
trainer) SIGKILLed by PID. A machine with the same address joins again (a replacement,
as a cloud's managed instance group or an autoscaler brings): Ray re-places the lost
bundle there (its table says so), the driver re-creates the replica's actor in it, on
the same address and port, and the job ends SUCCEEDED by the restart policy, the
replica's restart counted.

Slow (4 to 5 minutes on 2 shared cores); skipped, with the reason, where namespaces
cannot be made (root and `ip`) or Ray is not installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import yaml

from tests.support.netns import skip_reason as netns_skip, test_hosts
from tests.support.ray_cluster import skip_reason as ray_skip, start_node
from tests.support.trainer_runs import FAST

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(ray_skip() is not None, reason=ray_skip() or ""),
              pytest.mark.skipif(netns_skip() is not None, reason=netns_skip() or "")]

ONE_CPU = "n1-standard-1"
CONFIG = {"trainingInput": {
    "scaleTier": "CUSTOM", "masterType": ONE_CPU, "workerType": ONE_CPU,
    "parameterServerType": ONE_CPU, "workerCount": 1, "parameterServerCount": 1,
    **{key: {"restartPolicy": "OnFailure", "maxRestarts": 3}
       for key in ("masterConfig", "workerConfig", "parameterServerConfig")}}}
TRAIN = [*FAST, "--train-steps", "4000", "--checkpoint-every", "0", "--eval-every", "0",
         "--log-every", "100", "--steps-per-execution", "10"]
# The placement group table and the nodes, read through Ray's state API (the
# dashboard's), inside the head's machine: each alive node's address, and each of the
# job's placement groups, its state and its bundles' nodes in bundle order (a bundle's
# index is its `bundle_id.bundle_index`).
PLACEMENT = """
import json, sys
from ray.util.state import list_nodes, list_placement_groups
address = sys.argv[1]
nodes = {n.node_id: n.node_ip for n in list_nodes(address=address, detail=True)
         if n.state == "ALIVE"}
groups = [g for g in list_placement_groups(address=address, detail=True)
          if g.name.startswith("mljob-") and g.state != "REMOVED"]
print(json.dumps({"nodes": nodes, "groups": [{"state": g.state, "bundles": [
    b.get("node_id") for b in sorted(g.bundles,
                                     key=lambda b: b["bundle_id"]["bundle_index"])]}
    for g in groups]}))
"""


def placement(host, dashboard: str) -> dict:
    done = host.run([sys.executable, "-c", PLACEMENT, dashboard], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_for(what, predicate, timeout: float, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def command(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def placed(seen: dict) -> list[str | None]:
    """The addresses of the job's bundles (master, worker, ps: the job's order) once its
    one placement group is CREATED, else []."""
    groups = seen["groups"]
    if len(groups) != 1 or groups[0]["state"] != "CREATED":
        return []
    return [seen["nodes"].get(node) for node in groups[0]["bundles"]]


def test_replicas_on_three_machines_and_a_lost_machine_replaced(tmp_path, reaper):
    with test_hosts(3, reaper, name=f"mljob-ray{os.getpid() % 100000}") as hosts:
        nodes = []
        try:
            head = start_node(str(tmp_path / "ray-head"), ip=hosts[0].address, num_cpus=1,
                              wrap=hosts[0].command)
            nodes.append(head)
            with ThreadPoolExecutor(2) as pool:   # the two workers start together
                starting = {i: pool.submit(start_node, str(tmp_path / f"ray-{i}"),
                                           ip=hosts[i].address, head_address=head.address,
                                           num_cpus=1, wrap=hosts[i].command)
                            for i in (1, 2)}
            workers, failed = {}, []
            for i, future in starting.items():   # both started (or not), then any error
                try:
                    workers[i] = future.result()
                    nodes.append(workers[i])
                except Exception as exc:
                    failed.append(exc)
            if failed:
                raise failed[0]
            wait_for("three nodes", lambda: len(placement(hosts[0], head.dashboard)[
                "nodes"]) == 3, 120)
            config = tmp_path / "config.yaml"
            config.write_text(yaml.safe_dump(CONFIG))
            log_path = tmp_path / "submit.log"
            with open(log_path, "wb") as log:
                submitting = hosts[0].popen(
                    [sys.executable, "-m", "submit", "raynet", "--runner", "ray",
                     "--ray-address", head.dashboard, "--config", str(config),
                     "--job-dir", str(tmp_path / "out"), "--", *TRAIN],
                    stdout=log, stderr=subprocess.STDOUT)

            def output() -> str:
                return log_path.read_text(errors="replace")

            # Ray placed the bundles (the actors are running): where, by Ray's table
            wait_for("the replicas", lambda: "replica ps-replica-0 state=RUNNING" in output()
                     or submitting.poll() is not None, 420)
            assert submitting.poll() is None, output()[-3000:]
            first = placement(hosts[0], head.dashboard)
            ips = placed(first)
            assert sorted(ips) == sorted(h.address for h in hosts), first  # 3 machines
            wait_for("training", lambda: "\tmaster-replica-0\tstep 100/" in output() or
                     submitting.poll() is not None, 180, interval=0.2)
            assert submitting.poll() is None, output()[-3000:]
            # the worker's machine dies (the ps's if the worker is on the head)
            victim = ips[1] if ips[1] != hosts[0].address else ips[2]
            bundle = ips.index(victim)
            index = next(i for i in (1, 2) if hosts[i].address == victim)
            lost_label = "worker-replica-0" if bundle == 1 else "ps-replica-0"
            doomed = workers[index].pids()   # its Ray processes and the replica's trainer
            assert any("trainer.task" in command(pid) for pid in doomed), doomed
            workers[index].kill()
            assert workers[index].pids() == []
            wait_for("the lost actor", lambda: f"{lost_label} lost its actor" in output(),
                     120)
            assert submitting.poll() is None, output()[-3000:]   # the job goes on
            again = start_node(str(tmp_path / f"ray-{index}-again"), ip=victim,
                               head_address=head.address, num_cpus=1,
                               wrap=hosts[index].command)
            nodes.append(again)
            wait_for("the replica again", lambda: f"replica {lost_label} state=RUNNING "
                     "restarts=1" in output() or submitting.poll() is not None, 300)
            # Ray's table: the lost bundle is on the new node (same address, new id)
            seen = placement(hosts[0], head.dashboard)
            assert placed(seen) == ips, seen
            lost_node = first["groups"][0]["bundles"][bundle]
            assert seen["groups"][0]["bundles"][bundle] != lost_node, (first, seen)
            assert lost_node not in seen["nodes"], seen   # the dead node is gone
            assert submitting.wait(600) == 0, output()[-4000:]
            text = output()
            assert "Job [raynet] SUCCEEDED." in text
            assert f"replica {lost_label} state=RESTARTING restarts=0 exit=137" in text
            assert f"replica {lost_label} state=RUNNING restarts=1 exit=- node={victim}" \
                in text
            # back on its address and port: only the lost replica restarted
            assert f"{lost_label} moved from" not in text
            assert "\tmaster-replica-0\tstep 4000/4000" in text
            assert os.path.exists(tmp_path / "out" / "model" / "saved_model.pb")
        finally:
            for node in reversed(nodes):
                node.stop()
        for node in nodes:
            assert node.pids() == []
