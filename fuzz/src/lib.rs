//! Fixtures the fuzz targets share: a configuration that parses without any file, and the
//! catalog of the Vagus demo skill compiled from its manifest.

use std::path::Path;

use carapace::catalog::{skill_catalog, Catalog};
use carapace::config::{parse, Loaded};
use serde_json::{json, Value};

/// The environment variable that holds the secrets of [`CONFIG`].
pub const SECRET_ENV: &str = "CARAPACE_FUZZ_SECRET";
/// Their value (the Vagus vectors' secret).
pub const SECRET: &str = "demo-secret";

/// A skill-v1 front in front of the Vagus demo skill, on a Unix socket only (no file is read).
pub const CONFIG: &str = r#"
state_dir: /nonexistent/carapace-fuzz
front:
  protocol: skill-v1
  auth:
    mode: hmac
    keys:
      - { id: k1, secret: { env: CARAPACE_FUZZ_SECRET } }
listeners:
  unix:
    path: /nonexistent/carapace-fuzz/skill.sock
app:
  protocol: skill-v1
  address: "http://127.0.0.1:4050"
  skill:
    skill_id: demo.echo
    capabilities: [demo.echo]
"#;

/// [`CONFIG`], loaded.
pub fn config() -> Loaded {
    std::env::set_var(SECRET_ENV, SECRET);
    match parse(CONFIG, Path::new("/nonexistent/carapace-fuzz")) {
        Ok(loaded) => loaded,
        Err(e) => panic!("fixture configuration: {:?}", e.0),
    }
}

/// The demo skill's manifest, as its server answers `GET /manifest`.
pub fn manifest() -> Value {
    json!({
        "gateway_protocol_version": "1.0", "id": "demo.echo", "version": "1.0.0",
        "capabilities": [{
            "capability": "demo.echo", "description": "Echo demo worker",
            "input_schema": {"type": "object", "properties": {"message": {"type": "string"},
                "mode": {"type": "string"}}, "required": ["message"], "additionalProperties": false},
            "output_schema": {"type": "object", "properties": {"result": {"type": "string"}},
                "required": ["result"], "additionalProperties": false}
        }],
        "requires": {"auth": "hmac-sha256"}, "safety": {"data_handling": "no_secrets"}
    })
}

/// The catalog [`CONFIG`] and [`manifest`] make.
pub fn catalog(cfg: &Loaded) -> Catalog {
    let skill = cfg.config.app.skill.as_ref().expect("a skill-v1 app");
    skill_catalog(&manifest(), skill, cfg).expect("the demo manifest compiles")
}
