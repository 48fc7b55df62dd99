"""Seconds before training: from `python -m submit` to the chief's first training step,
phase by phase, with the start-up shortcuts on and off side by side in one run.

    python bench/startup.py [--train-steps 20] [--repeats 1] [--setups single,ps]
    python bench/startup.py --setups tuning --compare prestart [--repeats 2]

Each job runs with MLJOB_STARTUP_MARKS=1, so the launcher and every replica print
`startup PHASE TIME` lines (`mljob.startup`), and alternately with the start-up
shortcuts on (the defaults: an unchanged package's sdist is reused, `submit.packaging.sdist_cache`;
servers import TensorFlow without Keras and serve before the trainer loads its model and
data; training replicas leave IPython and matplotlib out) and off (MLJOB_QUICK_START=0
and MLJOB_SDIST_CACHE=0: as before them). The package environment is built once first
(`cold`, reported), then reused by every measured job. Setups: `single` (BASIC),
`standard_1` (STANDARD_1: chief + 4 workers + 3 ps, goal: the floor times its 8
replicas over the cores), `ps` (CUSTOM: chief + 2 workers + 1 ps), `tuning` (BASIC, 3
trials one at a time) and `tuning_ps` (the same trials, each a CUSTOM cluster as `ps`).
`--compare prestart` turns a tuning job's processes started ahead off and on instead
(MLJOB_PRESTART; `submit.local.prestart`), the shortcuts on both ways: per trial after
the first, the seconds from the tuner's previous trial's last line to this trial's
process (`gap_before`) and from that process becoming the trial's to its first step.
Phases, in seconds, each from the end of the one before:

- cli: interpreter start and the CLI's imports, to the submit command running
- spec, package (sdist built and hashed), plan, stage: the launcher's steps
- environment: the package environment checked (reused), as the launcher times it
- process: the job recorded, PREPARING, replica processes started (to the chief's exec)
- python: the chief's interpreter and `trainer.task`'s imports, to its main()
- tensorflow: the chief's import of TensorFlow, Keras and the trainer's modules
- data: the dataset loaded; peers: waiting for the ps and workers to listen
- strategy: the strategy built and connected; model: the model and optimizer built
- input: restore and the input pipelines (under ps, each worker's dataset made)
- traced: the first chunk of steps traced (under ps, scheduled)
- first_step: the first chunk's run (compilation, a worker's set-up) to its step line

plus each server's seconds from its process start to its import of TensorFlow and to
its server listening, the CPU seconds of the whole job (the supervisor's children), and,
the figures to compare on a shared machine where wall times move with the load, the CPU
seconds the launcher spent to its `staged` mark and the chief (each trial's chief) spent
from its process start to its first step.

Before each repeat, the floor: one process that imports TensorFlow and Keras and builds
the model, timed from its start (`floor_s`; goal for BASIC: to its first step within
1.5x that).

Writes bench/results/startup.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "startup.json")
TUNING = """trainingInput:
  scaleTier: BASIC
  hyperparameters:
    goal: MAXIMIZE
    hyperparameterMetricTag: accuracy
    maxTrials: 3
    maxParallelTrials: 1
    params:
    - parameterName: learning_rate
      type: DOUBLE
      minValue: 0.0001
      maxValue: 0.01
      scaleType: UNIT_LOG_SCALE
"""
TUNING_PS = TUNING.replace("scaleTier: BASIC", "scaleTier: CUSTOM\n  masterType: standard\n"
                           "  workerType: standard\n  parameterServerType: standard\n"
                           "  workerCount: 2\n  parameterServerCount: 1")
SETUPS = {"single": ["--scale-tier", "BASIC"], "standard_1": ["--scale-tier", "STANDARD_1"],
          "tuning": ["--config", "tuning.yaml"],
          "tuning_ps": ["--config", "tuning_ps.yaml"],
          "ps": ["--scale-tier", "CUSTOM", "--master-machine-type", "standard",
                 "--worker-count", "2", "--parameter-server-count", "1"]}
# the goal for each setup's start over the floor: BASIC 1.5x; a cluster no more than
# the imports its replicas must do on the cores there are
REPLICAS = {"single": 1, "standard_1": 8, "ps": 4}
CHIEF_PHASES = ("cli", "spec", "package", "plan", "staged", "environment", "process",
                "main", "tensorflow", "data", "peers", "strategy", "model", "input", "traced",
                "first_step")
NAMES = {"staged": "stage", "main": "python"}


def snapshot(dest: str) -> str:
    """A frozen copy of the source tree: others editing the tree would change the
    package hash between runs, and make every run cold."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", "jobs", "__pycache__", "*.egg-info", "results", ".pytest_cache"))
    return dest


def _chief_cpu(pid: int) -> float | None:
    """CPU seconds of the running chief (or master) replica under the launcher `pid`."""
    try:
        import psutil
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if "trainer.task" not in " ".join(child.cmdline()):
                    continue
                task = json.loads(child.environ().get("TF_CONFIG") or "{}").get("task", {})
                if task.get("type", "master") in ("master", "chief"):
                    times = child.cpu_times()
                    return round(times.user + times.system, 2)
            except (psutil.Error, ValueError):
                continue
    except Exception:  # a measurement aid
        return None
    return None


def _cpu_of(pid: int | None) -> float | None:
    """CPU seconds of the process `pid` (a pre-started one's import included)."""
    try:
        import psutil
        times = psutil.Process(pid).cpu_times()
        return round(times.user + times.system, 2)
    except Exception:  # a measurement aid
        return None


def _own_cpu(pid: int) -> float | None:
    """CPU seconds of the launcher and of the children it waited for (the sdist build)."""
    try:
        import psutil
        times = psutil.Process(pid).cpu_times()
        return round(times.user + times.system + times.children_user
                     + times.children_system, 2)
    except Exception:
        return None


def run_job(job_id: str, setup: str, quick: bool, home: str, job_dir: str, steps: int,
            source: str, compare: str = "quick") -> dict:
    """One job; `quick` is the compared shortcuts on or off: the start-up shortcuts
    (compare="quick") or the tuning trials' processes started ahead ("prestart")."""
    env = {**os.environ, "MLJOB_HOME": home, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": source, "MLJOB_STARTUP_MARKS": "1", "PYTHONUNBUFFERED": "1",
           "MLJOB_QUICK_START": "1" if quick or compare != "quick" else "0",
           "MLJOB_PRESTART": "1" if quick or compare != "prestart" else "0"}
    if not quick and compare == "quick":
        env["MLJOB_SDIST_CACHE"] = "0"  # every submit builds its sdist, as before the cache
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    marks: dict[str, float] = {}
    servers: dict[str, dict[str, float]] = {}
    trials: dict[str, dict[str, float]] = {}  # a tuning job's trials: their chiefs' marks
    trial_pids: dict[str, int] = {}  # from the trials' `... started (pid N` events
    env_state, env_seconds = None, 0.0
    cpu: dict[str, float | None] = {}
    proc = subprocess.Popen(
        [sys.executable, "-m", "submit", job_id, *SETUPS[setup], "--job-dir", job_dir,
         "--package-path", source, "--", "--model", "mlp", "--train-steps", str(steps)],
        cwd=source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            fields = line.rstrip("\n").split("\t")
            label, text = (fields[2], fields[3]) if len(fields) >= 4 else ("cli", line)
            words = text.split()
            trial, _, replica = label.rpartition("/")
            if trial.isascii() and trial.isdecimal() and replica == "master-replica-0":
                mine = trials.setdefault(trial, {})
                mine["last_line"] = now
                if words[:1] == ["startup"] and len(words) == 3:
                    mine.setdefault(words[1], float(words[2]))
                elif text.startswith("step ") and "first_step" not in mine:
                    mine["first_step"] = now
                    mine["cpu"] = _cpu_of(trial_pids.get(trial))  # type: ignore[assignment]
                continue
            started = re.match(r"([0-9]+)/master-replica-0 started \(pid ([0-9]+)", text)
            if started:
                trial_pids[started.group(1)] = int(started.group(2))
            if words[:1] == ["startup"] and len(words) == 3:
                if label == "cli":  # its own process start is the run's start
                    if words[1] != "process":
                        marks.setdefault(words[1], float(words[2]))
                    if words[1] == "staged":
                        cpu["launcher_to_staged"] = _own_cpu(proc.pid)
                elif label.startswith("master-replica-0"):
                    marks.setdefault(words[1], float(words[2]))
                else:
                    servers.setdefault(label, {}).setdefault(words[1], float(words[2]))
            elif label == "service" and text.startswith("package environment") and \
                    (" reused " in text or " created " in text):
                # "... reused in 0.1 s": its own duration (service lines come in batches)
                env_seconds = float(words[-2])
                env_state = "reused" if " reused " in text else "created"
            elif label == "master-replica-0" and text.startswith("step ") and \
                    "first_step" not in marks:
                marks["first_step"] = now
                cpu["chief_to_first_step"] = _chief_cpu(proc.pid)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:  # interrupted: cancel the job (SIGINT may be ignored)
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    total = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{job_id} failed with status {proc.returncode}")
    if "staged" in marks:  # the record saved and the environment checked after staging
        marks["environment"] = marks["staged"] + env_seconds
    phases, last = {}, start
    for name in CHIEF_PHASES:
        if name in marks:
            phases[NAMES.get(name, name)] = round(marks[name] - last, 3)
            last = marks[name]
    server_times = {label: {"tensorflow": round(m["tensorflow"] - m["process"], 3),
                            "listening": round(m["server"] - m["process"], 3)}
                    for label, m in sorted(servers.items())
                    if {"process", "tensorflow", "server"} <= set(m)}
    if trials:  # the first trial's chief stands for the job's
        marks.update({k: v for k, v in trials[min(trials, key=int)].items()
                      if k not in ("last_line", "cpu")})
        cpu["chief_to_first_step"] = trials[min(trials, key=int)].get("cpu")
    return {"setup": setup, "quick_start": quick, "compare": compare,
            "environment": env_state,
            "trials": trial_phases(trials),
            "to_first_step_s": round(marks.get("first_step", start) - start, 3),
            "phases_s": phases, "servers_s": server_times, "cpu_s": cpu,
            "marks": {k: round(v - start, 3) for k, v in marks.items()},
            "job_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime
                               - before.ru_stime, 2),
            "total_s": round(total, 2)}


FLOOR = """import time
start = float(__import__("sys").argv[1])
import tensorflow as tf, keras
from trainer import model
model.build("mlp", seed=1)
wall = time.time() - start
import resource
used = resource.getrusage(resource.RUSAGE_SELF)
print(round(wall, 3), round(used.ru_utime + used.ru_stime, 3))
"""


def floor_s(source: str) -> tuple[float, float]:
    """The floor a BASIC job's start is measured against: (wall seconds, CPU seconds)
    from starting one process that imports TensorFlow and Keras and builds the job's
    model (the MLP) to the model built, on the same machine in the same run (what the
    chief cannot avoid; its CPU seconds compare with the chief's to its first step)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": source}
    done = subprocess.run([sys.executable, "-c", FLOOR, repr(time.time())], cwd=source,
                          env=env, capture_output=True, text=True, timeout=600, check=True)
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def trial_phases(trials: dict[str, dict[str, float]]) -> list[dict]:
    """Per trial: the tuner's gap (the previous trial's last line to this trial's chief
    process), and the chief's seconds from its process start to its first step."""
    out, previous_end = [], None
    for trial in sorted(trials, key=int):
        m = trials[trial]
        if not {"process", "first_step"} <= set(m):
            continue
        phases, last = {}, m["process"]
        for name in ("main", "tensorflow", "data", "model", "first_step"):
            if name in m:
                phases[NAMES.get(name, name)] = round(m[name] - last, 3)
                last = m[name]
        out.append({"trial": trial, "to_first_step_s": round(m["first_step"] - m["process"],
                                                             3),
                    "chief_cpu_s": m.get("cpu"),
                    "gap_before_s": None if previous_end is None else
                    round(m["process"] - previous_end, 3), "phases_s": phases})
        previous_end = m["last_line"]
    return out


def _over(value: float | None, floor: float | None) -> float | None:
    return round(value / floor, 2) if value is not None and floor else None


def _mean(values) -> float | None:
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 2) if got else None


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # stopped by PID: cancel the running job
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--setups", default="single,ps")
    parser.add_argument("--compare", choices=("quick", "prestart"), default="quick",
                        help="what is off and on: the start-up shortcuts (MLJOB_QUICK_START, "
                             "MLJOB_SDIST_CACHE) or a tuning job's processes started ahead "
                             "(MLJOB_PRESTART; use with --setups tuning)")
    parser.add_argument("--out", default=OUT, help="the results file")
    args = parser.parse_args()
    results = []
    load_start = round(os.getloadavg()[0], 2)
    work = tempfile.mkdtemp(prefix="mljob-bench-")
    source = snapshot(os.path.join(work, "src"))
    for name, text in (("tuning.yaml", TUNING), ("tuning_ps.yaml", TUNING_PS)):
        with open(os.path.join(source, name), "w") as f:
            f.write(text)
    home = os.path.join(work, "home")
    try:
        n = 0
        cold = run_job("bench_cold", "single", True, home, os.path.join(work, "cold"),
                       args.train_steps, source)
        cold["phase"] = "cold"
        print(json.dumps(cold), flush=True)
        results.append(cold)
        for repeat in range(args.repeats):
            load = os.getloadavg()[0]
            wall, cpu_s = floor_s(source)
            floor = {"phase": "floor", "repeat": repeat, "to_model_built_s": wall,
                     "cpu_s": cpu_s, "load_before": round(load, 2)}
            print(json.dumps(floor), flush=True)
            results.append(floor)
            for setup in args.setups.split(","):
                order = (False, True) if repeat % 2 == 0 else (True, False)
                for quick in order:
                    n += 1
                    load = os.getloadavg()[0]
                    entry = run_job(f"bench_{setup}_{n}", setup, quick, home,
                                    os.path.join(work, f"j{n}"), args.train_steps, source,
                                    args.compare)
                    entry.update(phase="warm", repeat=repeat, load_before=round(load, 2),
                                 load_after=round(os.getloadavg()[0], 2))
                    print(json.dumps(entry), flush=True)
                    results.append(entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    floors = [r["to_model_built_s"] for r in results if r.get("phase") == "floor"]
    floor_cpu = [r["cpu_s"] for r in results if r.get("phase") == "floor"]
    summary: dict = {"floor: import TensorFlow and Keras, build the model":
                     {"to_model_built_s": _mean(floors), "each": floors,
                      "cpu_s": _mean(floor_cpu), "each_cpu_s": floor_cpu}}
    for setup in args.setups.split(","):
        for quick in (False, True):
            runs = [r for r in results if r.get("phase") == "warm" and r["setup"] == setup
                    and r["quick_start"] == quick]
            if runs:
                later = [t for r in runs for t in r["trials"] if t["trial"] != "1"]
                summary[f"{setup} {args.compare}={int(quick)}"] = {
                    "to_first_step_s": _mean(r["to_first_step_s"] for r in runs),
                    "package_s": _mean(r["phases_s"].get("package", 0) for r in runs),
                    "launcher_cpu_to_staged_s": _mean(
                        r["cpu_s"].get("launcher_to_staged") for r in runs),
                    "chief_cpu_to_first_step_s": _mean(
                        r["cpu_s"].get("chief_to_first_step") for r in runs),
                    "trial_to_first_step_s": _mean(
                        t["to_first_step_s"] for r in runs for t in r["trials"]),
                    "trial_chief_cpu_s": _mean(
                        t["chief_cpu_s"] for r in runs for t in r["trials"]),
                    # the trials a process started ahead can serve (not the first)
                    "later_trials_to_first_step_s": _mean(t["to_first_step_s"] for t in later),
                    "later_trials_gap_before_s": _mean(t["gap_before_s"] for t in later),
                    "goal_over_the_floor": 1.5 if REPLICAS.get(setup) == 1 else
                    round(REPLICAS[setup] / (os.cpu_count() or 1), 2)
                    if setup in REPLICAS else None,
                    "to_first_step_over_the_floor": _over(
                        _mean(r["to_first_step_s"] for r in runs), _mean(floors)),
                    "chief_cpu_over_the_floors": _over(_mean(
                        r["cpu_s"].get("chief_to_first_step") for r in runs),
                        _mean(floor_cpu)),
                    "total_s": _mean(r["total_s"] for r in runs),
                    "job_cpu_s": _mean(r["job_cpu_s"] for r in runs),
                    "load": [min(r["load_before"] for r in runs),
                             max(r["load_after"] for r in runs)]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"what": "seconds from `python -m submit` to the chief's first step, by "
                           f"phase, {args.compare} off and on side by side",
                   "quick_start": "1: the shortcuts on (the defaults); 0: "
                                  "MLJOB_QUICK_START=0 and MLJOB_SDIST_CACHE=0",
                   "prestart": "1: a tuning job's next trial in processes started ahead "
                               "(the default); 0: MLJOB_PRESTART=0",
                   "compare": args.compare,
                   "load_average": [load_start, round(os.getloadavg()[0], 2)],
                   "train_steps": args.train_steps, "cpus": os.cpu_count(),
                   "python": platform.python_version(), "summary": summary,
                   "results": results}, f, indent=2)
    print(json.dumps(summary, indent=2))
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
