//! What kvgate reads from a tokenizer_config.json: the chat templates and the
//! special tokens a template may refer to.

use serde_json::Value as Json;

/// Special-token names transformers passes to every chat template.
pub(crate) const SPECIAL_NAMES: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// The file's `"chat_template"`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) enum ConfigTemplate {
    #[default]
    None,
    /// A string: the one template.
    One(String),
    /// transformers' list of `{name, template}`: the two names it picks from
    /// on its own ("default", and "tool_use" for a request with tools).
    Named {
        default: Option<String>,
        tool_use: Option<String>,
    },
}

#[derive(Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub(crate) chat_template: ConfigTemplate,
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
            None | Some(Json::Null) => ConfigTemplate::None,
            Some(Json::String(s)) => ConfigTemplate::One(s.clone()),
            Some(Json::Array(named)) => ConfigTemplate::Named {
                default: named_template(named, "default")?,
                tool_use: named_template(named, "tool_use")?,
            },
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

/// The template of the list entry called `name`, if there is one.
fn named_template(list: &[Json], name: &str) -> Result<Option<String>, String> {
    list.iter()
        .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
        .map(|t| match t.get("template") {
            Some(Json::String(s)) => Ok(s.clone()),
            _ => Err(format!("chat_template {name:?} has no string \"template\"")),
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_string_and_named_templates_and_token_forms() {
        let c = TokenizerConfig::parse(br#"{"chat_template": "x", "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}}"#)
            .unwrap_or_default();
        assert_eq!(c.chat_template, ConfigTemplate::One("x".into()));
        assert_eq!(
            c.specials,
            vec![("bos_token", "<s>".into()), ("eos_token", "</s>".into())]
        );
        let c = TokenizerConfig::parse(
            br#"{"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]}"#,
        )
        .unwrap_or_default();
        assert_eq!(
            c.chat_template,
            ConfigTemplate::Named {
                default: Some("d".into()),
                tool_use: Some("t".into())
            }
        );
        let c = TokenizerConfig::parse(br#"{"chat_template": [{"name": "rag", "template": "r"}]}"#)
            .unwrap_or_default();
        assert_eq!(
            c.chat_template,
            ConfigTemplate::Named {
                default: None,
                tool_use: None
            }
        );
        assert!(
            TokenizerConfig::parse(br#"{"chat_template": [{"name": "tool_use", "template": 1}]}"#)
                .is_err()
        );
        assert!(TokenizerConfig::parse(b"[]").is_err());
        assert!(TokenizerConfig::parse(br#"{"chat_template": 3}"#).is_err());
        assert!(TokenizerConfig::parse(br#"{"bos_token": 3}"#).is_err());
    }
}
