"""The job index at scale: `jobs list` and `jobs describe` with 10,000 job records, and a
tuning job whose study holds 1,000 trials.

    python -m bench.bookkeeping [--records 10000] [--trials 1000] [--repeats 3]

The records are written through the project's own record API (`submit.jobs.save`, the
tuner's `training_output`, an Optuna journal in the tuner's own file) into a fresh
MLJOB_HOME: a tenth of them RUNNING with a supervisor PID that is gone (as after a
reboot), the rest ended, a few with labels changed by `jobs update`. Each command then
runs as the user runs it, `python -m submit ...` in a fresh process, and its wall time
is taken end to end (interpreter start and imports included); beside it, `--help`, the
floor every command pays. The in-process cost of the tuner's own bookkeeping per trial
(replaying the journal, the trials table, publishing the record) is timed as well.

Wall and CPU seconds are both recorded: on a loaded machine the CPU seconds compare
better. Set MLJOB_JOB_INDEX=0 to measure without the index summary (`submit.jobs`): every
record's file is read, as before it existed. By default both are measured, side by
side, in the same run. Writes bench/results/bookkeeping.json.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import common

GOAL_S = 1.0


def populate(home: str, records: int, trials: int) -> str:
    """`records` job records and one tuning job with a `trials`-trial study; its id."""
    os.environ["MLJOB_HOME"] = home
    from submit import jobs, resource
    rng = random.Random(0)
    now = time.time() - records * 60
    dead_pid = _dead_pid()
    for i in range(records):
        state = rng.choice([jobs.SUCCEEDED] * 6 + [jobs.FAILED, jobs.CANCELLED])
        running = i % 10 == 0
        record = jobs.JobRecord(
            job_id=f"job_{i:05d}", state=jobs.RUNNING if running else state,
            create_time=now + i * 60, start_time=now + i * 60 + 5,
            end_time=None if running else now + i * 60 + 300, scale_tier="STANDARD_1",
            module="trainer.task", trainer_args=["--train-steps", "1000"],
            training_input={"scaleTier": "STANDARD_1", "region": "local",
                            "args": ["--train-steps", "1000"]},
            labels={"team": rng.choice(["vision", "text", "speech"]), "run": str(i)},
            replicas=[jobs.ReplicaRecord(f"{kind}-replica-{n}", pid=dead_pid,
                                         state="EXITED", exit_code=0, exit_codes=[0])
                      for kind, count in (("master", 1), ("worker", 4), ("ps", 3))
                      for n in range(count)])
        if running:
            record.supervisor_pid = dead_pid
            record.supervisor_stamp = {"start_ticks": 1, "cmdline": ["python3"]}
        jobs.save(record)
        if i % 100 == 1:
            resource.save_labels(record, {**record.labels, "reviewed": "yes"})
    return tuning_job(home, trials, now + records * 60)


def tuning_job(home: str, trials: int, when: float) -> str:
    """A finished tuning job: its study journal written by Optuna in the tuner's own
    file, its trainingOutput made by the tuner's own `training_output`."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from submit import jobs
    from submit.jobdef import tuning_spec
    from submit.local import study as tuning
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job_id = "tuning_1000"
    job_dir = os.path.join(home, "job_dirs", job_id)
    hp = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": trials,
          "maxParallelTrials": 2,
          "params": [{"parameterName": "learning_rate", "type": "DOUBLE",
                      "minValue": 1e-4, "maxValue": 1e-1, "scaleType": "UNIT_LOG_SCALE"},
                     {"parameterName": "hidden_units", "type": "INTEGER",
                      "minValue": 16, "maxValue": 512, "scaleType": "UNIT_LINEAR_SCALE"}]}
    spec = tuning_spec.parse(hp, job_dir=job_dir)
    folder = os.path.join(job_dir, "hptuning")
    os.makedirs(folder, exist_ok=True)
    study = optuna.create_study(
        storage=JournalStorage(JournalFileBackend(os.path.join(folder, tuning_spec.JOURNAL))),
        study_name=tuning.STUDY_NAME, direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0))
    rng = random.Random(1)
    for n in range(trials):
        trial = study.ask(tuning.distributions(spec))
        params = {p.name: tuning.from_optuna(p, trial.params[p.name]) for p in spec.params}
        trial.set_user_attr("trialId", str(n + 1))
        trial.set_user_attr("hyperparameters", {k: str(v) for k, v in params.items()})
        trial.set_user_attr("startTime", tuning.iso(when + n))
        trial.set_user_attr("allMetrics", [{"trainingStep": str(s), "objectiveValue":
                                            rng.random()} for s in (100, 200, 300)])
        study.tell(trial, rng.random())
    record = jobs.JobRecord(job_id=job_id, state=jobs.SUCCEEDED, create_time=when,
                            start_time=when + 1, end_time=when + trials, job_dir=job_dir,
                            scale_tier="BASIC", module="trainer.task",
                            training_input={"scaleTier": "BASIC", "hyperparameters": hp})
    record.training_output = tuning.training_output(study, spec)
    jobs.save(record)
    return job_id


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def timed(argv: list[str], env: dict, repeats: int) -> dict:
    """Wall seconds of `python -m submit ARGV` in a fresh process (median of repeats)."""
    times, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "submit", *argv], env=env,
                              cwd=common.ROOT, capture_output=True, timeout=600)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"python -m submit {' '.join(argv)} failed: "
                             f"{done.stderr.decode()[-500:]}")
    return {"median_s": round(statistics.median(times), 3),
            "median_cpu_s": round(statistics.median(cpu), 3),
            "runs_s": [round(t, 3) for t in times], "stdout_lines":
            done.stdout.count(b"\n")}


def tuner_costs(home: str, job_id: str, repeats: int) -> dict:
    """The tuner's bookkeeping per trial at this study's size, in this process."""
    os.environ["MLJOB_HOME"] = home
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from submit import jobs
    from submit.jobdef import tuning_spec
    from submit.local import study as tuning
    record = jobs.load(job_id)
    spec = tuning_spec.parse(record.training_input["hyperparameters"],
                             job_dir=record.job_dir or "")
    journal = os.path.join(record.job_dir or "", tuning_spec.HP_DIR, tuning_spec.JOURNAL)

    def best(fn) -> float:
        out = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return round(min(out), 4)

    study = optuna.load_study(study_name=tuning.STUDY_NAME,
                              storage=JournalStorage(JournalFileBackend(journal)))
    return {
        "load_study_s": best(lambda: optuna.load_study(
            study_name=tuning.STUDY_NAME,
            storage=JournalStorage(JournalFileBackend(journal))).trials),
        "training_output_s": best(lambda: tuning.training_output(study, spec)),
        # what the tuner's loop asked every poll before, and asks now
        "study_trials_copied_s": best(lambda: study.trials),
        "study_trials_uncopied_s": best(lambda: study.get_trials(deepcopy=False)),
        "save_record_s": best(lambda: jobs.save(record)),
        "record_bytes": os.path.getsize(jobs.index_path(job_id)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bookkeeping", allow_abbrev=False)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--trials", type=int, default=1_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", help="keep the populated MLJOB_HOME in this folder")
    args = p.parse_args(argv)
    load_before = common.load_average()
    home = args.keep or tempfile.mkdtemp(prefix="mljob-bench-home-")
    started = time.perf_counter()
    tuning_id = populate(home, args.records, args.trials)
    populate_s = time.perf_counter() - started
    env = {**os.environ, "MLJOB_HOME": home, "PYTHONPATH": common.ROOT}
    # The first listing after the records were written elsewhere builds the summary:
    # timed once here, apart from the commands (a listing then reads what changed).
    first_listing = timed(["jobs", "list"], {**env, "MLJOB_JOB_INDEX": "1"}, 1)
    print(f"first jobs list (the summary built): {first_listing}", flush=True)
    commands = {
        "--help": ["--help"],
        "jobs list": ["jobs", "list"],
        "jobs list --limit 20 --sort-by ~createTime": ["jobs", "list", "--limit", "20",
                                                       "--sort-by", "~createTime"],
        "jobs list --filter state=RUNNING": ["jobs", "list", "--filter", "state=RUNNING"],
        "jobs list --filter labels.team=vision --format json":
            ["jobs", "list", "--filter", "labels.team=vision", "--format", "json"],
        "jobs list --page-size 100": ["jobs", "list", "--page-size", "100"],
        "jobs describe (plain job)": ["jobs", "describe", f"job_{args.records // 2:05d}"],
        f"jobs describe (tuning job, {args.trials} trials)": ["jobs", "describe",
                                                               tuning_id],
        f"jobs describe --summarize ({args.trials} trials)": ["jobs", "describe",
                                                              tuning_id, "--summarize"],
    }
    results: dict[str, dict] = {}
    try:
        for name, command in commands.items():
            row = {}
            for index in ("1", "0"):  # with the index summary, and every file read
                row["index" if index == "1" else "no_index"] = timed(
                    command, {**env, "MLJOB_JOB_INDEX": index}, args.repeats)
            row["ratio_no_index_over_index"] = round(
                row["no_index"]["median_s"] / row["index"]["median_s"], 2)
            results[name] = row
            floor = results.get("--help", row)
            for key in ("index", "no_index"):
                row[key]["over_help_s"] = round(row[key]["median_s"] -
                                                floor[key]["median_s"], 3)
            print(f"{name:<58} index {row['index']['median_s']:6.3f} s "
                  f"({row['index']['median_cpu_s']:.3f} CPU-s)   every file "
                  f"{row['no_index']['median_s']:6.3f} s "
                  f"({row['no_index']['median_cpu_s']:.3f} CPU-s)", flush=True)
        tuner = tuner_costs(home, tuning_id, args.repeats)
        print(f"tuner with {args.trials} trials: {tuner}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    over = [n for n, r in results.items() if n != "--help" and r["index"]["median_s"] > GOAL_S]
    common.write_json("bookkeeping", {
        "what": "wall seconds of `python -m submit` commands in a fresh process over an "
                f"index of {args.records} job records and a {args.trials}-trial tuning job",
        "records": args.records, "trials": args.trials, "repeats": args.repeats,
        "populate_s": round(populate_s, 1), "goal_s": GOAL_S,
        "first_listing_builds_the_summary": first_listing, "commands": results,
        "tuner": tuner, "over_goal": over}, load_before)
    print("over the goal of 1 s: " + (", ".join(over) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
