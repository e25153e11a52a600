//! Learning each instance's KV capacity from the engine itself, so
//! `longest_prefix` needs no `cache_tokens` on vLLM: vLLM exports
//! `vllm:cache_config_info{block_size="16",num_gpu_blocks="N",…} 1` on
//! `/metrics`, and `N × block_size` tokens is exactly what its prefix cache can
//! hold. Instances with a configured `cache_tokens`, or whose endpoint uses
//! another strategy, are left alone; an instance that does not export the gauge
//! (SGLang, llama.cpp) keeps the default after a few tries, logged once.
//!
//! The task only reads `/metrics` until it has learned an instance's figure (a
//! few requests at start-up or when a reload adds instances), never on the
//! request path.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::fleet::{AppState, Endpoint};

/// Tries per instance before settling for the configured default.
pub const MAX_TRIES: u32 = 5;
/// Between tries, and between looks for newly added instances.
const EVERY: Duration = Duration::from_secs(10);
/// A `/metrics` answer must come within this.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Run until the state is dropped by everyone else.
pub async fn run(state: std::sync::Weak<AppState>) {
    loop {
        let Some(live) = state.upgrade() else { return };
        let rt = live.runtime.load_full();
        drop(live);
        let mut probes = Vec::new();
        for ep in &rt.endpoints {
            if !ep.config.routing.strategy.uses_index() {
                continue;
            }
            for (inst, ic) in ep.instances.iter().zip(&ep.config.instances) {
                if ic.learn_cache_tokens && inst.capacity_wanted(MAX_TRIES) {
                    probes.push(learn(
                        std::sync::Weak::clone(&state),
                        Arc::clone(ep),
                        Arc::clone(inst),
                        rt.client.clone(),
                    ));
                }
            }
        }
        join_all(probes).await;
        tokio::time::sleep(EVERY).await;
    }
}

async fn learn(
    state: std::sync::Weak<AppState>,
    ep: Arc<Endpoint>,
    inst: Arc<super::Instance>,
    client: reqwest::Client,
) {
    let text = super::engine_load::fetch_metrics(&client, &inst.url, TIMEOUT).await;
    match text.as_deref().and_then(cache_tokens_of) {
        Some(tokens) => {
            inst.set_learned_cache_tokens(tokens);
            // Sized by the settings in force now: a reload may have come
            // during the probe (Runtime::build applies learned figures after).
            let Some(live) = state.upgrade() else { return };
            let rt = live.runtime.load_full();
            let routing = &rt
                .endpoint(ep.name())
                .map_or(&ep.config.routing, |e| &e.config.routing);
            inst.index.configure(
                routing.index_blocks(tokens, ep.density.block_tokens(routing.block_chars)),
                routing.block_chars,
            );
            tracing::info!(endpoint = %ep.name(), instance = %inst.id, cache_tokens = tokens,
                index_blocks = inst.index.capacity(), "learned the instance's KV capacity from vllm:cache_config_info");
        }
        None => {
            if inst.capacity_try_failed() == MAX_TRIES {
                tracing::warn!(endpoint = %ep.name(), instance = %inst.id,
                    default_cache_tokens = ep.config.routing.cache_tokens,
                    "no vllm:cache_config_info on /metrics; assuming routing.cache_tokens (set it, or the instance's own cache_tokens, to silence this)");
            }
        }
    }
}

/// `num_gpu_blocks × block_size` from the first `vllm:cache_config_info` sample
/// of a Prometheus text exposition that has both as integers.
pub fn cache_tokens_of(text: &str) -> Option<usize> {
    text.lines()
        .filter_map(|l| l.strip_prefix("vllm:cache_config_info{"))
        .find_map(|rest| {
            let labels = rest.split_once('}')?.0;
            let blocks = label(labels, "num_gpu_blocks")?;
            let size = label(labels, "block_size")?;
            blocks.checked_mul(size).filter(|&t| t > 0)
        })
}

/// The integer value of `name="…"` in a label set (values here hold no quotes).
fn label(labels: &str, name: &str) -> Option<usize> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"').parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllms_gauge() {
        let text = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
            gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27306\",\
            num_gpu_blocks_override=\"None\",engine=\"0\"} 1.0\n";
        assert_eq!(cache_tokens_of(text), Some(27306 * 16));
    }

    #[test]
    fn ignores_what_is_not_a_usable_figure() {
        assert_eq!(cache_tokens_of(""), None);
        assert_eq!(cache_tokens_of("vllm:num_requests_running 3\n"), None);
        assert_eq!(
            cache_tokens_of("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1"),
            None
        );
        assert_eq!(
            cache_tokens_of("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1"),
            None
        );
        // A broken first line does not hide a good second one (two engines).
        let two = "vllm:cache_config_info{num_gpu_blocks=\"x\"} 1\n\
                   vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\"} 1\n";
        assert_eq!(cache_tokens_of(two), Some(3200));
    }
}
