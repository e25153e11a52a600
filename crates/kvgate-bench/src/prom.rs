//! Just enough of the Prometheus text format to read the gateway's `/metrics`:
//! samples with labels, and histograms whose deltas give quantiles.

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of `text`; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `k="v",…}` → labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(tail) = s.strip_prefix('}') {
            return Some((labels, tail));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        let mut chars = s[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in chars {
            if escaped {
                value.push(if c == 'n' { '\n' } else { c });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(eq + 1 + i + 1);
                break;
            } else {
                value.push(c);
            }
        }
        labels.push((key, value));
        s = &s[end?..];
    }
}

/// A histogram's cumulative buckets, sum and count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// (upper bound, cumulative count), ascending, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Histogram {
    /// Histogram `name` in `samples`, summed over all its label sets (empty when
    /// absent).
    pub fn read(samples: &[Sample], name: &str) -> Self {
        let mut h = Histogram::default();
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for s in samples {
            if s.name == bucket {
                let le = s.label("le").and_then(|v| match v {
                    "+Inf" => Some(f64::INFINITY),
                    v => v.parse().ok(),
                });
                if let Some(le) = le {
                    match h.buckets.iter_mut().find(|b| b.0 == le) {
                        Some(b) => b.1 += s.value,
                        None => h.buckets.push((le, s.value)),
                    }
                }
            } else if s.name == sum {
                h.sum += s.value;
            } else if s.name == count {
                h.count += s.value;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
    }

    /// What was recorded between `before` and `self`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|&(le, n)| {
                let old = before
                    .buckets
                    .iter()
                    .find(|b| b.0 == le)
                    .map_or(0.0, |b| b.1);
                (le, n - old)
            })
            .collect();
        Histogram {
            buckets,
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// Two histograms with the same buckets, added.
    pub fn plus(&self, other: &Histogram) -> Histogram {
        let mut out = self.clone();
        for &(le, n) in &other.buckets {
            match out.buckets.iter_mut().find(|b| b.0 == le) {
                Some(b) => b.1 += n,
                None => out.buckets.push((le, n)),
            }
        }
        out.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.sum += other.sum;
        out.count += other.count;
        out
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The `q` quantile, interpolated linearly inside its bucket (the last finite
    /// bound when it falls in `+Inf`).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count;
        let (mut lo, mut below) = (0.0, 0.0);
        for &(le, cum) in &self.buckets {
            if cum >= rank {
                if le.is_infinite() {
                    return Some(lo);
                }
                let width = cum - below;
                let frac = if width > 0.0 {
                    (rank - below) / width
                } else {
                    1.0
                };
                return Some(lo + (le - lo) * frac);
            }
            (lo, below) = (le, cum);
        }
        Some(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE kvgate_routing_decisions_total counter
kvgate_routing_decisions_total{endpoint="w1",upstream="sim-0",outcome="overflow"} 3
kvgate_routing_decisions_total{endpoint="w\"1",upstream="sim-1",outcome="affinity"} 7
h_bucket{le="0.001"} 2
h_bucket{le="0.002"} 6
h_bucket{le="+Inf"} 8
h_sum 0.02
h_count 8
"#;

    #[test]
    fn parses_labels_values_and_histograms() {
        let s = parse(TEXT);
        assert_eq!(s.len(), 7);
        assert_eq!(s[0].label("outcome"), Some("overflow"));
        assert_eq!(s[1].label("endpoint"), Some("w\"1"));
        assert_eq!(s[1].value, 7.0);
        let h = Histogram::read(&s, "h");
        assert_eq!(h.count, 8.0);
        assert_eq!(h.quantile(0.5), Some(0.0015));
        assert_eq!(h.quantile(1.0), Some(0.002));
        let d = h.since(&Histogram {
            buckets: vec![(0.001, 2.0), (0.002, 2.0), (f64::INFINITY, 2.0)],
            sum: 0.004,
            count: 2.0,
        });
        assert_eq!(d.count, 6.0);
        let q = d.quantile(0.5).unwrap_or(0.0);
        assert!((q - 0.001_75).abs() < 1e-12, "{q}");
    }
}
