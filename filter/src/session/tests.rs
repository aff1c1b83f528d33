//! The session's state machine, driven without a host: streams opened,
//! confirmed, broken; questions asked, sent again, ended.
use std::time::Duration;

use super::link::MAX_BACKOFF;
use super::*;

impl Session {
    /// A session whose sends always succeed, without a host (the
    /// host's calls do not link outside Envoy).
    fn fake(root: u32) -> Self {
        Session::with_sender(root, |_, _, _, _| true)
    }
}

/// `ms` after the tests' start, which is ten seconds after the
/// streams of `up` came up.
fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(10) + Duration::from_millis(ms)
}

/// Opens and confirms stream `token`, up since long before `at(0)`.
fn up(s: &Session, token: u32) {
    s.opened(token, at(0));
    s.confirmed(token, SystemTime::UNIX_EPOCH, false);
}

/// Confirms stream `token` and flushes it, returning the messages sent
/// on it.
fn confirm(s: &Session, token: u32) -> Vec<Vec<u8>> {
    s.confirmed(token, SystemTime::UNIX_EPOCH, false);
    flush(s, token)
}

/// Flushes `s`, expecting stream `token`; the messages sent.
fn flush(s: &Session, token: u32) -> Vec<Vec<u8>> {
    let mut sent = Vec::new();
    s.flush(|t, m| {
        assert_eq!(t, token);
        sent.push(m.to_vec());
        true
    });
    sent
}

/// `context` waits on `s` for the answer to `ticket`'s question.
fn wait(s: &Session, ticket: u64, context: u32, deadline: SystemTime) {
    wait_for(s, ticket, Wait::Answer, context, deadline);
}

/// `context` waits on `s` for `kind` of `ticket`.
fn wait_for(s: &Session, ticket: u64, kind: Wait, context: u32, deadline: SystemTime) {
    s.0.borrow_mut().waiting.insert(
        (ticket, kind),
        deadline,
        Waiter {
            context,
            resend: Resend::Never,
        },
    );
}

#[test]
fn questions_wait_only_on_a_confirmed_stream() {
    let s = Session::fake(1);
    assert!(s.due(at(0)));
    s.opened(7, at(0));
    assert!(!s.is_up() && !s.due(at(0)));
    s.confirmed(8, at(0), false); // another stream's answer
    assert!(!s.is_up());
    s.confirmed(7, at(0), false);
    assert!(s.is_up());
}

#[test]
fn each_answer_goes_to_the_context_that_asked_once() {
    let s = Session::fake(1);
    up(&s, 7);
    wait(&s, 100, 11, at(50));
    wait(&s, 200, 12, at(50));
    assert_eq!(
        s.answered(200, Wait::Prefill),
        None,
        "not what it waits for"
    );
    assert_eq!(s.answered(200, Wait::Answer), Some(12));
    assert_eq!(s.answered(200, Wait::Answer), None);
    assert_eq!(s.answered(100, Wait::Answer), Some(11));
    assert_eq!(s.waiting(), 0);
}

#[test]
fn two_waits_of_one_request_both_get_their_answer() {
    let s = Session::fake(1);
    up(&s, 7);
    for kind in Wait::ALL {
        wait_for(&s, 100, kind, 11, at(50));
    }
    // The prefill's outcome first, then the answer: the second wait was
    // not lost to the first.
    assert_eq!(s.answered(100, Wait::Prefill), Some(11));
    assert_eq!(s.answered(100, Wait::Answer), Some(11));
    assert_eq!(s.waiting(), 0);
    // A finished request forgets all its waits.
    for kind in Wait::ALL {
        wait_for(&s, 200, kind, 12, at(50));
    }
    s.forget(200);
    assert_eq!(s.waiting(), 0);
    // A request that gives up one wait keeps the other.
    for kind in Wait::ALL {
        wait_for(&s, 300, kind, 13, at(50));
    }
    s.forget_wait(300, Wait::Answer);
    assert_eq!(s.answered(300, Wait::Answer), None);
    assert_eq!(s.answered(300, Wait::Prefill), Some(13));
}

#[test]
fn a_broken_stream_ends_the_waits_it_held_and_is_reopened_at_once() {
    let s = Session::fake(1);
    up(&s, 7);
    wait_for(&s, 100, Wait::Prefill, 11, at(500));
    wait_for(&s, 200, Wait::Prefill, 12, at(500));
    assert!(s.closed(3, at(10)).is_empty(), "not our stream");
    let mut ended = s.closed(7, at(10));
    ended.sort();
    assert_eq!(ended, [(11, Wait::Prefill), (12, Wait::Prefill)]);
    assert!(s.due(at(10)), "a stream that was up is reopened at once");
    // That try may reach the dead replica: QUICK_TRIES in all at once,
    // then the backoff, doubling up to the cap.
    s.opened(8, at(0));
    s.closed(8, at(20));
    assert!(s.due(at(20)));
    s.opened(9, at(0));
    s.closed(9, at(30));
    assert!(s.due(at(30)));
    s.opened(10, at(0));
    s.closed(10, at(40));
    assert!(!s.due(at(40 + 99)) && s.due(at(40 + 100)));
    s.opened(11, at(0));
    s.closed(11, at(200));
    assert!(!s.due(at(200 + 199)) && s.due(at(200 + 200)));
    for t in 12..30 {
        s.opened(t, at(0));
        s.closed(t, at(10_000));
    }
    assert!(!s.due(at(10_000) + MAX_BACKOFF - Duration::from_millis(1)));
    assert!(s.due(at(10_000) + MAX_BACKOFF));
}

#[test]
fn a_stream_that_breaks_soon_after_coming_up_keeps_backing_off() {
    let s = Session::fake(1);
    // A VM's first stream: its quick tries all refused, then one after
    // the first backoff.
    for (token, ms) in [(4, 0), (5, 20), (6, 40)] {
        s.opened(token, at(0));
        assert!(s.closed(token, at(ms)).is_empty());
    }
    assert!(!s.due(at(40 + 99)) && s.due(at(40 + 100)));
    s.opened(8, at(0));
    s.closed(8, at(140));
    // The next is due at 140 + 200: it comes up, and breaks at once.
    s.opened(9, at(0));
    s.confirmed(9, at(340), false);
    s.closed(9, at(350));
    assert!(!s.due(at(350 + 399)), "not reopened at once");
    assert!(s.due(at(350 + 400)));
}

/// A VM's first stream may reach a replica that refuses it (draining):
/// the questions that waited for it wait for the next try, at once, as
/// when a stream that worked breaks, rather than fall back.
#[test]
fn a_first_stream_refused_keeps_its_questions_for_the_quick_tries() {
    let s = Session::fake(1);
    // A fresh VM's questions wait for its first stream, on the next tick;
    // its root's calls (the worker list) go on until that opens.
    assert!(s.due(at(0)) && s.takes_questions(at(0)) && !s.first_tries());
    assert!(s.ask(10, 50, b"q50".to_vec(), at(0), at(500)));
    s.opened(7, at(0));
    assert!(s.first_tries(), "opening: no call moves the round robin");
    assert!(s.ask(11, 100, b"q100".to_vec(), at(0), at(500)));
    assert!(s.closed(7, at(1)).is_empty(), "refused: it waits on");
    assert!(s.due(at(1)) && s.takes_questions(at(1)) && s.first_tries());
    assert!(s.ask(12, 200, b"q200".to_vec(), at(2), at(500)));
    s.opened(8, at(0));
    let mut sent = confirm(&s, 8);
    sent.sort();
    assert_eq!(sent, [b"q100".to_vec(), b"q200".to_vec(), b"q50".to_vec()]);
    assert!(!s.first_tries(), "up: calls may go again");
    // With a long tick (a test's setting), the first questions call.
    let s = Session::fake(1);
    s.set_tick(Duration::from_secs(60));
    assert!(s.due(at(0)) && !s.takes_questions(at(0)) && !s.first_tries());
    s.set_tick(Duration::from_millis(20));
    assert!(s.takes_questions(at(0)));
    // With every try refused, they fall back after the last one.
    let s = Session::fake(1);
    s.opened(7, at(0));
    assert!(s.ask(11, 100, b"q100".to_vec(), at(0), at(500)));
    assert!(s.closed(7, at(1)).is_empty());
    s.opened(8, at(0));
    assert!(s.closed(8, at(21)).is_empty());
    s.opened(9, at(0));
    assert_eq!(s.closed(9, at(41)), [(11, Wait::Answer)]);
    assert!(!s.due(at(41 + 99)) && s.due(at(41 + 100)));
}

#[test]
fn a_question_on_a_broken_stream_goes_once_more_on_the_next_one() {
    let s = Session::fake(1);
    s.opened(7, at(0));
    assert!(s.takes_questions(at(0)) && !s.is_up());
    // Asked while the stream opens: sent when it is up.
    assert!(s.ask(11, 100, b"q100".to_vec(), at(0), at(500)));
    assert_eq!(confirm(&s, 7), [b"q100".to_vec()]);
    // Its replica dies: the question waits for the next stream.
    assert!(s.closed(7, at(10)).is_empty());
    assert_eq!(s.waiting(), 1);
    s.opened(8, at(0));
    // That one reached the dead replica too: still waiting.
    assert!(s.closed(8, at(11)).is_empty());
    s.opened(9, at(0));
    assert_eq!(confirm(&s, 9), [b"q100".to_vec()], "sent again");
    assert_eq!(flush(&s, 9), Vec::<Vec<u8>>::new(), "only once");
    // A second break: it was sent twice, it is not kept a third time
    // (a question that kills control planes kills one more at most).
    assert_eq!(s.closed(9, at(20)), [(11, Wait::Answer)]);
    assert_eq!(s.waiting(), 0);
}

#[test]
fn questions_wait_for_the_quick_reopenings_only() {
    let s = Session::fake(1);
    up(&s, 7);
    s.closed(7, at(0));
    // The root's calls go on: this VM has its worker list to fall back on.
    assert!(!s.first_tries());
    // Due again: a question waits for the stream about to open.
    assert!(s.ask(11, 100, b"q100".to_vec(), at(5), at(500)));
    s.opened(8, at(0));
    assert!(
        s.closed(8, at(10)).is_empty(),
        "the second quick try is left"
    );
    assert!(s.ask(12, 200, b"q200".to_vec(), at(15), at(500)));
    s.opened(9, at(0));
    assert!(
        s.closed(9, at(20)).is_empty(),
        "the third quick try is left"
    );
    s.opened(10, at(0));
    // Every quick try failed: every control plane may be down. The
    // questions fall back now, not at their deadline, and new ones
    // call until the stream is due again.
    let mut over = s.closed(10, at(25));
    over.sort();
    assert_eq!(over, [(11, Wait::Answer), (12, Wait::Answer)]);
    assert!(!s.takes_questions(at(26)));
    assert!(!s.ask(13, 300, b"q300".to_vec(), at(26), at(500)));
    assert!(s.due(at(25 + 100)));
    assert!(
        !s.takes_questions(at(25 + 100)),
        "while every control plane may be down, questions call"
    );
}

#[test]
fn a_question_answered_or_expired_while_waiting_for_a_stream_is_not_sent() {
    let s = Session::fake(1);
    s.opened(7, at(0));
    assert!(s.ask(11, 100, b"q100".to_vec(), at(0), at(50)));
    assert!(s.ask(12, 200, b"q200".to_vec(), at(0), at(500)));
    assert!(s.ask(13, 300, b"q300".to_vec(), at(0), at(500)));
    s.forget(300);
    assert_eq!(s.expired(at(60)), [(11, Wait::Answer)]);
    // Nothing goes out before the stream is up.
    assert_eq!(flush(&s, 7), Vec::<Vec<u8>>::new());
    // A send that fails leaves the question queued for the next stream.
    s.confirmed(7, SystemTime::UNIX_EPOCH, false);
    s.flush(|_, _| false);
    s.closed(7, at(70));
    s.opened(8, at(0));
    assert_eq!(confirm(&s, 8), [b"q200".to_vec()]);
    assert_eq!(s.answered(200, Wait::Answer), Some(12));
}

#[test]
fn late_questions_expire_and_are_forgotten() {
    let s = Session::fake(1);
    up(&s, 7);
    wait(&s, 100, 11, at(50));
    wait(&s, 200, 12, at(80));
    assert_eq!(s.expired(at(60)), [(11, Wait::Answer)]);
    assert_eq!(
        s.answered(100, Wait::Answer),
        None,
        "an expired question gets no answer"
    );
    s.forget(200);
    assert!(s.expired(at(1_000)).is_empty());
}

#[test]
fn a_promised_prefill_outcome_is_waited_for_only_on_a_stream_that_is_up() {
    let s = Session::fake(1);
    // No stream: the outcome promised on the last one will not come, and
    // the request must ask for it another way.
    assert!(!s.expect_prefill(11, 100, at(50)));
    assert_eq!(s.answered(100, Wait::Prefill), None);
    s.opened(7, at(0));
    assert!(!s.expect_prefill(11, 100, at(50)), "opening, not up");
    s.confirmed(7, at(0), false);
    assert!(s.expect_prefill(11, 100, at(50)));
    assert_eq!(flush(&s, 7), Vec::<Vec<u8>>::new(), "nothing asked");
    assert_eq!(s.answered(100, Wait::Prefill), Some(11));
}

thread_local! {
    /// What [`recording`] sent, in order.
    static SENT: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A [`Sender`] that keeps what it sends.
fn recording(_: u32, _: u32, _: u32, message: &[u8]) -> bool {
    SENT.with(|s| s.borrow_mut().push(message.to_vec()));
    true
}

/// The messages [`recording`] sent since the last call, decoded.
fn sent() -> Vec<SessionUp> {
    SENT.with(|s| {
        s.borrow_mut()
            .drain(..)
            .map(|m| SessionUp::decode(m.as_slice()).expect("a SessionUp"))
            .collect()
    })
}

fn end(ticket: u64) -> Completion {
    Completion {
        ticket,
        http_status: 200,
        ..Default::default()
    }
}

fn tickets(ends: &[Completion]) -> Vec<u64> {
    ends.iter().map(|c| c.ticket).collect()
}

/// A session up on stream 7 whose control plane takes riding ends or not.
fn riding_session(ends_ride: bool) -> Session {
    sent();
    let s = Session::with_sender(1, recording);
    s.opened(7, at(0));
    s.confirmed(7, at(0), ends_ride);
    s
}

#[test]
fn ends_ride_with_the_next_question_or_go_alone_on_the_tick() {
    let s = riding_session(true);
    assert_eq!(s.report_end(11, end(1)), Ok(()));
    assert_eq!(s.report_end(12, end(2)), Ok(()));
    assert!(sent().is_empty(), "no message of their own");
    let question = SessionUp {
        kind: Some(Kind::Synced(5)),
        ..Default::default()
    };
    assert!(s.ask(13, 3, question.encode_to_vec(), at(1), at(50)));
    let up = sent();
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].kind, Some(Kind::Synced(5)), "the message itself");
    assert_eq!(tickets(&up[0].ends), [1, 2]);
    // Not kept with the question to send again: they went up once.
    assert!(s.report_end(14, end(4)).is_ok());
    s.flush(|_, m| recording(1, 1, 7, m));
    let up = sent();
    assert_eq!(up.len(), 1);
    assert_eq!((up[0].kind.clone(), tickets(&up[0].ends)), (None, vec![4]));
    s.flush(|_, m| recording(1, 1, 7, m));
    assert!(sent().is_empty(), "nothing left to flush");
}

#[test]
fn a_control_plane_that_does_not_take_riding_ends_gets_each_at_once() {
    let s = riding_session(false);
    assert!(s.report_end(11, end(1)).is_ok());
    let up = sent();
    assert_eq!(up.len(), 1);
    assert!(matches!(&up[0].kind, Some(Kind::End(c)) if c.ticket == 1));
    assert!(up[0].ends.is_empty());
    // No stream: given back for the batched report.
    let down = Session::with_sender(1, recording);
    assert_eq!(down.report_end(11, end(2)), Err(end(2)));
}

#[test]
fn riding_ends_of_a_broken_stream_go_to_the_batched_report() {
    let s = riding_session(true);
    assert!(s.report_end(11, end(1)).is_ok());
    assert!(s.report_end(11, end(2)).is_ok());
    s.closed(7, at(5));
    assert_eq!(tickets(&s.take_unsent_ends()), [1, 2]);
    assert!(s.take_unsent_ends().is_empty());
    s.flush(|_, m| recording(1, 1, 7, m));
    assert!(sent().is_empty(), "nothing rides a stream that is gone");
}

#[test]
fn many_riding_ends_go_up_without_waiting_for_a_message() {
    let s = riding_session(true);
    for t in 1..MAX_RIDING_ENDS as u64 {
        assert!(s.report_end(11, end(t)).is_ok());
    }
    assert!(sent().is_empty());
    assert!(s.report_end(11, end(MAX_RIDING_ENDS as u64)).is_ok());
    let up = sent();
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].ends.len(), MAX_RIDING_ENDS);
    assert_eq!(up[0].kind, None);
}

/// An opening no control plane answers (its address is gone: the connect
/// hangs until Envoy's timeout) is given up after `OPENING_PATIENCE`, and
/// the questions waiting on it wait for the next try instead of running
/// into their deadline.
#[test]
fn an_unanswered_opening_is_given_up_and_the_next_try_goes() {
    let s = Session::fake(1);
    s.opened(7, at(0));
    assert!(s.ask(11, 100, b"q100".to_vec(), at(0), at(500)));
    assert_eq!(s.overdue_opening(at(199)), None, "still patient");
    assert_eq!(s.overdue_opening(at(200)), Some(7));
    assert!(s.closed(7, at(200)).is_empty(), "the question waits on");
    assert!(s.due(at(200)));
    s.opened(8, at(220));
    assert_eq!(confirm(&s, 8), [b"q100".to_vec()]);
    assert_eq!(s.overdue_opening(at(1000)), None, "up: nothing to give up");
    // A stream that worked breaks; its replacement hangs as well.
    s.closed(8, at(5000));
    s.opened(9, at(5020));
    assert_eq!(s.overdue_opening(at(5220)), Some(9));
    assert!(s.closed(9, at(5220)).is_empty());
    assert!(s.due(at(5220)), "the next quick try at once");
}

#[test]
fn the_root_ticks_fast_only_while_questions_wait_for_a_stream_to_open() {
    let s = Session::fake(1);
    let tick = Duration::from_millis(20);
    s.set_tick(tick);
    assert_eq!(s.retick(), None, "nothing waits");
    // A VM's first question waits for the stream its next tick opens.
    assert!(s.ask(11, 100, b"q".to_vec(), at(0), at(500)));
    assert_eq!(s.retick(), Some(FAST_TICK));
    assert_eq!(s.retick(), None, "set once");
    s.opened(7, at(1));
    assert_eq!(s.retick(), None, "still waiting for the opening's answer");
    // Up: the tick after sends the question, and the tick slows down.
    assert_eq!(confirm(&s, 7).len(), 1);
    assert_eq!(s.retick(), Some(tick));
    // A question asked on a stream that is up waits for no tick.
    assert!(s.ask(12, 101, b"q".to_vec(), at(2), at(500)));
    assert_eq!(s.retick(), None);
}

#[test]
fn a_tick_longer_than_a_first_wait_never_ticks_fast() {
    // Questions take calls of their own: none waits for the stream.
    let s = Session::fake(1);
    s.set_tick(Duration::from_secs(60));
    assert!(!s.ask(11, 100, b"q".to_vec(), at(0), at(500)));
    assert_eq!(s.retick(), None);
}
