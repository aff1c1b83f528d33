//! The spill gate of `cost_aware`: a worker far above the fleet's mean of
//! requests in flight is passed over while another is not.
//!
//! `cost_aware` prices the work queued on a worker in bytes, at half
//! weight: that keeps prompts with their caches, but a
//! worker whose prompts are cheap tails (a hot group's follow-ups) can pile
//! up requests long before their bytes outweigh a cold prefill elsewhere.
//! On a fleet of many small units (the benchmark's DP shape: 8 ranks) that
//! left one rank queueing while its siblings idled. smg 1.13.0's
//! `cache_aware` bounds the same thing with a gate on requests in flight
//! against the mean; this is that gate, with its defaults, as a bound on
//! top of the price rather than a mode switch.

/// A worker is over the gate at more than this multiple of the mean.
const REL: f64 = 1.5;

/// ...and more than this many requests above it, or two standard
/// deviations of a Poisson count at the mean if that is more: the natural
/// swing of in-flight counts, so a small fleet's noise does not trip it.
const MIN_MARGIN: f64 = 4.0;

/// The count of requests in flight above which a worker is over the gate,
/// on a fleet with these `loads` (one per worker). Some worker always
/// holds at most the mean, which is under the limit, so the gate never
/// passes over every worker.
pub(crate) fn limit(loads: impl ExactSizeIterator<Item = usize>) -> f64 {
    let n = loads.len();
    if n == 0 {
        return f64::INFINITY;
    }
    let mean = loads.sum::<usize>() as f64 / n as f64;
    let margin = (2.0 * mean.sqrt()).max(MIN_MARGIN);
    (mean + margin).max(REL * mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `loads` are over the gate; `None` when none is.
    fn over(loads: &[usize]) -> Option<Vec<bool>> {
        let limit = limit(loads.iter().copied());
        let over: Vec<bool> = loads.iter().map(|&l| l as f64 > limit).collect();
        over.contains(&true).then_some(over)
    }

    #[test]
    fn a_worker_far_above_the_mean_is_over() {
        // Mean 3, margin 4: 12 is over (> 7 and > 4.5), the idle are not.
        assert_eq!(over(&[12, 0, 0, 0]), Some(vec![true, false, false, false]));
    }

    #[test]
    fn the_natural_swing_of_counts_is_not_over() {
        // Mean 2.25: 6 is under mean + 4, 7 (mean 2.5) over it.
        assert_eq!(over(&[6, 1, 1, 1]), None);
        assert!(over(&[7, 1, 1, 1]).is_some());
        // Mean 20, margin 2 * sqrt(20) = 8.9: 28 is under it; 31 (mean 20) over it and over 1.5x.
        assert_eq!(over(&[28, 18, 17, 17]), None);
        assert_eq!(
            over(&[31, 17, 16, 16]),
            Some(vec![true, false, false, false])
        );
    }

    #[test]
    fn high_but_even_loads_are_not_over() {
        assert_eq!(over(&[40, 40, 40, 40]), None);
        assert_eq!(over(&[]), None);
        assert_eq!(over(&[50]), None);
    }
}
