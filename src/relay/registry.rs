//! Who offers which tools, and the calls waiting for their answers.
//!
//! A registration is one caller's open stream: its `caller_id`, the principal that opened it,
//! its tools (registered as `<caller_id>_<name>`), the sender of its events and its pending
//! requests. Only the stream that registered a tool answers for it: an answer names the
//! stream (`stream_id`, unguessable, sent as the stream's first event) and comes from the same
//! principal. When the stream ends, every pending call fails at once and the tools are
//! withdrawn; opening a stream again registers them again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use carapace_filters::call::{CallOutcome, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use carapace_filters::Rejection;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::catalog::CatalogHandle;
use crate::config::CallerToolsConfig;

/// Why a registration or an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("unknown or finished request_id")]
    UnknownRequest,
    #[error("the result has {0} bytes, over the limit of {1}")]
    ResultTooLarge(usize, usize),
}

impl RelayError {
    /// The rejection a front answers with.
    pub fn rejection(&self) -> Rejection {
        match self {
            RelayError::Invalid(m) => Rejection::InvalidRequest {
                message: m.clone(),
                path: None,
            },
            RelayError::Forbidden(m) => Rejection::Forbidden(m.clone()),
            RelayError::UnknownRequest => Rejection::InvalidRequest {
                message: self.to_string(),
                path: Some("/request_id".into()),
            },
            RelayError::ResultTooLarge(_, limit) => Rejection::PayloadTooLarge {
                limit: *limit as u64,
            },
        }
    }
}

/// What a caller answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Result(Value),
    Error(String),
    /// No answer the agent can use (the caller's was over the size limit).
    Unusable(String),
}

/// An event on a caller's stream.
#[derive(Debug, Clone)]
pub enum Event {
    /// The first: the stream's id and the names the tools are offered under.
    Registered {
        stream_id: String,
        tools: Vec<String>,
    },
    /// A call for the caller to run.
    Request {
        request_id: String,
        tool: String,
        arguments: Value,
    },
}

impl Event {
    /// The JSON of the SSE `data` line.
    pub fn to_json(&self) -> Value {
        match self {
            Event::Registered { stream_id, tools } => json!({
                "type": "caller_tools_registered", "stream_id": stream_id, "tools": tools,
            }),
            Event::Request {
                request_id,
                tool,
                arguments,
            } => json!({
                "type": "caller_tool_request", "request_id": request_id, "tool": tool,
                "arguments": arguments,
            }),
        }
    }
}

struct Registration {
    stream_id: String,
    caller_id: String,
    principal: String,
    /// Offered name → (declared name, spec).
    tools: BTreeMap<String, (String, Arc<ToolSpec>)>,
    events: mpsc::Sender<Event>,
    pending: HashMap<String, oneshot::Sender<Answer>>,
}

/// The registrations of every connected caller.
pub struct CallerTools {
    config: CallerToolsConfig,
    /// `tools.<name>.timeout_ms_max` of the configuration, by offered name.
    timeout_caps: BTreeMap<String, u64>,
    catalog: Arc<CatalogHandle>,
    /// By caller id.
    callers: Mutex<HashMap<String, Registration>>,
}

/// Held by a stream: dropping it (the caller went away) ends the registration.
pub struct StreamGuard {
    relay: Arc<CallerTools>,
    caller_id: String,
    stream_id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.relay.end(&self.caller_id, &self.stream_id);
    }
}

/// A declared tool, before checking.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Declared {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub input_schema: Option<Value>,
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl CallerTools {
    pub fn new(config: CallerToolsConfig, catalog: Arc<CatalogHandle>) -> Arc<Self> {
        Self::with_timeout_caps(config, catalog, BTreeMap::new())
    }

    /// With `tools.<name>.timeout_ms_max` lowering the wait for those offered names.
    pub fn with_timeout_caps(
        config: CallerToolsConfig,
        catalog: Arc<CatalogHandle>,
        timeout_caps: BTreeMap<String, u64>,
    ) -> Arc<Self> {
        Arc::new(CallerTools {
            config,
            timeout_caps,
            catalog,
            callers: Mutex::new(HashMap::new()),
        })
    }

    fn callers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Registration>> {
        self.callers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &CallerToolsConfig {
        &self.config
    }

    /// `tools` as `caller_id` offers them: checked, their input schemas compiled, by offered
    /// name (with the declared name beside).
    fn offered(
        &self,
        caller_id: &str,
        tools: Vec<Declared>,
    ) -> Result<BTreeMap<String, (String, Arc<ToolSpec>)>, RelayError> {
        if !valid_name(caller_id, 64) {
            return Err(RelayError::Invalid(format!(
                "caller_id `{}` must be 1 to 64 of [A-Za-z0-9_.-]",
                caller_id.chars().take(64).collect::<String>()
            )));
        }
        if tools.is_empty() || tools.len() > self.config.max_tools_per_caller {
            return Err(RelayError::Invalid(format!(
                "declare 1 to {} tools",
                self.config.max_tools_per_caller
            )));
        }
        let mut offered = BTreeMap::new();
        for t in tools {
            if !valid_name(&t.name, 64) {
                return Err(RelayError::Invalid(format!(
                    "tool name `{}` must be 1 to 64 of [A-Za-z0-9_.-]",
                    t.name.chars().take(64).collect::<String>()
                )));
            }
            let schema = t.input_schema.unwrap_or_else(|| json!({"type": "object"}));
            let input = CompiledSchema::compile(schema).map_err(|e| {
                RelayError::Invalid(format!("tool {}: inputSchema: {}", t.name, e.0))
            })?;
            let name = format!("{caller_id}_{}", t.name);
            let max = self
                .timeout_caps
                .get(&name)
                .map_or(self.config.timeout_ms_max, |cap| {
                    (*cap).min(self.config.timeout_ms_max)
                });
            let spec = ToolSpec {
                name: name.clone(),
                app_name: None,
                definition: None,
                description: t.description.chars().take(4096).collect(),
                input,
                output: None,
                timeout_ms_default: self.config.timeout_ms_default.min(max),
                timeout_ms_max: max,
                idempotent: false,
                side_effects: true,
            };
            if offered
                .insert(name.clone(), (t.name, Arc::new(spec)))
                .is_some()
            {
                return Err(RelayError::Invalid(format!("tool `{name}` declared twice")));
            }
        }
        Ok(offered)
    }

    /// Register `tools` of `caller_id` for `principal`: the stream's events, and the guard
    /// whose drop ends it. A caller id already registered is taken over (its stream ends, its
    /// pending calls fail) only by the same principal.
    pub fn register(
        self: &Arc<Self>,
        principal: &str,
        caller_id: &str,
        tools: Vec<Declared>,
    ) -> Result<(mpsc::Receiver<Event>, StreamGuard), RelayError> {
        let offered = self.offered(caller_id, tools)?;
        let stream_id = hex::encode(rand::random::<[u8; 16]>());
        let (tx, rx) = mpsc::channel(self.config.max_pending_per_caller + 2);
        let names: Vec<String> = offered.keys().cloned().collect();
        {
            let mut callers = self.callers();
            // A name another source serves is not taken over.
            let app = self.catalog.base();
            for name in &names {
                let taken_by_other = callers
                    .values()
                    .any(|r| r.caller_id != caller_id && r.tools.contains_key(name));
                if app.tools.contains_key(name) || taken_by_other {
                    return Err(RelayError::Invalid(format!(
                        "a tool named `{name}` is served already"
                    )));
                }
            }
            if let Some(old) = callers.get(caller_id) {
                if old.principal != principal {
                    return Err(RelayError::Forbidden(format!(
                        "caller_id {caller_id} is registered by another caller"
                    )));
                }
            }
            let registration = Registration {
                stream_id: stream_id.clone(),
                caller_id: caller_id.to_owned(),
                principal: principal.to_owned(),
                tools: offered,
                events: tx.clone(),
                pending: HashMap::new(),
            };
            // The old stream's pending calls fail as its channel closes with it.
            callers.insert(caller_id.to_owned(), registration);
            self.publish(&callers);
        }
        tracing::info!(
            "caller_tools_registered caller_id={caller_id} principal={principal} tools={names:?}"
        );
        // Room for it was made above: the channel is new.
        let _ = tx.try_send(Event::Registered {
            stream_id: stream_id.clone(),
            tools: names,
        });
        let guard = StreamGuard {
            relay: self.clone(),
            caller_id: caller_id.to_owned(),
            stream_id,
        };
        Ok((rx, guard))
    }

    /// The stream `stream_id` of `caller_id` ended: its pending calls fail (their senders are
    /// dropped) and its tools are withdrawn.
    fn end(&self, caller_id: &str, stream_id: &str) {
        let mut callers = self.callers();
        if callers
            .get(caller_id)
            .is_some_and(|r| r.stream_id == stream_id)
        {
            let gone = callers.remove(caller_id);
            self.publish(&callers);
            let pending = gone.map_or(0, |r| r.pending.len());
            tracing::warn!("caller_tools_withdrawn caller_id={caller_id} pending_failed={pending}");
        }
    }

    /// Every registered tool into the catalog's overlay.
    fn publish(&self, callers: &HashMap<String, Registration>) {
        let tools = callers
            .values()
            .flat_map(|r| r.tools.iter().map(|(n, (_, s))| (n.clone(), s.clone())))
            .collect();
        self.catalog.set_overlay(tools);
    }

    /// Calls waiting for `caller_id`'s answers.
    pub fn pending(&self, caller_id: &str) -> usize {
        self.callers().get(caller_id).map_or(0, |r| r.pending.len())
    }

    /// Whether `name` is a relayed tool.
    pub fn serves(&self, name: &str) -> bool {
        self.callers().values().any(|r| r.tools.contains_key(name))
    }

    /// Send `call` to the caller that offers its tool and wait for the answer (the call
    /// stage's timeout bounds the wait; dropping the future forgets the request).
    pub async fn call(self: &Arc<Self>, call: ToolCall) -> Result<CallOutcome, Rejection> {
        let name = call.tool.name.clone();
        let size = serde_json::to_vec(&call.args).map_or(0, |b| b.len());
        if size > self.config.max_argument_bytes {
            return Err(Rejection::PayloadTooLarge {
                limit: self.config.max_argument_bytes as u64,
            });
        }
        let request_id = hex::encode(rand::random::<[u8; 16]>());
        let (tx, rx) = oneshot::channel();
        let caller_id = {
            let mut callers = self.callers();
            let reg = callers
                .values_mut()
                .find(|r| r.tools.contains_key(&name))
                .ok_or_else(|| {
                    Rejection::AppUnavailable(format!("the caller offering {name} is gone"))
                })?;
            if reg.pending.len() >= self.config.max_pending_per_caller {
                return Err(Rejection::Overloaded);
            }
            let declared = reg.tools[&name].0.clone();
            let event = Event::Request {
                request_id: request_id.clone(),
                tool: declared,
                arguments: call.args.clone(),
            };
            match reg.events.try_send(event) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(Rejection::AppUnavailable(format!(
                        "caller {} is not reading its stream",
                        reg.caller_id
                    )))
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(Rejection::AppUnavailable(format!(
                        "caller {} disconnected",
                        reg.caller_id
                    )))
                }
            }
            reg.pending.insert(request_id.clone(), tx);
            reg.caller_id.clone()
        };
        let forget = Forget {
            relay: self,
            caller_id: &caller_id,
            request_id: &request_id,
        };
        let answer = rx.await;
        drop(forget);
        match answer {
            Ok(Answer::Result(output)) => Ok(CallOutcome::Ok {
                output,
                content: None,
                meta: None,
            }),
            Ok(Answer::Error(message)) => Ok(CallOutcome::AppError {
                code: "TOOL_ERROR".into(),
                message: message.chars().take(2048).collect(),
                details: None,
                retryable: false,
                content: None,
            }),
            Ok(Answer::Unusable(why)) => Err(Rejection::AppInvalid(why)),
            Err(_) => Err(Rejection::AppUnavailable(format!(
                "caller {caller_id} disconnected before answering"
            ))),
        }
    }

    /// The answer of `principal` on stream `stream_id` to `request_id`.
    pub fn respond(
        &self,
        principal: &str,
        stream_id: &str,
        request_id: &str,
        answer: Answer,
    ) -> Result<(), RelayError> {
        let mut callers = self.callers();
        let reg = callers
            .values_mut()
            .find(|r| r.stream_id == stream_id)
            .ok_or(RelayError::UnknownRequest)?;
        if reg.principal != principal {
            return Err(RelayError::Forbidden(
                "only the caller holding the stream answers its requests".into(),
            ));
        }
        let size = match &answer {
            Answer::Result(v) => serde_json::to_vec(v).map_or(0, |b| b.len()),
            Answer::Error(m) | Answer::Unusable(m) => m.len(),
        };
        let pending = reg
            .pending
            .remove(request_id)
            .ok_or(RelayError::UnknownRequest)?;
        if size > self.config.max_result_bytes {
            // The call fails rather than wait for an answer that will not come.
            let _ = pending.send(Answer::Unusable(format!(
                "the caller's result was over {} bytes",
                self.config.max_result_bytes
            )));
            return Err(RelayError::ResultTooLarge(
                size,
                self.config.max_result_bytes,
            ));
        }
        // The call may have timed out just now: then nobody waits, and that is fine.
        let _ = pending.send(answer);
        Ok(())
    }
}

/// Drops a request from its registration when the call ends, however it ends.
struct Forget<'a> {
    relay: &'a CallerTools,
    caller_id: &'a str,
    request_id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.relay.callers().get_mut(self.caller_id) {
            r.pending.remove(self.request_id);
        }
    }
}

#[cfg(test)]
mod tests;
