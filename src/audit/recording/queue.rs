//! The writer's channel, and the order in which the writer writes what sessions send on it:
//! arrival order, except that output its upstream cut off goes first.
//!
//! Such output (it took the recorder's cut lane; its events are marked urgent) belongs to a
//! session that can only end, and ends as soon as that output is written; and the cut lane
//! gets its room back only as the writer writes it. In arrival order it waited behind
//! everything queued before it, up to the whole shared budget of other sessions' events
//! (random bytes encode slowly), so a cut session took seconds to end.
//!
//! - A recording's own messages (open, events, close) never change order: an urgent event
//!   takes along everything its recording queued before it.
//! - Urgent recordings go in rounds: a round serves the recordings that had urgent events
//!   queued when it started, each only up to what it had queued then; before the next round,
//!   at least [`SLICE`] bytes and a third of what the round wrote go in arrival order (which
//!   holds everyone, so the oldest message waiting always moves on). Rounds so take at most
//!   three quarters of the writer while other output waits: a steady stream of cut-off output
//!   slows the other recordings down but never stops them, and an urgent event waits at most
//!   for the round under way and what arrival order is owed.
//! - Only output its upstream really cut off is urgent (a reset, or a connection that ended
//!   before the stream did; see `RecvStream::cut`): a session that ended well, whose upstream
//!   closed the connection while its output still waited, waits its turn like any other.
//! - Sorting has a cost per message, so the writer reads the channel in arrival order, as it
//!   comes, while it holds no urgent event ([`Outbox`] counts them); only then does it take
//!   everything waiting into its [`Queue`] and choose from there, until that is empty again.
//! - The queue holds what the channel would hold, nothing more: the writer only moves
//!   messages from one to the other. Every event keeps its share of the budget (or of a lane)
//!   until it is written, which bounds the events; an open and a close, which hold no share,
//!   come once per recording, and a recording holds its file (a descriptor) until its close is
//!   written, which bounds those. What the queue adds per message is its arrival-order entry
//!   (16 bytes, and at most as many again left behind by rounds) and the slack of growing
//!   buffers; it gives its buffers back when it is empty.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::writer::Message;

/// How many session bytes, at least, the writer writes in arrival order between two urgent
/// rounds (while there are any to write).
pub(super) const SLICE: usize = 256 * 1024;
/// For every this many bytes a round writes, arrival order is owed one more before the next
/// round (beside [`SLICE`]): cut-off output takes at most three quarters of the writer while
/// other output waits, so a stream of it (many sessions cut at once, an upstream that keeps
/// resetting) slows the others down, never stops them.
const ROUND_SHARE: usize = 3;
/// What a message counts towards a slice at the least (an open, a close, a resize), so that
/// a slice also ends after a bounded number of messages.
const MIN_COST: usize = 64;
/// Arrival-order entries left behind by messages written in a round that are tolerated
/// before they are swept out (also while they are at most half of all entries).
const STALE_SWEEP: usize = 1024;

/// The writer's channel: what sessions send on, and what the writer reads.
pub(super) fn channel() -> (Outbox, Inbox) {
    let (tx, rx) = unbounded_channel();
    let urgent = Arc::new(AtomicUsize::new(0));
    let outbox = Outbox {
        tx,
        urgent: urgent.clone(),
    };
    let inbox = Inbox {
        rx,
        urgent,
        queue: Queue::default(),
    };
    (outbox, inbox)
}

/// Where sessions send the writer their messages.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: UnboundedSender<Message>,
    /// Urgent events in the channel, not taken off it yet.
    urgent: Arc<AtomicUsize>,
}

impl Outbox {
    /// Sends `message`; lost if the writer is gone.
    pub(super) fn send(&self, message: Message) {
        if message.is_urgent() {
            // Counted before it is in the channel: a reader who sees the count 0 may still
            // find it there, and then takes it in arrival order, which is no harm.
            self.urgent.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self.tx.send(message);
    }
}

/// What the writer reads: the channel, and the messages it took off it to choose from.
pub(crate) struct Inbox {
    rx: UnboundedReceiver<Message>,
    urgent: Arc<AtomicUsize>,
    queue: Queue,
}

impl Inbox {
    /// The message to write next; `None` when nothing is waiting.
    pub(super) fn try_next(&mut self) -> Option<Message> {
        if self.queue.queued == 0 && self.urgent.load(Ordering::Relaxed) == 0 {
            // Arrival order is all there is: straight off the channel.
            let message = self.rx.try_recv().ok()?;
            return Some(self.taken(message));
        }
        while let Ok(message) = self.rx.try_recv() {
            let message = self.taken(message);
            self.queue.push(message);
        }
        self.queue.next()
    }

    /// Waits for a message, when [`Inbox::try_next`] had none; `None` once every sender is
    /// gone.
    pub(super) fn wait(&mut self) -> Option<Message> {
        let message = self.rx.blocking_recv()?;
        Some(self.taken(message))
    }

    /// Counts `message` off the channel.
    fn taken(&self, message: Message) -> Message {
        if message.is_urgent() {
            self.urgent.fetch_sub(1, Ordering::Relaxed);
        }
        message
    }
}

/// Messages taken off the writer's channel, not written yet.
#[derive(Default)]
pub(super) struct Queue {
    /// Each recording's queued messages, oldest first, with their arrival numbers; only
    /// recordings that have some.
    recordings: HashMap<u64, Queued, BuildHasherDefault<IdHasher>>,
    /// (arrival number, recording) of every queued message, in arrival order, and of some
    /// already written in a round (stale: their recording's oldest queued message came
    /// later); at most [`STALE_SWEEP`] or half of them are stale.
    order: VecDeque<(u64, u64)>,
    stale: usize,
    /// Messages queued.
    queued: usize,
    /// Recordings that were given urgent events since the last round started, in that order
    /// (a recording may stand here more than once, or after its urgent events were written
    /// in arrival order: its `urgent` flag says whether it still counts).
    urgent: VecDeque<u64>,
    /// The round under way: recordings still to serve, each with the arrival number of the
    /// last message it is served up to.
    round: VecDeque<(u64, u64)>,
    /// Session bytes still to write in arrival order before the next round may start.
    owed: usize,
    /// The next arrival number.
    arrivals: u64,
}

#[derive(Default)]
struct Queued {
    messages: VecDeque<(u64, Message)>,
    /// It was given an urgent event after the last round that served it started.
    urgent: bool,
}

impl Queue {
    /// Takes a message off the channel.
    pub(super) fn push(&mut self, message: Message) {
        let (id, arrival) = (message.id(), self.arrivals);
        self.arrivals += 1;
        let queued = self.recordings.entry(id).or_default();
        if message.is_urgent() && !queued.urgent {
            queued.urgent = true;
            self.urgent.push_back(id);
        }
        queued.messages.push_back((arrival, message));
        self.order.push_back((arrival, id));
        self.queued += 1;
    }

    /// The message to write next, if any is queued.
    pub(super) fn next(&mut self) -> Option<Message> {
        if let Some(message) = self.next_in_round() {
            return Some(message);
        }
        if self.owed == 0 && self.start_round() {
            return self.next_in_round();
        }
        while let Some((arrival, id)) = self.order.pop_front() {
            if self.oldest_of(id) == Some(arrival) {
                let message = self.pop(id)?;
                self.owed = self.owed.saturating_sub(message.len().max(MIN_COST));
                return Some(message);
            }
            self.stale -= 1;
        }
        None
    }

    /// Starts a round with the recordings that have urgent events queued; whether there are.
    fn start_round(&mut self) -> bool {
        for id in self.urgent.drain(..) {
            let Some(queued) = self.recordings.get_mut(&id) else {
                continue;
            };
            if std::mem::take(&mut queued.urgent) {
                if let Some(&(last, _)) = queued.messages.back() {
                    self.round.push_back((id, last));
                }
            }
        }
        if self.round.is_empty() {
            return false;
        }
        // Each message the round writes adds to this ([`next_in_round`]).
        self.owed = SLICE;
        true
    }

    /// The next message of the round under way, if it has one left.
    fn next_in_round(&mut self) -> Option<Message> {
        while let Some(&(id, last)) = self.round.front() {
            if self.oldest_of(id).is_some_and(|arrival| arrival <= last) {
                let message = self.pop(id)?;
                // Arrival order gets a third of it back before the next round: rounds take at
                // most three quarters of what the writer writes while others wait.
                if self.queued > 0 {
                    self.owed += message.len().max(MIN_COST) / ROUND_SHARE;
                }
                // Its entry in `order` stays behind.
                self.stale += 1;
                if self.stale > STALE_SWEEP && self.stale > self.order.len() / 2 {
                    self.sweep();
                }
                return Some(message);
            }
            self.round.pop_front();
        }
        None
    }

    /// The arrival number of recording `id`'s oldest queued message.
    fn oldest_of(&self, id: u64) -> Option<u64> {
        let queued = self.recordings.get(&id)?;
        queued.messages.front().map(|&(arrival, _)| arrival)
    }

    /// Takes the oldest queued message of recording `id`.
    fn pop(&mut self, id: u64) -> Option<Message> {
        let queued = self.recordings.get_mut(&id)?;
        let (_, message) = queued.messages.pop_front()?;
        if queued.messages.is_empty() {
            self.recordings.remove(&id);
        }
        self.queued -= 1;
        if self.queued == 0 {
            // Nothing is left that could be starved, and every entry in `order` is stale.
            // The writer reads the channel directly again: what a burst grew goes back.
            self.owed = 0;
            self.order.clear();
            self.order.shrink_to(STALE_SWEEP);
            self.recordings.shrink_to(64);
            self.stale = 0;
        }
        Some(message)
    }

    /// Drops the stale entries of `order`.
    fn sweep(&mut self) {
        let recordings = &self.recordings;
        self.order.retain(|&(arrival, id)| {
            let oldest = recordings.get(&id).and_then(|q| q.messages.front());
            oldest.is_some_and(|&(first, _)| first <= arrival)
        });
        self.stale = 0;
    }
}

/// Hashes recording ids, which are handed out in sequence and never chosen by a client: one
/// multiplication spreads them, at a fraction of the default hasher's cost (the writer looks
/// a recording up twice for every message).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::audit::recording::writer::EventKind;

    /// An event of recording `id` whose output is `text`.
    fn event(id: u64, text: &str, urgent: bool) -> Message {
        let permits = Arc::new(Semaphore::new(text.len().max(1)));
        Message::Event {
            id,
            at: 0.0,
            kind: EventKind::Output(Bytes::copy_from_slice(text.as_bytes())),
            urgent,
            _budget: permits.try_acquire_many_owned(text.len() as u32).unwrap(),
        }
    }

    /// What a message is, as a test names it: `3:close`, `3:abc`, `3:abc!` (urgent).
    fn name(message: &Message) -> String {
        match message {
            Message::Open { id, .. } => format!("{id}:open"),
            Message::Close { id, .. } => format!("{id}:close"),
            Message::Event {
                id,
                kind: EventKind::Output(data),
                urgent,
                ..
            } => format!(
                "{id}:{}{}",
                String::from_utf8_lossy(data),
                if *urgent { "!" } else { "" }
            ),
            Message::Event { id, .. } => format!("{id}:?"),
        }
    }

    /// Everything queued, in the order the writer takes it.
    fn drain(queue: &mut Queue) -> Vec<String> {
        std::iter::from_fn(|| queue.next())
            .map(|m| name(&m))
            .collect()
    }

    /// An event of recording `id` numbered `seq`, carrying `len` bytes.
    fn numbered(id: u64, seq: u32, len: usize, urgent: bool) -> Message {
        let mut data = vec![b'x'; len.max(4)];
        data[..4].copy_from_slice(&seq.to_be_bytes());
        let permits = Arc::new(Semaphore::new(data.len()));
        Message::Event {
            id,
            at: 0.0,
            _budget: permits.try_acquire_many_owned(data.len() as u32).unwrap(),
            kind: EventKind::Output(Bytes::from(data)),
            urgent,
        }
    }

    /// What the writer would do with `message`: note it under its recording.
    fn note(got: &mut HashMap<u64, Vec<u32>>, message: Message) {
        let seq = match &message {
            Message::Event {
                kind: EventKind::Output(data),
                ..
            } => u32::from_be_bytes(data[..4].try_into().unwrap()),
            Message::Close { .. } => u32::MAX,
            _ => unreachable!(),
        };
        got.entry(message.id()).or_default().push(seq);
    }

    proptest::proptest! {
        /// Any mix of sends (ordinary, urgent, closes, of many sizes) and takes through the
        /// writer's channel: everything sent comes out once, each recording's in its order;
        /// the writer is never told "nothing" while anything waits; and the arrival-order
        /// entries stay bounded.
        #[test]
        fn the_inbox_loses_nothing_reorders_nothing_and_never_idles_with_work(
            steps in proptest::collection::vec(
                (0u64..8, 0u8..8, proptest::prop_oneof![1usize..2_000, 60_000usize..300_000]),
                1..2_000,
            )
        ) {
            let (outbox, mut inbox) = channel();
            let mut sent: HashMap<u64, Vec<u32>> = HashMap::new();
            let mut got: HashMap<u64, Vec<u32>> = HashMap::new();
            // A closed recording's id is not used again (ids are handed out once).
            let mut generation: HashMap<u64, u64> = HashMap::new();
            let mut seq = 0;
            for (slot, what, len) in steps {
                let id = slot + 8 * generation.get(&slot).copied().unwrap_or(0);
                match what {
                    0..=2 => {
                        seq += 1;
                        sent.entry(id).or_default().push(seq);
                        outbox.send(numbered(id, seq, len, what == 2));
                    }
                    3 => {
                        sent.entry(id).or_default().push(u32::MAX);
                        outbox.send(Message::close(id));
                        *generation.entry(slot).or_default() += 1;
                    }
                    _ => match inbox.try_next() {
                        Some(message) => note(&mut got, message),
                        None => {
                            // The writer would now wait on the channel: nothing may be queued.
                            proptest::prop_assert_eq!(inbox.queue.queued, 0);
                            proptest::prop_assert!(inbox.rx.is_empty());
                        }
                    },
                }
                let bound = 2 * inbox.queue.queued + STALE_SWEEP + 2;
                proptest::prop_assert!(inbox.queue.order.len() <= bound);
            }
            while let Some(message) = inbox.try_next() {
                note(&mut got, message);
            }
            proptest::prop_assert_eq!(inbox.queue.queued, 0);
            proptest::prop_assert_eq!(inbox.urgent.load(Ordering::Relaxed), 0);
            proptest::prop_assert_eq!(got, sent);
        }
    }

    /// However much cut-off output keeps coming, arrival order gets at least a quarter of what
    /// the writer writes: a fault that cuts sessions one after another does not stop the
    /// recordings it did not cut.
    #[test]
    fn urgent_output_takes_at_most_three_quarters_of_the_writer() {
        let mut queue = Queue::default();
        let chunk = "x".repeat(64 * 1024);
        for _ in 0..64 {
            queue.push(event(1, &chunk, false));
        }
        queue.push(Message::close(1));
        let (mut ordinary, mut urgent, mut in_round) = (0, 0, false);
        for cut_session in 100.. {
            // Four more cut sessions' worth of output for every message written.
            for other in 0..4 {
                queue.push(event(cut_session + other * 1_000_000, &chunk, true));
            }
            match queue.next().unwrap() {
                Message::Close { id: 1, .. } => break,
                message @ Message::Event { id: 1, .. } => {
                    ordinary += message.len();
                    in_round = false;
                }
                message => {
                    // A round starts: arrival order has had what the rounds before it owed.
                    assert!(
                        in_round || ordinary >= urgent / ROUND_SHARE,
                        "{ordinary} bytes in arrival order against {urgent} urgent"
                    );
                    urgent += message.len();
                    in_round = true;
                }
            }
            assert!(cut_session < 10_000, "recording 1 starved");
        }
        assert_eq!(ordinary, 64 * chunk.len());
    }

    #[test]
    fn without_urgent_events_messages_go_in_arrival_order() {
        let mut queue = Queue::default();
        let sent = ["1:a", "2:b", "1:c", "3:d", "2:e", "1:f"];
        for s in sent {
            let (id, text) = s.split_once(':').unwrap();
            queue.push(event(id.parse().unwrap(), text, false));
        }
        queue.push(Message::close(2));
        let mut expected: Vec<String> = sent.iter().map(|s| s.to_string()).collect();
        expected.push("2:close".into());
        assert_eq!(drain(&mut queue), expected);
        assert!(queue.next().is_none());
    }

    #[test]
    fn a_recordings_messages_keep_their_order_whatever_goes_first() {
        let mut queue = Queue::default();
        // Recording 2's events before its urgent one, behind recording 1's, and more after.
        queue.push(event(1, "a0", false));
        queue.push(event(2, "b0", false));
        queue.push(event(1, "a1", false));
        queue.push(event(2, "b1", false));
        queue.push(event(2, "b2", true));
        queue.push(event(2, "b3", false));
        queue.push(event(2, "b4", true));
        queue.push(Message::close(2));
        queue.push(event(1, "a2", true));
        queue.push(event(3, "c0", false));
        let order = drain(&mut queue);
        for (id, expected) in [
            (1, &["1:a0", "1:a1", "1:a2!"][..]),
            (
                2,
                &["2:b0", "2:b1", "2:b2!", "2:b3", "2:b4!", "2:close"][..],
            ),
            (3, &["3:c0"][..]),
        ] {
            let own: Vec<&str> = order
                .iter()
                .map(String::as_str)
                .filter(|m| m.starts_with(&format!("{id}:")))
                .collect();
            assert_eq!(own, expected, "recording {id} in {order:?}");
        }
        // Both urgent recordings, in the order they became urgent, then the rest.
        assert_eq!(order[0], "2:b0");
        assert_eq!(order[6], "1:a0");
        assert_eq!(order[9], "3:c0");
    }

    #[test]
    fn an_urgent_event_goes_before_a_backlog_of_other_recordings() {
        let mut queue = Queue::default();
        for i in 0..10_000 {
            queue.push(event(1 + i % 40, "x", false));
        }
        queue.push(event(99, "cut", true));
        queue.push(Message::close(99));
        let order = drain(&mut queue);
        assert_eq!(order[..2], ["99:cut!", "99:close"]);
        assert_eq!(order.len(), 10_002);
    }

    #[test]
    fn the_inbox_sorts_only_while_urgent_events_wait() {
        let (outbox, mut inbox) = channel();
        let next = |inbox: &mut Inbox| inbox.try_next().map(|m| name(&m));
        // Nothing urgent: straight off the channel, in arrival order, nothing held back.
        outbox.send(event(1, "a", false));
        outbox.send(event(2, "b", false));
        assert_eq!(next(&mut inbox).as_deref(), Some("1:a"));
        assert_eq!(inbox.queue.queued, 0);
        // An urgent event behind it: everything waiting is taken in, the urgent one first.
        outbox.send(event(1, "c", false));
        outbox.send(event(3, "cut", true));
        outbox.send(Message::close(3));
        assert_eq!(next(&mut inbox).as_deref(), Some("3:cut!"));
        assert_eq!(inbox.urgent.load(Ordering::Relaxed), 0);
        assert_eq!(inbox.queue.queued, 3);
        // What came meanwhile waits behind what was taken in, and then it is arrival order
        // straight off the channel again.
        outbox.send(event(2, "d", false));
        let rest: Vec<String> = std::iter::from_fn(|| next(&mut inbox)).collect();
        assert_eq!(rest, ["3:close", "2:b", "1:c", "2:d"]);
        outbox.send(event(1, "e", false));
        assert_eq!(next(&mut inbox).as_deref(), Some("1:e"));
        assert_eq!(inbox.queue.queued, 0);
        assert!(next(&mut inbox).is_none());
    }

    #[test]
    fn entries_left_behind_by_rounds_stay_bounded() {
        let mut queue = Queue::default();
        // A long backlog at the front, and urgent events served in rounds meanwhile: each
        // leaves its arrival-order entry behind the backlog.
        for _ in 0..50_000 {
            queue.push(event(1, "x", false));
        }
        for cut_session in 100..100_000 {
            queue.push(event(cut_session, "cut", true));
            queue.next().unwrap();
            let bound = 2 * queue.queued + STALE_SWEEP + 2;
            assert!(
                queue.order.len() <= bound,
                "{} > {bound}",
                queue.order.len()
            );
        }
        assert_eq!(drain(&mut queue).len(), queue.arrivals as usize - 99_900);
        assert!(queue.order.is_empty());
    }

    #[test]
    fn a_steady_stream_of_urgent_events_does_not_starve_the_others() {
        let mut queue = Queue::default();
        // A backlog of 64 KiB events of recording 1, with a close at its end.
        let chunk = "x".repeat(64 * 1024);
        for _ in 0..16 {
            queue.push(event(1, &chunk, false));
        }
        queue.push(Message::close(1));
        // Every time the writer takes a message, another cut session sends an urgent event
        // (the writer could never keep up with that alone); each is noted with how many of
        // the backlog's bytes had been taken when it came.
        let mut came = HashMap::new();
        let (mut backlog_taken, mut urgent_taken) = (0, 0);
        for cut_session in 100.. {
            came.insert(cut_session, backlog_taken);
            queue.push(event(cut_session, "cut", true));
            let message = queue.next().unwrap();
            match message {
                Message::Event { id: 1, .. } => backlog_taken += message.len(),
                Message::Event { id, urgent, .. } => {
                    assert!(urgent);
                    urgent_taken += 1;
                    // Behind at most one slice of the others, and the third of the round
                    // before it that arrival order is owed (here less than one of its events).
                    let waited = backlog_taken - came[&id];
                    assert!(
                        waited <= SLICE + chunk.len(),
                        "cut session {id} waited for {waited} bytes"
                    );
                }
                Message::Close { id: 1, .. } => break,
                _ => unreachable!(),
            }
            assert!(cut_session < 100_000, "recording 1 starved");
        }
        assert_eq!(backlog_taken, 16 * chunk.len());
        // The urgent events went first: more of them were written than the backlog's events.
        assert!(urgent_taken > 16, "{urgent_taken}");
        let rest = drain(&mut queue);
        assert!(rest.iter().all(|m| m.ends_with(":cut!")), "{rest:?}");
    }
}
