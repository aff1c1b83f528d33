use std::collections::HashMap;

use super::config::{RateLimitYaml, TenantRate};
use super::*;

const D: Class = Class::Default;

fn admission(limit: usize, queue_size: usize, timeout_ms: u64) -> Admission {
    let q = ClassQueue {
        size: queue_size,
        timeout: Duration::from_millis(timeout_ms),
        starvation: Duration::MAX,
    };
    Admission::new(limit, [q; 4])
}

fn queued(a: Admit) -> (oneshot::Receiver<()>, Duration) {
    match a {
        Admit::Queued(rx, wait) => (rx, wait),
        other => panic!("expected to wait, got {other:?}"),
    }
}

fn options(limit: usize, queue_size: usize, timeout_ms: u64) -> AdmissionOptions {
    AdmissionOptions {
        limit,
        queue_size,
        queue_timeout: Duration::from_millis(timeout_ms),
        tenants: TenantOptions::default(),
    }
}

fn caller(tenant: &str, asked: Class) -> Caller {
    Caller {
        tenant: tenant.to_string(),
        asked,
    }
}

fn status(u: Option<Unrouted>) -> Option<(u16, String)> {
    match u {
        Some(Unrouted::Rejected(r)) => Some((r.status, r.kind)),
        _ => None,
    }
}

#[tokio::test]
async fn slots_queue_and_pass_on_in_order() {
    let a = admission(1, 2, 5_000);
    assert!(matches!(a.admit(1, D), Admit::Now));
    assert!(
        matches!(a.admit(1, D), Admit::Now),
        "an admitted ticket asks again"
    );
    let (rx2, wait) = queued(a.admit(2, D));
    let (rx3, _) = queued(a.admit(3, D));
    assert!(matches!(a.admit(4, D), Admit::Full));
    assert_eq!(a.counts(), (1, 2));
    a.release(1);
    assert_eq!(a.wait(2, rx2, wait).await, Ok(()));
    assert_eq!(a.counts(), (1, 1));
    a.release(2);
    assert_eq!(a.wait(3, rx3, wait).await, Ok(()));
    a.release(3);
    assert_eq!(a.counts(), (0, 0));
}

#[tokio::test]
async fn a_wait_times_out_and_leaves_the_queue() {
    let a = admission(1, 1, 50);
    assert!(matches!(a.admit(1, D), Admit::Now));
    let (rx, wait) = queued(a.admit(2, D));
    assert_eq!(
        a.wait(2, rx, wait).await,
        Err(NotAdmitted::TimedOut(Duration::from_millis(50)))
    );
    assert_eq!(a.counts(), (1, 0));
    // The slot then goes to nobody.
    a.release(1);
    assert_eq!(a.counts(), (0, 0));
}

#[tokio::test]
async fn a_request_that_ends_while_waiting_leaves_the_queue() {
    let a = admission(1, 2, 5_000);
    assert!(matches!(a.admit(1, D), Admit::Now));
    let (rx2, _) = queued(a.admit(2, D));
    let (rx3, wait) = queued(a.admit(3, D));
    a.release(2);
    drop(rx2);
    a.release(1);
    assert_eq!(
        a.wait(3, rx3, wait).await,
        Ok(()),
        "the slot skipped the gone request"
    );
    assert_eq!(a.counts(), (1, 0));
}

#[test]
fn no_queue_means_full_at_once() {
    let a = admission(2, 0, 1_000);
    assert!(matches!(a.admit(1, D), Admit::Now));
    assert!(matches!(a.admit(2, D), Admit::Now));
    assert!(matches!(a.admit(3, D), Admit::Full));
}

#[tokio::test]
async fn the_gate_queues_answers_and_passes_slots_on() {
    let g = Gate::new(options(1, 1, 200));
    let anyone = Caller::default();
    assert!(g.check(1, &anyone).is_none(), "a free slot: route it");
    assert_eq!(g.check(2, &anyone), Some(Unrouted::Queued { wait_ms: 200 }));
    assert_eq!(
        status(g.check(3, &anyone)),
        Some((429, "rate_limit_exceeded".into()))
    );
    g.release(1);
    assert!(g.wait(2).await.admitted);
    assert!(
        g.check(2, &anyone).is_none(),
        "the admitted ticket asks again"
    );
    // A queued request nobody frees a slot for times out.
    let _ = g.check(4, &anyone);
    let timed_out = g.wait(4).await;
    assert_eq!(timed_out.rejection.map(|r| r.http_status), Some(408));
    g.release(2);
    assert_eq!(g.counts(), (0, 0));
}

fn rated(limit: usize, default_rpm: u32) -> Gate {
    let mut o = options(limit, 4, 5_000);
    o.tenants.rates = Some(RateLimitYaml {
        default_policy: TenantRate {
            tenant_key: None,
            tokens_per_minute: 1_000_000,
            requests_per_minute: default_rpm,
            model_rules: Vec::new(),
        },
        tenants: Vec::new(),
    });
    Gate::new(o)
}

#[test]
fn a_tenant_over_its_rate_is_refused_while_another_is_served_at_once() {
    let g = rated(100, 2);
    let red = caller("header:red", D);
    assert!(g.check(1, &red).is_none());
    assert!(g.check(2, &red).is_none());
    assert_eq!(
        status(g.check(3, &red)),
        Some((429, "tenant_rate_limit_exceeded".into()))
    );
    // The refused request took no slot: only the two admitted hold one.
    assert_eq!(g.counts(), (2, 0));
    let blue = caller("header:blue", D);
    assert!(
        g.check(4, &blue).is_none(),
        "another tenant is admitted at once"
    );
    // An admitted request asked about again is not charged again.
    assert!(g.check(1, &red).is_none());
}

fn prioritised(limit: usize, queue_size: usize, default_max: Class) -> Gate {
    let q = ClassQueue {
        size: queue_size,
        timeout: Duration::from_secs(5),
        starvation: Duration::from_secs(3600),
    };
    let mut o = options(limit, 0, 5_000);
    o.tenants.priority = Some(Priorities {
        queues: [q; 4],
        default_max,
        tenant_max: HashMap::from([("header:vip".to_string(), Class::System)]),
    });
    Gate::new(o)
}

#[tokio::test]
async fn a_high_priority_request_goes_before_a_queue_of_low_ones() {
    let g = prioritised(1, 3, Class::Interactive);
    let bulk = caller("header:batch", Class::Bulk);
    assert!(g.check(1, &bulk).is_none());
    for ticket in 2..=4 {
        assert!(matches!(
            g.check(ticket, &bulk),
            Some(Unrouted::Queued { .. })
        ));
    }
    assert_eq!(
        status(g.check(5, &bulk)),
        Some((429, "scheduler_queue_full".into())),
        "bulk's queue is full"
    );
    // Its own class's queue has room: it waits behind nobody.
    let urgent = caller("header:chat", Class::Interactive);
    assert!(matches!(g.check(6, &urgent), Some(Unrouted::Queued { .. })));
    g.release(1);
    assert!(
        g.wait(6).await.admitted,
        "the interactive request goes first"
    );
    assert_eq!(g.counts(), (1, 3), "the bulk ones still wait");
}

#[test]
fn a_tenant_gets_no_higher_class_than_it_may_have() {
    let g = prioritised(1, 4, Class::Default);
    let p = g.priorities.as_ref().unwrap();
    assert_eq!(p.class_for("header:chat", Class::System), Class::Default);
    assert_eq!(p.class_for("header:chat", Class::Bulk), Class::Bulk);
    assert_eq!(p.class_for("header:vip", Class::System), Class::System);
}

#[tokio::test]
async fn a_timed_out_wait_reads_as_the_scheduler_s() {
    let q = ClassQueue {
        size: 1,
        timeout: Duration::from_millis(30),
        starvation: Duration::MAX,
    };
    let mut o = options(1, 0, 5_000);
    o.tenants.priority = Some(Priorities {
        queues: [q; 4],
        default_max: Class::Default,
        tenant_max: HashMap::new(),
    });
    let g = Gate::new(o);
    assert!(g.check(1, &Caller::default()).is_none());
    assert_eq!(
        g.check(2, &Caller::default()),
        Some(Unrouted::Queued { wait_ms: 30 })
    );
    let r = g.wait(2).await.rejection.unwrap();
    assert_eq!(
        (r.http_status, r.error_type.as_str()),
        (408, "scheduler_queue_timeout")
    );
}
