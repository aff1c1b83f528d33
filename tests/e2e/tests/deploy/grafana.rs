//! deploy/grafana: the dashboard queries metrics the control plane exports.

use super::*;

/// Metric names the control plane exports, as Prometheus sees them, with
/// their label names: from the `registry.register` calls in metrics.rs.
fn exported_metrics() -> BTreeMap<String, BTreeSet<String>> {
    let src = read("control-plane/src/metrics.rs");
    let field_re =
        Regex::new(r"(?m)^\s+(\w+): (?:Family<(\w+), (\w+)>|(Counter|Gauge|Histogram)),").unwrap();
    let mut fields: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    for c in field_re.captures_iter(&src) {
        let kind = c.get(3).or(c.get(4)).unwrap().as_str().to_string();
        fields.insert(
            c[1].to_string(),
            (c.get(2).map(|m| m.as_str().to_string()), kind),
        );
    }
    // Label structs: `struct RouteLabel { route: String, }`, or with
    // several labels: `struct CheckLabel { worker: String, result: &'static str, }`.
    let label_re = Regex::new(r"struct (\w+Label) \{([^}]*)\}").unwrap();
    let field_name_re = Regex::new(r"(\w+):").unwrap();
    let labels: BTreeMap<String, Vec<String>> = label_re
        .captures_iter(&src)
        .map(|c| {
            let names = field_name_re
                .captures_iter(&c[2])
                .map(|f| f[1].to_string())
                .collect();
            (c[1].to_string(), names)
        })
        .collect();
    let reg_re =
        Regex::new(r#"registry\.register\(\s*"(\w+)",\s*"[^"]*",\s*m\.(\w+)\.clone\(\),?\s*\)"#)
            .unwrap();
    let mut out = BTreeMap::new();
    for c in reg_re.captures_iter(&src) {
        let (label, kind) = &fields[&c[2]];
        let label: BTreeSet<String> = label.iter().flat_map(|l| labels[l].clone()).collect();
        let name = &c[1];
        let series: Vec<(String, BTreeSet<String>)> = match kind.as_str() {
            "Counter" => vec![(format!("{name}_total"), label)],
            "Gauge" => vec![(name.to_string(), label)],
            "Histogram" => {
                let mut with_le = label.clone();
                with_le.insert("le".into());
                vec![
                    (format!("{name}_bucket"), with_le),
                    (format!("{name}_sum"), label.clone()),
                    (format!("{name}_count"), label),
                ]
            }
            k => panic!("metric kind {k}"),
        };
        out.extend(series);
    }
    assert!(out.len() >= 11, "parsed the registrations: {out:?}");
    out
}

#[test]
fn grafana_dashboard_queries_exported_metrics() {
    let metrics = exported_metrics();
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/sglang-envoy-router.json"))
            .expect("dashboard is JSON");
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 30);
    let panels = dash["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "unique panel ids");

    let name_re = Regex::new(r"\bsgl_router_\w+").unwrap();
    let label_re = Regex::new(r"\bby \(([\w, ]+)\)").unwrap();
    let legend_re = Regex::new(r"\{\{(\w+)\}\}").unwrap();
    let mut used = BTreeSet::new();
    let mut exprs = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert!(p["datasource"]["uid"].is_string(), "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            exprs += 1;
            let names: Vec<&str> = name_re.find_iter(expr).map(|m| m.as_str()).collect();
            assert!(!names.is_empty(), "{expr}");
            let labels: BTreeSet<String> = names
                .iter()
                .flat_map(|n| {
                    used.insert(n.to_string());
                    metrics
                        .get(*n)
                        .unwrap_or_else(|| panic!("{n} is not exported by metrics.rs"))
                        .clone()
                })
                .collect();
            let mut grouped: Vec<String> = label_re
                .captures_iter(expr)
                .flat_map(|c| {
                    c[1].split(',')
                        .map(|l| l.trim().to_string())
                        .collect::<Vec<_>>()
                })
                .collect();
            grouped.extend(
                legend_re
                    .captures_iter(t["legendFormat"].as_str().unwrap_or(""))
                    .map(|c| c[1].to_string()),
            );
            for l in grouped {
                assert!(
                    labels.contains(&l),
                    "label {l} is not on the metrics of {expr}"
                );
            }
        }
    }
    assert!(exprs > 10);
    // Every exported metric is on the dashboard (histograms via _bucket).
    for name in metrics.keys() {
        if name.ends_with("_sum") || name.ends_with("_count") {
            continue;
        }
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
    assert!(read("README.md").contains("deploy/grafana/sglang-envoy-router.json"));
}
