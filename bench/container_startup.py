"""Start-up of one job as processes and as containers, side by side (bench/README.md,
section 13): a master, a worker and a ps (n1-standard-1 each), the MLP for 200 steps,
submitted with `python -m submit` and run to SUCCEEDED, alternating which runs first.
For each run: the seconds from submission to RUNNING, to the chief's first step, and to
the end, read from the job's service and chief logs. The containers run IMAGE (built by
`submit.runners.images.package_image` on `localhost/mljob-base`); the processes the
staged package in its environment (built by the first run, reused after).

    python bench/container_startup.py IMAGE [--repeats 3] [--json results/x.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--model", "mlp", "--seed", "1", "--train-steps", "200", "--checkpoint-every", "0",
         "--eval-every", "0", "--log-every", "100"]
ONE = "n1-standard-1"


def config(image: str | None) -> dict:
    ti: dict = {"scaleTier": "CUSTOM", "masterType": ONE, "workerType": ONE,
                "parameterServerType": ONE, "workerCount": 1, "parameterServerCount": 1}
    if image:
        command = {"containerCommand": ["python", "-m", "trainer.task"]}
        ti.update(masterConfig={**command, "imageUri": image}, workerConfig=command,
                  parameterServerConfig=command)
    return {"trainingInput": ti}


def stamp(path: str, text: str) -> float:
    with open(path, errors="replace") as f:
        for line in f:
            if text in line:
                when = line.split("\t")[1]
                return datetime.strptime(when, "%Y-%m-%d %H:%M:%S %z").timestamp()
    raise ValueError(f"{text!r} not in {path}")


def one(kind: str, image: str | None, n: int, work: str, env: dict) -> dict:
    job = f"bench_{kind}_{n}"
    path = os.path.join(work, f"{kind}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config(image), f)
    job_dir = os.path.join(work, job)
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "submit", job, "--config", path,
                           "--job-dir", job_dir, "--", *TRAIN], env=env, cwd=work,
                          capture_output=True, text=True)
    ended = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    logs = os.path.join(job_dir, "logs")
    return {"kind": kind, "run": n,
            "running_s": round(stamp(os.path.join(logs, "service.log"), "job RUNNING")
                               - started, 1),
            "first_step_s": round(stamp(os.path.join(logs, "master-replica-0.log"),
                                        "\tstep 1/") - started, 1),
            "total_s": round(ended - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("image")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="container-bench-") as work:
        env = {**os.environ, "MLJOB_HOME": os.path.join(work, "home"),
               "PYTHONPATH": ROOT}
        for n in range(opts.repeats):
            order = [("processes", None), ("containers", opts.image)]
            for kind, image in order if n % 2 == 0 else order[::-1]:
                rows.append(one(kind, image, n, work, env))
                print(json.dumps(rows[-1]), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"image": opts.image, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
