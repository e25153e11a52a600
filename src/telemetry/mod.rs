//! Metric names and the recorder. Everything is recorded through the
//! `metrics` facade (lock-free atomics behind the handle), so nothing on the
//! request path waits for telemetry; `/metrics` renders the Prometheus text.
//!
//! Labels are bounded: endpoint and instance ids come from config, reasons and
//! outcomes from fixed enums. No prompt text, no keys.

pub mod live;
pub mod otel;
mod series;

pub use series::{
    Charged, EndpointSeries, UpstreamSeries, request_cancelled, request_done, request_duration,
};

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS: &str = "kvgate_requests_total";
pub const REQUEST_DURATION: &str = "kvgate_request_duration_seconds";
/// Renamed from `kvgate_upstream_first_byte_seconds`: vLLM sends headers
/// before the first token, so this is the wait for headers, not for a token.
pub const UPSTREAM_HEADERS: &str = "kvgate_upstream_response_headers_seconds";
/// From the gateway receiving the request to the first SSE data event that
/// carries output (OpenTelemetry's `gen_ai.server.time_to_first_token`).
pub const TTFT: &str = "kvgate_time_to_first_token_seconds";
pub const ROUTING_DURATION: &str = "kvgate_routing_decision_seconds";
pub const ROUTING_DECISIONS: &str = "kvgate_routing_decisions_total";
pub const IN_FLIGHT: &str = "kvgate_instance_in_flight";
pub const HEALTHY: &str = "kvgate_instance_healthy";
pub const PROMPT_TOKENS: &str = "kvgate_upstream_prompt_tokens_total";
pub const CACHED_TOKENS: &str = "kvgate_upstream_cached_tokens_total";
pub const COMPLETION_TOKENS: &str = "kvgate_upstream_completion_tokens_total";
pub const RETRIES: &str = "kvgate_upstream_retries_total";
pub const REJECTIONS: &str = "kvgate_rejections_total";
pub const CONFIG_RELOADS: &str = "kvgate_config_reloads_total";
pub const MATCHED_FRACTION: &str = "kvgate_routing_matched_prefix_ratio";
pub const INDEX_BLOCKS: &str = "kvgate_index_blocks";
pub const INDEX_BYTES: &str = "kvgate_index_bytes";
pub const KV_EVENTS_APPLIED: &str = "kvgate_kv_events_applied_total";
pub const KV_EVENTS_DROPPED: &str = "kvgate_kv_events_dropped_total";
pub const KV_SEQUENCE: &str = "kvgate_kv_event_sequence_total";
pub const KV_HELD_BLOCKS: &str = "kvgate_kv_held_blocks";
pub const KV_SHED: &str = "kvgate_kv_shed_batches_total";
pub const KV_FALLBACK: &str = "kvgate_kv_fallback_total";
pub const KV_FALLBACK_INSTANCES: &str = "kvgate_kv_fallback_instances";
pub const KV_UNTOKENIZED: &str = "kvgate_kv_untokenized_total";
pub const WARMUP: &str = "kvgate_warmup_requests_total";
pub const DISCOVERY_FAILURES: &str = "kvgate_discovery_failures_total";
pub const DISCOVERED: &str = "kvgate_discovered_instances";
pub const JWKS_REFRESHES: &str = "kvgate_jwks_refreshes_total";
pub const CHARGED_COMPLETION_TOKENS: &str = "kvgate_completion_tokens_total";
pub const CLUSTER_REDIS_UP: &str = "kvgate_cluster_redis_up";
pub const CLUSTER_REPLICAS: &str = "kvgate_cluster_replicas";
pub const CLUSTER_FALLBACK: &str = "kvgate_cluster_fallback_total";
pub const CLUSTER_SYNC: &str = "kvgate_cluster_sync_total";
pub const CLUSTER_PEERS: &str = "kvgate_cluster_peers";
pub const CLUSTER_ROUTED: &str = "kvgate_cluster_routed_total";
pub const CLUSTER_CATCH_UP: &str = "kvgate_cluster_catch_up_seconds";
pub const ENGINE_READINGS: &str = "kvgate_engine_readings_total";
pub const USAGE_REFUSED: &str = "kvgate_usage_refused_total";
pub const QUEUE_WAITING: &str = "kvgate_queue_waiting";
pub const QUEUE_WAIT: &str = "kvgate_queue_wait_seconds";
pub const QUEUE_RELEASED: &str = "kvgate_queue_released_total";
pub const QUEUE_TIMEOUTS: &str = "kvgate_queue_timeouts_total";
pub const TENANT_SERVICE: &str = "kvgate_tenant_service_total";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the process-wide recorder once and return its handle. Every
/// gateway in the process (tests start several) shares it.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let micro = [
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
                0.01,
            ];
            let ratio = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0];
            let secs = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(ROUTING_DURATION.into()), &micro)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(MATCHED_FRACTION.into()), &ratio)
                })
                .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &secs));
            let recorder = match builder {
                Ok(b) => b.build_recorder(),
                Err(_) => PrometheusBuilder::new().build_recorder(),
            };
            let handle = recorder.handle();
            // Another recorder may already be installed (an embedding program's);
            // then our handle renders only what we record through it, which is nothing.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            // Reload results are there before the first reload.
            for result in ["ok", "error"] {
                counter!(CONFIG_RELOADS, "result" => result).increment(0);
            }
            handle
        })
        .clone()
}

/// Fold recorded histogram samples into their buckets every few seconds.
/// The recorder keeps each sample until a scrape renders it, so without
/// this a gateway nobody scrapes grows by every request's samples (8 bytes
/// each, several a request: 19 → 87 MiB over 640,000 requests, measured).
pub async fn upkeep() {
    let handle = handle();
    let mut every = tokio::time::interval(Duration::from_secs(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// `# HELP` lines for every family.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS,
        "Requests answered, by endpoint (empty when refused before it was known), API and status class; cancelled: the client left before the answer began"
    );
    describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Request duration until the response body ended or the client left"
    );
    describe_histogram!(
        UPSTREAM_HEADERS,
        metrics::Unit::Seconds,
        "Time from sending a request upstream to its response headers (not a token: vLLM answers headers first)"
    );
    describe_histogram!(
        TTFT,
        metrics::Unit::Seconds,
        "Time to first token of streamed answers: from the gateway routing the request to the first SSE data event with output"
    );
    describe_histogram!(
        ROUTING_DURATION,
        metrics::Unit::Seconds,
        "Time the routing policy took to order the instances"
    );
    describe_counter!(
        ROUTING_DECISIONS,
        "Routing decisions, by instance chosen and outcome (affinity, overflow, cache_hit, cache_spread, cold, fallback, failover, balance)"
    );
    describe_gauge!(
        IN_FLIGHT,
        "Requests dispatched to the instance and not finished"
    );
    describe_gauge!(HEALTHY, "1 while the instance is taken as healthy, else 0");
    describe_counter!(
        PROMPT_TOKENS,
        "Prompt tokens the upstream reported in usage"
    );
    describe_counter!(
        CACHED_TOKENS,
        "Prompt tokens the upstream reported served from its prefix cache"
    );
    describe_counter!(
        COMPLETION_TOKENS,
        "Output (completion) tokens the upstream reported in usage"
    );
    describe_counter!(RETRIES, "Attempts moved to the next instance, by reason");
    describe_counter!(REJECTIONS, "Requests refused by the gateway, by error code");
    describe_counter!(CONFIG_RELOADS, "Config reloads, by result");
    describe_counter!(
        DISCOVERY_FAILURES,
        "Discovery lookups that failed or came back empty (the last known instances are kept), by reason"
    );
    describe_counter!(
        JWKS_REFRESHES,
        "Fetches of auth.jwt.jwks_url, by result (a failure keeps the last key set)"
    );
    describe_gauge!(
        DISCOVERED,
        "Instances the endpoint's discovery currently knows"
    );
    describe_histogram!(
        MATCHED_FRACTION,
        "Share of each prompt the chosen instance was believed to hold (cache-aware strategies)"
    );
    describe_gauge!(
        INDEX_BLOCKS,
        "Blocks in the instance's approximate prefix index"
    );
    describe_gauge!(
        INDEX_BYTES,
        metrics::Unit::Bytes,
        "Estimated memory of the instance's approximate prefix index"
    );
    describe_counter!(
        KV_EVENTS_APPLIED,
        "KV-event blocks stored or removed in the instance's event-fed index"
    );
    describe_counter!(
        KV_EVENTS_DROPPED,
        "KV-event blocks (or messages) that could not be applied"
    );
    describe_counter!(
        KV_SEQUENCE,
        "KV-event sequence gaps, replays that filled one, and index resets"
    );
    describe_gauge!(
        KV_HELD_BLOCKS,
        "Blocks the instance's KV events say it holds"
    );
    describe_counter!(
        KV_SHED,
        "KV-event batches read off the socket and not applied, to catch up after an overload"
    );
    describe_counter!(
        KV_FALLBACK,
        "kv_aware decisions that used the approximate index for the instance, by reason"
    );
    describe_gauge!(
        KV_FALLBACK_INSTANCES,
        "Instances whose KV events were not usable at the endpoint's last decision"
    );
    describe_counter!(
        KV_UNTOKENIZED,
        "kv_aware prompts the tokenizer or chat template could not take"
    );
    describe_counter!(
        WARMUP,
        "Warm-up requests sent to joining instances, by result"
    );
    describe_counter!(
        CHARGED_COMPLETION_TOKENS,
        "Completion tokens charged to tenants' tokens per minute, by source (usage: the upstream reported them; counted: kvgate counted a stream without usage)"
    );
    describe_gauge!(
        CLUSTER_REDIS_UP,
        "1 while cluster.redis answers (tenant limits shared across replicas), 0 while limits are local shares"
    );
    describe_gauge!(
        CLUSTER_REPLICAS,
        "Gateway replicas alive in cluster.redis at the last heartbeat"
    );
    describe_gauge!(
        QUEUE_WAITING,
        "Requests waiting in the gateway for a saturated fleet, by tenant and priority"
    );
    describe_histogram!(
        QUEUE_WAIT,
        "Time released requests waited in the gateway's queue (0 when they passed at once)"
    );
    describe_counter!(
        QUEUE_RELEASED,
        "Requests let through the queue, by tenant and priority"
    );
    describe_counter!(
        QUEUE_TIMEOUTS,
        "Requests refused by the queue (full, or waited queue.max_wait_ms), by tenant and priority"
    );
    describe_counter!(
        TENANT_SERVICE,
        "Service each tenant received while queueing is on: input_weight x input + output_weight x output tokens"
    );
    describe_counter!(
        CLUSTER_SYNC,
        "Rounds of sharing routing and fair-queue state with the other replicas (cluster.sync_ms), by outcome (ok, failed: this replica routed on its own view)"
    );
    describe_gauge!(
        CLUSTER_PEERS,
        "Other replicas whose load figures this replica believes (written within the last second)"
    );
    describe_counter!(
        CLUSTER_ROUTED,
        "Placed prompts shared through the routed stream, by direction (sent, applied: another replica's, put in this replica's index; dropped: not sent)"
    );
    describe_gauge!(
        CLUSTER_CATCH_UP,
        "Seconds this replica took at start to read the routed stream's history into its index"
    );
    describe_counter!(
        ENGINE_READINGS,
        "Readings of the engines' /metrics for routing and queueing, by endpoint, upstream and outcome (ok, failed: routed on the gateway's own counts)"
    );
    describe_counter!(
        USAGE_REFUSED,
        "Answers whose usage.prompt_tokens was missing, zero or absurd for their prompt: not learned from (tokens a character)"
    );
    describe_counter!(
        CLUSTER_FALLBACK,
        "Limit decisions made on this replica's local share because Redis was unreachable or slow, by limit"
    );
}

pub fn healthy(endpoint: &str, instance: &str, up: bool) {
    gauge!(HEALTHY, "endpoint" => endpoint.to_owned(), "upstream" => instance.to_owned())
        .set(if up { 1.0 } else { 0.0 });
}

pub fn retry(endpoint: &str, instance: &str, why: &'static str) {
    counter!(RETRIES, "endpoint" => endpoint.to_owned(), "upstream" => instance.to_owned(), "reason" => why)
        .increment(1);
}

/// A request refused with error `code` (the OpenAI error code).
pub fn rejection(code: &'static str) {
    counter!(REJECTIONS, "reason" => code).increment(1);
}

pub fn config_reload(ok: bool) {
    counter!(CONFIG_RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// One KV feed's per-batch series, registered once: a batch then costs an
/// atomic add each rather than a registry lookup with its labels.
#[derive(Debug, Clone)]
pub struct KvSeries {
    pub applied: metrics::Counter,
    pub dropped: metrics::Counter,
    pub held: metrics::Gauge,
    pub shed: metrics::Counter,
}

impl KvSeries {
    pub fn new(endpoint: &str, instance: &str) -> Self {
        // Handles taken before the recorder is installed would record nowhere.
        let _ = handle();
        let labels = [
            ("endpoint", endpoint.to_owned()),
            ("upstream", instance.to_owned()),
        ];
        Self {
            applied: counter!(KV_EVENTS_APPLIED, &labels),
            dropped: counter!(KV_EVENTS_DROPPED, &labels),
            held: gauge!(KV_HELD_BLOCKS, &labels),
            shed: counter!(KV_SHED, &labels),
        }
    }
}

/// A sequence gap (`what` = "gap"), a replay that filled one ("replay"), or an
/// index reset ("reset": restart, AllBlocksCleared, unfillable gap).
pub fn kv_sequence(endpoint: &str, instance: &str, what: &'static str) {
    counter!(KV_SEQUENCE, "endpoint" => endpoint.to_owned(), "upstream" => instance.to_owned(), "event" => what)
        .increment(1);
}

/// A `kv_aware` decision used the approximate index for this instance, and why
/// (`disconnected`, `silent`, `not_configured`, `untokenized`).
pub fn kv_fallback(endpoint: &str, instance: &str, why: &'static str) {
    counter!(KV_FALLBACK, "endpoint" => endpoint.to_owned(), "upstream" => instance.to_owned(), "reason" => why)
        .increment(1);
}

/// Instances of an endpoint whose events were not usable at the last decision.
pub fn kv_fallback_instances(endpoint: &str, n: usize) {
    gauge!(KV_FALLBACK_INSTANCES, "endpoint" => endpoint.to_owned()).set(n as f64);
}

/// A `kv_aware` prompt the tokenizer could not take (routed approximately).
pub fn kv_untokenized() {
    counter!(KV_UNTOKENIZED).increment(1);
}

/// Warm-up requests sent to a joining instance, by `result` (`ok`, `error`).
pub fn warmup(endpoint: &str, instance: &str, result: &'static str) {
    counter!(WARMUP, "endpoint" => endpoint.to_owned(), "upstream" => instance.to_owned(), "result" => result)
        .increment(1);
}

/// A discovery lookup that kept the last known set: `error` or `empty`.
pub fn discovery_failure(endpoint: &str, reason: &'static str) {
    counter!(DISCOVERY_FAILURES, "endpoint" => endpoint.to_owned(), "reason" => reason)
        .increment(1);
}

/// How many instances an endpoint's discovery knows now.
pub fn discovered(endpoint: &str, n: usize) {
    gauge!(DISCOVERED, "endpoint" => endpoint.to_owned()).set(n as f64);
}

/// A fetch of the JWKS URL, good or not.
pub fn jwks_refresh(ok: bool) {
    counter!(JWKS_REFRESHES, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// (endpoint, tenant, priority) of a queued request.
pub type QueueLabels<'a> = (&'a str, &'a str, &'static str);

fn queue_labels((endpoint, tenant, priority): QueueLabels<'_>) -> [(&'static str, String); 3] {
    [
        ("endpoint", endpoint.to_owned()),
        ("tenant", tenant.to_owned()),
        ("priority", priority.to_owned()),
    ]
}

/// Requests of a tenant and priority waiting now.
pub fn queue_waiting(labels: QueueLabels<'_>, n: usize) {
    gauge!(QUEUE_WAITING, &queue_labels(labels)).set(n as f64);
}

/// A request let through the queue after `waited` seconds.
pub fn queue_released(labels: QueueLabels<'_>, waited: f64) {
    let labels = queue_labels(labels);
    counter!(QUEUE_RELEASED, &labels).increment(1);
    histogram!(QUEUE_WAIT, &labels).record(waited);
}

/// A request the queue refused.
pub fn queue_timeout(labels: QueueLabels<'_>) {
    counter!(QUEUE_TIMEOUTS, &queue_labels(labels)).increment(1);
}

/// Weighted tokens of service a tenant received.
pub fn tenant_service(endpoint: &str, tenant: &str, weighted: f64) {
    counter!(TENANT_SERVICE, "endpoint" => endpoint.to_owned(), "tenant" => tenant.to_owned())
        .increment(weighted.round() as u64);
}
