//! One attempt's charges on an instance, and their undo: the in-flight slot
//! (with the prefill it queues), the KV feed's expectation of the blocks the
//! engine will store, and the approximate index's insert. An instance that
//! does no work for the request (its connection failed, it answered 502/503,
//! or it refused the request with a 4xx) has the expectation and the insert
//! taken back; the slot goes with the guard.

use std::sync::Arc;
use std::time::Instant;

use kvgate_routing::index::Inserted;
use kvgate_routing::{Load, Request};

use crate::fleet::{Endpoint, InflightGuard, Instance, PaceSample, Seen};
use crate::kv_events::Subscription;
use crate::request::RouteInput;
use crate::route::Placement;

/// What one attempt charged to its instance.
pub struct Dispatch<'a> {
    instance: &'a Arc<Instance>,
    input: &'a RouteInput,
    guard: InflightGuard,
    /// The instance's KV feed and when it began awaiting this request's blocks.
    feed: Option<(Arc<Subscription>, Option<Instant>)>,
    /// Its insert into the instance's approximate index (strategies that use one).
    inserted: Option<Inserted>,
}

impl<'a> Dispatch<'a> {
    /// Claim the instance's slot and tell its feed and its index what it
    /// will cache by prefilling this prompt.
    pub fn claim(
        ep: &Endpoint,
        instance: &'a Arc<Instance>,
        input: &'a RouteInput,
        (request, load): (&Request, &Load),
        seen: Option<&Seen>,
    ) -> Self {
        let charge = ep.policy.queued_charge(request, load);
        let own = charge.saturating_sub(kvgate_routing::cost::overhead(load));
        let ahead = instance.queued_ahead(own);
        let mut guard = instance.claim(charge);
        if !input.stream {
            // Its first byte will be its last: time the charge out instead.
            guard.release_at_drain(load.queued_prefill);
        } else if ep.config.routing.strategy.uses_index() {
            // Its first token's time is a sample of the instance's pace
            // (strategies that estimate what it holds, so know its work).
            guard.time_first_token(PaceSample {
                ahead,
                prompt: request.prompt_tokens,
                secs: None,
            });
        }
        let feed = instance
            .kv_feed()
            .zip(input.kv.as_ref())
            .map(|(sub, prompt)| {
                let held = seen.map_or(0, |s| s.held_blocks);
                // Attribution matters only for a first block the instance lacks.
                let root = prompt.scoped_root.as_ref().filter(|_| held == 0);
                let new_blocks = held < prompt.keys.len();
                let since = sub
                    .feed
                    .dispatched(&prompt.keys, root, new_blocks, Instant::now());
                (sub, since)
            });
        // Prompts (a pinned follow-up's too) are charged to the index where
        // they go; what is placed by load alone has no cache to remember.
        let indexed = ep.config.routing.strategy.uses_index() && input.placement != Placement::Load;
        let inserted = indexed.then(|| {
            ep.series
                .matched_fraction(matched_fraction(ep, request, load));
            let inserted = instance.index.insert(&input.chain);
            instance.series.index_size(inserted.len);
            guard.inserted(inserted.stamp());
            inserted
        });
        Self {
            instance,
            input,
            guard,
            feed,
            inserted,
        }
    }

    /// The instance did no work for the request: no event is to be expected
    /// of it, and its index does not hold the prompt.
    pub fn no_work(&mut self) {
        if let (Some((sub, since)), Some(prompt)) = (self.feed.take(), &self.input.kv) {
            sub.feed.withdraw(since, &prompt.keys);
        }
        if let Some(inserted) = self.inserted.take() {
            self.instance.index.forget(&self.input.chain, inserted);
            self.instance.series.index_size(self.instance.index.len());
        }
    }

    /// The index insert that stands, for checking against the answer's usage.
    pub fn inserted(&self) -> Option<Inserted> {
        self.inserted
    }

    /// The slot, held by the response body until it ends.
    pub fn into_guard(self) -> InflightGuard {
        self.guard
    }
}

/// The share of the prompt the chosen instance is believed to hold.
fn matched_fraction(ep: &Endpoint, request: &Request, load: &Load) -> f64 {
    let cost = ep.policy.costs(request, std::slice::from_ref(load));
    let cached = cost.and_then(|c| c.first().map(|c| c.cached_tokens));
    cached.unwrap_or(0) as f64 / request.prompt_tokens.max(1) as f64
}
