//! Per-request series, resolved once: a labelled macro call builds its key
//! (owned label strings) and looks it up in the registry on every call,
//! together a few percent of a proxied request's CPU, so each endpoint and
//! each upstream holds its handles instead.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use super::{
    CACHED_TOKENS, CHARGED_COMPLETION_TOKENS, COMPLETION_TOKENS, IN_FLIGHT, INDEX_BLOCKS,
    INDEX_BYTES, MATCHED_FRACTION, PROMPT_TOKENS, REQUEST_DURATION, REQUESTS, RETRIES,
    ROUTING_DECISIONS, ROUTING_DURATION, TTFT, UPSTREAM_HEADERS,
};
use crate::route::Route;

const ROUTES: usize = Route::ALL.len();
/// The status classes counted from start-up (at zero); others on first use.
const CLASSES: [&str; 3] = ["2xx", "4xx", "5xx"];

/// One endpoint's request counters and durations, by route.
pub struct EndpointSeries {
    name: String,
    requests: [[Counter; CLASSES.len()]; ROUTES],
    durations: [Histogram; ROUTES],
    matched: Histogram,
    /// Registered when first charged, so the family appears once used.
    charged: [OnceLock<Counter>; 2],
}

/// Where a tenant's charged completion tokens came from.
#[derive(Debug, Clone, Copy)]
pub enum Charged {
    /// The answer's `usage`.
    Usage,
    /// Counted from a stream's text.
    Counted,
}

impl std::fmt::Debug for EndpointSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointSeries")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

static ENDPOINTS: LazyLock<Mutex<HashMap<String, Arc<EndpointSeries>>>> =
    LazyLock::new(Mutex::default);

impl EndpointSeries {
    /// The endpoint's series; its request counters and durations exist (at
    /// zero) from here on, so dashboards and `rate()` see them from start-up.
    pub fn of(endpoint: &str) -> Arc<Self> {
        let mut all = ENDPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        let series = all.entry(endpoint.to_owned()).or_insert_with(|| {
            let _ = histogram!(ROUTING_DURATION);
            let requests = Route::ALL.map(|r| {
                CLASSES.map(|class| {
                    let c = counter!(REQUESTS, "endpoint" => endpoint.to_owned(), "api" => r.label(), "status" => class);
                    c.increment(0);
                    c
                })
            });
            Arc::new(Self {
                name: endpoint.to_owned(),
                requests,
                durations: Route::ALL.map(|r| {
                    histogram!(REQUEST_DURATION, "endpoint" => endpoint.to_owned(), "api" => r.label())
                }),
                matched: histogram!(MATCHED_FRACTION, "endpoint" => endpoint.to_owned()),
                charged: Default::default(),
            })
        });
        Arc::clone(series)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A request answered with `status` (counted when its response headers go out).
    pub fn done(&self, route: Route, status: u16) {
        match status {
            200..=299 => self.requests[route.index()][0].increment(1),
            400..=499 => self.requests[route.index()][1].increment(1),
            500.. => self.requests[route.index()][2].increment(1),
            _ => request_done(&self.name, route.label(), status),
        }
    }

    /// A request's whole duration: until its response body ended or the client left.
    pub fn duration(&self, route: Route, elapsed: Duration) {
        self.durations[route.index()].record(elapsed.as_secs_f64());
    }

    /// How much of its prompt the chosen instance was believed to hold (cache-aware routing).
    pub fn matched_fraction(&self, fraction: f64) {
        self.matched.record(fraction);
    }

    /// Completion tokens charged to a tenant.
    pub fn charged(&self, source: Charged, n: u64) {
        let (i, label) = match source {
            Charged::Usage => (0, "usage"),
            Charged::Counted => (1, "counted"),
        };
        self.charged[i]
            .get_or_init(|| counter!(CHARGED_COMPLETION_TOKENS, "endpoint" => self.name.clone(), "source" => label))
            .increment(n);
    }
}

/// A request answered with `status`, for an endpoint not (yet) known: refused
/// before its body named one.
pub fn request_done(endpoint: &str, api: &'static str, status: u16) {
    let class = match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    counter!(REQUESTS, "endpoint" => endpoint.to_owned(), "api" => api, "status" => class)
        .increment(1);
}

/// A request whose client left before its answer began (counted as `status="cancelled"`).
pub fn request_cancelled(endpoint: &str, api: &'static str) {
    counter!(REQUESTS, "endpoint" => endpoint.to_owned(), "api" => api, "status" => "cancelled")
        .increment(1);
}

/// A request's duration, for an endpoint not (yet) known.
pub fn request_duration(endpoint: &str, api: &'static str, elapsed: Duration) {
    histogram!(REQUEST_DURATION, "endpoint" => endpoint.to_owned(), "api" => api)
        .record(elapsed.as_secs_f64());
}

/// Routing outcomes, as `Reason::as_str` and `"failover"` name them.
const OUTCOMES: [&str; 9] = [
    "affinity",
    "overflow",
    "fallback",
    "balance",
    "last_resort",
    "cache_hit",
    "cache_spread",
    "cold",
    "failover",
];

/// One upstream's per-request series, with its endpoint's.
pub struct UpstreamSeries {
    /// The endpoint's series, shared by its upstreams.
    pub endpoint_series: Arc<EndpointSeries>,
    routing_duration: Histogram,
    in_flight: Gauge,
    headers: Histogram,
    ttft: Histogram,
    prompt: Counter,
    cached: Counter,
    completion: Counter,
    index_blocks: Gauge,
    index_bytes: Gauge,
    decisions: [Counter; OUTCOMES.len()],
    endpoint: String,
    upstream: String,
    /// The console's last minute of usage and 15 minutes of TTFT.
    pub live: super::live::InstanceLive,
}

impl std::fmt::Debug for UpstreamSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSeries")
            .field("endpoint", &self.endpoint)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl UpstreamSeries {
    /// The handles, from the gateway's recorder; every series of the upstream
    /// exists (at zero) from here on, so dashboards and `rate()` see it from
    /// start-up rather than from its first request.
    pub fn new(endpoint: &str, upstream: &str) -> Self {
        for why in ["connect", "status"] {
            counter!(RETRIES, "endpoint" => endpoint.to_owned(), "upstream" => upstream.to_owned(), "reason" => why)
                .increment(0);
        }
        let labels = [
            ("endpoint", endpoint.to_owned()),
            ("upstream", upstream.to_owned()),
        ];
        Self {
            endpoint_series: EndpointSeries::of(endpoint),
            routing_duration: histogram!(ROUTING_DURATION),
            in_flight: gauge!(IN_FLIGHT, &labels),
            headers: histogram!(UPSTREAM_HEADERS, &labels),
            ttft: histogram!(TTFT, &labels),
            prompt: counter!(PROMPT_TOKENS, &labels),
            cached: counter!(CACHED_TOKENS, &labels),
            completion: counter!(COMPLETION_TOKENS, &labels),
            index_blocks: gauge!(INDEX_BLOCKS, &labels),
            index_bytes: gauge!(INDEX_BYTES, &labels),
            decisions: OUTCOMES.map(|outcome| {
                counter!(ROUTING_DECISIONS, "endpoint" => endpoint.to_owned(), "upstream" => upstream.to_owned(), "outcome" => outcome)
            }),
            endpoint: endpoint.to_owned(),
            upstream: upstream.to_owned(),
            live: super::live::InstanceLive::default(),
        }
    }

    pub fn routing_decision(&self, outcome: &'static str, took: Duration) {
        self.routing_duration.record(took.as_secs_f64());
        match OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => self.decisions[i].increment(1),
            None => counter!(ROUTING_DECISIONS, "endpoint" => self.endpoint.clone(), "upstream" => self.upstream.clone(), "outcome" => outcome)
                .increment(1),
        }
    }

    pub fn response_headers(&self, took: Duration) {
        self.headers.record(took.as_secs_f64());
    }

    pub fn in_flight(&self, n: usize) {
        self.in_flight.set(n as f64);
    }

    /// Time to first token of a streamed answer.
    pub fn first_token(&self, took: Duration) {
        self.ttft.record(took.as_secs_f64());
        self.live.ttft.record(took);
    }

    pub fn usage(&self, prompt: u64, cached: u64, completion: u64) {
        self.prompt.increment(prompt);
        self.cached.increment(cached);
        self.completion.increment(completion);
        self.live.minute.add([1, prompt, cached]);
    }

    /// Blocks in the upstream's index, and their approximate memory.
    pub fn index_size(&self, blocks: usize) {
        self.index_blocks.set(blocks as f64);
        self.index_bytes
            .set((blocks * kvgate_routing::index::ENTRY_BYTES) as f64);
    }
}
