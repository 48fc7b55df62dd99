"""Round 4's bad inputs to the prediction server's model config file: a version policy
the --model_version_policy flag refuses is refused in the file too (`latest: 0` was
taken as `latest` 1)."""
from __future__ import annotations

import pytest

from predict.models import config as model_config
from predict.errors import UsageError

BAD = ["{latest: 0}", "{latest: false}", '{latest: ""}', "{all: 0}", "{latest: []}",
       "{latest: {num_versions: 0}}", "{latest: {num_versions: true}}",
       "{latest: {num_versions: 1.5}}", '{latest: {num_versions: "²"}}']
GOOD = {"{latest: {num_versions: 2}}": 2, "{latest: {}}": 1, "{latest: null}": 1,
        '{latest: {num_versions: "3"}}': 3}


def _read(tmp_path, policy: str):
    path = tmp_path / "models.yaml"
    path.write_text("model_config_list: {config: [{name: m, base_path: /x, "
                    f"model_version_policy: {policy}}}]}}")
    return model_config.read(str(path))


@pytest.mark.parametrize("policy", BAD)
def test_a_policy_the_flag_refuses_is_refused_in_the_file(tmp_path, policy):
    with pytest.raises(UsageError) as info:
        _read(tmp_path, policy)
    assert "model_version_policy must be one of" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("policy", list(GOOD))
def test_the_policies_tf_serving_takes_are_taken(tmp_path, policy):
    (config,) = _read(tmp_path, policy)
    assert (config.policy.kind, config.policy.count) == ("latest", GOOD[policy])
