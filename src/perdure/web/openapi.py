"""The OpenAPI document of ``/api/v1``, built from the table of endpoints.

Served at ``/api/v1/openapi.json`` without a token: it holds no data. Each
operation carries the scope it needs as ``x-scope`` and is tagged with the
first segment of its path (``runs``, ``schedules``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perdure.web.api import Endpoint

PATH_PARAMETERS = ("run_id", "name", "channel", "key")

_ANSWERS = (
    (400, "bad input"),
    (401, "no or bad token"),
    (403, "scope or app not allowed"),
    (404, "unknown"),
    (409, "refused"),
)

_ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        },
        "receipt": {"type": "object"},
        "update_id": {"type": "string"},
        "run": {"type": "object"},
    },
}


def _operation(e: Endpoint) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/Error"}
    params = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in PATH_PARAMETERS
        if "{" + p + "}" in e.path
    ]
    params += [
        {"name": q, "in": "query", "required": False, "schema": {"type": t}} for q, t in e.query
    ]
    op: dict[str, Any] = {
        "summary": e.summary,
        "operationId": e.handler.__name__.strip("_"),
        "tags": [e.path.split("/")[1]],
        "parameters": params,
        "security": [{"bearer": []}],
        "x-scope": e.need,
        "responses": {
            str(e.status): {"description": "done"},
            **{
                str(status): {
                    "description": said,
                    "content": {"application/json": {"schema": error}},
                }
                for status, said in (*_ANSWERS, *e.responses)
            },
        },
    }
    if e.method == "POST":
        op["requestBody"] = {
            "required": False,
            "content": {
                "application/json": {
                    "schema": {"type": "object", "properties": {name: {} for name in e.body}}
                }
            },
        }
    return op


def document(app: str, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of ``endpoints`` as served for ``app``."""
    paths: dict[str, Any] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e)
    return {
        "openapi": "3.1.0",
        "info": {"title": f"perdure API ({app})", "version": "1"},
        "servers": [{"url": "/api/v1"}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR},
        },
    }
