//! Test harness: the real gateway and real HTTP upstreams, each on its own
//! 127.0.0.1:0 port. Upstreams record what reached them and can answer fast,
//! slowly, by streaming, or not at all.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::stream;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub mod openai;

/// What an upstream does with each request.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Answer at once with a small OpenAI-shaped JSON naming the instance.
    Json,
    /// Answer after a delay.
    Delay(Duration),
    /// Stream these SSE chunks, pausing `gap` before each after the first.
    Stream { chunks: Vec<String>, gap: Duration },
    /// Never answer; count the request as cancelled when the connection goes.
    Hold,
    /// Answer with this status.
    Status(u16),
    /// Answer with this status, content type and body.
    Raw(u16, &'static str, &'static str),
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug)]
pub struct UpstreamState {
    pub name: String,
    pub mode: Mutex<Mode>,
    pub seen: Mutex<Vec<Seen>>,
    pub active: AtomicUsize,
    pub peak: AtomicUsize,
    /// Requests whose connection went away before the answer was complete.
    pub cancelled: AtomicUsize,
    /// Reads of its `/metrics` (the gateway's capacity probe), not counted in `seen`.
    pub metrics_reads: AtomicUsize,
    /// Ids of the Responses API answers this instance stored.
    pub responses: Mutex<Vec<String>>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub state: Arc<UpstreamState>,
    stop: Option<oneshot::Sender<()>>,
    /// `http://127.0.0.1:…`, or `https://127.0.0.1:…` behind TLS.
    url: String,
}

impl Upstream {
    pub async fn start(name: &str, mode: Mode) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").await.unwrap(), name, mode).await
    }

    pub async fn start_on(listener: TcpListener, name: &str, mode: Mode) -> Self {
        let (state, app) = Self::app(name, mode);
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Self {
            addr,
            state,
            stop: Some(tx),
            url: format!("http://{addr}"),
        }
    }

    /// The same upstream behind TLS: a certificate for `localhost` and
    /// 127.0.0.1 issued by a CA made for this test, whose PEM is returned.
    pub async fn start_tls(name: &str, mode: Mode) -> (Self, String) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "kvgate test CA");
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let tls = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (state, app) = Self::app(name, mode);
        let (tx, mut rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    _ = &mut rx => return,
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that does not trust us fails the handshake: nothing to serve.
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        let up = Self {
            addr,
            state,
            stop: Some(tx),
            url: format!("https://127.0.0.1:{}", addr.port()),
        };
        (up, ca_pem)
    }

    fn app(name: &str, mode: Mode) -> (Arc<UpstreamState>, Router) {
        let state = Arc::new(UpstreamState {
            name: name.to_owned(),
            mode: Mutex::new(mode),
            seen: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            metrics_reads: AtomicUsize::new(0),
            responses: Mutex::new(Vec::new()),
        });
        // `/metrics` as an engine serves it, apart from the inference traffic
        // tests count: the gateway reads it to learn KV capacity.
        let app = Router::new()
            .route(
                "/metrics",
                axum::routing::get(|State(s): State<Arc<UpstreamState>>| async move {
                    s.metrics_reads.fetch_add(1, Ordering::SeqCst);
                    "vllm:num_requests_running 0\n"
                }),
            )
            .fallback(handle)
            .with_state(Arc::clone(&state));
        (state, app)
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn hits(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    pub fn cancelled(&self) -> usize {
        self.state.cancelled.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Counts a request active until dropped; if dropped unfinished, cancelled.
struct Active {
    state: Arc<UpstreamState>,
    finished: bool,
}

impl Active {
    fn new(state: &Arc<UpstreamState>) -> Self {
        let n = state.active.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak.fetch_max(n, Ordering::SeqCst);
        Self {
            state: Arc::clone(state),
            finished: false,
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.state.active.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.state.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn handle(State(state): State<Arc<UpstreamState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    state.seen.lock().unwrap().push(Seen {
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let mode = state.mode.lock().unwrap().clone();
    if matches!(mode, Mode::Json)
        && let Some(resp) = openai::answer(&state, parts.method.as_str(), parts.uri.path(), &body)
    {
        return resp;
    }
    let mut active = Active::new(&state);
    let json = || {
        let body = format!(
            r#"{{"id":"x","object":"chat.completion","instance":"{}","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{{"cached_tokens":8}}}}}}"#,
            state.name
        );
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-instance", state.name.as_str())
            .body(Body::from(body))
            .unwrap()
    };
    match mode {
        Mode::Json => {
            active.finished = true;
            json()
        }
        Mode::Delay(d) => {
            tokio::time::sleep(d).await;
            active.finished = true;
            json()
        }
        Mode::Status(code) => {
            active.finished = true;
            Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("x-instance", state.name.as_str())
                .body(Body::from(r#"{"error":{"message":"upstream says no","type":"server_error","param":null,"code":null}}"#))
                .unwrap()
        }
        Mode::Raw(code, content_type, body) => {
            active.finished = true;
            Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("x-instance", state.name.as_str())
                .header("content-type", content_type)
                .header("server", "uvicorn")
                .body(Body::from(body))
                .unwrap()
        }
        Mode::Hold => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Mode::Stream { chunks, gap } => {
            let s = stream::unfold(
                (chunks.into_iter(), active, true),
                move |(mut it, mut active, first)| async move {
                    match it.next() {
                        Some(c) => {
                            if !first {
                                tokio::time::sleep(gap).await;
                            }
                            Some((Ok::<_, std::io::Error>(Bytes::from(c)), (it, active, false)))
                        }
                        None => {
                            active.finished = true;
                            drop(active);
                            None
                        }
                    }
                },
            );
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .header("x-instance", state.name.as_str())
                .body(Body::from_stream(s))
                .unwrap()
        }
    }
}

/// A running gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    pub state: Arc<kvgate::AppState>,
    stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// The admin token every test gateway gets unless its config has an `admin:` section.
pub const ADMIN_TOKEN: &str = "test-only-admin-token-0123456789abcdef";

/// `yaml` with `admin.token` set to [`ADMIN_TOKEN`], unless it configures `admin` itself.
pub fn with_admin(yaml: &str) -> String {
    if yaml.lines().any(|l| l.starts_with("admin:")) {
        yaml.to_owned()
    } else {
        format!("{yaml}\nadmin:\n  token: \"{ADMIN_TOKEN}\"\n")
    }
}

impl Gateway {
    pub async fn start(yaml: &str) -> Self {
        let yaml = &with_admin(yaml);
        let mut config = kvgate::Config::from_yaml(yaml)
            .unwrap_or_else(|e| panic!("bad test config: {e}\n{yaml}"));
        // Several workers, as in production, but not one a CPU for each of
        // the tests a many-core machine runs at once.
        config.server.workers = config.server.workers.clamp(2, 4);
        let state = kvgate::build_state(config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(kvgate::serve(listener, Arc::clone(&state), async {
            let _ = rx.await;
        }));
        Self {
            addr,
            state,
            stop: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// POST a JSON body to an inference path and return the response.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .unwrap()
    }

    /// POST a chat completion.
    pub async fn chat(&self, body: &serde_json::Value) -> reqwest::Response {
        self.post("/v1/chat/completions", body).await
    }

    /// `POST /admin/explain/{path}` with the admin token, as the tenant that
    /// `credential` authenticates (the anonymous one without).
    pub async fn explain(
        &self,
        path: &str,
        credential: Option<&str>,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        let tenant = match credential {
            None => "anonymous".to_owned(),
            Some(c) => {
                let mut h = HeaderMap::new();
                h.insert(
                    header::AUTHORIZATION,
                    format!("Bearer {c}").parse().unwrap(),
                );
                let rt = self.state.runtime.load();
                rt.tenancy.authenticate(&h).unwrap().id.to_string()
            }
        };
        // Percent-encode all but unreserved characters (RFC 3986).
        let tenant: String = tenant
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        client()
            .post(self.url(&format!("/admin/explain{path}?tenant={tenant}")))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .unwrap()
    }

    /// The live instances of the endpoint named `chat` (the one `config()` writes).
    /// The gateway's `/metrics` text.
    pub async fn metrics(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn instances(&self) -> Vec<Arc<kvgate::fleet::Instance>> {
        let rt = self.state.runtime.load_full();
        rt.endpoint("chat").unwrap().instances.clone()
    }

    /// Wait until every instance's in-flight count is back to zero.
    pub async fn drained(&self) {
        let instances = self.instances();
        eventually("in-flight counts back to 0", || {
            instances.iter().all(|i| i.in_flight() == 0)
        })
        .await;
    }

    /// Begin graceful shutdown.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A one-endpoint config over these upstreams.
pub fn config(model: &str, upstreams: &[&Upstream], strategy: &str, threshold: usize) -> String {
    let instances: String = upstreams
        .iter()
        .map(|u| format!("      - url: \"{}\"\n", u.url()))
        .collect();
    format!(
        r#"server:
  listen: "127.0.0.1:0"
  max_body_bytes: 65536
  failover_cooldown_ms: 60000
endpoints:
  - name: chat
    models: ["{model}"]
    instances:
{instances}    routing:
      strategy: {strategy}
      prefix_length: 1024
      concurrency_threshold: {threshold}
"#
    )
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Poll `f` until it holds, for up to 10 s (generous: CI machines are slow).
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A chat body with a long shared system prompt and a short question.
pub fn chat_body(model: &str, system: &str, question: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ]
    })
}

pub fn system_prompt(topic: usize) -> String {
    format!("You are assistant number {topic}. ").repeat(80)
}

/// Which upstream served a response (each upstream names itself).
pub fn served_by(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-instance")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned()
}
