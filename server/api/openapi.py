"""The OpenAPI document, completed: the study body is the real `StudySpec` (every field, so a client
generator or a fuzzer can build a valid study), the metrics body resolves, and every operation
documents the errors it can answer, in their real shape (hpo.server.api.errors):

- 422 `{"detail": [{"field", "reason"}], "message"}`;
- 401, 403, 404, 408, 409, 413, 503 `{"detail": "..."}`.

Applied to every route, so routes added later are documented alike."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from hpo.server.schemas import MetricsIn
from hpo.server.spec.model import StudySpec

_REF = "#/components/schemas/{model}"
# Request bodies the routes read themselves (any JSON for the spec: parse_spec names each error).
BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/api/v1/studies"): StudySpec,
    ("post", "/api/v1/trials/{trial_id}/metrics"): MetricsIn,
}
_FIELD_ERROR = {
    "type": "object",
    "required": ["field", "reason"],
    "properties": {"field": {"type": "string"}, "reason": {"type": "string"}},
}
_SCHEMAS: dict[str, Any] = {
    "InvalidInput": {
        "type": "object",
        "required": ["detail"],
        "properties": {
            "detail": {"type": "array", "items": {"$ref": "#/components/schemas/FieldError"}},
            "message": {"type": "string"},
        },
    },
    "FieldError": _FIELD_ERROR,
    "Error": {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}},
}
_ERRORS = {
    "401": "no token, or an unknown or revoked one (once any token exists)",
    "403": "the token's role may not make this call (or a trial token names another lease)",
    "408": "the whole request body did not arrive within HPO_BODY_SECONDS",
    "413": "the request body is over HPO_MAX_BODY_BYTES, or a metrics batch would take its trial past "
    "HPO_MAX_POINTS_PER_TRIAL points",
    "503": "the database is unavailable, or the server is busy (Retry-After); retry",
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(
                get_openapi(title=app.title, version=app.version, routes=app.routes, description=app.description)
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(_SCHEMAS)
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for (method, path), model in BODIES.items():
        operation = schema.get("paths", {}).get(path, {}).get(method)
        if operation is not None:
            body = model.model_json_schema(ref_template=_REF)
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _document_errors(path, method, operation)
    _add_links(schema)
    _refuse_unstorable_text(schema)
    return schema


# The server refuses a NUL character or a lone UTF-16 surrogate anywhere in a request, keys included
# (hostile.py: no database can keep them), so the description says so on every string and every
# object's keys: a client or a fuzzer that follows it sends only what the server accepts. Escapes,
# not the characters themselves, so the document stays valid UTF-8; `u` semantics, as JSON Schema
# asks of patterns, so a pair of surrogates (one character past U+FFFF) is accepted.
STORABLE_TEXT = r"^[^\x00\uD800-\uDFFF]*$"


def _refuse_unstorable_text(schema: dict[str, Any]) -> None:
    for component in schema.get("components", {}).get("schemas", {}).values():
        _storable(component)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                _storable(parameter.get("schema", {}))


def _storable(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _storable(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if (kind == "string" or (isinstance(kind, list) and "string" in kind)) and not {"enum", "const"} & node.keys():
        if "pattern" not in node:
            node["pattern"] = STORABLE_TEXT
        elif node["pattern"] != STORABLE_TEXT:
            node.setdefault("allOf", []).append({"pattern": STORABLE_TEXT})
    if kind == "object" or "additionalProperties" in node:
        node.setdefault("propertyNames", {"pattern": STORABLE_TEXT})
    for key, value in node.items():
        if key not in ("pattern", "propertyNames", "enum", "const", "default", "examples", "example"):
            _storable(value)


_STUDY = {"study_id": "$response.body#/id"}
_FIRST_TRIAL = {"trial_id": "$response.body#/items/0/id"}
_LEASED = {"trial_id": "$response.body#/trial_id"}
# OpenAPI links: how a client (or a stateful fuzzer) gets from one answer to the next call.
LINKS: dict[tuple[str, str, str], list[tuple[str, str, dict[str, str], dict[str, Any] | None]]] = {
    ("post", "/api/v1/studies", "201"): [
        ("get", "/api/v1/studies/{study_id}", _STUDY, None),
        ("patch", "/api/v1/studies/{study_id}", _STUDY, None),
        ("get", "/api/v1/studies/{study_id}/trials", _STUDY, None),
        ("post", "/api/v1/studies/{study_id}/trials", _STUDY, None),
        ("get", "/api/v1/studies/{study_id}/analysis", _STUDY, None),
    ],
    ("get", "/api/v1/studies/{study_id}/trials", "200"): [
        ("get", "/api/v1/trials/{trial_id}", _FIRST_TRIAL, None),
        ("get", "/api/v1/trials/{trial_id}/metrics", _FIRST_TRIAL, None),
        ("post", "/api/v1/trials/{trial_id}/replicas", _FIRST_TRIAL, None),
        ("post", "/api/v1/trials/{trial_id}/cancel", _FIRST_TRIAL, None),
    ],
    ("post", "/api/v1/workers/claim", "200"): [
        ("post", f"/api/v1/trials/{{trial_id}}/{call}", _LEASED, {"lease_id": "$response.body#/lease_id"})
        for call in ("heartbeat", "metrics", "checkpoints", "complete", "fail")
    ],
}


def _add_links(schema: dict[str, Any]) -> None:
    paths = schema.get("paths", {})
    for (method, path, status), targets in LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        links = response.setdefault("links", {})
        for target_method, target_path, parameters, body in targets:
            target = paths.get(target_path, {}).get(target_method)
            if target is None or "operationId" not in target:
                continue
            link: dict[str, Any] = {"operationId": target["operationId"], "parameters": dict(parameters)}
            if body is not None:
                link["requestBody"] = body
            links[target["operationId"]] = link


def _document_errors(path: str, method: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    if path in ("/healthz", "/readyz"):
        if path == "/readyz":
            responses["503"] = {"description": "the database is unreachable"}
        return
    errors = dict(_ERRORS)
    errors["422"] = "a field is refused: each error names it and says why"
    if "{" in path:
        errors["404"] = "no such study or trial"
    if method in ("post", "patch", "put", "delete"):
        errors["409"] = "the resource's state refuses it (a name taken, a lost lease, a finished trial)"
    else:
        errors.pop("413")
        errors.pop("408")
    for status, description in errors.items():
        shape = "InvalidInput" if status == "422" else "Error"
        responses[status] = {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}},
        }
