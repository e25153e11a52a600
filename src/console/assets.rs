//! The console's files, embedded at build time (`include_str!`): one HTML
//! page, one stylesheet, one script, and the login form. No CDN, no build
//! step, nothing fetched from another origin; the Content-Security-Policy
//! every console response carries forbids inline script and other origins.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");
const LOGIN: &str = include_str!("assets/login.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// Scripts and styles from files of this origin only; no inline script,
/// no frames, no plugins, forms post here only.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The security headers on every console response.
pub async fn secure(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

pub fn index() -> Response {
    html(StatusCode::OK, INDEX.to_owned())
}

/// The login form; `wrong` adds the line saying the token was refused.
pub fn login_page(status: StatusCode, wrong: bool) -> Response {
    let note = if wrong {
        r#"<p class="error" role="alert">That is not the admin token.</p>"#
    } else {
        ""
    };
    html(status, LOGIN.replace("<!--NOTE-->", note))
}

/// `GET /console/assets/{file}`.
pub async fn file(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
