"""A tuning job's trials in TensorBoard's HParams dashboard.

TensorBoard compares trials by parameter when it finds the HParams plugin's summaries:
the experiment (every parameter's domain and the metric) in the study's root folder, and
in each trial's folder that trial's session: its parameter values when it starts, then
the metric as scalars under its tag, its end and status when it ends. The tuner writes them with the
plugin's own protos (`tensorboard.plugins.hparams`, no TensorFlow), each as one whole
event file (`events.out.tfevents.<time>.mljob-hparams`) through `mljob.storage`, so a
gs:// job dir gets them as a local one does:

    <job-dir>/events.out.tfevents...           the experiment: domains and the metric
    <job-dir>/<trialId>/events.out.tfevents... trial <trialId>: its values (at its start)
    <job-dir>/<trialId>/events.out.tfevents... trial <trialId>: metric, status (at its end)

`tensorboard --logdir <job-dir>` then lists every trial in its HParams tab, with the
trainer's own curves beside them (`<trialId>/summaries/...`). A trial is listed from its
start, and compared once it has ended. Without the `tensorboard` package (the `tuning`
extra installs it) nothing is written and the tuner says so once.
"""
from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Mapping, Sequence

from mljob import hypertune, storage
from submit.jobdef.tuning_spec import Parameter, TuningSpec

log = logging.getLogger(__name__)


def available() -> bool:
    try:
        import tensorboard.plugins.hparams.summary_v2  # noqa: F401
    except ImportError:
        return False
    return True


def _file_name() -> str:
    return f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.mljob-hparams"


def _events(summaries: Sequence[tuple[int, object]]) -> bytes:
    """An event file's bytes: the version record, then each (step, Summary)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    now = time.time()
    writer.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2")
                 .SerializeToString())
    for step, summary in summaries:
        writer.write(event_pb2.Event(wall_time=now, step=step, summary=summary)
                     .SerializeToString())
    return buffer.getvalue()


def _domain(p: Parameter):
    from tensorboard.plugins.hparams import summary_v2 as hp
    if p.type == "DOUBLE":
        low, high = p.bounds
        return hp.RealInterval(float(low), float(high))
    if p.type == "INTEGER":
        low, high = p.bounds
        return hp.IntInterval(int(low), int(high))
    if p.type == "CATEGORICAL":
        return hp.Discrete([str(v) for v in p.values])
    return hp.Discrete([float(v) for v in p.values])  # DISCRETE


def experiment(spec: TuningSpec) -> bytes:
    """The study root's event file: every parameter's domain and the metric."""
    from tensorboard.plugins.hparams import summary_v2 as hp
    goal = "higher is better" if spec.maximize else "lower is better"
    config = hp.hparams_config_pb(
        [hp.HParam(p.name, _domain(p)) for p in spec.params],
        [hp.Metric(spec.metric_tag, display_name=spec.metric_tag,
                   description=f"the tuning objective ({spec.goal}: {goal})")])
    return _events([(0, config)])


def session_start(spec: TuningSpec, trial_id: str, params: Mapping[str, object],
                  start_time: float) -> bytes:
    """A trial's first event file: its session (the parameter values), so TensorBoard
    lists it while it runs."""
    from tensorboard.plugins.hparams import summary_v2 as hp
    values = {p.name: _value(p, params[p.name]) for p in spec.params if p.name in params}
    return _events([(0, hp.hparams_pb(values, trial_id=trial_id,
                                      start_time_secs=start_time))])


def session_end(spec: TuningSpec, reports: Sequence[hypertune.Report], *, succeeded: bool,
                end_time: float) -> bytes:
    """A trial's last event file: each value of the metric it reported, and its end."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    status = api_pb2.STATUS_SUCCESS if succeeded else api_pb2.STATUS_FAILURE
    end = summary_pb2.Summary()
    end.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                  metadata=metadata.create_summary_metadata(
                      plugin_data_pb2.HParamsPluginData(
                          session_end_info=plugin_data_pb2.SessionEndInfo(
                              status=status, end_time_secs=end_time))))
    metrics = [(r.step, scalar_pb(spec.metric_tag, float(r.value))) for r in reports]
    last = max([r.step for r in reports] + [0])
    return _events([*metrics, (last, end)])


def _value(p: Parameter, value: object) -> object:
    if p.type == "CATEGORICAL":
        return str(value)
    return float(value) if p.type in ("DOUBLE", "DISCRETE") else int(value)  # type: ignore


def write(folder: str, data: bytes) -> None:
    """One whole event file in folder (a path or any storage URL)."""
    storage.write_bytes(storage.join(folder, _file_name()), data)


class Board:
    """The tuner's writer: the experiment when the study starts, each trial as it ends.
    A failed write is a warning: TensorBoard's view must never fail the job."""

    def __init__(self, spec: TuningSpec, root: str):
        self.spec = spec
        self.root = root
        self.on = available()
        if not self.on:
            log.warning("TensorBoard's HParams view is not written: the Python package "
                        "'tensorboard' is missing (pip install -e '.[tuning]')")

    def start(self) -> None:
        self._write(self.root, lambda: experiment(self.spec))

    def started(self, trial_id: str, folder: str | None, params: Mapping[str, object],
                start_time: float) -> None:
        self._write(folder or storage.join(self.root, trial_id),
                    lambda: session_start(self.spec, trial_id, params, start_time))

    def ended(self, trial_id: str, folder: str | None,
              reports: Sequence[hypertune.Report], *, succeeded: bool) -> None:
        self._write(folder or storage.join(self.root, trial_id), lambda: session_end(
            self.spec, reports, succeeded=succeeded, end_time=time.time()))

    def _write(self, folder: str, data) -> None:
        if not self.on:
            return
        try:
            write(folder, data())
        except Exception as exc:
            log.warning("cannot write TensorBoard's HParams summaries to %s: %s", folder, exc)
