"""`--runner ray` against `--runner local`, side by side in one run: the same ps job
(master, 1 worker, 1 ps; n1-standard-1 machines) submitted with `python -m submit` to a
Ray cluster started here and to the local runner, alternating, `--repeats` times each.

    python -m bench.ray_runner                # MLP, 2000 steps, 2 repeats
    python -m bench.ray_runner --quick
    python -m bench.ray_runner --cluster head # a one-node Ray head instead

The Ray cluster (`--cluster`):
- `netns` (the default where network namespaces can be made: root and `ip`): three
  nodes, a head and two workers, each in a network namespace of its own with its own
  address (tests/support/netns.py), one logical CPU each: the ps job's replicas are
  strictly spread, one per node, and talk over the namespaces' veths and bridge, as on
  three machines; `python -m submit --runner ray` runs in the head's namespace, where
  the dashboard is;
- `head`: one `ray start --head` on this machine's 127.0.0.1, 3 logical CPUs.
Every Ray node is stopped by PID, the namespaces deleted.

Measured per run, from the arrival of the submit command's output lines:
- start-up: from starting `python -m submit` to the chief's `training started` line
  (package build, staging, and then: local, the package environment and the processes;
  Ray, the job's upload, its runtime_env (a pip virtualenv per node), the placement
  group, the actors and the processes), and to its first `step` line (`first_step_s`:
  the above and the first step, its tracing included);
- per step: ms per step over the run's steady part (arrival times of the step lines,
  after 10% of the steps), and the trainer's own examples/s (median of its lines), which
  does not depend on how fast the lines reach the terminal;
- the whole run's wall time.
The local runner's package environment is cached by content, and so is Ray's pip
environment (by its pip list): the first run of each pays the install, later ones not,
so the first run is reported apart ("cold") from the median of the others.

Writes bench/results/ray_runner.json.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml

from bench import common
from tests.support import netns
from tests.support.ray_cluster import start_node

ONE_CPU = "n1-standard-1"
CONFIG = {"trainingInput": {"scaleTier": "CUSTOM", "masterType": ONE_CPU,
                            "workerType": ONE_CPU, "parameterServerType": ONE_CPU,
                            "workerCount": 1, "parameterServerCount": 1}}
BATCH = 100
SAMPLE = os.path.join(common.ROOT, "trainer", "sample")


CLUSTERS = {"netns": "3 Ray nodes (head + 2 workers, 1 CPU each) in 3 network namespaces",
            "head": "1 Ray head on 127.0.0.1, 3 CPUs"}


def start_cluster(stack: contextlib.ExitStack, cluster: str, folder: str):
    """The Ray cluster, stopped when `stack` closes: (dashboard URL, the wrap that runs a
    command where the dashboard answers, or None)."""
    if cluster == "head":
        head = start_node(os.path.join(folder, "ray"), num_cpus=3)
        stack.callback(head.stop)
        assert head.dashboard is not None
        return head.dashboard, None
    hosts = stack.enter_context(netns.test_hosts(3, name=f"mljob-bray{os.getpid() % 10000}"))
    nodes = []
    stack.callback(lambda: [node.stop() for node in reversed(nodes)])
    head = start_node(os.path.join(folder, "ray-0"), ip=hosts[0].address, num_cpus=1,
                      wrap=hosts[0].command)
    nodes.append(head)
    for i in (1, 2):
        nodes.append(start_node(os.path.join(folder, f"ray-{i}"), ip=hosts[i].address,
                                head_address=head.address, num_cpus=1,
                                wrap=hosts[i].command))
    assert head.dashboard is not None
    return head.dashboard, hosts[0].command


def run_once(runner: str, job_id: str, folder: str, config: str, steps: int,
             dashboard: str, timeout: float, wrap=None) -> dict:
    """One job to its end; `wrap` runs the submit command where the dashboard is (the
    head's namespace)."""
    args = [sys.executable, "-m", "submit", job_id, "--runner", runner, "--config", config,
            "--job-dir", os.path.join(folder, job_id)]
    if runner == "ray":
        args += ["--ray-address", dashboard]
    args += ["--", "--model", "mlp", "--data-dir", SAMPLE, "--seed", "1",
             "--train-steps", str(steps), "--checkpoint-every", "0", "--eval-every", "0",
             "--log-every", str(max(10, steps // 40)), "--batch-size", str(BATCH)]
    lines: list[tuple[float, str]] = []
    started = time.monotonic()
    command = wrap(args) if (wrap and runner == "ray") else args
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=common.ROOT, start_new_session=True)

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.decode("utf-8", "replace").rstrip("\n")
            # the log format's fourth field is the replica's own text
            parts = text.split("\t", 3)
            if len(parts) == 4 and parts[2] == "master-replica-0":
                lines.append((time.monotonic() - started, parts[3]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and its children, by PID
            proc.wait()
    reader.join(10)
    wall = time.monotonic() - started
    if status != 0:
        raise RuntimeError(f"{runner} run {job_id} exited {status}")
    speed = common.throughput(lines, BATCH)
    steps_seen = common.parse_steps(lines)
    return {"runner": runner, "job_id": job_id, "startup_s": round(
        common.started_at(lines) or float("nan"), 2),
            "first_step_s": round(steps_seen[0]["t"], 2) if steps_seen else float("nan"),
            "wall_s": round(wall, 2),
            "ms_per_step": speed["ms_per_step"],
            "trainer_examples_per_s": speed["reported_examples_per_s_median"]}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for runner in ("local", "ray"):
        mine = [r for r in runs if r["runner"] == runner]
        warm = mine[1:] or mine
        out[runner] = {
            "cold_startup_s": mine[0]["startup_s"],
            "cold_first_step_s": mine[0]["first_step_s"],
            "startup_s": common.median([r["startup_s"] for r in warm]),
            "first_step_s": common.median([r["first_step_s"] for r in warm]),
            "ms_per_step": common.median([r["ms_per_step"] for r in warm]),
            "trainer_examples_per_s": common.median(
                [r["trainer_examples_per_s"] for r in warm]),
            "wall_s": common.median([r["wall_s"] for r in warm])}
    local, ray = out["local"], out["ray"]
    out["ray_over_local"] = {
        "startup": round(ray["startup_s"] / local["startup_s"], 2),
        "startup_extra_s": round(ray["startup_s"] - local["startup_s"], 1),
        "first_step": round(ray["first_step_s"] / local["first_step_s"], 2),
        "first_step_extra_s": round(ray["first_step_s"] - local["first_step_s"], 1),
        "cold_first_step_extra_s": round(ray["cold_first_step_s"] -
                                         local["cold_first_step_s"], 1),
        "ms_per_step": round(ray["ms_per_step"] / local["ms_per_step"], 2),
        "trainer_examples_per_s": round(ray["trainer_examples_per_s"] /
                                        local["trainer_examples_per_s"], 2)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ray_runner", allow_abbrev=False)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--cluster", choices=("netns", "head"), default=None,
                   help="three nodes in network namespaces (the default where they can "
                        "be made) or one head on 127.0.0.1")
    args = p.parse_args(argv)
    cluster = args.cluster or ("netns" if netns.skip_reason() is None else "head")
    if cluster == "netns" and netns.skip_reason():
        p.error(f"--cluster netns: {netns.skip_reason()}; use --cluster head")
    steps = 400 if args.quick else args.steps
    load_before = common.load_average()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mljob-bench-ray-") as folder:
        os.environ["MLJOB_HOME"] = os.path.join(folder, "home")
        config = os.path.join(folder, "config.yaml")
        with open(config, "w") as f:
            yaml.safe_dump(CONFIG, f)
        with contextlib.ExitStack() as stack:
            dashboard, wrap = start_cluster(stack, cluster, folder)
            for repeat in range(args.repeats):
                for runner in ("local", "ray"):
                    run = run_once(runner, f"bench_{runner}_{repeat}", folder, config,
                                   steps, dashboard, args.timeout, wrap)
                    print(run, flush=True)
                    runs.append(run)
    summary = summarize(runs)
    print(yaml.safe_dump(summary, sort_keys=False))
    common.write_json("ray_runner", {"cluster": CLUSTERS[cluster], "steps": steps,
                                     "batch_size": BATCH,
                                     "config": CONFIG, "runs": runs,
                                     "summary": summary}, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
