//! The routing config's defaults that the gateway's config and the offline
//! what-if (`kvgate simulate`) share: each strategy runs under the same values
//! whether a config left them out or the simulator assumes them.

/// Characters of the prompt `prefix_aware` hashes onto the ring (and
/// `longest_prefix` for its tie-breaks).
pub const DEFAULT_PREFIX_LENGTH: u64 = 4096;
/// `longest_prefix` leaves balancing to its cost model; the threshold only
/// guards an instance, so it defaults to vLLM's `max_num_seqs`.
pub const DEFAULT_CACHE_AWARE_THRESHOLD: u64 = 256;
/// `longest_prefix` keeps every instance under 1.5 × the mean load (plus one
/// request): loose enough that a conversation rarely leaves its cache (99% of
/// the multi-turn ceiling), tight enough that a prefix whose traffic would
/// overload its holder is replicated onto others (bench/results/routing.md:
/// at 2.0 one instance of seven never got a system prompt).
pub const DEFAULT_CACHE_AWARE_BALANCE_FACTOR: f64 = 1.5;
/// 1,024 blocks of 256 characters ≈ 64k tokens of prompt indexed at most.
pub const DEFAULT_MAX_PROMPT_BLOCKS: u64 = 1024;
