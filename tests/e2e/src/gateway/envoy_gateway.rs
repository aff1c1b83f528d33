//! The Envoy Gateway recipes (`deploy/envoy-gateway/`) as Envoy Gateway hands
//! them to its Envoy (internal/gatewayapi and internal/xds/translator, v1.5
//! to v1.9): the skeleton `gateway-shapes/envoy-gateway.yaml` holds its
//! defaults; the listener's buffer limit, timeouts and path handling come
//! from the ClientTrafficPolicy, the route's timeout from the HTTPRoute, its
//! retries and its cluster's load balancing, limits and buffer from the
//! BackendTrafficPolicy, the ext_proc or wasm filter (on the listener,
//! disabled, enabled on the route) and the ext_proc cluster from the
//! EnvoyExtensionPolicy, and the wasm variant's EnvoyPatchPolicy is applied
//! as JSON patches. A policy field this builder does not know fails the test.

use anyhow::{bail, ensure, Context};
use regex::Regex;
use serde_yaml::{Mapping, Value};

use super::{
    bind, cluster_mut, deliver_dynamically, find_doc, key, load_assignment, only_endpoint,
    recipe_docs, service_address, skeleton, text,
};
use crate::envoy_config::{EnvoyConfig, EnvoyEnv};

/// Which EnvoyExtensionPolicy of the recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `extproc.yaml`: Envoy's ext_proc filter to the control plane.
    ExtProc,
    /// `wasm.yaml`: the wasm filter, with its EnvoyPatchPolicy.
    Wasm,
}

impl Variant {
    /// The recipe file of the variant.
    pub fn file(self) -> &'static str {
        match self {
            Variant::ExtProc => "deploy/envoy-gateway/extproc.yaml",
            Variant::Wasm => "deploy/envoy-gateway/wasm.yaml",
        }
    }
}

/// Where the built module stands in for the one Envoy Gateway serves.
const MODULE: &str = "/var/lib/eg/wasm/sglang-router.wasm";

fn y(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

/// Kubernetes quantities (`40Mi`, `32Ki`, `1G`, `1024`) in bytes.
pub fn quantity(v: &Value) -> u64 {
    let s = text(v);
    let c = Regex::new(r"^(\d+)(Ki|Mi|Gi|k|M|G)?$")
        .unwrap()
        .captures(&s);
    let c = c.unwrap_or_else(|| panic!("not a quantity: {s}"));
    let n: u64 = c[1].parse().unwrap();
    n * match c.get(2).map(|m| m.as_str()) {
        None => 1,
        Some("Ki") => 1 << 10,
        Some("Mi") => 1 << 20,
        Some("Gi") => 1 << 30,
        Some("k") => 1_000,
        Some("M") => 1_000_000,
        _ => 1_000_000_000,
    }
}

/// A Gateway API duration (`1800s`, `50ms`, `1h30m`) as Envoy's `N.NNNs`.
pub fn duration(v: &Value) -> String {
    let s = text(v);
    let mut ms = 0u64;
    let re = Regex::new(r"(\d+)(ms|h|m|s)").unwrap();
    ensure_whole(&re, &s);
    for c in re.captures_iter(&s) {
        let n: u64 = c[1].parse().unwrap();
        ms += n * match &c[2] {
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            _ => 1,
        };
    }
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

fn ensure_whole(re: &Regex, s: &str) {
    assert_eq!(re.replace_all(s, ""), "", "not a duration: {s}");
}

/// Fails on any field of `v` outside `known`: a recipe using a field this
/// builder does not translate must teach it first.
fn only(v: &Value, what: &str, known: &[&str]) -> anyhow::Result<()> {
    for k in v
        .as_mapping()
        .map(|m| m.keys().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let k = text(k);
        ensure!(
            known.contains(&k.as_str()),
            "{what}.{k}: not translated here"
        );
    }
    Ok(())
}

fn targets(policy: &Value, kind: &str, name: &str) -> anyhow::Result<()> {
    let refs = match policy["spec"]["targetRefs"].as_sequence() {
        Some(r) => r.clone(),
        None => vec![policy["spec"]["targetRef"].clone()],
    };
    ensure!(
        refs.iter()
            .any(|r| r["kind"].as_str() == Some(kind) && r["name"].as_str() == Some(name)),
        "{} {} does not target {kind} {name}",
        text(&policy["kind"]),
        text(&policy["metadata"]["name"])
    );
    Ok(())
}

/// The gateway's Envoy config for `variant`, Kubernetes names still in it.
pub fn generate(variant: Variant) -> anyhow::Result<Value> {
    let docs = recipe_docs("deploy/envoy-gateway/gateway.yaml");
    let gw = find_doc(&docs, "Gateway", None);
    let route = find_doc(&docs, "HTTPRoute", None);
    let ctp = find_doc(&docs, "ClientTrafficPolicy", None);
    let btp = find_doc(&docs, "BackendTrafficPolicy", None);
    let ext_docs = recipe_docs(variant.file());
    let eep = find_doc(&ext_docs, "EnvoyExtensionPolicy", None);
    let (ns, gw_name) = (
        text(&gw["metadata"]["namespace"]),
        text(&gw["metadata"]["name"]),
    );
    let (route_ns, route_name) = (
        text(&route["metadata"]["namespace"]),
        text(&route["metadata"]["name"]),
    );
    ensure!(
        text(&route["spec"]["parentRefs"][0]["name"]) == gw_name,
        "HTTPRoute parent"
    );
    targets(ctp, "Gateway", &gw_name)?;
    targets(btp, "HTTPRoute", &route_name)?;
    targets(eep, "HTTPRoute", &route_name)?;

    let l = &gw["spec"]["listeners"][0];
    let listener = format!("{ns}/{gw_name}/{}", text(&l["name"]));
    let port = l["port"].as_u64().unwrap();
    // Envoy Gateway runs Envoy unprivileged: ports below 1024 move up 10000.
    let envoy_port = if port < 1024 { port + 10000 } else { port };
    let mut b = skeleton(
        "envoy-gateway.yaml",
        &[
            ("LISTENER", listener.clone()),
            ("ENVOY_PORT", envoy_port.to_string()),
        ],
    );
    let lst = &mut b["static_resources"]["listeners"][0];

    // ClientTrafficPolicy -> listener and connection manager.
    let spec = &ctp["spec"];
    only(
        spec,
        "ClientTrafficPolicy.spec",
        &["targetRefs", "connection", "path", "timeout", "headers"],
    )?;
    only(&spec["connection"], "connection", &["bufferLimit"])?;
    if !spec["connection"]["bufferLimit"].is_null() {
        lst["per_connection_buffer_limit_bytes"] =
            quantity(&spec["connection"]["bufferLimit"]).into();
    }
    let hcm = &mut lst["filter_chains"][0]["filters"][0]["typed_config"];
    only(
        &spec["path"],
        "path",
        &["escapedSlashesAction", "disableMergeSlashes"],
    )?;
    if let Some(a) = spec["path"]["escapedSlashesAction"].as_str() {
        hcm["path_with_escaped_slashes_action"] = key(match a {
            "KeepUnchanged" => "KEEP_UNCHANGED",
            "RejectRequest" => "REJECT_REQUEST",
            "UnescapeAndRedirect" => "UNESCAPE_AND_REDIRECT",
            "UnescapeAndForward" => "UNESCAPE_AND_FORWARD",
            other => bail!("escapedSlashesAction {other}"),
        });
    }
    if let Some(d) = spec["path"]["disableMergeSlashes"].as_bool() {
        hcm["merge_slashes"] = (!d).into();
    }
    let http = &spec["timeout"]["http"];
    only(&spec["timeout"], "timeout", &["http"])?;
    only(
        http,
        "timeout.http",
        &["requestReceivedTimeout", "streamIdleTimeout", "idleTimeout"],
    )?;
    if !http["requestReceivedTimeout"].is_null() {
        hcm["request_timeout"] = key(&duration(&http["requestReceivedTimeout"]));
    }
    if !http["streamIdleTimeout"].is_null() {
        hcm["stream_idle_timeout"] = key(&duration(&http["streamIdleTimeout"]));
    }
    if !http["idleTimeout"].is_null() {
        hcm["common_http_protocol_options"]["idle_timeout"] = key(&duration(&http["idleTimeout"]));
    }
    only(&spec["headers"], "headers", &["earlyRequestHeaders"])?;
    let early = &spec["headers"]["earlyRequestHeaders"];
    only(early, "earlyRequestHeaders", &["remove"])?;
    if let Some(remove) = early["remove"].as_sequence() {
        let mutations: Vec<Value> = remove
            .iter()
            .map(|h| y(&format!("{{ remove: \"{}\" }}", text(h))))
            .collect();
        let mut ext = y("name: envoy.http.early_header_mutation.header_mutation\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation");
        ext["typed_config"]["mutations"] = Value::Sequence(mutations);
        hcm["early_header_mutation_extensions"] = Value::Sequence(vec![ext]);
    }

    // The EnvoyExtensionPolicy's filter and its cluster.
    let eep_name = text(&eep["metadata"]["name"]);
    let eep_ns = text(&eep["metadata"]["namespace"]);
    let (filter, extra_cluster) = match variant {
        Variant::ExtProc => ext_proc(eep, &eep_ns, &eep_name)?,
        Variant::Wasm => (wasm(eep, &eep_ns, &eep_name)?, None),
    };
    let filter_name = text(&filter["name"]);
    let router = y("name: envoy.filters.http.router\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n  suppress_envoy_headers: true");
    hcm["http_filters"] = Value::Sequence(vec![filter, router]);

    // HTTPRoute + BackendTrafficPolicy -> route and cluster.
    let rule = &route["spec"]["rules"][0];
    let path = &rule["matches"][0]["path"];
    ensure!(
        text(&path["type"]) == "PathPrefix" && text(&path["value"]) == "/",
        "route match"
    );
    let cluster_name = format!("httproute/{route_ns}/{route_name}/rule/0");
    let mut r = y(&format!(
        "name: \"httproute/{route_ns}/{route_name}/rule/0/match/0/*\"\nmatch: {{ prefix: / }}\nroute:\n  cluster: \"{cluster_name}\"\n  upgrade_configs: [{{ upgrade_type: websocket }}]"
    ));
    if let Some(t) = rule["timeouts"]["request"].as_str() {
        let t = duration(&key(t));
        r["route"]["timeout"] = key(&t);
        // The route's idle timeout is at least an hour (route.go idleTimeout).
        let secs: f64 = t.trim_end_matches('s').parse().unwrap();
        r["route"]["idle_timeout"] = key(&format!("{}s", secs.max(3600.0)));
    }
    let bspec = &btp["spec"];
    only(
        bspec,
        "BackendTrafficPolicy.spec",
        &[
            "targetRefs",
            "loadBalancer",
            "retry",
            "circuitBreaker",
            "connection",
        ],
    )?;
    r["route"]["retry_policy"] = retry_policy(&bspec["retry"])?;
    let mut per_filter = Mapping::new();
    per_filter.insert(
        key(&filter_name),
        y("\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig\nconfig: {}"),
    );
    r["typed_per_filter_config"] = Value::Mapping(per_filter);
    hcm["route_config"]["virtual_hosts"][0]["routes"] = Value::Sequence(vec![r]);

    let backend = &rule["backendRefs"][0];
    let mut c = base_cluster(&cluster_name);
    c["load_assignment"] = load_assignment(
        &cluster_name,
        &[format!(
            "{}.{route_ns}.svc.cluster.local:{}",
            text(&backend["name"]),
            text(&backend["port"])
        )],
    );
    only(&bspec["connection"], "connection", &["bufferLimit"])?;
    if !bspec["connection"]["bufferLimit"].is_null() {
        c["per_connection_buffer_limit_bytes"] =
            quantity(&bspec["connection"]["bufferLimit"]).into();
    }
    let cb = &bspec["circuitBreaker"];
    only(
        cb,
        "circuitBreaker",
        &[
            "maxConnections",
            "maxPendingRequests",
            "maxParallelRequests",
            "maxParallelRetries",
        ],
    )?;
    let t = &mut c["circuit_breakers"]["thresholds"][0];
    for (field, envoy) in [
        ("maxConnections", "max_connections"),
        ("maxPendingRequests", "max_pending_requests"),
        ("maxParallelRequests", "max_requests"),
        ("maxParallelRetries", "max_retries"),
    ] {
        if !cb[field].is_null() {
            t[envoy] = cb[field].clone();
        }
    }
    c["load_balancing_policy"] = load_balancing(&bspec["loadBalancer"])?;
    let clusters = b["static_resources"]["clusters"].as_sequence_mut().unwrap();
    clusters.push(c);
    clusters.extend(extra_cluster);

    if variant == Variant::Wasm {
        let epp = find_doc(&ext_docs, "EnvoyPatchPolicy", None);
        targets(epp, "Gateway", &gw_name)?;
        ensure!(
            text(&epp["spec"]["type"]) == "JSONPatch",
            "EnvoyPatchPolicy type"
        );
        for p in epp["spec"]["jsonPatches"].as_sequence().unwrap() {
            json_patch(&mut b, p).with_context(|| format!("EnvoyPatchPolicy patch {p:?}"))?;
        }
    }
    Ok(b)
}

/// A cluster as buildXdsCluster starts it (endpoints are EDS there, static here).
fn base_cluster(name: &str) -> Value {
    let mut c = y("type: STATIC\nconnect_timeout: 10s\nper_connection_buffer_limit_bytes: 32768\ncommon_lb_config: {}\nignore_health_on_host_removal: true\ncircuit_breakers:\n  thresholds:\n  - { priority: DEFAULT, max_retries: 1024 }");
    c["name"] = key(name);
    c
}

fn lb_policy(name: &str) -> Value {
    let (ext, ty) = match name {
        "RoundRobin" => ("round_robin", "round_robin.v3.RoundRobin"),
        "LeastRequest" => ("least_request", "least_request.v3.LeastRequest"),
        "Random" => ("random", "random.v3.Random"),
        other => panic!("load balancer {other} not translated here"),
    };
    y(&format!("policies:\n- typed_extension_config:\n    name: envoy.load_balancing_policies.{ext}\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.{ty}"))
}

fn load_balancing(lb: &Value) -> anyhow::Result<Value> {
    only(lb, "loadBalancer", &["type", "endpointOverride"])?;
    let kind = lb["type"].as_str().unwrap_or("LeastRequest");
    if lb["endpointOverride"].is_null() {
        return Ok(lb_policy(kind));
    }
    let mut o = y("policies:\n- typed_extension_config:\n    name: envoy.load_balancing_policies.override_host\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost");
    let tc = &mut o["policies"][0]["typed_extension_config"]["typed_config"];
    let mut sources = Vec::new();
    for s in lb["endpointOverride"]["extractFrom"].as_sequence().unwrap() {
        only(s, "extractFrom", &["header"])?;
        sources.push(y(&format!("{{ header: \"{}\" }}", text(&s["header"]))));
    }
    tc["override_host_sources"] = Value::Sequence(sources);
    tc["fallback_policy"] = lb_policy(kind);
    Ok(o)
}

/// route.go buildRetryPolicy: Envoy Gateway's defaults, then the policy's.
fn retry_policy(retry: &Value) -> anyhow::Result<Value> {
    only(retry, "retry", &["numRetries", "retryOn", "perRetry"])?;
    let mut rp = y("retry_on: connect-failure,retriable-status-codes\nretriable_status_codes: [503]\nnum_retries: 2\nretry_host_predicate:\n- name: envoy.retry_host_predicates.previous_hosts\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate\nhost_selection_retry_max_attempts: 5");
    if !retry["numRetries"].is_null() {
        rp["num_retries"] = retry["numRetries"].clone();
    }
    let on = &retry["retryOn"];
    only(on, "retryOn", &["triggers", "httpStatusCodes"])?;
    if !on.is_null() {
        if let Some(t) = on["triggers"].as_sequence() {
            rp["retry_on"] = key(&t.iter().map(text).collect::<Vec<_>>().join(","));
        }
        rp["retriable_status_codes"] = match &on["httpStatusCodes"] {
            Value::Null => Value::Sequence(vec![]),
            codes => codes.clone(),
        };
    }
    let per = &retry["perRetry"];
    only(per, "perRetry", &["backOff", "timeout"])?;
    if !per["timeout"].is_null() {
        rp["per_try_timeout"] = key(&duration(&per["timeout"]));
    }
    let bo = &per["backOff"];
    if !bo.is_null() {
        let mut m = Mapping::new();
        for (f, e) in [
            ("baseInterval", "base_interval"),
            ("maxInterval", "max_interval"),
        ] {
            if !bo[f].is_null() {
                m.insert(key(e), key(&duration(&bo[f])));
            }
        }
        rp["retry_back_off"] = Value::Mapping(m);
    }
    Ok(rp)
}

/// extproc.go: the filter (disabled on the listener) and its gRPC cluster.
fn ext_proc(eep: &Value, ns: &str, name: &str) -> anyhow::Result<(Value, Option<Value>)> {
    only(
        &eep["spec"],
        "EnvoyExtensionPolicy.spec",
        &["targetRefs", "extProc"],
    )?;
    let e = &eep["spec"]["extProc"][0];
    only(
        e,
        "extProc",
        &[
            "backendRefs",
            "processingMode",
            "messageTimeout",
            "failOpen",
        ],
    )?;
    let ir = format!("envoyextensionpolicy/{ns}/{name}/extproc/0");
    let backend = &e["backendRefs"][0];
    let (svc, port) = (text(&backend["name"]), text(&backend["port"]));
    let mut f = y("typed_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor\n  grpc_service:\n    timeout: 10s\n    envoy_grpc: {}\n  processing_mode: { request_header_mode: SKIP, response_header_mode: SKIP, request_body_mode: NONE, response_body_mode: NONE, request_trailer_mode: SKIP, response_trailer_mode: SKIP }\ndisabled: true");
    f["name"] = key(&format!("envoy.filters.http.ext_proc/{ir}"));
    let tc = &mut f["typed_config"];
    tc["grpc_service"]["envoy_grpc"]["cluster_name"] = key(&ir);
    tc["grpc_service"]["envoy_grpc"]["authority"] = key(&format!("{svc}.{ns}:{port}"));
    let pm = &e["processingMode"];
    only(
        pm,
        "processingMode",
        &["request", "response", "allowModeOverride"],
    )?;
    for (dir, header, body, attrs) in [
        (
            "request",
            "request_header_mode",
            "request_body_mode",
            "request_attributes",
        ),
        (
            "response",
            "response_header_mode",
            "response_body_mode",
            "response_attributes",
        ),
    ] {
        let o = &pm[dir];
        if o.is_null() {
            continue;
        }
        only(o, dir, &["body", "attributes"])?;
        tc["processing_mode"][header] = key("SEND");
        if let Some(b) = o["body"].as_str() {
            tc["processing_mode"][body] = key(match b {
                "Buffered" => "BUFFERED",
                "Streamed" => "STREAMED",
                "BufferedPartial" => "BUFFERED_PARTIAL",
                other => bail!("body mode {other} not translated here"),
            });
        }
        if !o["attributes"].is_null() {
            tc[attrs] = o["attributes"].clone();
        }
    }
    if let Some(b) = pm["allowModeOverride"].as_bool() {
        tc["allow_mode_override"] = b.into();
    }
    if !e["failOpen"].is_null() {
        tc["failure_mode_allow"] = e["failOpen"].clone();
    }
    if !e["messageTimeout"].is_null() {
        tc["message_timeout"] = key(&duration(&e["messageTimeout"]));
    }
    let mut c = base_cluster(&ir);
    c["typed_extension_protocol_options"] = y("envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n  \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n  explicit_http_config:\n    http2_protocol_options: { initial_stream_window_size: 65536, initial_connection_window_size: 1048576 }");
    c["load_balancing_policy"] = lb_policy("LeastRequest");
    c["load_assignment"] = load_assignment(&ir, &[format!("{svc}.{ns}.svc.cluster.local:{port}")]);
    Ok((f, Some(c)))
}

/// wasm.go: the filter (disabled on the listener), its module served by
/// Envoy Gateway after it pulled and checked it.
fn wasm(eep: &Value, ns: &str, name: &str) -> anyhow::Result<Value> {
    only(
        &eep["spec"],
        "EnvoyExtensionPolicy.spec",
        &["targetRefs", "wasm"],
    )?;
    let w = &eep["spec"]["wasm"][0];
    only(w, "wasm", &["name", "rootID", "code", "config", "failOpen"])?;
    let code = &w["code"];
    match code["type"].as_str() {
        Some("Image") => ensure!(code["image"]["url"].is_string(), "code.image.url"),
        Some("HTTP") => {
            let sha = code["http"]["sha256"].as_str().unwrap_or_default();
            // Envoy Gateway checks the module it fetched against this.
            ensure!(
                Regex::new("^[0-9a-f]{64}$").unwrap().is_match(sha) && sha.chars().any(|c| c != '0'),
                "code.http.sha256 {sha:?} is no module's checksum: Envoy Gateway answers 500 on the route"
            );
        }
        other => bail!("code.type {other:?}"),
    }
    let ir = format!("envoyextensionpolicy/{ns}/{name}/wasm/0");
    let mut f = y(&format!("name: \"envoy.filters.http.wasm/{ir}\"\ndisabled: true\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n  config:\n    vm_config:\n      vm_id: \"{ir}\"\n      runtime: envoy.wasm.runtime.v8\n      code: {{ local: {{ filename: \"{MODULE}\" }} }}\n    configuration:\n      \"@type\": type.googleapis.com/google.protobuf.StringValue"));
    let config = &mut f["typed_config"]["config"];
    config["name"] = w["name"].clone();
    config["root_id"] = w["rootID"].clone();
    config["configuration"]["value"] = key(&serde_json::to_string(&w["config"])?);
    config["fail_open"] = w["failOpen"].as_bool().unwrap_or(false).into();
    Ok(f)
}

/// One EnvoyPatchPolicy JSON patch (RFC 6902 `add`, with Envoy Gateway's
/// `jsonPath`, here of the form `..KEY[?match(@.name, 'RE')]`).
fn json_patch(b: &mut Value, p: &Value) -> anyhow::Result<()> {
    let op = &p["operation"];
    ensure!(text(&op["op"]) == "add", "only add is translated here");
    let name = text(&p["name"]);
    let path = op["path"].as_str().unwrap_or_default();
    let kind = text(&p["type"]);
    if kind.ends_with(".Cluster") && path.is_empty() && op["jsonPath"].is_null() {
        ensure!(
            text(&op["value"]["name"]) == name,
            "the added cluster's name"
        );
        b["static_resources"]["clusters"]
            .as_sequence_mut()
            .unwrap()
            .push(op["value"].clone());
        return Ok(());
    }
    ensure!(
        kind.ends_with(".Listener"),
        "patches of {kind} are not translated here"
    );
    let l = b["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"].as_str() == Some(&name))
        .with_context(|| format!("Envoy Gateway has no listener {name}"))?;
    let jp = op["jsonPath"].as_str().context("jsonPath")?;
    let c = Regex::new(r"^\.\.(\w+)\[\?match\(@\.name, '(.*)'\)\]$")
        .unwrap()
        .captures(jp)
        .with_context(|| format!("jsonPath {jp} not translated here"))?;
    let re = Regex::new(&format!("^(?:{})$", &c[2]))?;
    let mut hits = 0;
    each_named(l, &c[1], &re, &mut |target| {
        let mut at = target;
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        for part in &parts[..parts.len() - 1] {
            at = &mut at[*part];
            assert!(at.is_mapping(), "JSON patch: {path} has no parent {part}");
        }
        at[parts[parts.len() - 1]] = op["value"].clone();
        hits += 1;
    });
    ensure!(hits > 0, "jsonPath {jp} selects nothing");
    Ok(())
}

/// Calls `f` on every element named like `re` of every list at key `k`.
fn each_named(v: &mut Value, k: &str, re: &Regex, f: &mut dyn FnMut(&mut Value)) {
    match v {
        Value::Mapping(m) => {
            for (key, child) in m.iter_mut() {
                if key.as_str() == Some(k) {
                    if let Some(items) = child.as_sequence_mut() {
                        for item in items {
                            if item["name"].as_str().is_some_and(|n| re.is_match(n)) {
                                f(item);
                            }
                        }
                        continue;
                    }
                }
                each_named(child, k, re, f);
            }
        }
        Value::Sequence(s) => s.iter_mut().for_each(|c| each_named(c, k, re, f)),
        _ => {}
    }
}

/// The recipe's config for a stack: the Services resolved to the stack's
/// addresses, the module to the built one, the listener to
/// `env.listen_port`.
pub fn bootstrap(env: &EnvoyEnv, variant: Variant) -> anyhow::Result<String> {
    let mut b = generate(variant)?;
    let listener = text(&b["static_resources"]["listeners"][0]["name"]);
    let names: Vec<String> = b["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| text(&c["name"]))
        .collect();
    // The ext_proc cluster comes from the ClusterIP Service, the wasm
    // variant's sglang_control_plane resolves the headless one.
    let (cp, cp_headless, workers) = (
        service_address("sglang-control-plane", "grpc"),
        service_address("sglang-control-plane-headless", "grpc"),
        service_address("sglang-workers", "http"),
    );
    for name in names {
        let c = cluster_mut(&mut b, &name);
        let named = only_endpoint(c);
        let addresses = if named == cp || named == cp_headless {
            vec![format!("127.0.0.1:{}", env.cp_grpc_port)]
        } else if named == workers {
            env.workers.clone()
        } else {
            bail!("cluster {name} points at {named}, no Service of deploy/control-plane.yaml");
        };
        c["load_assignment"] = load_assignment(&name, &addresses);
    }
    let text = serde_yaml::to_string(&b)?.replace(MODULE, &env.wasm.display().to_string());
    let mut b: Value = serde_yaml::from_str(&text)?;
    bind(&mut b, &listener, env.listen_port, env.admin_port);
    deliver_dynamically(b, &env.dir)
}

/// [`bootstrap`] for `StackOptions::envoy_config`.
pub fn config(variant: Variant) -> EnvoyConfig {
    EnvoyConfig::new(move |env| bootstrap(env, variant))
}
