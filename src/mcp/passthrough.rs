//! What an MCP server behind carapace offers besides tools, passed through the MCP front:
//! resources, resource templates, prompts and completions. Authorization applies as for
//! tools, in the same policy model: `resource.read:<uri>` (patterns by URI prefix, such as
//! `resource.read:file:///docs/*`) and `prompt.get:<name>`. A list shows only what the caller
//! may use; a read, a get or a completion of anything else is refused (`FORBIDDEN`) before the
//! server sees it. The server's answers and errors are passed on as they are.

use serde_json::{Map, Value};

use carapace_filters::call::Principal;
use carapace_filters::Rejection;

use super::back::upstream::Reply;
use super::back::McpUpstream;
use super::jsonrpc::McpError;

/// The methods passed through to an MCP server.
pub const METHODS: [&str; 6] = [
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

/// The capabilities to announce for what is passed through: the server's own. Log messages are
/// relayed on a call's stream, filtered by each session's `logging/setLevel`; resource
/// subscriptions and list changes on the subscribers' streams ([`crate::mcp::subscriptions`]).
pub fn capabilities(server: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for key in ["resources", "prompts", "completions", "logging"] {
        let Some(offered) = server.get(key) else {
            continue;
        };
        let mut cap = Map::new();
        for flag in ["subscribe", "listChanged"] {
            if key != "completions"
                && key != "logging"
                && offered.get(flag) == Some(&Value::Bool(true))
            {
                cap.insert(flag.to_owned(), Value::Bool(true));
            }
        }
        out.insert(key.to_owned(), Value::Object(cap));
    }
    out
}

/// What a caller may use.
struct Access<'a> {
    principal: &'a Principal,
    now_ms: u64,
}

impl Access<'_> {
    fn read(&self, uri: &str) -> bool {
        self.principal
            .permissions
            .as_ref()
            .is_some_and(|p| p.may_read(uri, self.now_ms))
    }

    fn prompt(&self, name: &str) -> bool {
        self.principal
            .permissions
            .as_ref()
            .is_some_and(|p| p.may_get_prompt(name, self.now_ms))
    }

    /// The refusal of `action` (`resource.read:<uri>`, `prompt.get:<name>`).
    fn refuse(&self, action: String) -> McpError {
        let who = &self.principal.id;
        McpError::Refused(match &self.principal.permissions {
            Some(p) => p.refusal(who, &action),
            None => Rejection::Forbidden(format!("{who} may not {action}")),
        })
    }
}

fn required<'a>(params: &'a Map<String, Value>, pointer: &str) -> Result<&'a str, McpError> {
    let mut cur = None::<&Value>;
    for (i, key) in pointer.split('/').enumerate() {
        cur = match (i, cur) {
            (0, _) => params.get(key),
            (_, Some(v)) => v.get(key),
            (_, None) => None,
        };
    }
    cur.and_then(Value::as_str)
        .ok_or_else(|| McpError::InvalidParams(format!("`{pointer}` (a string) is required")))
}

/// Forward `method` for `principal`; the result, and whether a list was filtered for it.
pub async fn forward(
    server: &McpUpstream,
    method: &str,
    mut params: Map<String, Value>,
    principal: &Principal,
    now_ms: u64,
) -> Result<(Value, bool), McpError> {
    let access = Access { principal, now_ms };
    authorize(method, &params, &access)?;
    // The caller's protocol metadata is its own with carapace; the server gets carapace's.
    params.remove("_meta");
    let mirrored = match method {
        "resources/read" => params.get("uri"),
        "prompts/get" => params.get("name"),
        _ => None,
    }
    .and_then(Value::as_str)
    .map(str::to_owned);
    let reply = server
        .request(method, Value::Object(params), mirrored.as_deref())
        .await
        .map_err(McpError::Refused)?;
    let mut result = match reply {
        Reply::Result(r) => r,
        Reply::Error {
            code,
            message,
            data,
        } => {
            return Err(McpError::Upstream {
                code,
                message,
                data,
            })
        }
    };
    if !result.is_object() {
        return Err(McpError::Refused(Rejection::AppInvalid(format!(
            "the MCP server's {method} result is not an object"
        ))));
    }
    let filtered = filter_list(method, &mut result, &access);
    // carapace answers in the caller's revision; these are the server's.
    if let Some(r) = result.as_object_mut() {
        r.remove("resultType");
        r.remove("ttlMs");
        r.remove("cacheScope");
    }
    Ok((result, filtered))
}

/// Keep the items of `result[key]` that `keep` allows; whether any was dropped.
fn retain(result: &mut Value, key: &str, keep: impl Fn(&Value) -> bool) -> bool {
    let Some(items) = result.get_mut(key).and_then(Value::as_array_mut) else {
        return false;
    };
    let before = items.len();
    items.retain(|i| keep(i));
    items.len() != before
}

/// A read, a get or a completion the caller may not make is refused before the server sees it.
fn authorize(
    method: &str,
    params: &Map<String, Value>,
    access: &Access<'_>,
) -> Result<(), McpError> {
    match method {
        "resources/read" => {
            let uri = required(params, "uri")?;
            if !access.read(uri) {
                return Err(access.refuse(format!("resource.read:{uri}")));
            }
        }
        "prompts/get" => {
            let name = required(params, "name")?;
            if !access.prompt(name) {
                return Err(access.refuse(format!("prompt.get:{name}")));
            }
        }
        "completion/complete" => match required(params, "ref/type")? {
            "ref/prompt" => {
                let name = required(params, "ref/name")?;
                if !access.prompt(name) {
                    return Err(access.refuse(format!("prompt.get:{name}")));
                }
            }
            "ref/resource" => {
                let uri = required(params, "ref/uri")?;
                if !access.read(uri) {
                    return Err(access.refuse(format!("resource.read:{uri}")));
                }
            }
            other => {
                return Err(McpError::InvalidParams(format!(
                    "`ref.type` `{other}` is not one carapace knows"
                )))
            }
        },
        _ => {}
    }
    Ok(())
}

/// Keep the items of a list the caller may use; whether any was dropped.
fn filter_list(method: &str, result: &mut Value, access: &Access<'_>) -> bool {
    match method {
        "resources/list" => retain(result, "resources", |r| {
            r.get("uri")
                .and_then(Value::as_str)
                .is_some_and(|u| access.read(u))
        }),
        "resources/templates/list" => retain(result, "resourceTemplates", |r| {
            r.get("uriTemplate")
                .and_then(Value::as_str)
                .is_some_and(|u| access.read(u))
        }),
        "prompts/list" => retain(result, "prompts", |p| {
            p.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| access.prompt(n))
        }),
        _ => false,
    }
}
