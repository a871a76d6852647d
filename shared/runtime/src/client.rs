//! gRPC client plumbing: channels to peers and a bearer-token interceptor.
//!
//! Services call each other with a short-lived `system:service` token they
//! mint themselves ([`BearerInterceptor::service`]); the CLI and tests use a
//! fixed token ([`BearerInterceptor::fixed`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::Authenticator;

/// A channel whose calls carry a bearer token.
pub type AuthedChannel = InterceptedService<Channel, BearerInterceptor>;

/// Lifetime of minted service tokens.
const SERVICE_TOKEN_TTL: Duration = Duration::from_secs(300);
/// Minted tokens are replaced this long before they expire.
const SERVICE_TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// A bad peer address.
#[derive(Debug, thiserror::Error)]
#[error("invalid address {addr:?}: {reason}")]
pub struct AddressError {
    /// The address.
    pub addr: String,
    /// Why.
    pub reason: String,
}

/// Adds `http://` to a bare `host:port`.
pub fn normalize_addr(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// A lazily connecting channel to `addr` (`host:port` or a URL): creating
/// it never fails because the peer is down; calls fail with `UNAVAILABLE`
/// until it is up.
///
/// # Errors
/// An address that is not a valid URI.
pub fn channel(addr: &str) -> Result<Channel, AddressError> {
    let url = normalize_addr(addr);
    let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| AddressError {
        addr: addr.to_string(),
        reason: e.to_string(),
    })?;
    Ok(endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// Attaches `authorization: Bearer …` to every call.
#[derive(Clone)]
pub struct BearerInterceptor {
    source: TokenSource,
}

#[derive(Clone)]
enum TokenSource {
    Fixed(AsciiMetadataValue),
    Minted {
        auth: Arc<Authenticator>,
        subject: String,
        cached: Arc<Mutex<Option<(AsciiMetadataValue, Instant)>>>,
    },
}

impl BearerInterceptor {
    /// Sends the given token.
    ///
    /// # Errors
    /// A token with characters not allowed in metadata.
    pub fn fixed(token: &str) -> Result<Self, AddressError> {
        let value =
            AsciiMetadataValue::try_from(format!("Bearer {token}")).map_err(|e| AddressError {
                addr: "<token>".to_string(),
                reason: format!("token is not valid metadata: {e}"),
            })?;
        Ok(BearerInterceptor {
            source: TokenSource::Fixed(value),
        })
    }

    /// Mints (and re-mints before expiry) `system:service` tokens for
    /// `subject`, e.g. `bootstrap`.
    pub fn service(auth: Arc<Authenticator>, subject: impl Into<String>) -> Self {
        BearerInterceptor {
            source: TokenSource::Minted {
                auth,
                subject: subject.into(),
                cached: Arc::new(Mutex::new(None)),
            },
        }
    }

    fn value(&self) -> AsciiMetadataValue {
        match &self.source {
            TokenSource::Fixed(v) => v.clone(),
            TokenSource::Minted {
                auth,
                subject,
                cached,
            } => {
                let mut guard = cached.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((v, refresh_at)) = guard.as_ref()
                    && Instant::now() < *refresh_at
                {
                    return v.clone();
                }
                let token = auth.service_token(subject, SERVICE_TOKEN_TTL);
                let v = AsciiMetadataValue::try_from(format!("Bearer {token}"))
                    .expect("a JWT is always valid ASCII metadata");
                *guard = Some((
                    v.clone(),
                    Instant::now() + SERVICE_TOKEN_TTL - SERVICE_TOKEN_REFRESH,
                ));
                v
            }
        }
    }
}

impl Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.value());
        Ok(req)
    }
}

/// A channel to `addr` with the given interceptor.
///
/// # Errors
/// An invalid address.
pub fn authed_channel(
    addr: &str,
    interceptor: BearerInterceptor,
) -> Result<AuthedChannel, AddressError> {
    Ok(InterceptedService::new(channel(addr)?, interceptor))
}
