//! Percentiles and small statistics helpers.

use serde::{Deserialize, Serialize};

/// Summary of a sample.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Sample size.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Percentiles {
    /// Summarises `values` (sorted in place). All zero when empty.
    pub fn of(values: &mut [f64]) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        Percentiles {
            count: n,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: quantile(values, 0.50),
            p95: quantile(values, 0.95),
            p99: quantile(values, 0.99),
            max: values[n - 1],
        }
    }
}

/// The `q` quantile of sorted `values` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of `values` (sorted in place); 0 when empty.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    quantile(values, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(p.count, 100);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }
}
