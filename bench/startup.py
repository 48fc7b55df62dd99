"""Time from `python -m submit` to the chief's first training step, BASIC and STANDARD_1,
with a cold package environment (a fresh MLJOB_HOME: the sdist is extracted) and a warm
one (the same package again: the environment is reused).

    python bench/startup.py [--train-steps 20] [--repeats 1]

Writes bench/results/startup.json. Each phase is taken from the launcher's own output:
`submitted` (sdist built, hashed and staged), `environment_ready` (package environment
extracted or reused), `first_step` (the chief's first `step` line), `total` (the command
returned). The machine's load average is recorded before and after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "startup.json")


def snapshot(dest: str) -> str:
    """A frozen copy of the source tree: others editing the tree would change the
    package hash between the cold and the warm run, and make both cold."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", "jobs", "__pycache__", "*.egg-info", "results", ".pytest_cache"))
    return dest


def run_job(job_id: str, tier: str, home: str, job_dir: str, steps: int,
            package_path: str) -> dict:
    env = {**os.environ, "MLJOB_HOME": home, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": ROOT}
    start = time.monotonic()
    marks: dict[str, float] = {}
    state = sha = None
    proc = subprocess.Popen(
        [sys.executable, "-m", "submit", job_id, "--scale-tier", tier, "--job-dir",
         job_dir, "--package-path", package_path, "--", "--model", "mlp",
         "--train-steps", str(steps)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        for line in proc.stdout:
            now = time.monotonic() - start
            if "submitted successfully" in line:
                marks.setdefault("submitted", now)
            elif line.startswith("package environment"):
                marks.setdefault("environment_ready", now)
                state, sha = line.split()[-1], line.split()[2]
            elif "\tmaster-replica-0\tstep " in line:
                marks.setdefault("first_step", now)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:  # interrupted: cancel the job as Ctrl-C would
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    marks["total"] = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{job_id} failed with status {proc.returncode}")
    return {"package_environment": state, "package_sha256": sha, **{k: round(v, 2) for k, v in marks.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    results = []
    source = snapshot(os.path.join(tempfile.mkdtemp(prefix="mljob-bench-src-"), "src"))
    for tier in ("BASIC", "STANDARD_1"):
        for repeat in range(args.repeats):
            work = tempfile.mkdtemp(prefix="mljob-bench-")
            try:
                home = os.path.join(work, "home")
                for phase in ("cold", "warm"):
                    job_id = f"bench_{tier.lower()}_{phase}_{repeat}"
                    load = os.getloadavg()[0]
                    marks = run_job(job_id, tier, home, os.path.join(work, job_id),
                                    args.train_steps, source)
                    entry = {"tier": tier, "phase": phase, "repeat": repeat,
                             "load_before": round(load, 2),
                             "load_after": round(os.getloadavg()[0], 2), **marks}
                    print(json.dumps(entry), flush=True)
                    results.append(entry)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(os.path.dirname(source), ignore_errors=True)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"what": "seconds from `python -m submit` to milestones of the job",
                   "train_steps": args.train_steps, "cpus": os.cpu_count(),
                   "python": platform.python_version(), "results": results}, f, indent=2)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
