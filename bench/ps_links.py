"""Parameter-server training across hosts: the ps, the chief and two workers each in
its own network namespace, every link shaped to 1 Gbit/s, for mljob's path (step by
step and with `--ps-local-steps`) and TensorFlow 1's design (`bench/tf1_baseline.py`).

    python -m bench.ps_links                   # MLP and CNN (needs root and `ip netns`)
    python -m bench.ps_links --model mlp --quick

Each link is a veth pair to one bridge; `tc` shapes both ends with a token bucket
(`tbf rate 1gbit`). The issue's 1 ms delay needs `netem`, which this machine's kernel
lacks (`tc` says "Specified qdisc kind is unknown"): the runs here are rate-shaped only,
and the JSON says so. Bytes on the wire are the hosts' `eth0` counters (transmitted
plus received, over all four hosts, halved: each byte leaves one host and reaches
another), read when the leader logs the first and the last step of the timed window.

Writes bench/results/ps_links.json and ps_links.png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from bench import common
from tests.support import netns

RATE = "1gbit"
PORT = 2222


def _shape(network: netns.Network) -> None:
    for host in network:
        for ns, dev in ((host.namespace, netns.INTERFACE),
                        (network.bridge_namespace, host.port)):
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                            "rate", RATE, "burst", "256kb", "latency", "50ms"], check=True)


def _wire_bytes(network: netns.Network) -> int:
    total = 0
    for host in network:
        for counter in ("tx_bytes", "rx_bytes"):
            out = subprocess.run(host.command(["cat", f"/sys/class/net/{netns.INTERFACE}/"
                                                      f"statistics/{counter}"]),
                                 capture_output=True, text=True, check=True).stdout
            total += int(out)
    return total // 2


def run_design(label: str, module: str, args: list[str], batch: int, timeout: float) -> dict:
    """One cluster of four hosts: ps, chief, worker 0, worker 1."""
    print(f"== {label}", flush=True)
    network = netns.Network(4)
    lines: list = []
    counters: dict[int, int] = {}
    try:
        network.create()
        _shape(network)
        ps, chief, w0, w1 = network
        spec = {"ps": [ps.endpoint(PORT)], "chief": [chief.endpoint(PORT)],
                "worker": [w0.endpoint(PORT), w1.endpoint(PORT)]}
        env = dict(os.environ, **common.REPLICA_ENV, PYTHONPATH=common.ROOT,
                   MLJOB_PARENT_PID=str(os.getpid()))
        env.pop("TF_CONFIG", None)
        logs = tempfile.mkdtemp(prefix="mljob-links-")
        procs = {}
        for name, host, kind, index in (("ps-0", ps, "ps", 0), ("worker-0", w0, "worker", 0),
                                        ("worker-1", w1, "worker", 1),
                                        ("chief", chief, "chief", 0)):
            tf_config = json.dumps({"cluster": spec, "task": {"type": kind, "index": index}})
            with open(os.path.join(logs, f"{name}.log"), "wb") as err:
                procs[name] = network.popen(
                    host, [sys.executable, "-m", module, *args], cwd=common.ROOT,
                    env={**env, "TF_CONFIG": tf_config}, stderr=err,
                    stdout=subprocess.PIPE if name == "chief" else subprocess.DEVNULL)
        leader = procs["chief"]
        started = time.monotonic()

        def read() -> None:
            for raw in leader.stdout:
                text = raw.decode(errors="replace").rstrip("\n")
                lines.append((time.monotonic() - started, text))
                step = common.parse_steps(lines[-1:])
                if step:
                    counters[step[0]["step"]] = _wire_bytes(network)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = leader.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        reader.join(5)
    finally:
        network.destroy()
    record = {"label": label, "rc": rc, "rate": RATE, "delay": "none (netem unavailable)"}
    if rc != 0:
        record["error"] = "failed" if rc is not None else f"timeout {timeout:.0f} s"
        print(f"   {record['error']}: see {logs}", flush=True)
        return record
    record.update(common.throughput(lines, batch))
    first, last = record["window_steps"]
    if first in counters and last in counters:
        record["bytes_per_example"] = round((counters[last] - counters[first])
                                            / ((last - first) * batch))
    evals = common.parse_evals(lines)
    if evals:
        record["final_test_accuracy"] = evals[-1]["accuracy"]
    print(f"   {record['examples_per_s']:,.0f} examples/s, "
          f"{record.get('bytes_per_example', '-')} bytes/example on the wire", flush=True)
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ps_links", allow_abbrev=False)
    p.add_argument("--model", choices=("mlp", "cnn"), action="append")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=1200)
    args = p.parse_args(argv)
    reason = netns.skip_reason()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    load_before = common.load_average()
    runs = []
    try:
        for model in args.model or ["mlp", "cnn"]:
            steps = (3000 if model == "mlp" else 300) // (5 if args.quick else 1)
            every = max(100, steps // 10 - (steps // 10) % 20)  # see bench/ps_speed.py
            tf1 = ["--model", model, "--train-steps", str(steps), "--batch-size",
                   str(args.batch_size), "--log-every", str(every), "--optimizer", "adam"]
            for label, module, extra in (
                    ("mljob ps step by step", "trainer.task", []),
                    ("mljob ps local steps", "trainer.task", ["--ps-local-steps"]),
                    ("tf1 ps adam", "bench.tf1_baseline", None)):
                with common.TempJobDir() as job_dir:  # a fresh job dir: never a resume
                    targs = tf1 if extra is None else common.trainer_args(
                        model, steps, every, args.batch_size, job_dir, *extra,
                        eval_every=steps)
                    record = run_design(f"{model}: {label}", module, targs, args.batch_size,
                                        args.timeout)
                record.update(model=model, setup=label, train_steps=steps)
                runs.append(record)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    common.write_json("ps_links", {"batch_size": args.batch_size, "quick": args.quick,
                                   "runs": runs}, load_before)
    plot(runs)
    return 0


def plot(runs: list[dict]) -> None:
    plt = common.pyplot()
    models = list(dict.fromkeys(r["model"] for r in runs))
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7), squeeze=False)
    for col, model in enumerate(models):
        rows = [r for r in runs if r["model"] == model]
        names = [r["setup"] for r in rows]
        for row, key, title in ((0, "examples_per_s", "examples/s"),
                                (1, "bytes_per_example", "bytes on the wire per example")):
            ax = axes[row][col]
            ax.bar(names, [r.get(key, 0) for r in rows], color=["#1f77b4", "#2ca02c", "#d62728"])
            ax.set_title(f"{model.upper()}, 1 Gbit/s links: {title}")
            ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    common.save_figure(fig, "ps_links")


if __name__ == "__main__":
    sys.exit(main())
