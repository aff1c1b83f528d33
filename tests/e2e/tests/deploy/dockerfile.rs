//! The Dockerfile's stages build what scripts/lib.sh builds.

use super::*;

/// Dockerfile stages: name -> instructions (continuation lines joined).
pub(super) fn dockerfile() -> BTreeMap<String, Vec<String>> {
    let text = read("Dockerfile").replace("\\\n", " ");
    let mut stages = BTreeMap::new();
    let mut current: Option<String> = None;
    let from = Regex::new(r"(?i)^FROM\s+\S+\s+AS\s+(\S+)").unwrap();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(c) = from.captures(line) {
            current = Some(c[1].to_string());
        }
        if let Some(name) = &current {
            stages
                .entry(name.clone())
                .or_insert_with(Vec::new)
                .push(line.to_string());
        }
    }
    stages
}

pub(super) fn instruction<'a>(stage: &'a [String], op: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter_map(|l| l.strip_prefix(op).map(str::trim))
        .collect()
}

pub(super) fn json_list(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn dockerfile_builds_what_the_scripts_build() {
    let qs = quickstart();
    let stages = dockerfile();
    let lib = read("scripts/lib.sh");
    let build_all = &lib[lib.find("build_all() {").unwrap()..];
    let build_all = &build_all[..build_all.find("\n}").unwrap()];
    let builds: Vec<String> = Regex::new(r"cargo build [^)]*")
        .unwrap()
        .find_iter(build_all)
        .map(|m| {
            m.as_str()
                .trim()
                .replacen("--release", "--release --locked", 1)
        })
        .collect();
    assert_eq!(builds.len(), 2, "{builds:?}");
    let build_stage = stages["build"].join("\n");
    for b in &builds {
        assert!(build_stage.contains(b.as_str()), "Dockerfile runs `{b}`");
    }
    assert!(build_stage.contains("rustup target add wasm32-wasip1"));

    let cp = &stages["control-plane"];
    assert_eq!(
        json_list(instruction(cp, "ENTRYPOINT")[0]),
        ["sglang-envoy-control-plane"]
    );
    let cmd = json_list(instruction(cp, "CMD")[0]);
    let f = flags(&cmd);
    for (flag, value) in &qs.cp_flags {
        assert_eq!(f.get(flag), Some(value), "Dockerfile CMD {flag}");
    }
    let exposed: BTreeSet<String> = instruction(cp, "EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace().map(str::to_string))
        .collect();
    assert_eq!(
        exposed,
        BTreeSet::from([f["--admin-port"].clone(), f["--grpc-port"].clone()])
    );
    let sim = &stages["sim-worker"];
    let sim_cmd = flags(&json_list(instruction(sim, "CMD")[0]));
    assert_eq!(sim_cmd["--port"], qs.worker_ports[0]);
    assert_eq!(instruction(sim, "EXPOSE"), [qs.worker_ports[0].as_str()]);
    // The control-plane image is the default target (the last stage).
    let last_from = read("Dockerfile")
        .lines()
        .rfind(|l| l.starts_with("FROM "))
        .unwrap()
        .to_string();
    assert!(last_from.ends_with(" AS control-plane"), "{last_from}");
}
