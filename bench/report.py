"""The README's tables, printed as Markdown from bench/results/*.json.

    python -m bench.report > tables.md

Nothing is measured here; it only reads what the benchmarks wrote, so the numbers in
bench/README.md can be regenerated and checked against the JSON files.
"""
from __future__ import annotations

import argparse
import sys

from bench import common


def machine_line(result: dict) -> str:
    m = result["machine"]
    return (f"{m['cpu_model']}, {m['logical_cores']} logical cores, {m['memory_gib']} GiB, "
            f"TensorFlow {m['tensorflow']}, Keras {m['keras']}, Python {m['python']}; "
            f"run {result['date_utc']}, load average before {result['load_average_before']}, "
            f"after {result['load_average_after']}")


def throughput(result: dict, title: str) -> list[str]:
    out = [f"### {title} (batch 100, examples/s after warm-up)", "",
           f"Machine: {machine_line(result)}", ""]
    for model, entry in result["summary"].items():
        ref = entry["configs"].get("keras fit (defaults)", {})
        ratio = f"trainer / keras fit = {entry.get('ratio_trainer_over_keras')} in examples/s"
        if "ratio_cpu_trainer_over_keras" in entry:
            ratio += f", {entry['ratio_cpu_trainer_over_keras']} in CPU time per step"
        out += [f"**{model.upper()}** ({ratio})", "",
                "| configuration | examples/s (median) | all runs | ms/step | vs keras fit | "
                "CPU-ms/step | vs keras fit (CPU) | test acc. after run | peak RSS MiB |",
                "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for label, row in entry["configs"].items():
            rel = (f"{row['examples_per_s_median'] / ref['examples_per_s_median']:.2f}x"
                   if ref else "-")
            cpu = row.get("cpu_ms_per_step_median")
            rel_cpu = (f"{ref['cpu_ms_per_step_median'] / cpu:.2f}x"
                       if cpu and ref.get("cpu_ms_per_step_median") else "-")
            acc = row.get("final_test_accuracy")
            runs = ", ".join(f"{v:,.0f}" for v in row["examples_per_s_all"])
            out.append(f"| {label} | {row['examples_per_s_median']:,.0f} | {runs} | "
                       f"{row['ms_per_step_median']:.2f} | {rel} | "
                       f"{f'{cpu:.2f}' if cpu else '-'} | {rel_cpu} | "
                       f"{acc if acc is not None else '-'} | {row['peak_rss_mib']:,.0f} |")
        out.append("")
    return out


def overhead(result: dict) -> list[str]:
    out = ["### Coordinator overhead (ms per step; chief + 1 worker + 1 ps vs no strategy)", "",
           f"Machine: {machine_line(result)}", ""]
    for model, entry in result["summary"].items():
        out += [f"**{model.upper()}**: recommended {entry['recommendation']}", "",
                "| steps packed | single ms/step | ps ms/step | overhead ms/step | "
                "overhead ms per scheduled function | ps / single | CPU-ms/step single | "
                "CPU-ms/step ps (all replicas) |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in entry["rows"]:
            out.append(f"| {r['steps_per_execution']} | {r['single_ms_per_step']:.2f} | "
                       f"{r['ps_ms_per_step']:.2f} | {r['overhead_ms_per_step']:.2f} | "
                       f"{r['overhead_ms_per_scheduled_function']:.1f} | "
                       f"{r['ps_over_single']:.2f} | {r.get('single_cpu_ms_per_step', '-')} | "
                       f"{r.get('ps_cpu_ms_per_step', '-')} |")
        out.append("")
    return out


def scaling(result: dict) -> list[str]:
    out = [f"### Scaling on one machine ({result['model'].upper()}, batch 100, "
           f"{result['train_steps']} steps)", "", f"Machine: {machine_line(result)}", "",
           "| configuration | examples/s | vs single node | CPU-ms/step (all replicas) | "
           "examples per CPU-s | peak RSS MiB by replica | load at start |",
           "|---|---:|---:|---:|---:|---|---|"]
    for r in result["runs"]:
        rate = f"{r['examples_per_s']:,.0f}" if "examples_per_s" in r else "failed"
        mem = ", ".join(f"{k} {v:,.0f}" for k, v in r["peak_rss_mib"].items())
        out.append(f"| {r['label']} | {rate} | {r.get('relative_to_single', '-')} | "
                   f"{r.get('cpu_ms_per_step', '-')} | {r.get('examples_per_cpu_s', '-')} | "
                   f"{mem} | {r['load_average'][0]} |")
    net = result["network_model"]
    out += ["", f"### Network model ({net['model'].upper()}: {net['parameters']:,} parameters, "
            f"{net['weights_bytes'] / 1e6:.2f} MB of float32 weights, "
            f"{net['ps_bytes_per_step'] / 1e6:.2f} MB between a worker and the ps per step)",
            "", "Modelled examples/s = min(N x this machine's single-node rate "
            f"({net['single_node_steps_per_s_here']} steps/s), min(N, P) x link / bytes per "
            "step) x batch; last column: workers beyond which the ps links are the limit.", ""]
    counts = list(net["ps_table"][0]["examples_per_s"])
    out += ["| link | ps | network ceiling steps/s per link | "
            + " | ".join(f"N={n}" for n in counts) + " | network-bound beyond N |",
            "|---|---:|---:|" + "---:|" * len(counts) + "---:|"]
    for row in net["ps_table"]:
        ceiling = list(row["ceiling_steps_per_s"].values())[0]
        out.append(f"| {row['link_gbit_s']} Gbit/s | {row['ps']} | {ceiling:,.1f} | "
                   + " | ".join(f"{v:,}" for v in row["examples_per_s"].values())
                   + f" | {row.get('network_bound_beyond_workers', '-')} |")
    out += ["", "All-reduce (MultiWorkerMirrored, ring) ceiling, steps/s: "
            + "; ".join(f"{g} Gbit/s: " + ", ".join(f"N={n} {v}" for n, v in row.items())
                        for g, row in net["allreduce_ceiling_steps_per_s"].items()), ""]
    return out


def time_to_accuracy(results: dict) -> list[str]:
    out = ["### Time to 90% test accuracy (CNN, full Fashion-MNIST)", "",
           "| setup | time to 90% | step at 90% | final test accuracy | final step | "
           "wall time | of which evaluation | examples/s | peak RSS MiB | load before/after |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for setup, r in results.items():
        t = r.get("seconds_to_target")
        rate = r.get("throughput", {}).get("examples_per_s")
        mem = ", ".join(f"{k} {v:,.0f}" for k, v in r["peak_rss_mib"].items())
        out.append(f"| {r['cluster']} | {f'{t / 60:.1f} min ({t:.0f} s)' if t else 'not reached'} "
                   f"| {r.get('step_at_target') or '-'} | {r.get('final_test_accuracy')} | "
                   f"{r.get('final_step')} | {r['wall_s'] / 60:.1f} min | "
                   f"{r['evaluation_seconds_total']:.0f} s | "
                   f"{f'{rate:,.0f}' if rate else '-'} | {mem} | "
                   f"{r['load_average_before']} / {r['load_average_after']} |")
    out.append("")
    for setup, r in results.items():
        out += [f"- {setup}: `{r['command']}`"
                + ("" if setup == "single" else " (same command on every replica, TF_CONFIG "
                   "per replica)") + f", rc={r['rc']}, timeout {r['timeout_s']:.0f} s"]
    out.append("")
    return out


def memory(result: dict) -> list[str]:
    out = ["### Peak resident memory per process (MiB)", "",
           "| model | " + " | ".join(("single", "baseline", "chief", "worker", "ps"))
           + " |", "|---|---:|---:|---:|---:|---:|"]
    for model, kinds in result["summary"].items():
        cells = []
        for kind in ("single", "baseline", "chief", "worker", "ps"):
            k = kinds.get(kind)
            cells.append(f"{k['max_mib']:,.0f} (median {k['median_mib']:,.0f}, {k['runs']} runs)"
                         if k else "-")
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m bench.report", description=(
        "The README's tables as Markdown, from bench/results/*.json (nothing is "
        "measured)")).parse_args(argv)
    lines: list[str] = []
    for name, title in (("throughput_core", "Trainer against Keras fit, interleaved repeats"),
                        ("throughput", "Single-node throughput, every variant")):
        result = common.read_json(name)
        if result:
            lines += throughput(result, title)
    for name, render in (("overhead", overhead), ("scaling", scaling)):
        result = common.read_json(name)
        if result:
            lines += render(result)
    tta = {s: common.read_json(f"time_to_accuracy_{s}") for s in ("single", "ps")}
    tta = {s: r for s, r in tta.items() if r}
    if tta:
        lines += time_to_accuracy(tta)
    mem = common.read_json("memory")
    if mem:
        lines += memory(mem)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
