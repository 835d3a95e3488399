//! Who is asking, and how a refusal is answered: the [`Caller`] extractor
//! is the one place a request's `Authorization` header is read (the API,
//! the page and `/metrics` all take it), and [`ApiError`] is every JSON
//! error (`{"error": "..."}`). Deciding what a token may do is `auth`'s job;
//! this module only turns its answers into HTTP.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use crate::auth::{self, AuthError, Verb};
use crate::config::Token;

/// An error answer: a status and the message for `{"error": ...}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    /// The state database failed: 503, so a client retries later.
    pub fn unavailable(e: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        let status = match e {
            AuthError::Unauthorized => StatusCode::UNAUTHORIZED,
            AuthError::Forbidden { .. } => StatusCode::FORBIDDEN,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
        };
        (self.status, axum::Json(body)).into_response()
    }
}

/// The token a request presents (`Bearer <token>`, or HTTP Basic with the
/// token as the password so a browser can ask for it). Extracting it
/// answers 401 when there is none or it is unknown; what it may do is
/// asked of [`Caller::require`] and [`Caller::may`].
#[derive(Debug, Clone)]
pub struct Caller(Token);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Caller, ApiError> {
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let settings = s.app.settings();
        let token = auth::authenticate(&settings.tokens, presented)?;
        // A browser resends HTTP Basic credentials by itself, so a page on
        // another site could make it POST to the API: the API changes
        // nothing for Basic credentials (the page's own forms carry a CSRF
        // token instead).
        let basic = presented.is_some_and(|p| {
            p.get(..6)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("basic "))
        });
        if basic && !parts.method.is_safe() && parts.uri.path().starts_with("/api/") {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "the API changes nothing for HTTP Basic credentials (a browser sends them by \
                 itself); send the token as `Authorization: Bearer <token>`",
            ));
        }
        Ok(Caller(token.clone()))
    }
}

impl Caller {
    /// The token's name from the config, for logs and `paused_by`.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// May this token do `verb` on `target`?
    pub fn may(&self, verb: Verb, target: &str) -> bool {
        auth::allows(&self.0, verb, target)
    }

    /// 403 unless this token may do `verb` on `target`.
    pub fn require(&self, verb: Verb, target: &str) -> Result<(), ApiError> {
        Ok(auth::require(&self.0, verb, target)?)
    }

    /// Does this token read any target at all (the page and `/metrics`)?
    pub fn reads_anything(&self) -> bool {
        auth::reads_anything(&self.0)
    }
}

/// `Query<T>` whose refusal is JSON naming the parameter at fault
/// (`query parameter `limit`: invalid digit found in string`, `duplicate
/// field `limit``), never axum's plain-text 400.
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<ApiQuery<T>, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| {
                let at = e.path().to_string();
                let inner = e.into_inner();
                if at == "." {
                    ApiError::bad_request(format!("query string: {inner}"))
                } else {
                    ApiError::bad_request(format!("query parameter `{at}`: {inner}"))
                }
            })
    }
}

/// A query's `limit`: `default` when absent, else within `1..=max`;
/// anything outside is refused, naming the parameter (not clamped).
pub fn limit(given: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    match given {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "query parameter `limit`: must be from 1 to {max}, not {n}"
        ))),
    }
}

/// `Path<T>` whose refusal is JSON saying which part of the path is not
/// what the endpoint takes (`/api/v1/runs/abc`: "`abc` in the path is not
/// a whole number"), never axum's plain-text 400.
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> Result<ApiPath<T>, ApiError> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        match axum::extract::Path::<T>::from_request_parts(parts, s).await {
            Ok(axum::extract::Path(t)) => Ok(ApiPath(t)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                let message = match e.kind() {
                    ErrorKind::ParseError {
                        value,
                        expected_type,
                    }
                    | ErrorKind::ParseErrorAtIndex {
                        value,
                        expected_type,
                        ..
                    }
                    | ErrorKind::ParseErrorAtKey {
                        value,
                        expected_type,
                        ..
                    } => {
                        let what =
                            if expected_type.starts_with('i') || expected_type.starts_with('u') {
                                "a whole number"
                            } else {
                                expected_type
                            };
                        format!("`{value}` in the path is not {what}")
                    }
                    _ => format!("the path: {}", e.body_text()),
                };
                Err(ApiError::bad_request(message))
            }
            Err(other) => Err(ApiError::new(other.status(), other.body_text())),
        }
    }
}
