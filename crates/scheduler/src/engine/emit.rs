//! What one sequence's tokens become on its stream: detokenized text, held back while it might
//! be the start of a stop string and cut at the first stop string, with each token's
//! log-probabilities (when asked for) travelling in the event that carries its text.

use std::collections::VecDeque;

use hearth_infer::{Detokenizer, StepLogprobs, TextTokenizer};
use hearth_types::{TokenEvent, TokenLogprob, TopLogprob};

/// Turns one sequence's tokens into `TokenEvent::Token`s.
pub(super) struct Emitter {
    detok: Detokenizer,
    /// The request's non-empty stop strings, each with its index in the request's list.
    stops: Vec<(usize, String)>,
    /// Text not emitted yet because it might begin a stop string (empty without stop strings).
    held: String,
    /// Bytes emitted so far; `held` starts there.
    emitted: usize,
    /// Log-probabilities of tokens whose text has not gone out, with where the token's text
    /// starts and ends in the output (bytes since the first).
    pending: Vec<(usize, usize, TokenLogprob)>,
    /// A stop string was found: nothing more goes out.
    stopped: bool,
}

impl Emitter {
    pub(super) fn new(detok: Detokenizer, stops: &[String]) -> Emitter {
        Emitter {
            detok,
            stops: stops
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .map(|(i, s)| (i, s.clone()))
                .collect(),
            held: String::new(),
            emitted: 0,
            pending: Vec::new(),
            stopped: false,
        }
    }

    /// Adds generated token `id` (with its log-probabilities, when asked for) and queues what can
    /// go out. Returns the index (in the request's list) of the stop string the output now
    /// contains, if any: the sequence ends there.
    pub(super) fn push(
        &mut self,
        id: u32,
        logprob: Option<TokenLogprob>,
        outbox: &mut VecDeque<TokenEvent>,
    ) -> Option<usize> {
        let piece = self.detok.push(id);
        if self.stops.is_empty() && self.pending.is_empty() && logprob.is_none() {
            // The plain path: the piece goes out as it is.
            if let Some(text) = piece {
                self.emitted += text.len();
                outbox.push_back(TokenEvent::Token {
                    text,
                    id,
                    logprobs: Vec::new(),
                });
            }
            return None;
        }
        let start = self.emitted + self.held.len();
        if let Some(text) = piece {
            self.held.push_str(&text);
        }
        if let Some(entry) = logprob {
            let end = self.emitted + self.held.len();
            self.pending.push((start, end, entry));
        }
        self.release(id, false, outbox)
    }

    /// The end of the sequence: whatever the detokenizer and the stop-string check still hold
    /// goes out (unless a stop string ended it), with every log-probability left.
    pub(super) fn finish(&mut self, id: u32, outbox: &mut VecDeque<TokenEvent>) {
        if self.stopped {
            return;
        }
        if let Some(text) = self.detok.finish() {
            self.held.push_str(&text);
        }
        self.release(id, true, outbox);
    }

    /// Emits the text that can no longer be part of a stop string (all of it when `last`), or
    /// the text before the first stop string. The index of the stop string found, if one was.
    fn release(&mut self, id: u32, last: bool, outbox: &mut VecDeque<TokenEvent>) -> Option<usize> {
        let first = self
            .stops
            .iter()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, *i)))
            .min();
        let found = first.map(|(at, _)| at);
        let cut = match found {
            Some(at) => at,
            None if last => self.held.len(),
            None => self.undecided_from(),
        };
        let text = if cut == self.held.len() {
            std::mem::take(&mut self.held)
        } else {
            let rest = self.held.split_off(cut);
            std::mem::replace(&mut self.held, rest)
        };
        let stop_at = self.emitted + cut;
        self.emitted = stop_at;
        // Entries go out with text (a token whose text is not out yet waits for it), except at
        // the end, where all go. At a stop string, a token counts if any of its text went out.
        let split = if last && found.is_none() {
            self.pending.len()
        } else if text.is_empty() && found.is_none() {
            0
        } else {
            self.pending
                .iter()
                .take_while(|&&(start, end, _)| {
                    end <= stop_at || (found.is_some() && start < stop_at)
                })
                .count()
        };
        let logprobs: Vec<TokenLogprob> = self.pending.drain(..split).map(|(_, _, e)| e).collect();
        if !text.is_empty() || !logprobs.is_empty() {
            outbox.push_back(TokenEvent::Token { text, id, logprobs });
        }
        if found.is_some() {
            self.stopped = true;
            self.held.clear();
            self.pending.clear();
        }
        first.map(|(_, index)| index)
    }

    /// Where the held text's undecided tail starts: the first (char-boundary) position from
    /// which the rest is a proper beginning of some stop string.
    fn undecided_from(&self) -> usize {
        let longest = self.stops.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        let from = self.held.len().saturating_sub(longest.saturating_sub(1));
        (from..self.held.len())
            .filter(|&k| self.held.is_char_boundary(k))
            .find(|&k| {
                let tail = &self.held[k..];
                self.stops.iter().any(|(_, s)| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

/// The reported log-probabilities of token `id`, with each token's text and bytes.
pub(super) fn logprob_entry(tok: &TextTokenizer, id: u32, step: &StepLogprobs) -> TokenLogprob {
    let bytes = tok.token_bytes(id);
    TokenLogprob {
        id,
        token: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob: step.chosen,
        top: step
            .top
            .iter()
            .map(|&(id, logprob)| {
                let bytes = tok.token_bytes(id);
                TopLogprob {
                    id,
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    bytes,
                    logprob,
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_infer::TextModel;
    use std::sync::Arc;

    fn emitter(tok: &Arc<TextTokenizer>, stops: &[String]) -> Emitter {
        Emitter::new(tok.detokenizer(), stops)
    }

    fn tokenizer() -> Arc<TextTokenizer> {
        TextModel::tiny_random(7).tokenizer()
    }

    fn entry(id: u32) -> TokenLogprob {
        TokenLogprob {
            id,
            token: String::new(),
            bytes: Vec::new(),
            logprob: -0.5,
            top: Vec::new(),
        }
    }

    /// Pushes `text`'s tokens (with logprob entries when `logprobs`); returns the events' texts,
    /// their entries' ids, and whether a stop string ended it.
    fn run(text: &str, stops: &[&str], logprobs: bool) -> (Vec<String>, Vec<Vec<u32>>, bool) {
        let tok = tokenizer();
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut e = emitter(&tok, &stops);
        let mut outbox = VecDeque::new();
        let ids = tok.encode_plain(text).unwrap();
        let mut stopped = false;
        for &id in &ids {
            if e.push(id, logprobs.then(|| entry(id)), &mut outbox)
                .is_some()
            {
                stopped = true;
                break;
            }
        }
        e.finish(ids.last().copied().unwrap_or(0), &mut outbox);
        let mut texts = Vec::new();
        let mut entries = Vec::new();
        for event in outbox {
            let TokenEvent::Token { text, logprobs, .. } = event else {
                panic!("only tokens")
            };
            texts.push(text);
            entries.push(logprobs.iter().map(|l| l.id).collect());
        }
        (texts, entries, stopped)
    }

    #[test]
    fn without_stop_strings_every_piece_goes_out_as_it_comes() {
        let (texts, entries, stopped) = run("hello world, café 🦀", &[], false);
        assert_eq!(texts.concat(), "hello world, café 🦀");
        assert!(!stopped && entries.iter().all(Vec::is_empty));
    }

    #[test]
    fn text_is_cut_before_the_first_stop_string_and_never_contains_it() {
        let (texts, _, stopped) = run("hello world. the end. more", &["end.", "world!"], false);
        assert!(stopped);
        assert_eq!(texts.concat(), "hello world. the ");
        // A stop string split over many tokens, at the very start.
        let (texts, _, stopped) = run("STOPnow", &["STOP"], false);
        assert!(stopped);
        assert_eq!(texts.concat(), "");
        // A possible beginning that turns out not to be one is released.
        let (texts, _, stopped) = run("a <b <c", &["<end>"], false);
        assert!(!stopped);
        assert_eq!(texts.concat(), "a <b <c");
    }

    #[test]
    fn each_token_logprob_rides_with_the_text_it_produced() {
        let tok = tokenizer();
        let text = "hello café 🦀!";
        let ids = tok.encode_plain(text).unwrap();
        let (texts, entries, _) = run(text, &[], true);
        assert_eq!(texts.concat(), text);
        // Every token reported once, in order, whichever event carried it.
        assert_eq!(entries.concat(), ids);
        // The emoji's bytes take several byte-level tokens; their entries wait for its text.
        assert!(texts.iter().all(|t| !t.contains('\u{FFFD}')));
        let (texts, entries, stopped) = run("hello world. the end", &["end"], true);
        assert!(stopped);
        assert_eq!(texts.concat(), "hello world. the ");
        let kept = entries.concat();
        let all = tok.encode_plain("hello world. the end").unwrap();
        assert_eq!(
            kept[..],
            all[..kept.len()],
            "a prefix of the tokens, in order"
        );
        assert!(
            kept.len() < all.len(),
            "the stop string's own tokens are not reported"
        );
    }
}
