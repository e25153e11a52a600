//! Strategies that ignore the prompt: random, round robin, least outstanding
//! requests. Each leads with its choice and keeps the others as failover.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Load, Plan, Policy, Reason, Request, available_first, lead_with};

fn plan_with(first: Option<usize>, loads: &[Load]) -> Plan {
    let mut order: Vec<usize> = (0..loads.len()).collect();
    available_first(&mut order, loads);
    let reason = match first {
        Some(i) => {
            lead_with(&mut order, i);
            Reason::Balance
        }
        None => Reason::LastResort,
    };
    Plan { order, reason }
}

fn available(loads: &[Load]) -> impl Iterator<Item = usize> + '_ {
    loads
        .iter()
        .enumerate()
        .filter(|(_, l)| l.available)
        .map(|(i, _)| i)
}

/// Uniformly random among available instances (SageMaker's RANDOM).
#[derive(Debug, Default)]
pub struct Random;

impl Policy for Random {
    fn plan(&self, _request: &Request, loads: &[Load]) -> Plan {
        let up: Vec<usize> = available(loads).collect();
        let first = (!up.is_empty()).then(|| up[rand::random_range(0..up.len())]);
        plan_with(first, loads)
    }
}

/// Each available instance in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn plan(&self, _request: &Request, loads: &[Load]) -> Plan {
        let up: Vec<usize> = available(loads).collect();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let first = (!up.is_empty()).then(|| up[n % up.len()]);
        plan_with(first, loads)
    }
}

/// Fewest in-flight requests; ties go to a random one of the tied so that
/// bursts don't all land on the lowest index (SageMaker's LEAST_OUTSTANDING_REQUESTS).
#[derive(Debug, Default)]
pub struct LeastOutstanding;

impl Policy for LeastOutstanding {
    fn plan(&self, _request: &Request, loads: &[Load]) -> Plan {
        let min = available(loads).map(|i| loads[i].in_flight).min();
        let tied: Vec<usize> = available(loads)
            .filter(|&i| Some(loads[i].in_flight) == min)
            .collect();
        let first = (!tied.is_empty()).then(|| tied[rand::random_range(0..tied.len())]);
        plan_with(first, loads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(in_flight: &[usize]) -> Vec<Load> {
        in_flight
            .iter()
            .map(|&n| Load {
                in_flight: n,
                available: true,
                ..Load::default()
            })
            .collect()
    }

    #[test]
    fn round_robin_cycles() {
        let rr = RoundRobin::default();
        let firsts: Vec<usize> = (0..6)
            .map(|_| rr.plan(&Request::with_key(0), &loads(&[0, 0, 0])).order[0])
            .collect();
        assert_eq!(firsts, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_outstanding_picks_min() {
        let plan = LeastOutstanding.plan(&Request::with_key(0), &loads(&[3, 1, 2]));
        assert_eq!(plan.order[0], 1);
        assert_eq!(plan.order.len(), 3);
    }

    #[test]
    fn random_skips_unavailable() {
        let mut l = loads(&[0, 0]);
        l[0].available = false;
        for _ in 0..50 {
            assert_eq!(Random.plan(&Request::with_key(0), &l).order, vec![1, 0]);
        }
    }
}
