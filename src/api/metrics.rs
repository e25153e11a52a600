//! `/metrics`: the recorder's Prometheus text, less the series of instances
//! the running config no longer has. The `metrics` recorder cannot forget a
//! series (its only removal is an idle timeout, which would also drop a live
//! gauge that holds still, such as `kvgate_instance_healthy`), so a reload
//! that removes an instance hides every series labelled with it here: its
//! gauges no longer claim it is healthy or busy, and nothing it did lingers.
//! Its samples stay in memory, bounded by the instances ever configured; an
//! instance a reload brings back shows its counters where they were.

use std::collections::HashSet;

/// The label naming an instance in every per-instance series.
pub const INSTANCE_LABEL: &str = "upstream";
const ENDPOINT_LABEL: &str = "endpoint";

/// `text` without the sample lines whose (endpoint, instance) is not in `live`.
pub fn without_removed(text: &str, live: &HashSet<(&str, &str)>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let keep = line.starts_with('#')
            || match series_of(line) {
                Some((endpoint, instance)) => {
                    live.contains(&(endpoint.as_str(), instance.as_str()))
                }
                None => true,
            };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The endpoint and instance labels of a sample line, when it has both.
fn series_of(line: &str) -> Option<(String, String)> {
    let (_, rest) = line.split_once('{')?;
    let (mut endpoint, mut instance) = (None, None);
    for (name, value) in labels(rest) {
        match name {
            ENDPOINT_LABEL => endpoint = Some(value),
            INSTANCE_LABEL => instance = Some(value),
            _ => {}
        }
    }
    Some((endpoint?, instance?))
}

/// `name="value"` pairs up to the closing `}`, values unescaped (`\\`, `\"`, `\n`).
fn labels(mut rest: &str) -> Vec<(&str, String)> {
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start_matches(',');
        let Some((name, after)) = rest.split_once("=\"") else {
            return out;
        };
        if name.contains('}') {
            return out;
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    end = Some(i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(end) = end else {
            return out;
        };
        out.push((name.trim(), value));
        rest = &after[end..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_live_and_unlabelled_series_only() {
        let text = "# HELP x X\n# TYPE x gauge\n\
            x{endpoint=\"chat\",upstream=\"http://a\"} 1\n\
            x{endpoint=\"chat\",upstream=\"http://gone\"} 1\n\
            y_bucket{endpoint=\"chat\",upstream=\"http://gone\",le=\"0.5\"} 3\n\
            z{endpoint=\"chat\",api=\"chat\",status=\"2xx\"} 4\n\
            w 2\n\
            q{endpoint=\"c\\\"h\",upstream=\"a\\\\b\"} 5\n";
        let live: HashSet<(&str, &str)> = [("chat", "http://a"), ("c\"h", "a\\b")].into();
        let out = without_removed(text, &live);
        assert_eq!(
            out,
            "# HELP x X\n# TYPE x gauge\n\
             x{endpoint=\"chat\",upstream=\"http://a\"} 1\n\
             z{endpoint=\"chat\",api=\"chat\",status=\"2xx\"} 4\n\
             w 2\n\
             q{endpoint=\"c\\\"h\",upstream=\"a\\\\b\"} 5\n"
        );
    }
}
