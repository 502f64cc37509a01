//! The skill-v1 front: `GET /manifest` and `POST /run` from callers, authenticated and decoded.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use carapace_filters::call::{
    CallOutcome, Credential, Principal, SkillCredential, ToolCall, ToolSpec,
};
use carapace_filters::canonical::{parse_strict, write_canonical, CanonicalError};
use carapace_filters::signature::{AuthMode, UnixClock};
use carapace_filters::{BoxFuture, Rejection};
use futures_util::future::Either;
use futures_util::FutureExt as _;
use http::{HeaderName, Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::Service;

use super::{
    DEFAULT_API_KEY_HEADER, DEFAULT_SIGNATURE_HEADER, MAX_NUMBER_CHARS, PROTOCOL_VERSION,
    SIGNED_FIELDS,
};
use crate::catalog::CatalogHandle;
use crate::errors;
use crate::front::{self, json_response, CallStack, Resp};
use crate::json_text;

/// Byte offset of the first number literal (outside strings) longer than
/// [`MAX_NUMBER_CHARS`], if any. Strings are skipped to their closing quote in one search;
/// a body without that many number characters in a row anywhere is not searched.
pub(super) fn overlong_number(body: &[u8]) -> Option<usize> {
    if !long_run(body) {
        return None;
    }
    let (mut i, mut run, mut start) = (0usize, 0usize, 0usize);
    while let Some(&b) = body.get(i) {
        if b == b'"' {
            // An unterminated string (or a final backslash) holds no number to its end.
            i = string_end(body, i + 1)?;
            run = 0;
            continue;
        }
        if number_char(&b) {
            if run == 0 {
                start = i;
            }
            run += 1;
            if run > MAX_NUMBER_CHARS {
                return Some(start);
            }
        } else {
            run = 0;
        }
        i += 1;
    }
    None
}

/// A character a number literal is written with.
fn number_char(b: &u8) -> bool {
    matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
}

/// Whether `body` has more than [`MAX_NUMBER_CHARS`] number characters in a row anywhere,
/// strings included. Such a run covers an offset that is a multiple of `MAX_NUMBER_CHARS + 1`,
/// so only the runs through those offsets are measured: a few bytes of a body read, not all.
fn long_run(body: &[u8]) -> bool {
    let stride = MAX_NUMBER_CHARS + 1;
    (0..body.len()).step_by(stride).any(|at| {
        number_char(&body[at]) && {
            let before = body[..at]
                .iter()
                .rev()
                .take_while(|b| number_char(b))
                .count();
            let after = body[at..].iter().take_while(|b| number_char(b)).count();
            before + after > MAX_NUMBER_CHARS
        }
    })
}

/// The offset after the quote closing the string whose contents start at `from`.
fn string_end(body: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', body.get(from..)?)?;
        match body[at] {
            b'"' => return Some(at + 1),
            // An escape: the next byte is part of it.
            _ => from = at + 2,
        }
    }
}

/// The skill-v1 error envelope (this front's one mapping of rejections).
pub fn error_response(r: &Rejection) -> Resp {
    let (code, status) = errors::skill_v1(r);
    let body = json!({
        "ok": false,
        "error_code": code,
        "message": errors::message(r),
        "details": errors::details(r),
    });
    let mut resp = json_response(status, &body);
    errors::refusal_headers(r, resp.headers_mut());
    resp.extensions_mut().insert(front::RefusalCode(code));
    resp
}

/// The skill-v1 front (its parts shared: a front is copied for every request).
#[derive(Clone)]
pub struct SkillV1Front(Arc<FrontParts>);

/// What the skill-v1 front holds.
pub struct FrontParts {
    skill_id: Arc<str>,
    mode: AuthMode,
    auth_header: HeaderName,
    catalog: Arc<CatalogHandle>,
    calls: CallStack,
    clock: UnixClock,
}

impl std::ops::Deref for SkillV1Front {
    type Target = FrontParts;
    fn deref(&self) -> &FrontParts {
        &self.0
    }
}

impl SkillV1Front {
    pub fn new(
        skill_id: &str,
        mode: AuthMode,
        header_name: Option<&str>,
        catalog: Arc<CatalogHandle>,
        calls: CallStack,
        clock: UnixClock,
    ) -> Self {
        let default = match mode {
            AuthMode::ApiKey => DEFAULT_API_KEY_HEADER,
            AuthMode::Hmac => DEFAULT_SIGNATURE_HEADER,
        };
        let auth_header = HeaderName::from_bytes(header_name.unwrap_or(default).as_bytes())
            .expect("validated in config");
        SkillV1Front(Arc::new(FrontParts {
            skill_id: skill_id.into(),
            mode,
            auth_header,
            catalog,
            calls,
            clock,
        }))
    }

    /// The manifest: capabilities as objects carrying their own schemas (the shape the public
    /// Vagus client reads), plus the top-level schemas of the text's shape when there is
    /// exactly one capability.
    fn manifest(&self, principal: &Principal) -> Resp {
        let catalog = self.catalog.load();
        let caps: Vec<Value> = front::visible_tools(&catalog, principal, (self.clock)())
            .iter()
            .map(|t| {
                json!({
                    "capability": t.name,
                    "description": t.description,
                    "input_schema": &**t.input.source(),
                    "output_schema": t.output.as_ref().map(|o| (**o.source()).clone()).unwrap_or(json!({})),
                })
            })
            .collect();
        let mut m = json!({
            "gateway_protocol_version": PROTOCOL_VERSION,
            "id": &*self.skill_id,
            "version": catalog.version.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").into()),
            "requires": {"auth": match self.mode { AuthMode::Hmac => "hmac-sha256", AuthMode::ApiKey => "api_key" }},
            "safety": {"data_handling": "no_secrets"},
        });
        if let [only] = caps.as_slice() {
            m["input_schema"] = only["input_schema"].clone();
            m["output_schema"] = only["output_schema"].clone();
        }
        m["capabilities"] = Value::Array(caps);
        json_response(StatusCode::OK, &m)
    }

    /// Decode a `POST /run` request into a call: the body must be one strict JSON object of
    /// the signed fields and `signature`, for this skill and a capability of the catalog. The
    /// call carries the canonical string and the credentials; the call stack checks them.
    ///
    /// The body is read in one pass ([`super::wire`]); what that reader does not take, the
    /// general decoding ([`Self::decode_general`]) decides, with the same result.
    pub fn decode(
        &self,
        req: &Request<Bytes>,
        principal: Arc<Principal>,
    ) -> Result<ToolCall, Rejection> {
        if let Some(at) = overlong_number(req.body()) {
            return Err(overlong(at));
        }
        if let Some(run) = super::wire::read_run(req.body()) {
            check_version(&run.gateway_protocol_version)?;
            self.check_skill(&run.skill_id)?;
            let tool = self.tool(&run.capability)?;
            if let Some(canonical) = run.canonical(req.body().len()) {
                let signed = Signed {
                    tool,
                    input: run.input,
                    timestamp: run.timestamp as i64,
                    nonce: run.nonce.into_owned(),
                    signature: run.signature.into_owned(),
                    canonical,
                };
                return self.call(req, principal, signed);
            }
        }
        self.decode_general(req, principal)
    }

    /// [`Self::decode`] through the strict parse into a `Value` and the canonical writer:
    /// every body, every refusal.
    #[doc(hidden)]
    pub fn decode_general(
        &self,
        req: &Request<Bytes>,
        principal: Arc<Principal>,
    ) -> Result<ToolCall, Rejection> {
        if let Some(at) = overlong_number(req.body()) {
            return Err(overlong(at));
        }
        let doc = parse_strict(req.body()).map_err(canonical_refusal)?;
        let Value::Object(mut fields) = doc else {
            return Err(Rejection::invalid("body must be a JSON object"));
        };
        // A field the signature does not cover could be read by the app unverified.
        if let Some(extra) = fields
            .keys()
            .find(|k| !SIGNED_FIELDS.contains(&k.as_str()) && k.as_str() != "signature")
        {
            return Err(Rejection::Unsigned(format!("field `{extra}`")));
        }
        if !matches!(fields.get("signature"), Some(Value::String(_))) {
            return Err(Rejection::AuthFailed("`signature` is missing"));
        }
        let str_field = |k: &'static str| {
            fields
                .get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| Rejection::InvalidRequest {
                    message: format!("`{k}` must be a string"),
                    path: Some(format!("/{k}")),
                })
        };
        check_version(str_field("gateway_protocol_version")?)?;
        self.check_skill(str_field("skill_id")?)?;
        let capability = str_field("capability")?;
        let nonce = str_field("nonce")?.to_string();
        let signature = str_field("signature")?.to_string();
        if !matches!(fields.get("input"), Some(Value::Object(_))) {
            return Err(Rejection::InvalidRequest {
                message: "`input` must be an object".into(),
                path: Some("/input".into()),
            });
        }
        let timestamp = fields
            .get("timestamp")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite() && *t >= 0.0 && t.fract() == 0.0 && *t < 9.0e15)
            .ok_or_else(|| Rejection::InvalidRequest {
                message: "`timestamp` must be a whole, non-negative number of Unix ms".into(),
                path: Some("/timestamp".into()),
            })?;
        let tool = self.tool(capability)?;
        // The signed form is the body without `signature`: canonicalize it in place, then move
        // the input out of it.
        fields.remove("signature");
        let signed = Value::Object(fields);
        // The form is about as long as the body (no whitespace, nothing added but escapes).
        let mut canonical = String::with_capacity(req.body().len());
        write_canonical(&signed, &mut canonical).map_err(canonical_refusal)?;
        let Value::Object(mut fields) = signed else {
            unreachable!("built as an object above")
        };
        let signed = Signed {
            tool,
            input: fields.remove("input").expect("checked above"),
            timestamp: timestamp as i64,
            nonce,
            signature,
            canonical,
        };
        self.call(req, principal, signed)
    }

    /// The body is for this skill.
    fn check_skill(&self, skill_id: &str) -> Result<(), Rejection> {
        if skill_id != &*self.skill_id {
            return Err(Rejection::NoRoute(format!(
                "skill `{skill_id}` is not served here"
            )));
        }
        Ok(())
    }

    /// The catalog's tool for `capability`, once discovery has succeeded.
    fn tool(&self, capability: &str) -> Result<Arc<ToolSpec>, Rejection> {
        if !self.catalog.discovered() {
            return Err(Rejection::AppUnavailable(
                "tool discovery has not succeeded yet".into(),
            ));
        }
        self.catalog.lookup(capability)
    }

    /// The call of a decoded body, with the request's credential headers.
    fn call(
        &self,
        req: &Request<Bytes>,
        principal: Arc<Principal>,
        signed: Signed,
    ) -> Result<ToolCall, Rejection> {
        // A credential header that is present must be readable: never treat it as absent.
        let header = |h: &HeaderName| match req.headers().get(h) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(|s| Some(s.to_owned()))
                .map_err(|_| Rejection::AuthFailed("malformed credential header")),
        };
        let (api_key, header_signature) = match self.mode {
            AuthMode::ApiKey => (header(&self.auth_header)?, None),
            AuthMode::Hmac => (None, header(&self.auth_header)?),
        };
        let idempotency_key = crate::front::idempotency_header(req.headers())?;
        Ok(ToolCall {
            call_id: signed.nonce.as_str().into(),
            tool: signed.tool,
            tenant_id: None,
            args: signed.input,
            context: None,
            timeout_ms: None,
            idempotency_key,
            principal,
            request_id: None,
            trace_context: Vec::new(),
            extensions: Default::default(),
            credential: Credential::Skill(Box::new(SkillCredential {
                api_key,
                header_signature,
                signature_hex: signed.signature,
                canonical: signed.canonical,
                timestamp_ms: signed.timestamp,
                nonce: signed.nonce,
                scope: self.skill_id.clone(),
            })),
        })
    }
}

/// What a `/run` body gives a call: its tool, input, signed fields and signed form.
struct Signed {
    tool: Arc<ToolSpec>,
    input: Value,
    timestamp: i64,
    nonce: String,
    signature: String,
    canonical: String,
}

/// The body is of the protocol version this front speaks.
fn check_version(version: &str) -> Result<(), Rejection> {
    match version {
        PROTOCOL_VERSION => Ok(()),
        _ => Err(Rejection::ProtocolVersionUnsupported(version.into())),
    }
}

fn overlong(at: usize) -> Rejection {
    Rejection::invalid(format!(
        "number at byte {at} is longer than {MAX_NUMBER_CHARS} characters"
    ))
}

/// A body the strict parse or the canonical writer refuses.
fn canonical_refusal(e: CanonicalError) -> Rejection {
    match e {
        CanonicalError::UncoveredMember { path } => {
            Rejection::Unsigned(format!("the `__proto__` member of {path}"))
        }
        e => Rejection::invalid(e.to_string()),
    }
}

pub(super) fn outcome_response(outcome: &CallOutcome, duration_ms: u64) -> Resp {
    match outcome {
        CallOutcome::Ok { output, meta, .. } => {
            // Members in the order `json!` would write them (sorted), `output` copied once.
            let mut body = Vec::with_capacity(128);
            json_text::object(&mut body, |o| {
                match meta {
                    // The app's meta, with carapace's `duration_ms` in its sorted place.
                    Some(Value::Object(m)) => {
                        let mut m = m.clone();
                        m.insert("duration_ms".into(), json!(duration_ms));
                        o.value("meta", &Value::Object(m))
                    }
                    _ => o.object("meta", |m| {
                        m.u64("duration_ms", duration_ms);
                    }),
                };
                o.bool("ok", true).value("output", output);
            });
            front::json_body(StatusCode::OK, body)
        }
        CallOutcome::AppError {
            code,
            message,
            details,
            ..
        } => {
            let mut body = json!({"ok": false, "error_code": code, "message": message});
            if let Some(d) = details {
                body["details"] = d.clone();
            }
            json_response(StatusCode::OK, &body)
        }
    }
}

impl SkillV1Front {
    /// `POST /run`: the request is decoded and the call stage started here; the returned
    /// future holds only what the answer needs (not the request, nor the call).
    fn run(
        &self,
        req: &mut Request<Bytes>,
    ) -> impl Future<Output = Result<Resp, Rejection>> + Send + 'static {
        let started = carapace_filters::clock::now();
        let principal = match front::principal(req) {
            Ok(p) => p,
            Err(r) => return Either::Left(std::future::ready(Err(r))),
        };
        let call = match self.decode(req, principal) {
            Ok(mut call) => {
                call.request_id = crate::edge::request_id(req);
                crate::ops::call_fields::record_tool(&call.tool);
                call.trace_context = crate::telemetry::outgoing_context(req.headers());
                call
            }
            Err(r) => {
                let resp = front::refused(&r, error_response);
                return Either::Left(std::future::ready(Ok(resp)));
            }
        };
        let run = front::run_call(
            &self.calls,
            call,
            started,
            std::mem::take(req.extensions_mut()),
            |o, _, _, ms| outcome_response(o, ms),
            |r, _, _, _| error_response(r),
        );
        Either::Right(run.map(Ok))
    }
}

impl Service<Request<Bytes>> for SkillV1Front {
    type Response = Resp;
    type Error = Rejection;
    type Future = BoxFuture<Result<Resp, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        if req.method() == Method::POST && req.uri().path() == "/run" {
            return Box::pin(self.run(&mut req));
        }
        let this = self.clone();
        Box::pin(async move {
            match (req.method(), req.uri().path()) {
                (&Method::GET, "/manifest") => Ok(this.manifest(&*front::principal(&req)?)),
                (_, "/manifest") => Err(Rejection::MethodNotAllowed("GET".into())),
                (_, "/run") => Err(Rejection::MethodNotAllowed("POST".into())),
                (m, p) => Err(Rejection::NoRoute(format!("{m} {p}"))),
            }
        })
    }
}
