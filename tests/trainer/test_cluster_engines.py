"""The trainer unchanged under each engine's environment: TF_CONFIG as Kubeflow's TFJob,
Vertex AI and Cloud ML set it, Vertex AI's CLUSTER_SPEC translated from worker pools,
and Vertex AI's AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR moving the
outputs out of the job dir (a real training run, an evaluator following it, and a real
two-process cluster described by CLUSTER_SPEC alone)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from tests.support.common import free_ports, pid_alive
from mljob import cluster
from trainer import task
from mljob.cluster import ClusterConfigError, from_environment
from tests.support.trainer_runs import FAST, ROOT, export_accuracy, lines, read, start, wait_exit

ENGINE_VARIABLES = ("TF_CONFIG", "CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                    "AIP_TENSORBOARD_LOG_DIR")


@pytest.fixture(autouse=True)
def _no_engine_variables(monkeypatch):
    """Every process these tests start sees only the engine variables a test sets."""
    for name in ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _svc(job: str, kind: str, index: int) -> str:
    """A Kubeflow TFJob replica's in-cluster DNS name and port."""
    return f"{job}-{kind}-{index}.default.svc:2222"


def kubeflow(task_type: str, index, *, chief: str = "chief", workers: int = 2, ps: int = 1,
             evaluator_in_cluster: bool = False) -> str:
    """TF_CONFIG as the Training Operator's TFJob (kubeflow.org/v1) sets it."""
    spec = {chief: [_svc("job01", chief, 0)],
            "worker": [_svc("job01", "worker", i) for i in range(workers)]}
    if ps:
        spec["ps"] = [_svc("job01", "ps", i) for i in range(ps)]
    if evaluator_in_cluster:
        spec["evaluator"] = [_svc("job01", "evaluator", 0)]
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index},
                       "environment": "cloud"})


# --- Kubeflow TFJob ------------------------------------------------------------------

@pytest.mark.parametrize("evaluator_in_cluster", [False, True],
                         ids=["evaluator-left-out", "evaluator-listed"])
@pytest.mark.parametrize("task_type, index, is_chief, kind, address", [
    ("chief", 0, True, "ps", "job01-chief-0.default.svc:2222"),
    ("worker", 1, False, "ps", "job01-worker-1.default.svc:2222"),
    ("ps", 0, False, "ps", "job01-ps-0.default.svc:2222"),
    ("evaluator", 0, False, "single", None),
])
def test_kubeflow_tfjob_replicas(task_type, index, is_chief, kind, address,
                                 evaluator_in_cluster):
    info = from_environment({"TF_CONFIG": kubeflow(task_type, index,
                                                   evaluator_in_cluster=evaluator_in_cluster)})
    assert (info.task_type, info.task_index) == (task_type, index)
    assert info.is_chief is is_chief and info.is_evaluator is (task_type == "evaluator")
    assert dict(info.cluster) == {
        "chief": ("job01-chief-0.default.svc:2222",),
        "worker": ("job01-worker-0.default.svc:2222", "job01-worker-1.default.svc:2222"),
        "ps": ("job01-ps-0.default.svc:2222",)}
    assert info.strategy_kind() == kind
    assert info.address == address
    assert info.environment == "cloud" and info.source == "TF_CONFIG"
    assert "evaluator" not in info.tf_config()["cluster"]
    assert info.task_name == f"{task_type}-replica-{index}"


def test_kubeflow_master_and_workers_is_multiworker_under_the_chief_name():
    master = from_environment({"TF_CONFIG": kubeflow("master", 0, chief="master", ps=0)})
    assert master.is_chief and master.task_type == "chief" and master.legacy_master
    assert set(master.cluster) == {"chief", "worker"}
    assert master.tf_config()["cluster"]["chief"] == ["job01-master-0.default.svc:2222"]
    assert master.strategy_kind() == "multiworker"
    assert master.task_name == "master-replica-0"
    worker = from_environment({"TF_CONFIG": kubeflow("worker", 0, chief="master", ps=0)})
    assert not worker.is_chief and worker.strategy_kind() == "multiworker"


def test_kubeflow_index_as_a_string_and_an_evaluator_alone():
    info = from_environment({"TF_CONFIG": kubeflow("worker", "1")})
    assert (info.task_type, info.task_index, info.is_chief) == ("worker", 1, False)
    # An evaluator-only view: the cluster holds nothing TensorFlow trains with.
    alone = from_environment({"TF_CONFIG": json.dumps({
        "cluster": {"evaluator": [_svc("job01", "evaluator", 0)]},
        "task": {"type": "evaluator", "index": "0"}, "environment": "cloud"})})
    assert alone.is_evaluator and not alone.is_chief and alone.cluster == {}
    assert alone.strategy_kind() == "single"


def test_kubeflow_workers_only_make_worker_zero_the_chief():
    config = kubeflow("worker", 0, ps=0)
    spec = json.loads(config)
    del spec["cluster"]["chief"]
    info = from_environment({"TF_CONFIG": json.dumps(spec)})
    assert info.is_chief and info.strategy_kind() == "multiworker"


@pytest.mark.parametrize("change, expected", [
    ({"task": {"type": "evaluator", "index": 1}}, "out of range for 1 evaluator"),
    ({"task": {"type": "worker", "index": "one"}}, "must be a non-negative integer"),
    ({"task": {"type": "Worker", "index": 0}}, "task type 'Worker' is unknown"),
    ({"cluster": {"chief": [_svc("j", "chief", 0)], "worker": {"1": _svc("j", "worker", 1)}},
      "task": {"type": "worker", "index": 1}},
     "lists only task(s) [1] (sparse, as Kubeflow's enableDynamicWorker sets it)"),
])
def test_kubeflow_mistakes_are_one_line(change, expected):
    spec = json.loads(kubeflow("worker", 0, evaluator_in_cluster=True))
    spec.update(change)
    with pytest.raises(ClusterConfigError) as err:
        from_environment({"TF_CONFIG": json.dumps(spec)})
    assert expected in str(err.value) and "\n" not in str(err.value)


# --- Vertex AI -------------------------------------------------------------------------

VERTEX_JOB = json.dumps({"python_module": "trainer.task", "package_uris": [],
                         "job_args": ["--model", "mlp"]})


def vertex_pools(task_pool: str, index: int = 0, *, trial: str = "", workers: int = 2,
                 ps: int = 1, evaluators: int = 1) -> dict:
    """CLUSTER_SPEC as Vertex AI sets it: worker pools by position, `job` a JSON string."""
    def hosts(pool, n):
        return [f"cmle-training-{pool}-0123abcd-{i}:2222" for i in range(n)]
    spec = {"workerpool0": hosts("workerpool0", 1)}
    for pool, count in (("workerpool1", workers), ("workerpool2", ps),
                        ("workerpool3", evaluators)):
        if count:
            spec[pool] = hosts(pool, count)
    return {"cluster": spec, "environment": "cloud",
            "task": {"type": task_pool, "index": index, "trial": trial}, "job": VERTEX_JOB}


@pytest.mark.parametrize("pool, index, task_type, is_chief, kind", [
    ("workerpool0", 0, "chief", True, "ps"),
    ("workerpool1", 1, "worker", False, "ps"),
    ("workerpool2", 0, "ps", False, "ps"),
    ("workerpool3", 0, "evaluator", False, "single"),
])
def test_vertex_cluster_spec_alone_is_translated(pool, index, task_type, is_chief, kind):
    info = from_environment({"CLUSTER_SPEC": json.dumps(vertex_pools(pool, index))})
    assert (info.task_type, info.task_index, info.is_chief) == (task_type, index, is_chief)
    assert dict(info.cluster) == {
        "chief": ("cmle-training-workerpool0-0123abcd-0:2222",),
        "worker": ("cmle-training-workerpool1-0123abcd-0:2222",
                   "cmle-training-workerpool1-0123abcd-1:2222"),
        "ps": ("cmle-training-workerpool2-0123abcd-0:2222",)}
    assert info.strategy_kind() == kind
    assert info.source == "CLUSTER_SPEC" and info.environment == "cloud"
    assert info.trial is None  # "" outside hyperparameter tuning
    assert info.tf_config()["task"] == {"type": task_type, "index": index}


def test_vertex_cluster_spec_multiworker_single_node_and_trial():
    spec = vertex_pools("workerpool1", 0, trial="7", ps=0, evaluators=0)
    info = from_environment({"CLUSTER_SPEC": json.dumps(spec)})
    assert info.strategy_kind() == "multiworker" and not info.is_chief
    assert info.trial == "7" and info.task_name == "worker-replica-0"
    # One replica: Vertex AI still sets CLUSTER_SPEC, naming only workerpool0.
    single = vertex_pools("workerpool0", workers=0, ps=0, evaluators=0)
    info = from_environment({"CLUSTER_SPEC": json.dumps(single)})
    assert info.is_chief and info.is_single_node and info.strategy_kind() == "single"


def test_vertex_tf_config_wins_over_cluster_spec():
    tf_config = {"cluster": {"chief": ["vertex-chief-0:2222"],
                             "worker": ["vertex-worker-0:2222"]},
                 "environment": "cloud", "task": {"type": "worker", "index": 0, "trial": ""},
                 "job": VERTEX_JOB}
    spec = json.dumps(vertex_pools("workerpool1", 1))  # a different cluster: ignored
    info = from_environment({"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": spec})
    assert info.source == "TF_CONFIG" and info.trial is None
    assert dict(info.cluster) == {"chief": ("vertex-chief-0:2222",),
                                  "worker": ("vertex-worker-0:2222",)}
    assert (info.task_type, info.task_index, info.strategy_kind()) == ("worker", 0,
                                                                       "multiworker")
    # `job` as an object works too, and a malformed CLUSTER_SPEC is not even read.
    tf_config["job"] = json.loads(VERTEX_JOB)
    info = from_environment({"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": "{oops"})
    assert info.task_type == "worker"
    # A blank TF_CONFIG counts as unset.
    info = from_environment({"TF_CONFIG": "  ", "CLUSTER_SPEC": spec})
    assert info.source == "CLUSTER_SPEC" and info.task_index == 1


def test_cloud_ml_legacy_master_with_job_and_trial():
    config = {"cluster": {"master": ["master-0:2222"], "worker": ["worker-0:2222",
                                                                  "worker-1:2222"],
                          "ps": ["ps-0:2222"]},
              "environment": "cloud", "task": {"type": "master", "index": 0, "trial": "3"},
              "job": {"scaleTier": "STANDARD_1", "args": ["--train-steps", "9"],
                      "hyperparameters": {"goal": "MAXIMIZE"}}}
    info = from_environment({"TF_CONFIG": json.dumps(config)})
    assert info.is_chief and info.legacy_master and info.task_type == "chief"
    assert info.trial == "3" and info.strategy_kind() == "ps"
    assert info.task_name == "master-replica-0"
    assert set(info.tf_config()["cluster"]) == {"chief", "worker", "ps"}


def _spec(**changes) -> str:
    spec = vertex_pools("workerpool1", 0)
    for key, value in changes.items():
        spec[key] = value
    return json.dumps(spec)


def _pools(**pools) -> dict:
    return {name: [f"h{name[-1]}-{i}:2222" for i in range(n)] for name, n in pools.items()}


CLUSTER_SPEC_MALFORMED = {
    "not json": ("{cluster: nope", "CLUSTER_SPEC is not valid JSON"),
    "not an object": ('["workerpool0"]', "CLUSTER_SPEC must be a JSON object, not list"),
    "unknown key": (_spec(clusters={}), "CLUSTER_SPEC has unknown key 'clusters'"),
    "cluster not an object": (_spec(cluster=["h:1"]),
                              "CLUSTER_SPEC 'cluster' must be an object"),
    "task not an object": (_spec(task="workerpool1"), "CLUSTER_SPEC 'task' must be an object"),
    "workerpool4": (_spec(cluster=_pools(workerpool0=1, workerpool1=1, workerpool4=1)),
                    "unknown worker pool 'workerpool4'"),
    "TF job name as a pool": (_spec(cluster={"chief": ["h:1"]}), "unknown worker pool 'chief'"),
    "TF task name": (_spec(task={"type": "worker", "index": 0}),
                     "CLUSTER_SPEC task type 'worker' is unknown; use Vertex AI's pools"),
    "task pool not a string": (_spec(task={"type": ["workerpool1"], "index": 0}),
                               "task type ['workerpool1'] is unknown"),
    "two chiefs": (_spec(cluster=_pools(workerpool0=2, workerpool1=1)),
                   "workerpool0 has 2 replicas, but it is the chief; set its replicaCount"),
    "no workerpool0": (_spec(cluster=_pools(workerpool1=2)), "no workerpool0"),
    "index out of range": (_spec(task={"type": "workerpool1", "index": 2}),
                           "task index 2 is out of range for 2 worker(s)"),
    "task in a missing pool": (_spec(cluster=_pools(workerpool0=1, workerpool1=1),
                                     task={"type": "workerpool2", "index": 0}),
                               "CLUSTER_SPEC task is ps 0, but the cluster has no 'ps' job"),
    "bad address": (_spec(cluster={"workerpool0": ["h"], "workerpool1": ["h:2"]}),
                    "CLUSTER_SPEC cluster job 'chief' has bad address 'h'"),
    "ps without workers": (_spec(cluster=_pools(workerpool0=1, workerpool2=1),
                                 task={"type": "workerpool0", "index": 0}),
                           "parameter servers but no worker"),
    "deeply nested": ("[" * 100000 + "]" * 100000, "CLUSTER_SPEC"),
}


@pytest.mark.parametrize("case", sorted(CLUSTER_SPEC_MALFORMED))
def test_malformed_cluster_spec_is_one_clear_error(case):
    text, expected = CLUSTER_SPEC_MALFORMED[case]
    with pytest.raises(ClusterConfigError) as err:
        from_environment({"CLUSTER_SPEC": text})
    message = str(err.value)
    assert expected in message, message
    assert "\n" not in message and len(message) < 400


def test_seed_flags_and_cluster_spec_together_are_refused():
    with pytest.raises(ClusterConfigError, match="both CLUSTER_SPEC and --ps-hosts"):
        from_environment({"CLUSTER_SPEC": _spec()}, worker_hosts="h:1,h:2",
                         job_name="worker", task_index=0)


pool_names = st.sampled_from(list(cluster.VERTEX_POOLS) + ["workerpool4", "chief", ""])
json_leaf = st.none() | st.booleans() | st.integers(-3, 5) | st.sampled_from(
    ["h:1", "h:2", "h:3", "bad", "", "workerpool0", "workerpool1", "0", "1"])
cluster_specs = st.fixed_dictionaries({}, optional={
    "cluster": st.dictionaries(pool_names, st.lists(st.sampled_from(
        ["h:1", "h:2", "h:3", "h:4", "bad"]), max_size=3) | json_leaf, max_size=5)
    | json_leaf,
    "task": st.fixed_dictionaries({}, optional={
        "type": pool_names | json_leaf, "index": st.integers(-1, 3) | json_leaf,
        "trial": json_leaf}) | json_leaf,
    "environment": json_leaf, "job": json_leaf | st.just(VERTEX_JOB),
})


@settings(max_examples=300, deadline=None)
@given(cluster_specs)
def test_cluster_spec_parser_never_fails_another_way(spec):
    try:
        info = from_environment({"CLUSTER_SPEC": json.dumps(spec)})
    except ClusterConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert set(info.cluster) <= {"chief", "worker", "ps"}
    assert len(info.cluster.get("chief", ())) <= 1
    if info.cluster and not info.is_evaluator:
        assert info.address is not None


# --- through `python -m trainer.task`: exit 2 and one line, before TensorFlow loads ------

def _clean_env(**changes) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_VARIABLES}
    env.update(changes)
    return env


def test_bad_cluster_spec_exits_2_before_tensorflow_loads(tmp_path):
    code = ("import sys; from trainer import task; status = task.main(['--model', 'mlp', "
            f"'--job-dir', {str(tmp_path / 'job')!r}]); "
            "print('tensorflow' in sys.modules); sys.exit(status)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env=_clean_env(CLUSTER_SPEC=CLUSTER_SPEC_MALFORMED["workerpool4"][0]))
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "False"
    assert done.stderr.startswith("error: CLUSTER_SPEC cluster has unknown worker pool "
                                  "'workerpool4'") and done.stderr.count("\n") == 1
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("variable", ["AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                                      "AIP_TENSORBOARD_LOG_DIR"])
def test_bad_aip_url_is_a_usage_error_naming_the_variable(monkeypatch, capsys, tmp_path,
                                                          variable):
    monkeypatch.setenv(variable, "nosuchscheme://bucket/out/x/")
    assert task.main([*FAST, "--job-dir", str(tmp_path / "job")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {variable}: cannot use 'nosuchscheme://bucket/out/x'")
    assert err.count("\n") == 1 and "use a local path, file://, memory:// or gs:// URL" in err
    assert not (tmp_path / "job").exists()


# --- Vertex AI's output variables ------------------------------------------------------

def test_outputs_resolve_from_the_aip_variables(gcs_emulator):
    env = {"AIP_MODEL_DIR": "gs://bucket/base/model/",
           "AIP_CHECKPOINT_DIR": "gs://bucket/base/checkpoints/",
           "AIP_TENSORBOARD_LOG_DIR": "gs://bucket/base/logs/"}
    out = task.resolve_outputs(None, env)  # no --job-dir: the parent of AIP_MODEL_DIR
    assert (out.job_dir, out.export_url, out.checkpoint_url, out.summary_url) == (
        "gs://bucket/base", "gs://bucket/base/model", "gs://bucket/base/checkpoints",
        "gs://bucket/base/logs")
    assert out.from_environment == ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                                    "AIP_TENSORBOARD_LOG_DIR")
    # --job-dir given: it stays the job dir; each variable still moves its own output.
    out = task.resolve_outputs("memory://jobs/j1", {"AIP_CHECKPOINT_DIR": "/tmp/ck/",
                                                    "AIP_MODEL_DIR": " "})
    assert (out.job_dir, out.export_url, out.checkpoint_url, out.summary_url) == (
        "memory://jobs/j1", "memory://jobs/j1/model", "/tmp/ck", "memory://jobs/j1/summaries")
    # None set: the job dir's own folders, as before.
    out = task.resolve_outputs("file:///tmp/j2", {})
    assert (out.export_url, out.checkpoint_url, out.summary_url, out.from_environment) == (
        "file:///tmp/j2/model", "file:///tmp/j2/checkpoints", "file:///tmp/j2/summaries", ())
    # A hyperparameter trial's folder: the job dir is the trial's.
    out = task.resolve_outputs(None, {"AIP_MODEL_DIR": "file:///out/12/model/"})
    assert out.job_dir == "file:///out/12"


def test_aip_model_dir_without_a_parent_needs_a_job_dir(gcs_emulator):
    from trainer.errors import UsageError
    with pytest.raises(UsageError, match="AIP_MODEL_DIR 'gs://bucket' has no parent folder "
                                         "to use as the job dir; give --job-dir"):
        task.resolve_outputs(None, {"AIP_MODEL_DIR": "gs://bucket/"})


def test_aip_directories_take_the_export_checkpoints_and_summaries(reaper, tmp_path):
    """A real single-node run under Vertex AI's output variables, then an evaluator that
    finds the chief's checkpoints in AIP_CHECKPOINT_DIR."""
    model, checkpoints, logs, job = (tmp_path / "model", tmp_path / "ckpts",
                                     tmp_path / "tb", tmp_path / "job")
    env = {"AIP_MODEL_DIR": f"{model}/", "AIP_CHECKPOINT_DIR": f"{checkpoints}/",
           "AIP_TENSORBOARD_LOG_DIR": f"{logs}/"}
    args = [*FAST, "--train-steps", "20", "--checkpoint-every", "10", "--eval-every", "20",
            "--log-every", "10", "--job-dir", str(job)]
    chief = start(reaper, tmp_path / "chief.log", args, env=env)
    assert wait_exit(chief, 180, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")
    assert lines(tmp_path / "chief.log", "outputs: ") == [
        f"outputs: model={model} checkpoints={checkpoints} summaries={logs} (from "
        "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR)"]
    assert lines(tmp_path / "chief.log", "exported model to") == [f"exported model to {model}"]

    assert (model / "saved_model.pb").exists()
    assert export_accuracy(str(model)) > 0.3
    assert sorted(os.listdir(checkpoints)) == [
        "checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index",
        "ckpt-20.data-00000-of-00001", "ckpt-20.index"]
    assert sorted(os.listdir(logs)) == ["eval", "train"]
    from tensorboard.backend.event_processing import event_accumulator
    train = event_accumulator.EventAccumulator(str(logs / "train"))
    train.Reload()
    assert [e.step for e in train.Tensors("metrics/loss")] == [1, 10, 20]
    assert not job.exists() or not os.listdir(job)  # nothing under the job dir

    # The evaluator reads the same checkpoint folder and writes under the same logs.
    evaluator = start(reaper, tmp_path / "eval.log", args, env=dict(
        env, TF_CONFIG='{"cluster": {}, "task": {"type": "evaluator", "index": 0}}'))
    assert wait_exit(evaluator, 120, tmp_path / "eval.log") == 0, read(tmp_path / "eval.log")
    assert lines(tmp_path / "eval.log", "evaluator started: ") == [
        f"evaluator started: following {checkpoints} until step 20"]
    assert lines(tmp_path / "eval.log", "evaluator finished: step=20")
    assert glob.glob(str(logs / "eval" / f"*.{evaluator.pid}.*"))
    assert not job.exists() or not os.listdir(job)


def test_two_process_cluster_from_cluster_spec_alone(reaper, tmp_path):
    """Vertex AI's CLUSTER_SPEC with no TF_CONFIG: chief (workerpool0) and one worker
    (workerpool1) train together under MultiWorkerMirroredStrategy."""
    chief_port, worker_port = free_ports(2)
    pools = {"workerpool0": [f"127.0.0.1:{chief_port}"],
             "workerpool1": [f"127.0.0.1:{worker_port}"]}

    def spec(pool):
        return json.dumps({"cluster": pools, "environment": "cloud", "job": VERTEX_JOB,
                           "task": {"type": pool, "index": 0, "trial": ""}})

    args = [*FAST, "--train-steps", "40", "--checkpoint-every", "0", "--eval-every", "0",
            "--log-every", "20", "--job-dir", str(tmp_path / "job")]
    worker = start(reaper, tmp_path / "worker.log", args,
                   env={"CLUSTER_SPEC": spec("workerpool1")})
    chief = start(reaper, tmp_path / "chief.log", args,
                  env={"CLUSTER_SPEC": spec("workerpool0")})
    assert wait_exit(chief, 180, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")
    assert wait_exit(worker, 60, tmp_path / "worker.log") == 0, read(tmp_path / "worker.log")
    assert lines(tmp_path / "chief.log", "cluster: ") == [
        "cluster: 1 chief, 1 worker from CLUSTER_SPEC (Vertex AI worker pools)"]
    started = lines(tmp_path / "chief.log", "training started:")[0]
    assert started.startswith("training started: strategy=multiworker step=0 "
                              "train_steps=40 ") and " replicas=2 " in started
    assert lines(tmp_path / "chief.log", "training finished: step=40")
    assert (tmp_path / "job" / "model" / "saved_model.pb").exists()
    assert not pid_alive(chief.pid) and not pid_alive(worker.pid)
