//! The client the control plane uses to call agents.

use std::sync::Arc;

use ctrlplane_proto::provider::v1::provider_service_client::ProviderServiceClient;
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::client::{AddressError, AuthedChannel, BearerInterceptor, authed_channel};

/// A `ProviderService` client whose calls carry a `system:service` token.
pub type ProviderClient = ProviderServiceClient<AuthedChannel>;

/// Largest message accepted from an agent (log batches, exec output).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// A lazily connecting client for the agent at `endpoint`, minting service
/// tokens as `subject` (e.g. `bootstrap`).
///
/// # Errors
/// An invalid endpoint.
pub fn provider_client(
    endpoint: &str,
    auth: Arc<Authenticator>,
    subject: &str,
) -> Result<ProviderClient, AddressError> {
    let channel = authed_channel(endpoint, BearerInterceptor::service(auth, subject))?;
    Ok(ProviderServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}
