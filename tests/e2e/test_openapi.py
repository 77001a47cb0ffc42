"""`/openapi.json` is a valid OpenAPI 3.1 document: people generate clients from it. (That
every served route is in it, and every route in it is served, is a Rust unit test.)"""

from __future__ import annotations

import httpx
from openapi_spec_validator import OpenAPIV31SpecValidator

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def test_the_served_document_is_valid_openapi_3_1(control_plane):
    document = httpx.get(f"{control_plane.base_url}/openapi.json", timeout=30).json()
    assert document["openapi"].startswith("3.1")
    errors = [f"{'/'.join(map(str, error.path))}: {error.message[:300]}"
              for error in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []
    operation_ids = [operation["operationId"] for item in document["paths"].values()
                     for operation in item.values() if isinstance(operation, dict) and "operationId" in operation]
    assert len(operation_ids) == len(set(operation_ids)) and len(operation_ids) > 50
