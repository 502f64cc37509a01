//! The skill-v1 back: signed `POST /run` calls to a legacy skill and the decoding of its answers.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::canonical::{canonical_string, HmacSha256Key};
use carapace_filters::signature::AuthMode;
use carapace_filters::{BoxFuture, Rejection};
use http::{HeaderName, Method, StatusCode};
use serde_json::{json, Value};
use tower::Service;

use super::DEFAULT_API_KEY_HEADER;
use crate::config::Secret;
use crate::upstream::AppClient;

/// How carapace signs calls to a skill-v1 app.
#[derive(Clone, Debug)]
pub struct AppSigning {
    mode: AuthMode,
    header: Option<HeaderName>,
    secret: Secret,
    /// The secret's HMAC key, made ready once.
    key: HmacSha256Key,
}

impl AppSigning {
    /// Sign with `secret` in `mode`, repeating the signature (HMAC) or sending the key (API
    /// key) in `header`.
    pub fn new(mode: AuthMode, header: Option<HeaderName>, secret: Secret) -> Self {
        let key = HmacSha256Key::new(secret.bytes());
        AppSigning {
            mode,
            header,
            secret,
            key,
        }
    }
}

/// The skill-v1 back: calls `POST /run` on a legacy skill, signing each call itself with a
/// fresh timestamp and nonce when the skill checks signatures.
///
/// Its parts are shared: each call's future holds one reference count, not a copy of each.
#[derive(Clone, Debug)]
pub struct SkillV1Back(Arc<SkillV1BackParts>);

/// What a [`SkillV1Back`] holds.
#[derive(Debug)]
struct SkillV1BackParts {
    app: AppClient,
    skill_id: Box<str>,
    protocol_version: Box<str>,
    signing: Option<AppSigning>,
}

impl SkillV1Back {
    pub fn new(
        app: AppClient,
        skill_id: &str,
        protocol_version: &str,
        signing: Option<AppSigning>,
    ) -> Self {
        SkillV1Back(Arc::new(SkillV1BackParts {
            app,
            skill_id: skill_id.into(),
            protocol_version: protocol_version.into(),
            signing,
        }))
    }
}

/// The signed `/run` body and headers for a call.
pub fn encode_run(
    call: &ToolCall,
    skill_id: &str,
    protocol_version: &str,
    signing: Option<&AppSigning>,
    now_ms: u64,
    nonce: &str,
) -> Result<(Value, http::HeaderMap), Rejection> {
    let mut body = json!({
        "gateway_protocol_version": protocol_version,
        "skill_id": skill_id,
        "capability": call.tool.app_name(),
        "input": call.args,
        "timestamp": now_ms,
        "nonce": nonce,
    });
    let mut headers = carapace_filters::call::app_headers(call);
    if let Some(s) = signing {
        let secret_value = || {
            http::HeaderValue::from_bytes(s.secret.bytes())
                .map_err(|_| Rejection::Internal("app secret is not a valid header value".into()))
        };
        match s.mode {
            AuthMode::Hmac => {
                let canonical =
                    canonical_string(&body).map_err(|e| Rejection::invalid(e.to_string()))?;
                let sig = s.key.sign_hex(canonical.as_bytes());
                if let Some(h) = &s.header {
                    headers.insert(h.clone(), http::HeaderValue::from_str(&sig).expect("hex"));
                }
                body["signature"] = json!(sig);
            }
            AuthMode::ApiKey => {
                let h = s
                    .header
                    .clone()
                    .unwrap_or(HeaderName::from_static(DEFAULT_API_KEY_HEADER));
                headers.insert(h, secret_value()?);
                body["signature"] = json!("api_key");
            }
        }
    }
    Ok((body, headers))
}

/// Decode a skill's `/run` answer.
pub fn decode_run_response(status: StatusCode, body: &[u8]) -> Result<CallOutcome, Rejection> {
    // Like the Vagus client: a non-2xx answer is an HTTP failure of the skill whatever code
    // it carries (a 401 from the skill means carapace's own signing is misconfigured, not
    // that the caller failed to authenticate).
    if !status.is_success() {
        return Err(Rejection::AppHttp(status.as_u16()));
    }
    let doc: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| Rejection::AppInvalid(format!("answer is not JSON: {e}")))?
    };
    let app_error = |doc: &Value| CallOutcome::AppError {
        code: doc["error_code"]
            .as_str()
            .unwrap_or("SKILL_HTTP_ERROR")
            .to_string(),
        message: doc["message"].as_str().unwrap_or("").to_string(),
        details: doc.get("details").cloned(),
        retryable: false,
        content: None,
    };
    match doc.get("ok") {
        Some(Value::Bool(true)) => Ok(CallOutcome::Ok {
            output: doc.get("output").cloned().unwrap_or(Value::Null),
            meta: doc.get("meta").cloned(),
            content: None,
        }),
        Some(_) => Ok(app_error(&doc)),
        None => Err(Rejection::AppInvalid("answer has no `ok` flag".into())),
    }
}

impl Service<ToolCall> for SkillV1Back {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let this = self.0.clone();
        Box::pin(async move {
            call_skill(
                &this.app,
                &this.skill_id,
                &this.protocol_version,
                this.signing.as_ref(),
                &call,
            )
            .await
        })
    }
}

/// Call a skill's `/run` with a fresh timestamp and nonce, signed when `signing` is set.
pub async fn call_skill(
    app: &AppClient,
    skill_id: &str,
    protocol_version: &str,
    signing: Option<&AppSigning>,
    call: &ToolCall,
) -> Result<CallOutcome, Rejection> {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let (body, headers) = encode_run(
        call,
        skill_id,
        protocol_version,
        signing,
        carapace_filters::unix_now_ms(),
        &nonce,
    )?;
    let bytes = serde_json::to_vec(&body).expect("serializes");
    let resp = app
        .send(Method::POST, "/run", headers, Bytes::from(bytes))
        .await?;
    decode_run_response(resp.status, &resp.body)
}
