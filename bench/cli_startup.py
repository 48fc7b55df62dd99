"""The command line's start-up: `python -m submit --help` and `python -m submit jobs list`
timed in this tree and in another checkout of mljob (the layout before), side by side.

    python bench/cli_startup.py --before DIR [--repeats 10] [--jobs 50]

Each repeat runs every command once in each tree, the trees alternating (which goes first
alternates too), so a change in the machine's load falls on both. Both trees read one
MLJOB_HOME holding `--jobs` finished job records (written once with this tree's records),
so `jobs list` reads and summarises real records. Reports per command and tree the median
and the lowest wall seconds, the modules the command imported, and the ratio before /
after of the medians; writes bench/results/cli_startup.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {"help": ["--help"], "jobs list": ["jobs", "list"]}
# prints how many modules the command imported and which of these heavy ones
PROBE = ("import runpy, sys\n"
         "sys.argv = ['submit'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('submit', run_name='__main__')\n"
         "except SystemExit:\n    pass\n"
         "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
         "{'pydantic', 'numpy', 'tensorflow', 'yaml', 'fsspec', 'psutil'})\n"
         "print('PROBE', len(sys.modules), ','.join(heavy), file=sys.stderr)\n")


def fill_home(home: str, jobs: int) -> None:
    sys.path.insert(0, ROOT)
    os.environ["MLJOB_HOME"] = home
    from submit import jobs as records
    for i in range(jobs):
        records.save(records.JobRecord(job_id=f"bench_{i:04d}", state="SUCCEEDED",
                                       create_time=time.time() - i, end_time=time.time()))


def run(tree: str, args: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "submit", *args], cwd=tree, check=True,
                   env={**env, "PYTHONPATH": tree}, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def probe(tree: str, args: list[str], env: dict) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tree, check=True,
                         env={**env, "PYTHONPATH": tree}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True).stderr
    line = [x for x in out.splitlines() if x.startswith("PROBE")][-1].split(" ")
    return int(line[1]), line[2] if len(line) > 2 else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a checkout of the layout before")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before), "after": ROOT}
    home = tempfile.mkdtemp(prefix="mljob-cli-bench-")
    try:
        fill_home(home, args.jobs)
        env = {**os.environ, "MLJOB_HOME": home}
        times: dict[str, dict[str, list[float]]] = {c: {t: [] for t in trees}
                                                    for c in COMMANDS}
        for r in range(args.repeats):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for command, argv in COMMANDS.items():
                for tree in order:
                    times[command][tree].append(run(trees[tree], argv, env))
        load = os.getloadavg()
        result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                    "platform": platform.platform(), "load_after": load},
                        "repeats": args.repeats, "jobs": args.jobs, "commands": {}}
        for command, argv in COMMANDS.items():
            row = {}
            for tree in trees:
                modules, heavy = probe(trees[tree], argv, env)
                row[tree] = {"median_s": round(statistics.median(times[command][tree]), 3),
                             "min_s": round(min(times[command][tree]), 3),
                             "all_s": [round(x, 3) for x in times[command][tree]],
                             "modules": modules, "heavy": heavy}
            row["ratio_before_after"] = round(row["before"]["median_s"]
                                              / row["after"]["median_s"], 2)
            result["commands"][command] = row
            print(f"{command:10s} before {row['before']['median_s']:.2f} s "
                  f"(min {row['before']['min_s']:.2f}, {row['before']['modules']} modules, "
                  f"{row['before']['heavy']})  after {row['after']['median_s']:.2f} s "
                  f"(min {row['after']['min_s']:.2f}, {row['after']['modules']} modules, "
                  f"{row['after']['heavy']})  ratio {row['ratio_before_after']}x")
        print(f"load average after: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
        os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "results", "cli_startup.json"), "w") as f:
            json.dump(result, f, indent=1)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
