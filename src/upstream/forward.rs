//! Send a routed request upstream: plan the candidates, claim a slot on the
//! first, fail over to the next while nothing has reached the client, and
//! stream the answer back.
//!
//! Failover happens only before response headers: a refused, reset or timed
//! out connection puts the instance in cool-down and moves on; a 502/503 from
//! an upstream (overloaded or starting) moves on too. Once headers are
//! forwarded the answer is the client's, errors and all.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::body::{KeepAlive, UpstreamBody};
use super::first_token::{FirstToken, TokenEvent};
use super::headers;
use crate::error::{ApiError, ErrorKind};
use crate::fleet::Runtime;
use crate::fleet::instance::Instance;
use crate::openai::rewrite_stream::{Issuer, RewriteIds};
use crate::request::RouteInput;
use crate::route::{Placement, Route};
use crate::telemetry;
use kvgate_routing::{Load, Reason, Request};

/// One request on its way upstream.
#[derive(Debug)]
pub struct Forward<'a> {
    pub runtime: &'a Runtime,
    pub input: RouteInput,
    /// Path on the instance, e.g. `/v1/chat/completions` or `/invocations`,
    /// with the client's query string where it has one.
    pub path: &'a str,
    pub method: axum::http::Method,
    pub headers: &'a HeaderMap,
    /// SSE keep-alive comments may be added to the answer (not when the
    /// answer is re-framed, as on SageMaker's event stream).
    pub keepalive: bool,
    /// A streamed upload to send instead of `input.body`: it can be sent once,
    /// so such a request gets one attempt.
    pub upload: Option<Body>,
    /// Dropped once the request holds an instance's slot: the room a fair
    /// queue promised it (`queue::Reservation`), so that it is not counted
    /// twice while the request runs.
    pub until_claimed: Option<Box<dyn std::fmt::Debug + Send>>,
}

/// Where the request went and why, for logs.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub instance: Arc<Instance>,
    pub reason: Reason,
    pub attempts: usize,
}

pub async fn forward(mut f: Forward<'_>) -> Result<(Response, Outcome), ApiError> {
    let ep = &f.input.endpoint;
    let server = &f.runtime.config.server;
    let started = Instant::now();
    let (loads, seen) = f.input.view();
    // Warm-up replays chat-like prompts the strategy placed.
    if ep.config.routing.warmup.is_some()
        && f.input.placement == Placement::Policy
        && matches!(
            f.input.route,
            Route::Chat | Route::Completions | Route::Native
        )
    {
        ep.hot.record(
            f.input.key,
            f.input.route.upstream_path(),
            &f.input.body,
            &f.input.chain,
        );
    }
    let request = f.input.routing_request();
    let prompt_tokens = request.prompt_tokens;
    let plan = plan(ep, &f.input.placement, &request, &loads)?;
    let routing_took = started.elapsed();

    let mut upstream_headers = headers::upstream_request(f.headers);
    // The trace continues upstream (a no-op unless OpenTelemetry is on).
    crate::telemetry::otel::inject(&mut upstream_headers);
    // The endpoint's own credential; the client's was dropped just above.
    if let Some(auth) = &ep.config.upstream_authorization {
        upstream_headers.insert(header::AUTHORIZATION, auth.clone());
    }
    let mut last_error = String::from("no instance configured");
    let mut last_kind = ErrorKind::Unavailable;
    let count = plan.order.len();
    for (attempt, &idx) in plan.order.iter().enumerate() {
        let Some(instance) = ep.instances.get(idx) else {
            continue;
        };
        if instance.is_draining() {
            last_error = "every instance is draining".to_owned();
            continue;
        }
        // Before anything is charged to the instance: nothing to take back.
        let Some(uri) = instance.uri_for(f.path) else {
            tracing::warn!(endpoint = %ep.name(), instance = %instance.id, "the instance URL and the request path make no URI; trying the next instance");
            last_error = "the instance URL is not a valid URI".to_owned();
            continue;
        };
        let reason = if attempt == 0 {
            plan.reason
        } else {
            Reason::Overflow
        };
        let outcome = if attempt == 0 {
            reason.as_str()
        } else {
            "failover"
        };
        instance.series.routing_decision(outcome, routing_took);
        let load = loads.get(idx).copied().unwrap_or_default();
        // Prompts (a pinned follow-up's too) are charged to the index where
        // they go; what is placed by load alone has no cache to remember.
        let indexed =
            ep.config.routing.strategy.uses_index() && f.input.placement != Placement::Load;
        let mut guard = instance.claim(ep.policy.queued_charge(&request, &load));
        drop(f.until_claimed.take());
        if !f.input.stream {
            // Its first byte will be its last: time the charge out instead.
            guard.release_at_drain(load.queued_prefill);
        }
        // The instance will cache what it prefills; a request that never gets
        // there, or that it refuses, is taken back out below.
        if attempt == 0 && f.input.placement == Placement::Policy {
            count_fallbacks(ep, &f.input, &seen);
        }
        let feed = instance.kv_feed();
        let awaiting = match (&f.input.kv, &feed) {
            (Some(prompt), Some(sub)) => {
                let held = seen.get(idx).map_or(0, |s| s.held_blocks);
                // Attribution matters only for a first block the instance lacks.
                let root = prompt.scoped_root.as_ref().filter(|_| held == 0);
                let new_blocks = held < prompt.keys.len();
                sub.feed
                    .dispatched(&prompt.keys, root, new_blocks, Instant::now())
            }
            _ => None,
        };
        // This attempt did no work: no event is to be expected from it.
        let withdraw = || {
            if let (Some(sub), Some(prompt)) = (&feed, &f.input.kv) {
                sub.feed.withdraw(awaiting, &prompt.keys);
            }
        };
        let inserted = if indexed {
            telemetry::matched_fraction(ep.name(), matched_fraction(ep, &request, &load));
            let inserted = instance.index.insert(&f.input.chain);
            instance.series.index_size(inserted.len);
            guard.inserted(inserted.stamp());
            inserted
        } else {
            Default::default()
        };
        let body = match f.upload.take() {
            Some(upload) => upload,
            None if f.input.upload => {
                // The upload went to an instance that refused the connection.
                break;
            }
            None => Body::from(f.input.body.clone()),
        };
        let mut request = axum::http::Request::new(body);
        *request.method_mut() = f.method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = upstream_headers.clone();
        let sent = Instant::now();
        let request = f.runtime.proxies.here().request(request);
        let response = match tokio::time::timeout(server.timeouts.first_byte, request).await {
            Err(_) => {
                // The upstream may be working on it; a second copy elsewhere
                // would double the GPU work. Answer 504 and let the drop abort it.
                // A hung instance is a failing one: timeouts count toward passive
                // ejection like 5xx answers, or it would keep drawing its share.
                instance.server_error(server.failover_cooldown);
                tracing::warn!(endpoint = %ep.name(), instance = %instance.id, "no response headers in time");
                return Err(ApiError::new(
                    ErrorKind::GatewayTimeout,
                    format!(
                        "the upstream sent no response within {:?}",
                        server.timeouts.first_byte
                    ),
                ));
            }
            Ok(Err(e)) => {
                withdraw();
                if indexed {
                    take_back(instance, &f.input.chain, inserted);
                }
                instance.connect_failed(server.failover_cooldown);
                tracing::warn!(endpoint = %ep.name(), instance = %instance.id, error = %error_chain(&e), "upstream connection failed; trying the next instance");
                telemetry::retry(ep.name(), &instance.id, "connect");
                let timed_out = crate::fleet::client::is_timeout(&e);
                last_kind = if timed_out {
                    ErrorKind::GatewayTimeout
                } else {
                    ErrorKind::BadGateway
                };
                // The client learns what happened, not where: instance URLs stay internal.
                last_error = if timed_out {
                    "connection timed out"
                } else {
                    "connection failed"
                }
                .to_owned();
                continue;
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if status.is_server_error() {
            instance.server_error(server.failover_cooldown);
        } else {
            instance.succeeded();
        }
        let no_work = matches!(
            status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE
        );
        if no_work || status.is_client_error() {
            withdraw();
        }
        if indexed && (no_work || status.is_client_error()) {
            // Overloaded, starting, or refusing the request (context too long,
            // rate limited): it cached nothing, even when its answer is the client's.
            take_back(instance, &f.input.chain, inserted);
        }
        if no_work && attempt + 1 < count {
            telemetry::retry(ep.name(), &instance.id, "status");
            last_kind = ErrorKind::BadGateway;
            last_error = format!("an instance answered {status}");
            continue;
        }
        instance.series.response_headers(sent.elapsed());
        if status.is_client_error() || status.is_server_error() {
            // Read while the slot is held, then let it go with the guard.
            let resp = super::relay_error::relay(response, server.timeouts.idle).await;
            drop(guard);
            let api = f.input.route.label();
            telemetry::request_duration(ep.name(), api, started.elapsed());
            let outcome = Outcome {
                instance: Arc::clone(instance),
                reason,
                attempts: attempt + 1,
            };
            return Ok((resp, outcome));
        }
        let admission = f.input.admission.clone();
        // The approximate index checks itself against the engine's answer.
        let from_events = seen.get(idx).is_some_and(|s| s.from_events);
        let calibration = (indexed && !from_events).then(|| Calibration {
            inserted,
            block_tokens: kvgate_routing::cost::block_tokens(ep.config.routing.block_chars) as u64,
            prompt_tokens,
        });
        let timing = (started, f.input.route);
        let issuer = f.input.ids.clone().map(|scope| Issuer {
            scope,
            endpoint: ep.name().to_owned(),
            instance: instance.id.clone(),
        });
        let keepalive = server.sse_keepalive.filter(|_| f.keepalive);
        let resp = client_response(
            response,
            guard,
            (keepalive, server.timeouts.idle),
            (f.input.stream, issuer),
            (admission, calibration),
            timing,
        );
        let outcome = Outcome {
            instance: Arc::clone(instance),
            reason,
            attempts: attempt + 1,
        };
        return Ok((resp, outcome));
    }
    // Every candidate was already ejected or cooling down before this
    // request tried it as a last resort: no healthy instance, worth a retry.
    let none_healthy = !plan
        .order
        .iter()
        .any(|&i| loads.get(i).is_some_and(|l| l.available));
    if none_healthy && last_kind == ErrorKind::BadGateway {
        last_kind = ErrorKind::Unavailable;
        last_error = format!("no healthy instance (last attempt: {last_error})");
    }
    Err(ApiError::new(
        last_kind,
        format!(
            "no instance of endpoint {} could take the request: {last_error}",
            ep.name()
        ),
    ))
}

/// The instances to try, in order, as the request's placement says.
fn plan(
    ep: &crate::fleet::Endpoint,
    placement: &Placement,
    request: &Request,
    loads: &[Load],
) -> Result<kvgate_routing::Plan, ApiError> {
    use kvgate_routing::{LeastOutstanding, Plan, Policy, Strategy};
    match placement {
        Placement::Policy => Ok(ep.policy.plan(request, loads)),
        Placement::Load => match ep.config.routing.strategy {
            // The endpoint's own choice already ignores the prompt.
            Strategy::LeastOutstandingRequests | Strategy::Random | Strategy::RoundRobin => {
                Ok(ep.policy.plan(request, loads))
            }
            _ => Ok(LeastOutstanding.plan(request, loads)),
        },
        Placement::Pinned(id) => {
            let idx = ep
                .instances
                .iter()
                .position(|i| &i.id == id)
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::ResponseNotFound,
                        "the instance that stored this response is no longer part of the endpoint",
                    )
                })?;
            // No failover: no other instance holds the response.
            Ok(Plan {
                order: vec![idx],
                reason: Reason::Affinity,
            })
        }
    }
}

/// What the approximate index expected of an instance, to check against the
/// `cached_tokens` its answer reports ([`kvgate_routing::BlockIndex::calibrate`]).
#[derive(Debug, Clone, Copy)]
struct Calibration {
    inserted: kvgate_routing::index::Inserted,
    /// Tokens an index block stands for.
    block_tokens: u64,
    /// The gateway's estimate of the prompt's tokens.
    prompt_tokens: u64,
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

/// Turn the upstream response into the client's, streaming the body through.
fn client_response(
    upstream: axum::http::Response<hyper::body::Incoming>,
    guard: crate::fleet::InflightGuard,
    (keepalive, idle): (Option<std::time::Duration>, std::time::Duration),
    (stream_requested, issuer): (bool, Option<Issuer>),
    (admission, calibration): (Option<Arc<crate::tenancy::Admission>>, Option<Calibration>),
    (started, route): (Instant, Route),
) -> Response {
    let api = route.label();
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
            if let Some(a) = admission {
                settle(&a, usage, transcript, &instance.endpoint);
            }
            telemetry::request_duration(&instance.endpoint, api, started.elapsed());
            // A retrieved response repeats the usage of the one that made it.
            if let Some(u) = usage.filter(|_| route != Route::ResponseById) {
                instance
                    .series
                    .usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
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

/// Charge the tenant's tokens per minute with what the request really used:
/// the reported usage, or, for a stream without one, the prompt estimate
/// plus the completion tokens counted from its text — on a blocking thread,
/// after the last byte went to the client, so counting never delays one.
fn settle(
    admission: &crate::tenancy::Admission,
    usage: Option<super::usage::Usage>,
    transcript: Option<Vec<bytes::Bytes>>,
    endpoint: &str,
) {
    // A usage object is the upstream's own count: trust it as it is.
    let Some(chunks) = transcript.filter(|_| usage.is_none()) else {
        if let Some(u) = usage.filter(|u| u.completion_tokens > 0) {
            telemetry::completion_tokens(endpoint, "usage", u.completion_tokens);
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
    let endpoint = endpoint.to_owned();
    rt.spawn_blocking(move || {
        let counted = super::completion::count(&chunks);
        if let Some(c) = charge {
            telemetry::completion_tokens(&endpoint, "counted", counted);
            c.settle(None, counted);
        }
        if let Some(f) = served {
            f.call(counted);
        }
    });
}

/// Undo a dispatch's index insert on an instance that did no work for it.
fn take_back(instance: &Instance, chain: &[u64], inserted: kvgate_routing::index::Inserted) {
    instance.index.forget(chain, inserted);
    instance.series.index_size(instance.index.len());
}

/// Under `kv_aware`, count the instances this decision saw through the
/// approximate index, and why.
fn count_fallbacks(ep: &crate::fleet::Endpoint, input: &RouteInput, seen: &[crate::fleet::Seen]) {
    if !ep.config.routing.strategy.uses_events() {
        return;
    }
    let mut n = 0;
    for (inst, s) in ep.instances.iter().zip(seen) {
        if s.from_events {
            continue;
        }
        n += 1;
        let why = match s.trust {
            None => "not_configured",
            Some(t) if !t.is_live() => t.as_str(),
            Some(_) if input.kv.is_none() => "untokenized",
            Some(_) => "other",
        };
        telemetry::kv_fallback(ep.name(), &inst.id, why);
    }
    telemetry::kv_fallback_instances(ep.name(), n);
}

/// The share of the prompt the chosen instance is believed to hold.
fn matched_fraction(ep: &crate::fleet::Endpoint, request: &Request, load: &Load) -> f64 {
    let cost = ep.policy.costs(request, std::slice::from_ref(load));
    let cached = cost.and_then(|c| c.first().map(|c| c.cached_tokens));
    cached.unwrap_or(0) as f64 / request.prompt_tokens.max(1) as f64
}

/// The client's Display hides the cause ("client error (Connect)"); show the chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
