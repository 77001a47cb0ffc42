//! The HTTP API: one module per resource, thin handlers over the services. Every route is
//! registered through `utoipa_axum`, so the OpenAPI document at `/openapi.json` is
//! generated from the same code that serves the routes.

#[cfg(test)]
mod action_docs;
pub mod apps;
pub mod audit;
pub mod auth;
pub mod browsers;
pub mod console;
pub mod docs;
pub mod error;
pub mod extract;
pub mod forward;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod org;
pub mod organization;
pub mod paging;
pub mod resources;
pub mod session_token;
pub mod state;
pub mod telemetry_calls;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
pub use paging::{NamedListQuery, list_limit, page_headers, page_of};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use error::ApiError;
use state::AppState;

/// Largest JSON request body accepted.
pub const MAX_JSON_BODY_BYTES: usize = 1024 * 1024;

#[allow(deprecated)] // the deprecated DELETE /browsers is still served
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(browsers::create, browsers::list, browsers::delete_by_persistent_id))
        .routes(routes!(browsers::retrieve, browsers::update, browsers::delete))
        .routes(routes!(browsers::cdp::connect))
        .routes(routes!(browsers::cdp::webdriver))
        .routes(routes!(browsers::live_view::page))
        .routes(routes!(browsers::live_view::socket))
        .routes(routes!(browsers::live_view::flow_page))
        .routes(routes!(browsers::live_view::flow_socket))
        .routes(routes!(resources::extensions::list))
        .routes(routes!(resources::extensions::download, resources::extensions::delete))
        .routes(routes!(resources::extensions::metadata))
        .routes(routes!(resources::chrome_store::from_chrome_store))
        .routes(routes!(browsers::replays::start, browsers::replays::list))
        .routes(routes!(browsers::replays::stop))
        .routes(routes!(browsers::replays::download))
        .routes(routes!(browsers::replays::view_page))
        .routes(routes!(browsers::replays::view_video))
        .routes(routes!(resources::proxies::create, resources::proxies::list))
        .routes(routes!(
            resources::proxies::retrieve,
            resources::proxies::update,
            resources::proxies::delete
        ))
        .routes(routes!(resources::proxies::check))
        .routes(routes!(resources::pools::create, resources::pools::list))
        .routes(routes!(
            resources::pools::retrieve,
            resources::pools::update,
            resources::pools::delete
        ))
        .routes(routes!(resources::pools::acquire))
        .routes(routes!(resources::pools::release))
        .routes(routes!(resources::pools::flush))
        .routes(routes!(resources::profiles::create, resources::profiles::list))
        .routes(routes!(
            resources::profiles::retrieve,
            resources::profiles::update,
            resources::profiles::delete
        ))
        .routes(routes!(resources::profiles::download))
        .routes(routes!(auth::connections::create, auth::connections::list))
        .routes(routes!(
            auth::connections::retrieve,
            auth::connections::update,
            auth::connections::delete
        ))
        .routes(routes!(auth::connections::login))
        .routes(routes!(auth::connections::submit))
        .routes(routes!(auth::connections::events))
        .routes(routes!(auth::hosted_login::hosted_page, auth::hosted_login::hosted_submit))
        .routes(routes!(auth::timeline::timeline))
        .routes(routes!(auth::context::context))
        .routes(routes!(organization::api_keys::create, organization::api_keys::list))
        .routes(routes!(
            organization::api_keys::retrieve,
            organization::api_keys::update,
            organization::api_keys::delete
        ))
        .routes(routes!(organization::api_keys::rotate))
        .routes(routes!(organization::audit_logs::list))
        .routes(routes!(organization::limits::limits, organization::limits::update_limits))
        .routes(routes!(organization::limits::entitlements))
        .routes(routes!(organization::projects::create, organization::projects::list))
        .routes(routes!(
            organization::projects::retrieve,
            organization::projects::update,
            organization::projects::delete
        ))
        .routes(routes!(organization::projects::limits, organization::projects::update_limits))
        .routes(routes!(organization::audit_logs::export_chunk))
        .routes(routes!(organization::audit_export::create, organization::audit_export::list))
        .routes(routes!(
            organization::audit_export::retrieve,
            organization::audit_export::update,
            organization::audit_export::delete
        ))
        .routes(routes!(organization::audit_export::test))
        .routes(routes!(auth::credentials::create, auth::credentials::list))
        .routes(routes!(
            auth::credentials::retrieve,
            auth::credentials::update,
            auth::credentials::delete
        ))
        .routes(routes!(auth::credentials::totp_code))
        .routes(routes!(auth::credential_providers::create, auth::credential_providers::list))
        .routes(routes!(
            auth::credential_providers::retrieve,
            auth::credential_providers::update,
            auth::credential_providers::delete
        ))
        .routes(routes!(apps::deployments::list))
        .routes(routes!(apps::deployments::retrieve, apps::deployments::delete))
        .routes(routes!(apps::deployments::events))
        .routes(routes!(apps::deployments::list_apps))
        .routes(routes!(apps::invocations::create, apps::invocations::list))
        .routes(routes!(apps::invocations::retrieve, apps::invocations::update))
        .routes(routes!(apps::invocations::events))
        .routes(routes!(apps::invocations::list_browsers, apps::invocations::delete_browsers))
        .routes(routes!(auth::credential_providers::items))
        .routes(routes!(auth::credential_providers::test))
        .routes(routes!(browsers::logs::stream))
        .routes(routes!(browsers::telemetry::events))
        .routes(routes!(browsers::telemetry::stream))
        .routes(routes!(browsers::telemetry::har))
        .routes(routes!(browsers::inspector::page))
        .routes(routes!(browsers::inspector::script))
        .routes(routes!(browsers::inspector::style))
        .routes(routes!(browsers::inspector::events))
        .routes(routes!(browsers::inspector::replays))
        .routes(routes!(
            organization::telemetry_destinations::create,
            organization::telemetry_destinations::list
        ))
        .routes(routes!(
            organization::telemetry_destinations::retrieve,
            organization::telemetry_destinations::update,
            organization::telemetry_destinations::delete
        ))
        .routes(routes!(browsers::curl::curl))
        .routes(routes!(browsers::webmcp::list_tools))
        .routes(routes!(browsers::webmcp::invoke_tool))
        .routes(routes!(browsers::webmcp::add_custom_tools, browsers::webmcp::list_custom_tools))
        .routes(routes!(browsers::webmcp::remove_custom_tool))
        .routes(routes!(browsers::curl::raw))
        .routes(routes!(browsers::playwright::execute))
        .routes(routes!(browsers::playwright::repl))
        .routes(routes!(browsers::playwright::list_executors))
        .routes(routes!(browsers::playwright::delete_executor))
        .routes(routes!(browsers::processes::exec))
        .routes(routes!(browsers::processes::spawn))
        .routes(routes!(browsers::processes::status))
        .routes(routes!(browsers::processes::stdin))
        .routes(routes!(browsers::processes::stream))
        .routes(routes!(browsers::processes::kill))
        .routes(routes!(browsers::processes::resize))
        .routes(routes!(browsers::computer::click_mouse))
        .routes(routes!(browsers::computer::drag_mouse))
        .routes(routes!(browsers::computer::get_mouse_position))
        .routes(routes!(browsers::computer::move_mouse))
        .routes(routes!(browsers::computer::type_text))
        .routes(routes!(browsers::computer::press_key))
        .routes(routes!(browsers::computer::scroll))
        .routes(routes!(browsers::computer::screenshot))
        .routes(routes!(browsers::computer::batch::batch))
        .routes(routes!(browsers::computer::desktop::read_clipboard))
        .routes(routes!(browsers::computer::desktop::write_clipboard))
        .routes(routes!(browsers::computer::desktop::set_cursor))
        .routes(routes!(browsers::fs::move_path))
        .routes(routes!(browsers::fs::file_info))
        .routes(routes!(browsers::fs::list_files))
        .routes(routes!(browsers::fs::read_file))
        .routes(routes!(browsers::fs::download_dir_zip))
        .routes(routes!(browsers::fs::create_directory))
        .routes(routes!(browsers::fs::delete_file))
        .routes(routes!(browsers::fs::delete_directory))
        .routes(routes!(browsers::fs::set_file_permissions))
        .routes(routes!(browsers::fs_watch::start))
        .routes(routes!(browsers::fs_watch::events))
        .routes(routes!(browsers::fs_watch::stop))
        .merge(
            // Uploads stream and count their bytes against their own limits.
            OpenApiRouter::new()
                .routes(routes!(browsers::fs::write_file))
                .routes(routes!(browsers::fs::upload_zip))
                .routes(routes!(browsers::fs_upload::upload))
                .routes(routes!(resources::extensions::upload))
                .routes(routes!(resources::extensions::load_into_browser))
                .routes(routes!(apps::deployments::create))
                .layer(DefaultBodyLimit::disable()),
        )
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(openapi::openapi_json))
}

/// A ZIP file for download, saved as `filename`.
pub fn zip_attachment(filename: &str, length: Option<i64>, body: Body) -> Response {
    let mut response = (
        [
            (CONTENT_TYPE, "application/zip".to_owned()),
            (CONTENT_DISPOSITION, format!("attachment; filename=\"{filename}\"")),
        ],
        body,
    )
        .into_response();
    if let Some(length) = length {
        response.headers_mut().insert(CONTENT_LENGTH, length.into());
    }
    response
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes().split_for_parts();
    routes
        .route(metrics::PATH, axum::routing::get(metrics::with_token))
        .route(auth::sign_in::LOGIN_PATH, axum::routing::get(auth::sign_in::login))
        .route(auth::sign_in::CALLBACK_PATH, axum::routing::get(auth::sign_in::callback))
        .route(auth::sign_in::LOGOUT_PATH, axum::routing::post(auth::sign_in::logout))
        .merge(console::routes())
        .merge(docs::routes())
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(axum::middleware::from_fn(count_store_statements))
        // Each request may be confined to a project once its caller is known (`org`).
        .layer(axum::middleware::from_fn(
            |request: axum::extract::Request, next: axum::middleware::Next| {
                crate::store::scope::request(next.run(request))
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            telemetry_calls::record_browser_calls,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), audit::record_calls))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            session_token::accept_session_tokens,
        ))
        // Outside the session-token layer, which takes the token out of the URL: a
        // forwarded request keeps it.
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::to_home_replica))
        .layer(axum::middleware::from_fn(browsers::keep_alive::keep_connections_usable))
        .layer(axum::middleware::from_fn(metrics::count_requests))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Answers how many statements the request sent to the store (`Server-Timing`; see
/// `crate::store::statements`).
async fn count_store_statements(
    request: axum::extract::Request, next: axum::middleware::Next,
) -> Response {
    let (mut response, statements) = crate::store::statements::counting(next.run(request)).await;
    if let Ok(value) = format!("store;desc=\"{statements} statements\"").parse() {
        response.headers_mut().append("server-timing", value);
    }
    response
}

async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {method} {}: not supported by this server",
        uri.path()
    ))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::tokens::Tokens;

    /// Every endpoint of the Kernel API contract (API-CONTRACT.md), whether built yet or
    /// not. Path parameters are filled with `x`.
    const CONTRACT: &[(&str, &str)] = &[
        ("POST", "/browsers"),
        ("GET", "/browsers"),
        ("DELETE", "/browsers"),
        ("GET", "/browsers/x"),
        ("DELETE", "/browsers/x"),
        ("PATCH", "/browsers/x"),
        ("GET", "/browsers/x/cdp"),
        ("POST", "/browsers/x/extensions"),
        ("PUT", "/browsers/x/fs/move"),
        ("POST", "/browsers/x/fs/upload_zip"),
        ("POST", "/browsers/x/fs/upload"),
        ("POST", "/browsers/x/fs/watch"),
        ("GET", "/browsers/x/fs/watch/x/events"),
        ("DELETE", "/browsers/x/fs/watch/x"),
        ("GET", "/browsers/x/fs/read_file"),
        ("PUT", "/browsers/x/fs/write_file"),
        ("GET", "/browsers/x/fs/list_files"),
        ("GET", "/browsers/x/fs/file_info"),
        ("PUT", "/browsers/x/fs/create_directory"),
        ("PUT", "/browsers/x/fs/delete_file"),
        ("PUT", "/browsers/x/fs/delete_directory"),
        ("GET", "/browsers/x/fs/download_dir_zip"),
        ("PUT", "/browsers/x/fs/set_file_permissions"),
        ("POST", "/browsers/x/computer/click_mouse"),
        ("POST", "/browsers/x/computer/drag_mouse"),
        ("POST", "/browsers/x/computer/get_mouse_position"),
        ("POST", "/browsers/x/computer/move_mouse"),
        ("POST", "/browsers/x/computer/type"),
        ("POST", "/browsers/x/computer/press_key"),
        ("POST", "/browsers/x/computer/scroll"),
        ("POST", "/browsers/x/computer/screenshot"),
        ("POST", "/browsers/x/computer/batch"),
        ("POST", "/browsers/x/computer/clipboard/read"),
        ("POST", "/browsers/x/computer/clipboard/write"),
        ("POST", "/browsers/x/computer/cursor"),
        ("POST", "/browsers/x/replays"),
        ("GET", "/browsers/x/replays"),
        ("POST", "/browsers/x/replays/x/stop"),
        ("GET", "/browsers/x/replays/x"),
        ("POST", "/extensions"),
        ("GET", "/extensions"),
        ("GET", "/extensions/x"),
        ("DELETE", "/extensions/x"),
        ("PATCH", "/profiles/x"),
        ("PATCH", "/proxies/x"),
        ("GET", "/extensions/x/metadata"),
        ("POST", "/proxies"),
        ("GET", "/proxies"),
        ("GET", "/proxies/x"),
        ("DELETE", "/proxies/x"),
        ("POST", "/proxies/x/check"),
        ("POST", "/browser_pools"),
        ("GET", "/browser_pools"),
        ("GET", "/browser_pools/x"),
        ("PATCH", "/browser_pools/x"),
        ("DELETE", "/browser_pools/x"),
        ("POST", "/browser_pools/x/acquire"),
        ("POST", "/browser_pools/x/release"),
        ("POST", "/browser_pools/x/flush"),
        ("POST", "/profiles"),
        ("GET", "/profiles"),
        ("GET", "/profiles/x"),
        ("DELETE", "/profiles/x"),
        ("GET", "/profiles/x/download"),
        ("POST", "/auth/connections"),
        ("GET", "/auth/connections"),
        ("GET", "/auth/connections/x"),
        ("DELETE", "/auth/connections/x"),
        ("POST", "/auth/connections/x/login"),
        ("POST", "/auth/connections/x/submit"),
        ("GET", "/auth/connections/x/events"),
        ("POST", "/deployments"),
        ("GET", "/deployments"),
        ("GET", "/deployments/x"),
        ("DELETE", "/deployments/x"),
        ("GET", "/deployments/x/events"),
        ("GET", "/apps"),
        ("POST", "/invocations"),
        ("GET", "/invocations"),
        ("GET", "/invocations/x"),
        ("PATCH", "/invocations/x"),
        ("GET", "/invocations/x/events"),
        ("GET", "/invocations/x/browsers"),
        ("DELETE", "/invocations/x/browsers"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/openapi.json"),
    ];

    async fn test_router(dir: &std::path::Path) -> Router {
        let (services, _, _) = crate::testing::services(dir).await;
        router(AppState::new(
            services,
            Tokens::from_secret(b"test"),
            state::HttpSettings {
                public_url: "http://test".into(),
                max_upload_bytes: 1024,
                max_extension_bytes: 1024,
                proxy_check_url: "http://example.com/".into(),
                region: "us-east".into(),
                chrome_web_store: std::sync::Arc::new(
                    crate::chrome_store::ChromeWebStore::new(
                        "http://127.0.0.1:9/".parse().expect("url"),
                        1024,
                    )
                    .expect("client"),
                ),
                metrics: state::MetricsSettings {
                    token: Some("metrics-token".into()),
                    capacity: crate::metrics::Capacity { browsers: 4 },
                },
                offer: Default::default(),
                oidc: None,
                operator_org: crate::store::Organization {
                    id: "org_default".into(),
                    name: "default".into(),
                    created_at: chrono::Utc::now(),
                },
            },
        ))
    }

    /// Whether the router serves `method path` (anything but our "no route" answers).
    async fn is_served(router: &Router, method: &str, path: &str) -> bool {
        let request =
            Request::builder().method(method).uri(path).body(Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("response");
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return false;
        }
        if response.status() != StatusCode::NOT_FOUND {
            return true;
        }
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        !String::from_utf8_lossy(&body).contains("no route for")
    }

    fn documented(json: &serde_json::Value) -> Vec<(String, String)> {
        let mut routes = Vec::new();
        for (path, item) in json["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                let concrete = path
                    .split('/')
                    .map(|s| if s.starts_with('{') { "x" } else { s })
                    .collect::<Vec<_>>()
                    .join("/");
                routes.push((method.to_uppercase(), concrete));
            }
        }
        routes
    }

    #[tokio::test]
    async fn every_served_route_is_documented_and_every_documented_route_is_served() {
        let dir = tempfile::tempdir().expect("temp dir");
        let router = test_router(dir.path()).await;
        let documented = documented(&openapi::document());
        for (method, path) in CONTRACT {
            if is_served(&router, method, path).await {
                assert!(
                    documented.contains(&(method.to_string(), path.to_string())),
                    "{method} {path} is served but missing from /openapi.json"
                );
            }
        }
        for (method, path) in &documented {
            assert!(
                is_served(&router, method, path).await,
                "{method} {path} is documented but not served"
            );
        }
        assert!(documented.len() >= 9, "the document lists too few routes: {documented:?}");
    }

    #[tokio::test]
    async fn unknown_routes_and_methods_answer_the_error_shape() {
        let dir = tempfile::tempdir().expect("temp dir");
        let router = test_router(dir.path()).await;
        for (method, path, status) in [("GET", "/nope", 404), ("PUT", "/browsers", 405)] {
            let request =
                Request::builder().method(method).uri(path).body(Body::empty()).expect("request");
            let response = router.clone().oneshot(request).await.expect("response");
            assert_eq!(response.status().as_u16(), status);
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
            let error: serde_json::Value = serde_json::from_slice(&body).expect("JSON error body");
            assert!(error["code"].is_string() && error["message"].is_string(), "{error}");
        }
    }

    async fn get(router: &Router, path: &str, token: Option<&str>) -> (u16, String) {
        let mut request = Request::builder().uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("response");
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn metrics_need_their_token_and_count_requests_by_route_template() {
        let dir = tempfile::tempdir().expect("temp dir");
        let router = test_router(dir.path()).await;
        assert_eq!(get(&router, "/metrics", None).await.0, 401);
        assert_eq!(get(&router, "/metrics", Some("wrong")).await.0, 401);
        // An API key is not the metrics token.
        assert_eq!(get(&router, "/metrics", Some("sk_whatever")).await.0, 401);
        assert_eq!(get(&router, "/browsers/some-id-1", None).await.0, 401);
        assert_eq!(get(&router, "/browsers/some-id-2", None).await.0, 401);
        let (status, text) = get(&router, "/metrics", Some("metrics-token")).await;
        assert_eq!(status, 200, "{text}");
        let line = text
            .lines()
            .find(|line| {
                line.starts_with("browser_service_http_requests_total{")
                    && line.contains(r#"method="GET""#)
                    && line.contains(r#"route="/browsers/{id}""#)
                    && line.contains(r#"status="401""#)
            })
            .unwrap_or_else(|| panic!("no request counter for the route template:\n{text}"));
        let count: f64 =
            line.rsplit(' ').next().and_then(|value| value.parse().ok()).expect("a value");
        // Other tests of this process may count too (the metrics are process-wide).
        assert!(count >= 2.0, "{line}");
        assert!(!text.contains("some-id-1"), "raw paths must not become labels");
        for name in [
            "browser_service_capacity_browsers 4",
            "browser_service_browser_vms 0",
            "browser_service_recordings_active 0",
            "# TYPE browser_service_pool_acquire_duration_seconds histogram",
            "# TYPE browser_service_browser_create_duration_seconds histogram",
            "# TYPE browser_service_heap_in_use_bytes gauge",
            "# TYPE browser_service_heap_held_bytes gauge",
            "# EOF",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        // The heap holds live data, at most what it took from the system.
        let value = |name: &str| -> f64 {
            let line = text.lines().find(|line| line.starts_with(&format!("{name} ")));
            line.and_then(|line| line.rsplit(' ').next()?.parse().ok()).expect(name)
        };
        let in_use = value("browser_service_heap_in_use_bytes");
        assert!(in_use > 0.0 && in_use <= value("browser_service_heap_held_bytes"), "{text}");
    }
}
