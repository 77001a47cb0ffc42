//! Completing the generated document where annotations cannot say it all.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::UNSUPPORTED_FIELD;
use crate::sessions::{HEADFUL_MEMORY, HEADLESS_MEMORY};

/// What the annotations leave out:
/// - operation ids unique across resources (`browsers_list`, not `list` for every list);
/// - the errors every route of a kind answers, in the Error shape: 400 for bad input
///   (any parameter or body), 401 without a valid API key, 404 for an unknown resource
///   in the path, 415 for a body of another media type;
/// - a description for every response (the status' reason phrase where none is given);
/// - fields of today's SDK this server refuses, as schemas nothing satisfies: sending
///   one is a 400, and a generated client should not offer it.
pub(super) fn complete(document: &mut Value) {
    let schemas = document["components"]["schemas"].clone();
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    let mut operation_ids = std::collections::HashSet::new();
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            complete_operation(path, operation);
            complete_body(&schemas, method, path, operation);
            // One handler for several methods (`curl/raw`) has one id: each gets its own.
            if let Some(id) = operation["operationId"].as_str().map(str::to_owned)
                && !operation_ids.insert(id.clone())
            {
                operation["operationId"] = Value::String(format!("{id}_{method}"));
            }
        }
    }
    forbid_unsupported_fields(document);
    // `network.allowed_hosts` is described where it is parsed (`egress::allowlist`), which
    // knows nothing of schemas.
    let allowlist = allowed_hosts();
    for schema in ["NetworkConfig", "NetworkUpdate"] {
        let property =
            &mut document["components"]["schemas"][schema]["properties"]["allowed_hosts"];
        let description = property["description"].clone();
        *property = allowlist.clone();
        property["description"] = description;
    }
    // The memory sizes offered depend on `headless` (default false).
    for schema in ["CreateBrowserRequest", "PoolRequest"] {
        let schema = &mut document["components"]["schemas"][schema];
        schema["if"] =
            json!({"properties": {"headless": {"const": true}}, "required": ["headless"]});
        let sizes = |offered: &[&str]| {
            let mut sizes: Vec<Value> = offered.iter().map(|size| json!(size)).collect();
            sizes.push(Value::Null);
            json!({"properties": {"memory": {"enum": sizes}}})
        };
        schema["then"] = sizes(HEADLESS_MEMORY);
        schema["else"] = sizes(HEADFUL_MEMORY);
    }
    for (schema, fields) in EXACTLY_ONE_OF {
        let alternatives: Vec<Value> =
            fields.iter().map(|field| json!({"required": [field]})).collect();
        document["components"]["schemas"][schema]["oneOf"] = Value::Array(alternatives);
    }
}

/// `network.allowed_hosts`: 1 to 256 hostnames (`*.` and at least two labels for a
/// wildcard; no numeric top-level label), public IP addresses or CIDR ranges (not
/// described: the server also refuses private ones).
fn allowed_hosts() -> Value {
    json!({
        "type": ["array", "null"],
        "minItems": 1,
        "maxItems": 256,
        "items": {
            "type": "string",
            "maxLength": 253,
            "pattern": r"^(?:\*\.(?:[A-Za-z0-9_-]{1,63}\.)+|(?:[A-Za-z0-9_-]{1,63}\.)*)[A-Za-z][A-Za-z0-9_-]{0,62}$",
        },
    })
}

/// Objects that must have exactly one of these fields (a reference by id or by name).
const EXACTLY_ONE_OF: [(&str, &[&str]); 3] = [
    ("ResourceReference", &["id", "name"]),
    ("ProfileReference", &["id", "name"]),
    ("ProxySelection", &["id", "name", "mode"]),
];

/// Fields a create requires, and fields it refuses, that the update sharing its body
/// leaves optional: (method, path, required, refused).
const ON_CREATE: [(&str, &str, &[&str], &[&str]); 1] =
    [("post", "/browser_pools", &["size"], &["discard_all_idle"])];

/// A JSON body is required only when its schema requires a field: an empty body means
/// `{}` (all defaults) on every route. Fields required on create only are added.
fn complete_body(schemas: &Value, method: &str, path: &str, operation: &mut Value) {
    let Some(body) = operation.get_mut("requestBody") else {
        return;
    };
    let Some(json) = body
        .get_mut("content")
        .and_then(|content| content.get_mut("application/json"))
        .and_then(|media| media.get_mut("schema"))
    else {
        // Multipart and form bodies always carry their parts.
        body["required"] = Value::Bool(true);
        return;
    };
    for (on_method, on_path, required, refused) in ON_CREATE {
        if (on_method, on_path) == (method, path) {
            let mut properties = serde_json::Map::new();
            for field in required {
                properties.insert(field.to_string(), json!({"not": {"type": "null"}}));
            }
            for field in refused {
                properties.insert(field.to_string(), Value::Bool(false));
            }
            *json =
                json!({"allOf": [json.clone(), {"required": required, "properties": properties}]});
        }
    }
    let required = |schema: &Value| {
        let schema = match schema["$ref"].as_str() {
            Some(reference) => {
                let name = reference.rsplit('/').next().unwrap_or_default();
                &schemas[name]
            }
            None => schema,
        };
        schema["required"].as_array().is_some_and(|fields| !fields.is_empty())
    };
    let needs_fields =
        required(json) || json["allOf"].as_array().is_some_and(|parts| parts.iter().any(required));
    body["required"] = Value::Bool(needs_fields);
}

/// Query parameters that are required though their schema comes from a function (with
/// `schema_with`, utoipa marks every parameter optional).
const REQUIRED_QUERY: &[(&str, &str)] = &[("/browsers/{id}/curl/raw", "url")];

/// What each path parameter names, by the path segment before it. Operations leave their
/// path parameters out (but for a description of their own) and `complete` adds them,
/// described the same everywhere.
const PATH_PARAMETERS: &[(&str, &str)] = &[
    ("api_keys/{id}", "API key id"),
    ("browser_pools/{id_or_name}", "Pool id or name"),
    ("browsers/{id}", "Browser session id or name"),
    ("connections/{id}", "Auth connection id"),
    ("credential_providers/{id}", "Provider id or name"),
    ("credentials/{id_or_name}", "Credential id or name (the id is tried first)"),
    ("custom-tools/{tool_id}", "The custom tool's id"),
    ("deployments/{id}", "Deployment id"),
    ("destinations/{id}", "Destination id"),
    ("destinations/{id_or_name}", "Destination id or name"),
    ("executors/{name}", "Executor name"),
    ("extensions/{id_or_name}", "Extension id or name (the id is tried first)"),
    ("invocations/{id}", "Invocation id"),
    ("process/{process_id}", "Process id"),
    ("profiles/{id_or_name}", "Profile id or name (the id is tried first)"),
    ("projects/{id_or_name}", "Project id or name"),
    ("proxies/{id}", "Proxy id or name"),
    ("replays/{replay_id}", "Replay id"),
    ("watch/{watch_id}", "Watch id"),
];

/// Adds the path parameters an operation does not document itself, first and in the
/// path's order.
fn document_path_parameters(path: &str, operation: &mut Value) {
    let segments: Vec<&str> = path.split('/').collect();
    let documented = |operation: &Value, name: &str| {
        operation["parameters"].as_array().is_some_and(|parameters| {
            parameters
                .iter()
                .any(|parameter| parameter["in"] == "path" && parameter["name"] == name)
        })
    };
    let mut missing = Vec::new();
    for pair in segments.windows(2) {
        let Some(name) = pair[1].strip_prefix('{').and_then(|name| name.strip_suffix('}')) else {
            continue;
        };
        if documented(operation, name) {
            continue;
        }
        let key = format!("{}/{}", pair[0], pair[1]);
        let description = PATH_PARAMETERS
            .iter()
            .find(|(on, _)| *on == key)
            .map_or(name, |(_, description)| *description);
        missing.push(json!({"name": name, "in": "path", "required": true,
            "description": description, "schema": {"type": "string"}}));
    }
    if missing.is_empty() {
        return;
    }
    if let Some(parameters) = operation["parameters"].as_array() {
        missing.extend(parameters.iter().cloned());
    }
    operation["parameters"] = Value::Array(missing);
}

/// The tag (the reference's section) of the operations under each path prefix; the
/// longest prefix that matches wins.
const TAGS: &[(&str, &str)] = &[
    ("/apps", "apps"),
    ("/audit-logs", "audit_logs"),
    ("/auth/connections", "managed auth"),
    ("/auth/context", "auth"),
    ("/browser_pools", "browser_pools"),
    ("/browsers", "browsers"),
    ("/browsers/{id}/computer", "computer"),
    ("/browsers/{id}/fs", "filesystem"),
    ("/browsers/{id}/logs", "logs"),
    ("/browsers/{id}/playwright", "playwright"),
    ("/browsers/{id}/process", "processes"),
    ("/browsers/{id}/repl", "playwright"),
    ("/browsers/{id}/replays", "replays"),
    ("/browsers/{id}/telemetry", "telemetry"),
    ("/browsers/{id}/webmcp", "webmcp"),
    ("/credentials", "credentials"),
    ("/deployments", "apps"),
    ("/extensions", "extensions"),
    ("/healthz", "operations"),
    ("/inspector", "telemetry"),
    ("/invocations", "apps"),
    ("/openapi.json", "operations"),
    ("/org/api_keys", "api_keys"),
    ("/org/credential_providers", "credential providers"),
    ("/org/entitlements", "organization"),
    ("/org/limits", "organization"),
    ("/org/projects", "projects"),
    ("/profiles", "profiles"),
    ("/proxies", "proxies"),
    ("/readyz", "operations"),
    ("/replays", "replays"),
    ("/telemetry", "telemetry"),
];

/// The tag of the operations at `path`.
fn tag_of(path: &str) -> Option<&'static str> {
    TAGS.iter()
        .filter(|(prefix, _)| {
            path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, tag)| *tag)
}

fn complete_operation(path: &str, operation: &mut Value) {
    if let Some(tag) = tag_of(path) {
        operation["tags"] = json!([tag]);
    }
    document_path_parameters(path, operation);
    // Every operation takes the bearer key, but those marked `security(())`: public, or
    // authorized by a token of their own (live view, CDP, hosted login).
    match operation.get("security") {
        None => operation["security"] = json!([{"bearer": []}]),
        Some(security) if *security == json!([{}]) => {
            if let Some(operation) = operation.as_object_mut() {
                operation.remove("security");
            }
        }
        Some(_) => {}
    }
    let parameters = operation.get_mut("parameters").and_then(Value::as_array_mut);
    for parameter in parameters.into_iter().flatten() {
        if parameter["in"] == "query"
            && REQUIRED_QUERY.iter().any(|(on, name)| *on == path && parameter["name"] == *name)
        {
            parameter["required"] = Value::Bool(true);
        }
    }
    let tag = operation["tags"][0].as_str().unwrap_or_default().to_owned();
    if let Some(id) = operation["operationId"].as_str()
        && !tag.is_empty()
        && !id.starts_with(&format!("{tag}_"))
    {
        operation["operationId"] = Value::String(format!("{tag}_{id}"));
    }
    let has_parameters =
        operation["parameters"].as_array().is_some_and(|parameters| !parameters.is_empty());
    let has_body = operation.get("requestBody").is_some();
    let authenticated =
        operation["security"].as_array().is_some_and(|security| !security.is_empty());
    let errors = [
        (StatusCode::BAD_REQUEST, has_parameters || has_body),
        (StatusCode::UNAUTHORIZED, authenticated),
        (StatusCode::NOT_FOUND, path.contains('{')),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, has_body),
    ];
    let Some(responses) = operation["responses"].as_object_mut() else {
        return;
    };
    for (status, answered) in errors {
        if answered {
            responses.entry(status.as_str()).or_insert_with(|| {
                json!({
                    "description": reason(status.as_str()),
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                })
            });
        }
    }
    for (status, response) in responses.iter_mut() {
        if response.get("$ref").is_none()
            && response["description"].as_str().is_none_or(str::is_empty)
        {
            response["description"] = Value::String(reason(status));
        }
        // A stream of server-sent events: each event's fields (the data is JSON text).
        if let Some(stream) =
            response.get_mut("content").and_then(|content| content.get_mut("text/event-stream"))
        {
            stream["schema"] = json!({
                "type": "object",
                "required": ["data"],
                "properties": {
                    "event": {"type": "string"},
                    "data": {"type": "string", "contentMediaType": "application/json"},
                    "id": {"type": "string"},
                    "retry": {"type": "integer"},
                },
            });
        }
    }
}

/// The reason phrase of a status code.
fn reason(status: &str) -> String {
    status
        .parse::<u16>()
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .and_then(|code| code.canonical_reason())
        .unwrap_or("Response")
        .to_owned()
}

/// Replaces the schema of every refused field (wherever its object is described) by one
/// that no value satisfies, keeping its description.
fn forbid_unsupported_fields(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(Value::Object(properties)) = object.get_mut("properties") {
                for property in properties.values_mut() {
                    // The description is the property's, or (for an optional reference)
                    // that of the first member of its `oneOf`.
                    let description =
                        [&property["description"], &property["oneOf"][0]["description"]]
                            .into_iter()
                            .find_map(|description| description.as_str())
                            .filter(|description| description.starts_with(UNSUPPORTED_FIELD))
                            .map(str::to_owned);
                    if let Some(description) = description {
                        *property = json!({"not": {}, "description": description});
                    }
                }
            }
            object.values_mut().for_each(forbid_unsupported_fields);
        }
        Value::Array(items) => items.iter_mut().for_each(forbid_unsupported_fields),
        _ => {}
    }
}
