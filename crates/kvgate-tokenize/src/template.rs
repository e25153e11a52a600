//! Chat templates rendered as transformers' `apply_chat_template` renders
//! them (which is what vLLM calls): Jinja with `trim_blocks` and
//! `lstrip_blocks` on, no kept trailing newline, Python string methods,
//! `raise_exception`, `strftime_now` and transformers' own `tojson`; and
//! which of a tokenizer's templates a request is rendered with.

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::locate::{Found, FoundTemplates};
use crate::{LoadError, TokenizeError};

const NAME: &str = "chat_template";

pub(crate) struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source`; the error is minijinja's message.
    pub(crate) fn new(source: String) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", crate::pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source)
            .map_err(|e| describe(&e))?;
        Ok(Self { env })
    }

    /// Renders the template with `context` (a map: messages, tools, …).
    pub(crate) fn render(&self, context: Value) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::Template(describe(&e)))?;
        template
            .render(context)
            .map_err(|e| TokenizeError::Template(describe(&e)))
    }
}

/// A compiled template and where it came from.
struct Sourced {
    template: ChatTemplate,
    source: String,
}

impl Sourced {
    fn compile(found: Found) -> Result<Self, LoadError> {
        let template = ChatTemplate::new(found.text).map_err(|message| LoadError::Template {
            path: found.source.clone(),
            message,
        })?;
        Ok(Self {
            template,
            source: found.source,
        })
    }
}

/// A tokenizer's chat templates, compiled.
pub(crate) struct ChatTemplates {
    default: Option<Sourced>,
    tool_use: Option<Sourced>,
}

impl ChatTemplates {
    pub(crate) fn compile(found: FoundTemplates) -> Result<Self, LoadError> {
        Ok(Self {
            default: found.default.map(Sourced::compile).transpose()?,
            tool_use: found.tool_use.map(Sourced::compile).transpose()?,
        })
    }

    /// transformers' `get_chat_template`, which vLLM calls: "tool_use" for a
    /// request with tools (any `tools` but null, an empty list too: its test
    /// is `tools is not None`) when there is one; else "default".
    pub(crate) fn pick(&self, has_tools: bool) -> Option<&ChatTemplate> {
        let tool_use = self.tool_use.as_ref().filter(|_| has_tools);
        tool_use.or(self.default.as_ref()).map(|s| &s.template)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.default.is_none() && self.tool_use.is_none()
    }

    pub(crate) fn default_source(&self) -> Option<&str> {
        self.default.as_ref().map(|s| s.source.as_str())
    }

    pub(crate) fn tool_use_source(&self) -> Option<&str> {
        self.tool_use.as_ref().map(|s| s.source.as_str())
    }
}

/// minijinja's message with its causes, on one line.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The current UTC time formatted with a subset of C's strftime (the
/// specifiers chat templates use: dates for "Today is …" lines).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(secs, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

fn strftime(secs: u64, format: &str) -> String {
    let days = secs / 86_400;
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let month = MONTHS[(m - 1) as usize % 12];
    let weekday = DAYS[(days % 7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&d.to_string());
            }
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(month.get(..3).unwrap_or(month)),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(weekday.get(..3).unwrap_or(weekday)),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Howard Hinnant's days-from-civil inverse: days since 1970-01-01 → (y, m, d).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            strftime(1_709_211_909, "%d %b %Y %H:%M:%S %A %-d %B"),
            "29 Feb 2024 13:05:09 Thursday 29 February"
        );
        assert_eq!(strftime(0, "%Y-%m-%d %a %%"), "1970-01-01 Thu %");
    }

    #[test]
    fn whitespace_control_is_transformers() {
        let t = ChatTemplate::new("{% for m in messages %}\n  {{ m }}\n{% endfor %}\n".into())
            .unwrap_or_else(|e| panic!("{e}"));
        let ctx = Value::from_pairs([(
            "messages",
            Value::from(vec![Value::from("a"), Value::from("b")]),
        )]);
        // Jinja2 with trim_blocks + lstrip_blocks: "  a\n  b\n"; the final newline dropped.
        assert_eq!(t.render(ctx).ok().as_deref(), Some("  a\n  b\n"));
    }
}
