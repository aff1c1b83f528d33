//! This project's Envoy front door as the bench runs it: the config
//! rendered by `envoy/render.sh` (the one place its placeholders are
//! filled), optionally with several control planes behind its
//! `sglang_control_plane` cluster, and the Envoy process.

use std::path::Path;

use anyhow::{bail, Context};

use crate::procs::{Paths, Proc};

/// The ports a rendered config names.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// The client listener.
    pub listen: u16,
    /// Envoy's own admin.
    pub envoy_admin: u16,
    /// The control plane's gRPC port (cluster `sglang_control_plane`).
    pub grpc: u16,
    /// The control plane's admin port (cluster `sglang_control_plane_admin`).
    pub admin: u16,
}

/// Renders `template` into `out` with envoy/render.sh, as
/// scripts/lib.sh's `render_envoy_config` does; `admin_routes` is
/// render.sh's `ADMIN_ROUTES` (`on` or `off`).
pub fn render(
    paths: &Paths,
    template: &Path,
    admin_routes: &str,
    ports: Ports,
    out: &Path,
) -> anyhow::Result<()> {
    let rendered = std::process::Command::new(paths.root.join("envoy/render.sh"))
        .arg(out)
        .env("ENVOY_TEMPLATE", template)
        .env("ADMIN_ROUTES", admin_routes)
        .env("LISTEN_HOST", "127.0.0.1")
        .env("LISTEN_PORT", ports.listen.to_string())
        .env("ENVOY_ADMIN_PORT", ports.envoy_admin.to_string())
        .env("CONTROL_PLANE_HOST", "127.0.0.1")
        .env("CONTROL_PLANE_GRPC_PORT", ports.grpc.to_string())
        .env("CONTROL_PLANE_ADMIN_PORT", ports.admin.to_string())
        .env("FILTER_WASM", &paths.wasm)
        .output()
        .context("running envoy/render.sh")?;
    if !rendered.status.success() {
        bail!(
            "envoy/render.sh failed for {}: {}",
            template.display(),
            String::from_utf8_lossy(&rendered.stderr)
        );
    }
    Ok(())
}

/// Starts Envoy on `config` with `concurrency` worker threads (each runs
/// its own filter VM). As scripts/quickstart.sh, plus
/// `--disable-hot-restart`, so that it shares no memory with (and never
/// collides with the base id of) another Envoy on the machine.
pub fn spawn(paths: &Paths, config: &Path, concurrency: usize, name: &str) -> anyhow::Result<Proc> {
    Proc::spawn(
        name,
        &paths.envoy,
        &[
            "-c".into(),
            config.display().to_string(),
            "--concurrency".into(),
            concurrency.to_string(),
            "--disable-hot-restart".into(),
            "--log-level".into(),
            "warn".into(),
        ],
        &paths.run_dir,
    )
}

/// The `sglang_control_plane` cluster's name line in a rendered config.
const CLUSTER: &str = "- name: sglang_control_plane";

/// Indentation of `line`, in spaces.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A rendered `config` whose `sglang_control_plane` cluster has one
/// loopback endpoint per port of `grpc_ports` (in that order) instead of
/// its one, as a DNS name with several addresses gives it: the filter VMs'
/// sessions and the EDS stream then spread over those control planes. A
/// text edit, so that the rest of the file (outlier detection, comments)
/// stays byte for byte; it fails when the cluster does not hold exactly
/// one endpoint, as the shipped template does.
pub fn with_control_planes(config: &str, grpc_ports: &[u16]) -> anyhow::Result<String> {
    if grpc_ports.is_empty() {
        bail!("no control plane to list");
    }
    let lines: Vec<&str> = config.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == CLUSTER)
        .context("no sglang_control_plane cluster")?;
    let cluster_indent = indent(lines[start]);
    // The cluster ends at the next line as far left as its `- name:`.
    let end = lines[start + 1..]
        .iter()
        .position(|l| !l.trim().is_empty() && indent(l) <= cluster_indent)
        .map_or(lines.len(), |i| start + 1 + i);
    let endpoints: Vec<usize> = (start..end)
        .filter(|&i| lines[i].trim() == "- endpoint:")
        .collect();
    let [first] = endpoints[..] else {
        bail!(
            "sglang_control_plane has {} endpoints, not 1: envoy.yaml changed",
            endpoints.len()
        );
    };
    // The endpoint's block: its deeper-indented lines after `- endpoint:`.
    let block_end = lines[first + 1..end]
        .iter()
        .position(|l| l.trim().is_empty() || indent(l) <= indent(lines[first]))
        .map_or(end, |i| first + 1 + i);
    let block = &lines[first..block_end];
    let port_line = block
        .iter()
        .position(|l| l.contains("port_value:"))
        .context("no port_value in the sglang_control_plane endpoint")?;
    let mut out: Vec<String> = lines[..first].iter().map(|l| l.to_string()).collect();
    for port in grpc_ports {
        for (i, line) in block.iter().enumerate() {
            if i == port_line {
                out.push(with_port(line, *port)?);
            } else {
                out.push(line.to_string());
            }
        }
    }
    out.extend(lines[block_end..].iter().map(|l| l.to_string()));
    let mut text = out.join("\n");
    if config.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// `line` with the number after its `port_value:` replaced by `port`.
fn with_port(line: &str, port: u16) -> anyhow::Result<String> {
    let at = line.find("port_value:").context("no port_value")? + "port_value:".len();
    let rest = &line[at..];
    let digits_at = rest.len() - rest.trim_start().len();
    let digits = rest[digits_at..]
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len() - digits_at);
    if digits == 0 {
        bail!("port_value is not a number: {line}");
    }
    Ok(format!(
        "{}{}{port}{}",
        &line[..at],
        &rest[..digits_at],
        &rest[digits_at + digits..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped template with the control plane's placeholders filled
    /// as render.sh fills them (the rest does not matter here).
    fn shipped() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../envoy/envoy.yaml");
        std::fs::read_to_string(path)
            .unwrap()
            .replace("{{CONTROL_PLANE_HOST}}", "127.0.0.1")
            .replace("{{CONTROL_PLANE_GRPC_PORT}}", "5000")
            .replace("{{CONTROL_PLANE_ADMIN_PORT}}", "5900")
    }

    /// The text of cluster `name` (its `- name:` line to the next cluster).
    fn cluster<'a>(config: &'a str, name: &str) -> &'a str {
        let at = config.find(&format!("  - name: {name}\n")).unwrap();
        let rest = &config[at + 3..];
        let end = rest.find("\n  - name: ").map_or(rest.len(), |i| i + 1);
        &config[at..at + 3 + end]
    }

    #[test]
    fn lists_every_control_plane_in_its_cluster_only() {
        let before = shipped();
        let after = with_control_planes(&before, &[5000, 5001, 5002]).unwrap();
        let cp = cluster(&after, "sglang_control_plane");
        assert_eq!(cp.matches("- endpoint:").count(), 3, "{cp}");
        for port in [5000, 5001, 5002] {
            let line = format!("socket_address: {{ address: 127.0.0.1, port_value: {port} }}");
            assert_eq!(cp.matches(&line).count(), 1, "{port} in {cp}");
        }
        // The endpoints are siblings: each as indented as the first.
        let indents: Vec<usize> = cp
            .lines()
            .filter(|l| l.trim() == "- endpoint:")
            .map(indent)
            .collect();
        assert!(indents.windows(2).all(|w| w[0] == w[1]), "{indents:?}");
        // Outlier detection (a dead replica ejected) and the rest kept.
        assert!(cp.contains("consecutive_local_origin_failure: 1"));
        assert_eq!(
            cluster(&after, "sglang_control_plane_admin"),
            cluster(&before, "sglang_control_plane_admin")
        );
        assert_eq!(after.matches("port_value: 5001").count(), 1);
        // Only lines were added: everything before is still there, in order.
        let removed: Vec<&str> = before
            .lines()
            .filter(|l| !after.lines().any(|a| a == *l))
            .collect();
        assert!(removed.is_empty(), "{removed:?}");
        assert_eq!(
            after.lines().count(),
            before.lines().count() + 2 * cp_endpoint_lines(&before)
        );
    }

    /// Lines of the one endpoint block of the shipped cluster.
    fn cp_endpoint_lines(config: &str) -> usize {
        let cp = cluster(config, "sglang_control_plane");
        let from = cp.find("- endpoint:").unwrap();
        cp[from..]
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .count()
    }

    #[test]
    fn one_port_replaces_the_rendered_one() {
        let after = with_control_planes(&shipped(), &[6123]).unwrap();
        let cp = cluster(&after, "sglang_control_plane");
        assert!(cp.contains("port_value: 6123 }"), "{cp}");
        assert!(!cp.contains("port_value: 5000"));
    }

    #[test]
    fn refuses_what_it_cannot_edit() {
        assert!(with_control_planes(&shipped(), &[]).is_err());
        assert!(with_control_planes("static_resources: {}\n", &[1]).is_err());
        let two = with_control_planes(&shipped(), &[1, 2]).unwrap();
        assert!(with_control_planes(&two, &[3]).is_err(), "two endpoints");
    }

    #[test]
    fn port_numbers_are_replaced_whole() {
        assert_eq!(
            with_port("  a: { port_value: 5000 }", 42).unwrap(),
            "  a: { port_value: 42 }"
        );
        assert_eq!(
            with_port("port_value: 5000", 65535).unwrap(),
            "port_value: 65535"
        );
        assert!(with_port("port_value: {{X}}", 1).is_err());
    }
}
