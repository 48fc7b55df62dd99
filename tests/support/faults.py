"""A job submitted through the real launcher for the fault tests: the launcher's process,
its record and the chief's log, read while replicas are killed."""
from __future__ import annotations

import json
import os
import re
import subprocess

from tests.support.common import ROOT, Reaper, pid_alive
from tests.support.trainer_runs import read, wait_exit, wait_for
from trainer.data import default_data_dir

# The full Fashion-MNIST where installed (the packaged sample otherwise), 10 epochs at a
# small learning rate: undisturbed runs (asynchronous, so never bit-identical) differ by
# under 0.1 point, where on the 3,000-image sample at 0.001 they differ by a point.
DATA = default_data_dir()
TOTAL = 1600
ARGS = ["--model", "mlp", "--data-dir", DATA, "--seed", "1", "--train-steps", str(TOTAL),
        "--batch-size", "400", "--learning-rate", "0.0005", "--checkpoint-every", "100",
        "--log-every", "50", "--eval-every", "0", "--steps-per-execution", "2"]
JOB_TIMEOUT = 420   # a whole job on 2 busy cores, restarts included
STEP_TIMEOUT = 240  # the chief reaching a given step
ACCURACY_POINTS = 0.01
CONFIG = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
          "  workerCount: 2\n  parameterServerCount: 1\n")


class Job:
    """One submitted job: the launcher's process, and its record and chief log on disk."""

    def __init__(self, reaper: Reaper, folder, job_id: str, policy: str = "ExitCode",
                 max_restarts: int = 3, env: dict | None = None, extra: tuple = (),
                 cluster: str = CONFIG):
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yaml"
        config.write_text(cluster)
        self.job_id, self.job_dir = job_id, str(folder / "job")
        self.out = folder / "submit.out"
        self.env = env = {**os.environ, "MLJOB_HOME": str(folder / "home"), **(env or {})}
        with open(self.out, "wb") as out:
            self.proc = reaper.python(
                "-m", "submit", job_id, "--scale-tier", "CUSTOM", "--config", str(config),
                "--job-dir", self.job_dir, "--restart-policy", policy, "--max-restarts",
                str(max_restarts), "--", *ARGS, *extra, stdout=out, stderr=subprocess.STDOUT,
                env=env, cwd=ROOT)
        self.pids: set[int] = set()

    def record(self) -> dict:
        try:
            with open(os.path.join(self.job_dir, "jobs", f"{self.job_id}.json")) as f:
                record = json.load(f)
        except (FileNotFoundError, ValueError):
            return {}
        self.pids.update(r["pid"] for r in record.get("replicas", []) if r.get("pid"))
        return record

    def replica(self, label: str) -> dict:
        return next((r for r in self.record().get("replicas", []) if r["label"] == label), {})

    def chief_lines(self, prefix: str = "") -> list[str]:
        text = read(os.path.join(self.job_dir, "logs", "master-replica-0.log"))
        texts = [line.split("\t", 3)[-1] for line in text.splitlines()]
        return [t for t in texts if t.startswith(prefix)]

    def last_step(self) -> int:
        steps = [int(re.match(r"step (\d+)/", t).group(1)) for t in self.chief_lines("step ")]
        return steps[-1] if steps else 0

    def wait_step(self, step: int) -> int:
        """Wait until the chief has logged `step` or beyond (after its latest start)."""
        def reached():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended early:\n{read(self.out)[-3000:]}")
            return self.last_step() >= step and self.last_step()
        return wait_for(reached, STEP_TIMEOUT, f"the chief at step {step}", interval=0.1)

    def running_pid(self, label: str, other_than: int | None = None) -> int:
        """The replica's PID once it is RUNNING (a new process when other_than is given:
        the record changes only when the launcher notices)."""
        def pid():
            r = self.replica(label)
            return r.get("state") == "RUNNING" and r.get("pid") != other_than and r.get("pid")
        return wait_for(pid, 120, f"{label} running")

    def kill(self, label: str, sig: int) -> int:
        pid = self.running_pid(label)
        os.kill(pid, sig)
        wait_for(lambda: not pid_alive(pid), 60, f"{label} (pid {pid}) gone")
        return pid

    def finish(self) -> dict:
        status = wait_exit(self.proc, JOB_TIMEOUT, self.out)
        record = self.record()
        assert status == 0, read(self.out)[-4000:]
        assert record["state"] == "SUCCEEDED", record.get("error_message")
        # The launcher's cleanup: no replica it ever started is left.
        assert self.pids and [p for p in self.pids if pid_alive(p)] == []
        assert self.chief_lines(f"training finished: step={TOTAL} ")
        assert checkpoint_steps(self.job_dir)[-1] == TOTAL
        check_restorable(self.job_dir)
        return record


def checkpoint_steps(job_dir: str) -> list[int]:
    state = read(os.path.join(job_dir, "checkpoints", "checkpoint"))
    return sorted(int(s) for s in re.findall(r'"ckpt-(\d+)"', state))


def check_restorable(job_dir: str) -> None:
    """Every checkpoint the state file names reads back whole (index and data)."""
    import tensorflow as tf
    for step in set(checkpoint_steps(job_dir)):
        reader = tf.train.load_checkpoint(os.path.join(job_dir, "checkpoints", f"ckpt-{step}"))
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        step_names = [n for n in reader.get_variable_to_shape_map() if n.startswith("step/")]
        assert [int(reader.get_tensor(n)) for n in step_names] == [step]
