//! The OpenAPI 3.1 document at `/openapi.json`. It is generated from the same annotations
//! that register the routes, then completed where annotations cannot say it all: people
//! generate clients from it and fuzz against it, so it must describe exactly what the
//! server answers (`tests/e2e/test_schema_fuzz.py` holds it to that).

use std::sync::OnceLock;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use utoipa::openapi::OpenApi as OpenApiDocument;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, Array, ArrayBuilder, Object, ObjectBuilder, OneOfBuilder, Schema,
    SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

mod complete;

use super::error::{ErrorBody, ErrorDetail};
use super::state::AppState;
use crate::pools::MAX_POOL_SIZE;
use crate::proxies::TYPES;
use crate::sessions::labels;

/// How a field this server refuses starts its description (see `browsers::unsupported`).
const UNSUPPORTED_FIELD: &str = "Not supported by this server";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Browser service API (Kernel-compatible)",
        version = "0.1.0",
        description = "Remote Chromium sessions over HTTP, wire-compatible with the Kernel browser API."
    ),
    modifiers(&BearerSecurity),
    components(schemas(ErrorBody, ErrorDetail))
)]
pub(super) struct ApiDoc;

struct BearerSecurity;

impl Modify for BearerSecurity {
    fn modify(&self, openapi: &mut OpenApiDocument) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3.1 document of every route this server serves (built once).
pub fn document() -> Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            let generated = super::api_routes().split_for_parts().1;
            let mut document = serde_json::to_value(generated).unwrap_or_default();
            complete::complete(&mut document);
            document
        })
        .clone()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", security(()),
    responses((status = 200, description = "OpenAPI 3.1 document", body = Object)))]
pub async fn openapi_json(State(state): State<AppState>) -> Json<Value> {
    // The names this host's timezone database holds (read once).
    static TIMEZONES: OnceLock<Value> = OnceLock::new();
    let timezones = TIMEZONES.get_or_init(|| {
        let mut names: Vec<Value> =
            labels::timezone_names().into_iter().map(Value::String).collect();
        names.push(Value::Null);
        Value::Array(names)
    });
    let mut document = document();
    // Only the proxy types this server serves: the operator maps the others to upstream
    // proxies, or not.
    let served: Vec<&str> =
        TYPES.into_iter().filter(|kind| state.proxy_upstreams.serves(kind)).collect();
    let schemas = &mut document["components"]["schemas"];
    schemas["CreateProxyRequest"]["properties"]["type"]["enum"] = json!(served);
    if served == ["custom"] {
        // Only custom proxies: their config is this.
        let description =
            schemas["CreateProxyRequest"]["properties"]["config"]["description"].clone();
        schemas["CreateProxyRequest"]["properties"]["config"] = json!({
            "type": "object",
            "description": description,
            "required": ["host", "port"],
            "additionalProperties": false,
            "properties": {
                "host": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": r"^[^-/@ \u0000-\u001F\u007F-\u009F][^/@ \u0000-\u001F\u007F-\u009F]*$"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "username": {"type": "string", "pattern": format!("^{NO_CONTROLS}*$")},
                "password": {"type": "string", "pattern": format!("^{NO_CONTROLS}*$")},
            },
        });
        schemas["CreateProxyRequest"]["required"] = json!(["type", "config"]);
    }
    // The operator sets the shortest interval, and the one region.
    for request in ["CreateAuthConnectionRequest", "UpdateAuthConnectionRequest"] {
        schemas[request]["properties"]["health_check_interval"]["minimum"] =
            json!(state.managed_auth.min_health_check_interval);
    }
    for request in ["LocationRequest", "LocationUpdate"] {
        schemas[request]["properties"]["timezone"]["enum"] = timezones.clone();
    }
    schemas["ConnectionBrowserRequest"]["properties"]["region"]["enum"] =
        json!([&state.settings.region, null]);
    schemas["PoolRequest"]["properties"]["size"]["maximum"] =
        json!(state.pools.max_pooled_browsers().min(MAX_POOL_SIZE));
    for request in ["CreateBrowserRequest", "PoolRequest"] {
        schemas[request]["properties"]["region"]["enum"] = json!([&state.settings.region, null]);
    }
    Json(document)
}

/// Characters no name may contain: C0 and C1 controls (`char::is_control`).
const NO_CONTROLS: &str = r"[^\u0000-\u001F\u007F-\u009F]";

fn string_schema(nullable: bool, description: &str) -> ObjectBuilder {
    let schema_type: SchemaType = if nullable {
        [Type::String, Type::Null].into_iter().collect()
    } else {
        Type::String.into()
    };
    ObjectBuilder::new().schema_type(schema_type).description(Some(description))
}

/// A name people give a profile or proxy: 1 to 255 characters, no control characters.
pub fn display_name() -> Object {
    display_name_schema(false)
}

pub fn optional_display_name() -> Object {
    display_name_schema(true)
}

fn display_name_schema(nullable: bool) -> Object {
    string_schema(
        nullable,
        "1 to 255 characters without control characters; unique in the organization.",
    )
    .min_length(Some(1))
    .max_length(Some(255))
    .pattern(Some(format!("^{NO_CONTROLS}*$")))
    .build()
}

/// A browser session's name on create and acquire: up to 255 characters, not blank, no
/// control characters; `null` for none.
pub fn session_name() -> Object {
    string_schema(true, "Unique among the organization's live sessions: up to 255 characters, not blank, without control characters.")
        .max_length(Some(255))
        .pattern(Some(SESSION_NAME_PATTERN))
        .build()
}

/// A browser session's new name on update: `""` or `null` removes it.
pub fn new_session_name() -> Object {
    string_schema(true, "Unique among the organization's live sessions: up to 255 characters, not blank, without control characters. `\"\"` or `null` removes the name.")
        .max_length(Some(255))
        .pattern(Some(format!("^$|{SESSION_NAME_PATTERN}")))
        .build()
}

const SESSION_NAME_PATTERN: &str = r"^[^\u0000-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u001F\u007F-\u009F]*$";

/// The name of an extension or pool, which may become a directory name.
pub fn resource_name() -> Object {
    string_schema(true, "Unique in the organization: ^[A-Za-z0-9._-]{1,255}$, not `.` or `..`.")
        .pattern(Some(r"^(?!\.\.?$)[A-Za-z0-9._-]{1,255}$"))
        .build()
}

/// A proxy's type (`/openapi.json` lists those this server serves).
pub fn proxy_type() -> Object {
    string_schema(false, "datacenter, isp, residential, mobile or custom; all but custom only where the operator maps them to upstream proxies.")
        .enum_values(Some(TYPES))
        .build()
}

/// A flag only `false` (or absent) of: this server cannot do what `true` asks.
pub fn only_false() -> Object {
    ObjectBuilder::new()
        .schema_type([Type::Boolean, Type::Null].into_iter().collect::<SchemaType>())
        .enum_values(Some([json!(false), Value::Null]))
        .description(Some("Only `false`: this server cannot do what `true` asks (a 400 says so)."))
        .build()
}

/// Tags: up to 50 pairs; keys 1 to 128 characters, values up to 256, no control
/// characters in either.
pub fn tags() -> Object {
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(128))
        .pattern(Some(format!("^{NO_CONTROLS}*$")))
        .build();
    let value = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(256))
        .pattern(Some(format!("^{NO_CONTROLS}*$")))
        .build();
    ObjectBuilder::new()
        .schema_type([Type::Object, Type::Null].into_iter().collect::<SchemaType>())
        .property_names(Some(key))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(
            Schema::Object(value),
        ))))
        .max_properties(Some(50))
        .description(Some("Up to 50 pairs: keys 1 to 128 characters, values up to 256, without control characters. `{}` or `null`: none."))
        .build()
}

/// The values submitted to a login flow: discovered field name → value, at least one.
pub fn submitted_fields() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            ObjectBuilder::new().schema_type(Type::String).build(),
        )))))
        .min_properties(Some(1))
        .description(Some("Discovered field name → value; at least one."))
        .build()
}

/// A host as the URL parser accepts it: a name whose last label starts with a letter, or
/// an IPv4 address (IPv6 literals are accepted too but not described).
const HOST: &str = r"(?:(?:[A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*|(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))(?::[0-9]{1,4})?";

/// A site's domain, optionally with a port (no scheme or path).
pub fn host_and_port() -> Object {
    string_schema(
        false,
        "A host name or IPv4 address, optionally with a port (`example.com`, `127.0.0.1:8080`).",
    )
    .max_length(Some(253))
    .pattern(Some(format!("^{HOST}$")))
    .build()
}

/// An http or https URL (unanchored).
fn url_pattern() -> String {
    format!("https?://{HOST}(?:[/?#][!-~]*)?")
}

/// An http or https URL of at most 8 KiB.
pub fn http_url() -> Object {
    string_schema(true, "An http or https URL, at most 8192 characters.")
        .max_length(Some(8192))
        .pattern(Some(format!("^{}$", url_pattern())))
        .build()
}

/// The URL a browser's own request goes to: an http or https URL of at most 4096
/// characters (so that even a longer one, percent-encoded in a query, stays within
/// what a URI may hold and is answered with a 400).
pub fn request_url() -> Object {
    string_schema(false, "An http or https URL, at most 4096 characters.")
        .max_length(Some(4096))
        .pattern(Some(format!("^{}$", url_pattern())))
        .build()
}

/// Request headers: names HTTP allows (tokens), values of visible ASCII and tabs.
pub fn request_headers() -> Object {
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"))
        .build();
    let value = ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[\\t -~]*$")).build();
    ObjectBuilder::new()
        .schema_type([Type::Object, Type::Null].into_iter().collect::<SchemaType>())
        .property_names(Some(name))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(
            Schema::Object(value),
        ))))
        .description(Some("Over the browser's own headers for the request: HTTP header names, values of visible ASCII."))
        .build()
}

/// `http_url`, or `""` for no change.
pub fn new_start_url() -> Object {
    string_schema(true, "An http or https URL, at most 8192 characters, opened once the rest is applied; `\"\"` leaves the page as it is.")
        .max_length(Some(8192))
        .pattern(Some(format!("^$|^{}$", url_pattern())))
        .build()
}

/// An auth connection's login page: an http or https URL of at most 2048 characters;
/// on update also `""`, which clears it.
pub fn login_url() -> Object {
    string_schema(true, "The login page: an http or https URL, at most 2048 characters.")
        .max_length(Some(2048))
        .pattern(Some(format!("^{}$", url_pattern())))
        .build()
}

pub fn new_login_url() -> Object {
    string_schema(
        true,
        "The login page: an http or https URL, at most 2048 characters; `\"\"` clears it.",
    )
    .max_length(Some(2048))
    .pattern(Some(format!("^$|^{}$", url_pattern())))
    .build()
}

/// Domains a login may pass through: up to 50, each a host (and port) or `*.` and one.
pub fn allowed_domains() -> Array {
    let domain = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(253))
        .pattern(Some(format!(r"^(?:\*\.)?{HOST}$")));
    ArrayBuilder::new()
        .schema_type([Type::Array, Type::Null].into_iter().collect::<SchemaType>())
        .items(domain)
        .max_items(Some(50))
        .description(Some("Further domains the login may pass through or end on: up to 50, `*.example.com` allowed."))
        .build()
}

/// `since` of event streams and lists: an RFC 3339 time, or a duration back from now.
pub fn since() -> Schema {
    use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, SchemaFormat};
    AnyOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .item(ObjectBuilder::new().schema_type(Type::String).pattern(Some(r"^[0-9]{1,9}[smhd]$")))
        .description(Some(
            "An RFC 3339 time, or a duration back from now such as 90s, 5m, 2h or 1d.",
        ))
        .build()
        .into()
}

/// A TOTP algorithm.
pub fn totp_algorithm() -> Object {
    string_schema(true, "SHA1 (default), SHA256 or SHA512.")
        .enum_values(Some(["SHA1", "SHA256", "SHA512"]))
        .build()
}

/// An auth connection's credential: `{name}`, `{provider, path}` or `{provider, auto:
/// true}`, nothing else.
pub fn credential_reference() -> Schema {
    let text = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(255))
            .description(Some(description))
    };
    let exactly = |properties: Vec<(&str, Object)>| {
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        for (name, schema) in properties {
            object = object.property(name, schema).required(name);
        }
        object.build()
    };
    OneOfBuilder::new()
        .item(exactly(vec![(
            "name",
            text("A credential of the organization, by name or id.").build(),
        )]))
        .item(exactly(vec![
            ("provider", text("A credential provider, by name or id.").build()),
            (
                "path",
                text("The provider's item, `Vault/Item`.").pattern(Some(r"^[^/]+/.+$")).build(),
            ),
        ]))
        .item(exactly(vec![
            ("provider", text("A credential provider, by name or id.").build()),
            (
                "auto",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .enum_values(Some([json!(true)]))
                    .description(Some("The provider's item with a URL on the connection's domain."))
                    .build(),
            ),
        ]))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "`{name}` (a stored credential), `{provider, path}` or `{provider, auto: true}`; a \
             credential or provider the organization does not have is a 404.",
        ))
        .build()
        .into()
}

/// Hosts a proxy lets go direct: up to 100 entries of Chromium's bypass list (ASCII,
/// no spaces, commas or semicolons, not starting with `-`).
pub fn bypass_hosts() -> Array {
    let host = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(253))
        .pattern(Some(r"^[!-+.-:<-~][!-+\-.-:<-~]*$"));
    ArrayBuilder::new()
        .schema_type([Type::Array, Type::Null].into_iter().collect::<SchemaType>())
        .items(host)
        .max_items(Some(100))
        .description(Some("Hosts that go direct (Chromium bypass-list entries such as `*.example.com` or `<local>`); up to 100."))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What OpenAPI 3.1 requires of operations (the e2e suite also runs a validator over
    /// the served document): unique operation ids, a description for every response, and
    /// path parameters that are in the path.
    #[test]
    fn operations_are_complete() {
        let json = document();
        let mut ids = std::collections::HashSet::new();
        for (path, item) in json["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("path item") {
                let id = operation["operationId"].as_str().expect("operation id");
                assert!(ids.insert(id.to_owned()), "{id} is used twice");
                for (status, response) in operation["responses"].as_object().expect("responses") {
                    assert!(
                        response["description"].as_str().is_some_and(|d| !d.is_empty()),
                        "{method} {path} {status} has no description"
                    );
                }
                for parameter in operation["parameters"].as_array().into_iter().flatten() {
                    if parameter["in"] == "path" {
                        let name = parameter["name"].as_str().expect("name");
                        assert!(path.contains(&format!("{{{name}}}")), "{method} {path}: {name}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_store_url_pattern_spells_the_host_pattern() {
        let json = document();
        let url = json["paths"]["/extensions/from_chrome_store"]["get"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|parameter| parameter["name"] == "url")
            .expect("url parameter");
        let pattern = url["schema"]["pattern"].as_str().expect("pattern");
        assert!(pattern.contains(&format!("^https?://{HOST}(?:/")), "{pattern}");
    }
}
