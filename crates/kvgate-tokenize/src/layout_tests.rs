//! Where the chat template comes from, for each Hugging Face model-folder
//! layout, built in a temp dir from the SmolLM2 fixture: `chat_template.jinja`
//! (how transformers saves models today), tokenizer_config.json's list of named
//! templates, its string, and none.

use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use super::*;
use crate::tests::FIXTURE;

const TOOLS_TEMPLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools_template.jinja");

/// The fixture's tokenizer_config.json, parsed.
fn fixture_config() -> serde_json::Map<String, Json> {
    let bytes = std::fs::read(Path::new(FIXTURE).with_file_name("tokenizer_config.json")).unwrap();
    match serde_json::from_slice(&bytes).unwrap() {
        Json::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// SmolLM2-135M-Instruct's own chat template (the string in the fixture's config).
fn smollm2_template() -> String {
    fixture_config()["chat_template"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A model folder in a fresh temp dir, removed on drop.
struct Folder(PathBuf);

impl Folder {
    /// The fixture's tokenizer.json; its tokenizer_config.json with `chat_template`
    /// set to `template` (removed for None); and `files` (relative path, text).
    fn new(name: &str, template: Option<Json>, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kvgate-tokenize-layout-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(FIXTURE, dir.join("tokenizer.json")).unwrap();
        let mut config = fixture_config();
        match template {
            Some(t) => config.insert("chat_template".into(), t),
            None => config.remove("chat_template"),
        };
        let config = serde_json::to_vec_pretty(&Json::Object(config)).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Self(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).display().to_string()
    }

    fn load(&self) -> Result<PromptTokenizer, LoadError> {
        PromptTokenizer::load(&self.path("tokenizer.json"), None)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Conversations the template treats differently: its default system prompt,
/// the caller's own, several turns.
fn conversations() -> Vec<Json> {
    vec![
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "What is 12 × 7?"},
            {"role": "assistant", "content": "84"},
            {"role": "user", "content": "And 13 × 7?"}
        ]}),
    ]
}

fn ids(t: &PromptTokenizer, body: &Json) -> Vec<u32> {
    t.chat(body, usize::MAX).unwrap().ids
}

fn tools_body() -> Json {
    json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    })
}

#[test]
fn string_form_in_the_config_is_read_and_named() {
    let folder = Folder::new("string", Some(json!(smollm2_template())), &[]);
    let t = folder.load().unwrap();
    assert_eq!(
        t.chat_template_source(),
        Some(folder.path("tokenizer_config.json").as_str())
    );
    assert_eq!(t.tool_use_template_source(), None);
    // Tools or not, the one template.
    assert!(
        t.render_chat(&tools_body())
            .unwrap()
            .starts_with("<|im_start|>system\nYou are a helpful AI")
    );
}

#[test]
fn chat_template_jinja_beside_tokenizer_json_is_read_and_named() {
    let string = Folder::new("jinja-reference", Some(json!(smollm2_template())), &[]);
    let string = string.load().unwrap();
    // transformers' layout: the template in its own file, none in the config.
    let folder = Folder::new(
        "jinja",
        None,
        &[("chat_template.jinja", &smollm2_template())],
    );
    let t = folder.load().unwrap();
    assert!(t.has_chat_template());
    assert_eq!(
        t.chat_template_source(),
        Some(folder.path("chat_template.jinja").as_str())
    );
    for body in conversations() {
        assert_eq!(
            t.render_chat(&body).unwrap(),
            string.render_chat(&body).unwrap()
        );
        assert_eq!(ids(&t, &body), ids(&string, &body), "{body}");
    }
    assert_eq!(
        ids(&t, &conversations()[0])[0],
        1,
        "<|im_start|> is one special id"
    );
}

#[test]
fn the_jinja_file_wins_over_the_config_and_an_explicit_file_over_both() {
    let folder = Folder::new(
        "precedence",
        Some(json!("config {{ messages[0].content }}")),
        &[
            ("chat_template.jinja", "jinja {{ messages[0].content }}"),
            ("explicit.jinja", "explicit {{ messages[0].content }}"),
        ],
    );
    let body = json!({"messages": [{"role": "user", "content": "x"}]});
    assert_eq!(
        folder.load().unwrap().render_chat(&body).unwrap(),
        "jinja x"
    );
    let explicit = folder.path("explicit.jinja");
    let t =
        PromptTokenizer::load(&folder.path("tokenizer.json"), Some(Path::new(&explicit))).unwrap();
    assert_eq!(t.render_chat(&body).unwrap(), "explicit x");
    assert_eq!(t.chat_template_source(), Some(explicit.as_str()));
}

#[test]
fn list_form_takes_default_and_tool_use_for_requests_with_tools() {
    let tools_template = std::fs::read_to_string(TOOLS_TEMPLATE).unwrap();
    let folder = Folder::new(
        "list",
        Some(json!([
            {"name": "tool_use", "template": tools_template},
            {"name": "default", "template": smollm2_template()}
        ])),
        &[],
    );
    let t = folder.load().unwrap();
    let config = folder.path("tokenizer_config.json");
    assert_eq!(
        t.chat_template_source(),
        Some(format!("{config} (chat_template \"default\")").as_str())
    );
    assert_eq!(
        t.tool_use_template_source(),
        Some(format!("{config} (chat_template \"tool_use\")").as_str())
    );
    let string = PromptTokenizer::load(FIXTURE, None).unwrap();
    for body in conversations() {
        assert_eq!(ids(&t, &body), ids(&string, &body), "{body}");
    }
    // With tools, transformers (so vLLM) renders "tool_use".
    let tools = PromptTokenizer::load(FIXTURE, Some(Path::new(TOOLS_TEMPLATE))).unwrap();
    let with_tools = tools_body();
    assert!(t.render_chat(&with_tools).unwrap().contains("# Tools"));
    assert_eq!(ids(&t, &with_tools), ids(&tools, &with_tools));
    // Its test is `tools is not None`: an empty list counts, null does not.
    let mut empty = conversations()[0].clone();
    empty["tools"] = json!([]);
    assert_eq!(ids(&t, &empty), ids(&tools, &empty));
    empty["tools"] = Json::Null;
    assert_eq!(ids(&t, &empty), ids(&string, &empty));
}

#[test]
fn named_jinja_files_replace_the_config_list() {
    let folder = Folder::new(
        "named-files",
        Some(json!([{"name": "default", "template": "config"}])),
        &[
            ("chat_template.jinja", "default"),
            ("additional_chat_templates/tool_use.jinja", "tools"),
        ],
    );
    let t = folder.load().unwrap();
    assert_eq!(
        t.tool_use_template_source(),
        Some(
            folder
                .path("additional_chat_templates/tool_use.jinja")
                .as_str()
        )
    );
    let plain = json!({"messages": []});
    assert_eq!(t.render_chat(&plain).unwrap(), "default");
    assert_eq!(
        t.render_chat(&json!({"messages": [], "tools": []}))
            .unwrap(),
        "tools"
    );
}

#[test]
fn no_template_anywhere_is_none() {
    let folder = Folder::new("none", None, &[]);
    let t = folder.load().unwrap();
    assert!(!t.has_chat_template());
    assert_eq!(t.chat_template_source(), None);
    assert!(matches!(
        t.chat(&conversations()[0], 10),
        Err(TokenizeError::NoChatTemplate)
    ));
    // A list without "default" serves only requests with tools (transformers
    // raises for the rest).
    let folder = Folder::new(
        "tool-use-only",
        Some(json!([{"name": "tool_use", "template": "tools"}])),
        &[],
    );
    let t = folder.load().unwrap();
    assert_eq!(t.chat_template_source(), None);
    assert!(t.has_chat_template());
    assert!(matches!(
        t.chat(&json!({"messages": []}), 10),
        Err(TokenizeError::NoChatTemplate)
    ));
    assert_eq!(
        t.render_chat(&json!({"messages": [], "tools": []}))
            .unwrap(),
        "tools"
    );
}

#[test]
fn a_bad_jinja_file_is_a_load_error_naming_it() {
    let folder = Folder::new("bad", None, &[("chat_template.jinja", "{% for %}")]);
    let err = folder.load().unwrap_err().to_string();
    assert!(err.contains(&folder.path("chat_template.jinja")), "{err}");
    let folder = Folder::new("bad-utf8", None, &[]);
    std::fs::write(folder.0.join("chat_template.jinja"), [0xff, 0xfe]).unwrap();
    let err = folder.load().unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja"), "{err}");
}
