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
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use kvgate_routing::{Load, Reason, Request};

use super::attempt::{self, Sent};
use super::dispatch::Dispatch;
use super::headers;
use super::respond::{Calibration, client_response};
use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Endpoint, Instance, Runtime, Seen};
use crate::openai::rewrite_stream::Issuer;
use crate::request::RouteInput;
use crate::route::{Placement, Route};
use crate::telemetry;

/// One request on its way upstream.
#[derive(Debug)]
pub struct Forward<'a> {
    pub runtime: &'a Runtime,
    /// Whose request it is (for the console's decision ring).
    pub tenant: &'a Arc<str>,
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
    /// queue promised it (`fleet::queue::Reservation`), so that it is not counted
    /// twice while the request runs.
    pub until_claimed: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
}

/// Where the request went and why, for logs.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub instance: Arc<Instance>,
    pub reason: Reason,
    pub attempts: usize,
}

/// Try the plan's instances in order until one answers.
pub async fn forward(mut f: Forward<'_>) -> Result<(Response, Outcome), ApiError> {
    let ep = Arc::clone(&f.input.endpoint);
    let started = Instant::now();
    let (loads, seen) = f.input.view();
    remember_for_warmup(&ep, &f.input);
    let request = f.input.routing_request();
    let plan = plan(&ep, &f.input.placement, &request, &loads)?;
    let routing_took = started.elapsed();
    let upstream_headers = upstream_headers(&ep, f.headers);
    let mut failed = Failure::default();
    for (attempt, &idx) in plan.order.iter().enumerate() {
        let Some((instance, target)) = usable(&ep, idx, f.path, &mut failed) else {
            continue;
        };
        let (reason, decision) = match attempt {
            0 => (plan.reason, plan.reason.as_str()),
            _ => (Reason::Overflow, "failover"),
        };
        instance.series.routing_decision(decision, routing_took);
        if attempt == 0 && f.input.placement == Placement::Policy {
            count_fallbacks(&ep, &f.input, &seen);
        }
        // An upload can be sent once: not again after a refused connection.
        let Some(body) = f.body() else { break };
        let load = loads.get(idx).copied().unwrap_or_default();
        let mut dispatch =
            Dispatch::claim(&ep, instance, &f.input, (&request, &load), seen.get(idx));
        drop(f.until_claimed.take());
        let (response, took) = match attempt::send(
            f.runtime,
            ep.name(),
            instance,
            f.request(body, target, &upstream_headers),
        )
        .await
        {
            Sent::Answered(response, took) => (response, took),
            Sent::Failed(kind, why) => {
                dispatch.no_work();
                failed = Failure::new(kind, why);
                continue;
            }
            Sent::TimedOut(e) => return Err(e),
        };
        let status = response.status();
        // Overloaded, starting, or refusing the request (context too long,
        // rate limited): it cached nothing, even when its answer is the client's.
        let no_work = matches!(
            status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE
        );
        if no_work || status.is_client_error() {
            dispatch.no_work();
        }
        if no_work && attempt + 1 < plan.order.len() {
            telemetry::retry(ep.name(), &instance.id, "status");
            failed = Failure::new(
                ErrorKind::BadGateway,
                format!("an instance answered {status}"),
            );
            continue;
        }
        instance.series.response_headers(took);
        if !no_work && !status.is_client_error() {
            note_session(&ep, (&f.input, &request), instance, &loads, idx);
        }
        share_placement(f.runtime, &f.input, instance, &dispatch, status);
        let outcome = Outcome::new(instance, reason, attempt);
        let from_events = seen.get(idx).is_some_and(|s| s.from_events);
        let decision = record(
            &f,
            (&request, &loads),
            Some((&instance.id, idx)),
            (decision, attempt + 1),
        );
        return Ok((
            answer(
                (f.runtime, &f.input, f.keepalive),
                response,
                dispatch,
                (started, decision),
                from_events,
            )
            .await,
            outcome,
        ));
    }
    let attempts = plan.order.len();
    record(&f, (&request, &loads), None, ("unavailable", attempts)).done(503, started.elapsed());
    Err(failed.into_error(&ep, &plan, &loads))
}

/// Put the decision in the console's ring (`telemetry::live`): a few
/// atomics and one allocation, no lock.
fn record(
    f: &Forward<'_>,
    (request, loads): (&Request, &[Load]),
    chosen: Option<(&String, usize)>,
    (reason, attempts): (&'static str, usize),
) -> Arc<telemetry::live::Decision> {
    let ep = &f.input.endpoint;
    let matched = chosen
        .and_then(|(_, i)| loads.get(i))
        .map_or(0, |l| l.matched_blocks as u64);
    f.runtime
        .live
        .decisions
        .push(telemetry::live::Decision::new(
            Arc::clone(f.tenant),
            (
                f.input.route.label(),
                ep.name(),
                ep.config.routing.strategy.as_str(),
            ),
            (chosen.map(|(id, _)| id.clone()), chosen.map(|(_, i)| i)),
            (reason, u32::try_from(attempts).unwrap_or(u32::MAX)),
            f.input.stream,
            f.input.body.len() as u64,
            matched,
            (*request, loads.to_vec()),
        ))
}

/// Where a session lives, once `instance` has served its turn: counted there
/// as a session started on its first turn (not on an instance that failed
/// it), once, and again where a session moved — a hinted one off the
/// instance that served it last, a conversation's later turn, placed by the
/// strategy, onto an instance without its history while another holds it
/// (the cost model, a named home or a failover took it there) — so that new
/// sessions start away from where moved ones went; a hinted session's home
/// is remembered (`fleet::session_homes`).
fn note_session(
    ep: &Endpoint,
    (input, request): (&RouteInput, &Request),
    instance: &Arc<Instance>,
    loads: &[Load],
    at: usize,
) {
    let hosts = loads.get(at).is_some_and(|l| l.hosts_session);
    let moved = if input.hinted {
        !hosts && loads.iter().any(|l| l.hosts_session)
    } else {
        let history = |l: &Load| ep.policy.holds_history(request, l);
        !input.starts_session
            && input.placement == Placement::Policy
            && loads.get(at).is_some_and(|l| !history(l))
            && loads.iter().any(history)
    };
    if (input.starts_session && !hosts) || moved {
        instance.session_started();
    }
    if input.hinted {
        ep.sessions
            .set(input.key, instance, crate::fleet::instance::now_ms());
    }
}

/// A placement `longest_prefix` remembers, told to the other replicas
/// (`fleet::peers`) once the instance has taken the request. `kv_aware`'s
/// replicas learn the same from the engines' events.
fn share_placement(
    runtime: &Runtime,
    input: &RouteInput,
    instance: &Instance,
    dispatch: &Dispatch<'_>,
    status: StatusCode,
) {
    let Some(peers) = &runtime.peers else { return };
    let strategy = input.endpoint.config.routing.strategy;
    if status.is_success() && dispatch.inserted().is_some() && !strategy.uses_events() {
        peers.routed(input.endpoint.name(), &instance.id, &input.chain);
    }
}

impl Outcome {
    fn new(instance: &Arc<Instance>, reason: Reason, attempt: usize) -> Self {
        let instance = Arc::clone(instance);
        let attempts = attempt + 1;
        Self {
            instance,
            reason,
            attempts,
        }
    }
}

impl Forward<'_> {
    /// One attempt's request to the instance at `uri`.
    fn request(
        &self,
        body: Body,
        (uri, host): Target,
        headers: &HeaderMap,
    ) -> axum::http::Request<Body> {
        let mut req = axum::http::Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers.clone();
        // Set here so that hyper's client need not format it per request.
        if let Some(host) = host {
            req.headers_mut().insert(header::HOST, host);
        }
        req
    }

    /// The body of the next attempt; `None` when the upload it was has gone.
    fn body(&mut self) -> Option<Body> {
        match self.upload.take() {
            Some(upload) => Some(upload),
            None if self.input.upload => None,
            None => Some(Body::from(self.input.body.clone())),
        }
    }
}

/// The client's answer from the instance's: an error answer read whole
/// while the slot is held; a success streamed through, the index checked
/// against its usage unless the engine's events spoke for the instance.
async fn answer(
    (runtime, input, keepalive): (&Runtime, &RouteInput, bool),
    response: axum::http::Response<hyper::body::Incoming>,
    dispatch: Dispatch<'_>,
    (started, decision): (Instant, Arc<telemetry::live::Decision>),
    from_events: bool,
) -> Response {
    let ep = &input.endpoint;
    let server = &runtime.config.server;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let resp = super::relay_error::relay(response, server.timeouts.idle).await;
        drop(dispatch);
        decision.done(status.as_u16(), started.elapsed());
        ep.series.duration(input.route, started.elapsed());
        return resp;
    }
    let calibration = dispatch
        .inserted()
        .filter(|_| !from_events)
        .map(|inserted| Calibration {
            inserted,
            block_tokens: ep.density.block_tokens(ep.config.routing.block_chars),
            prompt_tokens: input.prompt_tokens,
        });
    let guard = dispatch.into_guard();
    let issuer = input.ids.clone().map(|scope| Issuer {
        scope,
        endpoint: ep.name().to_owned(),
        instance: guard.instance().id.clone(),
    });
    let keepalive = server.sse_keepalive.filter(|_| keepalive);
    client_response(
        response,
        guard,
        (keepalive, server.timeouts.idle),
        (input.stream, issuer),
        (input.admission.clone(), calibration, units(input)),
        (started, input.route, decision),
    )
}

/// What the answer's usage teaches of the engine's tokens a character: the
/// prompt's characters, when the gateway saw it whole, on a route whose
/// `prompt_tokens` counts that prompt (generation, not embeddings).
fn units(input: &RouteInput) -> Option<super::respond::Units> {
    let generates = matches!(
        input.route,
        Route::Chat | Route::Completions | Route::Messages | Route::Responses
    );
    let chars = input.prompt_chars.filter(|_| generates)?;
    Some((Arc::clone(&input.endpoint.density), chars))
}

/// Why no instance took the request, as the last attempt left it.
struct Failure {
    kind: ErrorKind,
    error: String,
}

impl Default for Failure {
    fn default() -> Self {
        Self::new(ErrorKind::Unavailable, "no instance configured")
    }
}

impl Failure {
    fn new(kind: ErrorKind, error: impl Into<String>) -> Self {
        Self {
            kind,
            error: error.into(),
        }
    }

    fn into_error(self, ep: &Endpoint, plan: &kvgate_routing::Plan, loads: &[Load]) -> ApiError {
        let Failure {
            mut kind,
            mut error,
        } = self;
        // Every candidate was already ejected or cooling down before this
        // request tried it as a last resort: no healthy instance, worth a retry.
        let none_healthy = !plan
            .order
            .iter()
            .any(|&i| loads.get(i).is_some_and(|l| l.available));
        if none_healthy && kind == ErrorKind::BadGateway {
            kind = ErrorKind::Unavailable;
            error = format!("no healthy instance (last attempt: {error})");
        }
        ApiError::new(
            kind,
            format!(
                "no instance of endpoint {} could take the request: {error}",
                ep.name()
            ),
        )
    }
}

/// The plan's `idx`th instance and the URI of the request on it, unless it
/// is draining or its URL makes no URI (nothing has been charged to it yet).
fn usable<'a>(
    ep: &'a Endpoint,
    idx: usize,
    path: &str,
    failed: &mut Failure,
) -> Option<(&'a Arc<Instance>, Target)> {
    let instance = ep.instances.get(idx)?;
    if instance.is_draining() {
        failed.error = "every instance is draining".to_owned();
        return None;
    }
    let Some(target) = instance.request_target(path) else {
        tracing::warn!(endpoint = %ep.name(), instance = %instance.id, "the instance URL and the request path make no URI; trying the next instance");
        failed.error = "the instance URL is not a valid URI".to_owned();
        return None;
    };
    Some((instance, target))
}

/// Where an attempt goes: the URI, and the `Host` header for it.
type Target = (axum::http::Uri, Option<axum::http::HeaderValue>);

/// The client's headers as the instance gets them: hop-by-hop and the
/// client's credential dropped, the trace continued, the endpoint's own
/// credential added.
fn upstream_headers(ep: &Endpoint, client: &HeaderMap) -> HeaderMap {
    let mut h = headers::upstream_request(client);
    // A no-op unless OpenTelemetry is on.
    crate::telemetry::otel::inject(&mut h);
    if let Some(auth) = &ep.config.upstream_authorization {
        h.insert(header::AUTHORIZATION, auth.clone());
    }
    h
}

/// Warm-up replays chat-like prompts the strategy placed.
fn remember_for_warmup(ep: &Endpoint, input: &RouteInput) {
    if ep.config.routing.warmup.is_some()
        && input.placement == Placement::Policy
        && matches!(
            input.route,
            Route::Chat | Route::Completions | Route::Native
        )
    {
        ep.hot.record(
            input.key,
            input.route.upstream_path(),
            &input.body,
            &input.chain,
        );
    }
}

/// The instances to try, in order, as the request's placement says.
fn plan(
    ep: &Endpoint,
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

/// Under `kv_aware`, count the instances this decision saw through the
/// approximate index, and why.
fn count_fallbacks(ep: &Endpoint, input: &RouteInput, seen: &[Seen]) {
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
