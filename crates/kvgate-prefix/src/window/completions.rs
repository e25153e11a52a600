//! The window of an OpenAI (legacy) completions body: its `prompt`.
//!
//! `prompt` may be a string, an array of strings (a batch), an array of token
//! ids, or an array of token-id arrays. Batches are joined with `'\n'`; token ids
//! are written in decimal separated by `','`. A text prompt spelling out the same
//! characters shares the window; that only co-locates two requests, it never
//! splits one prompt's traffic.

use serde_json::Value;

use super::ShapeError;
use super::budget::CharBudget;

/// The first `max_chars` characters of the body's `prompt`, as described above.
/// The whole `prompt` is validated whatever `max_chars` is.
pub fn completions_window(body: &Value, max_chars: usize) -> Result<String, ShapeError> {
    let mut window = CharBudget::new(max_chars);
    match body.get("prompt") {
        Some(Value::String(text)) => window.push_raw(text),
        Some(Value::Array(items)) => push_batch(&mut window, items)?,
        Some(_) => {
            return Err(ShapeError::new(
                "prompt",
                "expected a string, an array of strings, an array of token ids, \
                 or an array of token-id arrays",
            ));
        }
        None => return Err(ShapeError::new("prompt", "missing required parameter")),
    }
    Ok(window.into_string())
}

fn push_batch(window: &mut CharBudget, items: &[Value]) -> Result<(), ShapeError> {
    // The first element decides which of the three array forms this is.
    match items.first() {
        None => Ok(()),
        Some(Value::Number(_)) => push_tokens(window, items, "prompt"),
        Some(Value::String(_)) => {
            for (i, item) in items.iter().enumerate() {
                let Value::String(text) = item else {
                    return Err(ShapeError::new(format!("prompt[{i}]"), "expected a string"));
                };
                if i > 0 {
                    window.push('\n');
                }
                window.push_raw(text);
            }
            Ok(())
        }
        Some(Value::Array(_)) => {
            for (i, item) in items.iter().enumerate() {
                let Value::Array(tokens) = item else {
                    return Err(ShapeError::new(
                        format!("prompt[{i}]"),
                        "expected an array of token ids",
                    ));
                };
                if i > 0 {
                    window.push('\n');
                }
                push_tokens(window, tokens, &format!("prompt[{i}]"))?;
            }
            Ok(())
        }
        Some(_) => Err(ShapeError::new(
            "prompt[0]",
            "expected a string, a token id, or an array of token ids",
        )),
    }
}

fn push_tokens(window: &mut CharBudget, tokens: &[Value], param: &str) -> Result<(), ShapeError> {
    for (i, token) in tokens.iter().enumerate() {
        let Some(id) = token.as_u64() else {
            return Err(ShapeError::new(
                format!("{param}[{i}]"),
                "expected a non-negative integer token id",
            ));
        };
        if i > 0 {
            window.push(',');
        }
        if !window.is_full() {
            window.push_raw(itoa(id, &mut [0; 20]));
        }
    }
    Ok(())
}

/// Decimal text of `n` without a heap allocation per token.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(prompt: Value) -> String {
        completions_window(&json!({"model": "m", "prompt": prompt}), usize::MAX).unwrap()
    }

    fn err_param(prompt: Value) -> String {
        completions_window(&json!({"prompt": prompt}), usize::MAX)
            .unwrap_err()
            .param
    }

    #[test]
    fn each_prompt_form() {
        assert_eq!(window(json!("Once upon")), "Once upon");
        assert_eq!(window(json!(["a", "b c", ""])), "a\nb c\n");
        assert_eq!(
            window(json!([15339, 0, 11, 18446744073709551615_u64])),
            "15339,0,11,18446744073709551615"
        );
        assert_eq!(window(json!([[1, 2], [3], []])), "1,2\n3\n");
        assert_eq!(window(json!([])), "");
    }

    #[test]
    fn window_is_cut_at_max_chars() {
        let body = json!({"prompt": "héllo wörld"});
        assert_eq!(completions_window(&body, 4).unwrap(), "héll");
        assert_eq!(completions_window(&body, 0).unwrap(), "");
        let tokens = json!({"prompt": [123, 456]});
        assert_eq!(completions_window(&tokens, 5).unwrap(), "123,4");
        let batch = json!({"prompt": ["ab", "cd"]});
        assert_eq!(completions_window(&batch, 3).unwrap(), "ab\n");
    }

    #[test]
    fn shape_errors_name_the_param() {
        assert_eq!(
            completions_window(&json!({}), 10).unwrap_err().param,
            "prompt"
        );
        assert_eq!(
            completions_window(&json!("x"), 10).unwrap_err().param,
            "prompt"
        );
        assert_eq!(err_param(json!(null)), "prompt");
        assert_eq!(err_param(json!({"text": "x"})), "prompt");
        assert_eq!(err_param(json!(["a", 1])), "prompt[1]");
        assert_eq!(err_param(json!([1, "a"])), "prompt[1]");
        assert_eq!(err_param(json!([1, -2])), "prompt[1]");
        assert_eq!(err_param(json!([1, 2.5])), "prompt[1]");
        assert_eq!(err_param(json!([[1], [2, "x"]])), "prompt[1][1]");
        assert_eq!(err_param(json!([[1], 2])), "prompt[1]");
        assert_eq!(err_param(json!([null])), "prompt[0]");
        assert_eq!(err_param(json!([{"a": 1}])), "prompt[0]");
    }

    #[test]
    fn validation_does_not_depend_on_max_chars() {
        let body = json!({"prompt": ["long".repeat(100), "x", 7]});
        assert_eq!(completions_window(&body, 0).unwrap_err().param, "prompt[2]");
    }

    #[test]
    fn itoa_matches_display() {
        for n in [0, 9, 10, 99, 100, 12345, u64::MAX] {
            assert_eq!(itoa(n, &mut [0; 20]), n.to_string());
        }
    }
}
