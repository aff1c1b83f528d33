//! How long a decision took: on the clock, and (with
//! `--decision-cpu-metric`) in its thread's CPU time.
//!
//! The clock counts every moment the thread was not running too: on a
//! busy machine (several control planes, Envoy and the workers on 2
//! cores, as in the benchmark of several replicas) a decision's p99 is
//! mostly the scheduler's. The CPU time is the decision's own work, the
//! measure of "sharing adds no work on the request path". Reading it is a
//! system call (about 0.6 us here, against 35 ns for the clock), twice a
//! decision, so it is measured only when asked for.

use std::time::{Duration, Instant};

/// Started when a decision starts.
pub(super) struct Stopwatch {
    wall: Instant,
    cpu: Option<Duration>,
}

impl Stopwatch {
    /// Starts now; with `cpu`, the thread's CPU time too.
    pub(super) fn start(cpu: bool) -> Self {
        Stopwatch {
            wall: Instant::now(),
            cpu: cpu.then(thread_cpu).flatten(),
        }
    }

    /// Seconds since the start: on the clock, and of this thread's CPU
    /// when measured. The decision runs on one thread, start to end
    /// (nothing in it awaits). The CPU is read first, so that its span
    /// lies inside the clock's.
    pub(super) fn read(&self) -> (f64, Option<f64>) {
        let cpu = self
            .cpu
            .and_then(|start| Some(thread_cpu()?.saturating_sub(start).as_secs_f64()));
        (self.wall.elapsed().as_secs_f64(), cpu)
    }
}

/// The calling thread's CPU time so far; `None` where the clock cannot
/// be read.
fn thread_cpu() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration;
    // the call reads nothing else.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } == 0;
    ok.then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_work_and_not_sleep() {
        let watch = Stopwatch::start(true);
        std::thread::sleep(Duration::from_millis(30));
        let slept = watch.read().1.expect("a thread CPU clock");
        let mut x = 0u64;
        let busy = Instant::now();
        while busy.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let (wall, cpu) = watch.read();
        let worked = cpu.expect("a thread CPU clock") - slept;
        assert!(wall >= 0.06);
        assert!(slept < 0.01, "30 ms asleep counted as {slept} s of CPU");
        assert!(worked > 0.015, "30 ms of work counted as {worked} s of CPU");
    }

    #[test]
    fn no_cpu_time_unless_asked() {
        assert_eq!(Stopwatch::start(false).read().1, None);
    }
}
