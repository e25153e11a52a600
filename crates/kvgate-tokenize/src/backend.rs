//! The tokenizer proper (Hugging Face or tiktoken) and the segment-cached
//! encode that makes warm prompts cheap.
//!
//! Both libraries split a text at its special (added) tokens first and encode
//! each piece between them on its own; this module does that split itself, so
//! that each piece can be looked up in [`SegmentCache`]. The ids are the same
//! as a whole-string encode wherever the split is the library's own: added
//! tokens matched on the raw text (not normalized), none with lstrip, rstrip
//! or single_word (they reach across piece boundaries), no
//! `split_special_tokens`, and no pre-tokenizer that looks at a piece's
//! position in the whole string (Metaspace with prepend_scheme "first").
//! Anything else is encoded whole, uncached.

use std::num::NonZeroUsize;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use tiktoken_rs::CoreBPE;

use crate::Tokens;
use crate::byte_level::ByteLevelBpe;
use crate::cache::SegmentCache;

const CACHE_ENTRIES: NonZeroUsize = match NonZeroUsize::new(4096) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

pub(crate) enum Model {
    Hf(Box<tokenizers::Tokenizer>),
    Tiktoken(&'static CoreBPE),
}

/// Finds special tokens in a text: pattern `i` is the token with id `ids[i]`.
struct Splitter {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

pub(crate) struct Backend {
    model: Model,
    /// `None`: this tokenizer must be given whole strings (see the module doc).
    splitter: Option<Splitter>,
    /// The ids `add_special_tokens = true` puts before and after one sequence
    /// (e.g. a BOS); `None` when that could not be worked out, so such encodes
    /// go whole.
    wrap: Option<(Vec<u32>, Vec<u32>)>,
    /// The hand-run pre-tokenizer for segments, where it gives the
    /// library's ids (see `byte_level`).
    fast: Option<ByteLevelBpe>,
    cache: SegmentCache,
}

impl Backend {
    pub(crate) fn new(model: Model) -> Self {
        let (splitter, wrap, fast) = match &model {
            Model::Hf(tok) => (hf_splitter(tok), hf_wrap(tok), ByteLevelBpe::recognise(tok)),
            Model::Tiktoken(bpe) => (tiktoken_splitter(bpe), Some((Vec::new(), Vec::new())), None),
        };
        Self {
            model,
            splitter,
            wrap,
            fast,
            cache: SegmentCache::new(CACHE_ENTRIES),
        }
    }

    /// Encodes `text` as the library would, stopping once more than `limit`
    /// ids are known.
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special: bool,
        limit: usize,
    ) -> Result<Tokens, String> {
        let (Some(splitter), Some((prefix, suffix))) = (&self.splitter, &self.wrap) else {
            return self
                .encode_whole(text, add_special)
                .map(|ids| Tokens::truncate(ids, limit));
        };
        // Sized for about two bytes a token (code, logs; prose takes fewer):
        // a 100k-token prompt's ids were copied again each time they grew.
        let mut out = Tokens {
            ids: Vec::with_capacity(
                (text.len() / 2)
                    .min(limit)
                    .saturating_add(prefix.len() + suffix.len()),
            ),
            truncated: false,
        };
        let (prefix, suffix): (&[u32], &[u32]) = if add_special {
            (prefix, suffix)
        } else {
            (&[], &[])
        };
        if out.push(prefix, limit) {
            return Ok(out);
        }
        let mut at = 0;
        for m in splitter.matcher.find_iter(text) {
            if self.push_segment(&mut out, &text[at..m.start()], limit)?
                || out.push(&splitter.ids[m.pattern().as_usize()..][..1], limit)
            {
                return Ok(out);
            }
            at = m.end();
        }
        if !self.push_segment(&mut out, &text[at..], limit)? {
            out.push(suffix, limit);
        }
        Ok(out)
    }

    /// Appends the ids of one text segment; true once `out` is truncated.
    fn push_segment(&self, out: &mut Tokens, segment: &str, limit: usize) -> Result<bool, String> {
        if segment.is_empty() {
            return Ok(false);
        }
        let key = SegmentCache::key(segment);
        let ids = match self.cache.get(key) {
            Some(ids) => ids,
            None => {
                let ids: Arc<[u32]> = self.encode_segment(segment)?.into();
                self.cache.put(key, Arc::clone(&ids));
                ids
            }
        };
        Ok(out.push(&ids, limit))
    }

    /// A piece holding no splittable special token, without special tokens added.
    fn encode_segment(&self, segment: &str) -> Result<Vec<u32>, String> {
        match &self.model {
            Model::Hf(tok) => match &self.fast {
                Some(fast) if fast.applies(segment) => fast
                    .encode(tok, segment)
                    .or_else(|_| Self::encode_library(tok, segment)),
                _ => Self::encode_library(tok, segment),
            },
            Model::Tiktoken(bpe) => Ok(bpe.encode_ordinary(segment)),
        }
    }

    /// The library's own encode of a segment, without special tokens added.
    fn encode_library(tok: &tokenizers::Tokenizer, segment: &str) -> Result<Vec<u32>, String> {
        tok.encode_fast(segment, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The library's own encode of the whole string, uncached.
    pub(crate) fn encode_whole(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        match &self.model {
            Model::Hf(tok) => tok
                .encode_fast(text, add_special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string()),
            // tiktoken adds nothing around a sequence; special tokens in the
            // text are parsed, as in HF tokenizers.
            Model::Tiktoken(bpe) => Ok(bpe.encode_with_special_tokens(text)),
        }
    }

    pub(crate) fn segmented(&self) -> bool {
        self.splitter.is_some()
    }

    pub(crate) fn clear_cache(&self) {
        self.cache.clear();
    }

    pub(crate) fn cached_segments(&self) -> usize {
        self.cache.len()
    }
}

fn splitter(tokens: Vec<(String, u32)>) -> Option<Splitter> {
    if tokens.is_empty() {
        return None;
    }
    let matcher = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens.iter().map(|(s, _)| s.as_str()))
        .ok()?;
    Some(Splitter {
        matcher,
        ids: tokens.into_iter().map(|(_, id)| id).collect(),
    })
}

fn hf_splitter(tok: &tokenizers::Tokenizer) -> Option<Splitter> {
    if tok.get_encode_special_tokens() {
        return None;
    }
    if let Some(pre) = tok.get_pre_tokenizer() {
        // Metaspace "first" prepends only to the piece at offset 0 of the
        // whole string, which a piece encoded alone always is.
        let json = serde_json::to_string(pre).ok()?;
        if json.contains(r#""prepend_scheme":"first""#) {
            return None;
        }
    }
    let mut tokens = Vec::new();
    for (id, t) in tok.get_added_tokens_decoder() {
        if t.normalized || t.content.is_empty() {
            continue; // matched inside pieces, after normalization: left to the library
        }
        if t.lstrip || t.rstrip || t.single_word {
            return None;
        }
        tokens.push((t.content, id));
    }
    tokens.sort_by_key(|&(_, id)| id); // a stable pattern order
    splitter(tokens)
}

/// What `add_special_tokens = true` adds around one sequence, read off two
/// probes; `None` unless both agree that it is a fixed prefix and suffix.
fn hf_wrap(tok: &tokenizers::Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    let mut found: Option<(Vec<u32>, Vec<u32>)> = None;
    for probe in ["a", "Hello world, 12 probes."] {
        let plain = tok.encode_fast(probe, false).ok()?.get_ids().to_vec();
        let with = tok.encode_fast(probe, true).ok()?.get_ids().to_vec();
        if plain.is_empty() || with.len() < plain.len() {
            return None;
        }
        let at = (0..=with.len() - plain.len()).find(|&i| with[i..i + plain.len()] == plain[..])?;
        let wrap = (with[..at].to_vec(), with[at + plain.len()..].to_vec());
        if found.as_ref().is_some_and(|f| *f != wrap) {
            return None;
        }
        found = Some(wrap);
    }
    found
}

fn tiktoken_splitter(bpe: &CoreBPE) -> Option<Splitter> {
    let mut tokens: Vec<(String, u32)> = bpe
        .special_tokens()
        .into_iter()
        .filter_map(|s| match bpe.encode_with_special_tokens(s)[..] {
            [id] => Some((s.to_owned(), id)),
            _ => None,
        })
        .collect();
    tokens.sort_by_key(|&(_, id)| id);
    splitter(tokens)
}
