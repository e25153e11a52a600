//! Admission, after the body is parsed and keyed: the tenant's model
//! allow-list (403) and quotas (429), the upstream cache salt, and the
//! admission ticket the response body holds until it ends (which frees the
//! concurrency slot and settles the tokens). The work is in
//! [`crate::tenancy::Tenancy::admit`].

use std::sync::Arc;

use super::{Admitted, Analysed};
use crate::error::ApiError;
use crate::fleet::Runtime;
use crate::tenancy::Ask;

pub async fn admit(runtime: &Runtime, analysed: Analysed) -> Result<Admitted, ApiError> {
    let Analysed {
        tenant,
        held,
        parts,
        mut input,
        upload,
    } = analysed;
    let ask = Ask {
        api: input.api,
        model: input.model.as_deref(),
        endpoint_models: &input.endpoint.config.models,
        body: &input.body,
        has_cache_salt: input.has_cache_salt,
        is_object: input.is_object,
    };
    let admitted = runtime.tenancy.admit(&tenant, ask, Some(held)).await?;
    if let Some(body) = admitted.body {
        input.body = body;
    }
    input.admission = Some(Arc::new(admitted.admission));
    Ok(Admitted {
        tenant,
        parts,
        input,
        upload,
        rate_headers: admitted.headers,
    })
}
