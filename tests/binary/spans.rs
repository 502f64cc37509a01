//! Distributed tracing: spans exported to an OTLP receiver.

use super::*;

/// One exported span: trace id, span id, parent span id (hex), name, string attributes.
#[derive(Debug, Clone)]
struct SpanSeen {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: Vec<(String, String)>,
}

fn spans_in(bodies: &[bytes::Bytes]) -> Vec<SpanSeen> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message;
    let mut out = Vec::new();
    for body in bodies {
        let req = ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
        for span in req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            let attributes = span
                .attributes
                .iter()
                .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some((kv.key.clone(), s.clone())),
                    _ => None,
                })
                .collect();
            out.push(SpanSeen {
                trace_id: hex::encode(&span.trace_id),
                span_id: hex::encode(&span.span_id),
                parent: hex::encode(&span.parent_span_id),
                name: span.name.clone(),
                attributes,
            });
        }
    }
    out
}

/// Spans go to an OTLP receiver: the call continues the caller's trace, the stages are its
/// children, and the app is told carapace's span as its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_their_parent_links() {
    use std::sync::{Arc, Mutex};
    let env = Env::new().await;
    let bodies: Arc<Mutex<Vec<bytes::Bytes>>> = Arc::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = l.local_addr().unwrap();
    let sink = bodies.clone();
    common::serve_http1(l, move |req: http::Request<hyper::body::Incoming>| {
        let sink = sink.clone();
        async move {
            use http_body_util::BodyExt;
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            if path == "/v1/traces" {
                sink.lock().unwrap().push(body);
            }
            let mut r = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
            r.headers_mut()
                .insert("content-type", "application/x-protobuf".parse().unwrap());
            r
        }
    });
    let cfg = env.path().join("carapace.yaml");
    let extra = format!(
        "telemetry: {{ otlp: {{ endpoint: \"http://{otlp}/v1/traces\", export_interval_ms: 100 }} }}"
    );
    std::fs::write(&cfg, tools_config(&env, &extra)).unwrap();
    let mut srv = Serve::spawn(&cfg, &env.path().join("serve.log"), &[]);
    let sock = sock(&env);
    wait_serving(&sock, "/v1/tools", "memory.query").await;

    let (trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace}-{caller_span}-01");
    let mut body = call("memory.query", json!({"query": "x"}));
    body["context"]["trace_id"] = json!("ctx-trace-7");
    let reply = unix(&sock)
        .post_json("/v1/tools/call", &[("traceparent", &traceparent)], &body)
        .await
        .unwrap();
    assert_ok(&reply);
    let to_app = env.app.received().last().unwrap().headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(to_app.starts_with(&format!("00-{trace}-")), "{to_app}");

    let deadline = Instant::now() + WAIT;
    let (call_span, stages) = loop {
        let spans = spans_in(&bodies.lock().unwrap());
        let call_span = spans
            .iter()
            .find(|s| s.name == "call" && s.trace_id == trace)
            .cloned();
        if let Some(c) = call_span {
            let stages: Vec<SpanSeen> = spans
                .iter()
                .filter(|s| s.parent == c.span_id)
                .cloned()
                .collect();
            if stages.iter().any(|s| s.name == "upstream") {
                break (c, stages);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no spans: {spans:?}\n{}",
            srv.log()
        );
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(call_span.parent, caller_span, "{call_span:?}");
    let attr = |k: &str| {
        call_span
            .attributes
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(attr("context_trace_id").as_deref(), Some("ctx-trace-7"));
    assert_eq!(attr("tool").as_deref(), Some("memory.query"));
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    for stage in ["input_schema", "upstream", "output_schema"] {
        assert!(
            names.contains(&stage),
            "{stage} not a child of the call: {names:?}"
        );
    }
    assert!(stages.iter().all(|s| s.trace_id == trace));
    assert_eq!(
        to_app,
        format!("00-{trace}-{}-01", call_span.span_id),
        "the app's parent is carapace's call span"
    );
    srv.stop().await;
}
