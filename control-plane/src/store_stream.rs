//! A Redis stream on the fleet store that every replica writes to and reads
//! the others' entries from: the shared trees' inserts (`shared_tree.rs`)
//! and the ends passed on (`shared_ends.rs`). Each entry carries its
//! writer's replica id (field `r`), so a replica skips its own.

use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamMaxlen, StreamReadOptions, StreamReadReply};
use redis::AsyncCommands as _;

use crate::store_link::{timed, StoreError, StoreLink};

/// One replica's side of a shared stream.
pub struct StoreStream {
    /// The link to the store, for the users' own reports.
    pub link: StoreLink,
    key: String,
    replica: String,
    /// The last entry read (`0`: read from the stream's start).
    last: String,
}

impl StoreStream {
    /// The stream `key` on the store at `url`, this process's entries
    /// marked `replica`; read from its start.
    pub fn new(url: &str, key: String, replica: &str) -> Result<Self, redis::RedisError> {
        Ok(StoreStream {
            link: StoreLink::new(redis::Client::open(url)?),
            key,
            replica: replica.to_string(),
            last: "0".to_string(),
        })
    }

    /// The connection, opened if there is none.
    pub async fn conn(&mut self) -> Result<MultiplexedConnection, StoreError> {
        self.link.conn().await
    }

    /// Appends `entries` (each its fields, without the replica's mark) in
    /// one round trip, keeping about `max_len` entries in the stream.
    pub async fn append<'a>(
        &self,
        conn: &mut MultiplexedConnection,
        entries: impl IntoIterator<Item = Vec<(&'static str, &'a [u8])>>,
        max_len: usize,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for entry in entries {
            let mut fields = Vec::with_capacity(entry.len() + 1);
            fields.push(("r", self.replica.as_bytes()));
            fields.extend(entry);
            pipe.xadd_maxlen(&self.key, StreamMaxlen::Approx(max_len), "*", &fields)
                .ignore();
        }
        timed(pipe.query_async::<()>(conn)).await
    }

    /// The other replicas' entries written since the last read, at most
    /// `count`.
    pub async fn read_others(
        &mut self,
        conn: &mut MultiplexedConnection,
        count: usize,
    ) -> Result<Vec<StreamId>, StoreError> {
        let options = StreamReadOptions::default().count(count);
        let reply: Option<StreamReadReply> = timed(conn.xread_options(
            std::slice::from_ref(&self.key),
            std::slice::from_ref(&self.last),
            &options,
        ))
        .await?;
        let mut theirs = Vec::new();
        let entries = reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids);
        for entry in entries {
            self.last.clone_from(&entry.id);
            if entry.get::<String>("r").as_deref() != Some(self.replica.as_str()) {
                theirs.push(entry);
            }
        }
        Ok(theirs)
    }
}
