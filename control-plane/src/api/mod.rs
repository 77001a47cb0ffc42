//! The HTTP API: one module per resource, thin handlers over the services. Every route is
//! registered through `utoipa_axum`, so the OpenAPI document at `/openapi.json` is
//! generated from the same code that serves the routes.

#[cfg(test)]
mod action_docs;
pub mod api_keys;
pub mod app_events;
pub mod audit;
pub mod audit_export_destinations;
pub mod audit_logs;
pub mod auth_connections;
pub mod auth_context;
pub mod auth_settings;
pub mod auth_timeline;
pub mod browser_view;
pub mod browsers;
pub mod cdp;
mod cdp_passthrough;
pub mod chrome_store;
pub mod computer;
pub mod console;
pub mod credential_providers;
pub mod credentials;
pub mod curl;
pub mod deployments;
pub mod docs;
pub mod error;
pub mod extensions;
pub mod extract;
pub mod forward;
pub mod fs;
pub mod fs_upload;
pub mod fs_watch;
pub mod health;
pub mod inspector;
pub mod invocations;
pub mod keep_alive;
pub mod live_view;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod org;
pub mod organization;
pub mod paging;
pub mod playwright;
pub mod pools;
pub mod processes;
pub mod profiles;
pub mod projects;
pub mod proxies;
pub mod replays;
pub mod session_token;
pub mod sign_in;
pub mod state;
pub mod telemetry;
pub mod telemetry_calls;
pub mod telemetry_destinations;
pub mod webmcp;

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
        .routes(routes!(
            browsers::create,
            browsers::list,
            browsers::delete_by_persistent_id
        ))
        .routes(routes!(
            browsers::retrieve,
            browsers::update,
            browsers::delete
        ))
        .routes(routes!(cdp::connect))
        .routes(routes!(cdp::webdriver))
        .routes(routes!(live_view::page))
        .routes(routes!(live_view::socket))
        .routes(routes!(live_view::flow_page))
        .routes(routes!(live_view::flow_socket))
        .routes(routes!(extensions::list))
        .routes(routes!(extensions::download, extensions::delete))
        .routes(routes!(extensions::metadata))
        .routes(routes!(chrome_store::from_chrome_store))
        .routes(routes!(replays::start, replays::list))
        .routes(routes!(replays::stop))
        .routes(routes!(replays::download))
        .routes(routes!(replays::view_page))
        .routes(routes!(replays::view_video))
        .routes(routes!(proxies::create, proxies::list))
        .routes(routes!(proxies::retrieve, proxies::update, proxies::delete))
        .routes(routes!(proxies::check))
        .routes(routes!(pools::create, pools::list))
        .routes(routes!(pools::retrieve, pools::update, pools::delete))
        .routes(routes!(pools::acquire))
        .routes(routes!(pools::release))
        .routes(routes!(pools::flush))
        .routes(routes!(profiles::create, profiles::list))
        .routes(routes!(
            profiles::retrieve,
            profiles::update,
            profiles::delete
        ))
        .routes(routes!(profiles::download))
        .routes(routes!(auth_connections::create, auth_connections::list))
        .routes(routes!(
            auth_connections::retrieve,
            auth_connections::update,
            auth_connections::delete
        ))
        .routes(routes!(auth_connections::login))
        .routes(routes!(auth_connections::submit))
        .routes(routes!(auth_connections::events))
        .routes(routes!(
            auth_connections::hosted_page,
            auth_connections::hosted_submit
        ))
        .routes(routes!(auth_timeline::timeline))
        .routes(routes!(auth_context::context))
        .routes(routes!(api_keys::create, api_keys::list))
        .routes(routes!(
            api_keys::retrieve,
            api_keys::update,
            api_keys::delete
        ))
        .routes(routes!(api_keys::rotate))
        .routes(routes!(audit_logs::list))
        .routes(routes!(organization::limits, organization::update_limits))
        .routes(routes!(organization::entitlements))
        .routes(routes!(projects::create, projects::list))
        .routes(routes!(
            projects::retrieve,
            projects::update,
            projects::delete
        ))
        .routes(routes!(projects::limits, projects::update_limits))
        .routes(routes!(audit_logs::export_chunk))
        .routes(routes!(
            audit_export_destinations::create,
            audit_export_destinations::list
        ))
        .routes(routes!(
            audit_export_destinations::retrieve,
            audit_export_destinations::update,
            audit_export_destinations::delete
        ))
        .routes(routes!(audit_export_destinations::test))
        .routes(routes!(credentials::create, credentials::list))
        .routes(routes!(
            credentials::retrieve,
            credentials::update,
            credentials::delete
        ))
        .routes(routes!(credentials::totp_code))
        .routes(routes!(
            credential_providers::create,
            credential_providers::list
        ))
        .routes(routes!(
            credential_providers::retrieve,
            credential_providers::update,
            credential_providers::delete
        ))
        .routes(routes!(deployments::list))
        .routes(routes!(deployments::retrieve, deployments::delete))
        .routes(routes!(deployments::events))
        .routes(routes!(deployments::list_apps))
        .routes(routes!(invocations::create, invocations::list))
        .routes(routes!(invocations::retrieve, invocations::update))
        .routes(routes!(invocations::events))
        .routes(routes!(
            invocations::list_browsers,
            invocations::delete_browsers
        ))
        .routes(routes!(credential_providers::items))
        .routes(routes!(credential_providers::test))
        .routes(routes!(logs::stream))
        .routes(routes!(telemetry::events))
        .routes(routes!(telemetry::stream))
        .routes(routes!(telemetry::har))
        .routes(routes!(inspector::page))
        .routes(routes!(inspector::script))
        .routes(routes!(inspector::style))
        .routes(routes!(inspector::events))
        .routes(routes!(inspector::replays))
        .routes(routes!(
            telemetry_destinations::create,
            telemetry_destinations::list
        ))
        .routes(routes!(
            telemetry_destinations::retrieve,
            telemetry_destinations::update,
            telemetry_destinations::delete
        ))
        .routes(routes!(curl::curl))
        .routes(routes!(webmcp::list_tools))
        .routes(routes!(webmcp::invoke_tool))
        .routes(routes!(webmcp::add_custom_tools, webmcp::list_custom_tools))
        .routes(routes!(webmcp::remove_custom_tool))
        .routes(routes!(curl::raw))
        .routes(routes!(playwright::execute))
        .routes(routes!(playwright::repl))
        .routes(routes!(playwright::list_executors))
        .routes(routes!(playwright::delete_executor))
        .routes(routes!(processes::exec))
        .routes(routes!(processes::spawn))
        .routes(routes!(processes::status))
        .routes(routes!(processes::stdin))
        .routes(routes!(processes::stream))
        .routes(routes!(processes::kill))
        .routes(routes!(processes::resize))
        .routes(routes!(computer::click_mouse))
        .routes(routes!(computer::drag_mouse))
        .routes(routes!(computer::get_mouse_position))
        .routes(routes!(computer::move_mouse))
        .routes(routes!(computer::type_text))
        .routes(routes!(computer::press_key))
        .routes(routes!(computer::scroll))
        .routes(routes!(computer::screenshot))
        .routes(routes!(computer::batch::batch))
        .routes(routes!(computer::desktop::read_clipboard))
        .routes(routes!(computer::desktop::write_clipboard))
        .routes(routes!(computer::desktop::set_cursor))
        .routes(routes!(fs::move_path))
        .routes(routes!(fs::file_info))
        .routes(routes!(fs::list_files))
        .routes(routes!(fs::read_file))
        .routes(routes!(fs::download_dir_zip))
        .routes(routes!(fs::create_directory))
        .routes(routes!(fs::delete_file))
        .routes(routes!(fs::delete_directory))
        .routes(routes!(fs::set_file_permissions))
        .routes(routes!(fs_watch::start))
        .routes(routes!(fs_watch::events))
        .routes(routes!(fs_watch::stop))
        .merge(
            // Uploads stream and count their bytes against their own limits.
            OpenApiRouter::new()
                .routes(routes!(fs::write_file))
                .routes(routes!(fs::upload_zip))
                .routes(routes!(fs_upload::upload))
                .routes(routes!(extensions::upload))
                .routes(routes!(extensions::load_into_browser))
                .routes(routes!(deployments::create))
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
            (
                CONTENT_DISPOSITION,
                format!("attachment; filename=\"{filename}\""),
            ),
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
        .route(sign_in::LOGIN_PATH, axum::routing::get(sign_in::login))
        .route(
            sign_in::CALLBACK_PATH,
            axum::routing::get(sign_in::callback),
        )
        .route(sign_in::LOGOUT_PATH, axum::routing::post(sign_in::logout))
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
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            audit::record_calls,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            session_token::accept_session_tokens,
        ))
        // Outside the session-token layer, which takes the token out of the URL: a
        // forwarded request keeps it.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_home_replica,
        ))
        .layer(axum::middleware::from_fn(
            keep_alive::keep_connections_usable,
        ))
        .layer(axum::middleware::from_fn(metrics::count_requests))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Answers how many statements the request sent to the store (`Server-Timing`; see
/// `crate::store::statements`).
async fn count_store_statements(
    request: axum::extract::Request,
    next: axum::middleware::Next,
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
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .expect("request");
        let response = router.clone().oneshot(request).await.expect("response");
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return false;
        }
        if response.status() != StatusCode::NOT_FOUND {
            return true;
        }
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
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
        assert!(
            documented.len() >= 9,
            "the document lists too few routes: {documented:?}"
        );
    }

    #[tokio::test]
    async fn unknown_routes_and_methods_answer_the_error_shape() {
        let dir = tempfile::tempdir().expect("temp dir");
        let router = test_router(dir.path()).await;
        for (method, path, status) in [("GET", "/nope", 404), ("PUT", "/browsers", 405)] {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .expect("request");
            let response = router.clone().oneshot(request).await.expect("response");
            assert_eq!(response.status().as_u16(), status);
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            let error: serde_json::Value = serde_json::from_slice(&body).expect("JSON error body");
            assert!(
                error["code"].is_string() && error["message"].is_string(),
                "{error}"
            );
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
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
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
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|value| value.parse().ok())
            .expect("a value");
        // Other tests of this process may count too (the metrics are process-wide).
        assert!(count >= 2.0, "{line}");
        assert!(
            !text.contains("some-id-1"),
            "raw paths must not become labels"
        );
        for name in [
            "browser_service_capacity_browsers 4",
            "browser_service_browser_vms 0",
            "browser_service_recordings_active 0",
            "# TYPE browser_service_pool_acquire_duration_seconds histogram",
            "# TYPE browser_service_browser_create_duration_seconds histogram",
            "# EOF",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
