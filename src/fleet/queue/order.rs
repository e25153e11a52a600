//! Who goes next: priority first, then the backlogged tenant that has
//! received the least service, then first come, first served within that
//! tenant. Pure bookkeeping, no clocks or channels, so the order is tested
//! on its own.
//!
//! Service is the Virtual Token Counter of Sheng et al. ("Fairness in
//! Serving Large Language Models", OSDI 2024): each tenant's counter grows by
//! `input_weight·input + output_weight·output` tokens ÷ its weight as it is
//! served, and the least-served backlogged tenant goes next. A tenant that
//! was idle rejoins at the least counter among those backlogged in its class
//! (the paper's counter lift), or, with nobody waiting there, at the counter
//! of the last request served, so idleness banks no credit to burst with
//! later. A request served at once (nobody waiting) moves that mark too.
//! Under contention any two backlogged tenants' counters then stay within a
//! bound of about `2·max(weighted cost of one request)` of each other.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::tenancy::priority::Priority;

/// One tenant's waiting requests and its counter.
#[derive(Debug)]
struct Tenant<W> {
    /// Weighted service ÷ the tenant's weight: this replica's and, with
    /// replicas sharing (`fleet::peers`), the others'.
    service: f64,
    /// What this replica alone has counted of it, ever (shared with the others).
    own: f64,
    /// Waiting requests by priority (index: [`slot`]), oldest first.
    waiting: [VecDeque<(u64, W)>; 3],
}

impl<W> Default for Tenant<W> {
    fn default() -> Self {
        Self {
            service: 0.0,
            own: 0.0,
            waiting: Default::default(),
        }
    }
}

impl<W> Tenant<W> {
    fn backlogged(&self) -> bool {
        self.waiting.iter().any(|q| !q.is_empty())
    }
}

fn slot(p: Priority) -> usize {
    match p {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

/// The waiting requests (`W`: whatever wakes one) and every tenant's counter.
#[derive(Debug)]
pub struct Order<W> {
    tenants: HashMap<Arc<str>, Tenant<W>>,
    next_id: u64,
    len: usize,
    /// The counter of the tenant served last: where a tenant rejoins when
    /// nobody is backlogged.
    floor: f64,
}

impl<W> Default for Order<W> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            next_id: 0,
            len: 0,
            floor: 0.0,
        }
    }
}

impl<W> Order<W> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waiting requests of `tenant` at `priority`.
    pub fn waiting(&self, tenant: &str, priority: Priority) -> usize {
        self.tenants
            .get(tenant)
            .map_or(0, |t| t.waiting[slot(priority)].len())
    }

    /// Queue a request; its id, for [`Order::remove`].
    pub fn push(&mut self, tenant: &str, priority: Priority, waiter: W) -> u64 {
        let lift = self.least_backlogged(slot(priority)).unwrap_or(self.floor);
        let t = self.tenants.entry(Arc::from(tenant)).or_default();
        if !t.backlogged() {
            t.service = t.service.max(lift);
        }
        let id = self.next_id;
        self.next_id += 1;
        t.waiting[slot(priority)].push_back((id, waiter));
        self.len += 1;
        id
    }

    /// The least counter among tenants waiting in class slot `s`.
    fn least_backlogged(&self, s: usize) -> Option<f64> {
        self.tenants
            .values()
            .filter(|t| !t.waiting[s].is_empty())
            .map(|t| t.service)
            .min_by(f64::total_cmp)
    }

    /// The next request to release, and whose it is.
    pub fn pop(&mut self) -> Option<(Arc<str>, Priority, W)> {
        for p in Priority::ALL {
            let s = slot(p);
            let next = self
                .tenants
                .iter()
                .filter(|(_, t)| !t.waiting[s].is_empty())
                .min_by(|a, b| {
                    a.1.service
                        .total_cmp(&b.1.service)
                        .then_with(|| a.0.cmp(b.0))
                })
                .map(|(name, _)| Arc::clone(name));
            if let Some(name) = next {
                let t = self.tenants.get_mut(&name)?;
                let (_, w) = t.waiting[s].pop_front()?;
                self.len -= 1;
                self.floor = self.floor.max(t.service);
                return Some((name, p, w));
            }
        }
        None
    }

    /// Take a request out (its client left, or its wait ran out); `None`
    /// when it was released already.
    pub fn remove(&mut self, tenant: &str, priority: Priority, id: u64) -> Option<W> {
        let q = &mut self.tenants.get_mut(tenant)?.waiting[slot(priority)];
        let at = q.iter().position(|(i, _)| *i == id)?;
        self.len -= 1;
        q.remove(at).map(|(_, w)| w)
    }

    /// Count service to `tenant`: `weighted` tokens at weight `weight`.
    pub fn charge(&mut self, tenant: &str, weighted: f64, weight: f64) {
        let served = weighted / weight.max(1e-9);
        let t = self.at_mark(tenant);
        t.service += served;
        t.own += served;
    }

    /// `tenant`'s entry; one first seen now starts at the mark of the last
    /// request served.
    fn at_mark(&mut self, tenant: &str) -> &mut Tenant<W> {
        let lift = self.floor;
        self.tenants
            .entry(Arc::from(tenant))
            .or_insert_with(|| Tenant {
                service: lift,
                ..Tenant::default()
            })
    }

    /// Service the other replicas gave `tenant` (already ÷ its weight) since
    /// the last round: it counts here as if served here, but is not this
    /// replica's to share.
    pub fn peer_served(&mut self, tenant: &str, served: f64) {
        self.at_mark(tenant).service += served;
    }

    /// Every tenant's service as this replica alone counted it.
    pub fn own_service(&self) -> Vec<(String, f64)> {
        self.tenants
            .iter()
            .filter(|(_, t)| t.own > 0.0)
            .map(|(name, t)| (name.to_string(), t.own))
            .collect()
    }

    /// Count service to a request served at once, nobody waiting: the
    /// tenant rejoins as [`Order::push`] would have it, and is the last served.
    pub fn served_at_once(&mut self, tenant: &str, weighted: f64, weight: f64) {
        let floor = self.floor;
        let t = self.tenants.entry(Arc::from(tenant)).or_default();
        if !t.backlogged() {
            t.service = t.service.max(floor);
        }
        let before = t.service;
        let served = weighted / weight.max(1e-9);
        t.service += served;
        t.own += served;
        self.floor = self.floor.max(before);
    }

    /// Every waiting request, for a shutdown that refuses them.
    pub fn drain(&mut self) -> Vec<W> {
        self.len = 0;
        self.tenants
            .values_mut()
            .flat_map(|t| {
                t.waiting
                    .iter_mut()
                    .flat_map(|q| q.drain(..).map(|(_, w)| w))
            })
            .collect()
    }

    /// A tenant's counter (tests, metrics).
    pub fn service(&self, tenant: &str) -> f64 {
        self.tenants.get(tenant).map_or(0.0, |t| t.service)
    }

    /// Every tenant's counter and waiting requests (the console).
    pub fn tenants(&self) -> Vec<(Arc<str>, f64, usize)> {
        self.tenants
            .iter()
            .map(|(id, t)| {
                let waiting = t.waiting.iter().map(|q| q.len()).sum();
                (Arc::clone(id), t.service, waiting)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(o: &mut Order<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| o.pop().map(|(_, _, w)| w)).collect()
    }

    #[test]
    fn priority_first_then_least_service_then_fifo() {
        let mut o = Order::default();
        o.charge("big", 1000.0, 1.0);
        o.push("big", Priority::Normal, "big1");
        o.push("big", Priority::Normal, "big2");
        o.push("small", Priority::Normal, "small1");
        o.push("small", Priority::Normal, "small2");
        o.push("vip", Priority::High, "vip1");
        o.push("small", Priority::Low, "small-low");
        // small rejoined at big's counter (the lift), so they tie; the name breaks it.
        assert_eq!(o.service("small"), 1000.0);
        let first = o.pop().map(|(_, _, w)| w);
        assert_eq!(first, Some("vip1"));
        o.charge("big", 10.0, 1.0);
        assert_eq!(
            order(&mut o),
            ["small1", "small2", "big1", "big2", "small-low"]
        );
    }

    #[test]
    fn the_least_served_goes_until_it_catches_up() {
        let mut o = Order::default();
        for i in 0..4 {
            o.push("a", Priority::Normal, ["a0", "a1", "a2", "a3"][i]);
            o.push("b", Priority::Normal, ["b0", "b1", "b2", "b3"][i]);
        }
        let mut got = Vec::new();
        while let Some((t, _, w)) = o.pop() {
            got.push(w);
            // a's requests cost twice b's.
            o.charge(&t, if &*t == "a" { 200.0 } else { 100.0 }, 1.0);
        }
        assert_eq!(got, ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "a3"]);
        // A weight of 2 halves what the same service counts.
        let before = o.service("b");
        o.charge("b", 100.0, 2.0);
        assert_eq!(o.service("b"), before + 50.0);
    }

    #[test]
    fn lifts_stay_within_a_class_and_at_once_service_moves_the_mark() {
        let mut o = Order::default();
        // An hour served at once: the mark moves with it.
        for _ in 0..100 {
            o.served_at_once("a", 1000.0, 1.0);
        }
        o.push("b", Priority::Normal, "b1");
        assert!(
            o.service("b") >= 98_000.0,
            "b banked credit: {}",
            o.service("b")
        );
        // A starved low-class tenant does not drag a normal one's lift down.
        let mut o = Order::default();
        o.push("low", Priority::Low, "l1");
        o.charge("n1", 1e6, 1.0);
        o.push("n1", Priority::Normal, "n1");
        o.push("n2", Priority::Normal, "n2");
        assert_eq!(o.service("n2"), 1e6);
    }

    #[test]
    fn service_other_replicas_gave_orders_tenants_here_but_is_not_shared_again() {
        let mut o = Order::default();
        o.charge("flood", 100.0, 1.0);
        o.charge("steady", 100.0, 1.0);
        o.push("flood", Priority::Normal, "f");
        o.push("steady", Priority::Normal, "s");
        // Both backlogged; the flood was served 900 more at the other replicas.
        o.peer_served("flood", 900.0);
        assert_eq!(order(&mut o), ["s", "f"], "the fleet's service decides");
        assert_eq!(o.service("flood"), 1000.0);
        let mut own = o.own_service();
        own.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            own,
            [("flood".to_owned(), 100.0), ("steady".to_owned(), 100.0)],
            "what the others counted is theirs to share"
        );
        // A tenant first seen through the others rejoins at the mark, not at 0.
        o.peer_served("new", 5.0);
        assert_eq!(o.service("new"), 1005.0);
    }

    #[test]
    fn removal_and_drain() {
        let mut o = Order::default();
        let id = o.push("a", Priority::Low, 1);
        o.push("a", Priority::Low, 2);
        assert_eq!(o.remove("a", Priority::Low, id), Some(1));
        assert_eq!(o.remove("a", Priority::Low, id), None);
        assert_eq!(o.len(), 1);
        assert_eq!(o.drain(), [2]);
        assert!(o.is_empty());
    }
}
