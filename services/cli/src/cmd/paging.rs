//! Following `next_page_token` through a paginated `List*` RPC.

use ctrlplane_proto::agent::v1::{ListAgentsRequest, ListAgentsResponse};
use ctrlplane_proto::datacenter::v1::{ListDatacentersRequest, ListDatacentersResponse};

use crate::error::CliError;

/// A `List*` request: where its page starts.
pub trait PageRequest: Clone {
    /// Its `page_token`.
    fn page_token_mut(&mut self) -> &mut String;
}

/// A `List*` response: its items and where the next page starts.
pub trait PageResponse {
    /// Its `next_page_token`.
    fn next_page_token_mut(&mut self) -> &mut String;
    /// Appends the items of a later `page` (and takes its totals).
    fn absorb(&mut self, page: Self);
}

/// Fetches the first page, or with `all` every page, merged into one
/// response (no next page token; totals from the last page).
///
/// # Errors
/// The first failed call, or a server that hands out the same page token
/// twice (which would loop for ever).
pub async fn list_pages<Q, R, F>(first: Q, all: bool, mut fetch: F) -> Result<R, CliError>
where
    Q: PageRequest,
    R: PageResponse,
    F: AsyncFnMut(Q) -> Result<R, CliError>,
{
    let mut req = first;
    let mut merged = fetch(req.clone()).await?;
    if !all {
        return Ok(merged);
    }
    while !merged.next_page_token_mut().is_empty() {
        if *merged.next_page_token_mut() == *req.page_token_mut() {
            return Err(CliError::Config(format!(
                "the server returned page token {:?} twice; stopping",
                merged.next_page_token_mut()
            )));
        }
        *req.page_token_mut() = std::mem::take(merged.next_page_token_mut());
        let page = fetch(req.clone()).await?;
        merged.absorb(page);
    }
    Ok(merged)
}

impl PageRequest for ListAgentsRequest {
    fn page_token_mut(&mut self) -> &mut String {
        &mut self.page_token
    }
}

impl PageResponse for ListAgentsResponse {
    fn next_page_token_mut(&mut self) -> &mut String {
        &mut self.next_page_token
    }
    fn absorb(&mut self, page: Self) {
        self.agents.extend(page.agents);
        self.next_page_token = page.next_page_token;
    }
}

impl PageRequest for ListDatacentersRequest {
    fn page_token_mut(&mut self) -> &mut String {
        &mut self.page_token
    }
}

impl PageResponse for ListDatacentersResponse {
    fn next_page_token_mut(&mut self) -> &mut String {
        &mut self.next_page_token
    }
    fn absorb(&mut self, page: Self) {
        self.datacenters.extend(page.datacenters);
        self.next_page_token = page.next_page_token;
        self.total_size = page.total_size;
    }
}
