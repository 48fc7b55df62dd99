"""Hyperparameter tuning: the Bayesian sampler the local runner uses for
ALGORITHM_UNSPECIFIED (Optuna's TPE, as `submit.local.study.sampler` configures it) against
random search on the same budget, on an objective whose optimum is known.

    python -m bench.tuning                  # 10 seeds, 100 trials each, plus one real job
    python -m bench.tuning --quick          # 3 seeds, 30 trials, a 6-trial real job

The objective is a known function of three parameters shaped like a trainer's, on the
scales a user would give them (learning_rate DOUBLE 1e-5..1 log, dropout DOUBLE 0..0.9,
hidden_units INTEGER 16..1024 log):

    f = 1 - ((log10(lr) + 2.5) / 2.5)^2 - ((dropout - 0.3) / 0.6)^2
          - (log2(hidden_units / 128) / 3)^2 / 2

whose maximum is 1.0 at lr = 10^-2.5, dropout 0.3, 128 units. The figure is the number of
trials each sampler needs to reach within 1% of the optimum (f >= 0.99), median over the
seeds, with trials suggested two at a time as `maxParallelTrials: 2` does (TPE's constant
liar at work). These studies run in process: the samplers are what is compared, and a
trial's cost does not change which points they suggest.

Then one real tuning job through `python -m submit` on the local runner, with a trainer
whose single report is f: the same sampler path end to end, and the launcher's cost per
trial (process start, package environment, the tuner's polling).

Writes bench/results/tuning.json and tuning.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from bench import common

TARGET = 0.99
SPEC = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "objective", "maxTrials": 100,
        "maxParallelTrials": 2,
        "params": [{"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 1e-5,
                    "maxValue": 1.0, "scaleType": "UNIT_LOG_SCALE"},
                   {"parameterName": "dropout", "type": "DOUBLE", "minValue": 0.0,
                    "maxValue": 0.9},
                   {"parameterName": "hidden_units", "type": "INTEGER", "minValue": 16,
                    "maxValue": 1024, "scaleType": "UNIT_LOG_SCALE"}]}

TASK = r'''
import math, sys
import hypertune
a = dict(x[2:].split("=", 1) for x in sys.argv[1:] if x.startswith("--") and "=" in x)
lr, dropout, units = float(a["learning_rate"]), float(a["dropout"]), int(a["hidden_units"])
f = (1 - ((math.log10(lr) + 2.5) / 2.5) ** 2 - ((dropout - 0.3) / 0.6) ** 2
     - (math.log2(units / 128) / 3) ** 2 / 2)
hypertune.HyperTune().report_hyperparameter_tuning_metric("objective", f, global_step=1)
print(f"objective={f}")
'''


def objective(params: dict) -> float:
    return (1 - ((math.log10(params["learning_rate"]) + 2.5) / 2.5) ** 2
            - ((params["dropout"] - 0.3) / 0.6) ** 2
            - (math.log2(params["hidden_units"] / 128) / 3) ** 2 / 2)


def study_curve(algorithm: str, trials: int, seed: int) -> list[float]:
    """Objective values in the order the trials finish, two suggested at a time."""
    import optuna
    from submit.jobdef import tuning_spec
    from submit.local import study as tuning
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = tuning_spec.parse({**SPEC, "maxTrials": trials, "algorithm": algorithm},
                             job_dir="/unused")
    study = optuna.create_study(direction="maximize",
                                sampler=tuning.sampler(spec, seed=seed))
    values = []
    while len(values) < trials:
        batch = [study.ask(tuning.distributions(spec))
                 for _ in range(min(spec.max_parallel_trials, trials - len(values)))]
        for trial in batch:
            params = {p.name: tuning.from_optuna(p, trial.params[p.name])
                      for p in spec.params}
            value = objective(params)
            study.tell(trial, value)
            values.append(value)
    return values


def trials_to_target(values: list[float]) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v >= TARGET), None)


def best_so_far(values: list[float]) -> list[float]:
    out, best = [], -math.inf
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def real_job(trials: int) -> dict:
    """One tuning job through `python -m submit` on the local runner (TPE, 2 at once)."""
    with tempfile.TemporaryDirectory(prefix="mljob-bench-tuning-") as tmp:
        pkg = os.path.join(tmp, "pkg")
        os.makedirs(os.path.join(pkg, "knownobj"))
        with open(os.path.join(pkg, "setup.py"), "w") as f:
            f.write("from setuptools import setup\nsetup(name='knownobj', version='0.1', "
                    "packages=['knownobj'])\n")
        for name, text in (("__init__.py", ""), ("task.py", TASK)):
            with open(os.path.join(pkg, "knownobj", name), "w") as f:
                f.write(text)
        config = os.path.join(tmp, "config.json")
        with open(config, "w") as f:
            json.dump({"trainingInput": {"hyperparameters": {**SPEC, "maxTrials": trials}}},
                      f)
        env = {**os.environ, "MLJOB_HOME": os.path.join(tmp, "home"),
               "PYTHONPATH": common.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, "-m", "submit", "bench_tune", "--config", config,
                   "--job-dir", os.path.join(tmp, "job"), "--package-path", pkg,
                   "--module-name", "knownobj.task"]
        started = time.monotonic()
        out = subprocess.run(command, cwd=common.ROOT, env=env, capture_output=True,
                             text=True, timeout=60 * trials)
        wall = time.monotonic() - started
        if out.returncode != 0:
            raise SystemExit(f"the tuning job failed: {out.stderr[-2000:]}")
        with open(os.path.join(env["MLJOB_HOME"], "jobs", "bench_tune.json")) as f:
            output = json.load(f)["training_output"]
    by_id = sorted(output["trials"], key=lambda t: int(t["trialId"]))
    values = [t["finalMetric"]["objectiveValue"] for t in by_id]
    best = output["trials"][0]
    return {"command": " ".join(command[1:]), "trials": trials, "wall_s": round(wall, 1),
            "s_per_trial": round(wall / trials, 2), "values": values,
            "trials_to_target": trials_to_target(values),
            "best": {"trialId": best["trialId"], "hyperparameters": best["hyperparameters"],
                     "objective": best["finalMetric"]["objectiveValue"]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tuning", allow_abbrev=False)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--job-trials", type=int, default=16,
                   help="trials of the real tuning job (0: skip it)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.trials, args.job_trials = 3, 30, 6
    load_before = common.load_average()
    curves: dict[str, list[list[float]]] = {}
    summary = {}
    for label, algorithm in (("tpe (ALGORITHM_UNSPECIFIED)", "ALGORITHM_UNSPECIFIED"),
                             ("random (RANDOM_SEARCH)", "RANDOM_SEARCH")):
        started = time.monotonic()
        curves[label] = [study_curve(algorithm, args.trials, seed)
                         for seed in range(args.seeds)]
        hits = [trials_to_target(c) for c in curves[label]]
        reached = [h for h in hits if h is not None]
        # a seed that never reached the target counts as budget + 1 in the median
        summary[label] = {
            "trials_to_within_1pct": hits,
            "median_trials_to_within_1pct": common.median(
                [h if h is not None else args.trials + 1 for h in hits]),
            "seeds_reaching_target": f"{len(reached)}/{args.seeds}",
            "median_best_after_budget": round(common.median(
                [max(c) for c in curves[label]]), 5),
            "seconds": round(time.monotonic() - started, 1)}
        print(f"{label}: median trials to within 1% = "
              f"{summary[label]['median_trials_to_within_1pct']} "
              f"({summary[label]['seeds_reaching_target']} seeds reached it)")
    job = real_job(args.job_trials) if args.job_trials else None
    if job:
        print(f"real tuning job: {job['trials']} trials in {job['wall_s']} s "
              f"({job['s_per_trial']} s a trial, 2 at a time); within 1% after "
              f"{job['trials_to_target']} trials; best {job['best']['objective']:.4f}")
    common.write_json("tuning", {
        "objective": "f(lr, dropout, units), optimum 1.0 at lr=10^-2.5, dropout=0.3, "
                     "units=128; target f >= 0.99",
        "seeds": args.seeds, "budget_trials": args.trials, "parallel": 2,
        "command": "python -m bench.tuning " + " ".join(argv if argv is not None
                                                         else sys.argv[1:]),
        "samplers": summary, "real_job": job}, load_before)
    plot(curves, args.trials)
    return 0


def plot(curves: dict[str, list[list[float]]], trials: int) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = list(range(1, trials + 1))
    for label, runs in curves.items():
        bests = [best_so_far(r) for r in runs]
        med = [common.median([b[i] for b in bests]) for i in range(trials)]
        low = [sorted(b[i] for b in bests)[len(bests) // 4] for i in range(trials)]
        high = [sorted(b[i] for b in bests)[(3 * len(bests)) // 4] for i in range(trials)]
        ax.plot(xs, med, label=f"{label}, median best so far")
        ax.fill_between(xs, low, high, alpha=0.2)
    ax.axhline(TARGET, color="gray", linestyle="--", label="within 1% of the optimum")
    ax.set_ylim(0.8, 1.005)
    ax.set_xlabel("trial")
    ax.set_ylabel("objective (optimum 1.0)")
    ax.set_title(f"Bayesian (TPE) vs random search, {len(next(iter(curves.values())))} "
                 "seeds, 2 trials at a time")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    common.save_figure(fig, "tuning")


if __name__ == "__main__":
    sys.exit(main())
