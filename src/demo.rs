//! `kvgate demo`: the gateway in front of a simulated fleet (kvgate-sim
//! instances modelled on Llama-3.1-70B on 4×H100) in one process, with no
//! config file, so a newcomer can see prefix routing work without GPUs.

use std::net::SocketAddr;
use std::sync::Arc;

use kvgate_sim::{KvEventsConfig, SimConfig, SimHandle, spawn_fleet};
use kvgate_tokenize::PromptTokenizer;

use crate::fleet::AppState;
use crate::{Config, build_state};
use kvgate_routing::Strategy;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub instances: usize,
    /// 1.0 runs the simulated fleet in real time; 0.1 ten times faster.
    pub time_scale: f64,
    /// The routing strategy in front of the fleet.
    pub strategy: Strategy,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            instances: 4,
            time_scale: 1.0,
            strategy: Strategy::KvAware,
        }
    }
}

/// SmolLM2's tokenizer and chat template (fixtures/smollm2): the demo's
/// simulated instances and its gateway tokenize with the same one, as a real
/// vLLM fleet and kvgate would with the served model's.
const TOKENIZER_JSON: &[u8] = include_bytes!("../fixtures/smollm2/tokenizer.json");
const TOKENIZER_CONFIG: &[u8] = include_bytes!("../fixtures/smollm2/tokenizer_config.json");

/// Write the embedded tokenizer where the printed config can name it.
fn demo_tokenizer() -> anyhow::Result<(std::path::PathBuf, Arc<PromptTokenizer>)> {
    let dir = std::env::temp_dir().join(format!("kvgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, TOKENIZER_JSON)?;
    std::fs::write(dir.join("tokenizer_config.json"), TOKENIZER_CONFIG)?;
    let tok = PromptTokenizer::from_json(TOKENIZER_JSON, Some(TOKENIZER_CONFIG))?;
    Ok((path, Arc::new(tok)))
}

/// The routing block of the demo's config, and a one-line summary for the banner.
fn routing_yaml(strategy: Strategy, sim: &SimConfig, tokenizer: &str) -> (String, String) {
    match strategy {
        Strategy::KvAware => (
            format!(
                "      strategy: kv_aware\n      block_size: {}\n      tokenizer: \"{tokenizer}\"\n",
                sim.block_size
            ),
            "kv_aware (each instance's KV events, SmolLM2's tokenizer)".to_owned(),
        ),
        Strategy::LongestPrefix => {
            let cache = sim.cache_blocks * sim.block_size;
            (
                format!("      strategy: longest_prefix\n      cache_tokens: {cache}\n"),
                format!("longest_prefix (cache_tokens {cache}, the simulated instances' KV)"),
            )
        }
        other => (
            format!(
                "      strategy: {}\n      prefix_length: 4096\n      concurrency_threshold: 10\n",
                other.as_str()
            ),
            format!(
                "{} (prefix_length 4096, concurrency_threshold 10)",
                other.as_str()
            ),
        ),
    }
}

/// A running demo fleet and the gateway state in front of it.
pub struct Demo {
    pub model: String,
    pub config_yaml: String,
    /// `admin.token` of this run, for the explain call the banner shows.
    pub admin_token: String,
    pub state: Arc<AppState>,
    pub fleet: Vec<SimHandle>,
    /// The routing settings in a line, for the banner.
    pub routing: String,
}

/// Start the simulated instances and build the gateway's config over them.
pub async fn start_fleet(opts: &DemoOptions, listen: SocketAddr) -> anyhow::Result<Demo> {
    let kv = opts.strategy.uses_events();
    let (tokenizer_path, tokenizer) = if kv {
        let (p, t) = demo_tokenizer()?;
        (p.display().to_string(), Some(t))
    } else {
        (String::new(), None)
    };
    let sim = SimConfig {
        time_scale: opts.time_scale,
        kv_events: kv.then(KvEventsConfig::default),
        tokenizer,
        ..SimConfig::llama70b_h100_tp4()
    };
    let model = sim.model.clone();
    let fleet = spawn_fleet(&sim, opts.instances.max(1)).await?;
    let instances: String = fleet
        .iter()
        .map(|h| match (h.kv_events_endpoint(), h.kv_replay_endpoint()) {
            (Some(ev), Some(rp)) => format!(
                "      - url: \"{}\"\n        kv_events: \"{ev}\"\n        kv_replay: \"{rp}\"\n",
                h.url()
            ),
            _ => format!("      - url: \"{}\"\n", h.url()),
        })
        .collect();
    let (routing, summary) = routing_yaml(opts.strategy, &sim, &tokenizer_path);
    // A fresh admin token a run, so the banner's explain call works and nobody
    // else on the machine can call the admin routes.
    let admin_token = hex::encode(rand::random::<[u8; 24]>());
    let config_yaml = format!(
        r#"server:
  listen: "{listen}"
endpoints:
  - name: chat
    models: ["{model}"]
    instances:
{instances}    routing:
{routing}    health:
      path: /health
      interval_ms: 2000
admin:
  token: "{admin_token}"
"#
    );
    let state = build_state(Config::from_yaml(&config_yaml)?)?;
    Ok(Demo {
        model,
        admin_token,
        config_yaml,
        state,
        fleet,
        routing: summary,
    })
}

/// What to print once the gateway listens on `addr`.
pub fn banner(demo: &Demo, addr: SocketAddr) -> String {
    let model = &demo.model;
    let fleet: Vec<String> = demo.fleet.iter().map(|h| h.url()).collect();
    format!(
        r#"
kvgate demo: gateway on http://{addr} in front of {n} simulated vLLM instances
  ({fleet})
  model "{model}"; routing {routing}

Live console: http://{addr}/console
  sign in with this run's admin token: {admin_token}
  (every request below shows up under Decisions within a second; click one to explain it)

Try it: run the curl twice. The second call shares the long system prompt, lands on the
same (now warm) instance, reports cached_tokens and answers much sooner:

  SYS=$(printf 'You are a helpful assistant for ACME. %.0s' $(seq 400))
  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' -w '\ntime %{{time_total}}s\n' \
    -d "{{\"model\":\"{model}\",\"max_tokens\":1,\"messages\":[{{\"role\":\"system\",\"content\":\"$SYS\"}},{{\"role\":\"user\",\"content\":\"hi\"}}]}}" \
    | grep -o '"usage".*\|time .*'

  curl -s http://{addr}/v1/models
  curl -s http://{addr}/metrics | grep kvgate_routing_decisions_total

Why did it go there? The same body to the explain route shows, per instance, how much of
the prompt it holds, the prefill queued on it and the cost:

  curl -s http://{addr}/admin/explain/v1/chat/completions -H 'content-type: application/json' \
    -H 'authorization: Bearer {admin_token}' \
    -d "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"system\",\"content\":\"$SYS\"}},{{\"role\":\"user\",\"content\":\"hi\"}}]}}"

With the OpenAI SDK (pip install openai):

  from openai import OpenAI
  client = OpenAI(base_url="http://{addr}/v1", api_key="unused")
  for chunk in client.chat.completions.create(model="{model}", stream=True,
          messages=[{{"role": "user", "content": "Hello!"}}]):
      print(chunk.choices[0].delta.content or "", end="")

Config in use (kvgate serve --config FILE takes the same YAML):
{yaml}
Ctrl-C stops it.
"#,
        n = demo.fleet.len(),
        fleet = fleet.join(", "),
        yaml = demo.config_yaml,
        routing = demo.routing,
        admin_token = demo.admin_token,
    )
}
