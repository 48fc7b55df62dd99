"""Accuracy curves of one trainer run: wall time for the CNN to reach 90% test accuracy on the full
Fashion-MNIST (60,000 / 10,000, the trainer's default data), on a single node and on a
ParameterServerStrategy cluster (chief + 2 workers + 1 ps), all on this machine.

    python -m bench.accuracy_curves --setup single      # ~8 min on 2 idle cores
    python -m bench.accuracy_curves --setup ps          # ~10-15 min on 2 cores
    python -m bench.accuracy_curves --plot-only         # redraw from the JSON files
    python -m bench.accuracy_curves --setup ps --extra="--no-ps-local-steps" --name-suffix _x
    python -m bench.accuracy_curves --compare _x,_y     # ps runs' test accuracy by step

The trainer evaluates on the whole test split every --eval-every steps and prints
`eval step=... loss=... accuracy=...`; those lines, timestamped on arrival, are the
curve. Wall time counts from the moment the processes start (what a user waits for);
the evaluations are included, and their share is reported beside it. Each setup runs
under a timeout and writes bench/results/time_to_accuracy_<setup>.json; the plot of
loss and accuracy against wall time for both is time_to_accuracy.png. The same runs
give the README's final accuracies (single node >= 91%, PS cluster >= 90%).
(bench.time_to_accuracy races mljob against Keras `fit` and TF1's design instead.)
"""
from __future__ import annotations

import argparse
import shlex
import sys

from bench import common

SETUPS = {"single": (0, 0), "ps": (2, 1)}  # workers, ps
TARGET = 0.90
DEFAULT_STEPS = {"single": 4000, "ps": 4000}  # 4000 x 100 examples: ~6.7 epochs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy_curves", allow_abbrev=False)
    p.add_argument("--setup", choices=tuple(SETUPS), default="single")
    p.add_argument("--train-steps", type=int, default=None,
                   help="steps to train, 100 examples each (default: 4000, ~6.7 epochs)")
    p.add_argument("--eval-every", type=int, default=300)
    p.add_argument("--timeout", type=float, default=2400)
    p.add_argument("--data-dir", default=None, help="default: the trainer's default data")
    p.add_argument("--plot-only", action="store_true")
    p.add_argument("--name-suffix", default="", help="e.g. -check for trial runs")
    p.add_argument("--extra", default="", help="flags added to the trainer's command")
    p.add_argument("--compare", default="", metavar="SUFFIX,...",
                   help="plot the ps runs of these name suffixes against the step")
    args = p.parse_args(argv)
    if args.compare:
        compare([s.strip() for s in args.compare.split(",")], args.name_suffix)
        return 0
    if args.plot_only:
        plot(args.name_suffix)
        return 0
    workers, ps = SETUPS[args.setup]
    steps = args.train_steps or DEFAULT_STEPS[args.setup]
    extra = (["--data-dir", args.data_dir] if args.data_dir else []) + shlex.split(args.extra)
    load_before = common.load_average()
    try:
        with common.TempJobDir() as job_dir:
            targs = common.trainer_args("cnn", steps, 100, 100, job_dir, "--seed", "1",
                                        *extra, eval_every=args.eval_every)
            # Checkpoints as a user's job takes them (the trainer's default interval).
            i = targs.index("--checkpoint-every")
            del targs[i:i + 2]
            run = common.run_trainer(targs, workers=workers, ps=ps, timeout=args.timeout,
                                     echo=True)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    record = summarize(run, args.setup, steps, args.timeout, job_dir)
    common.write_json(f"time_to_accuracy_{args.setup}{args.name_suffix}", record, load_before)
    plot(args.name_suffix)
    print(f"{args.setup}: final accuracy {record.get('final_test_accuracy')}, "
          f"time to {TARGET:.0%}: {record.get('seconds_to_target')} s")
    return 0 if run.rc == 0 else 1


def summarize(run: common.RunResult, setup: str, steps: int, timeout: float,
              job_dir: str) -> dict:
    evals = common.parse_evals(run.lines)
    train = common.parse_steps(run.lines)
    step_time = {s["step"]: s["t"] for s in train}
    # An evaluation's cost: from the step line at its step to its own line (the
    # checkpoint saved at the same step, when there is one, is counted in it too).
    eval_seconds = sum(max(0.0, e["t"] - step_time[e["step"]]) for e in evals
                       if e["step"] in step_time)
    reached = next((e for e in evals if e["accuracy"] >= TARGET), None)
    command = "python " + " ".join(run.command).replace(job_dir, "JOB_DIR")
    record = {
        "setup": setup, "model": "cnn", "target_accuracy": TARGET,
        "cluster": ("none (single node)" if setup == "single"
                    else "chief + 2 workers + 1 ps (ParameterServerStrategy)"),
        "command": command, "train_steps": steps, "batch_size": 100,
        "rc": run.rc, "timeout_s": timeout, "wall_s": round(run.wall_s, 1),
        "startup_s": common.started_at(run.lines),
        "seconds_to_target": round(reached["t"], 1) if reached else None,
        "step_at_target": reached["step"] if reached else None,
        "final_test_accuracy": evals[-1]["accuracy"] if evals else None,
        "final_step": evals[-1]["step"] if evals else None,
        "seconds_to_final_eval": round(evals[-1]["t"], 1) if evals else None,
        "best_test_accuracy": max((e["accuracy"] for e in evals), default=None),
        "evaluation_seconds_total": round(eval_seconds, 1),
        "peak_rss_mib": run.memory(), "cpu_s": run.cpu_seconds(),
        "evals": evals, "train": train,
    }
    try:
        record["throughput"] = common.throughput(run.lines, 100)
    except ValueError:
        pass
    return record


def plot(suffix: str = "") -> None:
    results = {s: common.read_json(f"time_to_accuracy_{s}{suffix}") for s in SETUPS}
    results = {s: r for s, r in results.items() if r}
    if not results:
        print("no time_to_accuracy results to plot", file=sys.stderr)
        return
    plt = common.pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(13, 5))
    colors = {"single": "#4c72b0", "ps": "#c44e52"}
    names = {"single": "single node", "ps": "PS cluster (chief + 2 workers + 1 ps)"}
    for setup, r in results.items():
        c = colors[setup]
        train, evals = r["train"], r["evals"]
        ax_loss.plot([s["t"] / 60 for s in train], [s["loss"] for s in train], color=c,
                     alpha=0.35, linewidth=0.8, label=f"{names[setup]}: train batch loss")
        ax_loss.plot([e["t"] / 60 for e in evals], [e["loss"] for e in evals], "o-",
                     color=c, markersize=3, label=f"{names[setup]}: test loss")
        ax_acc.plot([e["t"] / 60 for e in evals], [e["accuracy"] for e in evals], "o-",
                    color=c, markersize=3,
                    label=f"{names[setup]} (last: {r['final_test_accuracy']:.4f} at step "
                    f"{r['final_step']}{'' if r['rc'] == 0 else ', stopped early'})"
                    if r.get("final_test_accuracy") else names[setup])
        if r.get("seconds_to_target"):
            ax_acc.axvline(r["seconds_to_target"] / 60, color=c, linestyle=":", linewidth=1)
            ax_acc.annotate(f"{TARGET:.0%} at {r['seconds_to_target'] / 60:.1f} min",
                            (r["seconds_to_target"] / 60, TARGET), color=c, fontsize=8,
                            textcoords="offset points", xytext=(4, -14 if setup == "ps" else 6))
    ax_loss.set_xlabel("wall time (minutes, from process start)")
    ax_loss.set_ylabel("cross-entropy loss")
    ax_loss.set_ylim(0, 1.0)
    ax_loss.set_title("CNN on Fashion-MNIST: loss against wall time", fontsize=10)
    ax_loss.legend(fontsize=7)
    _accuracy_axis(ax_acc, "wall time (minutes, from process start)",
                   "test accuracy against wall time", legend_size=7)
    common.save_figure(fig, f"time_to_accuracy{suffix}")
    plt.close(fig)


def compare(suffixes: list[str], name_suffix: str = "") -> None:
    """Test accuracy against the step of the ps runs with these name suffixes (each run
    with its own trainer flags), on one axis: the same steps, whatever the speed."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for suffix in suffixes:
        r = common.read_json(f"time_to_accuracy_ps{suffix}")
        if not r:
            raise SystemExit(f"no results file time_to_accuracy_ps{suffix}.json; run "
                             f"--setup ps --name-suffix {suffix} first")
        flags = r["command"].split("--seed 1", 1)[-1].strip() or "the defaults"
        ax.plot([e["step"] for e in r["evals"]], [e["accuracy"] for e in r["evals"]],
                "o-", markersize=3, label=f"{flags} (last: {r['final_test_accuracy']:.4f})")
    _accuracy_axis(ax, "step (100 examples each)",
                   "CNN, chief + 2 workers + 1 ps: test accuracy by step", legend_size=8)
    common.save_figure(fig, f"time_to_accuracy_ps_compare{name_suffix}")
    plt.close(fig)


def _accuracy_axis(ax, xlabel: str, title: str, legend_size: int) -> None:
    """Test accuracy from 80% to 95%, the target dashed."""
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (10,000 images)")
    ax.set_ylim(0.8, 0.95)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=legend_size, loc="lower right")


if __name__ == "__main__":
    sys.exit(main())
