//! The crate's two error types: loading a tokenizer, and tokenizing a request.

/// A tokenizer, its config or its chat template could not be loaded. Messages
/// name the file (or the in-memory source) at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a usable tokenizer.json: {message}")]
    Tokenizer { path: String, message: String },
    #[error("{path}: not a usable tokenizer_config.json: {message}")]
    Config { path: String, message: String },
    #[error(
        "unknown tiktoken encoding {0:?} (known: o200k_harmony, o200k_base, cl100k_base, p50k_base, p50k_edit, r50k_base)"
    )]
    UnknownEncoding(String),
    #[error("{path}: bad chat template: {message}")]
    Template { path: String, message: String },
}

/// A request body could not be turned into token ids. Bodies come from
/// clients, so every malformed input ends here, never in a panic.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("the tokenizer has no chat template")]
    NoChatTemplate,
    #[error("bad messages: {0}")]
    BadMessages(String),
    #[error("chat template failed: {0}")]
    Template(String),
    #[error("bad prompt: {0}")]
    BadPrompt(String),
}
