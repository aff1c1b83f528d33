//! Reading a Prometheus histogram out of a `/metrics` page: its cumulative
//! buckets, several of them summed (one per control plane, one per run),
//! and a quantile interpolated inside a bucket, as PromQL's
//! `histogram_quantile` does. The bucket bounds are read from the page,
//! never assumed: the control plane's decision histogram has had more than
//! one set of them.

use serde::{Deserialize, Serialize};

/// One histogram: cumulative counts at each upper bound.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// `(le, observations <= le)`, ascending by `le`; the last bound is
    /// `+Inf` when the page had it.
    pub buckets: Vec<(f64, f64)>,
    /// `_count`: every observation.
    pub count: f64,
    /// `_sum`: their total.
    pub sum: f64,
}

/// The value of label `name` in a `{a="x",b="y"}` label set, unescaped
/// enough for bucket bounds (which hold no quotes).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// A bound as Prometheus writes it: `0.000016`, `1.6e-5`, `+Inf`.
fn bound(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "inf" => Some(f64::INFINITY),
        _ => s.parse().ok(),
    }
}

/// The series of one sample line, `name{labels} value [timestamp]`:
/// `(name, labels, value)`.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            ((&line[..open], &line[open + 1..close]), &line[close + 1..])
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            ((name, ""), rest)
        }
    };
    let value = bound(rest.split_whitespace().next()?)?;
    Some((series.0, series.1, value))
}

/// The value of gauge or counter `name` in `page`, its series summed
/// over their labels; `None` when the page has none of it.
pub fn value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| sample(l.trim()))
        .filter(|(series, _, _)| *series == name)
        .map(|(_, _, v)| v)
        .reduce(|a, b| a + b)
}

impl Histogram {
    /// Histogram `name` (without `_bucket`) of the text exposition `page`,
    /// or `None` when the page has no bucket of it. Series of it with other
    /// labels besides `le` are summed, so that the result is the whole
    /// histogram whatever labels it may grow.
    pub fn parse(page: &str, name: &str) -> Option<Histogram> {
        let (bucket, count, sum) = (
            format!("{name}_bucket"),
            format!("{name}_count"),
            format!("{name}_sum"),
        );
        let mut h = Histogram::default();
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, labels, value)) = sample(line.trim()) else {
                continue;
            };
            if series == bucket {
                let Some(le) = label(labels, "le").and_then(bound) else {
                    continue;
                };
                match h.buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += value,
                    None => h.buckets.push((le, value)),
                }
            } else if series == count {
                h.count += value;
            } else if series == sum {
                h.sum += value;
            }
        }
        if h.buckets.is_empty() {
            return None;
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(h)
    }

    /// Observations at most `x`, as far as the buckets tell: the count of
    /// the largest bound at most `x` (0 below the first). Exact at every
    /// bound of this histogram; between two, the lower one's count.
    fn at_most(&self, x: f64) -> f64 {
        self.buckets
            .iter()
            .take_while(|(le, _)| *le <= x)
            .last()
            .map_or(0.0, |(_, c)| *c)
    }

    /// The sum of `hs`: the union of their bounds, each histogram's count
    /// at a bound it lacks taken from its next lower one ([`Self::at_most`]).
    /// With the same bounds everywhere (one build of the control plane),
    /// bucket by bucket sums.
    pub fn merge<'a>(hs: impl IntoIterator<Item = &'a Histogram>) -> Histogram {
        let hs: Vec<&Histogram> = hs.into_iter().collect();
        let mut bounds: Vec<f64> = hs
            .iter()
            .flat_map(|h| h.buckets.iter().map(|(le, _)| *le))
            .collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        Histogram {
            buckets: bounds
                .into_iter()
                .map(|le| (le, hs.iter().map(|h| h.at_most(le)).sum()))
                .collect(),
            count: hs.iter().map(|h| h.count).sum(),
            sum: hs.iter().map(|h| h.sum).sum(),
        }
    }

    /// Observations in all (the last bucket's cumulative count, which is
    /// `_count` when the page had `+Inf`).
    pub fn total(&self) -> f64 {
        self.buckets.last().map_or(0.0, |(_, c)| *c)
    }

    /// The `q` quantile (0..=1), linearly interpolated inside the bucket
    /// that holds rank `q x total`, the first bucket starting at 0; `None`
    /// without observations. A rank in the `+Inf` bucket gets the largest
    /// finite bound, as `histogram_quantile` answers.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, count) in &self.buckets {
            if count >= rank && count > below {
                if le.is_infinite() {
                    return Some(lower);
                }
                return Some(lower + (le - lower) * (rank - below) / (count - below));
            }
            (lower, below) = (le, count);
        }
        Some(lower)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the control plane serves (prometheus_client's text format),
    /// with bounds of the older factor-2 histogram.
    const PAGE: &str = "\
# HELP sgl_router_decision_duration_seconds Time the control plane took to choose a worker.
# TYPE sgl_router_decision_duration_seconds histogram
sgl_router_decision_duration_seconds_sum 0.0031
sgl_router_decision_duration_seconds_count 100
sgl_router_decision_duration_seconds_bucket{le=\"0.000008\"} 0
sgl_router_decision_duration_seconds_bucket{le=\"0.000016\"} 40
sgl_router_decision_duration_seconds_bucket{le=\"0.000032\"} 90
sgl_router_decision_duration_seconds_bucket{le=\"0.000064\"} 99
sgl_router_decision_duration_seconds_bucket{le=\"+Inf\"} 100
sgl_router_request_duration_seconds_bucket{le=\"0.001\"} 7
sgl_router_request_duration_seconds_bucket{le=\"+Inf\"} 7
";

    const NAME: &str = "sgl_router_decision_duration_seconds";

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
    }

    #[test]
    fn parses_one_histogram_and_not_its_neighbour() {
        let h = Histogram::parse(PAGE, NAME).unwrap();
        assert_eq!(h.count, 100.0);
        assert!(close(h.sum, 0.0031));
        let bounds: Vec<f64> = h.buckets.iter().map(|b| b.0).collect();
        assert_eq!(bounds, [8e-6, 16e-6, 32e-6, 64e-6, f64::INFINITY]);
        assert_eq!(h.total(), 100.0);
        assert!(Histogram::parse(PAGE, "sgl_router_nothing").is_none());
        // A prefix of a name is not that name.
        assert!(Histogram::parse(PAGE, "sgl_router_decision").is_none());
    }

    #[test]
    fn reads_exponents_labels_and_timestamps_and_sums_series() {
        let page = "\
x_bucket{route=\"a\",le=\"1.25e-6\"} 1 1700000000
x_bucket{le=\"1.5625e-6\",route=\"a\"} 3
x_bucket{route=\"b\",le=\"1.25e-6\"} 2
x_bucket{route=\"b\",le=\"1.5625e-6\"} 2
x_count{route=\"a\"} 3
x_count{route=\"b\"} 2
";
        let h = Histogram::parse(page, "x").unwrap();
        assert_eq!(h.buckets, [(1.25e-6, 3.0), (1.5625e-6, 5.0)]);
        assert_eq!(h.count, 5.0);
    }

    #[test]
    fn reads_a_gauge_by_its_whole_name() {
        let page = "\
# TYPE sgl_router_filter_sessions gauge
sgl_router_filter_sessions 3
sgl_router_filter_sessions_other 7
g{a=\"1\"} 2
g{a=\"2\"} 0.5
";
        assert_eq!(value(page, "sgl_router_filter_sessions"), Some(3.0));
        assert_eq!(value(page, "g"), Some(2.5));
        assert_eq!(value(page, "sgl_router_filter"), None);
        assert_eq!(
            value(PAGE, "sgl_router_decision_duration_seconds_count"),
            Some(100.0)
        );
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let h = Histogram::parse(PAGE, NAME).unwrap();
        // Rank 50 is 10 of the 50 in (16, 32] us: 16 + 16 x 10/50.
        assert!(
            close(h.quantile(0.5).unwrap(), 19.2e-6),
            "{:?}",
            h.quantile(0.5)
        );
        // Rank 99 is the last of (32, 64] us: its upper bound.
        assert!(close(h.quantile(0.99).unwrap(), 64e-6));
        // Rank 20 is half of the first non-empty bucket (8, 16] us.
        assert!(close(h.quantile(0.2).unwrap(), 12e-6));
        // In the +Inf bucket: the largest finite bound.
        assert!(close(h.quantile(0.999).unwrap(), 64e-6));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn the_first_bucket_starts_at_zero() {
        let h = Histogram {
            buckets: vec![(4.0, 10.0), (8.0, 10.0)],
            count: 10.0,
            sum: 0.0,
        };
        assert!(close(h.quantile(0.5).unwrap(), 2.0));
        // Empty buckets after the rank do not move it.
        assert!(close(h.quantile(1.0).unwrap(), 4.0));
    }

    #[test]
    fn merging_sums_bucket_by_bucket() {
        let a = Histogram::parse(PAGE, NAME).unwrap();
        let m = Histogram::merge([&a, &a, &a]);
        assert_eq!(m.count, 300.0);
        assert_eq!(m.buckets.len(), a.buckets.len());
        for ((le, c), (le_a, c_a)) in m.buckets.iter().zip(&a.buckets) {
            assert_eq!((*le, *c), (*le_a, 3.0 * c_a));
        }
        // The same shape, three times over: the same quantiles.
        assert!(close(m.quantile(0.5).unwrap(), a.quantile(0.5).unwrap()));
        assert_eq!(Histogram::merge([]), Histogram::default());
    }

    #[test]
    fn merging_different_bounds_keeps_each_count_cumulative() {
        let a = Histogram {
            buckets: vec![(1.0, 2.0), (4.0, 6.0), (f64::INFINITY, 6.0)],
            count: 6.0,
            sum: 0.0,
        };
        let b = Histogram {
            buckets: vec![(2.0, 1.0), (4.0, 3.0), (f64::INFINITY, 4.0)],
            count: 4.0,
            sum: 0.0,
        };
        let m = Histogram::merge([&a, &b]);
        // At 2, a is known only at 1 (2) and b exactly (1).
        assert_eq!(
            m.buckets,
            [(1.0, 2.0), (2.0, 3.0), (4.0, 9.0), (f64::INFINITY, 10.0)]
        );
        assert!(m.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
