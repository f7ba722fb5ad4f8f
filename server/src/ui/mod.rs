//! The web dashboard, on its own listener (`--ui-listen`): static assets embedded in
//! the binary and a small JSON API over the same services gRPC callers use.
//!
//! Invariants:
//! - every API call goes through the gRPC service implementations, with the
//!   principal of the caller's bearer token: the dashboard can do nothing the
//!   token could not do over gRPC, and errors are the same errors;
//! - `--ui-read-only` refuses every change here, whatever the token;
//! - user data (payloads, errors, keys) only ever leaves as JSON strings; the page
//!   renders it as text, and the Content-Security-Policy allows no inline script,
//!   so a payload holding markup cannot run.

mod json;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use spool_proto::v1::{
    self, activity_service_server::ActivityService, admin_service_server::AdminService,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{
    Error,
    activity::ActivityApi,
    admin::AdminApi,
    auth::{Auth, Principal, Role},
};
use crate::dispatch::Core;

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// No inline script or style, no framing, nothing fetched from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// What the handlers share.
pub struct Ui {
    activity: ActivityApi,
    admin: AdminApi,
    auth: Auth,
    core: Arc<Core>,
    read_only: bool,
}

impl Ui {
    pub fn new(activity: ActivityApi, admin: AdminApi, auth: Auth, core: Arc<Core>) -> Self {
        let read_only = core.config.ui_read_only;
        Self {
            activity,
            admin,
            auth,
            core,
            read_only,
        }
    }
}

/// Serves the dashboard on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    ui: Ui,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/api/session", get(session))
        .route("/api/overview", get(overview))
        .route("/api/activities", get(activities))
        .route("/api/activity", get(activity))
        .route("/api/workers", get(workers))
        .route("/api/limits", get(limits))
        .route("/api/retry", post(retry))
        .route("/api/cancel", post(cancel))
        .route("/api/drain", post(drain))
        .route("/api/resume", post(resume))
        .fallback(|| async { failure(StatusCode::NOT_FOUND, "NOT_FOUND", "no such page") })
        .layer(axum::middleware::map_response(secure))
        .with_state(Arc::new(ui));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Headers every answer carries.
async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// An API error: the gRPC status's message, with an HTTP status of the same sense.
struct Failure {
    http: StatusCode,
    code: String,
    message: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.http,
            Json(serde_json::json!({ "error": self.message, "code": self.code })),
        )
            .into_response()
    }
}

fn failure(http: StatusCode, code: &str, message: &str) -> Failure {
    Failure {
        http,
        code: code.to_owned(),
        message: message.to_owned(),
    }
}

fn from_status(status: tonic::Status) -> Failure {
    use tonic::Code;
    let http = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let code = format!("{:?}", status.code());
    failure(http, &json::screaming(&code), status.message())
}

type Answer = Result<Response, Failure>;

/// The caller, from its `authorization: Bearer` header.
fn caller(ui: &Ui, headers: &HeaderMap) -> Result<Principal, Failure> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    ui.auth.principal(bearer).map_err(|e| from_status(e.into()))
}

/// A gRPC request carrying the caller, as the interceptor would have made it.
fn request<T>(principal: &Principal, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(principal.clone());
    request
}

/// Calls a gRPC service implementation as `principal`: the page can do exactly
/// what the token can, and a refusal comes back as the API's.
async fn call<T, R, F, Fut>(principal: &Principal, message: T, rpc: F) -> Result<R, Failure>
where
    F: FnOnce(tonic::Request<T>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    Ok(rpc(request(principal, message))
        .await
        .map_err(from_status)?
        .into_inner())
}

/// Refuses a change when the dashboard is read-only.
fn writable(ui: &Ui) -> Result<(), Failure> {
    if ui.read_only {
        return Err(from_status(
            Error::PermissionDenied(
                "this dashboard is read-only (--ui-read-only): use the CLI or the API to change anything"
                    .to_owned(),
            )
            .into(),
        ));
    }
    Ok(())
}

async fn session(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Answer {
    let principal = caller(&ui, &headers)?;
    let everywhere = principal.namespaces().is_none();
    Ok(Json(json::Session {
        version: env!("CARGO_PKG_VERSION"),
        role: principal.role().name(),
        namespaces: principal.namespaces(),
        can_write: !ui.read_only && principal.may(Role::Client),
        can_admin: !ui.read_only && everywhere && principal.may(Role::Admin),
        read_only: ui.read_only,
        auth_required: ui.auth.required(),
    })
    .into_response())
}

#[derive(Deserialize)]
struct NamespaceQuery {
    #[serde(default)]
    namespace: String,
}

async fn overview(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<NamespaceQuery>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    let namespace =
        crate::api::validate::namespace(&q.namespace).map_err(|e| from_status(e.into()))?;
    let stats = call(
        &principal,
        v1::StatsRequest {
            namespace: namespace.clone(),
        },
        |r| ui.activity.stats(r),
    )
    .await?;
    let counts = ui
        .core
        .store
        .type_counts(ui.core.store.now())
        .await
        .map_err(|e| from_status(Error::from(e).into()))?;
    let recent = crate::metrics::recent::completions(&namespace);
    Ok(Json(json::overview(&namespace, stats, counts, recent)).into_response())
}

#[derive(Deserialize)]
struct ActivitiesQuery {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    activity_type: String,
    #[serde(default)]
    workflow_id: String,
    #[serde(default)]
    activity_id: String,
    #[serde(default)]
    page_token: String,
    page_size: Option<u32>,
}

async fn activities(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<ActivitiesQuery>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    // A whole key is a lookup, not a search.
    if !q.workflow_id.is_empty() && !q.activity_id.is_empty() {
        let found = ui
            .activity
            .get(request(
                &principal,
                v1::GetRequest {
                    key: Some(key(&q.namespace, &q.workflow_id, &q.activity_id)),
                    include_history: false,
                },
            ))
            .await;
        let activities = match found {
            Ok(a) => vec![json::summary(a.into_inner())],
            Err(s) if s.code() == tonic::Code::NotFound => Vec::new(),
            Err(s) => return Err(from_status(s)),
        };
        return Ok(Json(json::Page {
            activities,
            next_page_token: String::new(),
        })
        .into_response());
    }
    let status = json::status_from_name(&q.status).map_err(|e| from_status(e.into()))?;
    let page = call(
        &principal,
        v1::ListRequest {
            namespace: q.namespace,
            status: status as i32,
            activity_type: q.activity_type,
            page_size: q.page_size.unwrap_or(50),
            page_token: q.page_token,
            newest_first: true,
        },
        |r| ui.activity.list(r),
    )
    .await?;
    // A workflow id alone narrows the page: List has no such filter.
    let activities = page
        .activities
        .into_iter()
        .filter(|a| {
            q.workflow_id.is_empty()
                || a.key
                    .as_ref()
                    .is_some_and(|k| k.workflow_id == q.workflow_id)
        })
        .map(json::summary)
        .collect();
    Ok(Json(json::Page {
        activities,
        next_page_token: page.next_page_token,
    })
    .into_response())
}

#[derive(Deserialize)]
struct KeyQuery {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    workflow_id: String,
    #[serde(default)]
    activity_id: String,
}

fn key(namespace: &str, workflow_id: &str, activity_id: &str) -> v1::ActivityKey {
    v1::ActivityKey {
        namespace: namespace.to_owned(),
        workflow_id: workflow_id.to_owned(),
        activity_id: activity_id.to_owned(),
    }
}

async fn activity(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<KeyQuery>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    let found = call(
        &principal,
        v1::GetRequest {
            key: Some(key(&q.namespace, &q.workflow_id, &q.activity_id)),
            include_history: true,
        },
        |r| ui.activity.get(r),
    )
    .await?;
    Ok(Json(json::detail(found)).into_response())
}

async fn workers(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<NamespaceQuery>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    let listed = call(
        &principal,
        v1::ListWorkersRequest {
            namespace: q.namespace,
        },
        |r| ui.admin.list_workers(r),
    )
    .await?;
    Ok(Json(json::workers(listed)).into_response())
}

/// The rate and concurrency limits of a namespace (every one the caller may read,
/// when empty), with their use now, and the fairness weights set in it.
async fn limits(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<NamespaceQuery>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    let rate = call(
        &principal,
        v1::ListRateLimitsRequest {
            namespace: q.namespace.clone(),
        },
        |r| ui.admin.list_rate_limits(r),
    )
    .await?;
    let concurrency = call(
        &principal,
        v1::ListConcurrencyLimitsRequest {
            namespace: q.namespace.clone(),
        },
        |r| ui.admin.list_concurrency_limits(r),
    )
    .await?;
    let fairness = call(
        &principal,
        v1::ListFairnessWeightsRequest {
            namespace: q.namespace,
        },
        |r| ui.admin.list_fairness_weights(r),
    )
    .await?;
    Ok(Json(json::limits(rate, concurrency, fairness)).into_response())
}

#[derive(Deserialize)]
struct Keys {
    namespace: String,
    keys: Vec<json::KeyIn>,
    #[serde(default)]
    reason: String,
}

/// The most keys one bulk action takes.
const MAX_BULK: usize = 1000;

async fn retry(State(ui): State<Arc<Ui>>, headers: HeaderMap, Json(body): Json<Keys>) -> Answer {
    bulk(&ui, &headers, body, |ui, principal, key, _| async move {
        ui.activity
            .retry(request(&principal, v1::RetryRequest { key: Some(key) }))
            .await
            .map(drop)
    })
    .await
}

async fn cancel(State(ui): State<Arc<Ui>>, headers: HeaderMap, Json(body): Json<Keys>) -> Answer {
    bulk(
        &ui,
        &headers,
        body,
        |ui, principal, key, reason| async move {
            ui.activity
                .cancel(request(
                    &principal,
                    v1::CancelRequest {
                        key: Some(key),
                        reason,
                    },
                ))
                .await
                .map(drop)
        },
    )
    .await
}

/// Runs one call per key, in order, and reports each.
async fn bulk<'u, F, Fut>(ui: &'u Ui, headers: &HeaderMap, body: Keys, call: F) -> Answer
where
    F: Fn(&'u Ui, Principal, v1::ActivityKey, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let principal = caller(ui, headers)?;
    writable(ui)?;
    if !principal.may(Role::Client) {
        return Err(from_status(
            Error::PermissionDenied(format!(
                "this token's role is {}: re-driving and cancelling need client or admin",
                principal.role().name()
            ))
            .into(),
        ));
    }
    if body.keys.len() > MAX_BULK {
        return Err(from_status(
            Error::InvalidArgument(format!(
                "{} keys in one request; send at most {MAX_BULK}",
                body.keys.len()
            ))
            .into(),
        ));
    }
    let mut results = Vec::with_capacity(body.keys.len());
    for k in body.keys {
        let done = call(
            ui,
            principal.clone(),
            key(&body.namespace, &k.workflow_id, &k.activity_id),
            body.reason.clone(),
        )
        .await;
        results.push(json::BulkResult {
            workflow_id: k.workflow_id,
            activity_id: k.activity_id,
            ok: done.is_ok(),
            error: done.err().map(|s| s.message().to_owned()),
        });
    }
    Ok(Json(serde_json::json!({ "results": results })).into_response())
}

#[derive(Deserialize)]
struct DrainBody {
    timeout_seconds: Option<f64>,
}

async fn drain(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Json(body): Json<DrainBody>,
) -> Answer {
    let principal = caller(&ui, &headers)?;
    writable(&ui)?;
    let timeout = body
        .timeout_seconds
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| {
            spool_proto::duration::to_proto(std::time::Duration::from_secs_f64(s.min(3600.0)))
        });
    let report = ui
        .admin
        .drain(request(&principal, v1::DrainRequest { timeout }))
        .await
        .map_err(from_status)?
        .into_inner();
    Ok(Json(serde_json::json!({
        "completed": report.completed,
        "released": report.released,
        "handed_over": report.handed_over,
        "ended_otherwise": report.ended_otherwise,
    }))
    .into_response())
}

async fn resume(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Answer {
    let principal = caller(&ui, &headers)?;
    writable(&ui)?;
    let resumed = ui
        .admin
        .resume(request(&principal, v1::ResumeRequest {}))
        .await
        .map_err(from_status)?
        .into_inner();
    Ok(Json(serde_json::json!({ "was_draining": resumed.was_draining })).into_response())
}
