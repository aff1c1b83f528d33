//! The ext_proc front door configured the way a Gateway API Inference
//! Extension gateway (Envoy Gateway, kgateway, Istio, GKE, Envoy AI
//! Gateway) sets up Envoy for an InferencePool's endpoint picker, per the
//! protocol (`docs/proposals/004-endpoint-picker-protocol`):
//!
//! - request and response bodies in `FULL_DUPLEX_STREAMED` mode, trailers
//!   sent (the mode requires it), response headers always sent, and no
//!   mode override (Envoy allows none in this mode);
//! - a subset hint (`envoy.lb.subset_hint`) sent to the picker; a Lua
//!   filter stands for the gateway's logic that sets it;
//! - no word to the picker of what the worker cluster takes (the shipped
//!   config's `x-sglang-destination-endpoints` is dropped);
//! - and, as each gateway family differs ([`Shape`]): the destination read
//!   by `override_host` from the dynamic metadata `envoy.lb` /
//!   `x-gateway-destination-endpoint` (Istio, Envoy Gateway, kgateway), or
//!   by an `ORIGINAL_DST` cluster from the header (GIE's own test config,
//!   Envoy AI Gateway's fail-close pools), which takes exactly one
//!   `ip:port`; the picker reached over TLS (unverified, the control plane
//!   running with `--secure-serving`) or plaintext; failing closed (503)
//!   or open when the picker cannot be reached.
//!
//! It is made from the rendered `envoy/envoy-ext-proc.yaml`, so everything
//! else (routes, limits, clusters, TLS) stays the shipped front door's.

use anyhow::{bail, Context};

/// Where a gateway's worker cluster reads the picker's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// `override_host` on the dynamic metadata `envoy.lb`: a list is
    /// walked on retries, so the picker runs with `--destination-endpoints
    /// list`, as an operator of such a gateway would set it.
    OverrideHostMetadata,
    /// An `ORIGINAL_DST` cluster on the header: one `ip:port`, and the
    /// picker's default destination.
    OriginalDstHeader,
}

/// How one gateway family sets up Envoy for its picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Where the worker cluster reads the destination.
    pub reads: Reads,
    /// Envoy reaches the picker over TLS (`--secure-serving`).
    pub tls: bool,
    /// Requests go on when the picker cannot be reached.
    pub fail_open: bool,
}

impl Shape {
    /// The setup the whole suite runs through with
    /// `SGLANG_ENVOY_FRONT_DOOR=picker`.
    pub const SUITE: Shape = Shape {
        reads: Reads::OverrideHostMetadata,
        tls: true,
        fail_open: false,
    };

    /// The control plane's flags this shape needs, as its operator would
    /// set them.
    pub fn control_plane_args(self) -> Vec<String> {
        let mut args = Vec::new();
        if self.tls {
            args.push("--secure-serving".to_string());
        }
        if self.reads == Reads::OverrideHostMetadata {
            args.push("--destination-endpoints".into());
            args.push("list".into());
        }
        args
    }
}

/// The processing mode of the shipped ext_proc config, replaced whole.
const SHIPPED_MODE_START: &str = "              processing_mode:\n";
const SHIPPED_MODE_END: &str = "              allow_mode_override: true\n";

const PICKER_MODE: &str = "              processing_mode:
                request_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_header_mode: SEND
                response_body_mode: FULL_DUPLEX_STREAMED
                response_trailer_mode: SEND
              # The client's content-length stays (the picker sets it when
              # it edits the body), so a worker sees the request as sent.
              allow_content_length_header: true
              # The picker's destination, written as dynamic metadata; the
              # subset hint, sent to it.
              metadata_options:
                receiving_namespaces: { untyped: [envoy.lb] }
                forwarding_namespaces: { untyped: [envoy.lb.subset_hint] }
";

/// The shipped config's ext_proc filter, before which the subset hint is set.
const SHIPPED_FILTER: &str = "          - name: sglang.router\n";

/// What stands for the gateway's own choice of a subset: the hint is taken
/// from the test header `x-test-subset-hint` (comma-separated `ip:port`) and
/// written where a gateway writes it, as a list.
const SUBSET_FILTER: &str = r#"          - name: test.subset_hint
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(handle)
                    local hint = handle:headers():get("x-test-subset-hint")
                    if hint == nil then return end
                    local list = {}
                    for e in string.gmatch(hint, "[^,]+") do table.insert(list, e) end
                    handle:streamInfo():dynamicMetadata():set(
                      "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", list)
                  end
"#;

/// The shipped config fails open; Envoy cannot in full duplex once it has
/// handed the body to the picker, so most gateways' pickers fail closed,
/// and say so with 503 rather than Envoy's default 500.
const SHIPPED_FAILURE: &str = "              failure_mode_allow: true\n";
const PICKER_FAILURE: &str = "              failure_mode_allow: false
              status_on_error: { code: 503 }
";

/// The shipped config's cluster of the control plane's gRPC port.
const SHIPPED_CP_CLUSTER: &str = "  - name: sglang_control_plane\n    type: STRICT_DNS\n";

/// Gateways reach their picker over TLS without verifying it (the picker's
/// certificate is self-signed, made at start: `--secure-serving`).
const PICKER_CP_CLUSTER: &str = "  - name: sglang_control_plane
    type: STRICT_DNS
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context:
          alpn_protocols: [h2]
";

/// Where the shipped config's clusters read the destination.
const SHIPPED_SOURCE: &str = "- header: x-gateway-destination-endpoint\n";

const PICKER_SOURCE: &str =
    "- metadata: { key: envoy.lb, path: [ { key: x-gateway-destination-endpoint } ] }\n";

/// The shipped config's word to the control plane that its cluster walks
/// a list; a gateway says no such thing.
const SHIPPED_DESTINATION: &str = "                - key: x-sglang-destination-endpoints
                  value: list
";

/// The worker cluster of gateways that route on the header: Envoy connects
/// to the one `ip:port` it names.
const ORIGINAL_DST_CLUSTER: &str = "
name: sglang_workers
type: ORIGINAL_DST
lb_policy: CLUSTER_PROVIDED
connect_timeout: 1s
original_dst_lb_config:
  use_http_header: true
  http_header_name: x-gateway-destination-endpoint
";

/// `rendered` (the shipped ext_proc config, rendered) as an InferencePool
/// gateway of `shape` would configure it.
pub fn config(rendered: &str, shape: Shape) -> anyhow::Result<String> {
    let start = rendered
        .find(SHIPPED_MODE_START)
        .context("no processing_mode in the ext_proc config")?;
    let end = rendered[start..]
        .find(SHIPPED_MODE_END)
        .map(|i| start + i + SHIPPED_MODE_END.len())
        .context("no allow_mode_override after processing_mode")?;
    let mut out = format!("{}{PICKER_MODE}{}", &rendered[..start], &rendered[end..]);
    if out.matches(SHIPPED_FAILURE).count() != 1 {
        bail!("no failure_mode_allow in the ext_proc config");
    }
    if !shape.fail_open {
        out = out.replace(SHIPPED_FAILURE, PICKER_FAILURE);
    }
    if out.matches(SHIPPED_DESTINATION).count() != 1 {
        bail!("no x-sglang-destination-endpoints in the ext_proc config");
    }
    out = out.replace(SHIPPED_DESTINATION, "");
    if out.matches(SHIPPED_FILTER).count() != 1 {
        bail!("no ext_proc filter named sglang.router in the ext_proc config");
    }
    out = out.replace(SHIPPED_FILTER, &format!("{SUBSET_FILTER}{SHIPPED_FILTER}"));
    if out.matches(SHIPPED_CP_CLUSTER).count() != 1 {
        bail!("no sglang_control_plane cluster in the ext_proc config");
    }
    if shape.tls {
        out = out.replace(SHIPPED_CP_CLUSTER, PICKER_CP_CLUSTER);
    }
    let sources = out.matches(SHIPPED_SOURCE).count();
    if sources == 0 {
        bail!("no override_host header source in the ext_proc config");
    }
    match shape.reads {
        Reads::OverrideHostMetadata => Ok(out.replace(SHIPPED_SOURCE, PICKER_SOURCE)),
        Reads::OriginalDstHeader => original_dst_workers(&out),
    }
}

/// `config` with its worker cluster replaced by an `ORIGINAL_DST` one that
/// reads the header.
fn original_dst_workers(config: &str) -> anyhow::Result<String> {
    let mut yaml: serde_yaml::Value = serde_yaml::from_str(config)?;
    let clusters = yaml["static_resources"]["clusters"]
        .as_sequence_mut()
        .context("no clusters")?;
    let workers = clusters
        .iter_mut()
        .find(|c| c["name"].as_str() == Some("sglang_workers"))
        .context("no sglang_workers cluster")?;
    *workers = serde_yaml::from_str(ORIGINAL_DST_CLUSTER)?;
    Ok(serde_yaml::to_string(&yaml)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_becomes_full_duplex_and_routes_by_metadata_only() {
        let shipped = crate::read_repo_file("envoy/envoy-ext-proc.yaml");
        let out = config(&shipped, Shape::SUITE).unwrap();
        assert!(!out.contains("allow_mode_override"));
        assert!(out.contains(PICKER_FAILURE) && !out.contains(SHIPPED_FAILURE));
        assert!(out.contains(PICKER_CP_CLUSTER));
        assert!(!out.contains("request_body_mode: BUFFERED"));
        assert_eq!(out.matches("_body_mode: FULL_DUPLEX_STREAMED").count(), 2);
        assert!(!out.contains(SHIPPED_SOURCE), "the header is not read");
        assert!(!out.contains("x-sglang-destination-endpoints"));
        assert_eq!(
            out.matches(PICKER_SOURCE).count(),
            shipped.matches(SHIPPED_SOURCE).count()
        );
        let yaml: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        assert!(yaml["static_resources"].is_mapping());
    }

    /// The template with each `{{PLACEHOLDER}}` as `0`: YAML a parser takes.
    fn filled(template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("{{") {
            let Some(end) = rest[start..].find("}}") else {
                break;
            };
            out.push_str(&rest[..start]);
            out.push('0');
            rest = &rest[start + end + 2..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn the_header_shape_sends_workers_to_the_one_host_the_header_names() {
        let shipped = filled(&crate::read_repo_file("envoy/envoy-ext-proc.yaml"));
        let shape = Shape {
            reads: Reads::OriginalDstHeader,
            tls: false,
            fail_open: true,
        };
        let out = config(&shipped, shape).unwrap();
        let yaml: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        let clusters = yaml["static_resources"]["clusters"].as_sequence().unwrap();
        let workers = clusters
            .iter()
            .find(|c| c["name"] == "sglang_workers")
            .unwrap();
        assert_eq!(workers["type"], "ORIGINAL_DST");
        assert_eq!(
            workers["original_dst_lb_config"]["http_header_name"],
            "x-gateway-destination-endpoint"
        );
        assert!(
            workers["load_balancing_policy"].is_null(),
            "no override_host"
        );
        let picker = clusters
            .iter()
            .find(|c| c["name"] == "sglang_control_plane")
            .unwrap();
        assert!(
            picker["transport_socket"].is_null(),
            "plaintext to the picker"
        );
        assert!(out.contains("failure_mode_allow: true"));
        assert!(!out.contains("status_on_error"));
    }
}
