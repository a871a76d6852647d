//! The gRPC server every ctrlplane process runs.
//!
//! [`serve`] adds what every server has — `grpc.health.v1`, reflection v1
//! and v1alpha (older grpcurl speaks only v1alpha), the [`AuthLayer`] — to
//! the caller's routes, and shuts down gracefully: when `shutdown` resolves,
//! health turns NOT_SERVING, the listener closes, and in-flight calls get
//! `grace` to finish before the server is dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::auth::{AuthLayer, Authenticator};

/// Errors of the server itself (not of calls).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The descriptor sets could not be loaded into reflection.
    #[error("reflection set-up failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// What [`serve`] needs besides the routes.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Verifies bearer tokens.
    pub auth: Arc<Authenticator>,
    /// Fully-qualified names of the services in the routes (for health),
    /// e.g. `ctrlplane.datacenter.v1.DatacenterService`.
    pub service_names: Vec<&'static str>,
    /// Time in-flight calls get after shutdown begins.
    pub grace: Duration,
    /// Full gRPC paths (`/pkg.Service/Method`) that authenticate
    /// themselves and need no bearer token (e.g. `JoinAgent`, which carries
    /// a join token).
    pub public_methods: Vec<&'static str>,
}

/// Binds a listener, naming the address in the error.
///
/// # Errors
/// [`ServeError::Bind`].
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `routes` (plus health and reflection) on `listener` until
/// `shutdown` resolves, then drains.
///
/// # Errors
/// Reflection set-up or transport failures.
pub async fn serve(
    listener: TcpListener,
    options: ServeOptions,
    routes: Routes,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    for name in &options.service_names {
        health
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }

    // Advertise only what this process serves: the descriptor set holds
    // every ctrlplane service, most of which live in other processes.
    let reflection = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ctrlplane_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(ctrlplane_proto::GOOGLE_RPC_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
            .with_service_name("grpc.health.v1.Health")
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection");
        for name in &options.service_names {
            b = b.with_service_name(*name);
        }
        b
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let routes = routes
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);

    let local = listener.local_addr().ok();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .trace_fn(|req| tracing::debug_span!("grpc", path = %req.uri().path()))
        .layer(AuthLayer::new(options.auth.clone()).with_public_methods(&options.public_methods))
        .add_routes(routes)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    tracing::info!(addr = ?local, services = ?options.service_names, "serving gRPC");

    tokio::select! {
        res = &mut server => return res.map_err(Into::into),
        () = shutdown => {}
    }

    tracing::info!(grace = ?options.grace, "shutting down: draining in-flight calls");
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    for name in &options.service_names {
        health
            .set_service_status(*name, ServingStatus::NotServing)
            .await;
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout(options.grace, &mut server).await {
        Ok(res) => res.map_err(Into::into),
        Err(_) => {
            tracing::warn!("grace period over; dropping the remaining calls");
            Ok(())
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    // The handlers are installed now, not when the future is first polled:
    // a SIGTERM that arrives while the process is still starting up (before
    // the server awaits this future) must end it cleanly, not by the
    // signal's default action.
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (t, i) => {
                    if let Err(e) = t.and(i) {
                        tracing::warn!("cannot install signal handlers: {e}");
                    }
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
