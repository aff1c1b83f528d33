//! Takes the other routers' flags out of a launch line before clap parses
//! it: a line copied from an sglang-router or smg deployment either starts
//! this router or stops at the first flag it cannot honour, with a message
//! naming the flag and its row in docs/flags.md.

use std::ffi::OsString;

use super::flag_answer::{PeerFlag, Values, Verdict};
use super::peer_flags::PEER_FLAGS;
use super::smg_flags::SMG_FLAGS;

/// The router whose flag `name` is (`sglang-router` or `smg`), and its
/// table entry. sglang-router's come first: smg kept most of them.
pub fn find(name: &str) -> Option<(&'static str, &'static PeerFlag)> {
    let of = |router, table: &'static [PeerFlag]| {
        table.iter().find(|f| f.name == name).map(|f| (router, f))
    };
    of("sglang-router", PEER_FLAGS).or_else(|| of("smg", SMG_FLAGS))
}

/// Takes sglang-router's and smg's flags out of `argv`: those accepted (answered
/// `Elsewhere`, or given their default value) are removed, with a note to
/// log for each; the first refused one is an error naming it.
pub fn screen(argv: Vec<OsString>) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut kept = Vec::with_capacity(argv.len());
    let mut notes = Vec::new();
    let mut rest = argv.into_iter().peekable();
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy().into_owned();
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (text.clone(), None),
        };
        let Some((router, peer)) = find(&name) else {
            kept.push(arg);
            continue;
        };
        let is_flag = |a: &OsString| a.to_string_lossy().starts_with("--");
        let mut values: Vec<String> = inline.into_iter().collect();
        match peer.values {
            Values::Switch => {}
            Values::One if values.is_empty() => {
                if let Some(v) = rest.next_if(|a| !is_flag(a)) {
                    values.push(v.to_string_lossy().into_owned());
                }
            }
            Values::One => {}
            Values::Many => {
                while let Some(v) = rest.next_if(|a| !is_flag(a)) {
                    values.push(v.to_string_lossy().into_owned());
                }
            }
        }
        let default = match peer.values {
            Values::Switch => false,
            Values::One => values.len() == 1 && values[0] == peer.default,
            Values::Many => values.is_empty(),
        };
        match peer.answer {
            Verdict::Elsewhere(how) => notes.push(format!("{name} ({router}'s): {how}")),
            _ if default => notes.push(format!(
                "{name} has {router}'s default value and changes nothing here"
            )),
            answer => {
                return Err(format!(
                    "{name} is an {router} flag this router does not take ({}): {}. \
                     See docs/flags.md, section \"{router} flags\", row {name}.",
                    answer.label(),
                    answer.reason()
                ))
            }
        }
    }
    Ok((kept, notes))
}
