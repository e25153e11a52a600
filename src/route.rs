//! What a served inference route is: its metric label, the path it is
//! forwarded to, how its prompt is windowed, and how its instance is chosen.

use kvgate_prefix::Api;

/// A route that forwards to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Chat,
    Completions,
    /// SageMaker Invoke (`/endpoints/{name}/invocations…`).
    Native,
    /// `POST /v1/responses`.
    Responses,
    /// `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`.
    ResponseById,
    Embeddings,
    Tokenize,
    Detokenize,
    Score,
    Rerank,
    Pooling,
    Transcriptions,
    /// Anthropic `POST /v1/messages`.
    Messages,
    /// Anthropic `POST /v1/messages/count_tokens`.
    CountTokens,
}

/// Every path an inference route is served on: (method, template, route).
/// The router, the request counters, `kvgate explain` and the OpenAPI
/// document's test all read this list, so a new route is added here (and in
/// [`Route`]'s methods below) and nowhere else.
pub const PATHS: &[(&str, &str, Route)] = &[
    ("post", "/v1/chat/completions", Route::Chat),
    ("post", "/v1/completions", Route::Completions),
    ("post", "/v1/messages", Route::Messages),
    ("post", "/v1/messages/count_tokens", Route::CountTokens),
    ("post", "/v1/responses", Route::Responses),
    ("get", "/v1/responses/{id}", Route::ResponseById),
    ("delete", "/v1/responses/{id}", Route::ResponseById),
    ("post", "/v1/responses/{id}/cancel", Route::ResponseById),
    ("post", "/v1/embeddings", Route::Embeddings),
    ("post", "/tokenize", Route::Tokenize),
    ("post", "/detokenize", Route::Detokenize),
    ("post", "/v1/score", Route::Score),
    ("post", "/v1/rerank", Route::Rerank),
    ("post", "/pooling", Route::Pooling),
    ("post", "/v1/audio/transcriptions", Route::Transcriptions),
    ("post", "/endpoints/{endpoint}/invocations", Route::Native),
    // Re-framed as SageMaker's event stream (`api::proxy::Wire`).
    (
        "post",
        "/endpoints/{endpoint}/invocations-response-stream",
        Route::Native,
    ),
    // SageMaker's container contract, so kvgate can itself be the inference
    // container: `/invocations` goes to the first configured endpoint.
    ("post", "/invocations", Route::Native),
];

/// How the instance is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Placement {
    /// The endpoint's strategy, by the prompt.
    #[default]
    Policy,
    /// Fewest in-flight requests when the endpoint's strategy is prefix-based
    /// (its own otherwise): requests without a generation to cache for.
    Load,
    /// This instance and no other: it holds the response the request names.
    Pinned(String),
}

impl Route {
    /// Every route, for metrics present from start-up.
    pub const ALL: [Route; 14] = [
        Route::Chat,
        Route::Completions,
        Route::Native,
        Route::Responses,
        Route::ResponseById,
        Route::Embeddings,
        Route::Tokenize,
        Route::Detokenize,
        Route::Score,
        Route::Rerank,
        Route::Pooling,
        Route::Transcriptions,
        Route::Messages,
        Route::CountTokens,
    ];

    /// Its place in [`Route::ALL`] (the declaration order).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The route a matched path template is.
    pub fn of_template(template: &str) -> Option<Self> {
        PATHS
            .iter()
            .find(|(_, t, _)| *t == template)
            .map(|(_, _, r)| *r)
    }

    /// The route a concrete request path takes, and the endpoint its path
    /// names (`/endpoints/{endpoint}/…`), for `kvgate explain`.
    pub fn of_path(method: &str, path: &str) -> Option<(Self, Option<String>)> {
        let path = path.trim_end_matches('/');
        PATHS
            .iter()
            .filter(|(m, _, _)| *m == method)
            .find_map(|(_, t, r)| {
                let mut endpoint = None;
                let (mut want, mut got) = (t.split('/'), path.split('/'));
                loop {
                    match (want.next(), got.next()) {
                        (None, None) => return Some((*r, endpoint)),
                        (Some("{endpoint}"), Some(g)) if !g.is_empty() => {
                            endpoint = Some(g.to_owned())
                        }
                        (Some(w), Some(g)) if w.starts_with('{') && !g.is_empty() => {}
                        (Some(w), Some(g)) if w == g => {}
                        _ => return None,
                    }
                }
            })
    }

    /// The `api` label of `kvgate_requests_total` and friends.
    pub fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Native => "native",
            Self::Responses | Self::ResponseById => "responses",
            Self::Embeddings => "embeddings",
            Self::Tokenize => "tokenize",
            Self::Detokenize => "detokenize",
            Self::Score => "score",
            Self::Rerank => "rerank",
            Self::Pooling => "pooling",
            Self::Transcriptions => "transcriptions",
            Self::Messages => "messages",
            Self::CountTokens => "count_tokens",
        }
    }

    /// The instance path a body-carrying route is sent to (the same as the
    /// client's, but SageMaker's). [`Route::ResponseById`] builds its own.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Native => "/invocations",
            Self::Responses | Self::ResponseById => "/v1/responses",
            Self::Embeddings => "/v1/embeddings",
            Self::Tokenize => "/tokenize",
            Self::Detokenize => "/detokenize",
            Self::Score => "/v1/score",
            Self::Rerank => "/v1/rerank",
            Self::Pooling => "/pooling",
            Self::Transcriptions => "/v1/audio/transcriptions",
            Self::Messages => "/v1/messages",
            Self::CountTokens => "/v1/messages/count_tokens",
        }
    }

    /// How the prompt is windowed: the Responses API as chat (its input is
    /// turned into messages), embeddings as completions (`input` as `prompt`).
    pub fn api(self) -> Api {
        match self {
            Self::Chat | Self::Responses | Self::ResponseById => Api::Chat,
            Self::Messages | Self::CountTokens => Api::Messages,
            Self::Native => Api::Native,
            _ => Api::Completions,
        }
    }

    /// Whether the body's prompt is read and keyed (the rest route by `model` only).
    pub fn reads_prompt(self) -> bool {
        matches!(
            self,
            Self::Chat
                | Self::Completions
                | Self::Native
                | Self::Responses
                | Self::Embeddings
                | Self::Messages
        )
    }

    /// Whether the endpoint's strategy places it (else [`Placement::Load`]).
    pub fn uses_strategy(self) -> bool {
        matches!(
            self,
            Self::Chat | Self::Completions | Self::Native | Self::Responses | Self::Messages
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metric handles are kept in arrays indexed by [`Route::index`].
    #[test]
    fn index_is_the_place_in_all() {
        for (i, r) in Route::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }

    #[test]
    fn every_path_matches_its_own_template() {
        for (method, template, route) in PATHS {
            assert_eq!(Route::of_template(template), Some(*route));
            let concrete = template
                .replace("{endpoint}", "ep")
                .replace("{id}", "resp_1");
            let expect = template.contains("{endpoint}").then(|| "ep".to_owned());
            assert_eq!(Route::of_path(method, &concrete), Some((*route, expect)));
        }
        assert_eq!(Route::of_path("post", "/v1/models"), None);
        assert_eq!(Route::of_path("post", "/endpoints//invocations"), None);
    }
}
