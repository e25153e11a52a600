//! The benchmark's quick mode, every workload under every arm (`longest_prefix`
//! included), end to end through the real gateway, so it cannot rot; and one
//! workload with `--cache-scale`. Sanity only: the figures of a run this small
//! mean nothing and are not asserted.

use std::path::PathBuf;

use kvgate_bench::report::{self, Context};
use kvgate_bench::{Arm, Kind, bench, chart};

fn traces() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_of_every_workload_completes_with_sane_numbers() {
    let mut results = Vec::new();
    for kind in Kind::ALL {
        let setup = kind.setup(true, 1, &traces()).unwrap();
        assert!(setup.requests() > 0, "{}: no requests", setup.id);
        let one_prefill = setup.sim.max_partial_prefills == Some(1);
        assert_eq!(one_prefill, kind == Kind::HotDocument, "{}", setup.id);
        let w = bench(&setup, &Arm::ALL, "quicktest", |line| eprintln!("{line}"))
            .await
            .unwrap();
        assert!(
            (0.0..=1.0).contains(&w.ceiling),
            "{}: ceiling {}",
            w.setup_id,
            w.ceiling
        );
        assert!(
            w.ceiling > 0.0,
            "{}: the workload reuses nothing",
            w.setup_id
        );
        assert_eq!(w.runs.len(), Arm::ALL.len());
        for r in &w.runs {
            let what = format!("{} {}", w.setup_id, r.arm.label());
            assert_eq!(r.failed, 0, "{what}: {:?}", r.first_error);
            assert_eq!(r.requests, setup.requests(), "{what}");
            assert!(
                (0.0..=1.0).contains(&r.hit_rate),
                "{what}: hit {}",
                r.hit_rate
            );
            assert!(r.prompt_tokens > 0, "{what}");
            // The instances' counters and the clients' `usage` agree.
            assert_eq!(r.cached_tokens, r.usage_cached_tokens, "{what}");
            assert!(r.ttft_p50 > 0.0 && r.ttft_p50 <= r.ttft_p90, "{what}");
            assert!(
                r.requests_per_s > 0.0 && r.output_tokens_per_s > 0.0,
                "{what}"
            );
            assert_eq!(r.shares.len(), setup.instances, "{what}");
            let total: f64 = r.shares.iter().sum();
            assert!((total - 1.0).abs() < 1e-9, "{what}: shares sum to {total}");
            let decided: u64 = r.decisions.iter().map(|(_, n)| n).sum();
            assert!(decided >= r.requests as u64, "{what}: {decided} decisions");
            assert!(r.routing_mean.is_some_and(|m| m > 0.0 && m < 0.1), "{what}");
        }
        results.push(w);
    }
    let ctx = Context {
        command: "test".to_owned(),
        date: "today".to_owned(),
        machine: "test".to_owned(),
    };
    let md = report::markdown(&ctx, &results);
    let svg = chart::svg(&results, "test");
    for kind in Kind::ALL {
        assert!(md.contains(&format!("## {}\n", kind.id())), "{md}");
    }
    assert_eq!(
        md.matches("`longest_prefix` against `prefix_aware`")
            .count(),
        Kind::ALL.len(),
        "{md}"
    );
    assert_eq!(
        md.matches("`longest_prefix` against `random`").count(),
        Kind::ALL.len(),
        "{md}"
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.matches("<rect").count() > 4 * Arm::ALL.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_scale_reaches_the_instances_the_gateway_and_the_report() {
    let mut setup = Kind::LongContext.setup(true, 1, &traces()).unwrap();
    let blocks = setup.sim.cache_blocks;
    setup.scale_cache(2.0);
    let arms = [Arm::Random, Arm::LongestPrefix];
    let w = bench(&setup, &arms, "quickscale", |line| eprintln!("{line}"))
        .await
        .unwrap();
    assert_eq!(w.cache_blocks, 2 * blocks);
    assert_eq!(w.title(), "long-context (2× cache)");
    for r in &w.runs {
        assert_eq!(r.failed, 0, "{}: {:?}", r.arm.label(), r.first_error);
    }
    let ctx = Context {
        command: "test".to_owned(),
        date: "today".to_owned(),
        machine: "test".to_owned(),
    };
    let md = report::markdown(&ctx, &[w]);
    assert!(md.contains("## long-context (2× cache)\n"), "{md}");
    let tokens = format!(
        "{} tokens an instance (2× the workload's own)",
        2 * blocks * 16
    );
    assert!(md.contains(&tokens), "{md}");
    assert!(
        md.contains(&format!("cache_tokens {}", 2 * blocks * 16)),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_behind_two_gateway_replicas_completes_and_counts_real_tokens() {
    let mut setup = Kind::MultiTurn.setup(true, 1, &traces()).unwrap();
    setup.gateways = 2;
    let arms = [Arm::LongestPrefix, Arm::KvAware];
    let w = bench(&setup, &arms, "quickreplicas", |line| eprintln!("{line}"))
        .await
        .unwrap();
    assert_eq!(w.gateways, 2);
    let token_ceiling = w.token_ceiling.unwrap();
    assert!((0.0..=1.0).contains(&token_ceiling) && token_ceiling > 0.0);
    let (l, k) = (w.run(arms[0]).unwrap(), w.run(arms[1]).unwrap());
    for r in [l, k] {
        assert_eq!(r.failed, 0, "{}: {:?}", r.arm.label(), r.first_error);
        assert_eq!(r.requests, setup.requests());
        // Probes sent before the run are not counted.
        assert_eq!(r.cached_tokens, r.usage_cached_tokens, "{}", r.arm.label());
        let total: f64 = r.shares.iter().sum();
        assert!((total - 1.0).abs() < 1e-9);
    }
    // Its instances counted SmolLM2 tokens, not 4-byte chunks.
    assert_ne!(k.prompt_tokens, l.prompt_tokens);
    assert!(
        k.decisions_of("cache_hit") + k.decisions_of("cache_spread") > 0,
        "{:?}",
        k.decisions
    );
    let ctx = Context {
        command: "test".to_owned(),
        date: "today".to_owned(),
        machine: "test".to_owned(),
    };
    let md = report::replicas::markdown(&ctx, &[w]);
    assert!(md.contains("| kv_aware | 2 |"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_matrix_slice_runs_closed_loop_unstreamed_with_unknown_capacity() {
    use kvgate_bench::matrix::{self, Options};
    use kvgate_bench::{Arrivals, Capacity};
    let dir = std::env::temp_dir().join(format!("kvgate-matrix-{}", std::process::id()));
    let mut opts = Options::full(traces(), dir.join("matrix.md"));
    opts.quick = true;
    opts.kinds = vec![Kind::LongContext, Kind::CodingAgent];
    opts.arrivals = vec![Arrivals::Closed(4)];
    opts.streams = vec![false];
    opts.capacities = vec![Capacity::Learned, Capacity::Unknown];
    let ctx = Context {
        command: "test".to_owned(),
        date: "today".to_owned(),
        machine: "test".to_owned(),
    };
    let cells = matrix::run(&opts, &ctx).await.unwrap();
    assert_eq!(cells.len(), 4);
    for w in &cells {
        assert_eq!(w.instances, matrix::sizes::INSTANCES);
        assert_eq!(w.runs.len(), matrix::ARMS.len());
        for r in &w.runs {
            let what = format!("{} {} {}", w.setup_id, w.regime, r.arm.label());
            assert_eq!(r.failed, 0, "{what}: {:?}", r.first_error);
            // Every request found its own times in its instance's log.
            assert!(r.engine_requests_per_s.is_some_and(|x| x > 0.0), "{what}");
            assert!(
                r.engine_e2e.0 > 0.0 && r.engine_e2e.0 <= r.engine_e2e.1,
                "{what}"
            );
        }
        assert_eq!(matrix::verdict::judge(w).len(), 2);
        // kv_aware is judged against prefix_aware on its own tokenizing instances.
        assert_eq!(
            matrix::verdict::baseline(w, Arm::KvAware).map(|r| r.arm),
            Some(Arm::PrefixAwareOnTokens)
        );
    }
    let md = std::fs::read_to_string(dir.join("matrix.md")).unwrap();
    assert!(md.contains("## Summary"), "{md}");
    assert!(
        md.contains("### coding-agent · closed:4 · no-stream · capacity unknown"),
        "{md}"
    );
    assert!(md.contains("P90 latency (whole answer)"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_agent_benchmark_runs_every_strategy_over_chat_and_messages() {
    use kvgate_bench::{Api, agents};
    let dir = std::env::temp_dir().join(format!("kvgate-agents-{}", std::process::id()));
    let mut opts = agents::Options::full(traces(), dir.join("agents.md"));
    opts.quick = true;
    let ctx = Context {
        command: "test".to_owned(),
        date: "today".to_owned(),
        machine: "test".to_owned(),
    };
    let results = agents::run(&opts, &ctx).await.unwrap();
    assert_eq!(results.len(), Api::AGENTS.len());
    for (w, api) in results.iter().zip(Api::AGENTS) {
        assert_eq!(w.regime.api, api);
        assert!(w.ceiling > 0.0 && w.token_ceiling.is_some(), "{api}");
        assert_eq!(w.runs.len(), agents::ARMS.len());
        for r in &w.runs {
            let what = format!("{api} {}", r.arm.label());
            assert_eq!(r.failed, 0, "{what}: {:?}", r.first_error);
            assert_eq!(r.requests, w.requests, "{what}");
            // The clients read the same cached tokens from Anthropic's usage
            // as the instances counted, and every answer's id found its times.
            assert_eq!(r.cached_tokens, r.usage_cached_tokens, "{what}");
            assert!(r.engine_requests_per_s.is_some_and(|x| x > 0.0), "{what}");
            assert!(r.hit_rate > 0.0, "{what}");
        }
    }
    let md = std::fs::read_to_string(dir.join("agents.md")).unwrap();
    assert!(md.contains("| messages | kv_aware |"), "{md}");
    assert!(md.contains("| openai-keyed | longest_prefix |"), "{md}");
    assert!(
        md.contains("## Against plain chat, strategy by strategy"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
