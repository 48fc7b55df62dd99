"""The error boundary every mljob program runs its body in (`mljob.errors.boundary`):
what escapes becomes one line and the project's exit status."""
from __future__ import annotations

import errno
import subprocess

import pytest

from mljob import errors, storage
from mljob.cluster import ClusterConfigError
from mljob.training.errors import PeerUnavailableError, Preempted
from predict.errors import UsageError as PredictUsage
from tests.support.common import ROOT


def raising(exc: BaseException):
    def call():
        raise exc
    return call


@pytest.mark.parametrize("exc, status, line", [
    (errors.UsageError("--job-dir is missing; pass it"), 2,
     "error: --job-dir is missing; pass it"),
    (PredictUsage("bad\nflags"), 2, "error: bad flags"),  # one line, always
    (ClusterConfigError("TF_CONFIG is not JSON"), 2, "error: TF_CONFIG is not JSON"),
    (errors.MljobError("it broke"), 1, "error: it broke"),
    (Preempted("stopped after saving"), 143, "error: stopped after saving"),
    (PeerUnavailableError("ps 0 is gone"), 200, "error: ps 0 is gone"),
    (KeyboardInterrupt(), 130, "error: interrupted"),
    (storage.StorageError("cannot read gs://b/x after 6 attempts"), 1,
     "error: cannot read gs://b/x after 6 attempts"),
    (PermissionError(errno.EACCES, "Permission denied", "/etc/x"), 1,
     "error: [Errno 13] Permission denied: '/etc/x'"),
])
def test_each_kind_of_failure_is_one_line_and_its_status(capsys, exc, status, line):
    assert errors.boundary(raising(exc), program="prog") == status
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n"


def test_a_bug_keeps_its_traceback_and_ends_with_one_line(capsys):
    assert errors.boundary(raising(ZeroDivisionError("division by zero")),
                           program="training") == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert err.splitlines()[-1] == ("error: training failed with an unexpected error "
                                    "(traceback above)")


def test_the_body_s_status_is_the_program_s(capsys):
    assert errors.boundary(lambda: None, program="p") == 0
    assert errors.boundary(lambda: 143, program="p") == 143
    with pytest.raises(SystemExit):
        errors.boundary(raising(SystemExit(2)), program="p")
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_that_is_not_stdout_is_an_error(capsys):
    assert errors.boundary(raising(BrokenPipeError(errno.EPIPE, "Broken pipe")),
                           program="p") == 1
    assert capsys.readouterr().err == "error: [Errno 32] Broken pipe\n"


WRITER = """
import sys
from mljob.errors import boundary
def body():
    for i in range(10**6):
        print("line", i)
sys.exit(boundary(body, program="writer"))
"""


def test_output_closed_by_its_reader_ends_quietly(reaper):
    """`program | head -1`: the reader leaves; the program ends 0, saying nothing."""
    writer = reaper.python("-c", WRITER, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={"PYTHONPATH": ROOT})
    assert writer.stdout.readline() == b"line 0\n"
    writer.stdout.close()
    assert writer.wait(60) == 0
    assert writer.stderr.read() == b""
