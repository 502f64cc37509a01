//! The invocation ledger: every call recorded in a hash chain that survives `kill -9`, and
//! whose edited or deleted rows `carapace ledger verify` finds.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use carapace::client::{Client, Transport};
use common::*;
use http::Method;
use serde_json::{json, Value};

fn ledger_cli(env: &Env, args: &[&str]) -> Output {
    Command::new(binary())
        .arg("ledger")
        .args(args)
        .arg("--config")
        .arg(env.path().join("carapace.yaml"))
        .output()
        .unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn every_call_is_recorded_and_an_edited_or_deleted_row_is_found() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "receipts: { sign: true, provider_id: memory-host }\nledger: { retention: { max_rows: 1000 } }",
        ))
        .await;
    for n in 0..5 {
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.append", json!({"text": format!("n{n}")})),
            )
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok");
    }
    let refused = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "none"})),
        )
        .await
        .unwrap();
    let error_code = code(&refused);
    r.shutdown().await;

    let out = ledger_cli(&env, &["verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 rows"));
    let rows = lines(&ledger_cli(&env, &["export"]));
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0]["consumer"], "gw_test");
    assert_eq!(rows[0]["provider"], "memory-host");
    assert_eq!(rows[0]["side"], "inbound");
    assert_eq!(rows[0]["status"], "ok");
    assert_eq!(rows[5]["consumer"], "local");
    assert_eq!(rows[5]["status"], "error");
    assert_eq!(rows[5]["error_code"], error_code.as_str());
    // The receipt is kept with the row, and its hashes are the row's.
    let key = carapace::pairing::identity::HostIdentity::load_or_create(&env.path().join("state"))
        .unwrap()
        .public_key_ed25519();
    let receipt =
        carapace::receipts::verify(rows[2]["receipt"].as_str().unwrap().as_bytes(), &key).unwrap();
    assert_eq!(receipt.input_hash, rows[2]["input_hash"]);
    assert_eq!(receipt.receipt_id, rows[2]["receipt_id"]);
    let tail = lines(&ledger_cli(&env, &["tail", "-n", "2"]));
    assert_eq!(
        tail.iter()
            .map(|r| r["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [5, 6]
    );

    // An edited row.
    let db = env.path().join("state/ledger.sqlite3");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE invocations SET consumer = 'someone' WHERE seq = 3",
        [],
    )
    .unwrap();
    let out = ledger_cli(&env, &["verify"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("row 3 was changed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    conn.execute(
        "UPDATE invocations SET consumer = 'gw_test' WHERE seq = 3",
        [],
    )
    .unwrap();
    assert!(ledger_cli(&env, &["verify"]).status.success());
    // A deleted row.
    conn.execute("DELETE FROM invocations WHERE seq = 4", [])
        .unwrap();
    let out = ledger_cli(&env, &["verify"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("row 4 is missing"));
}

/// A call the caller cancels after it reached the app is recorded all the same, as
/// `CANCELLED`: the app may have run it.
#[tokio::test]
async fn a_call_cancelled_after_it_reached_the_app_is_recorded() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("ledger: {}")).await;
    let gw = env.gateway(&r);
    let slow = call("memory.query", json!({"query": "x", "delay_ms": 4000}));
    let call_id = slow["call_id"].clone();
    let answer = cancelled_in_flight(&env, &gw, slow, 1).await;
    assert_eq!(code(&answer), "CANCELLED");
    r.shutdown().await;

    let rows = lines(&ledger_cli(&env, &["export"]));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["call_id"], call_id);
    assert_eq!(rows[0]["status"], "error");
    assert_eq!(rows[0]["error_code"], "CANCELLED");
    assert!(ledger_cli(&env, &["verify"]).status.success());
}

/// On the gateway's side a call that times out is recorded with the answer its agent got,
/// `TIMEOUT` (the ledger sits above the timeout there too).
#[tokio::test]
async fn a_gateway_records_an_outbound_call_that_timed_out_as_a_timeout() {
    let env = Env::new().await;
    let (host, gw, agent) = paired(&env, "", "", "ledger: {}", None).await;
    let mut slow = call("memory.query", json!({"query": "x", "delay_ms": 2000}));
    slow["timeout_ms"] = json!(100);
    let reply = agent.post_json("/v1/tools/call", &[], &slow).await.unwrap();
    assert_eq!(code(&reply), "TIMEOUT", "{:?}", reply.json());
    gw.shutdown().await;
    host.shutdown().await;
    let rows = ledger_rows_of(&env.path().join("gw/carapace.yaml"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["side"], "outbound");
    assert_eq!(rows[0]["status"], "timeout");
    assert_eq!(rows[0]["error_code"], "TIMEOUT");
}

/// Kills the child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn serve(env: &Env) -> Guard {
    let guard = Guard(
        Command::new(binary())
            .args(["serve", "-c"])
            .arg(env.path().join("carapace.yaml"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = Client::new(Transport::Unix(env.path().join("tools.sock")));
    for _ in 0..500 {
        // Ready once the app's tools are discovered.
        if let Ok(r) = client.send(Method::GET, "/v1/tools", &[], "").await {
            if r.json()["tools"].as_array().is_some_and(|t| !t.is_empty()) {
                return guard;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("carapace did not start");
}

#[tokio::test]
async fn after_kill_9_under_load_the_ledger_opens_verifies_and_keeps_every_written_batch() {
    let env = Env::new().await;
    std::fs::write(
        env.path().join("carapace.yaml"),
        env.tools_yaml("ledger: { batch_max: 64 }"),
    )
    .unwrap();
    let mut child = serve(&env).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let loader = {
        let stop = stop.clone();
        let path = env.path().join("tools.sock");
        tokio::spawn(async move { LoadTarget(path).run(4, stop).await })
    };
    // Let the load run, then kill -9 in the middle of it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let _ = stop_tx.send(true);
    let answered = loader.await.unwrap();
    assert!(answered > 0);

    let out = ledger_cli(&env, &["verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = lines(&ledger_cli(&env, &["export"])).len() as u64;
    // Every row written is a call that was answered, or in flight when it was killed; what
    // is missing is what was still queued (at most the queue).
    assert!(rows <= answered + 4, "{rows} rows for {answered} answers");
    assert!(rows > 0);

    // It starts again on the same database and the chain goes on.
    let child = serve(&env).await;
    let client = Client::new(Transport::Unix(env.path().join("tools.sock")));
    for _ in 0..3 {
        let r = client
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.append", json!({"text": "after"})),
            )
            .await
            .unwrap();
        assert_eq!(r.json()["status"], "ok", "{:?}", r.json());
    }
    drop(client);
    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut child = child;
    let _ = child.0.wait();
    let out = ledger_cli(&env, &["verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A graceful stop writes what was queued: the three calls are there.
    assert_eq!(lines(&ledger_cli(&env, &["export"])).len() as u64, rows + 3);
}

/// The local socket as a load target.
struct LoadTarget(std::path::PathBuf);

impl LoadTarget {
    async fn run(&self, tasks: usize, stop: tokio::sync::watch::Receiver<bool>) -> u64 {
        let mut set = tokio::task::JoinSet::new();
        for t in 0..tasks {
            let client = Client::new(Transport::Unix(self.0.clone()));
            let stop = stop.clone();
            set.spawn(async move {
                let mut ok = 0u64;
                while !*stop.borrow() {
                    let body = call("memory.append", json!({"text": format!("t{t}")}));
                    match client.post_json("/v1/tools/call", &[], &body).await {
                        Ok(r) if r.json()["status"] == "ok" => ok += 1,
                        _ => break,
                    }
                }
                ok
            });
        }
        let mut total = 0;
        while let Some(n) = set.join_next().await {
            total += n.unwrap();
        }
        total
    }
}
