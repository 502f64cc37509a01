//! Offline commands over what carapace records: `receipts verify`, `ledger verify`, `tail`
//! and `export`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand, Clone)]
pub(crate) enum ReceiptsAction {
    /// Check a stored `Carapace-Receipt` value: its form, its Ed25519 signature, and when
    /// given, its hashes against the call's arguments and result. Prints the receipt; exits 1
    /// if it does not hold.
    Verify {
        /// A file holding the receipt (the header's value); `-` for stdin.
        #[arg(long, default_value = "-")]
        receipt: PathBuf,
        /// The tool host's Ed25519 public key (base64), as its paired record keeps it.
        #[arg(long, conflicts_with = "peer")]
        public_key: Option<String>,
        /// Or: a peer of this gateway, whose paired record's key is used (needs --config).
        #[arg(long, requires = "config")]
        peer: Option<String>,
        /// The gateway's configuration file (its peer store).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// A JSON file with the call's arguments: `input_hash` must be its hash.
        #[arg(long)]
        input: Option<PathBuf>,
        /// A JSON file with what `output_hash` covers (the result of a success, `{"code": ..}`
        /// of a failure, `null` for a timeout).
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    if path.as_os_str() == "-" {
        use std::io::Read;
        let mut buf = Vec::new();
        std::io::stdin()
            .take(64 * 1024)
            .read_to_end(&mut buf)
            .map_err(|e| format!("stdin: {e}"))?;
        return Ok(buf);
    }
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn json_file(path: &std::path::Path) -> Result<serde_json::Value, String> {
    serde_json::from_slice(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

fn peer_key(config: &std::path::Path, peer: &str) -> Result<String, String> {
    let loaded = carapace::config::load(config).map_err(|e| {
        let errors: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
        format!("{}: {}", config.display(), errors.join("; "))
    })?;
    let store = carapace::peers::PeerStore::open(loaded.peers_file()).map_err(|e| e.to_string())?;
    store
        .active(peer)
        .and_then(|r| r.public_key_ed25519)
        .ok_or_else(|| format!("no active peer {peer} with a public_key_ed25519"))
}

pub(crate) fn receipts(action: ReceiptsAction) -> ExitCode {
    let ReceiptsAction::Verify {
        receipt,
        public_key,
        peer,
        config,
        input,
        output,
    } = action;
    let run = || -> Result<carapace::receipts::Receipt, String> {
        let key = match (public_key, peer, config) {
            (Some(k), _, _) => k,
            (None, Some(p), Some(c)) => peer_key(&c, &p)?,
            _ => return Err("give --public-key, or --peer with --config".into()),
        };
        let text = read(&receipt)?;
        let value = text.trim_ascii();
        let r = carapace::receipts::verify(value, &key).map_err(|e| e.to_string())?;
        for (what, file, hash) in [
            ("input_hash", &input, &r.input_hash),
            ("output_hash", &output, &r.output_hash),
        ] {
            if let Some(f) = file {
                let want = carapace::receipts::value_hash(&json_file(f)?);
                if &want != hash {
                    return Err(format!(
                        "{what}: the receipt says {hash}, the file hashes to {want}"
                    ));
                }
            }
        }
        Ok(r)
    };
    match run() {
        Ok(r) => {
            println!("{}", serde_json::to_string_pretty(&r).expect("JSON"));
            eprintln!("receipt valid");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receipt not valid: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Subcommand, Clone)]
pub(crate) enum LedgerAction {
    /// Walk the hash chain: every row present, unchanged and in order. Exits 1 at the first
    /// break, naming the row.
    Verify,
    /// Print the newest rows as JSON lines, oldest first.
    Tail {
        #[arg(short, default_value_t = 20)]
        n: u64,
    },
    /// Print every row from `--from` on as JSON lines (for a log pipeline or SIEM).
    Export {
        /// The first row's `seq`.
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
}

fn ledger_path(config: Option<PathBuf>, path: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = path {
        return Ok(p);
    }
    let Some(config) = config else {
        return Err("give --config or --path".into());
    };
    let loaded = carapace::config::load(&config).map_err(|e| {
        let errors: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
        format!("{}: {}", config.display(), errors.join("; "))
    })?;
    carapace::ledger::path_of(&loaded.config)
        .ok_or_else(|| format!("{}: no `ledger` section", config.display()))
}

pub(crate) fn ledger(
    action: LedgerAction,
    config: Option<PathBuf>,
    path: Option<PathBuf>,
) -> ExitCode {
    use carapace::ledger::store;
    use std::io::Write;
    let run = || -> Result<(), String> {
        let path = ledger_path(config, path)?;
        if !path.exists() {
            return Err(format!("{}: no such ledger", path.display()));
        }
        let conn = store::open_read_only(&path).map_err(|e| e.to_string())?;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let mut line = |row: &carapace::ledger::Row| {
            serde_json::to_writer(&mut out, row).is_ok() && out.write_all(b"\n").is_ok()
        };
        match action {
            LedgerAction::Verify => match store::verify(&conn).map_err(|e| e.to_string())? {
                Ok(n) => {
                    println!("ledger intact: {n} rows");
                    Ok(())
                }
                Err(b) => Err(format!("ledger broken: {b}")),
            },
            LedgerAction::Tail { n } => {
                for row in store::tail(&conn, n).map_err(|e| e.to_string())? {
                    line(&row);
                }
                Ok(())
            }
            LedgerAction::Export { from } => {
                store::scan(&conn, from, |row| line(&row)).map_err(|e| e.to_string())
            }
        }
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("carapace ledger: {e}");
            ExitCode::FAILURE
        }
    }
}
