//! Stream resume by regeneration (issue 17, `stream_resume: "regenerate"`): after a stream
//! broke past its commit point, a new answer is read but withheld until it has reproduced the
//! text the client already has — compared with whitespace normalised (runs of whitespace are
//! one space; leading and trailing whitespace ignored) — and only what comes after is passed
//! on. An answer that says something else is a divergence: nothing of it reaches the client.
//! Pure: the relay feeds it text and acts on the verdict.

/// What the new answer has come to so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Still reproducing what was sent; nothing to pass on yet.
    Pending,
    /// It said something else: this attempt cannot continue the stream.
    Diverged,
    /// It reproduced everything sent; this is the text after that (possibly empty). Later
    /// feeds return their text unchanged.
    Reproduced(String),
}

#[derive(Debug, Clone)]
pub struct Reproduction {
    /// The sent text, normalised.
    expected: Vec<char>,
    matched: usize,
    /// Whether the sent text ended in whitespace (the client has that space already).
    sent_trailing_space: bool,
    /// Whitespace seen in the new text since its last other character.
    pending_space: String,
    started: bool,
    done: bool,
    diverged: bool,
}

fn normalise(text: &str) -> Vec<char> {
    text.split_whitespace().collect::<Vec<_>>().join(" ").chars().collect()
}

impl Reproduction {
    pub fn new(sent: &str) -> Reproduction {
        let sent_trailing_space = sent.chars().last().is_some_and(char::is_whitespace);
        Reproduction {
            expected: normalise(sent),
            matched: 0,
            sent_trailing_space,
            pending_space: String::new(),
            started: false,
            done: false,
            diverged: false,
        }
    }

    /// Whether everything sent has been reproduced (the rest of the answer passes through).
    pub fn is_reproduced(&self) -> bool {
        self.done
    }

    /// Feeds the next piece of the new answer's text.
    pub fn feed(&mut self, text: &str) -> Verdict {
        if self.diverged {
            return Verdict::Diverged;
        }
        if self.done {
            return Verdict::Reproduced(text.to_string());
        }
        for (at, c) in text.char_indices() {
            if c.is_whitespace() {
                if self.started {
                    self.pending_space.push(c);
                }
                continue;
            }
            if self.matched == self.expected.len() {
                self.done = true;
                let mut rest = std::mem::take(&mut self.pending_space);
                if self.sent_trailing_space {
                    rest.clear();
                }
                rest.push_str(text.get(at..).unwrap_or_default());
                return Verdict::Reproduced(rest);
            }
            if !self.pending_space.is_empty() {
                if self.expected.get(self.matched) != Some(&' ') {
                    self.diverged = true;
                    return Verdict::Diverged;
                }
                self.matched += 1;
                self.pending_space.clear();
            }
            if self.expected.get(self.matched) != Some(&c) {
                self.diverged = true;
                return Verdict::Diverged;
            }
            self.matched += 1;
            self.started = true;
        }
        // Whitespace after the last reproduced character is held until it is known to be
        // followed by text (then it is the remainder's) or the answer ends.
        Verdict::Pending
    }

    /// The new answer ended: it reproduced everything sent (and had nothing more to say) or
    /// it did not.
    pub fn finish(&mut self) -> Verdict {
        if !self.diverged && self.matched == self.expected.len() {
            self.done = true;
            Verdict::Reproduced(String::new())
        } else {
            Verdict::Diverged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_remainder_follows_what_was_sent() {
        let mut r = Reproduction::new("mock part1 par");
        assert_eq!(r.feed("mock "), Verdict::Pending);
        assert_eq!(r.feed("part1 part2 "), Verdict::Reproduced("t2 ".into()), "mid-word cut");
        assert_eq!(r.feed("part3 "), Verdict::Reproduced("part3 ".into()));

        let mut r = Reproduction::new("mock  part1 ");
        assert_eq!(r.feed("mock part1"), Verdict::Pending);
        assert_eq!(r.feed(" part2"), Verdict::Reproduced("part2".into()), "the client has the space already");

        let mut r = Reproduction::new("mock part1");
        assert_eq!(r.feed("mock part1"), Verdict::Pending);
        assert_eq!(r.feed("\npart2"), Verdict::Reproduced("\npart2".into()), "the new answer's own whitespace");
    }

    #[test]
    fn a_different_answer_diverges() {
        let mut r = Reproduction::new("mock part1 part2");
        assert_eq!(r.feed("mock alt1"), Verdict::Diverged);
        assert_eq!(r.feed(" part2"), Verdict::Diverged, "once diverged, always");
        let mut r = Reproduction::new("mock part1 part2");
        assert_eq!(r.feed("mock part1"), Verdict::Pending);
        assert_eq!(r.finish(), Verdict::Diverged, "ended before reproducing everything");
        let mut r = Reproduction::new("mock part1");
        assert_eq!(r.feed("mock part1"), Verdict::Pending);
        assert_eq!(r.finish(), Verdict::Reproduced(String::new()));
    }

    fn split(text: &str, cuts: &[usize]) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
        points.sort_unstable();
        points.dedup();
        let mut out = Vec::new();
        let mut from = 0;
        for p in points.into_iter().chain([chars.len()]) {
            out.push(chars[from..p.max(from)].iter().collect());
            from = p.max(from);
        }
        out
    }

    proptest! {
        /// Whatever the cut and however either answer is chunked, the client ends up with the
        /// answer exactly once: what it had, then the remainder — nothing repeated or lost.
        #[test]
        fn sent_plus_remainder_is_the_answer(
            words in proptest::collection::vec("[a-z]{1,6}", 1..30),
            seps in proptest::collection::vec(prop_oneof![Just(" "), Just("  "), Just("\n")], 30),
            cut in 0usize..400,
            first in proptest::collection::vec(0usize..400, 0..8),
            second in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let answer: String = words.iter().zip(seps.iter()).map(|(w, s)| format!("{w}{s}")).collect();
            let sent: String = answer.chars().take(cut % (answer.chars().count() + 1)).collect();
            prop_assert_eq!(split(&answer, &first).concat(), answer.clone());
            let mut r = Reproduction::new(&sent);
            let mut out = String::new();
            let mut diverged = false;
            for piece in split(&answer, &second) {
                match r.feed(&piece) {
                    Verdict::Reproduced(rest) => out.push_str(&rest),
                    Verdict::Diverged => diverged = true,
                    Verdict::Pending => {}
                }
            }
            if !r.is_reproduced() {
                prop_assert_eq!(r.finish(), Verdict::Reproduced(String::new()));
            }
            prop_assert!(!diverged);
            let got = format!("{sent}{out}");
            // Equal up to the whitespace at the cut (the client's own, kept; the new answer's
            // at the same place, dropped when the client had some).
            prop_assert_eq!(normalise(&got), normalise(&answer), "sent {:?} + {:?}", sent, out);
            prop_assert!(got.len() <= answer.len() + 1);
        }
    }
}
