//! Optional OpenTelemetry traces: every request's span exported over OTLP/HTTP
//! (protobuf, sent with reqwest — no gRPC stack), and W3C `traceparent` sent
//! to the upstream so vLLM (`--otlp-traces-endpoint`) continues the trace.
//!
//! Off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended) is set, as the
//! OpenTelemetry SDKs are configured everywhere. Off costs nothing: no layer
//! is installed and [`inject`] returns after one relaxed load.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ON: AtomicBool = AtomicBool::new(false);

/// The collector's traces URL from the standard environment variables, if any.
pub fn endpoint_from_env() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
        var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    })
}

/// Flushes and stops the exporter when dropped (at shutdown). Dropping it
/// blocks until the last batch is sent: drop it off the async runtime.
#[derive(Debug)]
pub struct Guard(SdkTracerProvider);

impl Guard {
    /// Turn on the request spans and `traceparent`: call once the layer is in
    /// the installed subscriber, so no span callsite is first met (and its
    /// interest cached) while traces are on but nothing listens yet.
    pub fn enable(&self) {
        ON.store(true, Ordering::Relaxed);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        ON.store(false, Ordering::Relaxed);
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry exporter did not shut down cleanly");
        }
    }
}

/// A `tracing` layer exporting spans to `endpoint` (an OTLP/HTTP traces URL),
/// and the guard that flushes it; [`Guard::enable`] turns traces on.
pub fn layer<S>(
    endpoint: &str,
) -> anyhow::Result<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    Guard,
)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "kvgate".to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("kvgate");
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Guard(provider),
    ))
}

/// Add the current span's W3C `traceparent` to an upstream request.
pub fn inject(headers: &mut HeaderMap) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
    });
}

/// The per-request span of the trace layer: tower-http's default (`request`,
/// DEBUG, method, URI, version) while traces are off, so logs read as before;
/// with traces on, INFO (exported at the default filter) and the child of the
/// client's `traceparent` when it sent one.
#[derive(Debug, Clone, Copy, Default)]
pub struct MakeSpan;

impl<B> tower_http::trace::MakeSpan<B> for MakeSpan {
    fn make_span(&mut self, req: &axum::http::Request<B>) -> tracing::Span {
        if !ON.load(Ordering::Relaxed) {
            return tower_http::trace::DefaultMakeSpan::new().make_span(req);
        }
        let span = tracing::info_span!(
            "request",
            method = %req.method(),
            uri = %req.uri(),
            version = ?req.version(),
        );
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&opentelemetry_http::HeaderExtractor(req.headers()))
        });
        // A context without a remote span leaves the request span a root.
        let _ = span.set_parent(parent);
        span
    }
}
