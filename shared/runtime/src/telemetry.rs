//! Tracing set-up: human-readable or JSON lines on stderr, filtered by
//! `CP_LOG`.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. Safe to call more than once (later calls
/// are no-ops), so tests can call it freely.
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_new(&cfg.filter).unwrap_or_else(|e| {
        eprintln!(
            "CP_LOG: invalid filter {:?} ({e}); using \"info\"",
            cfg.filter
        );
        EnvFilter::new("info")
    });
    // Colours only on a terminal: logs written to files stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match cfg.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Installs the rustls crypto provider (ring) for the whole process. Every
/// `main` and test set-up calls this first: two TLS stacks in one binary
/// otherwise panic when choosing a provider.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
