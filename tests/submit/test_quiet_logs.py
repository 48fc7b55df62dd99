"""Quiet logs: TensorFlow's start-up noise off by default in replicas (unless the user
set TF_CPP_MIN_LOG_LEVEL), storms of repeated stderr lines shown once with a count, and
the severity of TensorFlow's and Python's own log lines; with a tiny package of our own
that prints what TensorFlow prints (no TensorFlow: fast)."""
from __future__ import annotations

import os

import pytest

from submit import logs
from submit.__main__ import main

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ONEDNN = ("I0000 00:00:1795614149.218132   18107 port.cc:153] oneDNN custom operations are "
          "on. You may see slightly different numerical results due to floating-point "
          "round-off errors from different computation orders.")
# One attempt of the chief's gRPC storm after a worker was SIGKILLed, as TensorFlow 2.21
# printed it (four lines; the details' field order varies between attempts).
STORM = [
    "E0000 00:00:{t}   18116 context.cc:873] Failed to register function remotely due to "
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:34273: Failed "
    "to connect to remote host: Connection refused",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
    "while calling /tensorflow.eager.EagerService/Enqueue:",
    ':UNKNOWN:Error received from peer  {{{fields}}}',
    "This could happen if the remote target has been disconnected from the client.",
]
FIELDS = ['grpc_status:14, grpc_message:"Connection refused"',
          'grpc_message:"Connection refused", grpc_status:14']


def storm(attempts: int) -> list[str]:
    return [line.format(t=f"1795614171.{i:06d}", fields=FIELDS[i % 2])
            for i in range(attempts) for line in STORM]


def test_a_storm_is_shown_once_then_counted():
    shown: list[tuple[str, str]] = []
    repeats = logs.Repeats(lambda text, like: shown.append((text, like)))
    for line in ["step 1/10 started"] + storm(25) + ["training finished: step=10"]:
        repeats.feed(line)
    repeats.flush()
    texts = [t for t, _ in shown]
    assert texts[:5] == ["step 1/10 started"] + storm(1)
    assert texts[5].startswith("[96 repeated line(s) not shown, the first: E0000 ")
    assert texts[6:] == ["training finished: step=10"]
    assert logs.severity(shown[5][1], "stderr") == "ERROR"  # the count keeps its level


def test_lines_that_differ_short_lines_and_old_lines_are_kept():
    now = [0.0]
    shown: list[str] = []
    repeats = logs.Repeats(lambda text, like: shown.append(text), clock=lambda: now[0])
    lines = [f"W0000 00:00:1.{i}  7 x.cc:1] retrying peer {i} of 40" for i in range(40)]
    for line in lines + ["", "", "----", "----"]:
        repeats.feed(line)
    now[0] = logs.REPEAT_WINDOW_S + 1  # the same line again, a while later: new again
    repeats.feed(lines[-1])
    repeats.flush()
    assert shown == lines + ["", "", "----", "----", lines[-1]]


def test_a_storm_that_goes_on_is_counted_every_30_s():
    now = [0.0]
    shown: list[str] = []
    repeats = logs.Repeats(lambda text, like: shown.append(text), clock=lambda: now[0])
    line = storm(1)[0]
    for second in range(65):  # the same error once a second for a minute
        now[0] = float(second)
        repeats.feed(line)
    count = f"[31 repeated line(s) not shown, the first: {line[:117]}...]"
    assert shown == [line, count, count]  # at 31 s and 62 s
    repeats.flush()
    assert shown[-1].startswith("[2 repeated line(s)")


def test_severity_of_tensorflow_and_python_log_lines():
    assert logs.severity(storm(1)[0], "stderr") == "ERROR"
    assert logs.severity("W1125 13:00:01.123456 18116 cm.cc:968] Device filters", "stderr") \
        == "WARNING"
    assert logs.severity(ONEDNN, "stderr") == "INFO"
    assert logs.severity("ERROR:tensorflow:Worker failed", "stderr") == "ERROR"
    assert logs.severity("WARNING:absl:Importing a function", "stderr") == "WARNING"
    assert logs.severity("Traceback (most recent call last):", "stderr") == "ERROR"
    assert logs.severity("an ERROR of the user's, on stdout", "stdout") == "INFO"
    assert logs.startup_noise(ABSL) and logs.startup_noise(ONEDNN)
    assert not logs.startup_noise("I0000 00:00:1.0  7 port.cc:153] something else")
    assert logs.quiet_env({}) == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    assert logs.quiet_env({"TF_CPP_MIN_LOG_LEVEL": "0"}) == {}


NOISY_TASK = r'''
import os, sys
print("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", "unset"), flush=True)
for line in sys.argv[sys.argv.index("--lines") + 1].split("|"):
    print(line, file=sys.stderr, flush=True)
print("done", flush=True)
'''


@pytest.fixture
def pkg(tmp_path):
    folder = tmp_path / "pkg"
    (folder / "noisy").mkdir(parents=True)
    (folder / "setup.py").write_text('from setuptools import setup\nsetup(name="noisy", '
                                     'version="0.1", packages=["noisy"])\n')
    (folder / "noisy" / "__init__.py").write_text("")
    (folder / "noisy" / "task.py").write_text(NOISY_TASK)
    return str(folder)


@pytest.mark.parametrize("user_level", [None, "0"])
def test_a_replicas_log_is_quiet_unless_the_user_set_the_level(capsys, tmp_path, pkg,
                                                               monkeypatch, user_level):
    if user_level is None:
        monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", user_level)
    job_id = f"noisy{user_level or ''}"
    printed = [ABSL, ONEDNN, *storm(10)]
    status = main([job_id, "--job-dir", str(tmp_path / job_id), "--package-path", pkg,
                   "--module-name", "noisy.task", "--", "--lines", "|".join(printed)],
                  standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0, err
    log_dir = os.path.join(tmp_path, job_id, "logs")
    with open(os.path.join(log_dir, "master-replica-0.log")) as f:
        lines = [line.rstrip("\n").split("\t") for line in f]
    texts = [fields[3] for fields in lines]
    level = "1" if user_level is None else user_level
    assert f"TF_CPP_MIN_LOG_LEVEL={level}" in texts and "done" in texts
    kept = [t for t in texts if t in (ABSL, ONEDNN)]
    assert kept == ([] if user_level is None else [ABSL, ONEDNN])
    assert [t for t in texts if "Failed to register" in t][0] == printed[2]
    counted = [fields for fields in lines if fields[3].startswith("[36 repeated line(s)")]
    assert len(counted) == 1 and counted[0][0] == "ERROR", texts
    assert len(texts) == 2 + len(kept) + 4 + 1
    with open(os.path.join(log_dir, logs.SERVICE_LOG)) as f:
        service = f.read()
    assert "\tservice\tmaster-replica-0 exited with status 0\n" in service


def test_a_refusal_every_replica_makes_alike_is_shown_once():
    import io
    clock = [0.0]
    out = io.StringIO()
    terminal = logs.Terminal(out, clock=lambda: clock[0])
    refusal = "error: model.fit under MultiWorkerMirroredStrategy: optimizer adam (Adam) ..."
    for label, text in (("master-replica-0", refusal), ("worker-replica-0", refusal),
                        ("worker-replica-1", "error: another refusal"),
                        ("worker-replica-0", "step 1/2 loss=1")):
        terminal.line(label, text, f"{label}\t{text}")
    clock[0] = 61.0  # long after: a new failure of the same words is news again
    terminal.line("worker-replica-1", refusal, f"worker-replica-1\t{refusal}")
    terminal.line("master-replica-0", refusal, f"master-replica-0\t{refusal}")  # once again
    assert out.getvalue().splitlines() == [
        f"master-replica-0\t{refusal}", "worker-replica-1\terror: another refusal",
        "worker-replica-0\tstep 1/2 loss=1", f"worker-replica-1\t{refusal}"]
