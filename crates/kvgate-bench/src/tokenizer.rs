//! The one real tokenizer of `kv_aware` runs: SmolLM2's (`fixtures/smollm2`),
//! loaded once a process and shared by every instance of every run; the
//! gateway is given its path and loads its own copy.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kvgate_tokenize::PromptTokenizer;

/// `fixtures/smollm2/tokenizer.json` of the workspace (absolute), with the
/// chat template in the `tokenizer_config.json` beside it.
pub fn path() -> PathBuf {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    root.canonicalize()
        .unwrap_or(root)
        .join("fixtures/smollm2/tokenizer.json")
}

/// The path as the gateway's YAML names it.
pub fn path_str() -> String {
    path().display().to_string()
}

/// The shared tokenizer, loaded on first use.
pub fn shared() -> anyhow::Result<Arc<PromptTokenizer>> {
    static TOKENIZER: OnceLock<Result<Arc<PromptTokenizer>, String>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            PromptTokenizer::load(&path_str(), None)
                .map(Arc::new)
                .map_err(|e| format!("loading {}: {e}", path().display()))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}
