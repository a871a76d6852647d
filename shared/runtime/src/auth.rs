//! Bearer-token authentication.
//!
//! Tokens are HS256 JWTs signed with the shared secret, with claims `sub`,
//! `tenant_id` (may be empty), `roles`, `exp`. The [`AuthLayer`] checks the
//! `authorization` header of every call except health and reflection and
//! puts the verified [`Caller`] into the request extensions, where handlers
//! read it with [`caller`]. A missing, malformed, expired or forged token is
//! `UNAUTHENTICATED` before any handler runs.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{Either, Ready, ready};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Acts across tenants and on platform-shared resources.
pub const ROLE_ADMIN: &str = "system:admin";
/// A ctrlplane service calling another one.
pub const ROLE_SERVICE: &str = "system:service";
/// A joined provider agent (credential bound to `agent_id`).
pub const ROLE_AGENT: &str = "system:agent";

/// Clock skew tolerated when checking `exp`.
const LEEWAY_SECS: u64 = 5;

/// Token claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Subject: who the caller is.
    pub sub: String,
    /// Tenant the caller acts for; empty for platform callers.
    #[serde(default)]
    pub tenant_id: String,
    /// Roles, e.g. `system:admin`.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issue time, seconds since the epoch.
    #[serde(default)]
    pub iat: u64,
    /// Agent credentials: the agent id the token is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

impl Claims {
    /// Claims valid for `ttl` from now.
    pub fn new(
        sub: impl Into<String>,
        tenant_id: impl Into<String>,
        roles: Vec<String>,
        ttl: Duration,
    ) -> Self {
        let now = now_secs();
        Claims {
            sub: sub.into(),
            tenant_id: tenant_id.into(),
            roles,
            exp: now + ttl.as_secs(),
            iat: now,
            agent_id: None,
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` metadata.
    #[error("missing authorization metadata (expected \"authorization: Bearer <token>\")")]
    Missing,
    /// Not `Bearer <token>`.
    #[error("malformed authorization metadata (expected \"Bearer <token>\")")]
    Malformed,
    /// Past its `exp`.
    #[error("token expired")]
    Expired,
    /// Bad signature, bad encoding or bad claims.
    #[error("invalid token: {0}")]
    Invalid(String),
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> Self {
        tonic::Status::unauthenticated(e.to_string())
    }
}

/// Signs and verifies tokens with the shared secret.
#[derive(Clone)]
pub struct Authenticator {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authenticator(..)")
    }
}

impl Authenticator {
    /// An authenticator for the given HS256 secret.
    pub fn new(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECS;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Authenticator {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// Signs claims into a token.
    ///
    /// # Panics
    /// Never for HS256 with serializable claims.
    pub fn mint(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .expect("HS256 signing of plain claims cannot fail")
    }

    /// A short-lived `system:service` token for calls between services.
    pub fn service_token(&self, subject: &str, ttl: Duration) -> String {
        self.mint(&Claims::new(
            subject,
            "",
            vec![ROLE_SERVICE.to_string()],
            ttl,
        ))
    }

    /// Verifies a raw token (without the `Bearer ` prefix).
    ///
    /// # Errors
    /// [`AuthError::Expired`] or [`AuthError::Invalid`].
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
                _ => AuthError::Invalid(e.to_string()),
            })
    }

    /// Verifies an `authorization` header value.
    ///
    /// # Errors
    /// Any [`AuthError`].
    pub fn verify_header(&self, value: Option<&http::HeaderValue>) -> Result<Claims, AuthError> {
        let value = value.ok_or(AuthError::Missing)?;
        let value = value.to_str().map_err(|_| AuthError::Malformed)?;
        let (scheme, token) = value.trim().split_once(' ').ok_or(AuthError::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(AuthError::Malformed);
        }
        self.verify(token.trim())
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The verified claims.
    pub claims: Claims,
}

impl Caller {
    /// Has `system:admin`.
    pub fn is_admin(&self) -> bool {
        self.has_role(ROLE_ADMIN)
    }

    /// A platform caller: `system:admin` or `system:service`.
    pub fn is_system(&self) -> bool {
        self.is_admin() || self.has_role(ROLE_SERVICE)
    }

    /// A joined agent.
    pub fn is_agent(&self) -> bool {
        self.has_role(ROLE_AGENT)
    }

    /// Has the given role.
    pub fn has_role(&self, role: &str) -> bool {
        self.claims.roles.iter().any(|r| r == role)
    }

    /// The caller's tenant ("" for platform callers).
    pub fn tenant_id(&self) -> &str {
        &self.claims.tenant_id
    }

    /// The caller's subject.
    pub fn subject(&self) -> &str {
        &self.claims.sub
    }
}

/// The caller of a request, as put there by the [`AuthLayer`].
///
/// # Errors
/// `UNAUTHENTICATED` when the request did not pass the layer (a server
/// assembled without it): never serve unauthenticated by accident.
pub fn caller<T>(req: &tonic::Request<T>) -> Result<Caller, tonic::Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| tonic::Status::unauthenticated("no authenticated caller"))
}

/// Requires a platform caller (`system:admin` or `system:service`).
///
/// # Errors
/// `UNAUTHENTICATED` without a caller, `PERMISSION_DENIED` otherwise.
pub fn require_system<T>(req: &tonic::Request<T>) -> Result<Caller, tonic::Status> {
    let c = caller(req)?;
    if c.is_system() {
        Ok(c)
    } else {
        Err(tonic::Status::permission_denied(
            "this call needs a system:admin or system:service token",
        ))
    }
}

/// gRPC paths that need no token.
const OPEN_PREFIXES: &[&str] = &["/grpc.health.v1.Health/", "/grpc.reflection."];

/// Tower layer that authenticates every request except health and
/// reflection.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
    public: Arc<[&'static str]>,
}

impl AuthLayer {
    /// A layer verifying with `auth`.
    pub fn new(auth: Arc<Authenticator>) -> Self {
        AuthLayer {
            auth,
            public: Arc::from(Vec::new()),
        }
    }

    /// Also lets these exact gRPC paths through without a token: methods
    /// that authenticate themselves. A bearer token, if present, is still
    /// verified and its caller attached.
    pub fn with_public_methods(mut self, paths: &[&'static str]) -> Self {
        self.public = Arc::from(paths.to_vec());
        self
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.auth.clone(),
            public: self.public.clone(),
        }
    }
}

/// The service produced by [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    auth: Arc<Authenticator>,
    public: Arc<[&'static str]>,
}

impl<S, B, R> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        if OPEN_PREFIXES.iter().any(|p| path.starts_with(p)) {
            return Either::Right(self.inner.call(req));
        }
        let public = self.public.contains(&path);
        match self
            .auth
            .verify_header(req.headers().get(http::header::AUTHORIZATION))
        {
            Ok(claims) => {
                req.extensions_mut().insert(Caller { claims });
                Either::Right(self.inner.call(req))
            }
            Err(AuthError::Missing) if public => Either::Right(self.inner.call(req)),
            Err(e) => Either::Left(ready(Ok(tonic::Status::from(e).into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn round_trip() {
        let a = Authenticator::new(SECRET);
        let c = Claims::new(
            "alice",
            "t1",
            vec![ROLE_ADMIN.into()],
            Duration::from_secs(60),
        );
        let tok = a.mint(&c);
        assert_eq!(a.verify(&tok).unwrap(), c);
        let hv = http::HeaderValue::from_str(&format!("Bearer {tok}")).unwrap();
        assert_eq!(a.verify_header(Some(&hv)).unwrap().sub, "alice");
    }

    #[test]
    fn rejects_forged_expired_and_malformed() {
        let a = Authenticator::new(SECRET);
        let other = Authenticator::new(b"another-secret-another-secret-xx");
        let c = Claims::new("alice", "", vec![], Duration::from_secs(60));
        assert!(matches!(
            a.verify(&other.mint(&c)),
            Err(AuthError::Invalid(_))
        ));

        let mut old = c.clone();
        old.exp = now_secs() - 3600;
        assert!(matches!(a.verify(&a.mint(&old)), Err(AuthError::Expired)));

        assert!(matches!(a.verify_header(None), Err(AuthError::Missing)));
        let hv = http::HeaderValue::from_static("Basic abc");
        assert!(matches!(
            a.verify_header(Some(&hv)),
            Err(AuthError::Malformed)
        ));
        let hv = http::HeaderValue::from_static("Bearer not.a.jwt");
        assert!(matches!(
            a.verify_header(Some(&hv)),
            Err(AuthError::Invalid(_))
        ));
    }
}
