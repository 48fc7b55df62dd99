"""The default jobs' speed before and after a change, side by side in one run.

    python -m bench.before_after --before 7f0b5f8            # CNN and MLP, one node and ps
    python -m bench.before_after --before main --repeats 3 --steps 400

The `--before` commit is checked out into a temporary worktree; each repeat then runs,
one after the other, every job below from that tree and from this one (a fresh process
each, interleaved so that the machine's load falls on both alike), and the record gives
each job's examples/s after warm-up and the ratio after / before of their medians.

| job | what runs |
|---|---|
| cnn single | `trainer.task --model cnn`, one node (the fused Adam path) |
| mlp single | `trainer.task --model mlp`, one node |
| mlp ps | `trainer.task --model mlp`, chief + 2 workers + 1 ps (local steps, the default) |
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile

from bench import common

BATCH = 100
JOBS = {"cnn single": ("cnn", 0, 0), "mlp single": ("mlp", 0, 0), "mlp ps": ("mlp", 2, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.before_after")
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", default=",".join(JOBS))
    parser.add_argument("--name", default="before_after")
    args = parser.parse_args()
    jobs = [j.strip() for j in args.only.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        parser.error(f"unknown job {unknown[0]!r}; choose from {', '.join(JOBS)}")
    before = tempfile.mkdtemp(prefix="mljob-before-")
    subprocess.run(["git", "-C", common.ROOT, "worktree", "add", "--detach", before,
                    args.before], check=True, capture_output=True)
    load = common.load_average()
    runs: dict = {f"{job} {side}": [] for job in jobs for side in ("before", "after")}
    try:
        for _ in range(args.repeats):
            for job in jobs:
                model, workers, ps = JOBS[job]
                for side, tree in (("before", before), ("after", common.ROOT)):
                    job_dir = tempfile.mkdtemp(prefix="mljob-bench-")
                    try:
                        record = common.measure(
                            f"{job} {side}", common.trainer_args(model, args.steps, 50,
                                                                 BATCH, job_dir),
                            batch_size=BATCH, workers=workers, ps=ps,
                            kind="ps" if ps else "single",
                            env={common.TREE_ENV: tree})
                    finally:
                        shutil.rmtree(job_dir, ignore_errors=True)
                    runs[f"{job} {side}"].append(record)
    finally:
        subprocess.run(["git", "-C", common.ROOT, "worktree", "remove", "--force", before],
                       capture_output=True)
        shutil.rmtree(before, ignore_errors=True)
    summary = {}
    for job in jobs:
        speeds = {side: common.median([r.get("examples_per_s", 0.0)
                                       for r in runs[f"{job} {side}"]])
                  for side in ("before", "after")}
        summary[job] = {**speeds, "after_over_before": round(
            speeds["after"] / speeds["before"], 3) if speeds["before"] else None}
        print(f"{job}: before {speeds['before']:.0f} examples/s, after "
              f"{speeds['after']:.0f}: {summary[job]['after_over_before']}x", flush=True)
    common.write_json(args.name, {"before": args.before, "steps": args.steps,
                                  "repeats": args.repeats, "summary": summary,
                                  "runs": runs, "machine": common.machine()},
                      load_before=load)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
