"""What each replica costs: CPU and memory sampled while a local job runs.

The local supervisor runs one `Sampler` thread per job (and one per tuning trial). Every
`EVERY_S` seconds it reads each running replica's process and everything that process
started (psutil): CPU as cores in use over the interval (user + system time / wall time,
so 1.5 means one and a half cores busy) and memory as the resident set size. Each sample is
a JSON line appended to `<run folder>/usage.jsonl` (`{"t", "label", "cpu", "rss"}`), which
the console draws over time; when the job ends the supervisor keeps the summary per
replica (peak and mean of both, samples taken) in the record's `usage`, which
`jobs describe` shows. A tuning job's trials sample into `<run folder>/trials/<id>/`.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import psutil

log = logging.getLogger(__name__)
EVERY_S = 1.0
FILE = "usage.jsonl"
MIB = 1024 * 1024


class Sampler:
    """Samples the processes `pids()` names ({label: pid}) until `stop()`."""

    def __init__(self, path: str, pids: Callable[[], Mapping[str, int]],
                 every: float = EVERY_S):
        self.path = path
        self.pids = pids
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[tuple[int, float], psutil.Process] = {}
        self._last: dict[str, tuple[float, float]] = {}  # label: (cpu seconds, when)
        self.samples: list[dict] = []

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._thread = threading.Thread(target=self._run, daemon=True, name="usage")
        self._thread.start()

    def stop(self) -> dict[str, dict]:
        """Stop sampling; the summary per replica."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return summarize(self.samples)

    def _run(self) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            while not self._stop.wait(self.every):
                try:
                    for sample in self.sample():
                        out.write(json.dumps(sample, sort_keys=True) + "\n")
                    out.flush()
                except Exception as exc:  # sampling must never stop the job
                    log.warning("cannot sample the replicas' usage: %s", exc)

    def sample(self) -> list[dict]:
        """One sample of every replica that has run since the last one."""
        now = time.time()
        taken = []
        for label, pid in dict(self.pids()).items():
            measured = self._measure(pid)
            if measured is None:
                continue
            cpu_s, rss = measured
            last = self._last.get(label)
            self._last[label] = (cpu_s, now)
            if last is None or cpu_s < last[0]:  # first look, or a restarted process
                continue
            cores = (cpu_s - last[0]) / max(now - last[1], 1e-3)
            taken.append({"t": round(now, 3), "label": label, "cpu": round(cores, 3),
                          "rss": rss})
        self.samples += taken
        return taken

    def _measure(self, pid: int) -> tuple[float, int] | None:
        """CPU seconds and resident bytes of pid and its descendants."""
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        cpu_s, rss = 0.0, 0
        for proc in tree:
            try:  # the same Process object each time, keyed against PID reuse
                proc = self._procs.setdefault((proc.pid, proc.create_time()), proc)
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu_s += times.user + times.system
                    rss += proc.memory_info().rss
            except psutil.Error:
                continue  # it ended between the listing and the reading
        return cpu_s, rss


def summarize(samples: list[dict]) -> dict[str, dict]:
    """Peak and mean CPU (cores) and memory (MiB) per replica label."""
    by_label: dict[str, list[dict]] = {}
    for s in samples:
        by_label.setdefault(s["label"], []).append(s)
    out = {}
    for label, rows in sorted(by_label.items()):
        cpu = [float(r["cpu"]) for r in rows]
        mem = [float(r["rss"]) / MIB for r in rows]
        out[label] = {"cpuPeak": round(max(cpu), 2), "cpuMean": round(sum(cpu) / len(cpu), 2),
                      "memoryPeakMiB": round(max(mem), 1),
                      "memoryMeanMiB": round(sum(mem) / len(mem), 1),
                      "samples": len(rows)}
    return out


def files(run_dir: str) -> list[str]:
    """The job's samples: its own file and, for a tuning job, each trial's."""
    found = [os.path.join(run_dir, FILE)]
    trials = os.path.join(run_dir, "trials")
    if os.path.isdir(trials):
        found += [os.path.join(trials, t, FILE) for t in sorted(os.listdir(trials))]
    return [f for f in found if os.path.isfile(f)]


def read(run_dir: str, limit: int = 200_000) -> Iterator[dict]:
    """The samples of a job's run folder (damaged lines skipped, at most `limit`)."""
    count = 0
    for path in files(run_dir):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    s = json.loads(line)
                    sample = {"t": float(s["t"]), "label": str(s["label"]),
                              "cpu": float(s["cpu"]), "rss": int(s["rss"])}
                except (ValueError, TypeError, KeyError):
                    continue
                yield sample
                count += 1
                if count >= limit:
                    return


def table(summary: Mapping[str, Mapping]) -> str:
    """`jobs describe`'s table: one row a replica."""
    rows = [["REPLICA", "CPU_PEAK", "CPU_MEAN", "MEM_PEAK_MIB", "MEM_MEAN_MIB", "SAMPLES"]]
    for label, u in summary.items():
        rows.append([label, f"{u['cpuPeak']:.2f}", f"{u['cpuMean']:.2f}",
                     f"{u['memoryPeakMiB']:.1f}", f"{u['memoryMeanMiB']:.1f}",
                     str(u["samples"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def summary_of(record) -> dict[str, dict]:
    """A job's summary: as its record kept it when it ended, else from its samples while
    they are on this machine (a running job, a tuning job's trials)."""
    if record.done and record.usage:
        return dict(record.usage)
    from submit.home import mljob_home
    run_dir = os.path.join(mljob_home(), "runs", record.job_id)
    return summarize(list(read(run_dir))) or dict(record.usage or {})
