//! OpenAI request bodies → the token ids a vLLM engine computes for them
//! (chat template, then tokenizer), so that kvgate can route on vLLM's
//! KV-cache events, which name cached blocks by their token ids.
//!
//! The hot path (every `kv_aware` request) renders the template, splits the
//! prompt at special tokens and looks each piece up in an LRU of piece → ids
//! (see `backend`), so a prompt whose system prompt was seen before costs
//! little more than a hash of it.

mod backend;
mod byte_level;
#[cfg(test)]
mod byte_level_tests;
mod cache;
mod config;
mod error;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod layout_tests;
mod load;
mod locate;
mod messages;
mod pyjson;
mod template;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::Value;
use serde_json::Value as Json;

use backend::{Backend, Model};
use config::TokenizerConfig;
pub use error::{LoadError, TokenizeError};
use load::{hf_model, read, tiktoken_encoding};
use locate::{Found, FoundTemplates};
use template::ChatTemplates;

/// A tokenizer with its chat template; `Send + Sync`, shared via `Arc`.
pub struct PromptTokenizer {
    name: String,
    backend: Backend,
    templates: ChatTemplates,
    /// bos_token, eos_token, … as the template sees them.
    specials: Vec<(&'static str, String)>,
    /// [`PromptTokenizer::requires_system_first`], probed once.
    system_first: std::sync::OnceLock<bool>,
}

/// Token ids of a prompt, at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tokens {
    pub ids: Vec<u32>,
    /// The prompt had more than `limit` tokens; `ids` holds the first `limit`.
    pub truncated: bool,
}

impl Tokens {
    fn truncate(mut ids: Vec<u32>, limit: usize) -> Self {
        let truncated = ids.len() > limit;
        ids.truncate(limit);
        Self { ids, truncated }
    }

    /// Appends `more` up to `limit`; true once truncated.
    fn push(&mut self, more: &[u32], limit: usize) -> bool {
        let room = limit.saturating_sub(self.ids.len());
        if more.len() > room {
            self.ids.extend_from_slice(&more[..room]);
            self.truncated = true;
        } else {
            self.ids.extend_from_slice(more);
        }
        self.truncated
    }
}

impl PromptTokenizer {
    /// `spec`: a path to a Hugging Face tokenizer.json, or "tiktoken:<encoding>".
    /// Chat template, as transformers finds it (see `locate`): the `chat_template`
    /// file (Jinja) when given; else, for a tokenizer.json, `chat_template.jinja`
    /// beside it; else the "chat_template" of tokenizer_config.json beside it (a
    /// string, or a list of {name, template}: "default", and "tool_use" for
    /// requests with tools); else none.
    /// bos_token / eos_token come from tokenizer_config.json (string or {"content": ..}).
    pub fn load(spec: &str, chat_template: Option<&Path>) -> Result<Self, LoadError> {
        let explicit = chat_template.map(FoundTemplates::explicit).transpose()?;
        if let Some(encoding) = spec.strip_prefix("tiktoken:") {
            let model = Model::Tiktoken(tiktoken_encoding(encoding)?);
            return Self::build(spec, model, explicit.unwrap_or_default(), Vec::new());
        }
        let path = Path::new(spec);
        let model = hf_model(&read(path)?, spec)?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = if config_path.is_file() {
            let shown = config_path.display().to_string();
            TokenizerConfig::parse(&read(&config_path)?).map_err(|message| LoadError::Config {
                path: shown.clone(),
                message,
            })?
        } else {
            TokenizerConfig::default()
        };
        let templates = match explicit {
            Some(t) => t,
            None => FoundTemplates::beside(
                path,
                config.chat_template,
                &config_path.display().to_string(),
            )?,
        };
        Self::build(spec, model, templates, config.specials)
    }

    /// The same from bytes already in memory (tokenizer.json, optional tokenizer_config.json).
    pub fn from_json(
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
    ) -> Result<Self, LoadError> {
        const NAME: &str = "tokenizer.json (in memory)";
        const CONFIG: &str = "tokenizer_config.json (in memory)";
        let model = hf_model(tokenizer_json, NAME)?;
        let config = tokenizer_config_json
            .map(TokenizerConfig::parse)
            .transpose()
            .map_err(|message| LoadError::Config {
                path: CONFIG.into(),
                message,
            })?
            .unwrap_or_default();
        let templates = FoundTemplates::from_config(config.chat_template, CONFIG);
        Self::build(NAME, model, templates, config.specials)
    }

    /// A tiktoken encoding with a given Jinja chat template (None = no template).
    pub fn tiktoken(encoding: &str, chat_template: Option<String>) -> Result<Self, LoadError> {
        let name = format!("tiktoken:{encoding}");
        let model = Model::Tiktoken(tiktoken_encoding(encoding)?);
        let templates = FoundTemplates {
            default: chat_template.map(|text| Found {
                text,
                source: "chat template (in memory)".to_owned(),
            }),
            tool_use: None,
        };
        Self::build(&name, model, templates, Vec::new())
    }

    fn build(
        name: &str,
        model: Model,
        templates: FoundTemplates,
        specials: Vec<(&'static str, String)>,
    ) -> Result<Self, LoadError> {
        Ok(Self {
            name: name.to_owned(),
            backend: Backend::new(model),
            templates: ChatTemplates::compile(templates)?,
            specials,
            system_first: std::sync::OnceLock::new(),
        })
    }

    pub fn has_chat_template(&self) -> bool {
        !self.templates.is_empty()
    }

    /// Where the chat template came from (a file path; for tokenizer_config.json's
    /// list, the path and the entry's name), for `kvgate check` and logs.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.templates.default_source()
    }

    /// Where the template for requests with tools came from, when the model has
    /// one of its own ("tool_use").
    pub fn tool_use_template_source(&self) -> Option<&str> {
        self.templates.tool_use_source()
    }

    /// What `tokenizer:` said, for logs ("tiktoken:o200k_base", a path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Chat completions: render `body["messages"]` (and `body["tools"]` when present)
    /// with add_generation_prompt = true, as vLLM does, with the "tool_use" template
    /// when there are tools and the model has one, then tokenize WITHOUT adding
    /// special tokens (the template carries them). Content given as an array of parts
    /// is flattened to its text parts joined with "\n" (vLLM's "string" content format);
    /// non-text parts are skipped. Stops once `limit` ids are produced.
    pub fn chat(&self, body: &Json, limit: usize) -> Result<Tokens, TokenizeError> {
        let prompt = self.render_chat(body)?;
        self.backend
            .encode(&prompt, false, limit)
            .map_err(TokenizeError::BadPrompt)
    }

    /// Completions: `prompt` a string (tokenized WITH the tokenizer's special tokens
    /// added, as vLLM's completions endpoint does, e.g. a BOS), or an array of token ids
    /// (used as is), or an array whose first element is one of those.
    pub fn completion(&self, prompt: &Json, limit: usize) -> Result<Tokens, TokenizeError> {
        let bad = |m: &str| TokenizeError::BadPrompt(m.to_owned());
        match prompt {
            Json::String(text) => self
                .backend
                .encode(text, true, limit)
                .map_err(TokenizeError::BadPrompt),
            Json::Array(items) => match items.first() {
                None => Err(bad("empty prompt array")),
                Some(Json::Number(_)) => token_ids(items, limit),
                Some(first @ Json::String(_)) => self.completion(first, limit),
                Some(Json::Array(ids)) => token_ids(ids, limit),
                Some(_) => Err(bad("prompt array holds neither strings nor token ids")),
            },
            _ => Err(bad("\"prompt\" is neither a string nor an array")),
        }
    }

    /// The rendered chat prompt (for tests and `explain`).
    pub fn render_chat(&self, body: &Json) -> Result<String, TokenizeError> {
        let has_tools = body.get("tools").is_some_and(|t| !t.is_null());
        let template = self
            .templates
            .pick(has_tools)
            .ok_or(TokenizeError::NoChatTemplate)?;
        if !body.is_object() {
            return Err(TokenizeError::BadMessages(
                "the body is not a JSON object".into(),
            ));
        }
        // transformers: special tokens first, then the call's own arguments.
        let mut context: BTreeMap<String, Value> = self
            .specials
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str())))
            .collect();
        context.insert("messages".into(), messages::conversation(body)?);
        let tools = match body.get("tools") {
            None | Some(Json::Null) => Value::from(()),
            Some(Json::Array(tools)) => messages::tools(tools)?,
            Some(_) => {
                return Err(TokenizeError::BadMessages(
                    "\"tools\" is not an array".into(),
                ));
            }
        };
        context.insert("tools".into(), tools);
        context.insert("documents".into(), Value::from(()));
        let generation = body
            .get("add_generation_prompt")
            .and_then(Json::as_bool)
            .unwrap_or(true);
        context.insert("add_generation_prompt".into(), Value::from(generation));
        match body.get("chat_template_kwargs") {
            None | Some(Json::Null) => {}
            // vLLM lets these override its own arguments (add_generation_prompt, …).
            Some(Json::Object(extra)) => {
                for (k, v) in extra.iter().filter(|(k, _)| k.as_str() != "messages") {
                    context.insert(k.clone(), messages::to_value(v));
                }
            }
            Some(_) => {
                return Err(TokenizeError::BadMessages(
                    "\"chat_template_kwargs\" is not an object".into(),
                ));
            }
        }
        template.render(Value::from_pairs(context))
    }

    /// Whether the chat template refuses a system message after the first
    /// turn (Qwen's `loop.first` guard), probed as vLLM's Messages endpoint
    /// probes it (`_detect_merge_inline_system`): render system, user, system,
    /// user with the default and the tool-use template; either failing, or no
    /// template at all, means inline system messages are merged into the
    /// leading one. Probed once, on first use.
    pub fn requires_system_first(&self) -> bool {
        *self.system_first.get_or_init(|| {
            let probe = serde_json::json!([
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
            ]);
            let plain = serde_json::json!({"messages": probe, "add_generation_prompt": false});
            let tools =
                serde_json::json!({"messages": probe, "tools": [], "add_generation_prompt": false});
            self.render_chat(&plain).is_err() || self.render_chat(&tools).is_err()
        })
    }

    /// Plain encode. (A tokenizer error, which byte-level BPE does not raise,
    /// gives no ids.)
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        self.backend
            .encode(text, add_special_tokens, usize::MAX)
            .map(|t| t.ids)
            .unwrap_or_default()
    }

    /// Forgets every cached segment (benchmarks measure a cold prompt with it).
    pub fn clear_cache(&self) {
        self.backend.clear_cache();
    }
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("name", &self.name)
            .field("chat_template", &self.templates.default_source())
            .field("tool_use_template", &self.templates.tool_use_source())
            .field("segment_cache", &self.backend.segmented())
            .field("cached_segments", &self.backend.cached_segments())
            .finish()
    }
}

fn token_ids(items: &[Json], limit: usize) -> Result<Tokens, TokenizeError> {
    let ids = items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| TokenizeError::BadPrompt("token ids must be integers in 0..2^32".into()))?;
    Ok(Tokens::truncate(ids, limit))
}
