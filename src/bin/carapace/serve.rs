//! `serve`, `check`, `sample-app`: running carapace, its logs and its runtime.

use std::path::Path;
use std::process::ExitCode;

use carapace::config::{self, LogFormat};

use crate::EXIT_CONFIG;

pub(crate) fn print_config_errors(path: &Path, errors: &config::ConfigErrors) {
    eprintln!("{}: {} error(s)", path.display(), errors.0.len());
    for e in &errors.0 {
        eprintln!("  {e}");
    }
}

pub(crate) fn init_logging(format: LogFormat, level: &str) {
    init_tracing(format, level, None);
}

/// Logs on stderr, and spans over OTLP when `otlp` is set (its handle flushes at the end).
pub(crate) fn init_tracing(
    format: LogFormat,
    level: &str,
    otlp: Option<&carapace::telemetry::OtlpConfig>,
) -> Option<carapace::telemetry::Exporter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let (spans, exporter) = match otlp.map(carapace::telemetry::otlp_layer) {
        Some(Ok((layer, exporter))) => (Some(layer), Some(exporter)),
        Some(Err(e)) => {
            eprintln!("spans are not exported: {e}");
            (None, None)
        }
        None => (None, None),
    };
    match spans {
        // Exported spans have a filter of their own, so the log level filters the logs only.
        Some(spans) => tracing_subscriber::registry()
            .with(log_layer(format).with_filter(filter))
            .with(spans)
            .init(),
        // Otherwise the log level filters everything, once, for the whole subscriber (no
        // per-layer filter state kept for every span). A filter that is one level for every
        // target (`info`, the default) is a plain level: an `EnvFilter` takes a lock each time
        // a span is entered or left, to look for span-scoped directives it cannot have.
        None => match plain_level(&filter) {
            Some(level) => {
                // The text lines write a call's fields themselves: calls need no span.
                if format == LogFormat::Text {
                    carapace::ops::call_fields::keep_fields_beside_calls();
                }
                tracing_subscriber::registry()
                    .with(level)
                    .with(log_layer(format))
                    .init()
            }
            None => tracing_subscriber::registry()
                .with(filter)
                .with(log_layer(format))
                .init(),
        },
    }
    exporter
}

/// The one level of a filter that has no directive but a level for every target (`info`).
fn plain_level(
    filter: &tracing_subscriber::EnvFilter,
) -> Option<tracing_subscriber::filter::LevelFilter> {
    filter.to_string().parse().ok()
}

/// Log lines on stderr, as text or JSON.
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
        LogFormat::Text => fmt
            .with_ansi(false)
            .fmt_fields(carapace::ops::log_format::TextFields)
            .event_format(carapace::ops::log_format::TextFormat::default())
            .boxed(),
    }
}

/// The runtime `serve` starts on: worker 0's event loop on the main thread (tokio's
/// current-thread scheduler), which also accepts and runs the background tasks.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// How many workers serve connections: `runtime.worker_threads`, else one per core.
fn worker_count(configured: Option<usize>) -> usize {
    configured.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `carapace check`: validate a configuration file.
pub(crate) fn check(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(_) => {
            println!("{}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_config_errors(path, &e);
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

pub(crate) fn serve(path: &Path) -> ExitCode {
    let loaded = match config::load(path) {
        Ok(l) => l,
        Err(e) => {
            print_config_errors(path, &e);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let otlp = loaded
        .config
        .telemetry
        .as_ref()
        .and_then(|t| t.otlp.clone());
    let exporter = init_tracing(
        loaded.config.log.format,
        &loaded.config.log.level,
        otlp.as_ref(),
    );
    let workers = match carapace::server::Workers::spawn(worker_count(
        loaded.config.runtime.worker_threads,
    )) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("cannot start the workers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = runtime();
    let code = rt.block_on(async move {
        // Handlers first, so a signal during start-up is not fatal.
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let running = match carapace::server::start_on(loaded, workers).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        loop {
            tokio::select! {
                _ = hup.recv() => { let _ = running.reload().await; }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        tracing::info!("draining");
        running.shutdown().await;
        ExitCode::SUCCESS
    });
    if let Some(exporter) = exporter {
        exporter.shutdown();
    }
    code
}

/// `carapace sample-app`: the demo's memory tool host, until SIGINT or SIGTERM.
pub(crate) fn sample_app(listen: std::net::SocketAddr, threads: usize) -> ExitCode {
    init_logging(LogFormat::Text, "info");
    // The benchmarks' app: kept on the scheduler it was measured with.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("sample memory tool host on http://{listen}");
        let app = std::sync::Arc::new(carapace::memory_app::MemoryApp::default());
        let task = app.serve(listener);
        // Until SIGINT or SIGTERM (what a container runtime sends).
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        task.abort();
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::EnvFilter;

    #[test]
    fn only_a_filter_of_one_level_for_every_target_is_a_plain_level() {
        let plain = |f: &str| super::plain_level(&EnvFilter::new(f));
        assert_eq!(plain("info"), Some(LevelFilter::INFO));
        assert_eq!(plain("DEBUG"), Some(LevelFilter::DEBUG));
        assert_eq!(plain("off"), Some(LevelFilter::OFF));
        assert_eq!(plain("carapace=debug"), None);
        assert_eq!(plain("info,hyper=warn"), None);
        assert_eq!(plain("info,[call]=debug"), None);
    }
}
