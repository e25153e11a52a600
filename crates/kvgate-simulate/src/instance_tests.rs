//! Timing and cache behaviour of one simulated instance, checked by hand.

use super::*;
use crate::trace::TraceRequest;

fn timing(max_running: usize) -> Timing {
    Timing {
        block_size: 16,
        cache_blocks: 1_000,
        prefill_tokens_per_s: 1_000.0,
        inter_token_latency_s: 0.01,
        max_running,
        max_batched_tokens: 8_192,
    }
}

fn workload(reqs: &[(Vec<u64>, usize, usize)]) -> Workload {
    let trace: Vec<TraceRequest> = reqs
        .iter()
        .map(|(ids, input, output)| TraceRequest {
            timestamp: 0.0,
            input_length: *input,
            output_length: *output,
            hash_ids: ids.clone(),
        })
        .collect();
    Workload::new(&trace, 16)
}

/// Run the instance's steps until it is idle or `until` is reached.
fn run_until(inst: &mut Instance, w: &Workload, rec: &mut Record, until: f64) {
    while inst.step_end().is_some_and(|e| e <= until) {
        inst.finish(w, rec);
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn cold_prefill_then_warm_hit_skips_it() {
    let w = workload(&[(vec![1], 512, 3), (vec![1], 512, 3)]);
    let mut inst = Instance::new(timing(8));
    let mut rec = Record::new(2);
    inst.submit(0, 0.0, 0, &w, &mut rec);
    run_until(&mut inst, &w, &mut rec, f64::INFINITY);
    // 512 tokens at 1,000/s; then two decode steps of 10 ms.
    assert!(close(rec.ttft[0], 0.512), "{}", rec.ttft[0]);
    assert!(close(rec.end, 0.532), "{}", rec.end);
    assert_eq!(rec.cached[0], 0);
    inst.submit(1, 1.0, 0, &w, &mut rec);
    run_until(&mut inst, &w, &mut rec, f64::INFINITY);
    // 31 of 32 blocks hit (the last token is recomputed): 16 tokens, one ITL step.
    assert_eq!(rec.cached[1], 496);
    assert!(close(rec.ttft[1], 0.016), "{}", rec.ttft[1]);
}

#[test]
fn a_full_instance_queues() {
    let w = workload(&[(vec![1], 100, 5), (vec![2], 100, 5)]);
    let mut inst = Instance::new(timing(1));
    let mut rec = Record::new(2);
    inst.submit(0, 0.0, 0, &w, &mut rec);
    inst.submit(1, 0.0, 0, &w, &mut rec);
    assert_eq!(inst.in_flight(), 2);
    run_until(&mut inst, &w, &mut rec, f64::INFINITY);
    // First: 0.1 s prefill + 4 decode steps = 0.14 s; the second waits for it.
    assert!(close(rec.ttft[0], 0.1));
    assert!(close(rec.ttft[1], 0.14 + 0.1), "{}", rec.ttft[1]);
    assert_eq!(inst.in_flight(), 0);
}

#[test]
fn decode_runs_are_cut_at_the_step_after_an_arrival() {
    let w = workload(&[(vec![1], 16, 100), (vec![2], 16, 2)]);
    let mut inst = Instance::new(timing(8));
    let mut rec = Record::new(2);
    inst.submit(0, 0.0, 0, &w, &mut rec);
    inst.finish(&w, &mut rec);
    assert!(close(rec.ttft[0], 0.016));
    // Now decoding: the run of 99 steps of 10 ms is one event...
    assert!(close(inst.step_end().unwrap_or(0.0), 1.006));
    // ...until a request arrives at 0.333 s: the run stops at the next boundary
    // (0.336 s), where the newcomer is admitted; the mixed step of 1 + 16 tokens
    // lasts 17 ms, so its TTFT is 20 ms and the first request ends 7 ms later.
    inst.submit(1, 0.333, 0, &w, &mut rec);
    assert!(close(inst.step_end().unwrap_or(0.0), 0.336));
    run_until(&mut inst, &w, &mut rec, f64::INFINITY);
    assert!(close(rec.ttft[1], 0.020), "{}", rec.ttft[1]);
    assert!(close(rec.end, 1.013), "{}", rec.end);
}

#[test]
fn a_request_no_cache_can_hold_is_rejected() {
    let w = workload(&[(vec![1, 2, 3], 1_500, 20_000)]);
    let mut inst = Instance::new(timing(8));
    let mut rec = Record::new(1);
    inst.submit(0, 0.0, 0, &w, &mut rec);
    assert_eq!(rec.rejected, 1);
    assert!(rec.ttft[0].is_nan());
    assert_eq!(inst.in_flight(), 0);
}

#[test]
fn charges_stay_queued_until_the_first_token_or_a_rejection() {
    let w = workload(&[
        (vec![1], 100, 5),
        (vec![2], 100, 5),
        (vec![3, 4, 5], 1_500, 20_000),
    ]);
    let mut inst = Instance::new(timing(1));
    let mut rec = Record::new(3);
    inst.submit(0, 0.0, 356, &w, &mut rec);
    inst.submit(1, 0.0, 300, &w, &mut rec);
    assert_eq!(inst.queued_prefill(0.0), 656);
    // The first's prefill step ends at 0.1 s: its first token releases its charge.
    inst.finish(&w, &mut rec);
    assert_eq!(inst.queued_prefill(0.1), 300, "no rate yet: nothing drains");
    run_until(&mut inst, &w, &mut rec, f64::INFINITY);
    assert_eq!(inst.queued_prefill(1.0), 0);
    // A request no cache can hold is answered at once: nothing stays queued.
    inst.submit(2, 1.0, 1_000, &w, &mut rec);
    assert_eq!((rec.rejected, inst.queued_prefill(1.0)), (1, 0));
}
