//! What kvgate reads from a tokenizer_config.json: the chat template and the
//! special tokens a template may refer to.

use serde_json::Value as Json;

/// Special-token names transformers passes to every chat template.
pub(crate) const SPECIAL_NAMES: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

#[derive(Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub(crate) chat_template: Option<String>,
    /// `(name, token)` for each of [`SPECIAL_NAMES`] present.
    pub(crate) specials: Vec<(&'static str, String)>,
}

impl TokenizerConfig {
    /// Parses the file's bytes; errors say what is wrong, the caller names the file.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let json: Json = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let Json::Object(map) = &json else {
            return Err("not a JSON object".into());
        };
        let chat_template = match map.get("chat_template") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            // transformers' named templates: "default" is the one used
            // when the caller names none.
            Some(Json::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .map(|t| match t.get("template") {
                    Some(Json::String(s)) => Ok(s.clone()),
                    _ => Err("chat_template \"default\" has no string \"template\"".to_owned()),
                })
                .transpose()?,
            Some(_) => return Err("\"chat_template\" is neither a string nor a list".into()),
        };
        let mut specials = Vec::new();
        for name in SPECIAL_NAMES {
            match map.get(name) {
                None | Some(Json::Null) => {}
                Some(Json::String(s)) => specials.push((name, s.clone())),
                Some(v) => match v.get("content").and_then(Json::as_str) {
                    Some(s) => specials.push((name, s.to_owned())),
                    None => {
                        return Err(format!(
                            "\"{name}\" is neither a string nor {{\"content\": …}}"
                        ));
                    }
                },
            }
        }
        Ok(Self {
            chat_template,
            specials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_string_and_named_templates_and_token_forms() {
        let c = TokenizerConfig::parse(br#"{"chat_template": "x", "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}}"#)
            .unwrap_or_default();
        assert_eq!(c.chat_template.as_deref(), Some("x"));
        assert_eq!(
            c.specials,
            vec![("bos_token", "<s>".into()), ("eos_token", "</s>".into())]
        );
        let c = TokenizerConfig::parse(
            br#"{"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]}"#,
        )
        .unwrap_or_default();
        assert_eq!(c.chat_template.as_deref(), Some("d"));
        assert!(TokenizerConfig::parse(b"[]").is_err());
        assert!(TokenizerConfig::parse(br#"{"chat_template": 3}"#).is_err());
        assert!(TokenizerConfig::parse(br#"{"bos_token": 3}"#).is_err());
    }
}
