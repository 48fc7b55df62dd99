"""Which versions the server serves from a base path holding a model's record
(`BASE/mljob-model.json`, written by `submit models/versions`), with no version policy
given: every READY version, the default through its label; a version deleted there is
unloaded at the next poll, the only one too. A policy given by the user, and a plain TF
Serving base path, keep TF Serving's rules. No TensorFlow: the versions are folders with
their marker and a stand-in loader (the real server: tests/submit/test_models_versions.py)."""
from __future__ import annotations

import shutil

from mljob import contracts, model_meta
from predict.models import config as model_config
from predict.models.repository import Repository
from predict.models.versions import ModelConfig, VersionPolicy


class Loaded:
    def __init__(self, url):
        self.url = url

    def close(self):
        pass


def _base(tmp_path, record: bool):
    base = tmp_path / "fashion"
    for number in (1, 2):
        (base / str(number)).mkdir(parents=True)
        (base / str(number) / contracts.SAVED_MODEL_MARKER).write_bytes(b"published")
    if record:
        model_meta.write(str(base), {"name": "fashion", "defaultVersion": "v1", "versions": {
            "v1": {"number": 1}, "v2": {"number": 2}}})
    return base


def _served(config: ModelConfig):
    repo = Repository([config], poll_seconds=0, loader=Loaded)
    repo.start()
    return repo.get(config.name)


def _states(served) -> dict:
    return {int(s["version"]): s["state"] for s in served.status()}


def test_a_models_record_serves_every_ready_version_and_follows_deletes(tmp_path):
    base = _base(tmp_path, record=True)
    config_file = tmp_path / "models.config"   # a model config file naming no policy
    config_file.write_text(f"model_config_list {{ config {{ name: 'fashion' "
                           f"base_path: '{base}' model_platform: 'tensorflow' }} }}")
    for config in (ModelConfig("fashion", base_path=str(base),
                               policy=VersionPolicy(registry=True)),   # the flags' default
                   *model_config.read(str(config_file))):
        served = _served(config)
        assert served.available() == [1, 2]
        with served.use(label="default") as (number, _):
            assert number == 1                     # the default, though 2 is newer
    # `versions delete v1` (after `set-default v2`): unloaded at the next poll
    record = model_meta.read(str(base))
    record["defaultVersion"] = "v2"
    del record["versions"]["v1"]
    model_meta.write(str(base), record)
    (base / "1" / contracts.SAVED_MODEL_MARKER).unlink()   # unpublished marker first
    shutil.rmtree(base / "1")
    served.poll()
    assert _states(served) == {2: "AVAILABLE", 1: "END"}
    with served.use(label="default") as (number, _):
        assert number == 2
    # deleting the only version stops serving it
    model_meta.write(str(base), {"name": "fashion", "defaultVersion": None, "versions": {}})
    shutil.rmtree(base / "2")
    served.poll()
    assert _states(served) == {2: "END", 1: "END"} and served.available() == []


def test_a_given_policy_and_a_plain_base_path_keep_tf_servings_rules(tmp_path):
    registered = _base(tmp_path / "a", record=True)
    assert _served(ModelConfig("fashion", base_path=str(registered),
                               policy=VersionPolicy.parse("latest:1"))).available() == [2]
    plain = _base(tmp_path / "b", record=False)
    assert _served(ModelConfig("fashion", base_path=str(plain),
                               policy=VersionPolicy(registry=True))).available() == [2]
