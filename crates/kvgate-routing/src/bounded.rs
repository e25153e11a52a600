//! Prefix-aware placement: consistent hashing with bounded loads.
//!
//! The key's ring walk gives the preference order. An instance is *full* when
//! its in-flight count has reached `concurrency_threshold` (SageMaker's
//! ConcurrencyThreshold) or, with a balance factor c, when it holds
//! ⌈c·(m+1)/n⌉ requests already, m being the total in flight over n available
//! instances (Mirrokni, Thorup, Zadimoghaddam, SODA 2018). The first available
//! instance that is not full leads; when all are full, the least loaded does.

use super::{Load, Plan, Policy, Reason, Request, Ring, balance_cap, lead_with, ring_order};

#[derive(Debug, Clone)]
pub struct PrefixAware {
    ring: Ring,
    threshold: usize,
    balance_factor: Option<f64>,
}

impl PrefixAware {
    pub fn new(ring: Ring, threshold: usize, balance_factor: Option<f64>) -> Self {
        Self {
            ring,
            threshold: threshold.max(1),
            balance_factor,
        }
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }
}

impl Policy for PrefixAware {
    fn plan(&self, request: &Request, loads: &[Load]) -> Plan {
        let mut order = ring_order(&self.ring, request.key, loads);
        let Some(&head) = order.first() else {
            return Plan {
                order,
                reason: Reason::LastResort,
            };
        };
        if !loads[head].available {
            return Plan {
                order,
                reason: Reason::LastResort,
            };
        }
        let limit = balance_cap(self.balance_factor, loads)
            .map_or(self.threshold, |cap| cap.min(self.threshold));
        let fits = |i: usize| loads[i].available && loads[i].in_flight < limit;
        if let Some(pos) = order.iter().position(|&i| fits(i)) {
            let chosen = order[pos];
            lead_with(&mut order, chosen);
            let reason = if pos == 0 {
                Reason::Affinity
            } else {
                Reason::Overflow
            };
            return Plan { order, reason };
        }
        // All full: least loaded available instance, ties broken by ring order.
        let least = order
            .iter()
            .copied()
            .filter(|&i| loads[i].available)
            .min_by_key(|&i| loads[i].in_flight)
            .unwrap_or(head);
        lead_with(&mut order, least);
        Plan {
            order,
            reason: Reason::Fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(n: usize, threshold: usize, c: Option<f64>) -> PrefixAware {
        let ids: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
        PrefixAware::new(Ring::new(&ids, 64), threshold, c)
    }

    fn idle(n: usize) -> Vec<Load> {
        vec![
            Load {
                in_flight: 0,
                available: true,
                ..Load::default()
            };
            n
        ]
    }

    #[test]
    fn idle_fleet_gives_ring_order_with_affinity() {
        let p = policy(5, 4, None);
        let plan = p.plan(&Request::with_key(99), &idle(5));
        assert_eq!(plan.reason, Reason::Affinity);
        assert_eq!(plan.order, p.ring().walk(99).collect::<Vec<_>>());
    }

    #[test]
    fn full_primary_overflows_to_ring_successor() {
        let p = policy(5, 4, None);
        let ring_order: Vec<usize> = p.ring().walk(99).collect();
        let mut loads = idle(5);
        loads[ring_order[0]].in_flight = 4;
        let plan = p.plan(&Request::with_key(99), &loads);
        assert_eq!(plan.reason, Reason::Overflow);
        assert_eq!(plan.order[0], ring_order[1]);
        assert_eq!(plan.order.len(), 5);
    }

    #[test]
    fn all_full_picks_least_loaded() {
        let p = policy(3, 2, None);
        let loads = vec![
            Load {
                in_flight: 5,
                available: true,
                ..Load::default()
            },
            Load {
                in_flight: 2,
                available: true,
                ..Load::default()
            },
            Load {
                in_flight: 3,
                available: true,
                ..Load::default()
            },
        ];
        let plan = p.plan(&Request::with_key(7), &loads);
        assert_eq!(plan.reason, Reason::Fallback);
        assert_eq!(plan.order[0], 1);
    }

    #[test]
    fn unavailable_primary_is_skipped_and_put_last() {
        let p = policy(4, 8, None);
        let ring_order: Vec<usize> = p.ring().walk(5).collect();
        let mut loads = idle(4);
        loads[ring_order[0]].available = false;
        let plan = p.plan(&Request::with_key(5), &loads);
        assert_eq!(plan.reason, Reason::Affinity);
        assert_eq!(plan.order[0], ring_order[1]);
        assert_eq!(*plan.order.last().unwrap_or(&usize::MAX), ring_order[0]);
    }

    #[test]
    fn nothing_available_is_last_resort() {
        let p = policy(2, 8, None);
        let loads = vec![
            Load {
                in_flight: 0,
                available: false,
                ..Load::default()
            };
            2
        ];
        assert_eq!(
            p.plan(&Request::with_key(1), &loads).reason,
            Reason::LastResort
        );
    }

    #[test]
    fn balance_factor_caps_below_threshold() {
        // 4 instances, 3 in flight on the primary, none elsewhere:
        // cap = ceil(1.25 * 4 / 4) = 2, so the primary is full at 3 though the threshold is 100.
        let p = policy(4, 100, Some(1.25));
        let ring_order: Vec<usize> = p.ring().walk(11).collect();
        let mut loads = idle(4);
        loads[ring_order[0]].in_flight = 3;
        let plan = p.plan(&Request::with_key(11), &loads);
        assert_eq!(plan.reason, Reason::Overflow);
        assert_ne!(plan.order[0], ring_order[0]);
    }
}
