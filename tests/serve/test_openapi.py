"""The OpenAPI document of `cuectl serve` is complete and true: it validates as OpenAPI
(openapi-spec-validator), every operation says what it answers and that its errors are
problems, and a real server on a real store holding a job answers Schemathesis'
property-based requests (valid and invalid ones, generated from the document) as the
document says, never with a 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from apiclient import GIB, Server, claim, create_token, device, job_spec, layer_spec, new_store, register_host
from hypothesis import HealthCheck, Phase, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

API = "/api/v1"
PROBLEM_JSON = "application/problem+json"


@pytest.fixture(scope="module")
def site(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    register_host(
        db,
        "gpu-node-01",
        [
            device(0, "GPU-oa-0", "NVIDIA A100-SXM4-80GB", 80 * GIB),
            device(1, "GPU-oa-1", "NVIDIA A100-SXM4-80GB", 80 * GIB),
        ],
    )
    admin = create_token(db, "oa-admin", "admin", env=serve_env)
    # CUECTL_FRAME_LIMIT: a generated spec may ask for any range; keep the store small.
    server = Server(
        db, env={**serve_env, "CUECTL_FRAME_LIMIT": "50"}, log=serve_dir / "openapi.log", extra=("--cache", "0")
    )
    api = server.api.with_token(admin)
    job = api.ok(
        "POST",
        f"{API}/jobs",
        job_spec("train-sweep", layer_spec("train", range="1-4", gpus=1), layer_spec("eval", depends=["train"])),
        status=201,
    )
    claim(db, job["layers"][0]["id"], host="gpu-node-01", gpu_uuids=("GPU-oa-0",))  # one RUNNING frame
    yield server, admin.secret, job
    server.stop()


@pytest.fixture(scope="module")
def document(site) -> dict[str, Any]:
    server, _secret, _job = site
    return server.api.ok("GET", f"{API}/openapi.json")  # no token needed


def test_the_document_is_valid_openapi(document):
    validate(document)  # raises, naming the place, on any violation of the OpenAPI 3.1 schema
    assert document["openapi"].startswith("3.1")


def test_every_operation_is_typed_and_its_errors_are_problems(document):
    schemas = document["components"]["schemas"]
    assert {"Job", "JobSpec", "LayerSpec", "Frame", "Host", "HostDevice", "Problem"} <= set(schemas)
    assert "HTTPValidationError" not in schemas  # FastAPI's own 422 body: ours are problems
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `cuectl admin token create USER --role ROLE`",
    }
    operations = [(path, method, op) for path, ops in document["paths"].items() for method, op in ops.items()]
    assert len(operations) >= 17
    for path, method, op in operations:
        success = [(s, r) for s, r in op["responses"].items() if s.startswith("2")]
        assert len(success) == 1, (method, path, op["responses"])
        content = success[0][1]["content"]
        schema = content.get("application/json", content.get("text/plain", {})).get("schema", {})
        assert "$ref" in schema or schema.get("type") == "string", (method, path, content)
        errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
        assert "400" in errors and "422" in errors, (method, path)
        for status, answer in errors.items():
            assert answer["content"] == {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}, (
                method,
                path,
                status,
            )
        secured = path.startswith(API) or path == "/metrics"
        assert (op.get("security") == [{"bearer": []}]) == secured, (method, path)
        assert ("401" in errors) == secured, (method, path)
        for parameter in op.get("parameters", []):  # the actions are enumerated
            if parameter["name"] == "action":
                assert parameter["schema"]["enum"], (method, path)
    bodies = document["paths"][f"{API}/jobs"]["post"]["requestBody"]["content"]
    spec_or_template = {
        "anyOf": [{"$ref": "#/components/schemas/JobSpec"}, {"$ref": "#/components/schemas/JobTemplate"}]
    }
    assert bodies["application/json"]["schema"] == bodies["application/yaml"]["schema"] == spec_or_template
    assert bodies["application/xml"]["schema"]["type"] == "string"  # an OpenCue spec
    assert schemas["JobSpec"]["required"] == ["name", "layers"]
    assert {"command", "range", "gpus", "gpu_vendor", "gpu_models", "gpu_memory_min", "depends"} <= set(
        schemas["LayerSpec"]["properties"]
    )
    job_actions = document["paths"][f"{API}/jobs/{{job}}/{{action}}"]["post"]["parameters"]
    assert next(p for p in job_actions if p["name"] == "action")["schema"]["enum"] == [
        "pause",
        "resume",
        "kill",
        "retry",
    ]


def _document_of_the_code() -> dict[str, Any]:
    """The document as the server builds it (the test above checks the live one): built
    here at collection, since Schemathesis makes one test per operation from it (its lazy,
    fixture-built schemas do not run on this pytest)."""
    from cuectl.serve.app import Settings, create_app

    return create_app(Settings(db_url="unused.db")).openapi()  # the store is opened by requests only


schema = schemathesis.openapi.from_dict(_document_of_the_code())


def test_the_spec_schemas_have_every_key_the_library_takes():
    """The request schemas forbid keys they do not list, and Schemathesis only sends what
    they list: a spec key added to the library and not here would be refused by the
    document while the server takes it, and no other test would notice."""
    from cuectl.sched import spec
    from cuectl.serve import schemas

    assert set(schemas.LAYER_SPEC["properties"]) == set(spec.LAYER_KEYS)
    assert set(schemas.JOB_SPEC["properties"]) == set(spec.JOB_KEYS)


def test_the_document_served_is_the_one_schemathesis_tests(document):
    assert document == _document_of_the_code()


# Bounded: a few examples per operation (the explicit examples of the document, which
# name the store's job and frame, then generated ones, valid and invalid), no shrinking,
# no example database written into the checkout.
@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_the_live_server_answers_as_its_document_says(case, site):
    server, secret, _job = site
    case.call_and_validate(
        base_url=f"http://127.0.0.1:{server.port}",
        headers={"Authorization": f"Bearer {secret}"},
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
        timeout=20,
    )
