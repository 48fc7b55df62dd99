"""Single-node training throughput: our trainer against a plain Keras `model.fit`.

    python -m bench.throughput                 # CNN and MLP, every variant
    python -m bench.throughput --quick         # a short check that everything runs

Every configuration runs alone in a fresh subprocess (nothing else of ours running),
on the same model (`trainer.model.build`), data (`trainer.data`) and batch size.
examples/s is measured after warm-up (see `bench.common.throughput`). The ratio the
README states is `trainer (defaults) / keras fit (defaults)`, per model, from the median
of `--repeats` interleaved runs of each.

The variants change one thing each (see bench/keras_baseline.py for the Keras side):
steps packed per tf.function call, XLA, the input pipeline, mixed precision.
Writes bench/results/throughput.json and throughput.png.
"""
from __future__ import annotations

import argparse
import sys

from bench import common

# (label, program, extra args). "trainer" is `python -m trainer.task`, "keras" is
# `python -m bench.keras_baseline`. The first of each is the reference the ratio uses.
CORE = [
    ("trainer (defaults)", "trainer", []),
    ("keras fit (defaults)", "keras", []),
]
VARIANTS = [
    ("trainer spe=1", "trainer", ["--steps-per-execution", "1"]),
    ("trainer spe=20", "trainer", ["--steps-per-execution", "20"]),
    ("trainer spe=100", "trainer", ["--steps-per-execution", "100"]),
    ("keras spe=20", "keras", ["--steps-per-execution", "20"]),
    ("keras XLA", "keras", ["--jit-compile", "on"]),
    ("keras XLA spe=20", "keras", ["--jit-compile", "on", "--steps-per-execution", "20"]),
    ("keras float-once", "keras", ["--pipeline", "float-once"]),
    ("keras numpy fit", "keras", ["--pipeline", "numpy"]),
    ("keras mixed_bfloat16", "keras", ["--mixed-precision", "mixed_bfloat16"]),
]
# Steps per run and the logging interval: long enough for a steady window after the
# warm-up (CNN ~1,500 examples/s, MLP ~60,000 examples/s on 2 cores).
# The trainer ends a packed call at every log step, so the log interval is a multiple
# of every --steps-per-execution measured (up to 100).
STEPS = {"cnn": (400, 100), "mlp": (10000, 500)}
QUICK_STEPS = {"cnn": (100, 20), "mlp": (1000, 100)}


def run_config(label: str, program: str, model: str, extra: list[str], *, steps: int,
               log_every: int, batch_size: int, learning_rate: float | None,
               timeout: float) -> dict:
    with common.TempJobDir() as job_dir:
        lr = ["--learning-rate", str(learning_rate)] if learning_rate is not None else []
        if program == "trainer":
            args = common.trainer_args(model, steps, log_every, batch_size, job_dir,
                                       *lr, *extra)
            module, kind = "trainer.task", "single"
        else:
            args = ["--model", model, "--train-steps", str(steps), "--batch-size",
                    str(batch_size), "--log-every", str(log_every), *lr, *extra]
            module, kind = "bench.keras_baseline", "baseline"
        record = common.measure(f"{model}: {label}", args, batch_size=batch_size,
                                module=module, kind=kind, timeout=timeout)
    record.update(label=label, program=program, model=model)
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", allow_abbrev=False)
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=None,
                   help="passed to both programs (default: each one's own default)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each core configuration, interleaved (median taken)")
    p.add_argument("--no-variants", action="store_true", help="only the two defaults")
    p.add_argument("--only", default=None, help="comma-separated labels to run")
    p.add_argument("--quick", action="store_true", help="short runs, to check it works")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--name", default="throughput", help="results file name")
    p.add_argument("--resummarize", action="store_true",
                   help="recompute the summary and plot of --name from its recorded runs")
    args = p.parse_args(argv)
    if args.resummarize:
        result = common.read_json(args.name)
        models = list(dict.fromkeys(r["model"] for r in result["runs"]))
        result["summary"] = summarize(result["runs"], models, result["batch_size"])
        common.update_json(args.name, result)
        plot(result["summary"], models, args.name)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    table = QUICK_STEPS if args.quick else STEPS
    repeats = 1 if args.quick else args.repeats
    configs = [] if args.only else [c for _ in range(repeats) for c in CORE]
    if not args.no_variants:
        configs += VARIANTS
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in CORE + VARIANTS if c[0] in wanted] * repeats

    load_before = common.load_average()
    runs = []
    try:
        for model in models:
            steps, log_every = table[model]
            for label, program, extra in configs:
                runs.append(run_config(label, program, model, extra, steps=steps,
                                    log_every=log_every, batch_size=args.batch_size,
                                    learning_rate=args.learning_rate, timeout=args.timeout))
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    summary = summarize(runs, models, args.batch_size)
    common.write_json(args.name, {"batch_size": args.batch_size, "quick": args.quick,
                                  "summary": summary, "runs": runs}, load_before)
    plot(summary, models, args.name)
    for model in models:
        ratio = summary[model].get("ratio_trainer_over_keras")
        print(f"{model}: trainer/keras = {ratio}")
    return 0


def summarize(runs: list[dict], models: list[str], batch_size: int = 100) -> dict:
    out = {}
    for model in models:
        by_label: dict[str, list[dict]] = {}
        for r in runs:
            if r["model"] == model and "examples_per_s" in r:
                by_label.setdefault(r["label"], []).append(r)
        rows = {}
        for label, rs in by_label.items():
            rates = [r["examples_per_s"] for r in rs]
            rows[label] = {"examples_per_s_median": round(common.median(rates), 1),
                           "examples_per_s_all": rates,
                           "ms_per_step_median": round(common.median(
                               [r["ms_per_step"] for r in rs]), 3),
                           "peak_rss_mib": max(max(r["peak_rss_mib"].values()) for r in rs),
                           "final_test_accuracy": rs[-1].get("final_test_accuracy")}
            cpu = [r["cpu_ms_per_step"] for r in rs if "cpu_ms_per_step" in r]
            if cpu:
                rows[label]["cpu_ms_per_step_median"] = round(common.median(cpu), 2)
                rows[label]["examples_per_cpu_s_median"] = round(
                    1000 * batch_size / common.median(cpu), 1)
        entry = {"configs": rows}
        ours, theirs = rows.get(CORE[0][0]), rows.get(CORE[1][0])
        if ours and theirs:
            entry["ratio_trainer_over_keras"] = round(
                ours["examples_per_s_median"] / theirs["examples_per_s_median"], 3)
            if "cpu_ms_per_step_median" in ours and "cpu_ms_per_step_median" in theirs:
                # The same ratio in CPU time per step: what an idle machine would show,
                # less disturbed by whatever else the shared machine runs.
                entry["ratio_cpu_trainer_over_keras"] = round(
                    theirs["cpu_ms_per_step_median"] / ours["cpu_ms_per_step_median"], 3)
        out[model] = entry
    return out


def plot(summary: dict, models: list[str], name: str) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = summary[model]["configs"]
        labels = list(rows)
        values = [rows[k]["examples_per_s_median"] for k in labels]
        colors = ["#4c72b0" if k.startswith("trainer") else "#dd8452" for k in labels]
        bars = ax.bar(range(len(labels)), values, color=colors)
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
        ref = rows.get(CORE[1][0])
        if ref:
            ax.axhline(ref["examples_per_s_median"], color="#c44e52", linestyle="--",
                       linewidth=1, label="keras fit (defaults)")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("examples/s (after warm-up)")
        ratio = summary[model].get("ratio_trainer_over_keras")
        ax.set_title(f"{model.upper()} single node, batch 100"
                     + (f" (trainer/keras = {ratio})" if ratio else ""), fontsize=10)
    common.save_figure(fig, name)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
