"""config.yaml's schema: Cloud ML's Job resource (`trainingInput`, `labels`, `jobId`) as
pydantic models, and the one formatter of their errors.

A key is one line: its snake_case name gives Cloud ML's camelCase key (the JSON name
gcloud's `--config` takes; snake_case keys are refused with the camelCase spelling named,
as gcloud refuses them). Unknown keys are refused (`extra="forbid"`), values are checked
strictly, and the spellings proto-JSON allows are taken as gcloud takes them: int64
fields as strings of digits (`workerCount: "4"`, as `describe --format yaml` writes
them), enums by name, and `null` as "not given". `validate` turns pydantic's first error
into the one-line `ConfigError` naming the key and the fix; what needs more than one
field (a count against a tier, min below max) is checked where the value is used
(`submit.jobdef.spec`, `submit.jobdef.tuning_spec`).

`python -m submit.jobdef.config_schema` writes the published JSON Schema
(docs/schema/config.schema.json; `--check` fails when that file is stale).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, \
    WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from submit.jobdef.containers import IMAGE, MAX_WORDS
from submit.jobdef.vocabulary import (  # noqa: F401  (the schema's words, read here)
    ALGORITHMS, GOALS, MAX_PARALLEL_TRIALS, MAX_RESTARTS, MAX_TRIALS, PARAM_TYPES,
    RESTART_POLICIES, SCALES, type_name)
from submit.errors import ConfigError

SCHEMA_PATH = "docs/schema/config.schema.json"   # from the project's root
_INT64 = re.compile(r"\s*-?[0-9]{1,19}\s*")
_DURATION = re.compile(r"([0-9]{1,12})(\.[0-9]{1,9})?s")


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a field must be, as its error says it: `<key> must be <text>, not <value>`."""

    text: str


def _phrase(text: str) -> PydanticCustomError:
    """An error said after the value: `<key> <value> <text>`."""
    return PydanticCustomError("phrase", text)


def _int64(value: Any) -> Any:
    """proto-JSON's int64: a JSON number, or a string of digits."""
    if isinstance(value, str) and _INT64.fullmatch(value):
        number = int(value)
        if not -2**63 <= number < 2**63:
            raise _phrase("is out of int64's range")
        return number
    return value


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("number_type", "not a number")
    return value


def _duration(value: Any) -> Any:
    """A google.protobuf.Duration as JSON writes it: `7200s`, `1.5s`."""
    if not isinstance(value, str) or not _DURATION.fullmatch(value) or \
            float(value[:-1]) <= 0:
        raise _phrase("is not a duration; write seconds with an 's', greater than 0, "
                      "e.g. 7200s")
    return value


def _int64_schema(ge: int | None = None, le: int | None = None) -> WithJsonSchema:
    """An int64's JSON Schema: a number in range, or its digits as a string."""
    number: dict[str, Any] = {"type": "integer"}
    if ge is not None:
        number["minimum"] = ge
    if le is not None:
        number["maximum"] = le
    digits = r"^\s*-?[0-9]{1,19}\s*$" if ge is None or ge < 0 else \
        r"^\s*[0-9]{1,19}\s*$" if ge == 0 else r"^\s*0*[1-9][0-9]{0,18}\s*$"
    return WithJsonSchema({"anyOf": [number, {
        "type": "string", "pattern": digits,
        "description": "int64 as proto-JSON writes it, e.g. \"4\""}]})


# int64 fields: ranges go inside (before the string spelling is taken)
Int64 = Annotated[int, BeforeValidator(_int64), _int64_schema()]
def _image(value: Any) -> Any:
    if not isinstance(value, str) or len(value) > 1024 or not IMAGE.fullmatch(value):
        raise _phrase("is not a container image; write REGISTRY/PATH[:TAG], e.g. "
                      "gcr.io/my-project/trainer:1")
    return value


ImageUri = Annotated[str, BeforeValidator(_image), WithJsonSchema(
    {"type": "string", "maxLength": 1024, "pattern": f"^(?:{IMAGE.pattern})$",
     "examples": ["gcr.io/my-project/trainer:1"]})]
Number = Annotated[Any, BeforeValidator(_number), WithJsonSchema({"type": "number"})]
Duration = Annotated[str, BeforeValidator(_duration), WithJsonSchema(
    {"type": "string", "pattern": r"^[0-9]{1,12}(\.[0-9]{1,9})?s$",
     "description": "seconds with an 's', e.g. 7200s"})]
WORDS = Expect("a list of strings, e.g. [python, -m, trainer.task]")


class Model(BaseModel):
    """A Cloud ML message: camelCase keys, no others, values as written."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True,
                              frozen=True, populate_by_name=False)
    expect: ClassVar[str] = "a mapping"
    label_key: ClassVar[str | None] = None   # a list item's key named in its messages
    document: ClassVar[bool] = False         # the file: its keys are named on their own

    def to_dict(self) -> dict[str, Any]:
        """The message as its camelCase mapping, int64 strings as numbers, nulls left
        out (proto-JSON's "not given")."""
        return self.model_dump(by_alias=True, exclude_none=True)


class AcceleratorConfig(Model):
    """GPUs per replica."""

    count: Annotated[Annotated[int, Field(ge=0), BeforeValidator(_int64), _int64_schema(0)]
                     | None, Expect("a non-negative integer")] = None
    type: Annotated[str | None, Expect("a string like NVIDIA_TESLA_T4"),
                    Field(examples=["NVIDIA_TESLA_T4"])] = None


class ReplicaConfig(Model):
    """One replica type's settings: GPUs, restarts (as Kubeflow's replica specs), and a
    custom container (Cloud ML's imageUri, containerCommand, containerArgs)."""

    accelerator_config: Annotated[AcceleratorConfig | None, Expect(
        "a mapping like {count: 1, type: NVIDIA_TESLA_T4}")] = None
    restart_policy: Literal["Never", "OnFailure", "ExitCode", "Always"] | None = None
    max_restarts: Annotated[Annotated[int, Field(ge=0, le=MAX_RESTARTS),
                                      BeforeValidator(_int64), _int64_schema(0, MAX_RESTARTS)]
                            | None, Expect(f"an integer from 0 to {MAX_RESTARTS}")] = None
    image_uri: ImageUri | None = None
    container_command: Annotated[list[str] | None, Field(max_length=MAX_WORDS), WORDS] = None
    container_args: Annotated[list[str] | None, Field(max_length=MAX_WORDS), WORDS] = None


class Scheduling(Model):
    """Deadlines: maxRunningTime (then the job fails), maxWaitTime (queued)."""

    max_running_time: Duration | None = None
    max_wait_time: Duration | None = None
    # the cluster engines' (values checked in submit/jobdef/engine_keys.py)
    strategy: Annotated[str | None, Field(examples=["STANDARD", "SPOT", "FLEX_START"])] = None
    queue_name: str | None = None
    ttl_after_finished: Duration | None = None


class ParameterSpec(Model):
    """One tuned parameter, passed to each trial as --<parameterName>=<value>."""

    expect: ClassVar[str] = "a mapping with parameterName and type"
    label_key: ClassVar[str | None] = "parameterName"
    parameter_name: Annotated[str, Expect(
        "a flag name: letters, digits, _ and -, starting with a letter (e.g. "
        "learning_rate)")]
    type: Literal["DOUBLE", "INTEGER", "CATEGORICAL", "DISCRETE"]
    min_value: Number | None = None
    max_value: Number | None = None
    categorical_values: Annotated[list[str] | None, Expect(
        "a non-empty list of strings, e.g. [cnn, mlp]")] = None
    discrete_values: Annotated[list[Number] | None, Expect(
        "a non-empty list of numbers (finite; integers within ±2^53), e.g. "
        "[32, 64, 128]")] = None
    scale_type: Literal["UNIT_LINEAR_SCALE", "UNIT_LOG_SCALE",
                        "UNIT_REVERSE_LOG_SCALE"] | None = None


class HyperparameterSpec(Model):
    """Cloud ML's HyperparameterSpec: a tuning job's study."""

    expect: ClassVar[str] = "a mapping"
    goal: Annotated[Literal["MAXIMIZE", "MINIMIZE"], Expect("MAXIMIZE or MINIMIZE")]
    hyperparameter_metric_tag: str | None = None
    max_trials: Annotated[Annotated[int, Field(ge=1, le=MAX_TRIALS), BeforeValidator(
        _int64), _int64_schema(1, MAX_TRIALS)] | None,
        Expect(f"an integer from 1 to {MAX_TRIALS}")] = None
    max_parallel_trials: Annotated[Annotated[int, Field(
        ge=1, le=MAX_PARALLEL_TRIALS), BeforeValidator(_int64), _int64_schema(
            1, MAX_PARALLEL_TRIALS)] | None,
        Expect(f"an integer from 1 to {MAX_PARALLEL_TRIALS}")] = None
    max_failed_trials: Annotated[Annotated[int, Field(ge=0, le=MAX_TRIALS), BeforeValidator(
        _int64), _int64_schema(0, MAX_TRIALS)] | None,
        Expect(f"an integer from 0 to {MAX_TRIALS}")] = None
    enable_trial_early_stopping: bool | None = None
    resume_previous_job_id: str | None = None
    algorithm: Literal["ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH"] | None = None
    params: Annotated[list[ParameterSpec], Field(min_length=1), Expect(
        "a non-empty list of parameters like {parameterName: learning_rate, type: DOUBLE, "
        "minValue: 0.0001, maxValue: 0.1}")]


class TrainingInput(Model):
    """Cloud ML's TrainingInput: the cluster, the code, and where it runs."""

    scale_tier: Annotated[str | None, Field(examples=[
        "BASIC", "STANDARD_1", "PREMIUM_1", "BASIC_GPU", "CUSTOM"])] = None
    master_type: Annotated[str | None, Field(examples=["n1-standard-4", "standard"])] = None
    worker_type: str | None = None
    parameter_server_type: str | None = None
    evaluator_type: str | None = None
    worker_count: Int64 | None = None
    parameter_server_count: Int64 | None = None
    evaluator_count: Int64 | None = None
    master_config: ReplicaConfig | None = None
    worker_config: ReplicaConfig | None = None
    parameter_server_config: ReplicaConfig | None = None
    evaluator_config: ReplicaConfig | None = None
    args: Annotated[list[str] | None, Expect("a list of strings")] = None
    job_dir: str | None = None
    region: str | None = None
    runtime_version: str | None = None
    python_version: str | None = None
    package_uris: Annotated[list[str] | None, Expect("a list of strings")] = None
    python_module: str | None = None
    hyperparameters: HyperparameterSpec | None = None
    use_chief_in_tf_config: bool | None = None
    scheduling: Scheduling | None = None
    # the cluster engines' (values checked in submit/jobdef/engine_keys.py)
    service_account: str | None = None
    network: str | None = None
    enable_web_access: bool | None = None
    tensorboard: str | None = None
    base_output_directory: str | None = None


class JobConfig(Model):
    """The whole --config file: Cloud ML's Job, the keys a submission takes."""

    document: ClassVar[bool] = True

    training_input: TrainingInput = Field(default_factory=lambda: TrainingInput())
    # checked by submit.jobdef.spec.check_labels, which names the label and Google's rule
    labels: Annotated[dict[str, Any] | None, Expect("a mapping of KEY: VALUE"),
                      WithJsonSchema({"type": "object", "additionalProperties": {
                          "type": ["string", "integer"]}})] = None
    job_id: Annotated[str | None, Expect("a string like job01")] = None


def keys(model: type[Model]) -> tuple[str, ...]:
    """The model's keys as config.yaml spells them."""
    return tuple(f.alias or name for name, f in model.model_fields.items())


M = TypeVar("M", bound=Model)


def validate(model: type[M], data: Any, where: str = "trainingInput") -> M:
    """`data` as `model`, or a one-line ConfigError naming the key (`where` names the
    top: trainingInput, trainingInput.hyperparameters, --config PATH)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        first = min(unknown, key=lambda e: len(e["loc"])) if unknown else errors[0]
        raise ConfigError(message(model, data, first, where)) from None


def message(model: type[Model], data: Any, error: Mapping[str, Any], where: str) -> str:
    """One pydantic error as our one line: `<key> has unknown key 'k'; allowed keys are
    ...`, `<key> must be <what>, not <value>`, or `<key> <value> <phrase>`."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        steps = _walk(model, data, loc[:-1], where)
        parent, owner = steps[-1][1], steps[-1][3]
        allowed = keys(owner) if owner else ()
        key = loc[-1]
        hint = (f" (Cloud ML's JSON name is {to_camel(key)})"
                if isinstance(key, str) and to_camel(key) in allowed and key != to_camel(key)
                else "")
        return (f"{parent} has unknown key {key!r:.60}{hint}; allowed keys are "
                f"{', '.join(allowed)}")
    depth, at, expect, _ = _walk(model, data, loc, where)[-1]
    value = _value_at(data, loc[:depth])
    if kind == "phrase":
        return f"{at} {short(value, 30)} {error['msg']}"
    if expect is None:
        expect = _default_expect(kind, error)
    if kind == "missing":
        return f"{at} must be {expect}, not None"
    if kind.endswith("_type"):
        return f"{at} must be {expect}, not {type_name(value)} {short(value)}"
    return f"{at} must be {expect}, not {short(value)}"


def _walk(model: type[Model], data: Any, loc: tuple, where: str) -> list[tuple]:
    """(loc depth, where text, expect text, model) for each step that names a key or a
    mapping in a list; a scalar list item's error belongs to its list's key."""
    steps: list[tuple] = [(0, where, model.expect, model)]
    kind: Any = model
    text, raw = where, data
    for depth, part in enumerate(loc, 1):
        owner = _model_of(kind)
        if isinstance(part, str) and owner is not None:
            fields = {f.alias or n: f for n, f in owner.model_fields.items()}
            field = fields.get(part)
            if field is None:
                break
            if owner.document and depth == 1:   # a file's key: trainingInput, labels, ...
                text = part if part == "trainingInput" else f"{where}: {part}"
            else:
                text += f".{part}"
            raw = raw.get(part) if isinstance(raw, Mapping) else None
            kind = field.annotation
            expect = next((m.text for m in field.metadata if isinstance(m, Expect)), None)
            literal = _literal(kind)
            if expect is None and literal:
                expect = "one of " + ", ".join(literal)
            item = _model_of(kind)
            if expect is None and item is not None:
                expect = item.expect
            steps.append((depth, text, expect, item))
        elif isinstance(part, int):
            kind = _item_type(kind)
            raw = raw[part] if isinstance(raw, list) and part < len(raw) else None
            item = _model_of(kind)
            if item is None:
                continue   # a string in a list of strings: the list's key is named
            text += f"[{part}]"
            label = raw.get(item.label_key) if item.label_key and isinstance(raw, Mapping) \
                else None
            if isinstance(label, str) and label.isprintable() and len(label) <= 64 and \
                    not (len(loc) > depth and loc[depth] == item.label_key):
                text += f" ({label})"
            steps.append((depth, text, item.expect, item))
    return steps


def _unwrap(kind: Any) -> Any:
    """X from Optional[X] and Annotated[X, ...]."""
    while True:
        origin = typing.get_origin(kind)
        if origin is Annotated:
            kind = typing.get_args(kind)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(kind) if a is not type(None)]
            if len(rest) != 1:
                return kind
            kind = rest[0]
        else:
            return kind


def _model_of(kind: Any) -> type[Model] | None:
    kind = _unwrap(kind)
    return kind if isinstance(kind, type) and issubclass(kind, Model) else None


def _item_type(kind: Any) -> Any:
    kind = _unwrap(kind)
    args = typing.get_args(kind) if typing.get_origin(kind) is list else ()
    return args[0] if args else Any


def _literal(kind: Any) -> tuple[str, ...]:
    kind = _unwrap(kind)
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else ()


def _value_at(data: Any, loc: tuple) -> Any:
    for part in loc:
        if isinstance(part, str) and isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(part, int) and isinstance(data, list) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _default_expect(kind: str, error: Mapping[str, Any]) -> str:
    names = {"int_type": "an integer", "string_type": "a string", "bool_type":
             "true or false", "list_type": "a list", "dict_type": "a mapping",
             "model_type": "a mapping", "number_type": "a number"}
    ctx = error.get("ctx") or {}
    if kind in names:
        return names[kind]
    if "ge" in ctx or "le" in ctx:
        return f"a number from {ctx.get('ge', '-inf')} to {ctx.get('le', 'inf')}"
    if "min_length" in ctx:
        return f"at least {ctx['min_length']} long"
    if "max_length" in ctx:
        return f"at most {ctx['max_length']} long"
    return "another value"


def short(value: Any, width: int = 60) -> str:
    """A value for a message, at most `width` characters; an integer of hundreds of
    digits as its size (its repr alone fails past 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return f"{value!r:.{width}}"


# -- the published JSON Schema -----------------------------------------------------------

def json_schema() -> dict[str, Any]:
    """config.yaml's JSON Schema: the Job document; `x-` keys hold YAML anchors."""
    schema = JobConfig.model_json_schema(by_alias=True)
    schema.pop("description", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "mljob config.yaml (Cloud ML Engine's Job: trainingInput, labels, "
                     "jobId)",
            "description": "The --config file of `python -m submit` and `jobs submit "
                           "training`, shaped like Cloud ML's Job resource; keys starting "
                           "with x- hold YAML anchors and are ignored.",
            **schema, "patternProperties": {"^x-": {}}}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """`python -m submit.jobdef.config_schema [--check] [PATH]`: write the schema to PATH
    (default: the project's docs/schema/config.schema.json), or with --check exit 1 if
    it differs."""
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    path = paths[0] if paths else os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), SCHEMA_PATH)
    text = schema_text()
    if check:
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read() == text
        except OSError:
            current = False
        if not current:
            print(f"error: {path} is stale; run python -m submit.jobdef.config_schema",
                  file=sys.stderr)
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
