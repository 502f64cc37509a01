//! Distributed tracing: W3C trace context in and out, and spans exported over OTLP/HTTP when
//! `telemetry.otlp` is configured.
//!
//! Off (the default), nothing is exported and no trace context is parsed or made: a caller's
//! `traceparent` and `tracestate` (when well formed) are passed to the app unchanged, so
//! carapace is transparent to a trace it takes no part in. On, each call is a `call` span,
//! a child of the caller's `traceparent` (or the root of a new trace), with child spans for
//! the stages that take time (`signature`, `input_schema`, `upstream`, `output_schema`); the
//! app and, on the outbound role, the remote tool host receive a `traceparent` naming
//! carapace's span.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use serde::Deserialize;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// W3C trace context headers.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Whether spans are exported (set once, at start).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// `telemetry` in the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Export spans over OTLP/HTTP (protobuf); absent: nothing is exported.
    #[serde(default)]
    pub otlp: Option<OtlpConfig>,
}

/// Where and how spans are exported.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's traces endpoint, `http://HOST:PORT/v1/traces`.
    pub endpoint: String,
    /// `service.name` of the spans.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// How often a batch of spans is sent, in ms.
    #[serde(default = "default_export_interval_ms")]
    pub export_interval_ms: u64,
}

fn default_service_name() -> String {
    "carapace".into()
}
fn default_export_interval_ms() -> u64 {
    5_000
}

/// The exporter's handle: flushes what is left when shut down.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Send the spans not yet sent and stop.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("span export did not shut down cleanly: {e}");
        }
    }
}

/// The tracing layer that exports spans, and its handle. Spans of the `carapace` crates at
/// `debug` and above are exported whatever the log level.
pub fn otlp_layer<S>(
    cfg: &OtlpConfig,
) -> Result<(impl tracing_subscriber::Layer<S>, Exporter), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(cfg.endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(cfg.export_interval_ms))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(exporter)
                .with_batch_config(batch)
                .build(),
        )
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(cfg.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("carapace");
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("carapace", tracing::Level::DEBUG)
        .with_target("carapace_filters", tracing::Level::DEBUG);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter);
    EXPORTING.store(true, Ordering::Release);
    Ok((layer, Exporter { provider }))
}

/// Whether spans are exported.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Acquire)
}

/// Make `span` a child of the caller's trace context, when spans are exported.
pub fn adopt_caller_context(span: &tracing::Span, headers: &HeaderMap) {
    if !exporting() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    // A caller without a trace context starts a new trace.
    let _ = span.set_parent(parent);
}

/// The trace context headers a call sends on: the current span's when spans are exported,
/// otherwise the caller's own, unchanged when well formed.
pub fn outgoing_context(caller: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    if exporting() {
        let mut out = HeaderMap::new();
        TraceContextPropagator::new().inject_context(
            &tracing::Span::current().context(),
            &mut HeaderInjector(&mut out),
        );
        return out.into_iter().filter_map(|(k, v)| Some((k?, v))).collect();
    }
    let mut out = Vec::new();
    if let Some(tp) = caller.get(TRACEPARENT).filter(|v| is_traceparent(v)) {
        out.push((TRACEPARENT, tp.clone()));
        if let Some(ts) = caller
            .get(TRACESTATE)
            .filter(|v| v.len() <= 512 && v.to_str().is_ok())
        {
            out.push((TRACESTATE, ts.clone()));
        }
    }
    out
}

/// A W3C `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero.
pub fn is_traceparent(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |s: &[u8]| s.iter().any(|c| *c != b'0');
    b.len() == 55
        && hex(&b[0..2])
        && &b[0..2] != b"ff"
        && b[2] == b'-'
        && hex(&b[3..35])
        && nonzero(&b[3..35])
        && b[35] == b'-'
        && hex(&b[36..52])
        && nonzero(&b[36..52])
        && b[52] == b'-'
        && hex(&b[53..55])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_traceparents_are_passed_on() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(is_traceparent(&HeaderValue::from_static(ok)));
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            assert!(!is_traceparent(&HeaderValue::from_static(bad)), "{bad}");
        }
        let mut caller = HeaderMap::new();
        caller.insert(TRACEPARENT, HeaderValue::from_static(ok));
        caller.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        assert_eq!(outgoing_context(&caller).len(), 2);
        caller.insert(TRACEPARENT, HeaderValue::from_static("garbage"));
        assert!(outgoing_context(&caller).is_empty());
    }
}
