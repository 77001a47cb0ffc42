//! The HTTP API: one module per resource, thin handlers over the services. Every route is
//! registered through `utoipa_axum`, so the OpenAPI document at `/openapi.json` is
//! generated from the same code that serves the routes.

pub mod browsers;
pub mod cdp;
pub mod extract;
pub mod health;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use tower_http::trace::TraceLayer;
use utoipa::openapi::OpenApi as OpenApiDocument;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody, ErrorDetail};
use crate::state::AppState;

/// Largest JSON request body accepted.
pub const MAX_JSON_BODY_BYTES: usize = 1024 * 1024;

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
struct ApiDoc;

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

#[allow(deprecated)] // the deprecated DELETE /browsers is still served
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(browsers::create, browsers::list, browsers::delete_by_persistent_id))
        .routes(routes!(browsers::retrieve, browsers::delete))
        .routes(routes!(cdp::connect))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(openapi_json))
}

/// The OpenAPI 3.1 document of every route this server serves.
pub fn openapi() -> OpenApiDocument {
    api_routes().split_for_parts().1
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1 document")))]
async fn openapi_json() -> Json<OpenApiDocument> {
    Json(openapi())
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes().split_for_parts();
    routes
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
