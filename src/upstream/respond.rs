//! The client's answer from an instance's: headers filtered, the body
//! streamed through the [`UpstreamBody`] that holds the instance's slot and
//! the tenant's admission until it ends, response ids rewritten where the
//! Responses API issued them; and, when it ends, the tenant charged what it
//! used and the approximate index checked against the cached tokens reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;

use super::body::{KeepAlive, UpstreamBody};
use super::first_token::{FirstToken, TokenEvent};
use super::headers;
use crate::fleet::InflightGuard;
use crate::openai::rewrite_stream::{Issuer, RewriteIds};
use crate::route::Route;
use crate::telemetry::live::Decision;
use crate::telemetry::{Charged, EndpointSeries};
use crate::tenancy::Admission;

/// What the approximate index expected of an instance, to check against the
/// `cached_tokens` its answer reports ([`kvgate_routing::BlockIndex::calibrate`]).
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    pub inserted: kvgate_routing::index::Inserted,
    /// Tokens an index block stands for.
    pub block_tokens: u64,
    /// The gateway's estimate of the prompt's tokens.
    pub prompt_tokens: u64,
}

impl Calibration {
    /// An answer speaks for the index only if it says what was cached, of a
    /// prompt about the size the gateway estimated (characters ÷ 4 is rough,
    /// but not off by 2×): anything else is not about these blocks.
    fn believable(&self, u: &super::usage::Usage) -> bool {
        u.cached_reported
            && u.prompt_tokens.saturating_mul(2) >= self.prompt_tokens
            && u.prompt_tokens <= self.prompt_tokens.saturating_mul(2)
    }
}

/// What an answer's usage teaches of its engine's tokens a character: the
/// endpoint's estimate and the prompt's characters.
pub type Units = (Arc<kvgate_routing::units::Density>, u64);

/// Turn the upstream response into the client's, streaming the body through.
pub fn client_response(
    upstream: axum::http::Response<hyper::body::Incoming>,
    guard: InflightGuard,
    (keepalive, idle): (Option<Duration>, Duration),
    (stream_requested, issuer): (bool, Option<Issuer>),
    (admission, calibration, units): (Option<Arc<Admission>>, Option<Calibration>, Option<Units>),
    (started, route, decision): (Instant, Route, Arc<Decision>),
) -> Response {
    let status = upstream.status();
    let mut hdrs = headers::client_response(upstream.headers());
    let is_sse = hdrs
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse || stream_requested {
        // Ask nginx-style proxies in front of us not to buffer the stream.
        hdrs.insert("x-accel-buffering", HeaderValue::from_static("no"));
        hdrs.entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-cache"));
    }
    let instance = Arc::clone(guard.instance());
    let finished = Arc::clone(&decision);
    // Only a stream that reports no usage needs its text counted, and only
    // for a tenant with a token limit or a fair queue counting its service;
    // the chunks are kept either way (by reference) because which kind it
    // is shows only at its end.
    let keep = is_sse
        && admission
            .as_ref()
            .is_some_and(|a| a.counts_tokens() || a.counts_service());
    // The tenant's admission (concurrency slot, token charge) lives exactly
    // as long as this closure: until the body ends or the client leaves.
    let on_done = Box::new(
        move |usage: Option<super::usage::Usage>, transcript: Option<Vec<bytes::Bytes>>| {
            // A token count's `input_tokens` is the answer, not tokens served.
            let usage = usage.filter(|_| route != Route::CountTokens);
            finished.done(status.as_u16(), started.elapsed());
            if let Some(u) = usage {
                finished.usage(u.prompt_tokens, u.cached_tokens);
            }
            if let Some(a) = admission {
                if let Some(u) = usage {
                    a.used(u.prompt_tokens + u.completion_tokens);
                }
                settle(&a, usage, transcript, &instance.series.endpoint_series);
            }
            instance
                .series
                .endpoint_series
                .duration(route, started.elapsed());
            // A retrieved response repeats the usage of the one that made it.
            if let Some(u) = usage.filter(|_| route != Route::ResponseById) {
                instance
                    .series
                    .usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
                if let Some((density, chars)) = &units {
                    learn_units(density, *chars, u.prompt_tokens, &instance.endpoint);
                }
                if let Some(c) = calibration.filter(|c| c.believable(&u)) {
                    let held = u.cached_tokens / c.block_tokens.max(1);
                    instance
                        .index
                        .calibrate(&c.inserted, usize::try_from(held).unwrap_or(usize::MAX));
                }
            }
        },
    );
    let keepalive = keepalive.filter(|_| is_sse).map(KeepAlive::new);
    let event = match route {
        Route::Responses | Route::ResponseById | Route::Messages => TokenEvent::Delta,
        _ => TokenEvent::Data,
    };
    let first_token = is_sse.then(|| (FirstToken::new(event), started));
    let body = UpstreamBody::new(
        http_body_util::BodyExt::into_data_stream(upstream.into_body()),
        guard,
        idle,
        keepalive,
        first_token,
        on_done,
    );
    let body = body.with_decision(decision);
    let body = if keep { body.keep_transcript() } else { body };
    let body = match issuer {
        Some(issuer) => {
            // Rewritten ids change the length.
            hdrs.remove(header::CONTENT_LENGTH);
            Body::from_stream(RewriteIds::new(body, issuer, is_sse))
        }
        None => Body::from_stream(body),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = hdrs;
    resp
}

/// One answer's sample of its engine's tokens a character; a refused one
/// (zero or absurd usage) is counted, and logged once an endpoint.
fn learn_units(
    density: &kvgate_routing::units::Density,
    chars: u64,
    prompt_tokens: u64,
    endpoint: &str,
) {
    if density.observe(chars, prompt_tokens) {
        return;
    }
    metrics::counter!(crate::telemetry::USAGE_REFUSED, "endpoint" => endpoint.to_owned())
        .increment(1);
    if density.snapshot().refused == 1 {
        tracing::warn!(
            endpoint,
            chars,
            prompt_tokens,
            "an answer's usage.prompt_tokens is not believable for its prompt; the estimate of tokens a character keeps its value"
        );
    }
}

/// Charge the tenant's tokens per minute with what the request really used:
/// the reported usage, or, for a stream without one, the prompt estimate
/// plus the completion tokens counted from its text — on a blocking thread,
/// after the last byte went to the client, so counting never delays one.
fn settle(
    admission: &Admission,
    usage: Option<super::usage::Usage>,
    transcript: Option<Vec<bytes::Bytes>>,
    endpoint: &Arc<EndpointSeries>,
) {
    // A usage object is the upstream's own count: trust it as it is.
    let Some(chunks) = transcript.filter(|_| usage.is_none()) else {
        if let Some(u) = usage.filter(|u| u.completion_tokens > 0) {
            endpoint.charged(Charged::Usage, u.completion_tokens);
        }
        admission.served(usage.map_or(0, |u| u.completion_tokens));
        admission.settle(
            usage.map(|u| u.prompt_tokens),
            usage.map_or(0, |u| u.completion_tokens),
        );
        return;
    };
    let (charge, served) = (admission.take_charge(), admission.take_served());
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if charge.is_none() && served.is_none() {
        return;
    }
    let endpoint = Arc::clone(endpoint);
    rt.spawn_blocking(move || {
        let counted = super::completion::count(&chunks);
        if let Some(c) = charge {
            endpoint.charged(Charged::Counted, counted);
            c.settle(None, counted);
        }
        if let Some(f) = served {
            f.call(counted);
        }
    });
}
