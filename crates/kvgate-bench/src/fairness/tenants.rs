//! The three tenants and what each sends: open-loop Poisson arrivals of
//! single-turn streaming chat requests with chat-sized prompts and answers,
//! every prompt unique (no prefix cache hits, so a token of prompt costs the
//! same prefill whoever sends it and the fleet's capacity is one number).
//!
//! Arrivals are drawn per tenant from its own seed, so `steady` and `vip`
//! send the very same requests in every arm: the arms differ only in what
//! else runs and in the gateway's queue.

use std::time::Duration;

use bytes::Bytes;
use kvgate_sim::block_text;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;

use crate::workload::{exp_gap, log_normal};

/// One tenant: its name (the gateway's tenant id), priority class and
/// offered load in multiples of its fair share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tenant {
    pub name: &'static str,
    pub priority: &'static str,
    pub shares: f64,
}

/// Index of each tenant in [`TENANTS`].
pub const FLOOD: usize = 0;
pub const STEADY: usize = 1;
pub const VIP: usize = 2;

/// One tenant floods at 5× its fair share; two send their share, one of
/// them at high priority.
pub const TENANTS: [Tenant; 3] = [
    Tenant {
        name: "flood",
        priority: "normal",
        shares: 5.0,
    },
    Tenant {
        name: "steady",
        priority: "normal",
        shares: 1.0,
    },
    Tenant {
        name: "vip",
        priority: "high",
        shares: 1.0,
    },
];

impl Tenant {
    /// The API key the tenant sends (the gateway holds its SHA-256).
    pub fn key(&self) -> String {
        format!("kvgate-bench-{}-key", self.name)
    }
}

/// Prompt and answer sizes, tokens: log-normal, clamped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizes {
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    pub prompt_range: (f64, f64),
    pub output_median: f64,
    pub output_sigma: f64,
    pub output_range: (f64, f64),
}

impl Sizes {
    /// Chat-sized: prompts of median 1,000 tokens (system prompt, history
    /// and question; the Azure 2023 conversation trace's median is about
    /// 1,000), answers of median 200 (ShareGPT-like).
    pub const CHAT: Sizes = Sizes {
        prompt_median: 1_000.0,
        prompt_sigma: 0.7,
        prompt_range: (64.0, 4_096.0),
        output_median: 200.0,
        output_sigma: 0.6,
        output_range: (16.0, 1_024.0),
    };

    /// One draw: (prompt tokens, max_tokens).
    fn draw(&self, rng: &mut StdRng) -> (usize, u32) {
        let (plo, phi) = self.prompt_range;
        let (olo, ohi) = self.output_range;
        let prompt = log_normal(rng, self.prompt_median, self.prompt_sigma, plo, phi);
        let output = log_normal(rng, self.output_median, self.output_sigma, olo, ohi);
        // `as` saturates; both are clamped to small positive ranges.
        (prompt.round() as usize, output.round() as u32)
    }

    /// Mean prompt and answer tokens, from 20,000 draws.
    pub fn means(&self) -> (f64, f64) {
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let n = 20_000;
        let (mut p, mut o) = (0.0, 0.0);
        for _ in 0..n {
            let (a, b) = self.draw(&mut rng);
            p += a as f64;
            o += f64::from(b);
        }
        (p / f64::from(n), o / f64::from(n))
    }

    /// The largest request's weighted cost, `w_in·prompt + w_out·output`
    /// at the clamps (VTC's `U`).
    pub fn max_cost(&self, input_weight: f64, output_weight: f64) -> f64 {
        input_weight * self.prompt_range.1 + output_weight * self.output_range.1
    }
}

/// One request: whose, when (simulated time from the start), how big.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub tenant: usize,
    pub at: Duration,
    pub prompt_tokens: usize,
    pub max_tokens: u32,
    /// Unique over every tenant: the prompt's text is drawn from it.
    pub id: u64,
}

/// `tenant`'s Poisson arrivals at `rate` per simulated second over
/// `[0, duration)`, from its own seed.
pub fn arrivals(
    tenant: usize,
    rate: f64,
    duration: Duration,
    sizes: &Sizes,
    seed: u64,
) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x7e4a_0000 + tenant as u64));
    let mut out = Vec::new();
    let mut at = Duration::ZERO;
    loop {
        at += exp_gap(&mut rng, rate);
        if at >= duration {
            return out;
        }
        let (prompt_tokens, max_tokens) = sizes.draw(&mut rng);
        out.push(Request {
            tenant,
            at,
            prompt_tokens,
            max_tokens,
            id: ((tenant as u64 + 1) << 40) | out.len() as u64,
        });
    }
}

/// The chat completion `r` is sent as: one user message of about its
/// prompt's size (the simulator adds its template's few tokens), streamed
/// with usage in the last chunk.
pub fn body(model: &str, r: &Request) -> Bytes {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": block_text(r.id, r.prompt_tokens)}],
        "max_tokens": r.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_poisson_at_the_rate_and_the_same_every_time() {
        let d = Duration::from_secs(400);
        let a = arrivals(STEADY, 5.0, d, &Sizes::CHAT, 7);
        let rate = a.len() as f64 / d.as_secs_f64();
        assert!((rate - 5.0).abs() < 0.3, "{rate}");
        assert_eq!(a, arrivals(STEADY, 5.0, d, &Sizes::CHAT, 7));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(
            a.iter()
                .all(|r| r.at < d && (64..=4_096).contains(&r.prompt_tokens))
        );
        // Another tenant's arrivals and prompts are its own.
        let b = arrivals(VIP, 5.0, d, &Sizes::CHAT, 7);
        assert_ne!(a[0].at, b[0].at);
        assert!(a.iter().all(|r| b.iter().all(|s| s.id != r.id)));
    }

    #[test]
    fn sizes_have_their_medians_and_bodies_their_size() {
        let (p, o) = Sizes::CHAT.means();
        // Log-normal means sit above the medians: e^(σ²/2).
        assert!((1_150.0..1_350.0).contains(&p), "{p}");
        assert!((215.0..260.0).contains(&o), "{o}");
        assert_eq!(Sizes::CHAT.max_cost(1.0, 2.0), 4_096.0 + 2_048.0);
        let r = Request {
            tenant: FLOOD,
            at: Duration::ZERO,
            prompt_tokens: 100,
            max_tokens: 7,
            id: 1 << 40,
        };
        let v: serde_json::Value = serde_json::from_slice(&body("m", &r)).unwrap_or_default();
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], true);
        let text = v["messages"][0]["content"].as_str().unwrap_or("");
        assert_eq!(kvgate_sim::count_tokens(text.as_bytes()), 100);
    }
}
