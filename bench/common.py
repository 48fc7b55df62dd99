"""What every benchmark shares: the machine record, a cluster of replica processes on
127.0.0.1, peak memory sampling, the trainer's progress lines, and JSON + PNG output.

A run is a set of child processes, each in its own session so that it and anything it
forks can be stopped as a group by its PID: SIGTERM, a grace period, then SIGKILL. The
`Cluster` context manager does that on success, on failure, and on Ctrl-C or SIGTERM
to the benchmark itself, so no replica outlives a benchmark.

Throughput is measured from the benchmark's side: every progress line is timestamped
as it arrives (the trainer flushes each line), and examples/s is the number of examples
between two logged steps over the wall time between them, after a warm-up that is
skipped (tracing, XLA compilation, the first shuffle buffer). The trainer's own
`examples/s=` figures are kept beside it as a cross-check.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

import psutil

from mljob.procs import free_ports, stop_process  # noqa: F401 (bench modules use both)
from mljob.training import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
TREE_ENV = "MLJOB_BENCH_TREE"

# Every replica gets these before TensorFlow is imported: quiet logs, and dead peers
# detected (GRPC_FAIL_FAST), as the launcher sets them.
REPLICA_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_FAIL_FAST": "use_caller",
               "PYTHONUNBUFFERED": "1"}

STEP_LINE = re.compile(r"^step ([0-9]+)/([0-9]+) loss=(\S+) accuracy=(\S+) examples/s=(\S+)")
EVAL_LINE = re.compile(r"^eval step=([0-9]+) loss=(\S+) accuracy=(\S+)")
STARTED_LINE = re.compile(r"^training started: (.*)$")
FINISHED_LINE = re.compile(r"^training finished: (.*)$")


# ---- the machine -----------------------------------------------------------------------

def machine() -> dict:
    """CPU model, cores, memory and library versions: recorded in every result."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
        "keras": _version("keras"),
        "platform": platform.platform(),
    }


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- processes -------------------------------------------------------------------------

@dataclasses.dataclass
class Replica:
    """One child process: its stdout lines (with arrival times) and its peak memory."""

    name: str           # chief, worker-0, ps-1, single, baseline
    kind: str           # chief, worker, ps, single, baseline
    proc: subprocess.Popen
    stderr_path: str
    lines: list = dataclasses.field(default_factory=list)   # (seconds since start, text)
    started: float = dataclasses.field(default_factory=time.monotonic)
    peak_rss: int = 0   # bytes, max over samples of the process tree's RSS
    hwm_rss: int = 0    # bytes, the kernel's high-water mark (VmHWM) of the main process
    cpu_seconds: float = 0.0
    cpu_samples: list = dataclasses.field(default_factory=list)  # (monotonic, cpu seconds)

    def stderr_tail(self, n: int = 15) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class Cluster:
    """Child processes started together and stopped together, by PID.

    Use as a context manager; `start` launches one replica, `wait` waits for one to
    exit. A sampler thread records each replica's peak RSS (the process and its
    children) and CPU time every `sample_every` seconds.
    """

    def __init__(self, sample_every: float = 0.2):
        self.replicas: list[Replica] = []
        self._logs = tempfile.mkdtemp(prefix="mljob-bench-")
        self._stop = threading.Event()
        self._sample_every = sample_every
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._old_handlers = {}

    def __enter__(self) -> "Cluster":
        # SIGTERM to the benchmark behaves like Ctrl-C: unwind and stop every replica.
        if threading.current_thread() is threading.main_thread():
            self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _raise_interrupt)
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)

    def start(self, name: str, kind: str, args: Sequence[str], *,
              env: dict | None = None, tf_config: dict | None = None) -> Replica:
        child_env = dict(os.environ)
        if child_env.get(kernels.MARK) == "1":
            # importing mljob.training here chose oneDNN for this process: a baseline
            # runs with TensorFlow's own choice, mljob's trainer makes its own
            child_env.pop(kernels.ENV, None)
            child_env.pop(kernels.MARK, None)
        child_env.update(REPLICA_ENV)
        # MLJOB_BENCH_TREE: another checkout of the project to run (bench.before_after).
        tree = (env or {}).get(TREE_ENV) or ROOT
        child_env["PYTHONPATH"] = tree + os.pathsep + child_env.get("PYTHONPATH", "")
        child_env["MLJOB_PARENT_PID"] = str(os.getpid())
        child_env.pop("TF_CONFIG", None)
        if tf_config is not None:
            child_env["TF_CONFIG"] = json.dumps(tf_config)
        child_env.update(env or {})
        stderr_path = os.path.join(self._logs, f"{name}.stderr")
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, *args], cwd=tree, env=child_env,
                                    stdout=subprocess.PIPE, stderr=stderr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        replica = Replica(name, kind, proc, stderr_path)
        self.replicas.append(replica)
        threading.Thread(target=_read_lines, args=(replica,), daemon=True).start()
        return replica

    def wait(self, replica: Replica, timeout: float) -> int | None:
        """The replica's exit status, or None when it is still running at the timeout."""
        try:
            return replica.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self, grace: float = 5.0) -> None:
        self._sample_once()  # the last high-water marks, before anything exits
        self._stop.set()
        for replica in reversed(self.replicas):
            stop_process(replica.proc, grace)

    def _sample(self) -> None:
        while not self._stop.wait(self._sample_every):
            self._sample_once()

    def _sample_once(self) -> None:
        for replica in list(self.replicas):
            if replica.proc.poll() is not None:
                continue
            try:
                main = psutil.Process(replica.proc.pid)
                tree = [main, *main.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree)
                times = main.cpu_times()
                replica.cpu_seconds = times.user + times.system
            except psutil.Error:
                continue
            replica.cpu_samples.append((time.monotonic(), replica.cpu_seconds))
            replica.peak_rss = max(replica.peak_rss, rss)
            replica.hwm_rss = max(replica.hwm_rss, _vm_hwm(replica.proc.pid))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _read_lines(replica: Replica) -> None:
    for raw in replica.proc.stdout:
        text = raw.decode(errors="replace").rstrip("\n")
        replica.lines.append((time.monotonic() - replica.started, text))


def _vm_hwm(pid: int) -> int:
    """The kernel's peak RSS of one process (Linux), 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


# ---- clusters --------------------------------------------------------------------------

def cluster_spec(workers: int, ps: int, chief: bool = True) -> dict:
    """{"chief": [...], "worker": [...], "ps": [...]} on free 127.0.0.1 ports."""
    ports = iter(free_ports(int(chief) + workers + ps))
    spec = {}
    if chief:
        spec["chief"] = [f"127.0.0.1:{next(ports)}"]
    if workers:
        spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
    if ps:
        spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
    return spec


@dataclasses.dataclass
class RunResult:
    command: list            # the chief's (or single node's) argv
    rc: int | None           # None: stopped at the timeout
    wall_s: float
    replicas: list           # Replica, chief or single first
    lines: list              # the leader's (seconds, text)

    @property
    def leader(self) -> Replica:
        return self.replicas[0]

    def memory(self) -> dict:
        """Peak RSS in MiB per replica name (the larger of sampled and VmHWM)."""
        return {r.name: round(max(r.peak_rss, r.hwm_rss) / 2**20, 1) for r in self.replicas}

    def cpu_seconds(self) -> dict:
        return {r.name: round(r.cpu_seconds, 1) for r in self.replicas}


def run_trainer(trainer_args: Sequence[str], *, workers: int = 0, ps: int = 0,
                timeout: float = 600.0, module: str = "trainer.task",
                kind: str | None = None, env: dict | None = None,
                echo: bool = True) -> RunResult:
    """Run one training job to completion (or the timeout) and stop every replica.

    workers=0, ps=0: one process, no TF_CONFIG. workers>0, ps>0: chief + workers + ps
    (ParameterServerStrategy); workers>0, ps=0: chief + workers, MultiWorkerMirrored.
    Every replica runs the same command, as the launcher runs them.
    """
    args = ["-m", module, *trainer_args]
    started = time.monotonic()
    with Cluster() as cluster:
        if workers or ps:
            spec = cluster_spec(workers, ps)
            # Servers first, the chief last: it connects to them as it starts.
            for job in ("ps", "worker"):
                for i in range(len(spec.get(job, ()))):
                    cluster.start(f"{job}-{i}", job, args, env=env,
                                  tf_config={"cluster": spec, "task": {"type": job, "index": i}})
            leader = cluster.start("chief", "chief", args, env=env,
                                   tf_config={"cluster": spec, "task": {"type": "chief", "index": 0}})
        else:
            leader = cluster.start(kind or "single", kind or "single", args, env=env)
        cluster.replicas.remove(leader)
        cluster.replicas.insert(0, leader)
        rc = _wait_echoing(cluster, leader, timeout, echo)
        if rc is None or rc != 0:
            for replica in cluster.replicas:
                if replica.proc.poll() not in (None, 0):
                    print(f"[{replica.name} exited {replica.proc.returncode}]\n"
                          f"{replica.stderr_tail()}", file=sys.stderr)
            if rc != 0 and rc is not None:
                print(f"[leader stderr]\n{leader.stderr_tail()}", file=sys.stderr)
    wall = time.monotonic() - started
    return RunResult(args, rc, wall, cluster.replicas, list(leader.lines))


def _wait_echoing(cluster: Cluster, leader: Replica, timeout: float, echo: bool) -> int | None:
    deadline = time.monotonic() + timeout
    shown = 0
    while True:
        rc = cluster.wait(leader, 1.0)
        if echo:
            while shown < len(leader.lines):
                t, text = leader.lines[shown]
                if STEP_LINE.match(text) or EVAL_LINE.match(text) or "training" in text:
                    print(f"  [{leader.name} {t:7.1f}s] {text}", flush=True)
                shown += 1
        if rc is not None:
            time.sleep(0.2)  # let the reader thread drain the last lines
            return rc
        if time.monotonic() > deadline:
            return None
        for replica in cluster.replicas[1:]:
            # A multiworker replica ends with 0 when training ends, maybe before the
            # chief; any other exit of a peer fails the run.
            if replica.proc.poll() not in (None, 0):
                print(f"[{replica.name} exited early with {replica.proc.returncode}]\n"
                      f"{replica.stderr_tail()}", file=sys.stderr)
                return replica.proc.returncode


# ---- progress lines --------------------------------------------------------------------

def parse_steps(lines) -> list[dict]:
    """The `step n/T ...` lines as dicts with the arrival time `t` (seconds)."""
    out = []
    for t, text in lines:
        m = STEP_LINE.match(text)
        if m:
            out.append({"t": t, "step": int(m[1]), "total": int(m[2]), "loss": float(m[3]),
                        "accuracy": float(m[4]), "examples_per_s": float(m[5])})
    return out


def parse_evals(lines) -> list[dict]:
    out = []
    for t, text in lines:
        m = EVAL_LINE.match(text)
        if m:
            out.append({"t": t, "step": int(m[1]), "loss": float(m[2]),
                        "accuracy": float(m[3])})
    return out


def started_at(lines) -> float | None:
    """Arrival time of the `training started:` line (after the cluster is connected)."""
    for t, text in lines:
        if STARTED_LINE.match(text):
            return t
    return None


def throughput(lines, batch_size: int, skip_fraction: float = 0.1) -> dict:
    """examples/s after warm-up, from the arrival times of two logged steps.

    The window starts at the first logged step past `skip_fraction` of the steps
    (and never at the first line, whose step includes tracing) and ends at the last.
    """
    steps = parse_steps(lines)
    if len(steps) < 3:
        raise ValueError(f"too few step lines to measure throughput ({len(steps)}); "
                         "log more often (--log-every) or train longer")
    total = steps[-1]["total"]
    after = [s for s in steps[1:] if s["step"] >= skip_fraction * total]
    first, last = (after[0] if len(after) >= 2 else steps[1]), steps[-1]
    if last["step"] <= first["step"] or last["t"] <= first["t"]:
        raise ValueError("the step lines span no time; train longer")
    window = last["t"] - first["t"]
    examples = (last["step"] - first["step"]) * batch_size
    reported = [s["examples_per_s"] for s in steps if first["step"] < s["step"] <= last["step"]]
    return {
        "examples_per_s": round(examples / window, 1),
        "ms_per_step": round(1000 * window / (last["step"] - first["step"]), 3),
        "window_steps": [first["step"], last["step"]],
        "window_t": [round(first["t"], 3), round(last["t"], 3)],
        "window_s": round(window, 2),
        "reported_examples_per_s_median": round(median(reported), 1) if reported else None,
    }


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# ---- output ----------------------------------------------------------------------------

def write_json(name: str, payload: dict, load_before: list[float] | None = None) -> str:
    """bench/results/<name>.json with the machine, the time and the load average."""
    os.makedirs(RESULTS, exist_ok=True)
    record = {
        "benchmark": name,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        **payload,
    }
    path = os.path.join(RESULTS, f"{name}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return path


def update_json(name: str, record: dict) -> None:
    """Rewrite a result in place (a recomputed summary), keeping its date and loads."""
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def read_json(name: str) -> dict | None:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, name: str) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return path


def bar_chart(name: str, labels: Sequence[str], values: Sequence[float], *, title: str,
              ylabel: str, reference: float | None = None, reference_label: str = "") -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4.5))
    bars = ax.bar(range(len(labels)), values, color="#4c72b0")
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    if reference is not None:
        ax.axhline(reference, color="#c44e52", linestyle="--", label=reference_label)
        ax.legend(loc="best", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    path = save_figure(fig, name)
    plt.close(fig)
    return path


# ---- one measured run ------------------------------------------------------------------

def trainer_args(model: str, steps: int, log_every: int, batch_size: int, job_dir: str,
                 *extra: str, eval_every: int | None = None) -> list[str]:
    """`trainer.task` flags for a timed run: no evaluation or checkpoint inside the timed
    window unless asked (eval_every), a throwaway job dir."""
    quiet = str(10 * steps)
    return ["--model", model, "--train-steps", str(steps), "--batch-size", str(batch_size),
            "--log-every", str(log_every), "--job-dir", job_dir,
            "--eval-every", str(eval_every or quiet), "--checkpoint-every", quiet, *extra]


def measure(label: str, args: Sequence[str], *, batch_size: int, module: str = "trainer.task",
            workers: int = 0, ps: int = 0, timeout: float = 600.0, kind: str = "single",
            skip_fraction: float = 0.1, echo: bool = False,
            env: dict | None = None) -> dict:
    """Run one job and return its record: command, exit status, load, examples/s after
    warm-up, ms/step, peak RSS and CPU seconds of every replica. Paths under a temp
    job dir are written as JOB_DIR in the recorded command."""
    print(f"== {label}", flush=True)
    load = load_average()
    run = run_trainer(args, module=module, workers=workers, ps=ps, timeout=timeout,
                      kind=kind, echo=echo, env=env)
    command = "python " + " ".join(run.command)
    if "--job-dir" in args:
        command = command.replace(args[list(args).index("--job-dir") + 1], "JOB_DIR")
    record = {"label": label, "workers": workers, "ps": ps, "command": command,
              "tf_config": _describe_cluster(workers, ps),
              "rc": run.rc, "wall_s": round(run.wall_s, 1), "load_average": load,
              "peak_rss_mib": run.memory(), "cpu_s": run.cpu_seconds()}
    for _, text in run.lines:
        if STARTED_LINE.match(text):
            record["started_line"] = re.sub(r"job_dir=\S+", "job_dir=JOB_DIR", text)
            break
    t0 = started_at(run.lines)
    if t0 is not None:
        record["startup_s"] = round(t0, 1)
    if run.rc != 0:
        record["error"] = (run.leader.stderr_tail(5) if run.rc is not None
                           else f"stopped at the {timeout:.0f} s timeout")
        print(f"   failed (rc={run.rc}): {record['error'][-300:]}", flush=True)
        return record
    try:
        record.update(throughput(run.lines, batch_size, skip_fraction))
    except ValueError as exc:
        record["error"] = str(exc)
        print(f"   {exc}", flush=True)
        return record
    evals = parse_evals(run.lines)
    if evals:
        record["final_test_accuracy"] = evals[-1]["accuracy"]
    record.update(window_cpu(run, record, batch_size))
    print(f"   {record['examples_per_s']:,.0f} examples/s ({record['ms_per_step']} ms/step, "
          f"{record.get('cpu_ms_per_step')} CPU-ms/step; "
          f"trainer says {record['reported_examples_per_s_median']}), peak RSS "
          + ", ".join(f"{k} {v:.0f}" for k, v in record["peak_rss_mib"].items()) + " MiB"
          + f", load {load[0]}", flush=True)
    return record


def window_cpu(run: RunResult, record: dict, batch_size: int) -> dict:
    """CPU seconds all replicas together spent inside the throughput window.

    On a shared machine wall time depends on what else runs; CPU time per step much
    less so. examples per CPU-second x free cores approximates examples/s on an idle
    machine (as long as the replicas can keep those cores busy)."""
    t0, t1 = (run.leader.started + t for t in record["window_t"])
    total = 0.0
    for replica in run.replicas:
        a, b = _cpu_at(replica.cpu_samples, t0), _cpu_at(replica.cpu_samples, t1)
        if a is None or b is None:
            return {}
        total += b - a
    steps = record["window_steps"][1] - record["window_steps"][0]
    if total <= 0 or steps <= 0:
        return {}
    return {"cpu_s_in_window": round(total, 2),
            "cpu_ms_per_step": round(1000 * total / steps, 2),
            "examples_per_cpu_s": round(steps * batch_size / total, 1),
            "cores_busy": round(total / (t1 - t0), 2)}


def _cpu_at(samples: list, when: float) -> float | None:
    """CPU seconds at `when`, linearly interpolated between the samples around it
    (a process that had exited by then keeps its last value)."""
    if not samples or when < samples[0][0]:
        return None
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if ta <= when <= tb:
            return ca + (cb - ca) * (when - ta) / max(tb - ta, 1e-9)
    return samples[-1][1]


def _describe_cluster(workers: int, ps: int) -> str:
    if not workers and not ps:
        return "none (single node)"
    if ps:
        return f"chief + {workers} worker + {ps} ps (ParameterServerStrategy)"
    return f"chief + {workers} worker (MultiWorkerMirroredStrategy)"


class TempJobDir:
    """A throwaway local job dir, removed on exit."""

    def __enter__(self) -> str:
        self.path = tempfile.mkdtemp(prefix="mljob-bench-job-")
        return self.path

    def __exit__(self, *exc) -> None:
        import shutil
        shutil.rmtree(self.path, ignore_errors=True)
