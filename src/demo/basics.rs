//! 1 to 6: a tools-v1 front (mTLS, a paired gateway) and a skill-v1 front (HMAC, the nonce
//! store) before the sample app, and what each does with a good call and with bad ones.

use std::net::SocketAddr;
use std::time::Duration;

use http::Method;
use serde_json::json;

use super::{call, code, expect, DEMO_KEY};
use crate::client::{signed_run, tls_config, Client, Transport};
use crate::memory_app::MemoryApp;
use crate::pki::{Authority, Issued};
use crate::server::Running;

/// What the first steps call: the two fronts, the app behind them and the paired gateway's
/// client of the tools-v1 front.
pub(super) struct Fronts<'a> {
    pub app: &'a MemoryApp,
    pub tools: &'a Running,
    pub tools_addr: SocketAddr,
    pub skill_addr: SocketAddr,
    pub gw: &'a Client,
}

/// Steps 1 to 6; the error codes they met.
pub(super) async fn basic_steps(
    f: &Fronts<'_>,
    ca: &Authority,
    stranger: &Issued,
) -> Result<Vec<String>, String> {
    good_call(f).await?;
    Ok(vec![
        bad_arguments(f).await?,
        unpaired_peer(f, ca, stranger).await?,
        replay(f).await?,
        kill_switch(f).await?,
        timeout(f).await?,
    ])
}

/// 1. A good call.
async fn good_call(f: &Fronts<'_>) -> Result<(), String> {
    let args = json!({"text": "the cat sat on the mat"});
    let r =
        f.gw.post_json("/v1/tools/call", &[], &call("memory.append", args, None))
            .await?;
    if r.json()["status"] != "ok" {
        return Err(format!(
            "good call failed: {}",
            String::from_utf8_lossy(&r.body)
        ));
    }
    let seen = f.app.received();
    println!(
        "1. good call       memory.append over mTLS -> {} result={}; the app saw caller {:?}",
        r.json()["status"],
        r.json()["result"],
        seen.last()
            .and_then(|c| c.headers.get("x-carapace-peer-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
    );
    Ok(())
}

/// 2. Bad arguments never reach the app.
async fn bad_arguments(f: &Fronts<'_>) -> Result<String, String> {
    let before = f.app.received().len();
    let args = json!({"text": 42, "drop_table": true});
    let r =
        f.gw.post_json("/v1/tools/call", &[], &call("memory.append", args, None))
            .await?;
    let met = expect("bad arguments", &r, "INVALID_ARGS")?;
    let reached = f.app.received().len() - before;
    if reached != 0 {
        return Err("bad arguments reached the app".into());
    }
    println!(
        "2. bad arguments   memory.append {{text: 42, drop_table: true}} -> HTTP {} {}; calls that reached the app: {reached}",
        r.status.as_u16(),
        code(&r)
    );
    Ok(met)
}

/// 3. A certificate from the right CA that was never paired.
async fn unpaired_peer(
    f: &Fronts<'_>,
    ca: &Authority,
    stranger: &Issued,
) -> Result<String, String> {
    let outsider = Client::new(Transport::Tls {
        address: f.tools_addr,
        config: tls_config(&ca.cert_pem(), Some(stranger), false),
    });
    let args = json!({"query": "cat"});
    let r = outsider
        .post_json("/v1/tools/call", &[], &call("memory.query", args, None))
        .await?;
    let met = expect("unpaired peer", &r, "PAIRING_REQUIRED")?;
    println!(
        "3. unpaired peer   valid certificate, not in the peer store -> HTTP {} {}",
        r.status.as_u16(),
        code(&r)
    );
    Ok(met)
}

/// 4. A signed Skill Gateway v1 call, then the same bytes again.
async fn replay(f: &Fronts<'_>) -> Result<String, String> {
    let signer = Client::new(Transport::Tcp(f.skill_addr));
    let body = signed_run(
        DEMO_KEY.as_bytes(),
        "memory",
        "memory.query",
        json!({"query": "cat"}),
        carapace_filters::unix_now_ms(),
        &hex::encode(rand::random::<[u8; 16]>()),
    );
    let first = signer.post_json("/run", &[], &body).await?;
    if first.json()["ok"] != true {
        return Err(format!(
            "signed call failed: {}",
            String::from_utf8_lossy(&first.body)
        ));
    }
    let replay = signer.post_json("/run", &[], &body).await?;
    let met = expect("replay", &replay, "NONCE_REPLAY")?;
    println!(
        "4. replay          signed /run memory.query -> ok={} output={}; same request again -> HTTP {} {}",
        first.json()["ok"],
        first.json()["output"],
        replay.status.as_u16(),
        code(&replay)
    );
    Ok(met)
}

/// Engage or release the kill-switch of `memory.delete` through the admin socket.
async fn set_kill_switch(f: &Fronts<'_>, engaged: bool) -> Result<(), String> {
    let (status, _) = crate::ops::admin::request(
        &f.tools.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": engaged, "tool": "memory.delete"})),
    )
    .await?;
    match status.is_success() {
        true => Ok(()),
        false => Err(format!("kill-switch engaged={engaged}: HTTP {status}")),
    }
}

/// 5. The kill-switch, through the admin socket.
async fn kill_switch(f: &Fronts<'_>) -> Result<String, String> {
    let delete = || call("memory.delete", json!({"id": "m1"}), None);
    set_kill_switch(f, true).await?;
    let killed = f.gw.post_json("/v1/tools/call", &[], &delete()).await?;
    let met = expect("kill-switch", &killed, "DEPENDENCY_UNAVAILABLE")?;
    set_kill_switch(f, false).await?;
    let released = f.gw.post_json("/v1/tools/call", &[], &delete()).await?;
    println!(
        "5. kill-switch     engaged for memory.delete -> HTTP {} {}; released -> {}",
        killed.status.as_u16(),
        code(&killed),
        released.json()["status"]
    );
    Ok(met)
}

/// 6. A call that runs past its timeout is cut off, and the app's request with it.
async fn timeout(f: &Fronts<'_>) -> Result<String, String> {
    let args = json!({"query": "cat", "delay_ms": 5000});
    let r =
        f.gw.post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", args, Some(300)),
        )
        .await?;
    let met = expect("timeout", &r, "TIMEOUT")?;
    let mut abandoned = 0;
    for _ in 0..40 {
        abandoned = f.app.abandoned();
        if abandoned > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    println!(
        "6. timeout         memory.query taking 5 s with timeout_ms=300 -> HTTP {} {} (status {}); upstream request dropped: {}",
        r.status.as_u16(),
        code(&r),
        r.json()["status"],
        abandoned > 0
    );
    Ok(met)
}
