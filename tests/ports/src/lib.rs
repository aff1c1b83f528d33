//! Loopback ports for the processes the end-to-end tests and the
//! benchmarks start, drawn where nothing else will take them first.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// A loopback port that was free a moment ago and that this process
/// has not handed out before (between handing out and binding, a port is
/// free, so two stacks starting in parallel could otherwise get the same).
///
/// It is drawn below the kernel's ephemeral range where there is room
/// ([`listen_range`]): the source ports of outgoing connections, and the
/// simulated workers' ZMQ sockets bound to port 0, come from that range, so
/// a port drawn there could be taken by one of them before the process it
/// was meant for binds it (a worker then exits with "cannot listen on").
/// 0 when 200 draws found none.
pub fn free_port() -> u16 {
    static ISSUED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let range = listen_range();
    for _ in 0..200 {
        let candidate = range.map_or(0, |(low, high)| {
            let span = u64::from(high - low) + 1;
            low + (random() % span) as u16
        });
        let port = TcpListener::bind(("127.0.0.1", candidate))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        let mut issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
        if port != 0 && issued.insert(port) {
            return port;
        }
    }
    0
}

/// The ports [`free_port`] draws from: from 10000 to just below the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`), and below
/// 29000, where the ports this project publishes by default begin (29000
/// metrics, 30000 clients, 30010-30011 the control plane, 31001-31002 the
/// quick start's workers: the compose and quick-start tests bind those);
/// `None` (any free port) when that leaves fewer than 4096.
fn listen_range() -> Option<(u16, u16)> {
    const LOW: u16 = 10_000;
    const DEFAULTS: u16 = 29_000;
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral: u16 = text.split_whitespace().next()?.parse().ok()?;
    let high = ephemeral.min(DEFAULTS).saturating_sub(1);
    (high >= LOW + 4096).then_some((LOW, high))
}

/// A random number (std's hasher keys are drawn at random for each
/// `RandomState`).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports handed out stay clear of the range that outgoing connections
    /// and port-0 binds take theirs from, and are never handed out twice.
    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_once() {
        let Some((low, high)) = listen_range() else {
            eprintln!("skipped: no room below this kernel's ephemeral range");
            return;
        };
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        for &port in &ports {
            assert!((low..=high).contains(&port), "{port} not in {low}..={high}");
        }
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
    }
}
