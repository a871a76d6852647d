//! `ctrlplane token`: mint a bearer token from the shared secret.
//!
//! The token is signed exactly as the services verify it
//! ([`Authenticator`]), with the secret read the way the services read it:
//! `CP_AUTH_SECRET`, else the file named by `CP_AUTH_SECRET_FILE` with
//! trailing whitespace trimmed, at least 32 bytes. No service is contacted.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ctrlplane_runtime::auth::{Authenticator, Claims};
use ctrlplane_runtime::config::{
    AUTH_SECRET, AUTH_SECRET_FILE, AuthConfig, ConfigError, MIN_SECRET_LEN, Settings,
};

use crate::error::CliError;

const AFTER_HELP: &str = "\
Examples:
  # an administrator token, valid for one hour
  ctrlplane token --secret-file /etc/ctrlplane/secret --role system:admin
  # a token for a user of tenant t1, valid for a day
  ctrlplane token --secret-file secret.txt --subject alice --tenant t1 --ttl 24h
  # use it
  export CP_TOKEN=$(ctrlplane token --secret-file secret.txt --role system:admin)";

/// Arguments of `ctrlplane token`.
#[derive(Debug, Clone, Args)]
#[command(after_help = AFTER_HELP)]
pub struct TokenArgs {
    /// The services' HS256 secret, at least 32 bytes (prefer --secret-file:
    /// flags are visible to other users in the process list)
    #[arg(long, env = AUTH_SECRET, hide_env_values = true, value_name = "SECRET")]
    pub secret: Option<String>,

    /// File holding the secret (trailing whitespace is ignored); used when
    /// no --secret is given
    #[arg(long, env = AUTH_SECRET_FILE, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,

    /// Who the token is for (the `sub` claim)
    #[arg(long, default_value = "admin", value_name = "NAME")]
    pub subject: String,

    /// Tenant the token acts for; omit for a platform token
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "TENANT"
    )]
    pub tenant: String,

    /// Role to grant, e.g. system:admin (repeatable)
    #[arg(long = "role", value_name = "ROLE")]
    pub roles: Vec<String>,

    /// How long the token is valid (e.g. 30m, 1h, 24h)
    #[arg(long, default_value = "1h", value_name = "DURATION",
          value_parser = crate::input::parse_positive_duration)]
    pub ttl: Duration,
}

/// Reads the secret from the flags (or their environment variables).
///
/// # Errors
/// [`CliError::Config`]: none given, the file unreadable, or too short.
pub fn secret(args: &TokenArgs) -> Result<Vec<u8>, CliError> {
    let mut pairs = Vec::new();
    if let Some(s) = args.secret.as_ref().filter(|s| !s.is_empty()) {
        pairs.push((AUTH_SECRET.to_string(), s.clone()));
    }
    if let Some(p) = args
        .secret_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        pairs.push((AUTH_SECRET_FILE.to_string(), p.display().to_string()));
    }
    if pairs.is_empty() {
        return Err(CliError::Config(format!(
            "no secret: pass --secret-file FILE or --secret SECRET (or set {AUTH_SECRET_FILE} or {AUTH_SECRET}); \
             it must be the secret the services use, at least {MIN_SECRET_LEN} bytes"
        )));
    }
    // The runtime's reader, so the CLI and the services agree byte for byte
    // on what the secret is.
    AuthConfig::from_settings(&Settings::from_map(pairs))
        .map(|c| c.secret)
        .map_err(|e| {
            CliError::Config(match e {
                ConfigError::Invalid { name, reason, .. } => {
                    let flag = if name == AUTH_SECRET {
                        "--secret"
                    } else {
                        "--secret-file"
                    };
                    format!("bad secret ({flag} / {name}): {reason}")
                }
                ConfigError::File { path, source, .. } => {
                    format!("cannot read the secret file {path}: {source}")
                }
                other => other.to_string(),
            })
        })
}

/// Mints the token described by `args`.
///
/// # Errors
/// As [`secret`].
pub fn mint(args: &TokenArgs) -> Result<String, CliError> {
    let secret = secret(args)?;
    let claims = Claims::new(
        args.subject.clone(),
        args.tenant.clone(),
        args.roles.clone(),
        args.ttl,
    );
    Ok(Authenticator::new(&secret).mint(&claims))
}

/// Runs `ctrlplane token`: prints the token and a newline.
///
/// # Errors
/// As [`mint`], or a failed write.
pub fn run(args: &TokenArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let token = mint(args)?;
    writeln!(out, "{token}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ctrlplane_runtime::auth::ROLE_ADMIN;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    /// Parses `ctrlplane token ARGS…` with explicit secret flags, so the
    /// process environment does not matter.
    fn parse(args: &[&str]) -> TokenArgs {
        let argv = ["ctrlplane", "token"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Token(t) => t,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn minted_tokens_verify_with_the_services_authenticator() {
        let args = parse(&[
            "--secret",
            SECRET,
            "--subject",
            "alice",
            "--tenant",
            "t1",
            "--role",
            ROLE_ADMIN,
            "--role",
            "x",
            "--ttl",
            "2h",
        ]);
        let token = mint(&args).unwrap();
        let claims = Authenticator::new(SECRET.as_bytes())
            .verify(&token)
            .unwrap();
        assert_eq!(claims.sub, "alice");
        assert_eq!(claims.tenant_id, "t1");
        assert_eq!(claims.roles, vec![ROLE_ADMIN.to_string(), "x".to_string()]);
        let ttl = claims.exp - claims.iat;
        assert_eq!(ttl, 7200);

        // Signed with one secret, refused under another.
        assert!(
            Authenticator::new(b"another-secret-another-secret-xx")
                .verify(&token)
                .is_err()
        );
    }

    #[test]
    fn defaults() {
        let mut args = parse(&[]);
        assert_eq!(args.subject, "admin");
        assert_eq!(args.tenant, "");
        assert!(args.roles.is_empty());
        assert_eq!(args.ttl, Duration::from_secs(3600));
        args.secret = Some(SECRET.to_string());
        let mut out = Vec::new();
        run(&args, &mut out).unwrap();
        let printed = String::from_utf8(out).unwrap();
        assert!(printed.ends_with('\n'));
        let claims = Authenticator::new(SECRET.as_bytes())
            .verify(printed.trim_end())
            .unwrap();
        assert_eq!(
            (claims.sub.as_str(), claims.exp - claims.iat),
            ("admin", 3600)
        );
    }

    #[test]
    fn secret_from_file_is_trimmed_like_the_services_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, format!("{SECRET}\n")).unwrap();
        let mut args = parse(&[]);
        args.secret = None;
        args.secret_file = Some(path);
        let token = mint(&args).unwrap();
        assert!(Authenticator::new(SECRET.as_bytes()).verify(&token).is_ok());
    }

    #[test]
    fn bad_secrets_are_explained() {
        let mut args = parse(&[]);
        args.secret = None;
        args.secret_file = None;
        let err = mint(&args).unwrap_err().to_string();
        assert!(err.starts_with("no secret: pass --secret-file"), "{err}");

        args.secret = Some("short".to_string());
        let err = mint(&args).unwrap_err().to_string();
        assert!(
            err.contains("at least 32 bytes") && !err.contains("short"),
            "{err}"
        );

        args.secret = None;
        args.secret_file = Some("/nonexistent/secret".into());
        let err = mint(&args).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/secret"), "{err}");
    }

    #[test]
    fn ttl_must_be_a_positive_duration() {
        assert!(crate::cli::Cli::try_parse_from(["ctrlplane", "token", "--ttl", "0s"]).is_err());
        assert!(crate::cli::Cli::try_parse_from(["ctrlplane", "token", "--ttl", "1d"]).is_err());
    }
}
