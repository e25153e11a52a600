//! Tenants: who is calling. Authentication produces a [`Tenant`]; its id salts
//! every routing key so tenants never share placement.

use std::sync::Arc;

/// The authenticated caller. With authentication off, everyone is [`Tenant::anonymous`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: Arc<str>,
}

impl Tenant {
    pub fn anonymous() -> Self {
        Self {
            id: Arc::from("anonymous"),
        }
    }
}
