//! Where each tool is served: a paired peer, a configured Skill Gateway v1 skill, or a
//! verified EAT catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::OutboundError;
use crate::config::Loaded;
use crate::upstream::AppClient;

/// Where a tool is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    /// A paired tool host, by component id.
    Peer(String),
    /// A configured skill, by skill id.
    Skill(String),
    /// A verified EAT catalog, by its id in `outbound.eat`.
    Eat(String),
}

/// A skill the outbound role calls.
pub(super) struct SkillRoute {
    pub(super) client: AppClient,
    pub(super) config: crate::config::SkillAppConfig,
    pub(super) signing: Option<crate::skill_v1::AppSigning>,
}

/// The configured Skill Gateway v1 skills, by skill id, with their clients and signing.
pub(super) fn skill_routes(cfg: &Loaded) -> Result<BTreeMap<String, SkillRoute>, OutboundError> {
    let mut skills = BTreeMap::new();
    let outbound = cfg.config.outbound.as_ref();
    for (id, skill) in outbound.map(|o| &o.skills).into_iter().flatten() {
        let at = &cfg.outbound_skills[id];
        let client = match &at.ca_file {
            None => AppClient::new(
                crate::config::AppAddress::Tcp(at.address),
                &cfg.config.app.pool,
                cfg.config.limits.max_response_bytes,
            ),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in crate::tls::load_certs(ca).map_err(|e| OutboundError(e.to_string()))? {
                    roots.add(c).map_err(|e| OutboundError(e.to_string()))?;
                }
                let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(|e| OutboundError(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                AppClient::mtls(
                    at.address,
                    Arc::new(config),
                    &cfg.config.app.pool,
                    cfg.config.limits.max_response_bytes,
                )
            }
        };
        let signing = match (&skill.auth, &at.secret) {
            (Some(auth), Some(secret)) => Some(crate::skill_v1::AppSigning::new(
                match auth.mode {
                    crate::config::AuthModeConfig::Hmac => {
                        carapace_filters::signature::AuthMode::Hmac
                    }
                    crate::config::AuthModeConfig::ApiKey => {
                        carapace_filters::signature::AuthMode::ApiKey
                    }
                },
                auth.header_name
                    .as_deref()
                    .map(|h| http::HeaderName::from_bytes(h.as_bytes()).expect("validated")),
                secret.clone(),
            )),
            _ => None,
        };
        let config = crate::config::SkillAppConfig {
            skill_id: id.clone(),
            capabilities: skill.capabilities.clone(),
            auth: skill.auth.clone(),
            protocol_version: skill.protocol_version.clone(),
            timeout_ms_default: skill.timeout_ms_default,
            timeout_ms_max: skill.timeout_ms_max,
        };
        skills.insert(
            id.clone(),
            SkillRoute {
                client,
                config,
                signing,
            },
        );
    }
    Ok(skills)
}
