"""The manifests we render, checked against the engines' own schemas as the API server
checks them: the CustomResourceDefinitions' OpenAPI v3 schemas (TFJob, JobSet) and
Katib's OpenAPI (its Experiment CRD has no schema: `x-kubernetes-preserve-unknown-fields`
over the whole object; Katib's webhook decodes it into the Go types that swagger.json
describes), copied from each project's repository at a named release into
tests/schemas/<engine>-<version>/ (see the README there).

Validated with `jsonschema` (Draft 7: what CRD schemas are written in, less the
Kubernetes extensions), after turning Kubernetes' structural-schema rules into JSON
Schema:
- unknown fields: an object schema with `properties` and neither
  `x-kubernetes-preserve-unknown-fields` nor `additionalProperties` takes no other
  field (the API server prunes them, and `kubectl apply` refuses them under its default
  strict field validation);
- `x-kubernetes-int-or-string`: an integer or a string;
- `x-kubernetes-list-type: set`: unique items; `map`: unique `x-kubernetes-list-map-keys`
  (the custom keyword below); `nullable`: null allowed;
- `format: int32/int64`: the integer's range;
- `x-kubernetes-embedded-resource`: apiVersion and kind required.
Not evaluated: `x-kubernetes-validations` (CEL rules; the ones in these CRDs are
`self == oldSelf` immutability, which only updates can break, and JobSet's StartupPolicy
vs DependsOn exclusion, which we never set) and ObjectMeta's own rules (CRDs give
`metadata` no schema; the API server checks names and labels apart).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

import jsonschema
import yaml

from tests.support.common import ROOT

SCHEMAS = os.path.join(ROOT, "tests", "schemas")
TFJOB_CRD = ("training-operator-v1.9.0", "kubeflow.org_tfjobs.yaml", "v1")
JOBSET_CRD = ("jobset-v0.12.0", "jobset.x-k8s.io_jobsets.yaml", "v1alpha2")
KATIB_OPENAPI = ("katib-v0.19.0", "swagger.json")
RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def structural(schema: Any) -> Any:
    """A CRD schema (or a swagger definition) as plain JSON Schema, see the docstring."""
    if isinstance(schema, list):
        return [structural(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: structural(v) if k in ("items", "additionalProperties", "not") else
           [structural(s) for s in v] if k in ("allOf", "anyOf", "oneOf") else
           {name: structural(s) for name, s in v.items()}
           if k in ("properties", "definitions") else v
           for k, v in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if out.get("format") in RANGES and out.get("type") == "integer":
        out.setdefault("minimum", RANGES[out["format"]][0])
        out.setdefault("maximum", RANGES[out["format"]][1])
    if out.get("x-kubernetes-embedded-resource"):
        out["required"] = sorted({*out.get("required", ()), "apiVersion", "kind"})
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _list_map_keys(validator, keys, instance, schema):
    """`x-kubernetes-list-type: map`: no two items with the same keys."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(instance, list):
        return
    seen = set()
    for item in instance:
        if isinstance(item, dict):
            key = tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)
            if key in seen:
                yield jsonschema.ValidationError(
                    f"duplicate entry for {({k: item.get(k) for k in keys})} in a list-map")
            seen.add(key)


Validator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-map-keys": _list_map_keys})


@functools.cache
def crd(folder: str, name: str, version: str) -> dict:
    """The structural openAPIV3Schema of the CRD's `version`."""
    with open(os.path.join(SCHEMAS, folder, name)) as f:
        document = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (entry,) = [v for v in document["spec"]["versions"] if v["name"] == version]
    schema = structural(entry["schema"]["openAPIV3Schema"])
    Validator.check_schema(schema)
    return schema


@functools.cache
def katib(definition: str = "v1beta1.Experiment") -> dict:
    """A definition of Katib's swagger.json; what it borrows from Kubernetes
    (ObjectMeta, Container, Unstructured: not in the file) is left open."""
    with open(os.path.join(SCHEMAS, *KATIB_OPENAPI)) as f:
        definitions = json.load(f)["definitions"]
    text = json.dumps(definitions)
    for missing in {ref.split('"', 1)[0] for ref in text.split('"#/definitions/')[1:]} - \
            set(definitions):
        definitions[missing] = {}
    schema = {"$ref": f"#/definitions/{definition}",
              "definitions": structural({"definitions": definitions})["definitions"]}
    Validator.check_schema(schema)
    return schema


def errors(schema: dict, body: Any) -> list[str]:
    """Every place the body breaks the schema, as `path: message`, sorted."""
    return sorted(f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: "
                  f"{e.message[:200]}" for e in Validator(schema).iter_errors(body))


def tfjob_errors(body: Any) -> list[str]:
    return errors(crd(*TFJOB_CRD), body)


def jobset_errors(body: Any) -> list[str]:
    return errors(crd(*JOBSET_CRD), body)


def job_errors(body: Any) -> list[str]:
    """A batch/v1 Job's metadata and spec against the JobTemplateSpec that JobSet's CRD
    embeds (generated from k8s.io/api v0.36.0, the Kubernetes 1.36 types, per jobset's
    go.mod at v0.12.0); apiVersion and kind are checked as the constants they are."""
    template = crd(*JOBSET_CRD)["properties"]["spec"]["properties"]["replicatedJobs"][
        "items"]["properties"]["template"]
    found = errors(template, {k: v for k, v in body.items()
                              if k not in ("apiVersion", "kind")})
    if (body.get("apiVersion"), body.get("kind")) != ("batch/v1", "Job"):
        found.append(f"<root>: not a batch/v1 Job: {body.get('apiVersion')} "
                     f"{body.get('kind')}")
    return found


def experiment_errors(body: Any) -> list[str]:
    """Katib's Experiment, and its trial template (an Unstructured there) as the TFJob
    it is."""
    found = errors(katib(), body)
    trial = (((body.get("spec") or {}).get("trialTemplate") or {}).get("trialSpec"))
    if trial is not None:
        found += [f"spec.trialTemplate.trialSpec.{e}" for e in tfjob_errors(trial)]
    return found
