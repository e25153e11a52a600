//! Reading tokenizer files and naming tiktoken encodings, with errors that
//! name the file.

use std::path::Path;

use crate::LoadError;
use crate::backend::Model;

pub(crate) fn tiktoken_encoding(name: &str) -> Result<&'static tiktoken_rs::CoreBPE, LoadError> {
    Ok(match name {
        "o200k_harmony" => tiktoken_rs::o200k_harmony_singleton(),
        "o200k_base" => tiktoken_rs::o200k_base_singleton(),
        "cl100k_base" => tiktoken_rs::cl100k_base_singleton(),
        "p50k_base" => tiktoken_rs::p50k_base_singleton(),
        "p50k_edit" => tiktoken_rs::p50k_edit_singleton(),
        "r50k_base" => tiktoken_rs::r50k_base_singleton(),
        _ => return Err(LoadError::UnknownEncoding(name.to_owned())),
    })
}

pub(crate) fn hf_model(bytes: &[u8], path: &str) -> Result<Model, LoadError> {
    let err = |e: &dyn std::fmt::Display| LoadError::Tokenizer {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let mut tok = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| err(&e))?;
    // transformers ignores the file's truncation and padding unless a call
    // asks for them, and vLLM asks for neither on prompts.
    tok.with_truncation(None).map_err(|e| err(&e))?;
    tok.with_padding(None);
    Ok(Model::Hf(Box::new(tok)))
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn utf8(path: &Path, bytes: Vec<u8>) -> Result<String, LoadError> {
    String::from_utf8(bytes).map_err(|e| LoadError::Template {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
