//! Who may see the console: the admin token (`admin.token`), presented as
//! `Authorization: Bearer …` or as the session cookie the login form sets
//! (HttpOnly, SameSite=Strict, Path=/console; its value is an HMAC derived
//! from the token, never the token). Off, as the admin routes are, while no
//! token is configured (403). The checks are
//! [`crate::tenancy::admin::authorize_console`]'s.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::fleet::AppState;

pub const COOKIE: &str = "kvgate_console";
/// A session lasts 12 hours; signing in again is one form.
const MAX_AGE_S: u64 = 12 * 3600;

pub fn check(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let rt = state.runtime.load();
    crate::tenancy::admin::authorize_console(rt.config.admin.as_ref(), headers, COOKIE)
}

/// The layer in front of the console's data routes.
pub async fn require(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match check(&state, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /console/login` with the form field `token`: the cookie and a
/// redirect to the console, or the form again with a 401.
pub async fn login(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let rt = state.runtime.load();
    let Some(admin) = rt.config.admin.as_ref() else {
        return crate::tenancy::admin::authorize(None, &HeaderMap::new())
            .err()
            .map(IntoResponse::into_response)
            .unwrap_or_else(|| StatusCode::FORBIDDEN.into_response());
    };
    let token = form_field(&body, "token").unwrap_or_default();
    if !admin.matches(&token) {
        return super::assets::login_page(StatusCode::UNAUTHORIZED, true);
    }
    let cookie = format!(
        "{COOKIE}={}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={MAX_AGE_S}",
        admin.session()
    );
    redirect_with(&cookie)
}

/// `POST /console/logout`: the cookie cleared.
pub async fn logout() -> Response {
    redirect_with(&format!(
        "{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0"
    ))
}

fn redirect_with(cookie: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static("/console"));
    if let Ok(v) = HeaderValue::from_str(cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    resp
}

/// One field of an `application/x-www-form-urlencoded` body, decoded.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)?
        .1;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_decode() {
        assert_eq!(
            form_field(b"a=1&token=ab%2B%2Fc%3D+d", "token").as_deref(),
            Some("ab+/c= d")
        );
        assert_eq!(form_field(b"token=%zz", "token"), None);
        assert_eq!(form_field(b"other=1", "token"), None);
    }
}
