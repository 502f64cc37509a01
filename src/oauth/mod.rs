//! carapace as an OAuth 2.1 resource server (`front.oauth`): the bearer-token layer built
//! from the configuration, the protected-resource metadata it serves (RFC 9728), and the
//! issuer's keys.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carapace_filters::bearer::{
    BearerLayer, BearerPolicy, KeySource, ScopeMap, StaticKeys, TokenRules,
};
use serde_json::json;

use crate::config::{Loaded, OAuthConfig};

pub mod jwks;

/// The well-known path of protected-resource metadata (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Where the metadata of `resource` is: its URL, and the paths it is served at (the
/// path-suffixed one of RFC 9728 §3.1 first, then the bare well-known path).
pub fn metadata_location(resource: &http::Uri) -> (String, Vec<String>) {
    let path = resource.path().trim_end_matches('/');
    let suffixed = format!("{METADATA_PATH}{path}");
    let origin = format!(
        "{}://{}",
        resource.scheme_str().unwrap_or("https"),
        resource.authority().map_or("", |a| a.as_str())
    );
    let mut paths = vec![suffixed.clone()];
    if suffixed != METADATA_PATH {
        paths.push(METADATA_PATH.to_owned());
    }
    (format!("{origin}{suffixed}"), paths)
}

/// The protected-resource metadata document.
pub fn metadata(o: &OAuthConfig) -> serde_json::Value {
    let servers = if o.authorization_servers.is_empty() {
        vec![o.issuer.clone()]
    } else {
        o.authorization_servers.clone()
    };
    let mut m = json!({
        "resource": o.resource,
        "authorization_servers": servers,
        "scopes_supported": o.scopes.keys().collect::<Vec<_>>(),
        "bearer_methods_supported": ["header"],
    });
    if let Some(name) = &o.resource_name {
        m["resource_name"] = json!(name);
    }
    m
}

/// The bearer-token layer of an mcp front with `front.oauth`, else `None`.
pub fn layer(cfg: &Loaded, clock: carapace_filters::signature::UnixClock) -> Option<BearerLayer> {
    let o = cfg.config.front.oauth.as_ref()?;
    Some(layer_for(o, cfg.oauth_keys.as_ref(), clock))
}

/// The bearer-token layer of the outbound role's remote endpoint (`outbound.listen`), else
/// `None`.
pub fn outbound_layer(
    cfg: &Loaded,
    clock: carapace_filters::signature::UnixClock,
) -> Option<BearerLayer> {
    let listen = cfg.config.outbound.as_ref()?.listen.as_ref()?;
    Some(layer_for(
        &listen.oauth,
        cfg.outbound_oauth_keys.as_ref(),
        clock,
    ))
}

/// The bearer-token layer of `o`; `file_keys` are its `jwks_file`, loaded.
fn layer_for(
    o: &OAuthConfig,
    file_keys: Option<&jsonwebtoken::jwk::JwkSet>,
    clock: carapace_filters::signature::UnixClock,
) -> BearerLayer {
    // Checked when the configuration was loaded.
    let resource: http::Uri = o.resource.parse().expect("validated resource");
    let (resource_metadata, metadata_paths) = metadata_location(&resource);
    let mut audiences = vec![o.resource.clone()];
    audiences.extend(o.audiences.iter().cloned());
    let policy = BearerPolicy {
        rules: TokenRules {
            issuer: o.issuer.clone(),
            audiences,
            skew: Duration::from_secs(o.clock_skew_s),
        },
        scopes: ScopeMap::new(o.scopes.clone()),
        challenge_scope: o.challenge_scope.clone(),
        resource_metadata,
        metadata_paths,
        metadata: Bytes::from(metadata(o).to_string()),
    };
    BearerLayer::new(policy, key_source(o, file_keys), clock)
}

fn key_source(
    o: &OAuthConfig,
    file_keys: Option<&jsonwebtoken::jwk::JwkSet>,
) -> Arc<dyn KeySource> {
    if let Some(keys) = file_keys {
        return Arc::new(StaticKeys(Arc::new(keys.clone())));
    }
    let url = o.jwks_url.as_deref().expect("validated: a file or a URL");
    let ca = o.jwks_ca_file.as_ref().and_then(|f| std::fs::read(f).ok());
    match jwks::JwksUrl::new(
        url.parse().expect("validated URL"),
        ca.as_deref(),
        Duration::from_secs(o.jwks_min_refresh_s),
        Duration::from_secs(o.jwks_max_age_s),
    ) {
        Ok(source) => Arc::new(source),
        Err(e) => {
            // Fail closed: with no keys every token is refused.
            tracing::error!("front.oauth: {e}; every bearer token will be refused");
            Arc::new(StaticKeys(Arc::new(jsonwebtoken::jwk::JwkSet {
                keys: vec![],
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_sits_at_the_path_suffixed_well_known_uri() {
        let (url, paths) = metadata_location(&"https://h.test:8443/mcp".parse().unwrap());
        assert_eq!(
            url,
            "https://h.test:8443/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            paths,
            ["/.well-known/oauth-protected-resource/mcp", METADATA_PATH]
        );
        let (url, paths) = metadata_location(&"https://h.test/".parse().unwrap());
        assert_eq!(url, "https://h.test/.well-known/oauth-protected-resource");
        assert_eq!(paths, [METADATA_PATH]);
    }
}
