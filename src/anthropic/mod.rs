//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
//! served beside OpenAI's: the checks its bodies get, the conversation vLLM
//! renders from them (for `kv_aware`), and its error wire. Routing, tenancy,
//! quotas, failover and streaming are the same code as chat completions'.

pub mod chat;
pub mod error;
pub mod request;
