"""How the ps merges the workers' local steps (`--ps-merge`), against step by step, as
the number of workers grows: test accuracy after the same steps.

    python -m bench.ps_merge                       # 2, 4 and 8 workers, 2 repeats
    python -m bench.ps_merge --workers 2 --repeats 3

The job is the fault tests' undisturbed one (`tests/support/faults.py`): the MLP on the
default data, seed 1, 1,600 steps at batch 400, Adam at 0.0005, chief + N workers + 1
ps, evaluated on the test set at the end. Each repeat runs every setup once, for each N,
interleaved: step by step (`--no-ps-local-steps`), local steps with the weights'
changes summed over sqrt(N) (`--ps-merge sqrt`, the default) and averaged
(`--ps-merge mean`, the rule before). Reported: each run's test accuracy, and per N and
rule the mean and its points from step by step's mean.

Writes bench/results/ps_merge.json and .png.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from bench import common

STEPS, BATCH = 1600, 400
JOB = ["--seed", "1", "--learning-rate", "0.0005"]  # the MLP, as trainer_args says
SETUPS = (("step by step", ["--no-ps-local-steps"]),
          ("sqrt", ["--ps-merge", "sqrt"]),
          ("mean", ["--ps-merge", "mean"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ps_merge", allow_abbrev=False)
    p.add_argument("--workers", type=int, action="append",
                   help="workers in the cluster (repeatable; default 2, 4 and 8)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)
    counts = args.workers or [2, 4, 8]
    load_before = common.load_average()
    runs = []
    try:
        for repeat in range(args.repeats):
            for workers in counts:
                for setup, flags in SETUPS:
                    with common.TempJobDir() as job_dir:
                        targs = common.trainer_args("mlp", STEPS, 400, BATCH, job_dir,
                                                    *JOB, *flags, eval_every=STEPS)
                        record = common.measure(f"{workers} workers: {setup}", targs,
                                                batch_size=BATCH, workers=workers, ps=1,
                                                timeout=args.timeout)
                    record.update(setup=setup, repeat=repeat)
                    runs.append(record)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    summary = summarise(runs)
    common.write_json("ps_merge", {"batch_size": BATCH, "train_steps": STEPS,
                                   "runs": runs, "summary": summary}, load_before)
    plot(summary)
    for workers, row in summary.items():
        print(f"{workers} workers: " + ", ".join(
            f"{setup} {v['mean_accuracy']:.4f} ({v.get('points_vs_step_by_step', 0):+.2f})"
            for setup, v in row.items()))
    return 0


def summarise(runs: list[dict]) -> dict:
    """{workers: {setup: mean accuracy, its runs, points from step by step's mean}}."""
    out: dict = {}
    for r in runs:
        if r.get("final_test_accuracy") is not None:
            row = out.setdefault(str(r["workers"]), {})
            row.setdefault(r["setup"], {"runs": []})["runs"].append(r["final_test_accuracy"])
    for row in out.values():
        for v in row.values():
            v["mean_accuracy"] = round(statistics.mean(v["runs"]), 4)
        base = row.get("step by step", {}).get("mean_accuracy")
        for setup, v in row.items():
            if base is not None and setup != "step by step":
                v["points_vs_step_by_step"] = round(100 * (v["mean_accuracy"] - base), 2)
    return out


def plot(summary: dict) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    counts = sorted(summary, key=int)
    for setup, _ in SETUPS:
        ax.plot([int(n) for n in counts],
                [100 * summary[n].get(setup, {}).get("mean_accuracy", float("nan"))
                 for n in counts], marker="o", label=setup)
    ax.set_xlabel("workers (chief + N workers + 1 ps)")
    ax.set_ylabel("test accuracy after 1,600 steps (%)")
    ax.set_xticks([int(n) for n in counts])
    ax.set_title("MLP: how the ps merges local steps")
    ax.legend()
    fig.tight_layout()
    common.save_figure(fig, "ps_merge")


if __name__ == "__main__":
    sys.exit(main())
