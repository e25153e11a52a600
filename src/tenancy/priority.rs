//! Priority classes (`tenants.*.priority`, the queue's `priority_header`):
//! the gateway's queue releases every waiting request of a higher class first.

/// A priority class: released before every lower one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "high" => Some(Self::High),
            "normal" => Some(Self::Normal),
            "low" => Some(Self::Low),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }
}

/// The priority a request runs at: its tenant's (`own`), or what it asks for
/// with `header` — only when its tenant may (`may_ask`, the tenant's
/// `priority_header: true`), and never above its tenant's own (403).
pub fn asked(
    headers: &axum::http::HeaderMap,
    header: &axum::http::HeaderName,
    own: Priority,
    may_ask: bool,
) -> Result<Priority, crate::error::ApiError> {
    use crate::error::{ApiError, ErrorKind};
    let Some(value) = headers.get(header) else {
        return Ok(own);
    };
    if !may_ask {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            format!("this tenant may not set {header}"),
        )
        .with_param(header.as_str()));
    }
    let asked = value
        .to_str()
        .ok()
        .and_then(|v| Priority::parse(v.trim()))
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::InvalidRequest,
                format!("{header} must be high, normal or low"),
            )
            .with_param(header.as_str())
        })?;
    if asked > own {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            format!(
                "{header}: {} is above this tenant's priority, {}",
                asked.name(),
                own.name()
            ),
        )
        .with_param(header.as_str()));
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.name()), Some(p));
        }
        assert_eq!(Priority::parse("urgent"), None);
        assert!(Priority::High > Priority::Normal && Priority::Normal > Priority::Low);
    }
}
