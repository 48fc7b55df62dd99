"""Training speed of one job as processes and as containers, side by side (bench/README.md,
section 14): a master, a worker and a ps (n1-standard-1 each), the MLP (or the CNN) for
STEPS steps, submitted with `python -m submit` and run to SUCCEEDED, alternating which
runs first,
while LOAD busy processes of this machine's own (one thread each, each in a session of
its own as other users' and tests' processes are, so that the kernel's autogroups weigh
them as such; started and stopped here by PID) compete for its cores as other work on a
shared machine does. For each run: the chief's examples per second (the median of its
step lines after the first), the seconds from submission to the first step and to the
end, and how each stopped replica ended. The containers run IMAGE
(`submit.runners.images.package_image` on `localhost/mljob-base`).

    python bench/container_speed.py IMAGE [--repeats 2] [--load 4] [--steps 3000]
        [--model mlp|cnn] [--before TREE] [--together] [--json results/x.json]

`--together` starts each repeat's jobs at the same moment, so that they share the cores
under the same load (a replica process's scheduling weight against a container's is
then what decides). `--before TREE` adds a third kind: the containers as another source
tree of mljob runs them (`PYTHONPATH=TREE`: a checkout of an earlier commit), side by
side in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

from bench.common import STEP_LINE
from bench.container_startup import config, stamp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY = "while True: pass"


def train(steps: int, model: str = "mlp") -> list[str]:
    return ["--model", model, "--seed", "1", "--train-steps", str(steps),
            "--checkpoint-every", "0", "--eval-every", "0",
            "--log-every", str(max(10, steps // 8))]


def rates(log: str) -> list[float]:
    """examples/s of each of the chief's step lines."""
    found = []
    with open(log, errors="replace") as f:
        for line in f:
            match = STEP_LINE.match(line.rstrip("\n").split("\t")[-1])
            if match:
                found.append(float(match[5]))
    return found


def start(kind: str, image: str | None, n: int, steps: int, work: str, env: dict,
          model: str = "mlp") -> dict:
    """Submit one job (`python -m submit`, followed to its end) without waiting."""
    job = f"speed_{kind.replace('-', '_')}_{n}"
    path = os.path.join(work, f"{kind}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config(image), f)
    job_dir = os.path.join(work, job)
    proc = subprocess.Popen([sys.executable, "-m", "submit", job, "--config", path,
                             "--job-dir", job_dir, "--", *train(steps, model)], env=env,
                            cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return {"kind": kind, "run": n, "proc": proc, "job_dir": job_dir,
            "started": time.time()}


def finish(run: dict) -> dict:
    """Wait for a started job; its figures."""
    _, err = run["proc"].communicate()
    ended = time.time()
    assert run["proc"].returncode == 0, err[-2000:]
    logs = os.path.join(run["job_dir"], "logs")
    per_line = rates(os.path.join(logs, "master-replica-0.log"))
    with open(os.path.join(logs, "service.log"), errors="replace") as f:
        service = f.read()
    return {"kind": run["kind"], "run": run["run"],
            "examples_per_s": round(statistics.median(per_line[1:] or per_line), 1),
            "first_step_s": round(stamp(os.path.join(logs, "master-replica-0.log"),
                                        "\tstep 1/") - run["started"], 1),
            "total_s": round(ended - run["started"], 1),
            "stopped": re.findall(r"(\S+-replica-[0-9]+) stopped with status ([0-9]+)",
                                  service)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("image")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--before")
    parser.add_argument("--together", action="store_true",
                        help="start each repeat's jobs at once (they share the cores at "
                             "the same moment) instead of one after the other")
    parser.add_argument("--json")
    opts = parser.parse_args()
    kinds = ["processes", "containers"] + (["containers-before"] if opts.before else [])
    rows = []
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
            for _ in range(opts.load)]
    try:
        with tempfile.TemporaryDirectory(prefix="container-speed-") as work:
            env = {**os.environ, "MLJOB_HOME": os.path.join(work, "home"),
                   "PYTHONPATH": ROOT}
            before = {**env, "PYTHONPATH": os.path.abspath(opts.before or ROOT)}
            for n in range(opts.repeats):
                order = kinds if n % 2 == 0 else kinds[::-1]
                started = []
                for kind in order:
                    started.append(start(kind, None if kind == "processes" else opts.image,
                                         n, opts.steps, work,
                                         before if kind == "containers-before" else env,
                                         opts.model))
                    if not opts.together:
                        rows.append(finish(started.pop()))
                        print(json.dumps(rows[-1]), flush=True)
                for run in started:
                    rows.append(finish(run))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    by_kind = {k: statistics.median(r["examples_per_s"] for r in rows if r["kind"] == k)
               for k in kinds}
    ratio = by_kind["processes"] / by_kind["containers"]
    print("median examples/s: " + ", ".join(f"{k} {v:.0f}" for k, v in by_kind.items())
          + f"; processes/containers {ratio:.2f}x", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"image": opts.image, "load": opts.load, "steps": opts.steps,
                       "model": opts.model,
                       "together": opts.together,
                       "runs": rows, "median_examples_per_s": by_kind,
                       "ratio": round(ratio, 3)}, f, indent=1)


if __name__ == "__main__":
    main()
