//! Installs what a pairing issued on this tool host: certificate files, the gateway's peer
//! record and the listener TLS.

use std::path::Path;
use std::sync::Arc;

use crate::pairing::handshake::Installed;
/// The service every listener hands requests to.
use crate::server::shared::Shared;

/// Installs what a pairing issued on this tool host: the certificate files before the
/// install is confirmed, the new listener TLS and the gateway's peer record once the gateway
/// said the pairing is complete.
pub(crate) struct ToolHostInstaller {
    pub(crate) shared: Arc<Shared>,
}

impl crate::pairing::transport::PairingSink for ToolHostInstaller {
    fn install(&self, i: &Installed) -> Result<(), String> {
        // A gateway revoked here stays revoked: pairing again would make it active.
        if let Some(r) = self
            .shared
            .peers
            .revoked(&i.gateway_id, &i.gateway_public_key_ed25519)
        {
            return Err(format!(
                "gateway {} is revoked on this host; its record must be deleted from the peer \
                 store before it pairs again",
                r.component_id
            ));
        }
        let cfg = self.shared.config.load();
        let files = crate::tls::PairedFiles::of(&cfg.config.state_dir, &i.pairing_id)
            .map_err(|e| e.to_string())?;
        let write = |path: &Path, bytes: &[u8]| {
            carapace_filters::state_file::write_atomically(path, bytes)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        // A directory of its own: nothing in use changes until `activate` points at it.
        write(&files.key, i.key_pem.as_bytes())?;
        write(&files.cert, i.certificate_pem.as_bytes())?;
        write(&files.ca, i.chain_pem.concat().as_bytes())?;
        Ok(())
    }

    fn activate(&self, i: &Installed) -> Result<(), String> {
        // A reload builds the listener's TLS from the pairing current when it starts: one
        // running now could serve the old pairing's TLS after this one's. Reloads are short
        // and rare; the pairing fails (and can be run again) rather than wait here.
        let _no_reload = self
            .shared
            .reload_lock
            .try_lock()
            .map_err(|_| "a configuration reload is under way; pair again")?;
        let cfg = self.shared.config.load();
        let state_dir = &cfg.config.state_dir;
        let files =
            crate::tls::PairedFiles::of(state_dir, &i.pairing_id).map_err(|e| e.to_string())?;
        // Check that the new TLS builds before anything changes.
        let tls_config = cfg
            .config
            .listeners
            .tcp
            .as_ref()
            .and_then(|t| t.tls.as_ref())
            .ok_or("no TLS listener to install the pairing on")?;
        let optional = cfg.config.front.authenticates_each_request();
        let tls = crate::tls::listener_tls(tls_config, Some(&files), optional)
            .map_err(|e| e.to_string())?;
        let ca_fingerprint = tls
            .client_ca_fingerprint
            .clone()
            .ok_or("the installed gateway CA is not a single certificate")?;
        // 1. The gateway's record: unusable until the listener trusts the gateway CA.
        record_gateway(&self.shared, gateway_record(i, ca_fingerprint))?;
        // 2. Make this pairing the current one (one atomic write); 3. serve it.
        carapace_filters::state_file::write_atomically(
            &crate::tls::PairedFiles::current_pointer(state_dir),
            i.pairing_id.as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        self.shared.tls.store(Some(Arc::new(tls)));
        self.shared
            .metrics
            .peers
            .set(self.shared.peers.len() as i64);
        Ok(())
    }

    fn abandon(&self, pairing_id: &str) {
        let cfg = self.shared.config.load();
        crate::tls::PairedFiles::discard(&cfg.config.state_dir, pairing_id);
    }
}

/// Record the gateway in the peer file, decided on the file as it is now (not on the last
/// snapshot read): a revocation, or an operator's edit, made while the pairing ran is not
/// overwritten.
fn record_gateway(shared: &Shared, mut record: crate::peers::PeerRecord) -> Result<(), String> {
    shared
        .peers
        .modify(|f| {
            let (id, key) = (&record.component_id, record.public_key_ed25519.as_deref());
            if let Some(r) = f.peers.iter().find(|p| p.revokes(id, key)) {
                return Err(format!(
                    "gateway {} was revoked during the pairing",
                    r.component_id
                ));
            }
            // The operator's role and policy for this gateway outlive its certificate.
            let active = |p: &&crate::peers::PeerRecord| {
                &p.component_id == id && p.status == crate::peers::ACTIVE
            };
            if let Some(p) = f.peers.iter().find(active) {
                (record.role, record.policy) = (p.role.clone(), p.policy.clone());
            }
            f.version = 1;
            f.peers.retain(|p| p.component_id != record.component_id);
            f.peers.push(record);
            Ok(())
        })
        .map_err(|e| e.to_string())?
}

/// The gateway's peer record, as a pairing that installed `i` makes it.
fn gateway_record(i: &Installed, ca_fingerprint: String) -> crate::peers::PeerRecord {
    let paired_at = crate::pairing::wire::GoTime::from_system_time(std::time::SystemTime::now())
        .and_then(|t| t.to_rfc3339_nano());
    crate::peers::PeerRecord {
        component_type: "gateway".into(),
        component_id: i.gateway_id.clone(),
        role: Some("gateway".into()),
        endpoint: None,
        public_key_ed25519: Some(i.gateway_public_key_ed25519.clone()),
        public_key_x25519: None,
        mtls_cert_fingerprint: String::new(),
        mtls_ca_fingerprint: Some(ca_fingerprint),
        mtls_cert_not_after: None,
        status: crate::peers::ACTIVE.into(),
        paired_at,
        last_seen_at: None,
        policy: None,
    }
}
