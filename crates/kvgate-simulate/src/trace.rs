//! Mooncake trace files: one JSON request per line (`timestamp` in ms,
//! `input_length` and `output_length` in tokens, `hash_ids` naming the prompt's
//! 512-token blocks, equal ids meaning an equal prefix up to and including that
//! block), and the trace's hit-rate ceiling under an infinite cache.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

/// Tokens per Mooncake `hash_ids` block.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// One line of a trace. Unknown fields are ignored: other Mooncake traces carry more.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRequest {
    /// Arrival, in milliseconds from the trace's start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: usize,
    /// Generated tokens.
    pub output_length: usize,
    /// One id per 512-token prompt block; equal ids are a reusable prefix.
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    // Fields named `error`, not `source`: the message already carries the cause,
    // and anyhow's `{:#}` would print it twice.
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("line {line}: {error}")]
    Json {
        line: usize,
        error: serde_json::Error,
    },
    #[error("line {line}: timestamp {value} is not a finite, non-negative number of ms")]
    Timestamp { line: usize, value: f64 },
    #[error("the trace holds no requests")]
    Empty,
}

/// Parse a whole trace; blank lines are skipped. Requests come back in arrival
/// order (stable, so equal timestamps keep the file's order).
pub fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = parse_lines(text)?;
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    out.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    Ok(out)
}

/// The trace's requests in the file's order, blank lines skipped; a trace
/// with none is no error here.
pub fn parse_lines(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let req: TraceRequest =
            serde_json::from_str(line).map_err(|error| TraceError::Json { line: i + 1, error })?;
        if !(req.timestamp.is_finite() && req.timestamp >= 0.0) {
            return Err(TraceError::Timestamp {
                line: i + 1,
                value: req.timestamp,
            });
        }
        out.push(req);
    }
    Ok(out)
}

/// Read and parse a trace file.
pub fn load(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|error| TraceError::Io {
        path: path.display().to_string(),
        error,
    })?;
    parse(&text)
}

/// Fraction of the trace's blocks that an infinite cache shared by every request
/// would have seen before (Mooncake's "reusable" share: papers.md gives 36.6% for
/// the conversation trace and 64.0% for the synthetic one).
pub fn block_ceiling(trace: &[TraceRequest]) -> f64 {
    let mut seen = HashSet::new();
    let (mut total, mut reused) = (0usize, 0usize);
    for req in trace {
        for &id in &req.hash_ids {
            total += 1;
            if !seen.insert(id) {
                reused += 1;
            }
        }
    }
    ratio(reused, total)
}

/// `num / den`, 0 for an empty denominator.
pub fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_skips_blanks_sorts_by_arrival() {
        let text = r#"{"timestamp": 40, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]}

{"timestamp": 0, "input_length": 512, "output_length": 10, "hash_ids": [0], "extra": 1}
"#;
        let t = parse(text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].timestamp, 0.0);
        assert_eq!(t[0].hash_ids, vec![0]);
        assert_eq!((t[1].input_length, t[1].output_length), (600, 3));
        let lines = parse_lines(text).unwrap();
        assert_eq!(lines[0].timestamp, 40.0, "the file's order");
        assert_eq!(lines[1], t[0]);
        assert!(parse_lines("\n\n").unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_line() {
        let text = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n{oops";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(matches!(parse("\n\n"), Err(TraceError::Empty)));
        let neg =
            "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}";
        assert!(matches!(
            parse(neg),
            Err(TraceError::Timestamp { line: 1, .. })
        ));
    }

    #[test]
    fn block_ceiling_counts_blocks_seen_before() {
        // 3 + 3 + 2 = 8 blocks; reused: [0, 1] in the second, [0] in the third = 3.
        let t = [vec![0, 1, 2], vec![0, 1, 3], vec![0, 4]].map(|hash_ids| TraceRequest {
            timestamp: 0.0,
            input_length: 512 * hash_ids.len(),
            output_length: 1,
            hash_ids,
        });
        assert!((block_ceiling(&t) - 3.0 / 8.0).abs() < 1e-12);
    }
}
