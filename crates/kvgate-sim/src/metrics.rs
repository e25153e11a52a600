//! `/metrics`: the counters in Prometheus text format, under vLLM's metric names, so
//! a gateway (or Prometheus) reads a simulated instance exactly like a real one.
//! Every series carries `model_name` (as vLLM) and `server` (the instance name),
//! except `vllm:cache_config_info`, whose labels are vLLM's (the `CacheConfig`
//! fields as strings, and `engine`) plus `server`: a gateway learns each
//! instance's KV capacity (`num_gpu_blocks` × `block_size` tokens) from it,
//! unless `SimConfig::export_cache_config_info` is off (an engine with no gauge).
//! TTFT is observed in simulated seconds, i.e. real seconds ÷ `time_scale`.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use crate::server::SimServer;
use crate::stats::TTFT_BUCKETS;

/// Render the exposition text.
pub(crate) fn render(server: &SimServer) -> String {
    let c = &server.counters;
    let s = c.snapshot();
    let labels = format!(
        "model_name=\"{}\",server=\"{}\"",
        escape(&server.cfg.model),
        escape(&server.cfg.name)
    );
    let mut out = String::with_capacity(4096);
    let mut metric = |name: &str, kind: &str, help: &str, value: &dyn std::fmt::Display| {
        let sample = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_owned()
        };
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{sample}{{{labels}}} {value}"
        );
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &s.running,
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &s.waiting,
    );
    let usage = s.kv_blocks_in_use as f64 / s.kv_blocks_total.max(1) as f64;
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &usage,
    );
    metric(
        "vllm:prefix_cache_queries",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        &s.queries_tokens,
    );
    metric(
        "vllm:prefix_cache_hits",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        &s.cached_tokens,
    );
    metric(
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        &s.prompt_tokens,
    );
    metric(
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        &s.generation_tokens,
    );
    metric(
        "kvgate_sim_requests_aborted",
        "counter",
        "Requests aborted because the client went away.",
        &s.aborted,
    );

    if server.cfg.export_cache_config_info {
        cache_config_info(&mut out, server);
    }

    let name = "vllm:time_to_first_token_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Histogram of time to first token in seconds.\n# TYPE {name} histogram"
    );
    let mut cumulative = 0u64;
    for (i, bucket) in c.ttft_buckets.iter().enumerate() {
        cumulative += bucket.load(Relaxed);
        let le = TTFT_BUCKETS
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |b| format!("{b:?}"));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let sum = c.ttft_sum_ns.load(Relaxed) as f64 / 1e9;
    let _ = writeln!(
        out,
        "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {cumulative}"
    );
    out
}

/// vLLM's info gauge of its `CacheConfig`: value 1, the fields as labels, their
/// values as Python's `str()` writes them (`True`, `None`), in field order.
fn cache_config_info(out: &mut String, server: &SimServer) {
    let name = "vllm:cache_config_info";
    let cfg = &server.cfg;
    let _ = writeln!(
        out,
        "# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge\n\
         {name}{{block_size=\"{}\",gpu_memory_utilization=\"0.9\",cache_dtype=\"auto\",\
         num_gpu_blocks_override=\"None\",enable_prefix_caching=\"True\",\
         num_gpu_blocks=\"{}\",num_cpu_blocks=\"None\",engine=\"0\",server=\"{}\"}} 1.0",
        cfg.block_size,
        cfg.cache_blocks,
        escape(&cfg.name),
    );
}

fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;
    use std::time::Duration;

    #[test]
    fn exposition_has_vllm_names_types_and_a_cumulative_histogram() {
        let server = SimServer::new(SimConfig {
            name: "a\"b".into(),
            ..SimConfig::default()
        });
        server.counters.queries_tokens.store(100, Relaxed);
        server.counters.cached_tokens.store(80, Relaxed);
        server.counters.running.store(3, Relaxed);
        server.counters.observe_ttft(0, Duration::from_millis(30));
        server.counters.observe_ttft(1, Duration::from_secs(1));
        let text = render(&server);
        let labels = r#"model_name="meta-llama/Llama-3.1-70B-Instruct",server="a\"b""#;
        for line in [
            "# TYPE vllm:prefix_cache_queries counter".to_owned(),
            format!("vllm:prefix_cache_queries_total{{{labels}}} 100"),
            format!("vllm:prefix_cache_hits_total{{{labels}}} 80"),
            format!("vllm:num_requests_running{{{labels}}} 3"),
            format!("vllm:num_requests_waiting{{{labels}}} 0"),
            format!("vllm:prompt_tokens_total{{{labels}}} 0"),
            format!("vllm:generation_tokens_total{{{labels}}} 0"),
            "# TYPE vllm:time_to_first_token_seconds histogram".to_owned(),
            format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.02\"}} 0"),
            format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.04\"}} 1"),
            format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"1.0\"}} 2"),
            format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"+Inf\"}} 2"),
            format!("vllm:time_to_first_token_seconds_sum{{{labels}}} 1.03"),
            format!("vllm:time_to_first_token_seconds_count{{{labels}}} 2"),
            "# TYPE vllm:cache_config_info gauge".to_owned(),
            "vllm:cache_config_info{block_size=\"16\",gpu_memory_utilization=\"0.9\",\
             cache_dtype=\"auto\",num_gpu_blocks_override=\"None\",enable_prefix_caching=\"True\",\
             num_gpu_blocks=\"24000\",num_cpu_blocks=\"None\",engine=\"0\",server=\"a\\\"b\"} 1.0"
                .to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn an_engine_without_a_cache_gauge_exports_none() {
        let server = SimServer::new(SimConfig {
            export_cache_config_info: false,
            ..SimConfig::default()
        });
        let text = render(&server);
        assert!(!text.contains("cache_config_info"), "{text}");
        assert!(text.contains("vllm:kv_cache_usage_perc"), "{text}");
    }
}
