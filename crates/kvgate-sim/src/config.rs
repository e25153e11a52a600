//! One simulated instance's capacity, speed and time scale, with a calibrated preset.

use std::sync::Arc;
use std::time::Duration;

use kvgate_tokenize::PromptTokenizer;

use crate::kv_events::KvEventsConfig;
use crate::tokens::TokenBytes;

/// Capacity and speed of one simulated vLLM instance.
///
/// Every field is public so callers can start from [`SimConfig::llama70b_h100_tp4`]
/// and change what a test or benchmark needs. [`crate::SimServer::new`] clamps
/// nonsensical values (zero sizes, a negative or non-finite rate or scale) to the
/// nearest usable ones instead of failing, so no configuration can make a request
/// panic.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Instance name, used as the `server` label in `/metrics` and in logs.
    pub name: String,
    /// Model id listed by `/v1/models` and echoed when a request names none.
    pub model: String,
    /// Tokens per KV block (vLLM: 16). Only full blocks are cached.
    pub block_size: usize,
    /// KV capacity in blocks.
    pub cache_blocks: usize,
    /// Uncached prompt tokens processed per second (compute-bound prefill).
    pub prefill_tokens_per_s: f64,
    /// Duration of one decode step (memory-bound: weights are read once a step).
    pub inter_token_latency: Duration,
    /// Most sequences running at once (vLLM `max_num_seqs`).
    pub max_running: usize,
    /// Token budget of one scheduler step (vLLM `max_num_batched_tokens`).
    pub max_batched_tokens: usize,
    /// Most sequences in (chunked) prefill at once (vLLM `--max-num-partial-prefills`);
    /// `None` for no limit. With `Some(1)` the instance prefills one request at a
    /// time: a sequence behind another's unfinished prefill waits in the queue, and
    /// gets no prefill tokens, until that prefill completes. `Some(0)` counts as 1.
    pub max_partial_prefills: Option<usize>,
    /// Output tokens when the request sets no `max_tokens`.
    pub default_max_tokens: usize,
    /// Real seconds per simulated second: 1.0 is real time, 0.01 runs 100× faster.
    /// Every simulated duration is multiplied by it; 0 runs without sleeping.
    pub time_scale: f64,
    /// Publish KV-cache events over ZeroMQ as vLLM does (`--kv-events-config`);
    /// `None` publishes nothing. [`crate::spawn`] binds the sockets.
    pub kv_events: Option<KvEventsConfig>,
    /// A real tokenizer: prompts become its token ids (chat through its chat
    /// template), blocks are `block_size` ids each, hashed over the ids. `None`
    /// keeps the 4-bytes-a-token model (see `tokens.rs`).
    pub tokenizer: Option<Arc<PromptTokenizer>>,
    /// Bytes of prompt text a simulated token when no `tokenizer` is set
    /// (4: English prose; about 2 for code; 3.9 for CJK text at 1.3
    /// characters a token, 3 bytes a character). Usage, cached tokens, KV
    /// blocks and events all count in these tokens, and the KV capacity
    /// (`cache_blocks`) holds that many fewer or more bytes of text. Clamped
    /// to `1..=64`, to the nearest thousandth; not a finite number: 4.
    pub bytes_per_token: f64,
    /// Export `vllm:cache_config_info` on `/metrics`, as vLLM does, so a gateway
    /// can learn the KV capacity. `false` plays an engine with no cache gauge
    /// (SGLang, llama.cpp, TGI).
    pub export_cache_config_info: bool,
}

impl SimConfig {
    /// Llama-3.1-70B-Instruct, BF16, on 4 × H100 80 GB (tensor parallel 4), vLLM defaults.
    ///
    /// - `cache_blocks = 24_000` (384k tokens): 4 × 80 GB × 0.9
    ///   (`gpu_memory_utilization`) = 288 GB, less 141 GB of weights and about
    ///   20 GB of activations, CUDA graphs and NCCL buffers, leaves ≈ 126 GB. One
    ///   token of KV is 80 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes =
    ///   320 KiB, so a 16-token block is 5 MiB and 126 GB holds ≈ 24,000 blocks.
    ///   At 8,000-token prompts that is ≈ 48 resident sequences: KV, not
    ///   `max_running`, is what binds.
    /// - `prefill_tokens_per_s = 12_000`: a token costs ≈ 2 × 70.6 G = 141 GFLOP
    ///   (plus ≈ 7% attention at 8k context); 4 × 989 TFLOPS dense BF16 at ≈ 45%
    ///   utilisation gives ≈ 1.8 PFLOPS, ≈ 12k tokens/s. An 8,000-token cold
    ///   prompt therefore costs ≈ 0.67 s of prefill, a warm one a single step.
    /// - `inter_token_latency = 25 ms`: each GPU streams its 35 GB of weights at
    ///   3.35 TB/s (10.5 ms) plus the batch's KV reads, 160 all-reduces and kernel
    ///   overheads; measured ITL for 70B TP4 at moderate batch is 20–30 ms.
    /// - `max_running = 256`, `max_batched_tokens = 8_192`: vLLM's `max_num_seqs`
    ///   and its OpenAI-server `max_num_batched_tokens` default (chunked prefill).
    /// - `max_partial_prefills = None`: any number of sequences share a step's
    ///   prefill budget, as vLLM V1's scheduler does.
    /// - `default_max_tokens = 16`: OpenAI's legacy completions default; vLLM's
    ///   own default (the rest of the context) would make idle demos run for minutes.
    /// - `export_cache_config_info = true`: vLLM exports it.
    pub fn llama70b_h100_tp4() -> Self {
        Self {
            name: "sim".to_owned(),
            model: "meta-llama/Llama-3.1-70B-Instruct".to_owned(),
            block_size: 16,
            cache_blocks: 24_000,
            prefill_tokens_per_s: 12_000.0,
            inter_token_latency: Duration::from_millis(25),
            max_running: 256,
            max_batched_tokens: 8_192,
            max_partial_prefills: None,
            default_max_tokens: 16,
            time_scale: 1.0,
            kv_events: None,
            tokenizer: None,
            bytes_per_token: crate::tokens::BYTES_PER_TOKEN as f64,
            export_cache_config_info: true,
        }
    }

    /// Clamp every field into the range the engine can work with.
    pub(crate) fn normalized(mut self) -> Self {
        let preset = Self::llama70b_h100_tp4();
        self.block_size = self.block_size.max(1);
        self.cache_blocks = self.cache_blocks.max(1);
        if !(self.prefill_tokens_per_s.is_finite() && self.prefill_tokens_per_s > 0.0) {
            self.prefill_tokens_per_s = preset.prefill_tokens_per_s;
        }
        self.max_running = self.max_running.max(1);
        self.max_batched_tokens = self.max_batched_tokens.max(1);
        self.max_partial_prefills = self.max_partial_prefills.map(|n| n.max(1));
        self.default_max_tokens = self.default_max_tokens.max(1);
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            self.time_scale = preset.time_scale;
        }
        self.time_scale = self.time_scale.min(MAX_TIME_SCALE);
        self.bytes_per_token = self.token_bytes().get();
        self
    }
}

impl SimConfig {
    /// The prompt bytes a simulated token ([`SimConfig::bytes_per_token`]).
    pub fn token_bytes(&self) -> TokenBytes {
        TokenBytes::new(self.bytes_per_token)
    }
}

/// Beyond this a simulated second would last over 15 minutes: surely a mistake.
const MAX_TIME_SCALE: f64 = 1_000.0;

impl Default for SimConfig {
    fn default() -> Self {
        Self::llama70b_h100_tp4()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_clamps_unusable_values() {
        let cfg = SimConfig {
            block_size: 0,
            cache_blocks: 0,
            prefill_tokens_per_s: f64::NAN,
            max_running: 0,
            max_batched_tokens: 0,
            max_partial_prefills: Some(0),
            default_max_tokens: 0,
            time_scale: -1.0,
            bytes_per_token: 0.5,
            ..SimConfig::default()
        }
        .normalized();
        assert_eq!(cfg.block_size, 1);
        assert_eq!(cfg.cache_blocks, 1);
        assert_eq!(cfg.prefill_tokens_per_s, 12_000.0);
        assert_eq!((cfg.max_running, cfg.max_batched_tokens), (1, 1));
        assert_eq!(cfg.max_partial_prefills, Some(1));
        assert_eq!(cfg.default_max_tokens, 1);
        assert_eq!(cfg.time_scale, 1.0);
        assert_eq!(cfg.bytes_per_token, 1.0);
        let nan = SimConfig {
            bytes_per_token: f64::NAN,
            ..SimConfig::default()
        };
        assert_eq!(nan.normalized().bytes_per_token, 4.0);
    }
}
