//! Text density (issue 30): how many characters a token the workload's text
//! has (`--density 4,2,1.3`), the engine density that implies, and
//! [`Density::recode`], which rewrites a workload's English-like filler as
//! text of that density with the same tokens and the same sharing.
//!
//! **Characters, and why the engines are told bytes.** Tokenizer figures are
//! quoted in characters a token (English ≈ 4, code ≈ 2, Chinese ≈ 1.3 on
//! Llama 3's), so `--density` is characters. The simulated engines count
//! bytes (`SimConfig::bytes_per_token`), and so does the gateway: its learned
//! density (`kvgate_routing::units::Density`, "tokens a character") is
//! sampled as `usage.prompt_tokens ÷ window.len()`, the UTF-8 length of the
//! canonical prompt. Text of 2 characters a token is ASCII here, 2 bytes a
//! token for both, so the gateway's 4-a-token guess is 2× off and it must
//! learn. Text of 1.3 is CJK (3 bytes a character): the engine is given
//! 1.3 × 3 = 3.9 bytes a token, a fraction the simulator holds exactly, and
//! the gateway, counting bytes, sees 3.9 — near its guess. That is what a
//! real CJK prompt does to it too; the cell tests multi-byte text (block cuts
//! inside characters, key windows in characters), not a wrong guess.
//!
//! **Recoding.** The filler counts 4 bytes a token; token `k` of a text (its
//! `k`-th 4-byte chunk) becomes characters `⌊k·d⌋..⌊(k+1)·d⌋` of the output,
//! drawn from a hash of the chunk alone. So a text of `K` tokens becomes one
//! of `⌊K·d⌋` characters, `K` tokens at the new density; texts that share
//! their first `m` chunks share their first `⌊m·d⌋` characters, and texts
//! that differ differ from there on (up to a 1-in-64 chance a token): every
//! prefix the workload shares stays shared, and no other. The engines'
//! answers (English-like words whatever the density) are recoded the same way
//! before they join a conversation's history (`driver`).

use std::fmt;

use anyhow::Context as _;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Code-like characters, each one token after a space in BPE vocabularies
/// trained on English and code (SmolLM2's among them): identifiers' letters
/// and the punctuation between them. 64, so a character is 6 bits of hash.
const CODE: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_(){}[]=;.,:";

/// First of the 4,096 CJK unified ideographs drawn from (U+4E00..=U+5DFF,
/// all assigned): 12 bits of hash a character.
const CJK_FIRST: u32 = 0x4E00;

/// Characters a token, thousandths (integers, so every run cuts the same).
const MILLI: u64 = 1_000;

/// Characters of workload text a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Density(f64);

/// What a density's text is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// The workloads' own English-like filler (exactly 4 characters a token).
    Prose,
    /// Code-like ASCII: identifiers and punctuation (1.8 characters a token or more).
    Code,
    /// CJK ideographs, 3 UTF-8 bytes each (below 1.8).
    Cjk,
}

impl Density {
    /// The workloads' own text: 4 characters (bytes) a token.
    pub const ENGLISH: Density = Density(4.0);
    /// The range `--density` takes.
    pub const RANGE: (f64, f64) = (1.0, 16.0);

    /// `chars_per_token` if it is a number in [`Density::RANGE`], rounded to
    /// the nearest thousandth.
    pub fn new(chars_per_token: f64) -> Option<Self> {
        let (lo, hi) = Self::RANGE;
        (chars_per_token.is_finite() && (lo..=hi).contains(&chars_per_token))
            .then(|| Density((chars_per_token * MILLI as f64).round() / MILLI as f64))
    }

    /// One `--density` value.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let v: f64 = s
            .trim()
            .parse()
            .with_context(|| format!("--density {s:?}: not a number"))?;
        let (lo, hi) = Self::RANGE;
        Self::new(v).with_context(|| format!("--density {s:?}: characters a token, {lo} to {hi}"))
    }

    /// Every value of a `--density` list, in order, each once.
    pub fn parse_list(list: &[String]) -> anyhow::Result<Vec<Self>> {
        let mut out: Vec<Self> = Vec::with_capacity(list.len());
        for s in list {
            let d = Self::parse(s)?;
            if !out.contains(&d) {
                out.push(d);
            }
        }
        Ok(out)
    }

    pub fn chars_per_token(self) -> f64 {
        self.0
    }

    pub fn is_english(self) -> bool {
        self == Self::ENGLISH
    }

    pub fn script(self) -> Script {
        if self.is_english() {
            Script::Prose
        } else if self.0 >= 1.8 {
            Script::Code
        } else {
            Script::Cjk
        }
    }

    /// UTF-8 bytes a character of this density's text.
    pub fn bytes_per_char(self) -> f64 {
        match self.script() {
            Script::Prose | Script::Code => 1.0,
            Script::Cjk => 3.0,
        }
    }

    /// The engines' `bytes_per_token`: what the gateway, counting bytes,
    /// learns (to the thousandth, as the engines hold it).
    pub fn bytes_per_token(self) -> f64 {
        (self.0 * self.bytes_per_char() * MILLI as f64).round() / MILLI as f64
    }

    /// Characters of the output for tokens `0..k`: ⌊k·d⌋.
    fn chars_before(self, k: usize) -> usize {
        let milli = (self.0 * MILLI as f64).round() as u64;
        let at = k as u128 * u128::from(milli) / u128::from(MILLI);
        usize::try_from(at).unwrap_or(usize::MAX)
    }

    /// `text` (English-like filler, 4 bytes a token) as text of this density
    /// with as many tokens; the text itself at 4 (see the module docs).
    pub fn recode(self, text: &str) -> String {
        let script = self.script();
        if script == Script::Prose {
            return text.to_owned();
        }
        let bytes = text.as_bytes();
        let tokens = bytes.len().div_ceil(kvgate_sim::BYTES_PER_TOKEN);
        let per_char = self.bytes_per_char() as usize;
        let mut out = String::with_capacity(self.chars_before(tokens) * per_char);
        for (k, chunk) in bytes.chunks(kvgate_sim::BYTES_PER_TOKEN).enumerate() {
            let n = self.chars_before(k + 1) - self.chars_before(k);
            piece(&mut out, script, chunk, n);
        }
        out
    }

    /// As it reads in a report: `4`, `2`, `1.3`.
    pub fn label(self) -> String {
        format!("{}", self.0)
    }
}

impl fmt::Display for Density {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} chars/token", self.0)
    }
}

/// Push `n` characters of `script` standing for one 4-byte `chunk`.
fn piece(out: &mut String, script: Script, chunk: &[u8], n: usize) {
    let mut bits = xxh3_64_with_seed(chunk, 0x6465_6e73); // "dens"
    let mut left = 64u32;
    let mut draw = |width: u32| {
        if left < width {
            bits = splitmix64(bits);
            left = 64;
        }
        let v = bits & ((1u64 << width) - 1);
        bits >>= width;
        left -= width;
        v as usize
    };
    for i in 0..n {
        match script {
            // A space before a piece's first character keeps BPE from
            // merging it into the piece before: one token a piece.
            Script::Code if i == 0 && n >= 2 => out.push(' '),
            Script::Code => out.push(char::from(CODE[draw(6)])),
            Script::Cjk => {
                let c = char::from_u32(CJK_FIRST + draw(12) as u32).unwrap_or('\u{4E00}');
                out.push(c);
            }
            Script::Prose => {}
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
#[path = "density_tests.rs"]
mod tests;
