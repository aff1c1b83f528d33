//! The documentation holds together: every relative link and anchor in the
//! repository's Markdown leads somewhere, and every command block of the
//! pages an operator follows step by step is either run by a named test or
//! marked as not runnable here, with the reason.
//!
//! Markers are HTML comments on the line before a block:
//! `<!-- tested: tests/e2e/tests/FILE.rs::FUNCTION, ... -->` (each function
//! must exist in its file) or `<!-- not run here: REASON -->`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;
use sglang_envoy_e2e::{read_repo_file, repo_root};

static EXPLICIT_ANCHOR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"<a (?:id|name)="([^"]+)""#).unwrap());
static INLINE_CODE: LazyLock<Regex> = LazyLock::new(|| Regex::new("`[^`]*`").unwrap());

/// The pages an operator follows step by step.
const QUICK_PAGES: [&str; 4] = [
    "README.md",
    "deploy/README.md",
    "deploy/gie/README.md",
    "docs/migration.md",
];

/// Directories whose Markdown is not ours (build outputs, virtualenvs).
const SKIP: [&str; 6] = ["target", ".venv", ".venv-bench", ".git", ".run", "fuzz"];

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !SKIP.contains(&name.as_str()) {
                markdown_files(&p, out);
            }
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

/// The text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(&INLINE_CODE.replace_all(line, ""));
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces to `-`; a repeated heading gets `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        // An explicit anchor: <a id="name"></a>.
        for c in EXPLICIT_ANCHOR.captures_iter(line) {
            seen.insert(c[1].to_string());
        }
        if !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim().replace('`', "");
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut files = Vec::new();
    markdown_files(&repo_root(), &mut files);
    assert!(files.len() >= 10, "{files:?}");
    let link = Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for c in link.captures_iter(&prose(&text)) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target, None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let rel = file.strip_prefix(repo_root()).unwrap().display();
            if !dest.exists() {
                broken.push(format!("{rel}: {target}: no such file"));
                continue;
            }
            if let Some(a) = anchor {
                let dest_text = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&dest_text).contains(a) {
                    broken.push(format!("{rel}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 50, "only {checked} links checked");
}

#[test]
fn quick_page_commands_are_run_by_a_test_or_marked_not_runnable() {
    let tested = Regex::new(r"^<!-- tested: (.+) -->$").unwrap();
    let not_run = Regex::new(r"^<!-- not run here: (.{10,}) -->$").unwrap();
    let mut problems = Vec::new();
    let mut blocks = 0;
    for page in QUICK_PAGES {
        let text = read_repo_file(page);
        let lines: Vec<&str> = text.lines().collect();
        let mut fenced = false;
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("```") {
                continue;
            }
            fenced = !fenced;
            let lang = line.trim_start().trim_start_matches('`');
            if !fenced || !["sh", "bash", "console", "shell"].contains(&lang) {
                continue;
            }
            blocks += 1;
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map_or("", |l| l.trim());
            if not_run.is_match(marker) {
                continue;
            }
            let Some(c) = tested.captures(marker) else {
                problems.push(format!("{page}:{}: no marker before the block", i + 1));
                continue;
            };
            // The block's commands, `./` dropped, comments and blanks aside.
            let commands: Vec<String> = lines[i + 1..]
                .iter()
                .take_while(|l| !l.trim_start().starts_with("```"))
                .map(|l| l.trim().trim_start_matches("./").to_string())
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect();
            for entry in c[1].split(", ") {
                let (path, function) = entry.split_once("::").unwrap_or((entry, ""));
                let Ok(source) = std::fs::read_to_string(repo_root().join(path)) else {
                    problems.push(format!("{page}:{}: {path} does not exist", i + 1));
                    continue;
                };
                // A test function by name, or a script that runs one of the
                // block's commands word for word (.ci/run runs test.sh).
                let found = if function.is_empty() {
                    commands.iter().any(|c| source.contains(c.as_str()))
                } else {
                    source.contains(&format!("fn {function}("))
                };
                if !found {
                    problems.push(format!("{page}:{}: {entry} does not run it", i + 1));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(blocks >= 8, "only {blocks} command blocks found");
}

#[test]
fn anchors_follow_githubs_rules() {
    let a = anchors(
        "# Title\n## Without wasm: the ext_proc front door\n## As an InferencePool's endpoint picker\n\
         ## Prefill/decode disaggregation and DP-aware routing\n## `--flag` table\n## Title\n",
    );
    for expected in [
        "title",
        "without-wasm-the-ext_proc-front-door",
        "as-an-inferencepools-endpoint-picker",
        "prefilldecode-disaggregation-and-dp-aware-routing",
        "--flag-table",
        "title-1",
    ] {
        assert!(a.contains(expected), "{expected}: {a:?}");
    }
}
