"""TF Serving's version lifecycle in process, with real exports: load retries, warmup
replayed before traffic, config reloads with TF Serving's label rule, one log line per
version event, and the batcher's queues (per version, bounded, padded)."""
import logging
import shutil
import threading
import time

import numpy as np
import pytest

from predict.runtime import batching, protos
from predict.models import warmup
from predict.errors import UsageError
from predict.models.repository import NotFoundError, Repository
from predict.models.versions import LoadOptions, ModelConfig
from tests.support.tf_serving import (LABELS, classifier_export, example, features,
                                      regressor_export, warmup_file)

pytest.importorskip("predict.serving_api.apis.prediction_log_pb2")
ROWS = features(3, seed=5)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {"c1": classifier_export(str(root / "c1"), seed=1),
            "c2": classifier_export(str(root / "c2"), seed=2),
            "r": regressor_export(str(root / "r"), seed=3)}


def _broken(path):
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"not a SavedModel")


def _messages(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "predict.repository"]


def test_a_failed_load_is_retried_and_each_event_is_one_log_line(tmp_path, exports, caplog):
    caplog.set_level(logging.INFO, logger="predict.repository")
    base = tmp_path / "base"
    _broken(base / "1")

    def repair():  # the export is fixed while the server waits to retry
        time.sleep(0.5)
        shutil.rmtree(base / "1")
        shutil.copytree(exports["c1"], base / "1")
    fixer = threading.Thread(target=repair)
    fixer.start()
    repo = Repository([ModelConfig("m", base_path=str(base))], poll_seconds=0,
                      load_options=LoadOptions(max_retries=3, retry_interval_s=2.0))
    try:
        repo.start()
        fixer.join()
        assert repo.get("m").available() == [1]
        messages = _messages(caplog)
        assert messages[0] == f"model m: loading version 1 from {base / '1'}"
        assert messages[1].startswith("model m: version 1 failed to load (attempt 1 of 4): ")
        assert messages[1].endswith("; retrying in 2s")
        assert messages[2:] == [f"model m: loading version 1 from {base / '1'}",
                                "model m: version 1 available"]
    finally:
        repo.stop()


def test_retries_end_in_a_failed_version_with_its_error(tmp_path, exports, caplog):
    caplog.set_level(logging.INFO, logger="predict.repository")
    base = tmp_path / "base"
    shutil.copytree(exports["c1"], base / "1")
    repo = Repository([ModelConfig("m", base_path=str(base))], poll_seconds=0,
                      load_options=LoadOptions(max_retries=1, retry_interval_s=0.05))
    try:
        repo.start()
        _broken(base / "2")
        repo.get("m").poll()
        status = {s["version"]: s for s in repo.get("m").status()}
        assert status["2"]["state"] == "END" and "SavedModel" in \
            status["2"]["status"]["error_message"]
        assert repo.get("m").available() == [1]  # a failed version never replaces a good one
        failures = [m for m in _messages(caplog) if "failed to load" in m]
        assert len(failures) == 2 and "(attempt 1 of 2)" in failures[0]
        assert failures[1].startswith("model m: version 2 failed to load: ")
    finally:
        repo.stop()


def test_warmup_runs_before_traffic_and_a_bad_file_fails_the_load(tmp_path, exports, caplog):
    from predict.models.publish import publish
    caplog.set_level(logging.INFO, logger="predict.repository")
    base = str(tmp_path / "base")
    good = warmup_file(str(tmp_path / "good"), ROWS)
    assert publish(exports["c1"], base, warmup_requests=good) == 1
    published = tmp_path / "base" / "1" / "assets.extra" / "tf_serving_warmup_requests"
    assert published.read_bytes() == open(good, "rb").read()
    assert not (tmp_path / "c1" / "assets.extra").exists()  # the source is untouched
    calls = []

    def loader(url):
        from predict.runtime import model as models
        model = models.load(url)
        real = model.predict
        model.predict = lambda batch, name=None: calls.append(name) or real(batch, name)
        return model
    repo = Repository([ModelConfig("m", base_path=base)], poll_seconds=0, loader=loader,
                      load_options=LoadOptions(max_retries=0,
                                               warmup=warmup.replayer(2, 100)))
    try:
        repo.start()
        # each record twice, in order, before the version took traffic
        assert calls == ["serving_default"] * 2 + ["classification"] * 2
        assert "model m: version 1 warmed up with 4 requests" in _messages(caplog)
        bad = warmup_file(str(tmp_path / "bad"), ROWS, bad=True)
        with pytest.raises(UsageError, match="warmup requests file .* does not exist"):
            publish(exports["c2"], base, warmup_requests=str(tmp_path / "missing"))
        shutil.copytree(exports["c2"], tmp_path / "base" / "2")
        target = tmp_path / "base" / "2" / "assets.extra"
        target.mkdir()
        shutil.copy(bad, target / "tf_serving_warmup_requests")
        repo.get("m").poll()
        (failed,) = [s for s in repo.get("m").status() if s["version"] == "2"]
        assert failed["state"] == "END"
        assert failed["status"]["error_message"].startswith("warmup failed: ")
        assert repo.get("m").available() == [1]
    finally:
        repo.stop()


def test_reload_adds_removes_and_checks_labels_as_tf_serving(tmp_path, exports):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(exports["c1"], a / "1")
    shutil.copytree(exports["r"], b / "7")
    repo = Repository([ModelConfig("a", base_path=str(a))], poll_seconds=0,
                      load_options=LoadOptions(max_retries=0))
    try:
        repo.start()
        repo.reload([ModelConfig("a", base_path=str(a)), ModelConfig("b", base_path=str(b))])
        assert repo.get("b").available() == [7]
        with pytest.raises(UsageError, match="label 'stable' names version 9, which is not "
                                             "available"):
            repo.reload([ModelConfig("b", base_path=str(b), labels={"stable": 9})])
        assert repo.get("b").config.labels == {}  # the labels before stay
        repo.labels_for_unavailable = True  # --allow_version_labels_for_unavailable_models
        repo.reload([ModelConfig("b", base_path=str(b), labels={"stable": 9})])
        assert repo.get("b").config.labels == {"stable": 9}
        assert sorted(repo.models) == ["b"]  # "a" left the config and was unloaded
        with pytest.raises(NotFoundError, match="model 'a' not found"):
            repo.get("a")
    finally:
        repo.stop()


class _Counting:
    """A loaded model whose calls are recorded (batch sizes), answering as itself."""

    def __init__(self, model):
        self.model, self.sizes = model, []
        self.signatures, self.source = model.signatures, model.source

    def signature(self, name=None):
        return self.model.signature(name)

    def predict(self, batch, name=None):
        self.sizes.append(len(next(iter(batch.values()))))
        return self.model.predict(batch, name)


def test_batch_queues_are_per_version(exports):
    """Two versions of one model, requests at once: each answer is its own version's
    (with queues keyed by name only, they would share calls and answers)."""
    from predict.runtime import model as models
    v1, v2 = _Counting(models.load(exports["c1"])), _Counting(models.load(exports["c2"]))
    want = {n: m.model.predict({"x": ROWS[:1]})["outputs"] for n, m in ((1, v1), (2, v2))}
    assert not np.allclose(want[1], want[2])
    batcher = batching.Batcher(protos.BatchingParameters(max_batch_size=8,
                                                         batch_timeout_micros=300_000))
    results = {}

    def ask(version, model):
        results[version] = batcher.wrap(model, "m", version).predict({"x": ROWS[:1]})
    threads = [threading.Thread(target=ask, args=a) for a in ((1, v1), (2, v2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for version in (1, 2):
        np.testing.assert_allclose(results[version]["outputs"], want[version], rtol=1e-6)
    assert v1.sizes[-1] == 1 and v2.sizes[-1] == 1


def test_full_queue_is_unavailable_and_batches_pad_to_allowed_sizes(exports):
    from predict.runtime import model as models
    model = _Counting(models.load(exports["c1"]))
    params = protos.BatchingParameters(max_batch_size=3, batch_timeout_micros=1_500_000,
                                       max_enqueued_batches=1, allowed_batch_sizes=(2, 3))
    batcher = batching.Batcher(params).wrap(model, "m", 1)
    first = {}
    waiting = threading.Thread(target=lambda: first.update(batcher.predict({"x": ROWS[:2]})))
    waiting.start()
    time.sleep(0.3)
    with pytest.raises(batching.Unavailable, match="max_enqueued_batches"):
        batcher.predict({"x": ROWS[:2]})  # does not fit the open batch, no room for more
    waiting.join()
    alone = model.model.predict({"x": ROWS[:2]})["outputs"]
    np.testing.assert_allclose(first["outputs"], alone, rtol=1e-6)
    one = batching.Batcher(protos.BatchingParameters(
        max_batch_size=3, batch_timeout_micros=0, allowed_batch_sizes=(2, 3)))
    answer = one.wrap(model, "m", 1).predict({"x": ROWS[:1]})
    assert model.sizes[-1] == 2 and len(answer["outputs"]) == 1  # padded to 2, one answer
    np.testing.assert_allclose(answer["outputs"], alone[:1], rtol=1e-6)


def test_variable_length_inputs_pad_with_the_first_element():
    merged = batching._concat([np.array([[5, 6]]), np.array([[7, 8, 9]])])
    np.testing.assert_array_equal(merged, [[5, 6, 5], [7, 8, 9]])


def test_batching_parameters_file_is_tf_servings_text_proto(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 5000 }\n"
                    "max_enqueued_batches { value: 4 }\nnum_batch_threads { value: 2 }\n"
                    "allowed_batch_sizes: 8\nallowed_batch_sizes: 32\n"
                    "pad_variable_length_inputs: true\n")
    assert protos.read_batching(str(path), 2) == protos.BatchingParameters(
        32, 5000, 4, 2, (8, 32), True)
    for text, words in [("max_batch_size: 3", "is not a BatchingParameters text proto"),
                        ("max_batch_size { value: 8 } allowed_batch_sizes: 4",
                         "the last entry in allowed_batch_sizes must equal max_batch_size"),
                        ("max_batch_size { value: 0 }", "max_batch_size must lie in 1.."),
                        ("enable_large_batch_splitting { value: true }",
                         "enable_large_batch_splitting is not implemented")]:
        path.write_text(text)
        with pytest.raises(UsageError, match=words):
            protos.read_batching(str(path), 2)


def test_classify_and_regress_use_the_exports_labels(exports):
    from predict.runtime import inference, model as models
    classifier = models.load(exports["c1"])
    name, rows = inference.classify(classifier, "classification",
                                    [example(r) for r in ROWS])
    want = classifier.predict({"x": ROWS})["outputs"]
    assert name == "classification" and [[c for c, _ in row] for row in rows] == [LABELS] * 3
    np.testing.assert_allclose([[s for _, s in row] for row in rows], want, rtol=1e-6)
    regressor = models.load(exports["r"])
    _, values = inference.regress(regressor, "regression", [example(r) for r in ROWS])
    np.testing.assert_allclose(values, regressor.predict({"x": ROWS})["outputs"][:, 0],
                               rtol=1e-6)


@pytest.mark.parametrize("field, words", [
    ("model_type: OTHER", "model_type 'OTHER' is not served"),
    ('model_type: TENSORFLOW model_platform: "tensorflow"',
     "Illegal setting both model_type (deprecated) and model_platform"),
    ("logging_config { sampling_config { sampling_rate: 0.1 } }",
     "log collector type '' is not served; use type: \"tfrecord\""),
    ('logging_config { log_collector_config { type: "tfrecord" filename_prefix: "l" } '
     "sampling_config { sampling_rate: 2 } }", "sampling_rate must lie in [0, 1]"),
    ('logging_config { log_collector_config { type: "tfrecord" filename_prefix: "gs://b/l" } }',
     "needs filename_prefix, a local path"),
])
def test_model_config_fields_tf_serving_checks(tmp_path, field, words):
    from predict.models import config
    path = tmp_path / "models.config"
    path.write_text(f'model_config_list {{ config {{ name: "m" base_path: "/b" {field} }} }}')
    with pytest.raises(UsageError) as raised:
        config.read(str(path))
    assert words in str(raised.value)
    path.write_text('model_config_list { config { name: "m" base_path: "/b" '
                    'model_type: TENSORFLOW } }')
    assert config.read(str(path))[0].name == "m"  # the deprecated spelling of tensorflow
