//! Where a tokenizer's chat templates come from, in the order transformers
//! (and so vLLM) looks for them, each named by its source for `kvgate check`:
//!
//! 1. a template file given explicitly (vLLM's `--chat-template`, kvgate's
//!    `routing.chat_template`) — the one template, tools or not;
//! 2. `chat_template.jinja` (and `additional_chat_templates/tool_use.jinja`)
//!    beside tokenizer.json, where transformers saves templates today; when
//!    either exists, tokenizer_config.json's template is not read at all;
//! 3. tokenizer_config.json's `"chat_template"`: a string, or a list of
//!    `{name, template}` of which "default" and "tool_use" are used.

use std::path::Path;

use crate::LoadError;
use crate::config::ConfigTemplate;
use crate::load::{read, utf8};

/// transformers' `CHAT_TEMPLATE_FILE`, beside tokenizer.json.
pub(crate) const JINJA_FILE: &str = "chat_template.jinja";
/// transformers' `CHAT_TEMPLATE_DIR`: one `<name>.jinja` a named template.
const NAMED_DIR: &str = "additional_chat_templates";

/// A template's text and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) text: String,
    /// A path, followed by the list entry's name for tokenizer_config.json's list.
    pub(crate) source: String,
}

/// The templates a chat request may be rendered with.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FoundTemplates {
    pub(crate) default: Option<Found>,
    /// What transformers renders a request that has tools with, when present.
    pub(crate) tool_use: Option<Found>,
}

impl FoundTemplates {
    /// An explicit template file: it alone, as vLLM uses `--chat-template`.
    pub(crate) fn explicit(path: &Path) -> Result<Self, LoadError> {
        Ok(Self {
            default: Some(Found {
                text: utf8(path, read(path)?)?,
                source: path.display().to_string(),
            }),
            tool_use: None,
        })
    }

    /// The templates of the tokenizer.json at `tokenizer`: its Jinja files if
    /// there are any, else `config` (read from `config_source`).
    pub(crate) fn beside(
        tokenizer: &Path,
        config: ConfigTemplate,
        config_source: &str,
    ) -> Result<Self, LoadError> {
        let default = optional_file(&tokenizer.with_file_name(JINJA_FILE))?;
        let tool_use = optional_file(&tokenizer.with_file_name(NAMED_DIR).join("tool_use.jinja"))?;
        if default.is_some() || tool_use.is_some() {
            return Ok(Self { default, tool_use });
        }
        Ok(Self::from_config(config, config_source))
    }

    /// tokenizer_config.json's template(s), read from `source`.
    pub(crate) fn from_config(config: ConfigTemplate, source: &str) -> Self {
        let entry = |name: &str, text: Option<String>| {
            text.map(|text| Found {
                text,
                source: format!("{source} (chat_template {name:?})"),
            })
        };
        match config {
            ConfigTemplate::None => Self::default(),
            ConfigTemplate::One(text) => Self {
                default: Some(Found {
                    text,
                    source: source.to_owned(),
                }),
                tool_use: None,
            },
            ConfigTemplate::Named { default, tool_use } => Self {
                default: entry("default", default),
                tool_use: entry("tool_use", tool_use),
            },
        }
    }
}

/// The file's text, or None when there is no such file.
fn optional_file(path: &Path) -> Result<Option<Found>, LoadError> {
    let bytes = match read(path) {
        Ok(bytes) => bytes,
        Err(LoadError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(Some(Found {
        text: utf8(path, bytes)?,
        source: path.display().to_string(),
    }))
}
