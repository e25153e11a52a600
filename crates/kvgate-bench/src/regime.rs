//! The load regime a run is measured under: how requests arrive (open-loop
//! Poisson on the workload's own clock, or a fixed number of closed-loop
//! clients), whether answers stream, whether the gateway is told each
//! instance's KV capacity, learns it from the engine, or has to assume its
//! default, and which API the sessions speak (OpenAI chat or Anthropic
//! Messages). [`Regime::default`] is what `routing.md` has always measured.

use std::fmt;

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arrivals {
    /// Each session starts at its own (Poisson) time, and waits its think
    /// times between an answer and the next turn ([`crate::driver`]).
    Open,
    /// This many clients, each sending its next request when its last one
    /// answers ([`crate::closed`]).
    Closed(usize),
}

impl Arrivals {
    /// The matrix's five: open loop, then 1, 4, 8 and 32 clients.
    pub const MATRIX: [Arrivals; 5] = [
        Arrivals::Open,
        Arrivals::Closed(1),
        Arrivals::Closed(4),
        Arrivals::Closed(8),
        Arrivals::Closed(32),
    ];

    /// `open`, or `closed:N` with N ≥ 1.
    pub fn parse(text: &str) -> Option<Arrivals> {
        match text.trim() {
            "open" => Some(Arrivals::Open),
            other => other
                .strip_prefix("closed:")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .map(Arrivals::Closed),
        }
    }
}

impl fmt::Display for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arrivals::Open => f.write_str("open"),
            Arrivals::Closed(n) => write!(f, "closed:{n}"),
        }
    }
}

/// What the gateway knows of each instance's KV capacity (`longest_prefix`
/// and `kv_aware`; the others ignore it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// `cache_tokens` written in the gateway's config, sized to the instances.
    Configured,
    /// No `cache_tokens`; the instances export `vllm:cache_config_info` and
    /// the gateway learns it (the run starts once it has, [`crate::fleet`]).
    Learned,
    /// No `cache_tokens` and no gauge (SGLang, llama.cpp, TGI): the gateway
    /// assumes its default of 384,000 tokens an instance.
    Unknown,
}

impl Capacity {
    pub const MATRIX: [Capacity; 2] = [Capacity::Learned, Capacity::Unknown];

    pub fn parse(text: &str) -> Option<Capacity> {
        match text.trim() {
            "configured" => Some(Capacity::Configured),
            "learned" => Some(Capacity::Learned),
            "unknown" => Some(Capacity::Unknown),
            _ => None,
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Capacity::Configured => "configured",
            Capacity::Learned => "learned",
            Capacity::Unknown => "unknown",
        })
    }
}

/// The API a run's chat sessions are sent over (trace prompts are always
/// completions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// Anthropic's `POST /v1/messages` ([`crate::conversation`]).
    Messages,
    /// `POST /v1/chat/completions` with `prompt_cache_key` = the session's
    /// id, as agent clients that set it send it (Codex does).
    OpenAiKeyed,
}

impl Api {
    /// The agent benchmark's: chat without and with a session hint, and Messages.
    pub const AGENTS: [Api; 3] = [Api::OpenAi, Api::OpenAiKeyed, Api::Messages];

    pub fn parse(text: &str) -> Option<Api> {
        match text.trim() {
            "openai" => Some(Api::OpenAi),
            "messages" => Some(Api::Messages),
            "openai-keyed" => Some(Api::OpenAiKeyed),
            _ => None,
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::OpenAi => "openai",
            Api::Messages => "messages",
            Api::OpenAiKeyed => "openai-keyed",
        })
    }
}

/// Arrivals, streaming, capacity and API of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Regime {
    pub arrivals: Arrivals,
    /// `stream: true` (TTFT is the first SSE chunk) or `false` (the client's
    /// "TTFT" is the time to the whole answer).
    pub stream: bool,
    pub capacity: Capacity,
    pub api: Api,
}

impl Default for Regime {
    fn default() -> Self {
        Self {
            arrivals: Arrivals::Open,
            stream: true,
            capacity: Capacity::Configured,
            api: Api::OpenAi,
        }
    }
}

/// `open · stream · capacity configured`, with ` · messages` when not OpenAI.
impl fmt::Display for Regime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} · {} · capacity {}",
            self.arrivals,
            if self.stream { "stream" } else { "no-stream" },
            self.capacity
        )?;
        match self.api {
            Api::OpenAi => Ok(()),
            api => write!(f, " · {api}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_and_capacity_parse_back() {
        for a in Arrivals::MATRIX {
            assert_eq!(Arrivals::parse(&a.to_string()), Some(a));
        }
        assert_eq!(Arrivals::parse("closed:0"), None);
        assert_eq!(Arrivals::parse("closed"), None);
        for c in [Capacity::Configured, Capacity::Learned, Capacity::Unknown] {
            assert_eq!(Capacity::parse(&c.to_string()), Some(c));
        }
        assert_eq!(
            Regime::default().to_string(),
            "open · stream · capacity configured"
        );
        for api in Api::AGENTS {
            assert_eq!(Api::parse(&api.to_string()), Some(api));
        }
        let messages = Regime {
            api: Api::Messages,
            ..Regime::default()
        };
        assert_eq!(
            messages.to_string(),
            "open · stream · capacity configured · messages"
        );
    }
}
