//! Tests of the replicas section of the report.

use super::*;
use crate::quality::QualityRow;
use crate::stats::Percentiles;

/// A histogram of `n` decisions, all in (`lo`, `hi`] seconds.
fn hist(lo: f64, hi: f64, n: f64) -> Histogram {
    Histogram {
        buckets: vec![(lo, 0.0), (hi, n), (f64::INFINITY, n)],
        count: n,
        sum: 0.0,
    }
}

fn run(
    shape: &str,
    setup: &str,
    seed: u64,
    hit: f64,
    p95: f64,
    per: &[u64],
    h: Histogram,
) -> ReplicaRun {
    ReplicaRun {
        setup: setup.into(),
        replicas: per.len(),
        row: QualityRow {
            shape: shape.into(),
            seed,
            held_out: false,
            contender: setup.into(),
            requests: 100,
            completed: 99,
            failed: 1,
            first_failure: None,
            ttft_ms: Percentiles {
                p50: p95 / 4.0,
                p95,
                ..Percentiles::default()
            },
            e2e_ms: Percentiles::default(),
            cache_hit_ratio: hit,
            per_worker: vec![25; 4],
            max_min: 1.0,
            busy: 0.5,
        },
        decisions: h,
        per_replica: per.to_vec(),
        sessions: per.iter().map(|_| 1).collect(),
        envoy_starts: 1,
        cpu: None,
    }
}

/// "many groups": 2 replicas keep the hit ratio and the p99; 3
/// replicas lose both; the unshared row has no goal.
fn results() -> ReplicasResults {
    let us = 1e-6;
    ReplicasResults {
        runs: vec![
            // Run order is not table order.
            run(
                "many groups",
                "3 replicas",
                1,
                0.80,
                900.0,
                &[30, 30, 40],
                hist(20.0 * us, 40.0 * us, 100.0),
            ),
            run(
                "many groups",
                "1 replica",
                1,
                0.90,
                600.0,
                &[100],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
            run(
                "many groups",
                "1 replica",
                2,
                0.92,
                800.0,
                &[100],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
            run(
                "many groups",
                "2 replicas",
                1,
                0.90,
                700.0,
                &[60, 40],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
            run(
                "many groups",
                "2 replicas",
                2,
                0.90,
                700.0,
                &[50, 50],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
            run(
                "many groups",
                "3 replicas, tree not shared",
                1,
                0.70,
                1400.0,
                &[34, 33, 33],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
            run(
                "few hot",
                "1 replica",
                1,
                0.90,
                500.0,
                &[100],
                hist(10.0 * us, 20.0 * us, 100.0),
            ),
        ],
        skipped: vec![],
    }
}

#[test]
fn aggregates_over_seeds_in_setup_order() {
    let aggs = aggregate(&results().runs, "many groups");
    let names: Vec<&str> = aggs.iter().map(|a| a.setup.as_str()).collect();
    assert_eq!(
        names,
        [
            "1 replica",
            "2 replicas",
            "3 replicas",
            "3 replicas, tree not shared"
        ]
    );
    let one = &aggs[0];
    assert_eq!((one.requests, one.failed), (200, 2));
    assert!((one.hit - 0.91).abs() < 1e-9 && (one.p95 - 700.0).abs() < 1e-9);
    assert_eq!(one.decisions.count, 200.0);
    assert_eq!(aggs[1].per_replica, [110, 90]);
    assert_eq!(aggs[1].sessions, ["1/1", "1/1"]);
    assert!(aggregate(&results().runs, "no such shape").is_empty());
}

#[test]
fn goals_hold_the_shared_setups_to_one_replica() {
    let aggs = aggregate(&results().runs, "many groups");
    let g = goals("many groups", &aggs);
    // Two goals for each of "2 replicas" and "3 replicas", none for
    // the unshared row.
    assert_eq!(g.len(), 4, "{g:?}");
    assert!(g.iter().all(|g| !g.setup.contains("not shared")));
    let find = |setup: &str, what: &str| {
        g.iter()
            .find(|g| g.setup == setup && g.goal.starts_with(what))
            .unwrap()
    };
    // 0.90 / 0.91 = 0.99x.
    let hit2 = find("2 replicas", "hit");
    assert_eq!(hit2.pass, Some(true));
    assert_eq!(hit2.measured, "0.900 vs 0.910 = 0.99x");
    // 0.80 / 0.91 = 0.88x < 0.95x.
    assert_eq!(find("3 replicas", "hit").pass, Some(false));
    // Same buckets: same p99 (19.9 us interpolated), 1.00x.
    let p99 = find("2 replicas", "decision");
    assert_eq!(
        (p99.pass, p99.measured.as_str()),
        (Some(true), "19.9 vs 19.9 us = 1.00x")
    );
    // One bucket up: (20, 40] us, 39.8 us = 2.00x.
    assert_eq!(find("3 replicas", "decision").pass, Some(false));
    // Without the one-replica row there is nothing to compare with.
    assert!(goals("many groups", &aggs[1..]).is_empty());
}

#[test]
fn the_p99_is_judged_in_cpu_time_where_every_run_measured_it() {
    let micro = 1e-6;
    let with_cpu = |setup: &str, per: &[u64], clock: Histogram, cpu: Histogram| {
        let mut r = run("s", setup, 1, 0.9, 600.0, per, clock);
        r.cpu = Some(cpu);
        r
    };
    let (fast, slow) = (
        || hist(10.0 * micro, 20.0 * micro, 100.0),
        || hist(40.0 * micro, 80.0 * micro, 100.0),
    );
    // On the clock 3 replicas are 4x slower (waits for a core); in CPU
    // they are not.
    let runs = vec![
        with_cpu("1 replica", &[100], fast(), fast()),
        with_cpu("3 replicas", &[30, 30, 40], slow(), fast()),
        with_cpu("2 replicas", &[50, 50], fast(), slow()),
    ];
    let aggs = aggregate(&runs, "s");
    assert_eq!(us(aggs[2].cpu_p99()), "19.9");
    let g = goals("s", &aggs);
    let find = |setup: &str, what: &str| {
        g.iter()
            .find(|g| g.setup == setup && g.goal.starts_with(what))
            .unwrap()
    };
    assert_eq!(find("3 replicas", "decision p99, CPU").pass, Some(true));
    assert_eq!(find("2 replicas", "decision p99, CPU").pass, Some(false));
    let clock = find("3 replicas", "decision p99 on the clock");
    assert_eq!(
        (clock.pass, clock.measured.as_str()),
        (None, "79.6 vs 19.9 us = 4.00x")
    );
    // One run without it: judged on the clock, as before.
    let mut runs = runs;
    runs.push(run("s", "3 replicas", 2, 0.9, 600.0, &[30, 30, 40], slow()));
    let g = goals("s", &aggregate(&runs, "s"));
    assert!(!g
        .iter()
        .any(|g| g.goal.contains("CPU") && g.setup == "3 replicas"));
    let p99 = g
        .iter()
        .find(|g| g.setup == "3 replicas" && g.goal.starts_with("decision"))
        .unwrap();
    assert_eq!(p99.pass, Some(false));
}

#[test]
fn the_p99_judged_is_the_median_seeds_not_the_pooled_one() {
    let micro = 1e-6;
    let fast = || hist(10.0 * micro, 20.0 * micro, 100.0);
    let mut runs: Vec<ReplicaRun> = (1..=3)
        .map(|seed| run("s", "1 replica", seed, 0.9, 600.0, &[100], fast()))
        .collect();
    // One seed of "2 replicas" hit a slow patch of the machine.
    runs.push(run("s", "2 replicas", 1, 0.9, 600.0, &[50, 50], fast()));
    let slow = hist(40.0 * micro, 80.0 * micro, 100.0);
    runs.push(run("s", "2 replicas", 2, 0.9, 600.0, &[50, 50], slow));
    runs.push(run("s", "2 replicas", 3, 0.9, 600.0, &[50, 50], fast()));
    let aggs = aggregate(&runs, "s");
    let two = &aggs[1];
    assert_eq!(us(two.p99()), "19.9");
    assert_eq!(us(two.decisions.quantile(0.99)), "78.8", "pooled");
    let g = goals("s", &aggs);
    let p99 = g.iter().find(|g| g.goal.starts_with("decision")).unwrap();
    assert_eq!(
        (p99.pass, p99.measured.as_str()),
        (Some(true), "19.9 vs 19.9 us = 1.00x")
    );
    // Of two seeds, the slower one.
    let aggs = aggregate(&runs[3..5], "s");
    assert_eq!(us(aggs[0].p99()), "79.6");
}

#[test]
fn renders_a_table_per_shape_and_the_goals() {
    let mut doc = String::new();
    render(&mut doc, &results(), &Profile::full(), &RunInfo::default());
    assert!(doc.starts_with(HEADING));
    assert!(doc.contains("### many groups") && doc.contains("### few hot"));
    assert!(doc.contains(
        "| 2 replicas | 200 | 2 | 175 | 700 | 0.900 | 15.0 | 19.9 | 19.9, 19.9 | 19.9 | - | - |  | 110 / 90 | 1/1, 1/1 | 0.99x | 1.00x |  | 1.00x |"
    ), "{doc}");
    assert!(doc.contains("| many groups | 3 replicas | hit ratio >= 0.95x one replica's | 0.800 vs 0.910 = 0.88x | **FAIL** |"));
    assert!(
        doc.contains(
            "What `--disable-shared-tree` turns off (`3 replicas` against `3 replicas, tree \
         not shared`, the same processes): decision p50 30.0 vs 15.0 us, p99 39.8 vs \
         19.9 us (2.00x); hit ratio 0.800 vs 0.700; TTFT p50 225 vs 350 ms, p95 900 vs \
         1400 ms."
        ),
        "{doc}"
    );
    // "few hot" has only one replica: its table, no goals.
    assert!(!doc.contains("| few hot | 2 replicas"));
}

#[test]
fn the_splice_replaces_or_appends_only_its_section() {
    let doc = "# Benchmarks\n\n## Scenario 3: decision engine\n\nold engine\n";
    let new = format!("{HEADING}\n\nfirst\n");
    let once = splice(doc, &new);
    assert_eq!(once, format!("{}\n\n{new}", doc.trim_end()));
    assert_eq!(section(&once), Some(new.as_str()));
    // A section followed by another: only it changes.
    let middle = format!("{once}\n## Later\n\nkept\n");
    let newer = format!("{HEADING}\n\nsecond\n");
    let twice = splice(&middle, &newer);
    assert!(twice.contains("second") && !twice.contains("first"));
    assert!(twice.contains("old engine") && twice.ends_with("## Later\n\nkept\n"));
    assert_eq!(section(&twice), Some(format!("{newer}\n").as_str()));
    // Spliced at the end again: the same document.
    assert_eq!(splice(&once, &new), once);
    assert_eq!(section(doc), None);
}
