//! A faster encode of one text segment for byte-level BPE tokenizers (GPT-2,
//! SmolLM2, Llama 3, Qwen 2 and their kin): the pre-tokenizer's split run on
//! `regex-automata`'s DFAs, then the tokenizer's own model.
//!
//! Why by hand: `tokenizers` runs these split patterns on `fancy-regex` (its
//! other backend, onig, is a C build), because each ends in GPT-2's
//! `\s+(?!\S)|\s+`, a look-ahead that `regex` does not have, and `fancy-regex`
//! then runs the whole pattern on its backtracking VM: about 1 ms a KiB of
//! digit-dense text here, the largest part of a `kv_aware` decision whose
//! prompt ends in a new tool output (`benches/kv_aware.rs`). Without its
//! look-ahead the pattern is an ordinary regex; the look-ahead's one effect
//! is restored after each match (see [`ByteLevelBpe::split`]). Nothing else
//! of the library's pipeline is replaced: the bytes are mapped as its
//! ByteLevel pre-tokenizer maps them and each piece goes to the tokenizer's
//! own model. The fast path is taken only for the shapes [`ByteLevelBpe::recognise`]
//! knows, and tests compare it with the library's encode on generated text.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};
use serde_json::{Value, json};
use tokenizers::{Model, Tokenizer};

/// The look-ahead tail of GPT-2's pattern, and what stands in for it.
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";
const PLAIN_TAIL: &str = r"|\s+";
/// Bytes of whitespace in one match from which the library's own split is
/// used instead: `fancy-regex` keeps a backtrack point a character of
/// `\s+(?!\S)` and gives up at a million (`tokenizers` then leaves the rest
/// of the text unsplit), which no DFA reproduces. Well short of it: a run
/// this long is pathological anyway, and the library is always right.
const LONG_RUN: usize = 100_000;
/// The pattern of `tokenizers`' ByteLevel pre-tokenizer with `use_regex`.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

pub(crate) struct ByteLevelBpe {
    /// `Digits { individual_digits: true }` runs first: every numeric
    /// character is a piece of its own, and the split runs between them.
    digits: bool,
    /// The pattern without its look-ahead: `A|\s+`.
    split: Regex,
    /// `A` alone, to tell whether an all-whitespace match came from it.
    head: Regex,
    /// An NFC normalizer runs first; the fast path then takes ASCII text
    /// only (NFC leaves it as it is).
    nfc: bool,
    /// GPT-2's byte → character map (`bytes_to_unicode`).
    chars: [char; 256],
}

impl ByteLevelBpe {
    /// The fast path for this tokenizer, or `None` when its pipeline is not
    /// one this module reproduces exactly.
    pub(crate) fn recognise(tok: &Tokenizer) -> Option<Self> {
        if tok.get_truncation().is_some() || tok.get_padding().is_some() {
            return None;
        }
        // Added tokens matched after normalization could sit inside a segment.
        if tok
            .get_added_tokens_decoder()
            .values()
            .any(|t| t.normalized)
        {
            return None;
        }
        let nfc = match tok.get_normalizer() {
            None => false,
            Some(n) if serde_json::to_value(n).ok()? == json!({"type": "NFC"}) => true,
            Some(_) => return None,
        };
        let pre = serde_json::to_value(tok.get_pre_tokenizer()?).ok()?;
        let (digits, pattern) = shape(&pre)?;
        let head_source = pattern.strip_suffix(LOOKAHEAD_TAIL)?;
        let head = Regex::new(head_source).ok()?;
        // A head that can match nothing would split differently (and never
        // advance); every known pattern's needs a character.
        if head.is_match(Input::new("").anchored(Anchored::Yes)) {
            return None;
        }
        Some(Self {
            digits,
            split: Regex::new(&format!("{head_source}{PLAIN_TAIL}")).ok()?,
            head,
            nfc,
            chars: bytes_to_unicode(),
        })
    }

    /// Whether [`Self::encode`] gives the library's ids for `text`.
    pub(crate) fn applies(&self, text: &str) -> bool {
        !self.nfc || text.is_ascii()
    }

    /// The ids of `text` (no special tokens added), as the library's encode.
    pub(crate) fn encode(&self, tok: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
        let model = tok.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut mapped = String::new();
        let mut piece_ids = |piece: &str| -> Result<(), String> {
            mapped.clear();
            mapped.extend(piece.bytes().map(|b| self.chars[usize::from(b)]));
            let tokens = model.tokenize(&mapped).map_err(|e| e.to_string())?;
            ids.extend(tokens.iter().map(|t| t.id));
            Ok(())
        };
        if self.digits {
            let mut at = 0;
            for (i, c) in text.char_indices().filter(|(_, c)| c.is_numeric()) {
                self.split(&text[at..i], &mut piece_ids)?;
                let end = i + c.len_utf8();
                self.split(&text[i..end], &mut piece_ids)?;
                at = end;
            }
            self.split(&text[at..], &mut piece_ids)?;
        } else {
            self.split(text, &mut piece_ids)?;
        }
        Ok(ids)
    }

    /// Calls `piece` for each piece of `text` that the pattern with its
    /// look-ahead would give, matches and the text between them alike.
    ///
    /// `\s+(?!\S)|\s+` at a run of whitespace that `A` does not match there:
    /// the whole run when it ends the text or is one character long, else
    /// the run less its last character (left to start the next piece, as
    /// in " word"). `A|\s+` gives the whole run, so it is shortened here.
    fn split(
        &self,
        text: &str,
        piece: &mut impl FnMut(&str) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut at = 0;
        while at < text.len() {
            let Some(m) = self.split.search(&Input::new(text).range(at..)) else {
                return piece(&text[at..]);
            };
            if m.is_empty() {
                // Not for a recognised pattern (see `recognise`); the caller
                // falls back to the library rather than loop here.
                return Err("empty pre-tokenizer match".to_owned());
            }
            if m.start() > at {
                piece(&text[at..m.start()])?;
            }
            let found = &text[m.start()..m.end()];
            let mut end = m.end();
            if found.chars().all(char::is_whitespace) {
                if found.len() >= LONG_RUN {
                    return Err("a whitespace run past fancy-regex's stack".to_owned());
                }
                // Several characters, more text after, and not `A`'s match:
                // `\s+(?!\S)` leaves the last one to the next piece.
                if let Some((last, _)) = found.char_indices().next_back()
                    && last > 0
                    && end < text.len()
                    && !self.head_matches_at(text, m.start())
                {
                    end = m.start() + last;
                }
            }
            piece(&text[m.start()..end])?;
            at = end;
        }
        Ok(())
    }

    /// Whether the head `A` of the pattern matches at `at` in `text`.
    fn head_matches_at(&self, text: &str, at: usize) -> bool {
        let input = Input::new(text).range(at..).anchored(Anchored::Yes);
        self.head.search(&input).is_some()
    }
}

/// Whether the pre-tokenizer runs Digits first, and its split pattern.
fn shape(pre: &Value) -> Option<(bool, String)> {
    let byte_level = |v: &Value, regex: bool| {
        v["type"] == "ByteLevel" && v["add_prefix_space"] == false && v["use_regex"] == regex
    };
    if byte_level(pre, true) {
        return Some((false, GPT2.to_owned()));
    }
    if pre["type"] != "Sequence" {
        return None;
    }
    match pre["pretokenizers"].as_array()?.as_slice() {
        [d, b]
            if d["type"] == "Digits" && d["individual_digits"] == true && byte_level(b, true) =>
        {
            Some((true, GPT2.to_owned()))
        }
        [s, b]
            if s["type"] == "Split"
                && s["behavior"] == "Isolated"
                && s["invert"] == false
                && byte_level(b, false) =>
        {
            Some((false, s["pattern"]["Regex"].as_str()?.to_owned()))
        }
        _ => None,
    }
}

/// GPT-2's reversible byte → printable character map: printable Latin-1
/// bytes map to themselves, the rest to U+0100 upwards in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
    }
    chars
}
