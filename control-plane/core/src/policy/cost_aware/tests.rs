//! Tests of the cost-aware policy's choices.

use super::*;
use crate::policy::test_support::workers;
use crate::workers::Sent;
use std::time::Duration;

/// The policy with the weights the control plane ships with.
fn policy() -> CostAware {
    CostAware::new(CostAwareConfig::default())
}

fn pick(p: &CostAware, ws: &[Arc<Worker>], text: &str) -> Selection {
    pick_sent(p, ws, text).0
}

/// [`pick`], with what ends the request.
fn pick_sent(p: &CostAware, ws: &[Arc<Worker>], text: &str) -> (Selection, Sent) {
    let s = p.select(ws, &RouteInput::of_text(text.as_bytes()));
    let sent = ws[s.index].start(s.work);
    (s, sent)
}

#[test]
fn requests_another_control_plane_keeps_on_a_worker_count_against_it() {
    let p = policy();
    let ws = workers(2);
    ws[0].set_peer_load(2, 0);
    for i in 0..6 {
        // Each ends before the next is sent.
        let text = format!("{i} is a quick question");
        let s = p.select(&ws, &RouteInput::of_text(text.as_bytes()));
        assert_eq!(s.index, 1, "prompt {i}");
    }
}

#[test]
fn a_prompt_another_control_plane_sent_follows_it() {
    let p = policy();
    let ws = workers(3);
    let prompt = "a long shared system prompt ".repeat(10);
    p.learn(&ws[2], prompt.as_bytes());
    let s = pick(&p, &ws, &format!("{prompt} and a question"));
    assert_eq!((s.index, s.cache), (2, CacheOutcome::Hit));
    assert!(p.keeps_tree() && p.prices_queued_prefill());
}

#[test]
fn exact_matches_from_kv_events_override_the_tree() {
    let p = policy();
    let ws = workers(3);
    let prompt = "a long shared system prompt ".repeat(10);
    let first = pick(&p, &ws, &prompt).index;
    // The tree now believes `first` holds the prompt; the events say
    // it evicted it and `other` holds all of it (traffic this router
    // did not send). The third worker has no events: tree.
    let other = (first + 1) % 3;
    let mut exact = vec![None; 3];
    exact[first] = Some(0);
    exact[other] = Some(prompt.len());
    let input = RouteInput {
        exact: Some(&exact),
        ..RouteInput::of_text(prompt.as_bytes())
    };
    let s = p.select(&ws, &input);
    assert_eq!(s.index, other);
    assert_eq!(s.work, 0);
    assert_eq!(s.cache, CacheOutcome::Hit);
}

#[test]
fn a_prompt_the_events_find_nowhere_goes_back_where_the_tree_sent_it() {
    let p = policy();
    let ws = workers(3);
    let prompt = "a long shared system prompt ".repeat(10);
    // Still in flight: by load alone, another worker would be chosen.
    let home = pick(&p, &ws, &prompt).index;
    // Evicted everywhere (or its worker restarted): the events find no
    // page of it anywhere.
    let exact = vec![Some(0); 3];
    let input = RouteInput {
        exact: Some(&exact),
        ..RouteInput::of_text(prompt.as_bytes())
    };
    let s = p.select(&ws, &input);
    assert_eq!(s.index, home, "the prompt keeps its home");
    // Priced as what the events say it is: a full prefill.
    assert_eq!(s.work, prompt.len() as u64);
    assert_eq!(s.cache, CacheOutcome::Miss);
}

#[test]
fn distinct_prompts_spread_and_count_their_work() {
    let p = policy();
    let ws = workers(3);
    let mut used = [0; 3];
    for i in 0..3 {
        let prompt = format!("{i} some unrelated prompt");
        let s = pick(&p, &ws, &prompt);
        assert_eq!(s.cache, CacheOutcome::Miss);
        assert_eq!(s.work, prompt.len() as u64);
        used[s.index] += 1;
    }
    assert_eq!(used, [1, 1, 1]);
}

#[test]
fn sequential_distinct_prompts_with_tiny_common_prefixes_spread() {
    // Idle workers (every request finished before the next): a 2-byte
    // common prefix ("00") is no reason to pile everything on one cache.
    let p = policy();
    let ws = workers(3);
    let mut used = [0; 3];
    for i in 0..30 {
        let (s, sent) = pick_sent(
            &p,
            &ws,
            &format!("{i:03} distinct prompt {}", "x".repeat(i % 7)),
        );
        ws[s.index].finish(s.work, sent);
        used[s.index] += 1;
    }
    assert!(used.iter().all(|&n| n >= 6), "{used:?}");
}

#[test]
fn a_shared_prefix_stays_while_its_queue_is_cheaper_then_replicates() {
    let p = policy();
    let ws = workers(2);
    let system = "S".repeat(1000);
    let (first, sent) = pick_sent(&p, &ws, &format!("{system} q00"));
    let holder = first.index;
    ws[holder].finish(first.work, sent);
    // The holder prefills only the tail, so it takes the follow-ups
    // even with several of them in flight.
    for i in 1..10 {
        let s = pick(&p, &ws, &format!("{system} q{i:02}"));
        assert_eq!(s.index, holder, "follow-up {i}");
        assert_eq!(s.cache, CacheOutcome::Hit);
        assert!(s.work <= 3, "only the tail is new: {}", s.work);
    }
    // A long prefill queued on the holder costs more than prefilling the
    // whole prompt elsewhere: the prefix replicates to the other worker.
    ws[holder].start(5000);
    let moved = pick(&p, &ws, &format!("{system} q10"));
    assert_ne!(moved.index, holder);
    assert_eq!(moved.work, 1004, "the other worker prefills it all");
    // From now on both hold it: the next one is cheap on the other too.
    let next = pick(&p, &ws, &format!("{system} q11"));
    assert_eq!(next.index, moved.index);
    assert!(next.work <= 3);
}

#[test]
fn a_prefill_nearly_done_by_the_workers_pace_does_not_replicate_its_prefix() {
    let ago = |ms: u64| Instant::now().checked_sub(Duration::from_millis(ms));
    let (Some(t0), Some(t1), Some(t2)) = (ago(1300), ago(1200), ago(1000)) else {
        return; // a clock too young to hold the past (just booted)
    };
    let system = "S".repeat(4000);
    // Whether the next prompt of the group stays with the holder, when
    // the worker `teacher` (0: the holder, 1: the other) has shown the
    // pace and `progress` counts it.
    let stays = |teacher: usize, progress: bool| {
        let p = CostAware::new(CostAwareConfig {
            prefill_progress: progress,
            ..CostAwareConfig::default()
        });
        let ws = workers(2);
        let first = p.select(&ws, &RouteInput::of_text(format!("{system} q0").as_bytes()));
        let holder = &ws[first.index];
        // It prefilled 1000 bytes in 100 ms: 10 bytes per ms.
        let taught = &ws[(first.index + teacher) % 2];
        taught.start_at(1000, t0);
        taught.prefilled_at(1000, t1);
        // A second ago the holder took the first prompt (400 ms of
        // prefill at that pace: long done, its report due) and another
        // 5000 bytes.
        holder.start_at(first.work, t2);
        holder.start_at(5000, t2);
        let next = p.select(&ws, &RouteInput::of_text(format!("{system} q1").as_bytes()));
        next.index == first.index
    };
    assert!(
        stays(0, true),
        "what is left is cheaper than a cold prefill"
    );
    assert!(
        stays(1, true),
        "at its sibling's pace before its own report"
    );
    // Counted in full, the first prompt's prefill makes the holder's
    // queue dearer than prefilling the prompt on the idle worker.
    assert!(!stays(0, false));
}

#[test]
fn cold_prompts_on_an_even_fleet_go_to_the_worker_chosen_longest_ago() {
    // Prompts nobody holds, of very different sizes, each ended before
    // the next: the fleet is even, and the worker chosen longest ago
    // takes the next one, so every 3 in a row use 3 workers (by tree
    // size, the small prompts would follow each other to one worker).
    let p = policy();
    let ws = workers(3);
    let mut order = Vec::new();
    for i in 0..12 {
        let len = if i % 3 == 0 { 3000 } else { 40 };
        let (s, sent) = pick_sent(&p, &ws, &format!("{i:03} {}", "x".repeat(len)));
        assert_eq!(s.cache, CacheOutcome::Miss);
        ws[s.index].finish(s.work, sent);
        order.push(s.index);
    }
    for w in order.windows(3) {
        assert!(w[0] != w[1] && w[1] != w[2] && w[0] != w[2], "{order:?}");
    }
}

#[test]
fn a_cold_prompt_goes_to_the_fewest_requests_in_flight() {
    let p = policy();
    let ws = workers(3);
    // Two requests in flight on one worker, one on another.
    let (a, _) = pick_sent(&p, &ws, &format!("a {}", "x".repeat(100)));
    let (b, _) = pick_sent(&p, &ws, &format!("b {}", "x".repeat(100)));
    ws[a.index].start(10);
    let idle = (0..3).find(|&i| i != a.index && i != b.index).unwrap_or(0);
    let next = pick(&p, &ws, &format!("c {}", "x".repeat(100)));
    assert_eq!(next.index, idle);
}

#[test]
fn prompts_that_share_only_a_template_head_everywhere_are_balanced_by_count() {
    // Every worker holds the same 40-byte head (a chat template's
    // opening words): the prompts cost the same everywhere, so they are
    // spread as cold ones are.
    let p = policy();
    let ws = workers(3);
    let head = "system\nYou are the assistant of the user ";
    for (i, w) in ws.iter().enumerate() {
        p.tree.insert(format!("{head}{i}").as_bytes(), w.tenant);
    }
    let mut order = Vec::new();
    for i in 0..9 {
        let len = if i % 3 == 0 { 3000 } else { 40 };
        let (s, sent) = pick_sent(&p, &ws, &format!("{head}{i:03} {}", "x".repeat(len)));
        ws[s.index].finish(s.work, sent);
        order.push(s.index);
    }
    for w in order.windows(3) {
        assert!(w[0] != w[1] && w[1] != w[2] && w[0] != w[2], "{order:?}");
    }
}

#[test]
fn requests_the_engine_reports_from_elsewhere_count_as_load() {
    let p = policy();
    let ws = workers(2);
    // This router's first request, 1000 bytes, in flight on one worker.
    let (s, _sent) = pick_sent(&p, &ws, &"a".repeat(1000));
    let busy = s.index;
    let other = 1 - busy;
    // The other worker's engine reports 40 requests this router never
    // sent (a batch job calling it directly): a distinct prompt goes to
    // the worker this router loaded instead.
    ws[other].engine.record(40);
    let next = pick(&p, &ws, &"b".repeat(1000));
    assert_eq!(next.index, busy, "40 foreign requests outweigh 1 own");
    // Without the report the idle-looking worker wins.
    ws[other].engine.forget();
    let again = pick(&p, &ws, &"c".repeat(1000));
    assert_eq!(again.index, other);
}

#[test]
fn a_warm_worker_far_above_the_mean_in_flight_passes_prompts_on() {
    let p = policy();
    let ws = workers(4);
    let prefix = "a long shared system prompt of one hot group ".repeat(50);
    let mut held = Vec::new();
    // Follow-ups of one group: each tail is cheap where the prefix is,
    // so by price alone all stay on its worker.
    for i in 0..12 {
        let (s, sent) = pick_sent(&p, &ws, &format!("{prefix} turn {i}"));
        held.push((s, sent));
    }
    let home = held[0].0.index;
    let chosen: Vec<usize> = held.iter().map(|(s, _)| s.index).collect();
    // Six in flight there and none elsewhere is over the gate (mean
    // 1.5, plus 4): the seventh goes on, to one other worker, which then
    // holds the prefix and takes the rest (the gate stays open for the
    // first: 6 against a mean of 3).
    assert_eq!(chosen[..6], [home; 6], "{chosen:?}");
    let other = chosen[6];
    assert_ne!(other, home);
    assert!(chosen[6..].iter().all(|&i| i == other), "{chosen:?}");
    assert!(
        held[6].0.work > held[7].0.work,
        "the spill prefilled the prefix once"
    );
}

#[test]
fn without_the_spill_gate_a_warm_worker_keeps_its_group() {
    let p = CostAware::new(CostAwareConfig {
        spill_gate: false,
        ..CostAwareConfig::default()
    });
    let ws = workers(4);
    let prefix = "a long shared system prompt of one hot group ".repeat(50);
    let mut held = Vec::new();
    for i in 0..12 {
        held.push(pick_sent(&p, &ws, &format!("{prefix} turn {i}")));
    }
    let home = held[0].0.index;
    assert!(
        held.iter().all(|(s, _)| s.index == home),
        "twelve in flight on one worker, by price alone"
    );
}

#[test]
fn with_exact_matches_from_kv_events_the_spill_gate_is_off() {
    let p = policy();
    let ws = workers(4);
    let prefix = "a long shared system prompt of one hot group ".repeat(50);
    let mut exact = vec![Some(0); 4];
    exact[2] = Some(prefix.len());
    let mut held = Vec::new();
    for i in 0..12 {
        let text = format!("{prefix} turn {i}");
        let input = RouteInput {
            exact: Some(&exact),
            ..RouteInput::of_text(text.as_bytes())
        };
        let s = p.select(&ws, &input);
        held.push(ws[s.index].start(s.work));
        assert_eq!(s.index, 2, "turn {i}");
    }
}
