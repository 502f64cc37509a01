//! Conformance parity: every server scenario of the official MCP conformance suite runs against
//! a reference server (the Python SDK exposing the suite's fixtures,
//! `tests/interop/conformance_server.py`) directly, and through carapace in front of it (the
//! MCP back over Streamable HTTP, the MCP front). Every scenario that passes directly passes
//! through carapace.

mod common;

use std::path::Path;
use std::time::Duration;

use common::node::{all_passed, args, installed, node};
use common::Env;
use tokio::net::{TcpListener, UnixStream};

const SUITE: &str = "@modelcontextprotocol/conformance/dist/index.js";

/// The suite's server scenarios, from `list --server`.
async fn scenarios(home: &Path) -> Vec<String> {
    let suite = installed(SUITE);
    let ran = node(home, args(&[suite.to_str().unwrap(), "list", "--server"])).await;
    assert!(ran.status.success(), "{}", ran.show());
    ran.stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

async fn passes(home: &Path, url: &str, scenario: &str) -> bool {
    let suite = installed(SUITE);
    let a = [
        suite.to_str().unwrap(),
        "server",
        "--url",
        url,
        "--scenario",
        scenario,
    ];
    all_passed(&node(home, args(&a)).await)
}

#[tokio::test]
async fn every_scenario_that_passes_against_the_server_passes_through_carapace() {
    let env = Env::new().await;
    let home = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = tokio::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/conformance_server.py"))
        .args(["--port", &port.to_string()])
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut up = false;
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the reference server did not start");

    // carapace in front of it, served on a loopback port forwarded to its Unix socket.
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_port = front.local_addr().unwrap().port();
    let yaml = env
        .tools_yaml("")
        .replace(
            "front: { protocol: tools-v1 }",
            &format!(
                r#"front: {{ protocol: mcp, mcp: {{ allowed_origins: ["http://127.0.0.1:{front_port}"] }} }}"#
            ),
        )
        .replace(
            &format!("app: {{ protocol: tools-v1, address: \"http://{}\" }}", env.app_addr),
            &format!("app: {{ protocol: mcp, address: \"http://127.0.0.1:{port}\" }}"),
        );
    let running = env.start_with(&yaml, false).await;
    for _ in 0..400 {
        if running.shared.ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        running.shared.ready(),
        "carapace discovered the server's tools"
    );
    let sock = env.path().join("tools.sock");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = front.accept().await {
            let sock = sock.clone();
            tokio::spawn(async move {
                if let Ok(mut unix) = UnixStream::connect(&sock).await {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });

    let direct = format!("http://127.0.0.1:{port}/mcp");
    let through = format!("http://127.0.0.1:{front_port}/mcp");
    let mut table = vec!["| scenario | reference server | through carapace |".to_string()];
    let mut lost = Vec::new();
    let mut passed = 0;
    let all = scenarios(home.path()).await;
    assert!(all.len() >= 30, "{all:?}");
    for s in &all {
        let d = passes(home.path(), &direct, s).await;
        let t = passes(home.path(), &through, s).await;
        let mark = |b| if b { "pass" } else { "fail" };
        table.push(format!("| `{s}` | {} | {} |", mark(d), mark(t)));
        if d && !t {
            lost.push(s.clone());
        }
        passed += usize::from(d && t);
    }
    eprintln!("{}", table.join("\n"));
    assert!(
        lost.is_empty(),
        "pass directly but not through carapace: {lost:?}"
    );
    // The reference server passes all but the stream-resumption scenario directly.
    assert!(passed + 1 >= all.len(), "{}", table.join("\n"));
}
