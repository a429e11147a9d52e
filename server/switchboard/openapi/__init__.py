"""The OpenAPI 3.1 document served at /openapi.json (kept next to the routes it describes).

3.1 because its schemas are JSON Schema 2020-12 (``type: ["string", "null"]``
is valid there and nowhere in 3.0). tests/test_openapi_contract.py validates
it with openapi-spec-validator, checks every operation has an operationId and
tags, and validates real responses against it; tests/test_openapi_fuzz.py
fuzzes a live replica with it.

Layout: the media types, shared JSON Schemas and the ``op()`` helper in
``schema.py``; shared schemas, headers and responses in ``components()`` and
the tags in ``components.py``; the paths in blocks, one function per area
(``paths.py``: the public API; ``operate.py``: the operators'), merged here by
``openapi_document()`` from PATH_BLOCKS. **Another area adds its paths as a
new ``paths_<area>()`` function in a module of its own and one line in
PATH_BLOCKS** -- so branches never edit the same lines.

Every error response is RFC 9457 ``application/problem+json`` (the Problem
schema; errors.py writes it). Free-form JSON (task ``args``, event
``payload``, tool ``args``/``result``) is declared as such
(``additionalProperties: true`` / any value), so generated types accept it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import __version__
from .components import TAGS, components
from .operate import paths_console, paths_operate
from .paths import paths_auth, paths_ops, paths_realtime, paths_tasks
from .sse import paths_sse
from .streams import paths_jobs, paths_streams

__all__ = ["PATH_BLOCKS", "openapi_document", "with_unsupported_media_type"]

# Each area's paths: add a paths_<area>() block in a module of this package and one line here.
PATH_BLOCKS: list[Callable[[], dict[str, Any]]] = [
    paths_auth,
    paths_tasks,
    paths_realtime,
    paths_ops,
    paths_operate,
    paths_console,
    paths_streams,
    paths_jobs,
    paths_sse,
]


def openapi_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for block in PATH_BLOCKS:
        for path, item in block().items():
            paths.setdefault(path, {}).update(item)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchboard", "version": __version__,
                 "description": "N stateless replicas, PostgreSQL as the only coordination layer. Errors are "
                                "RFC 9457 problem details (application/problem+json)."},
        "tags": TAGS,
        "components": components(),
        "paths": paths,
    }


# -- issue 21 (e21): JSON endpoints refuse other media types ---------------------------------
def with_unsupported_media_type(doc: dict[str, Any]) -> dict[str, Any]:
    """Every operation that takes a JSON request body may answer 415 (the body is read
    only when declared ``application/json``): added here, beside the document, so the
    routes' declarations stay as they are."""
    responses = doc.get("components", {}).get("responses", {})
    name = next((n for n in ("Problem", "Error") if n in responses), None)
    resp: dict[str, Any] = ({"$ref": f"#/components/responses/{name}"} if name
                            else {"description": "Unsupported Media Type: send 'Content-Type: application/json'"})
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict) and "requestBody" in op:
                op.setdefault("responses", {}).setdefault("415", resp)
    return doc
