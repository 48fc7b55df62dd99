"""A batch prediction job's worker: `python -m predict.batch_worker --job-file F ...`.

It loads the export once, then predicts shards (`predict.offline.shards`) through the same loop
as `predict batch` (`predict.offline.batch.predict_shard`) and publishes each shard's pair of
files, the errors file first and the results file last, each renamed into place (local)
or uploaded whole (object stores): a reader never sees half a file, and a shard is done
when its results file is there.

Two ways to be told which shards:
- from the local supervisor: shard indexes on stdin, one a line; after each it prints
  `{"done": i, "instances": n, "predicted": p, "failed": f}` on stdout, and while
  predicting `{"progress": i, "instances": n, "bytes": b}` about once a second. stdout
  carries nothing else; logs go to stderr.
- as a Kubernetes Indexed Job's pod: `--index N` (default `$JOB_COMPLETION_INDEX`), one
  shard, then exit; a shard already published is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from mljob import storage
from mljob.errors import ascii_digits, first_line
from predict.offline import batch, shards
from predict.errors import PredictError

PROGRESS_EVERY_S = 1.0


def shard_names(index: int, count: int) -> tuple[str, str]:
    tag = f"{index:05d}-of-{count:05d}"
    return f"prediction.results-{tag}", f"prediction.errors_stats-{tag}"


def published(output_path: str, index: int, count: int) -> bool:
    """The shard's results file is there (it is published last)."""
    return storage.exists(storage.join(output_path, shard_names(index, count)[0]))


class Worker:
    def __init__(self, job: dict, worker: int, out=None):
        from predict.runtime import model as models
        self.job = job
        self.shards = [shards.Shard.from_dict(s) for s in job["shards"]]
        self.output = job["output_path"]
        self.out = out or sys.stdout
        self.model = models.load(job["model_dir"])
        self.sig = self.model.signature(job.get("signature_name"))
        local = storage.is_local(self.output)
        if local:
            final = storage.local_path(self.output)
            self.scratch = os.path.join(final, f".prediction-tmp-{job['job_id']}-{worker}")
            os.makedirs(self.scratch, exist_ok=True)
        else:
            self.scratch = tempfile.mkdtemp(prefix="mljob-batch-worker-")
        self.local = local

    def predict(self, index: int) -> batch.Summary:
        shard = self.shards[index]
        names = shard_names(index, len(self.shards))
        summary = batch.Summary()
        reader = shards.Reader(shard, self.sig)
        progress = _Progress(self.out, index, reader)
        paths = [os.path.join(self.scratch, n) for n in names]
        with open(paths[0], "w") as res, open(paths[1], "w") as err:
            batch.predict_shard(self.model, self.sig, reader, self.job["batch_size"], res,
                                err, summary, progress)
        for name, path in zip(names[::-1], paths[::-1], strict=True):  # errors first
            if self.local:
                os.replace(path, os.path.join(storage.local_path(self.output), name))
            else:
                storage.upload_file(path, storage.join(self.output, name))
                os.remove(path)
        return summary

    def serve(self, lines) -> None:
        for line in lines:
            if not line.strip():
                continue
            index = int(line)
            started = time.time()
            summary = self.predict(index)
            ended = time.time()
            print(f"shard {index} published: {summary.line()} in {ended - started:.3f} s "
                  f"(from {started:.3f} to {ended:.3f})", file=sys.stderr, flush=True)
            self._emit({"done": index, "instances": summary.instances,
                        "predicted": summary.predicted, "failed": summary.failed})

    def _emit(self, message: dict) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


class _Progress:
    def __init__(self, out, index: int, reader: shards.Reader):
        self.out, self.index, self.reader = out, index, reader
        self.next = time.monotonic() + PROGRESS_EVERY_S

    def update(self, summary: batch.Summary) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + PROGRESS_EVERY_S
            self.out.write(json.dumps({"progress": self.index,
                                       "instances": summary.instances,
                                       "bytes": self.reader.consumed}) + "\n")
            self.out.flush()


def _set_threads(threads: int) -> None:
    if threads > 0:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predict.batch_worker")
    parser.add_argument("--job-file", required=True, help="The job's prediction plan "
                                                          "(JSON, any storage URL).")
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--index", type=int, default=None,
                        help="Predict this shard and exit (default $JOB_COMPLETION_INDEX "
                             "when set; else shard indexes are read from stdin).")
    args = parser.parse_args(argv)
    index = args.index
    if index is None and ascii_digits(os.environ.get("JOB_COMPLETION_INDEX", "")):
        index = int(os.environ["JOB_COMPLETION_INDEX"])
    worker = None
    try:
        job = json.loads(storage.read_bytes(args.job_file))
        if index is not None and not 0 <= index < len(job["shards"]):
            raise PredictError(f"shard {index} is not one of the job's "
                               f"{len(job['shards'])} shards")
        if index is not None and published(job["output_path"], index, len(job["shards"])):
            print(f"shard {index} is already published; nothing to do", file=sys.stderr)
            return 0
        _set_threads(args.threads)
        worker = Worker(job, args.worker)
        print(f"worker {args.worker}: model {job['model_dir']} loaded", file=sys.stderr,
              flush=True)
        if index is not None:
            summary = worker.predict(index)
            print(f"shard {index}: {summary.line()}", file=sys.stderr)
        else:
            worker.serve(sys.stdin)
        return 0
    except (PredictError, storage.StorageError, OSError) as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return getattr(exc, "exit_status", 1)
    finally:
        if worker is not None:
            worker.close()


if __name__ == "__main__":
    sys.exit(main())
