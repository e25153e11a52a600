//! Tests of `--density` parsing and of recoding workload text.

use super::*;

fn filler(seed: u64, tokens: usize) -> String {
    kvgate_sim::block_text(seed, tokens)
}

#[test]
fn densities_parse_as_characters_a_token_in_range() {
    assert_eq!(Density::parse("4").unwrap(), Density::ENGLISH);
    assert_eq!(Density::parse(" 1.3 ").unwrap().chars_per_token(), 1.3);
    assert_eq!(Density::parse("2.0004").unwrap().chars_per_token(), 2.0);
    for bad in ["", "x", "0.5", "0", "-2", "17", "NaN", "inf"] {
        assert!(Density::parse(bad).is_err(), "{bad:?}");
    }
    let list: Vec<String> = ["4", "2", "1.3", "2"].map(String::from).to_vec();
    let parsed = Density::parse_list(&list).unwrap();
    let cpt: Vec<f64> = parsed.iter().map(|d| d.chars_per_token()).collect();
    assert_eq!(cpt, [4.0, 2.0, 1.3], "in order, each once");
    assert!(Density::parse_list(&["2".into(), "zero".into()]).is_err());
}

#[test]
fn scripts_and_the_bytes_the_engines_count() {
    let d = |v| Density::new(v).unwrap();
    assert_eq!(Density::ENGLISH.script(), Script::Prose);
    assert_eq!(Density::ENGLISH.bytes_per_token(), 4.0);
    assert_eq!(d(2.0).script(), Script::Code);
    assert_eq!(d(2.0).bytes_per_token(), 2.0);
    assert_eq!(d(5.0).script(), Script::Code);
    assert_eq!(d(1.3).script(), Script::Cjk);
    assert_eq!(d(1.3).bytes_per_token(), 3.9);
    assert_eq!(d(1.3).label(), "1.3");
}

/// A text of K filler tokens becomes ⌊K·d⌋ characters, and the simulator at
/// the density's bytes a token counts K tokens of it (±1 for the cut).
#[test]
fn recoding_keeps_the_tokens_the_engine_counts() {
    let text = filler(1, 1_000);
    assert_eq!(Density::ENGLISH.recode(&text), text);
    for (v, bytes_per_char) in [(2.0, 1), (1.3, 3), (2.7, 1)] {
        let d = Density::new(v).unwrap();
        let out = d.recode(&text);
        assert_eq!(out.chars().count(), (1_000.0 * v).round() as usize, "{v}");
        assert_eq!(out.len(), out.chars().count() * bytes_per_char, "{v}");
        let engine = kvgate_sim::TokenBytes::new(d.bytes_per_token());
        let counted = engine.count(out.as_bytes()) as i64;
        assert!((counted - 1_000).abs() <= 1, "{v}: {counted} tokens");
    }
    let cjk = Density::new(1.3).unwrap().recode(&text);
    assert!(cjk.chars().all(|c| ('\u{4E00}'..='\u{5DFF}').contains(&c)));
    let code = Density::new(2.0).unwrap().recode(&text);
    assert!(code.bytes().all(|b| b == b' ' || CODE.contains(&b)));
    assert_eq!(code.matches(' ').count(), 1_000, "one piece a token");
}

/// Texts sharing a prefix share its recoding, and differ after it.
#[test]
fn recoding_keeps_shared_prefixes_shared_and_no_more() {
    let a = filler(7, 600);
    let b = format!("{}{}", &a[..4 * 400], filler(8, 200));
    for v in [2.0, 1.3] {
        let d = Density::new(v).unwrap();
        let (ra, rb): (Vec<char>, Vec<char>) = (
            d.recode(&a).chars().collect(),
            d.recode(&b).chars().collect(),
        );
        let shared = ra.iter().zip(&rb).take_while(|(x, y)| x == y).count();
        let expect = d.chars_before(400);
        // Up to a few characters more when the first differing tokens happen to match.
        assert!(
            (expect..expect + 8).contains(&shared),
            "{v}: {shared} vs {expect}"
        );
        assert_eq!(d.recode(&a), d.recode(&a), "deterministic");
    }
}

/// What SmolLM2 (`kv_aware`'s tokenizer) makes of the recoded text: code at
/// about 2 characters a token as the engines count it; CJK far denser (it is
/// an English model), which is why `kv_aware`'s instances get their own
/// ratio in density cells (`Setup::at_density`).
#[test]
fn smollm2_counts_code_near_its_density() {
    let tok = crate::tokenizer::shared().unwrap();
    let text = filler(3, 2_000);
    let code = Density::new(2.0).unwrap().recode(&text);
    let n = tok.encode(&code, false).len() as f64;
    let per_token = code.chars().count() as f64 / n;
    assert!(
        (1.7..2.3).contains(&per_token),
        "{per_token} chars a SmolLM2 token"
    );
    let cjk = Density::new(1.3).unwrap().recode(&text);
    let n = tok.encode(&cjk, false).len() as f64;
    eprintln!(
        "CJK: {} chars a SmolLM2 token",
        cjk.chars().count() as f64 / n
    );
}
