//! Tool search on the gateway side: `GET /v1/tools/search` on the outbound socket and
//! `carapace tools search`, over the tools of a paired peer.

mod common;

use common::*;
use http::Method;
use serde_json::Value;

fn names(v: &Value) -> Vec<String> {
    v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_agent_finds_tools_by_words_and_query_syntax_is_only_text() {
    let env = Env::new().await;
    let (host, gw, agent) = paired(&env, "", "", "", None).await;
    let search = |q: &str| {
        let path = format!(
            "/v1/tools/search?{}",
            form_urlencoded::Serializer::new(String::new())
                .append_pair("q", q)
                .finish()
        );
        let agent = &agent;
        async move { agent.send(Method::GET, &path, &[], "").await.unwrap() }
    };
    let r = search("find entries").await;
    assert_eq!(r.status, http::StatusCode::OK);
    let v = r.json();
    assert_eq!(names(&v)[0], "memory.query", "{v}");
    assert_eq!(v["results"][0]["provider"], "memory-east");
    assert_eq!(v["results"][0]["kind"], "peer");
    assert_eq!(v["results"][0]["healthy"], true);
    assert_eq!(names(&search("delete").await.json()), ["memory.delete"]);
    // FTS5 syntax characters give results or nothing, never an error.
    for q in [
        "\"",
        "memory\"",
        "*",
        "mem*",
        "NEAR(memory delete)",
        "-memory",
        "memory - delete",
        "AND",
        "OR NOT",
        "(",
        "\u{1f980}",
    ] {
        let r = search(q).await;
        assert_eq!(r.status, http::StatusCode::OK, "{q:?}: {:?}", r.json());
        assert!(r.json()["results"].is_array(), "{q:?}");
    }
    assert_eq!(names(&search("-memory").await.json()).len(), 3);
    assert!(names(&search("NEAR").await.json()).is_empty());
    // `q` is required.
    let r = agent
        .send(Method::GET, "/v1/tools/search", &[], "")
        .await
        .unwrap();
    assert_eq!(code(&r), "INVALID_ARGS");

    // The command does the same through the socket.
    // (Run off this thread: the gateway answering it runs on the test's runtime.)
    let socket = env.path().join("gw/outbound.sock");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary())
            .args(["tools", "search", "append memory", "-n", "1", "--socket"])
            .arg(socket)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&v), ["memory.append"]);
    gw.shutdown().await;
    host.shutdown().await;
}
