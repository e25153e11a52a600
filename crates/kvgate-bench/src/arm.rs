//! What a run compares: one of the gateway's six strategies, plus `prefix_aware`
//! with its balance factor switched off, to show what bounded loads cost in hits.

use kvgate_routing::Strategy;

use crate::workload::Routing;

/// One compared configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    Random,
    RoundRobin,
    LeastOutstanding,
    /// `prefix_aware` with the workload's routing settings.
    PrefixAware,
    /// `prefix_aware` with the same settings but no balance factor: plain
    /// consistent hashing up to `concurrency_threshold`.
    PrefixAwareUnbounded,
    /// `longest_prefix`: the longest prefix each instance holds (by the gateway's
    /// own block index, sized to the instances' KV cache), weighed against the
    /// prefill queued there; on its own defaults (concurrency_threshold 256,
    /// balance_factor 1.5) but for `cache_tokens`.
    LongestPrefix,
    /// `kv_aware`: `longest_prefix`'s placement on what each instance's KV
    /// events say it holds, by real token ids. Its instances tokenize with
    /// SmolLM2's tokenizer and publish events; every other arm's count 4-byte
    /// chunks and publish nothing.
    KvAware,
    /// `prefix_aware` on `kv_aware`'s instances (tokenizing with SmolLM2, their
    /// KV and prefill scaled the same way, publishing nothing): the baseline
    /// the matrix judges `kv_aware` against, so that both face the same
    /// engines and the scaling's approximation does not enter the verdict.
    PrefixAwareOnTokens,
}

impl Arm {
    /// Every arm, the `random` baseline first.
    pub const ALL: [Arm; 7] = [
        Arm::Random,
        Arm::RoundRobin,
        Arm::LeastOutstanding,
        Arm::PrefixAware,
        Arm::PrefixAwareUnbounded,
        Arm::LongestPrefix,
        Arm::KvAware,
    ];

    pub fn strategy(self) -> Strategy {
        match self {
            Arm::Random => Strategy::Random,
            Arm::RoundRobin => Strategy::RoundRobin,
            Arm::LeastOutstanding => Strategy::LeastOutstandingRequests,
            Arm::PrefixAware | Arm::PrefixAwareUnbounded | Arm::PrefixAwareOnTokens => {
                Strategy::PrefixAware
            }
            Arm::LongestPrefix => Strategy::LongestPrefix,
            Arm::KvAware => Strategy::KvAware,
        }
    }

    /// Whether its gateway routes on KV events (its instances publish them).
    pub fn uses_events(self) -> bool {
        self.strategy().uses_events()
    }

    /// Whether its instances tokenize for real (SmolLM2) and count those
    /// tokens: `kv_aware`'s, and its same-engine baseline's.
    pub fn tokenizing(self) -> bool {
        self.uses_events() || self == Arm::PrefixAwareOnTokens
    }

    /// The arm the matrix judges this one against: `prefix_aware` on the same
    /// kind of instances, when it ran in `ran`.
    pub fn baseline(self, ran: &[Arm]) -> Arm {
        if self.tokenizing() && ran.contains(&Arm::PrefixAwareOnTokens) {
            Arm::PrefixAwareOnTokens
        } else {
            Arm::PrefixAware
        }
    }

    /// Whether the gateway runs on its cache-aware defaults (threshold,
    /// balance factor) with `cache_tokens` sized to the instances.
    pub fn cache_aware_defaults(self) -> bool {
        self.strategy().uses_index()
    }

    /// Its name in reports, endpoint names and `--strategies`.
    pub fn label(self) -> &'static str {
        match self {
            Arm::PrefixAwareUnbounded => "prefix_aware_unbounded",
            Arm::PrefixAwareOnTokens => "prefix_aware_tokens",
            other => other.strategy().as_str(),
        }
    }

    pub fn parse(name: &str) -> Option<Arm> {
        Arm::ALL
            .into_iter()
            .chain([Arm::PrefixAwareOnTokens])
            .find(|a| a.label() == name)
            .or_else(|| {
                Strategy::parse(name).and_then(|s| Arm::ALL.into_iter().find(|a| a.strategy() == s))
            })
    }

    /// The gateway's routing settings for this arm, from the workload's.
    pub fn routing(self, base: Routing) -> Routing {
        match self {
            Arm::PrefixAwareUnbounded | Arm::LongestPrefix | Arm::KvAware => Routing {
                balance_factor: None,
                ..base
            },
            _ => base,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_back() {
        for arm in Arm::ALL {
            assert_eq!(Arm::parse(arm.label()), Some(arm));
        }
        assert_eq!(Arm::parse("PREFIX_AWARE"), Some(Arm::PrefixAware));
        assert_eq!(Arm::parse("longest_prefix"), Some(Arm::LongestPrefix));
        assert_eq!(Arm::parse("kv_aware"), Some(Arm::KvAware));
        assert!(Arm::KvAware.uses_events() && !Arm::LongestPrefix.uses_events());
        assert_eq!(
            Arm::parse("prefix_aware_tokens"),
            Some(Arm::PrefixAwareOnTokens)
        );
        let on = Arm::PrefixAwareOnTokens;
        assert!(on.tokenizing() && !on.uses_events());
        assert_eq!(Arm::KvAware.baseline(&[Arm::PrefixAware, on]), on);
        assert_eq!(Arm::KvAware.baseline(&[Arm::PrefixAware]), Arm::PrefixAware);
        assert_eq!(
            Arm::LongestPrefix.baseline(&[Arm::PrefixAware, on]),
            Arm::PrefixAware
        );
        assert_eq!(Arm::parse("nope"), None);
    }
}
