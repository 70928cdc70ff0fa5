"""Validate Kubernetes objects against the real schemas, strictly (an unknown field such as
`tolerration` is an error, as `kubectl apply --validate=strict` makes it one).

- Kubernetes' own kinds: the OpenAPI schemas bundled by the `kubernetes-validate` package, in
  its strict variant, for the oldest and the newest Kubernetes version the docs claim.
- SecurityContextConstraints (OpenShift), ServiceMonitor and PrometheusRule (the Prometheus
  Operator): the openAPIV3Schema of the CRD their project publishes (tests/deploy/schemas,
  sources in its README), with additionalProperties false wherever the CRD lists the
  properties (the API server prunes unknown fields there, silently: a typo would vanish),
  and the object's metadata against Kubernetes' ObjectMeta.

A kind with no schema is an error, so nothing passes unvalidated."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The Kubernetes versions docs/deploy-kubernetes.md claims (the chart's kubeVersion: >=1.27):
# the oldest, and the newest that kubernetes-validate (pinned in pyproject.toml) bundles.
OLDEST = "1.27"
NEWEST = "1.37"
VERSIONS = (OLDEST, NEWEST)

CRDS = {
    (
        "security.openshift.io/v1",
        "SecurityContextConstraints",
    ): "securitycontextconstraints.security.openshift.io.crd.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors.monitoring.coreos.com.crd.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules.monitoring.coreos.com.crd.yaml",
}


class Invalid(AssertionError):
    pass


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema: nullable as a null type, and no
    unknown properties where the schema names them (unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


@functools.lru_cache(maxsize=None)
def _crd_validator(file: str, version: str) -> Any:
    import jsonschema

    crd = yaml.safe_load((SCHEMAS / file).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # checked against ObjectMeta below
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict[str, Any], version: str, where: str = "") -> None:
    """Raise Invalid (one line: where, kind/name, the path and what is wrong)."""
    import kubernetes_validate as kv

    api, kind = obj.get("apiVersion"), obj.get("kind")
    name = f"{kind}/{obj.get('metadata', {}).get('name')}"
    crd = CRDS.get((api, kind))
    if crd is not None:
        errors = sorted(_crd_validator(crd, api.split("/")[1]).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            said = "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:3])
            raise Invalid(f"{where} {name}: {said} (CRD schema {crd})")
        _k8s(kv, {"apiVersion": "meta/v1", "kind": "ObjectMeta", **obj.get("metadata", {})}, version, where, name)
        return
    _k8s(kv, obj, version, where, name)


def _k8s(kv: Any, obj: dict[str, Any], version: str, where: str, name: str) -> None:
    if obj.get("kind") == "ObjectMeta":
        import jsonschema
        from kubernetes_validate.utils import schema_contents

        schema_dir = f"kubernetes-json-schema/v{_bundled(version)}-local-strict"
        schema = schema_contents(f"{schema_dir}/objectmeta-meta-v1.json", version)
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        try:
            jsonschema.Draft7Validator(schema).validate(body)
        except jsonschema.ValidationError as e:
            raise Invalid(f"{where} {name}: metadata/{'/'.join(map(str, e.path))}: {e.message}") from None
        return
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as e:
        raise Invalid(f"{where} {name}: {'/'.join(map(str, e.path))}: {e.message} (Kubernetes {e.version})") from None
    except kv.SchemaNotFoundError as e:
        raise Invalid(f"{where} {name}: no schema: {e.message}") from None


def _bundled(version: str) -> str:
    from kubernetes_validate.utils import all_versions, major_minor

    return [v for v in all_versions() if major_minor(v) == version][0]


def validate_all(docs: list[dict[str, Any]], where: str) -> int:
    """Every object, at every claimed version; returns how many objects were checked."""
    for version in VERSIONS:
        for obj in docs:
            validate(obj, version, where)
    return len(docs)
