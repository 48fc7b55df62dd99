"""A tuning study on `--runner ray` against the same study on `--runner local`, side by
side in one run: a grid of `--trials` points of a tiny user trainer (it reports two
metrics 1 s apart, so a trial's own work is ~2-3 s), `--parallel` trials at once, one
n1-standard-1 replica per trial, on a Ray head started here (`ray start --head`, 3
logical CPUs, stopped by PID); the runners alternate, `--repeats` times each.

    python -m bench.ray_tuning                 # 4 trials, 2 at a time, 2 repeats

Measured per study: its wall time (the submit command's start to its end), and per
trial the overhead around the trainer's own work: the trial's endTime - startTime in
the record's trainingOutput (whole seconds) minus the trainer's own running time (it
writes its start and end). On Ray a trial's overhead is its Ray job's: the working dir's
upload, the driver's start in the job's pip environment (built once per node for the
study's archives, then reused), the placement group and the actor, then the log
followed once a second. The first study of each runner pays its package environment's
build; the median of the later ones is reported apart.

Writes bench/results/ray_tuning.json.
"""
from __future__ import annotations

import argparse
import calendar
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

from bench import common
from tests.support.ray_cluster import head
from tests.support.submit_cli import write_package

TASK = """import argparse, json, os, time
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=int, default=0)
parser.add_argument("--job-dir")
args, _ = parser.parse_known_args()
started = time.time()
path, tag = os.environ["CLOUD_ML_HP_METRIC_FILE"], os.environ["CLOUD_ML_HP_METRIC_TAG"]
os.makedirs(os.path.dirname(path), exist_ok=True)
for step in (1, 2):
    time.sleep(1.0)
    with open(path, "a") as f:
        f.write(json.dumps({"global_step": str(step), tag: str(-abs(args.x - 2) + step),
                            "timestamp": time.time()}) + "\\n")
os.makedirs(args.job_dir, exist_ok=True)
with open(os.path.join(args.job_dir, "ran.json"), "w") as f:
    json.dump({"started": started, "ended": time.time()}, f)
"""


def config(folder: str, trials: int, parallel: int) -> str:
    path = os.path.join(folder, "hptuning.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"trainingInput": {
            "scaleTier": "CUSTOM", "masterType": "n1-standard-1", "hyperparameters": {
                "goal": "MAXIMIZE", "hyperparameterMetricTag": "score",
                "algorithm": "GRID_SEARCH", "maxTrials": trials,
                "maxParallelTrials": parallel,
                "params": [{"parameterName": "x", "type": "INTEGER", "minValue": 1,
                            "maxValue": trials}]}}}, f)
    return path


def _seconds(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def study(runner: str, job_id: str, folder: str, package: str, hp: str,
          dashboard: str, timeout: float) -> dict:
    job_dir = os.path.join(folder, job_id)
    args = [sys.executable, "-m", "submit", job_id, "--runner", runner, "--config", hp,
            "--job-dir", job_dir, "--package-path", package,
            "--module-name", "fakejob.task"]
    if runner == "ray":
        args += ["--ray-address", dashboard]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=common.ROOT, start_new_session=True)
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        common.stop_process(proc)
        raise
    wall = time.monotonic() - started
    from submit import jobs
    record = jobs.load(job_id)
    overheads = []
    for trial in record.training_output.get("trials", []):
        with open(os.path.join(job_dir, trial["trialId"], "ran.json")) as f:
            ran = json.load(f)
        span = _seconds(trial["endTime"]) - _seconds(trial["startTime"])
        overheads.append(round(span - (ran["ended"] - ran["started"]), 1))
    return {"runner": runner, "job_id": job_id, "exit": status, "state": record.state,
            "wall_s": round(wall, 1), "trials": len(overheads),
            "trial_overhead_s": overheads}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for runner in ("local", "ray"):
        mine = [r for r in runs if r["runner"] == runner]
        later = mine[1:] or mine
        out[runner] = {
            "first_study_wall_s": mine[0]["wall_s"],
            "study_wall_s_median_later": common.median([r["wall_s"] for r in later]),
            "trial_overhead_s_median_later": common.median(
                [o for r in later for o in r["trial_overhead_s"]])}
    out["ray_over_local_wall"] = round(out["ray"]["study_wall_s_median_later"] /
                                       out["local"]["study_wall_s_median_later"], 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ray_tuning", allow_abbrev=False)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)
    load_before = common.load_average()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mljob-bench-raytune-") as folder:
        os.environ["MLJOB_HOME"] = os.path.join(folder, "home")
        package = write_package(os.path.join(folder, "pkg"), TASK)
        hp = config(folder, args.trials, args.parallel)
        with head(os.path.join(folder, "ray"), num_cpus=3) as node:
            assert node.dashboard is not None
            for repeat in range(args.repeats):
                for runner in ("local", "ray"):
                    run = study(runner, f"bench_tune_{runner}_{repeat}", folder, package,
                                hp, node.dashboard, args.timeout)
                    print(run, flush=True)
                    runs.append(run)
    summary = summarize(runs)
    print(yaml.safe_dump(summary, sort_keys=False))
    common.write_json("ray_tuning", {"trials": args.trials, "parallel": args.parallel,
                                     "runs": runs, "summary": summary}, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
