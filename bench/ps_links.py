"""Parameter-server training across hosts: the ps, the chief and two workers each in
its own network namespace, every link shaped to 1 Gbit/s with 1 ms of delay, for mljob's
path (step by step, with `--ps-local-steps`, and with bfloat16 on the wire) and
TensorFlow 1's design (`bench/tf1_baseline.py`).

    python -m bench.ps_links                   # MLP and CNN (needs root, `ip netns`, gcc)
    python -m bench.ps_links --model mlp --quick
    python -m bench.ps_links --model cnn --ps 2 --only "mljob ps local steps"

Each link is a veth pair to one bridge; `tc` shapes both ends with a token bucket
(`tbf rate 1gbit`). The delay: this machine's kernel has neither `netem` nor `fq` (`tc`
says "Specified qdisc kind is unknown"), so it is made in user space. Every server's
address in the cluster spec is a relay (`bench/delay_relay.c`, built with gcc at the
start) in a fifth namespace on an unshaped link; each relay holds every byte for the
delay in each direction before passing it to the real server, so each request and each
answer arrive 1 ms late (2 ms a round trip), and TF's gRPC connections all go through
one. The relays' CPU time is in the JSON: they share the 2 cores with the replicas.
Bytes on the wire are the four replica hosts' `eth0` counters (transmitted plus
received, halved: each byte leaves one replica host and reaches another), read when the
leader logs the first and the last step of the timed window.

Writes bench/results/ps_links.json and ps_links.png (`--name` to change).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from bench import common
from tests.support import netns

RATE = "1gbit"
PORT = 2222
RELAY_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_relay.c")


def build_relay(folder: str) -> str:
    if shutil.which("gcc") is None:
        raise SystemExit("error: the delay relay needs gcc; install it (apt-get install gcc) "
                         "or pass --delay-ms 0")
    binary = os.path.join(folder, "delay_relay")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", binary, RELAY_SOURCE], check=True)
    return binary


def _shape(network: netns.Network, hosts) -> None:
    for host in hosts:
        for ns, dev in ((host.namespace, netns.INTERFACE),
                        (network.bridge_namespace, host.port)):
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                            "rate", RATE, "burst", "256kb", "latency", "50ms"], check=True)


def _wire_bytes(hosts) -> int:
    total = 0
    for host in hosts:
        for counter in ("tx_bytes", "rx_bytes"):
            out = subprocess.run(host.command(["cat", f"/sys/class/net/{netns.INTERFACE}/"
                                                      f"statistics/{counter}"]),
                                 capture_output=True, text=True, check=True).stdout
            total += int(out)
    return total // 2


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_design(label: str, module: str, args: list[str], batch: int, timeout: float,
               ps_count: int = 1, relay: str | None = None, delay_ms: float = 1.0) -> dict:
    """One cluster: ps_count ps hosts, the chief and two worker hosts (and the relays'
    host when there is a delay)."""
    print(f"== {label}", flush=True)
    roles = [("ps", i) for i in range(ps_count)] + [("worker", 0), ("worker", 1),
                                                    ("chief", 0)]
    network = netns.Network(len(roles) + (1 if relay else 0))
    hosts = network.hosts[:len(roles)]
    lines: list = []
    counters: dict[int, int] = {}
    relays = []
    logs = tempfile.mkdtemp(prefix="mljob-links-")
    try:
        network.create()
        _shape(network, hosts)
        addresses = [h.endpoint(PORT) for h in hosts]
        if relay:
            relay_host = network.hosts[-1]
            for i, host in enumerate(hosts):
                address = f"{netns.SUBNET}.{101 + i}"
                netns._ip("-n", relay_host.namespace, "addr", "add", f"{address}/24",
                          "dev", netns.INTERFACE)
                relays.append(network.popen(
                    relay_host, [relay, address, PORT, host.address, PORT,
                                 int(delay_ms * 1000)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                addresses[i] = f"{address}:{PORT}"
        spec: dict[str, list[str]] = {}
        for (kind, _), address in zip(roles, addresses, strict=True):
            spec.setdefault(kind, []).append(address)
        env = dict(os.environ, **common.REPLICA_ENV, PYTHONPATH=common.ROOT,
                   MLJOB_PARENT_PID=str(os.getpid()))
        env.pop("TF_CONFIG", None)
        procs = {}
        for (kind, index), host in zip(roles, hosts, strict=True):
            name = f"{kind}-{index}"
            tf_config = json.dumps({"cluster": spec, "task": {"type": kind, "index": index}})
            with open(os.path.join(logs, f"{name}.log"), "wb") as err:
                procs[name] = network.popen(
                    host, [sys.executable, "-m", module, *args], cwd=common.ROOT,
                    env={**env, "TF_CONFIG": tf_config}, stderr=err,
                    stdout=subprocess.PIPE if kind == "chief" else subprocess.DEVNULL)
        leader = procs["chief-0"]
        started = time.monotonic()

        def read() -> None:
            for raw in leader.stdout:
                text = raw.decode(errors="replace").rstrip("\n")
                lines.append((time.monotonic() - started, text))
                step = common.parse_steps(lines[-1:])
                if step:
                    counters[step[0]["step"]] = _wire_bytes(hosts)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = leader.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        reader.join(5)
        relay_cpu = sum(_cpu_seconds(r.pid) for r in relays)
    finally:
        network.destroy()
    record = {"label": label, "rc": rc, "rate": RATE, "ps": ps_count,
              "delay": f"{delay_ms:g} ms each way (user-space relay)" if relay else "none"}
    if relay:
        record["relay_cpu_s"] = round(relay_cpu, 2)
    if rc != 0:
        record["error"] = "failed" if rc is not None else f"timeout {timeout:.0f} s"
        print(f"   {record['error']}: see {logs}", flush=True)
        return record
    try:
        record.update(common.throughput(lines, batch))
    except ValueError as exc:  # too few progress lines: recorded, the other runs go on
        record["error"] = str(exc)
        print(f"   {exc}", flush=True)
        return record
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


SETUPS = (("mljob ps step by step", "trainer.task", ["--no-ps-local-steps"]),
          ("mljob ps local steps", "trainer.task", ["--ps-local-steps", "--ps-wire-dtype",
                                                     "float32"]),
          ("mljob ps local steps bfloat16 wire", "trainer.task",
           ["--ps-local-steps", "--ps-wire-dtype", "bfloat16"]),
          ("tf1 ps adam", "bench.tf1_baseline", None))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ps_links", allow_abbrev=False)
    p.add_argument("--model", choices=("mlp", "cnn"), action="append")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--train-steps", type=int, default=None,
                   help="default: 3000 for the MLP, 600 for the CNN")
    p.add_argument("--ps", type=int, default=1, help="parameter-server hosts")
    p.add_argument("--delay-ms", type=float, default=1.0,
                   help="one-way delay of every link (0: rate-shaped only)")
    p.add_argument("--only", default="", help="comma-separated setup labels to run")
    p.add_argument("--name", default="ps_links")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=1200)
    args = p.parse_args(argv)
    reason = netns.skip_reason()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    only = {label.strip() for label in args.only.split(",") if label.strip()}
    load_before = common.load_average()
    runs = []
    build = tempfile.mkdtemp(prefix="mljob-relay-")
    try:
        relay = build_relay(build) if args.delay_ms > 0 else None
        for model in args.model or ["mlp", "cnn"]:
            steps = args.train_steps or (3000 if model == "mlp" else 600)
            steps //= 5 if args.quick else 1
            every = max(100, steps // 10 - (steps // 10) % 20)  # see bench/ps_speed.py
            tf1 = ["--model", model, "--train-steps", str(steps), "--batch-size",
                   str(args.batch_size), "--log-every", str(every), "--optimizer", "adam"]
            for label, module, extra in SETUPS:
                if only and label not in only:
                    continue
                with common.TempJobDir() as job_dir:  # a fresh job dir: never a resume
                    targs = tf1 if extra is None else common.trainer_args(
                        model, steps, every, args.batch_size, job_dir, *extra,
                        eval_every=steps)
                    record = run_design(f"{model}: {label}", module, targs, args.batch_size,
                                        args.timeout, args.ps, relay, args.delay_ms)
                record.update(model=model, setup=label, train_steps=steps)
                runs.append(record)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(build, ignore_errors=True)
    common.write_json(args.name, {"batch_size": args.batch_size, "quick": args.quick,
                                  "ps": args.ps, "delay_ms": args.delay_ms, "runs": runs},
                      load_before)
    plot(runs, args.name)
    return 0


def plot(runs: list[dict], name: str) -> None:
    plt = common.pyplot()
    models = list(dict.fromkeys(r["model"] for r in runs))
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7), squeeze=False)
    for col, model in enumerate(models):
        rows = [r for r in runs if r["model"] == model]
        names = [r["setup"] for r in rows]
        for row, key, title in ((0, "examples_per_s", "examples/s"),
                                (1, "bytes_per_example", "bytes on the wire per example")):
            ax = axes[row][col]
            ax.bar(names, [r.get(key, 0) for r in rows],
                   color=["#9ecae1", "#1f77b4", "#2ca02c", "#d62728"][:len(rows)])
            ax.set_title(f"{model.upper()}, 1 Gbit/s, {rows[0]['delay']}: {title}",
                         fontsize=9)
            ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    common.save_figure(fig, name)


if __name__ == "__main__":
    sys.exit(main())
