"""The value checks of mljob, submit and the engines, property-based: a value passes only
when all of it is what the check means (full matches, ASCII digits), never with a
trailing newline, a control character or a digit from another script."""
from __future__ import annotations

import json
import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mljob import contracts, storage
from mljob.cluster import ClusterConfigError, parse_tf_config
from submit.jobdef import spec as specs
from submit.errors import UsageError
from submit.runners import kubeflow

# What slipped through before: `$` matching before a final "\n", `\d` and isdecimal()
# taking other scripts' digits, and control characters nobody checked for.
SNEAKY = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "３", "٣", "²", "é",
          " ", "/", "."]
SNEAKY_TEXT = st.text(alphabet=st.sampled_from(SNEAKY) | st.characters(max_codepoint=0x7f)
                      | st.characters(), max_size=24)
SETTINGS = settings(max_examples=300, deadline=None)


def near_misses(valid: list[str]):
    """A valid value with something sneaky put before, inside or after it."""
    return st.builds(lambda v, bad, where: v[:where % (len(v) + 1)] + bad
                     + v[where % (len(v) + 1):],
                     st.sampled_from(valid), st.sampled_from(SNEAKY[:12]),
                     st.integers(0, 64))


def clean(text: str) -> bool:
    return text.isascii() and text.isprintable()


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["job01", "a", "J_2"])))
def test_job_ids(text):
    try:
        specs.check_job_id(text)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert clean(text) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", text, re.ASCII)


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["trainer.task", "a.b_c", "fakejob.task"])))
def test_module_names(text):
    try:
        spec = specs.resolve(specs.Flags("job01", module_name=text, staging_bucket="/tmp/s"))
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert clean(spec.module_name) and " " not in spec.module_name


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["gs://bucket/job", "memory://job/x",
                                           "file:///tmp/job", "/tmp/job", "job"])))
def test_job_dir_urls(text):
    try:
        url = specs.resolve(specs.Flags("job01", job_dir=text)).job_dir
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in url)
    protocol = url.split("://")[0] if "://" in url else None
    assert protocol in (None, "file", "memory", "gs")
    if protocol:
        assert ".." not in url.split("://", 1)[1].split("/")
    if protocol == "gs":
        assert re.fullmatch(r"gs://[a-z0-9][a-z0-9._\-]+(/.*)?", url, re.ASCII)
    if protocol in (None, "file"):
        assert storage.local_path(url).startswith("/")  # absolute: one place for all


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["127.0.0.1:2222", "host:1", "[::1]:80"])))
def test_cluster_addresses(address):
    config = {"cluster": {"chief": [address]}, "task": {"type": "chief", "index": 0}}
    try:
        info = parse_tf_config(json.dumps(config))
    except ClusterConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert clean(info.address)
    assert re.fullmatch(r".+:[0-9]{1,5}", info.address, re.ASCII)


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["0", "1", "12"])))
def test_task_indexes_given_as_strings(index):
    hosts = [f"h:{1000 + i}" for i in range(20)]
    config = {"cluster": {"chief": ["c:1"], "worker": hosts},
              "task": {"type": "worker", "index": index}}
    try:
        info = parse_tf_config(json.dumps(config))
    except ClusterConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert re.fullmatch(r"[0-9]+", index, re.ASCII) and info.task_index == int(index)


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["master-replica-0", "worker-replica-12"])))
def test_replica_labels(label):
    parsed = contracts.parse_label(label)
    if parsed is not None:
        assert clean(label) and contracts.replica_label(*parsed) == label


@SETTINGS
@given(st.one_of(SNEAKY_TEXT, near_misses(["job01", "a1", "team-a"])))
def test_kubernetes_names(name):
    try:
        out = kubeflow.tfjob_name(name)
    except UsageError:
        return
    assert clean(out) and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", out, re.ASCII)


@pytest.mark.parametrize("text", ["job01\n", "job０1", "job\x00"])
def test_each_sneaky_job_id_is_refused(text):
    with pytest.raises(UsageError, match="invalid job id"):
        specs.check_job_id(text)


@pytest.mark.parametrize("module", ["trainer.task\n", "trainer.task\x00", "tràiner.task"])
def test_each_sneaky_module_name_is_refused(module):
    with pytest.raises(UsageError, match="is not a Python module name"):
        specs.resolve(specs.Flags("job01", module_name=module, staging_bucket="/tmp/s"))


@pytest.mark.parametrize("address", ["h:2222\n", "h:２２２２", "h:٢٢"])
def test_each_sneaky_address_is_refused(address):
    config = {"cluster": {"chief": [address]}, "task": {"type": "chief", "index": 0}}
    with pytest.raises(ClusterConfigError, match="bad address"):
        parse_tf_config(json.dumps(config))


@pytest.mark.parametrize("index", ["１", "٣", "1\n"])
def test_each_sneaky_task_index_is_refused(index):
    config = {"cluster": {"chief": ["c:1"], "worker": ["h:1", "h:2", "h:3", "h:4"]},
              "task": {"type": "worker", "index": index}}
    with pytest.raises(ClusterConfigError, match="must be a non-negative integer"):
        parse_tf_config(json.dumps(config))


def test_a_namespace_with_a_newline_is_refused():
    with pytest.raises(UsageError):
        kubeflow.tfjob_name("job01\n")
    assert not kubeflow.DNS_LABEL.fullmatch("team-a\n")
