"""TF_CONFIG and the seeds' cluster flags, parsed into ClusterInfo: every accepted shape,
every malformed case (message and exit status, before any TensorFlow server starts),
and property-based checks that no input makes the parser fail any other way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from mljob import cluster
from mljob.cluster import ClusterConfigError, ClusterInfo, parse_flags, parse_tf_config

CLOUD_ML = {
    "cluster": {"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"],
                "worker": ["127.0.0.1:2224", "127.0.0.1:2225"]},
    "environment": "cloud", "job": {"scaleTier": "CUSTOM", "args": ["--train-steps", "9"]},
    "task": {"type": "worker", "index": 1, "trial": "1"},
}


def tf_config(**changes):
    config = json.loads(json.dumps(CLOUD_ML))
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return json.dumps(config)


def test_cloud_ml_worker():
    info = parse_tf_config(tf_config())
    assert (info.task_type, info.task_index) == ("worker", 1)
    assert info.num_workers == 2 and info.num_ps == 1
    assert not info.is_chief and not info.is_single_node
    assert info.environment == "cloud" and info.trial == "1"
    assert info.address == "127.0.0.1:2225"
    assert info.task_name == "worker-replica-1"
    assert info.strategy_kind() == "ps"


def test_master_is_the_legacy_chief():
    config = json.loads(tf_config())
    config["cluster"]["master"] = config["cluster"].pop("chief")
    config["task"] = {"type": "master", "index": 0}
    info = parse_tf_config(json.dumps(config))
    chief = parse_tf_config(tf_config(task={"type": "chief", "index": 0}))
    assert info.is_chief and info.legacy_master
    assert info.cluster == chief.cluster
    assert info.tf_config() == chief.tf_config()
    assert "master" not in json.dumps(info.tf_config())  # PSS refuses the name
    assert info.task_name == "master-replica-0"


def test_kubeflow_evaluator_inside_cluster_is_left_out_of_training():
    config = json.loads(tf_config(task={"type": "evaluator", "index": 0}))
    config["cluster"]["evaluator"] = ["127.0.0.1:2299"]
    info = parse_tf_config(json.dumps(config))
    assert info.is_evaluator
    assert "evaluator" not in info.cluster
    assert "evaluator" not in info.tf_config()["cluster"]
    assert info.strategy_kind() == "single"
    worker = json.loads(json.dumps(config))
    worker["task"] = {"type": "worker", "index": 0}
    assert "evaluator" not in parse_tf_config(json.dumps(worker)).cluster


@pytest.mark.parametrize("text", [None, "", "  ", '{"cluster": {}}',
                                  '{"cluster": {}, "task": {}, "environment": "cloud"}',
                                  '{"cluster": {"master": ["h:1"]}, '
                                  '"task": {"type": "master", "index": 0}}'])
def test_no_cluster_means_single_node(text):
    info = parse_tf_config(text)
    assert info.is_chief and info.is_single_node
    assert info.strategy_kind() == "single"
    assert info.strategy_kind(num_gpus=2) == "mirrored"


def test_chief_and_workers_without_ps_is_multiworker():
    info = parse_tf_config(tf_config(cluster={"chief": ["h:1"], "worker": ["h:2"]},
                                     task={"type": "chief", "index": 0}))
    assert info.strategy_kind() == "multiworker"
    assert info.is_chief


def test_workers_alone_make_worker_zero_the_chief():
    config = tf_config(cluster={"worker": ["h:1", "h:2"]}, task={"type": "worker", "index": 0})
    assert parse_tf_config(config).is_chief
    other = tf_config(cluster={"worker": ["h:1", "h:2"]}, task={"type": "worker", "index": 1})
    assert not parse_tf_config(other).is_chief


def test_index_as_digit_string_and_sparse_jobs_are_accepted():
    info = parse_tf_config(tf_config(task={"type": "worker", "index": "1"}))
    assert info.task_index == 1
    sparse = json.loads(tf_config())
    sparse["cluster"]["worker"] = {"0": "127.0.0.1:2224", "1": "127.0.0.1:2225"}
    assert parse_tf_config(json.dumps(sparse)).num_workers == 2


def test_seed_flags_make_worker_zero_the_chief():
    chief = parse_flags("h:1", "h:2,h:3,h:4", "worker", 0)
    assert chief.is_chief and chief.cluster["chief"] == ("h:2",)
    assert chief.cluster["worker"] == ("h:3", "h:4")
    worker = parse_flags("h:1", "h:2,h:3,h:4", "worker", 2)
    assert (worker.task_type, worker.task_index, worker.address) == ("worker", 1, "h:4")
    ps = parse_flags("h:1", "h:2,h:3", "ps", 0)
    assert (ps.task_type, ps.address) == ("ps", "h:1")


MALFORMED = {
    "not json": ("{cluster: nope", "not valid JSON"),
    "not an object": ("[1, 2]", "must be a JSON object"),
    "unknown top-level key": (tf_config(clusters={}), "unknown key 'clusters'"),
    "cluster not an object": (tf_config(cluster=["h:1"]), "'cluster' must be an object"),
    "task not an object": (tf_config(task="worker"), "'task' must be an object"),
    "unknown role in cluster": (tf_config(cluster={"chief": ["h:1"], "boss": ["h:2"]},
                                          task={"type": "chief", "index": 0}),
                                "unknown job 'boss'"),
    "unknown task type": (tf_config(task={"type": "leader", "index": 0}),
                          "task type 'leader' is unknown"),
    "index out of range": (tf_config(task={"type": "worker", "index": 2}),
                           "index 2 is out of range for 2 worker"),
    "negative index": (tf_config(task={"type": "worker", "index": -1}), "negative"),
    "index not an integer": (tf_config(task={"type": "worker", "index": 1.5}),
                             "must be a non-negative integer"),
    "index is a bool": (tf_config(task={"type": "worker", "index": True}),
                        "must be a non-negative integer"),
    "task missing from cluster": (tf_config(cluster={"chief": ["h:1"], "worker": ["h:2"]},
                                            task={"type": "ps", "index": 0}),
                                  "has no 'ps' job"),
    "task in empty cluster": (tf_config(cluster={}, task={"type": "worker", "index": 3}),
                              "the cluster is empty"),
    "cluster without task": (tf_config(cluster={"worker": ["h:1"]}, task=None),
                             "no task"),
    "duplicate addresses": (tf_config(cluster={"chief": ["h:1"], "worker": ["h:2"],
                                               "ps": ["h:2"]}),
                            "address h:2 to both worker 0 and ps 0"),
    "ps with no worker": (tf_config(cluster={"chief": ["h:1"], "ps": ["h:2"]},
                                    task={"type": "chief", "index": 0}),
                          "parameter servers but no worker"),
    "ps with no chief": (tf_config(cluster={"worker": ["h:1"], "ps": ["h:2"]},
                                   task={"type": "worker", "index": 0}),
                         "no chief to coordinate"),
    "more than one chief": (tf_config(cluster={"chief": ["h:1", "h:2"], "worker": ["h:3"]},
                                      task={"type": "worker", "index": 0}),
                            "2 chiefs"),
    "both chief and master": (tf_config(cluster={"chief": ["h:1"], "master": ["h:2"],
                                                 "worker": ["h:3"]},
                                        task={"type": "worker", "index": 0}),
                              "both 'chief' and 'master'"),
    "address without port": (tf_config(cluster={"chief": ["h"], "worker": ["h:2"]},
                                       task={"type": "chief", "index": 0}),
                             "bad address 'h'"),
    "port out of range": (tf_config(cluster={"chief": ["h:70000"], "worker": ["h:2"]},
                                    task={"type": "chief", "index": 0}),
                          "bad address 'h:70000'"),
    "hosts not strings": (tf_config(cluster={"chief": [2222], "worker": ["h:2"]},
                                    task={"type": "chief", "index": 0}),
                          "must be a list of 'host:port' strings"),
    "deeply nested": ("[" * 100000 + "]" * 100000, "TF_CONFIG"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_tf_config_is_one_clear_error(case):
    text, expected = MALFORMED[case]
    with pytest.raises(ClusterConfigError) as err:
        parse_tf_config(text)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("args, expected", [
    (("h:1", None, "worker", 0), "--worker-hosts is required"),
    (("h:1", "h:2,h:3", "boss", 0), "--job-name must be 'worker' or 'ps'"),
    (("h:1", "h:2,h:3", "worker", 5), "--task-index 5 is out of range"),
    (("h:1", "h:2", "worker", 0), "parameter servers but no worker"),
    (("h:1", "h:2,nope", "worker", 0), "bad address 'nope'"),
    (("h:1", "h:2,h:1", "worker", 0), "address h:1 to both"),
])
def test_malformed_seed_flags(args, expected):
    with pytest.raises(ClusterConfigError, match=expected):
        parse_flags(*args)


def test_flags_and_tf_config_together_are_refused():
    with pytest.raises(ClusterConfigError, match="both TF_CONFIG and --ps-hosts"):
        cluster.from_environment({"TF_CONFIG": tf_config()}, worker_hosts="h:1,h:2",
                                 job_name="worker", task_index=0)


@pytest.mark.parametrize("requested, config, expected", [
    ("ps", tf_config(cluster={"chief": ["h:1"], "worker": ["h:2"]},
                     task={"type": "chief", "index": 0}), "needs parameter servers"),
    ("multiworker", tf_config(task={"type": "chief", "index": 0}), "cannot use the cluster's"),
    ("multiworker", None, "needs workers besides the chief"),
    ("single", tf_config(task={"type": "chief", "index": 0}), "runs on one node"),
    ("mirrored", None, "needs several local GPUs"),
    ("fastest", None, "unknown --strategy 'fastest'"),
])
def test_strategy_that_does_not_fit_the_cluster(requested, config, expected):
    with pytest.raises(ClusterConfigError, match=expected):
        parse_tf_config(config).strategy_kind(requested, num_gpus=0)


def test_strategy_override_that_fits():
    info = parse_tf_config(tf_config(task={"type": "chief", "index": 0}))
    assert info.strategy_kind("ps") == "ps"
    assert ClusterInfo().strategy_kind("single") == "single"
    assert ClusterInfo().strategy_kind("mirrored", num_gpus=4) == "mirrored"


# --- the replica program itself: exit status 2 and one line, before TensorFlow starts ---

TASK_CASES = {
    "not json": ({"TF_CONFIG": "{oops"}, [], "not valid JSON"),
    "unknown role": ({"TF_CONFIG": tf_config(task={"type": "boss", "index": 0})}, [],
                     "task type 'boss' is unknown"),
    "duplicate addresses": ({"TF_CONFIG": MALFORMED["duplicate addresses"][0]}, [],
                            "to both worker 0 and ps 0"),
    "both chief and master": ({"TF_CONFIG": MALFORMED["both chief and master"][0]}, [],
                              "both 'chief' and 'master'"),
    "bad seed flags": ({}, ["--ps-hosts", "h:1", "--worker-hosts", "h:2", "--job-name",
                            "worker", "--task-index", "0"], "no worker"),
    "strategy does not fit": ({}, ["--strategy", "ps"], "needs parameter servers"),
}


@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_trainer_task_exits_2_with_one_line(case, tmp_path):
    env_changes, args, expected = TASK_CASES[case]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(env_changes)
    proc = subprocess.run([sys.executable, "-m", "trainer.task", "--job-dir",
                           str(tmp_path / "job"), *args],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and expected in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "job").exists()  # nothing written for a refused job


# --- property-based: any JSON gives a ClusterInfo or a ClusterConfigError, nothing else ---

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False)
    | st.sampled_from(["h:1", "h:2", "127.0.0.1:2222", "chief", "worker", "ps", "master",
                       "evaluator", "", "h", "x:0"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(list(cluster.ROLES) + ["type", "index", "task",
                                                              "cluster", "other"]),
                      inner, max_size=4),
    max_leaves=20)

tf_configs = st.fixed_dictionaries({}, optional={
    "cluster": st.dictionaries(st.sampled_from(list(cluster.ROLES) + ["boss"]),
                               st.lists(st.sampled_from(["h:1", "h:2", "h:3", "h:4", "bad"]),
                                        max_size=3) | json_values, max_size=5),
    "task": st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(list(cluster.ROLES) + ["boss"]) | json_values,
        "index": st.integers(-2, 4) | json_values}),
    "environment": json_values, "job": json_values,
})


@settings(max_examples=400, deadline=None)
@given(tf_configs)
def test_parser_never_fails_another_way(config):
    try:
        info = parse_tf_config(json.dumps(config))
    except ClusterConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    # What it accepts is a consistent training cluster.
    assert info.task_type in (cluster.CHIEF, cluster.WORKER, cluster.PS, cluster.EVALUATOR)
    assert set(info.cluster) <= {cluster.CHIEF, cluster.WORKER, cluster.PS}
    addresses = [a for hosts in info.cluster.values() for a in hosts]
    assert len(addresses) == len(set(addresses))
    assert len(info.cluster.get(cluster.CHIEF, ())) <= 1
    if info.num_ps:
        assert info.num_workers and info.cluster.get(cluster.CHIEF)
    if not info.is_evaluator and info.cluster:
        assert info.address is not None
    parse_tf_config(json.dumps(info.tf_config()))  # its own output parses again


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parser_survives_any_text(text):
    try:
        info = parse_tf_config(text)
    except ClusterConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    # Only blank text (no TF_CONFIG: one node) or a JSON object is ever accepted.
    if not text.strip():
        assert info == cluster.ClusterInfo() and not info.cluster
    else:
        assert isinstance(json.loads(text), dict)
