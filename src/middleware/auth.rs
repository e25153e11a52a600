//! Authentication: puts the caller's [`Tenant`] into request extensions.
//! Applied to every route except the open allow-list (`/health`, `/ready`, `/metrics`).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::tenancy::Tenant;

pub async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Tenant::anonymous());
    next.run(req).await
}
