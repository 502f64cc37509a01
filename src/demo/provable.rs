//! 16–21: provable invocations. A gateway calls a paired tool host: signed receipts checked
//! at the gateway, both ledgers, idempotency at the shell, a budget running out, tool search,
//! and a circuit opening when the host goes away.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::{call, code, start};
use crate::client::{Client, Reply, Transport};
use crate::memory_app::MemoryApp;

/// A tool host with a ledger, a priced `memory.append` and a budget for the gateway, paired
/// with a gateway that requires receipts and keeps a ledger.
async fn pair(
    dir: &Path,
    app_addr: &str,
) -> Result<(crate::server::Running, crate::server::Running, Client), String> {
    let gw_dir = dir.join("provable-gw");
    std::fs::create_dir_all(gw_dir.join("state")).map_err(|e| e.to_string())?;
    let gateway_key =
        crate::pairing::identity::GatewayIdentity::load_or_create(&gw_dir.join("state"), "gw_home")
            .map_err(|e| e.to_string())?
            .public_key_ed25519();
    super::write(
        &dir.join("provable-peers.json"),
        r#"{"version": 1, "peers": []}"#,
    )?;
    let host = start(
        &dir.join("provable-host"),
        &format!(
            r#"
state_dir: {dir}/provable-host
front: {{ protocol: tools-v1 }}
listeners:
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key, client_ca_file: {dir}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
peers: {{ file: {dir}/provable-peers.json }}
ops: {{ address: "" }}
pairing: {{ listen: "127.0.0.1:0", component_id: memory-east, gateway_public_key_ed25519: "{gateway_key}" }}
ledger: {{}}
tools: {{ memory.append: {{ price: 10 }} }}
metering: {{ budgets: {{ gw_home: {{ total: 20 }} }} }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    let gateway = start(
        &gw_dir,
        &format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
ledger: {{}}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://{tools}", receipts: require }} }}
  health: {{ failures_to_open: 2, backoff_ms: 60000, max_backoff_ms: 60000 }}
"#,
            d = gw_dir.display(),
            tools = host.tcp_address.ok_or("no tcp address")?,
        ),
    )
    .await?;
    super::pair_memory_east(&gateway, &host).await?;
    let agent = Client::new(Transport::Unix(gw_dir.join("outbound.sock")));
    for _ in 0..100 {
        let list = agent.send(http::Method::GET, "/v1/tools", &[], "").await?;
        if list.json()["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
        {
            return Ok((host, gateway, agent));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the gateway did not discover the host's tools".into())
}

async fn agent_call(agent: &Client, body: &Value) -> Result<Reply, String> {
    agent.post_json("/v1/tools/call", &[], body).await
}

fn ledger_check(path: &Path) -> Result<u64, String> {
    let conn = crate::ledger::store::open_read_only(path).map_err(|e| e.to_string())?;
    match crate::ledger::store::verify(&conn).map_err(|e| e.to_string())? {
        Ok(n) => Ok(n),
        Err(b) => Err(b.to_string()),
    }
}

pub(super) async fn provable_steps(
    dir: &Path,
    app_addr: &str,
    app: &MemoryApp,
) -> Result<(), String> {
    let (host, gateway, agent) = pair(dir, app_addr).await?;
    receipt_step(dir, &agent).await?;
    // 18 and 19 run before 17, so that the ledgers hold them, and are shown after it.
    let ran = idempotency_step(&agent, app).await?;
    let refused = budget_step(&agent).await?;
    host.shutdown().await;
    ledger_step(dir)?;
    println!(
        "18. idempotency   5 concurrent calls with idempotency_key demo-order-1 -> the app ran it {ran} time, all 5 got the same answer"
    );
    let details = &refused.json()["error"]["details"];
    println!(
        "19. metering      gw_home's budget 20, memory.append costs 10: third call -> {} ({}, remaining {})",
        code(&refused),
        details["reason"],
        details["remaining"]
    );
    search_step(&agent).await?;
    health_step(&agent).await?;
    gateway.shutdown().await;
    Ok(())
}

/// 16. A receipt, signed by the host and checked by the gateway.
async fn receipt_step(dir: &Path, agent: &Client) -> Result<(), String> {
    let args = json!({"text": "a receipt for this"});
    let reply = agent_call(agent, &call("memory.append", args.clone(), None)).await?;
    let receipt = reply
        .headers
        .get(crate::receipts::RECEIPT_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or("no receipt")?;
    let host_key =
        crate::pairing::identity::HostIdentity::load_or_create(&dir.join("provable-host"))
            .map_err(|e| e.to_string())?
            .public_key_ed25519();
    let r = crate::receipts::verify(receipt.as_bytes(), &host_key).map_err(|e| e.to_string())?;
    let status = reply.headers.get(crate::receipts::RECEIPT_STATUS_HEADER);
    if status.map(|v| v.as_bytes()) != Some(b"verified")
        || r.input_hash != crate::receipts::value_hash(&args)
    {
        return Err(format!("receipt: {status:?} {r:?}"));
    }
    println!(
        "16. receipts      gateway -> memory-east memory.append: Carapace-Receipt signed by the host ({} {} -> {}, status {}), checked at the gateway: verified",
        r.tool, r.consumer, r.provider, r.status.as_str()
    );
    Ok(())
}

/// 18. Idempotency: five concurrent repeats of one keyed call; how many times the app ran it.
async fn idempotency_step(agent: &Client, app: &MemoryApp) -> Result<usize, String> {
    let before = app.received().len();
    let mut keyed = call("memory.append", json!({"text": "once"}), None);
    keyed["idempotency_key"] = json!("demo-order-1");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let (agent, keyed) = (agent.clone(), keyed.clone());
        set.spawn(async move { agent.post_json("/v1/tools/call", &[], &keyed).await });
    }
    let mut answers = Vec::new();
    while let Some(r) = set.join_next().await {
        answers.push(r.map_err(|e| e.to_string())??.json()["result"].clone());
    }
    let ran = app.received().len() - before;
    if ran != 1 || answers.iter().any(|a| *a != answers[0]) {
        return Err(format!("idempotency: the app ran {ran} times: {answers:?}"));
    }
    Ok(ran)
}

/// 19. The budget (20, at 10 a call) is spent: the next call is refused before the app.
async fn budget_step(agent: &Client) -> Result<Reply, String> {
    let refused = agent_call(agent, &call("memory.append", json!({"text": "over"}), None)).await?;
    let details = &refused.json()["error"]["details"];
    if code(&refused) != "FORBIDDEN" || details["reason"] != "budget_exhausted" {
        return Err(format!(
            "metering: {}",
            String::from_utf8_lossy(&refused.body)
        ));
    }
    Ok(refused)
}

/// 17. Both ledgers: intact, then a row edited behind carapace's back (the host stopped).
fn ledger_step(dir: &Path) -> Result<(), String> {
    let host_db = dir.join("provable-host/ledger.sqlite3");
    let rows = ledger_check(&host_db)?;
    let gw_rows = ledger_check(&dir.join("provable-gw/state/ledger.sqlite3"))?;
    let conn = rusqlite::Connection::open(&host_db).map_err(|e| e.to_string())?;
    conn.execute(
        "UPDATE invocations SET consumer = 'someone-else' WHERE seq = 1",
        [],
    )
    .map_err(|e| e.to_string())?;
    let tampered = ledger_check(&host_db).err().unwrap_or_default();
    println!(
        "17. ledgers       host ledger: {rows} rows, chain intact; gateway ledger: {gw_rows} rows, intact; one row edited -> `ledger verify`: {tampered}"
    );
    Ok(())
}

/// 20. Tool search over what the gateway knows; query syntax in the text is only text.
async fn search_step(agent: &Client) -> Result<(), String> {
    let found = agent
        .send(
            http::Method::GET,
            "/v1/tools/search?q=find+memory+%22NEAR%22*",
            &[],
            "",
        )
        .await?
        .json();
    let first = found["results"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if first != "memory.query" {
        return Err(format!("search: {found}"));
    }
    println!(
        "20. tool search   `find memory \"NEAR\"*` -> {first} first ({} results; query syntax is only text)",
        found["results"].as_array().map_or(0, Vec::len)
    );
    Ok(())
}

/// 21. The host is gone: two failures open its circuit, the next call fails at once.
async fn health_step(agent: &Client) -> Result<(), String> {
    for _ in 0..2 {
        agent_call(agent, &call("memory.query", json!({"query": "x"}), None)).await?;
    }
    let started = std::time::Instant::now();
    let fast = agent_call(agent, &call("memory.query", json!({"query": "x"}), None)).await?;
    let took = started.elapsed();
    if fast.json()["error"]["details"]["reason"] != "circuit_open" {
        return Err(format!("health: {}", String::from_utf8_lossy(&fast.body)));
    }
    let unhealthy = agent
        .send(http::Method::GET, "/v1/tools/search?q=memory", &[], "")
        .await?
        .json()["results"][0]["healthy"]
        .clone();
    println!(
        "21. health        host stopped: 2 failures open its circuit -> next call {} circuit_open in {} ms; search marks its tools healthy={unhealthy}",
        code(&fast),
        took.as_millis()
    );
    Ok(())
}
