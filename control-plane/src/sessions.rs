//! The filter sessions open on this control plane, so that what it shows of
//! its loads can first take in every end the filters have already sent.
//!
//! A filter reports a request's end on its session just before the
//! answer's last bytes leave Envoy, and does not wait for the control plane
//! to count it (a wait would cost every request a round trip). A client
//! that has its answer and reads `/get_loads` at once could then race its
//! own end. So `/get_loads` settles first: it sends each session a numbered
//! `sync`, and the filter answers `synced` with that number. A stream keeps
//! its messages in order, so by the time the session's reader meets the
//! answer, it has counted every end the filter sent before it, including
//! that client's.
//!
//! Loads can be read through Envoy's client port, as often as a client
//! likes: reads that come while a round of syncs is out wait for the next
//! round and share it, so each session has at most one sync in flight
//! however many reads there are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use sglang_envoy_proto::SessionDown;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::time::{timeout_at, Instant};
use tonic::Status;

use crate::shutdown::Drain;

/// Where a session's messages to its filter go.
pub type Answers = mpsc::Sender<Result<SessionDown, Status>>;

/// The longest loads wait for the sessions to answer: a filter too busy
/// to answer sooner is left out (its ends are counted a little later).
pub const SETTLE_WAIT: Duration = Duration::from_millis(250);

/// The open sessions.
#[derive(Default)]
pub struct Sessions {
    next_id: AtomicU64,
    next_sync: AtomicU64,
    open: DashMap<u64, Open>,
    /// Held while a round of syncs is out; it holds when the last round
    /// started and how many sessions it missed.
    last_round: Mutex<Option<(Instant, usize)>>,
    /// Started once this control plane is going away: every session ends.
    drain: Drain,
}

/// What a settle needs of one open session.
struct Open {
    answers: Answers,
    synced: watch::Receiver<u64>,
}

/// A session's place in [`Sessions`], given up when it is dropped.
pub struct Registration {
    id: u64,
    sessions: Arc<Sessions>,
    synced: watch::Sender<u64>,
}

impl Registration {
    /// Resolves once this control plane is going away: the session then
    /// ends (`shutdown.rs`).
    pub fn drained(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.sessions.drain.started()
    }

    /// True once this control plane is going away.
    pub fn is_draining(&self) -> bool {
        self.sessions.drain.is_started()
    }

    /// The filter answered sync `n`: the ends it sent before are counted.
    pub fn synced(&self, n: u64) {
        self.synced.send_if_modified(|last| {
            let newer = n > *last;
            if newer {
                *last = n;
            }
            newer
        });
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.sessions.open.remove(&self.id);
    }
}

impl Sessions {
    /// Registers a session whose messages to the filter go to `answers`.
    pub fn open(self: &Arc<Self>, answers: Answers) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (synced, receiver) = watch::channel(0);
        self.open.insert(
            id,
            Open {
                answers,
                synced: receiver,
            },
        );
        Registration {
            id,
            sessions: self.clone(),
            synced,
        }
    }

    /// No session yet; each one, open or opened later, ends its stream
    /// once `drain` starts, so that its filter opens the next one on
    /// another replica and sends its unanswered questions there.
    pub fn new(drain: Drain) -> Self {
        Sessions {
            drain,
            ..Sessions::default()
        }
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when no session is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Waits, for `within` at most, until every open session has counted
    /// the ends its filter sent before now. Returns how many did not
    /// answer in time (or could not be asked: a session whose answers
    /// are backed up is left out rather than waited behind).
    pub async fn settle(&self, within: Duration) -> usize {
        let arrived = Instant::now();
        let deadline = arrived + within;
        let Ok(mut last) = timeout_at(deadline, self.last_round.lock()).await else {
            // Rounds for earlier reads took the whole wait.
            return self.len();
        };
        // A round whose syncs went out after this read arrived covers it.
        if let Some((started, missed)) = *last {
            if started >= arrived {
                return missed;
            }
        }
        let started = Instant::now();
        let missed = self.round(deadline).await;
        *last = Some((started, missed));
        missed
    }

    /// Sends every open session a new sync and waits, until `deadline` at
    /// most, for their answers; how many did not answer.
    async fn round(&self, deadline: Instant) -> usize {
        let n = self.next_sync.fetch_add(1, Ordering::Relaxed) + 1;
        let sync = SessionDown {
            sync: n,
            ..Default::default()
        };
        let mut asked = Vec::new();
        let mut missed = 0;
        for open in self.open.iter() {
            if open.answers.try_send(Ok(sync.clone())).is_ok() {
                asked.push(open.synced.clone());
            } else {
                missed += 1;
            }
        }
        for mut synced in asked {
            match timeout_at(deadline, synced.wait_for(|&last| last >= n)).await {
                // Answered, or the session ended (nothing of it to wait for).
                Ok(_) => {}
                Err(_) => missed += 1,
            }
        }
        missed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settle_waits_for_each_session_to_answer_its_sync() {
        let sessions = Arc::new(Sessions::default());
        let (tx, mut rx) = mpsc::channel(4);
        let session = sessions.open(tx);
        let filter = tokio::spawn(async move {
            let down = rx.recv().await.unwrap().unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            session.synced(down.sync);
            session
        });
        let started = Instant::now();
        assert_eq!(sessions.settle(Duration::from_secs(5)).await, 0);
        assert!(started.elapsed() >= Duration::from_millis(30));
        let session = filter.await.unwrap();
        assert_eq!(sessions.len(), 1);
        drop(session);
        assert!(sessions.is_empty());
    }

    #[tokio::test]
    async fn a_silent_session_is_left_out_after_the_wait_and_an_ended_one_at_once() {
        let sessions = Arc::new(Sessions::default());
        let (tx, _silent_rx) = mpsc::channel(4);
        let _silent = sessions.open(tx);
        let (tx, rx) = mpsc::channel(4);
        let ending = sessions.open(tx);
        let ender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(rx);
            // The session ends without answering; its entry goes with it,
            // and its watch closes.
            drop(ending);
        });
        let started = Instant::now();
        assert_eq!(sessions.settle(Duration::from_millis(100)).await, 1);
        assert!(started.elapsed() >= Duration::from_millis(100));
        ender.await.unwrap();
        assert_eq!(sessions.len(), 1);
    }

    #[tokio::test]
    async fn reads_that_come_together_share_rounds_of_syncs() {
        let sessions = Arc::new(Sessions::default());
        let (tx, mut rx) = mpsc::channel(1024);
        let session = sessions.open(tx);
        let filter = tokio::spawn(async move {
            let mut syncs = 0;
            // Answers each sync a little later, until none comes for a while.
            let quiet = Duration::from_millis(200);
            while let Ok(Some(Ok(down))) = tokio::time::timeout(quiet, rx.recv()).await {
                syncs += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
                session.synced(down.sync);
            }
            syncs
        });
        let reads: Vec<_> = (0..200)
            .map(|_| {
                let sessions = sessions.clone();
                tokio::spawn(async move { sessions.settle(Duration::from_secs(5)).await })
            })
            .collect();
        for read in reads {
            assert_eq!(read.await.unwrap(), 0);
        }
        let syncs = filter.await.unwrap();
        // One round for the first read, one for those that came during
        // it (and perhaps a few more as the reads trickle in), not 200.
        assert!((1..=10).contains(&syncs), "{syncs} syncs for 200 reads");
    }

    #[tokio::test]
    async fn a_session_whose_answers_are_backed_up_is_not_waited_for() {
        let sessions = Arc::new(Sessions::default());
        let (tx, _rx) = mpsc::channel(1);
        tx.try_send(Ok(SessionDown::default())).unwrap();
        let _full = sessions.open(tx);
        let started = Instant::now();
        assert_eq!(sessions.settle(Duration::from_secs(5)).await, 1);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_drain_reaches_sessions_open_and_opened_later() {
        let drain = Drain::default();
        let sessions = Arc::new(Sessions::new(drain.clone()));
        let (tx, _rx) = mpsc::channel(4);
        let open = sessions.open(tx.clone());
        let told = open.drained();
        tokio::pin!(told);
        assert!(!open.is_draining());
        assert!(futures::poll!(&mut told).is_pending());
        drain.start();
        assert!(futures::poll!(&mut told).is_ready());
        assert!(open.is_draining());
        let later = sessions.open(tx);
        assert!(
            later.is_draining(),
            "a session opened while draining ends at once"
        );
        let told_later = later.drained();
        tokio::pin!(told_later);
        assert!(futures::poll!(&mut told_later).is_ready());
    }
}
