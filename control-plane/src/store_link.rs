//! One replica's link to the fleet store (`--fleet-store-url`), as each of
//! its users (`fleet_store.rs`, `shared_tree.rs`) keeps it: a connection
//! opened on demand and dropped on any failure, every exchange bounded in
//! time, and whether the store answered last so that only changes are
//! logged.

use redis::aio::MultiplexedConnection;
use tracing::{info, warn};

/// A new replica id: the mark of this process's entries in the store
/// (its shared tree inserts, the key of its loads). Random, so that a
/// restarted replica learns what its earlier life wrote.
pub fn draw_replica_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Longest wait for one exchange with the store (connect included).
pub const OP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why one exchange with the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis refused or failed.
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    /// No answer in time.
    #[error("no answer within {OP_TIMEOUT:?}")]
    Timeout,
}

/// Bounds one exchange with the store by [`OP_TIMEOUT`].
pub async fn timed<T>(
    f: impl std::future::Future<Output = Result<T, redis::RedisError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(OP_TIMEOUT, f)
        .await
        .map_err(|_| StoreError::Timeout)?
        .map_err(StoreError::from)
}

/// A connection to the store, and whether it answered last.
pub struct StoreLink {
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
    up: Option<bool>,
}

impl StoreLink {
    /// A link through `client`; nothing is connected until the first
    /// exchange.
    pub fn new(client: redis::Client) -> Self {
        StoreLink {
            client,
            conn: None,
            up: None,
        }
    }

    /// The connection, opened if there is none.
    pub async fn conn(&mut self) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let c = timed(self.client.get_multiplexed_async_connection()).await?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// Takes a round's `result` and logs only a change: the store just
    /// reached (`shared`: what is shared now) or just lost (`meanwhile`:
    /// what this replica does until it is back).
    pub fn report<T>(&mut self, result: &Result<T, StoreError>, shared: &str, meanwhile: &str) {
        match (self.settle(result), result) {
            (Some(true), _) => info!("fleet store reached: {shared}"),
            (Some(false), Err(e)) => {
                warn!(error = %e, "fleet store unreachable: {meanwhile} until it is back")
            }
            _ => {}
        }
    }

    /// Takes a round's `result` (a failure drops the connection); the
    /// store's new state when it differs from the last round's: what is
    /// worth a log line.
    fn settle<T>(&mut self, result: &Result<T, StoreError>) -> Option<bool> {
        let up = result.is_ok();
        if !up {
            self.conn = None;
        }
        (self.up.replace(up) != Some(up)).then_some(up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_are_reported_and_a_failure_drops_the_connection() {
        let mut link = StoreLink::new(redis::Client::open("redis://127.0.0.1:1/0").unwrap());
        let ok: Result<(), StoreError> = Ok(());
        let failed: Result<(), StoreError> = Err(StoreError::Timeout);
        assert_eq!(link.settle(&failed), Some(false));
        assert_eq!(link.settle(&failed), None);
        assert_eq!(link.settle(&ok), Some(true));
        assert_eq!(link.settle(&ok), None);
        assert_eq!(link.settle(&failed), Some(false));
        assert!(link.conn.is_none());
    }
}
