//! Retries after failed attempts: what a decision tells Envoy, and what a
//! finished request tells the circuit breakers.
//!
//! Envoy does the retrying (it holds the body, and retries before any byte
//! reaches the client); the control plane decides where. A decision lists
//! distinct endpoints, never one twice: the chosen worker, then the least
//! loaded other servers (`--max-fallback-workers`), or the chosen one alone
//! where the gateway takes one ([`Destination::One`]). The `override_host`
//! load balancer walks that list, one entry per attempt; attempts past its
//! end go where the gateway sends them (`override_host`'s fallback policy,
//! or an `ORIGINAL_DST` cluster's one host), and Envoy reports where the
//! last one went. So when the request ends, its attempt count and that
//! report say which workers failed it.
//!
//! The route's `retry_policy` (envoy/envoy.yaml) says what is retried: a
//! refused or reset connection, 408, 429 and 5xx answers, a timeout. The
//! decision sets how many times (`x-envoy-max-retries`), and, for a stream,
//! how long the worker may take to start answering
//! (`x-envoy-upstream-rq-per-try-timeout-ms`): SGLang sends a stream's
//! headers at once, so a stream that has not started is a stalled worker,
//! and Envoy moves the request on (the per-try timeout ends once the
//! answer has started; it never cuts a stream short).

use std::sync::Arc;
use std::time::Duration;

use sglang_envoy_body::is_worker_failure;
use sglang_envoy_lifecycle::Destination;
use sglang_envoy_proto::{Completion, Header};

use crate::policy::least_loaded;
use crate::workers::Worker;

/// How requests are retried (the `--retry-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOptions {
    /// Attempts per request, the first included (`--retry-max-retries`,
    /// sglang-router's meaning; 1 with `--disable-retries`).
    pub max_attempts: u32,
    /// Distinct other servers listed after the chosen one
    /// (`--max-fallback-workers`), where the gateway takes a list.
    pub max_fallbacks: usize,
    /// How long a streamed answer may take to start before the attempt
    /// counts as failed (`--stream-start-timeout-secs`; `None`: no bound).
    pub stream_start_timeout: Option<Duration>,
}

impl Default for RetryOptions {
    fn default() -> Self {
        RetryOptions {
            max_attempts: 5,
            max_fallbacks: 2,
            stream_start_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// The distinct units to try, in order, one per attempt: `units[chosen]`
/// first, then (with [`Destination::List`]) the least loaded other servers,
/// at most `max_fallbacks` and fewer than `max_attempts`.
pub fn plan(
    units: &[Arc<Worker>],
    chosen: usize,
    options: &RetryOptions,
    destination: Destination,
) -> Vec<Arc<Worker>> {
    let attempts = options.max_attempts.max(1) as usize;
    let fallbacks = match destination {
        Destination::One => 0,
        Destination::List => options.max_fallbacks,
    };
    let Some(first) = units.get(chosen) else {
        return Vec::new();
    };
    let mut distinct = vec![first.clone()];
    while distinct.len() <= fallbacks && distinct.len() < attempts {
        // Ranks of a server already listed share its endpoint.
        match least_loaded(units, |i| {
            !distinct.iter().any(|d| d.endpoint == units[i].endpoint)
        }) {
            Some(i) => distinct.push(units[i].clone()),
            None => break,
        }
    }
    distinct
}

/// The request headers that bound Envoy's attempts (`--retry-max-retries`:
/// the plan's endpoints, then where the gateway sends the rest) and, for a
/// stream, how long its start may take.
pub fn request_headers(stream: bool, options: &RetryOptions) -> Vec<Header> {
    let mut headers = vec![Header {
        name: "x-envoy-max-retries".into(),
        value: options.max_attempts.max(1).saturating_sub(1).to_string(),
    }];
    if let (true, Some(timeout)) = (stream, options.stream_start_timeout) {
        headers.push(Header {
            name: "x-envoy-upstream-rq-per-try-timeout-ms".into(),
            value: timeout.as_millis().to_string(),
        });
    }
    headers
}

/// What each attempt of a finished request says about its worker: the
/// attempts before the last failed (those past the plan's end went where
/// the gateway sent them: unknown, unless to the host Envoy reports for the
/// last one); the last one failed when its answer says the worker did (5xx,
/// 408, 429, or none), and says nothing when the client left before any
/// answer or the router answered for its own reasons. The last attempt's
/// worker is the one Envoy reports (`upstream_host`), else the plan's entry
/// for it.
pub fn outcomes(plan: &[Arc<Worker>], c: &Completion) -> Vec<(Arc<Worker>, bool)> {
    let reported = plan
        .iter()
        .position(|w| !c.upstream_host.is_empty() && w.endpoint_text == c.upstream_host);
    // With no count reported: the list is walked in order, so a last
    // attempt on its k-th entry means k + 1 attempts. (A count is trusted:
    // override_host skips an entry its cluster does not hold.)
    let attempts = match c.attempts {
        0 => reported.map_or(1, |k| k + 1),
        n => n as usize,
    };
    let mut out: Vec<(Arc<Worker>, bool)> = plan
        .iter()
        .take(attempts - 1)
        .map(|w| (w.clone(), false))
        .collect();
    let last = reported.or(Some(attempts - 1)).and_then(|i| plan.get(i));
    let Some(last) = last else {
        return out;
    };
    let status = c.http_status;
    if (c.client_cancelled && status == 0) || c.local_reply {
        return out;
    }
    out.push((last.clone(), !is_worker_failure(status)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{WorkerAddress, WorkerSpec};

    fn units(ports: &[u16]) -> Vec<Arc<Worker>> {
        ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let a = WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], *p)));
                Arc::new(Worker::new(
                    a,
                    WorkerSpec::REGULAR,
                    None,
                    Arc::default(),
                    i as u32,
                ))
            })
            .collect()
    }

    fn ports(plan: &[Arc<Worker>]) -> Vec<u16> {
        plan.iter().map(|w| w.endpoint.port()).collect()
    }

    #[test]
    fn plans_list_distinct_servers_never_one_twice() {
        let u = units(&[1, 2, 3, 4]);
        u[3].increment_load();
        let opts = RetryOptions::default();
        // Chosen first, then the least loaded others (the busy one last),
        // at most --max-fallback-workers of them.
        let p = plan(&u, 3, &opts, Destination::List);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].endpoint.port(), 4);
        let all: std::collections::HashSet<u16> = ports(&p).into_iter().collect();
        assert_eq!(all.len(), 3, "no endpoint twice: {:?}", ports(&p));
        let two = units(&[1, 2]);
        assert_eq!(ports(&plan(&two, 0, &opts, Destination::List)), [1, 2]);
        let once = RetryOptions {
            max_attempts: 1,
            ..opts
        };
        assert_eq!(ports(&plan(&u, 1, &once, Destination::List)), [2]);
        assert!(plan(&u, 9, &opts, Destination::List).is_empty());
    }

    #[test]
    fn a_gateway_that_takes_one_endpoint_gets_the_chosen_one_alone() {
        let u = units(&[1, 2, 3]);
        let p = plan(&u, 2, &RetryOptions::default(), Destination::One);
        assert_eq!(ports(&p), [3]);
    }

    #[test]
    fn headers_bound_attempts_and_stream_starts() {
        let opts = RetryOptions::default();
        let h = request_headers(false, &opts);
        assert_eq!(
            (h[0].name.as_str(), h[0].value.as_str()),
            ("x-envoy-max-retries", "4"),
            "--retry-max-retries attempts, whatever the list holds"
        );
        assert_eq!(h.len(), 1);
        let h = request_headers(true, &opts);
        assert_eq!(h[1].value, "10000");
    }

    #[test]
    fn outcomes_blame_the_attempts_before_the_last() {
        let u = units(&[1, 2, 3]);
        let done = |attempts, http_status, client_cancelled| Completion {
            attempts,
            http_status,
            client_cancelled,
            ..Default::default()
        };
        let verdicts = |c: Completion| -> Vec<(u16, bool)> {
            outcomes(&u, &c)
                .into_iter()
                .map(|(w, ok)| (w.endpoint.port(), ok))
                .collect()
        };
        assert_eq!(verdicts(done(1, 200, false)), [(1, true)]);
        assert_eq!(
            verdicts(done(3, 200, false)),
            [(1, false), (2, false), (3, true)]
        );
        assert_eq!(verdicts(done(2, 503, false)), [(1, false), (2, false)]);
        assert_eq!(
            verdicts(done(1, 404, false)),
            [(1, true)],
            "a client error is not the worker's"
        );
        assert_eq!(verdicts(done(1, 429, false)), [(1, false)]);
        assert_eq!(verdicts(done(1, 0, true)), Vec::<(u16, bool)>::new());
        let prefill_failed = Completion {
            local_reply: true,
            ..done(2, 500, false)
        };
        assert_eq!(
            verdicts(prefill_failed),
            [(1, false)],
            "the last is not blamed"
        );
        assert_eq!(
            verdicts(done(0, 200, false)),
            [(1, true)],
            "unknown counts as one"
        );
        assert_eq!(
            verdicts(done(9, 200, false)),
            [(1, false), (2, false), (3, false)],
            "attempts past the plan went where the gateway sent them: unknown"
        );
        // Envoy reports where the last attempt went: that worker answered.
        let reported = |attempts, http_status, host: u16| Completion {
            upstream_host: format!("127.0.0.1:{host}"),
            ..done(attempts, http_status, false)
        };
        let one: Vec<(u16, bool)> = outcomes(&u[..1], &reported(5, 503, 1))
            .into_iter()
            .map(|(w, ok)| (w.endpoint.port(), ok))
            .collect();
        assert_eq!(
            one,
            [(1, false), (1, false)],
            "one endpoint (ORIGINAL_DST): the attempts went back to it"
        );
        assert_eq!(verdicts(reported(1, 503, 1)), [(1, false)]);
        assert_eq!(
            verdicts(reported(0, 200, 2)),
            [(1, false), (2, true)],
            "served by the second with no count: the first failed"
        );
        assert_eq!(
            verdicts(reported(2, 200, 3)),
            [(1, false), (3, true)],
            "the reported host answered, not the plan's second (skipped)"
        );
    }
}
