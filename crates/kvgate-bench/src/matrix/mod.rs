//! The regime matrix (issue 20): every workload ([`Kind::MATRIX`]) under every
//! arrival mode (open loop, closed loop with 1, 4, 8 and 32 clients),
//! streaming and not, with the KV capacity learned from the engine and
//! unknown — `prefix_aware`, `longest_prefix` and `kv_aware` side by side in
//! each cell, judged by [`verdict`] and written by [`report`] to `matrix.md`
//! (after every cell, so an interrupted run keeps what it measured). Any
//! dimension can be narrowed to run a slice ([`Options`]); text density
//! (issue 30: `--density`, characters a token, 4 by default) is one more,
//! each workload's text recoded to it ([`crate::workload::Setup::at_density`]). Ceilings are not
//! measured here (they would double the time); `routing.md` has them.
//!
//! Each cell runs on a tokio runtime of its own, dropped after it: every
//! in-process gateway spawns tasks that outlive it (its metrics upkeep ticks
//! forever), and 420 gateways' worth of them, each walking the process-wide
//! recorder, would eat the CPU the later cells are timed on.

mod density;
pub mod report;
pub mod sizes;
mod summary;
pub mod verdict;

use std::future::Future;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;

use crate::density::Density;
use crate::regime::{Api, Arrivals, Capacity, Regime};
use crate::report::Context;
use crate::workload::Kind;
use crate::{Arm, WorkloadResult, bench_with};

/// The strategies every cell compares: `kv_aware` beside `prefix_aware` on
/// its own tokenizing instances, which it is judged against.
pub const ARMS: [Arm; 4] = [
    Arm::PrefixAware,
    Arm::LongestPrefix,
    Arm::PrefixAwareOnTokens,
    Arm::KvAware,
];

/// What to run; each list narrows one dimension (all of it by default).
#[derive(Clone, Debug)]
pub struct Options {
    pub kinds: Vec<Kind>,
    pub arrivals: Vec<Arrivals>,
    pub streams: Vec<bool>,
    pub capacities: Vec<Capacity>,
    /// The APIs sessions are sent over (OpenAI chat alone by default).
    pub apis: Vec<Api>,
    /// Text densities, characters a token (the workloads' own 4 by default).
    pub densities: Vec<Density>,
    pub arms: Vec<Arm>,
    /// Seconds, not minutes (CI smoke).
    pub quick: bool,
    /// Every workload's time scale instead of its own (`--time-scale`): a
    /// slower clock shows what of a cell's figures the shared machine's
    /// real-time delays make, multiplied by 1/time_scale.
    pub time_scale: Option<f64>,
    pub seed: u64,
    pub traces: PathBuf,
    /// The report's path.
    pub out: PathBuf,
}

impl Options {
    /// The whole matrix, written to `out`.
    pub fn full(traces: PathBuf, out: PathBuf) -> Self {
        Self {
            kinds: Kind::MATRIX.to_vec(),
            arrivals: Arrivals::MATRIX.to_vec(),
            streams: vec![true, false],
            capacities: Capacity::MATRIX.to_vec(),
            apis: vec![Api::OpenAi],
            densities: vec![Density::ENGLISH],
            arms: ARMS.to_vec(),
            quick: false,
            time_scale: None,
            seed: 7,
            traces,
            out,
        }
    }

    /// Every cell's regime, in run order.
    pub fn regimes(&self) -> Vec<Regime> {
        let mut out = Vec::new();
        for &arrivals in &self.arrivals {
            for &stream in &self.streams {
                for &capacity in &self.capacities {
                    for &api in &self.apis {
                        out.push(Regime {
                            arrivals,
                            stream,
                            capacity,
                            api,
                        });
                    }
                }
            }
        }
        out
    }
}

/// Run the cells `opts` selects, writing the report after each; returns them.
pub async fn run(opts: &Options, ctx: &Context) -> anyhow::Result<Vec<WorkloadResult>> {
    let started = Instant::now();
    let build = crate::host::build();
    let regimes = opts.regimes();
    let total = opts.kinds.len() * opts.densities.len() * regimes.len();
    let mut cells: Vec<WorkloadResult> = Vec::with_capacity(total);
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for &kind in &opts.kinds {
        let mut sized = sizes::setup(kind, opts.quick, opts.seed, &opts.traces)?;
        if let Some(ts) = opts.time_scale {
            sized.sim.time_scale = ts;
        }
        eprintln!(
            "{}: {} requests, {} instances, {} KV tokens an instance",
            sized.id,
            sized.requests(),
            sized.instances,
            sized.cache_tokens()
        );
        for &density in &opts.densities {
            let base = sized.at_density(density)?;
            if !density.is_english() {
                eprintln!(
                    "{} at {density}: engines at {} bytes a token; kv_aware's at {:.2}× (SmolLM2 tokens a token)",
                    base.id, base.sim.bytes_per_token, base.kv_token_ratio
                );
            }
            for regime in &regimes {
                let mut setup = base.clone();
                setup.regime = *regime;
                let tag = format!("m{}", cells.len());
                eprintln!(
                    "[{}/{total}] {} · {density} · {regime}",
                    cells.len() + 1,
                    setup.id
                );
                let w = in_fresh_runtime(|| async {
                    bench_with(&setup, &opts.arms, &tag, false, |l| eprintln!("  {l}")).await
                })?;
                for v in verdict::judge(&w) {
                    eprintln!(
                        "  => {} {}",
                        v.arm.label(),
                        if v.won() {
                            "won".to_owned()
                        } else {
                            format!("LOST on {}", v.failed().join(", "))
                        }
                    );
                }
                cells.push(w);
                let md = report::markdown(ctx, &build, &cells, started.elapsed().as_secs_f64());
                std::fs::write(&opts.out, md)
                    .with_context(|| format!("writing {}", opts.out.display()))?;
            }
        }
    }
    eprintln!(
        "wrote {} ({} cells in {:.1} min)",
        opts.out.display(),
        cells.len(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(cells)
}

/// Run `make()`'s future to its end on a new multi-threaded runtime, on a
/// thread of its own (a runtime cannot start inside another), then drop the
/// runtime and every task left on it.
pub(crate) fn in_fresh_runtime<T, F, Fut>(make: F) -> anyhow::Result<T>
where
    T: Send,
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = anyhow::Result<T>>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                let out = rt.block_on(make());
                rt.shutdown_timeout(std::time::Duration::from_secs(1));
                out
            })
            .join()
            .map_err(|_| anyhow::anyhow!("a matrix cell panicked"))?
    })
}
