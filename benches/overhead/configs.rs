//! The config files the benchmark writes for the processes it starts: the
//! fixed-answer nginx upstream, nginx and HAProxy as reverse proxies, nginx
//! over h2c for the open-stream memory test, and kvgate.

use std::path::Path;

/// The fixed chat.completion every `POST /v1/chat/completions` gets.
pub const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"A reverse proxy fronts servers; a load balancer spreads requests across them."},"finish_reason":"stop"}],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":0}}}"#;

/// Lines every nginx config here shares: one process, foreground, every
/// path it writes inside `dir`.
fn nginx_head(dir: &Path, name: &str, connections: u32) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/{name}.pid;\n\
         error_log {d}/{name}-error.log warn;\nevents {{ worker_connections {connections}; }}\n"
    )
}

fn nginx_temp_paths(dir: &Path, name: &str) -> String {
    let d = dir.display();
    ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .map(|t| format!("  {t}_temp_path {d}/{name}-{t};\n"))
        .collect()
}

/// The upstream: answers at once from memory, no access log.
pub fn nginx_upstream(dir: &Path, port: u16) -> String {
    format!(
        "{head}http {{\n  access_log off;\n{temps}  keepalive_requests 10000000;\n  keepalive_timeout 3600s;\n  \
         client_body_buffer_size 64k;\n  server {{\n    listen 127.0.0.1:{port} backlog=4096;\n    \
         location = /v1/chat/completions {{ default_type application/json; return 200 '{ANSWER}'; }}\n    \
         location = /health {{ return 200; }}\n    location / {{ return 404; }}\n  }}\n}}\n",
        head = nginx_head(dir, "upstream", 4096),
        temps = nginx_temp_paths(dir, "upstream"),
    )
}

/// nginx as a reverse proxy as a user would run it: one worker, no access
/// log (kvgate writes no line per request by default either: like for
/// like), HTTP/1.1 with keep-alive to the upstream, default buffering;
/// only the body buffer raised so a 16 KiB prompt is not spooled to disk.
pub fn nginx_proxy(dir: &Path, port: u16, upstream: u16) -> String {
    format!(
        "{head}http {{\n  access_log off;\n{temps}  keepalive_requests 10000000;\n  \
         keepalive_timeout 3600s;\n  client_body_buffer_size 64k;\n  \
         upstream up {{ server 127.0.0.1:{upstream}; keepalive 128; keepalive_requests 10000000; keepalive_timeout 3600s; }}\n  \
         server {{\n    listen 127.0.0.1:{port} backlog=4096;\n    location / {{\n      proxy_pass http://up;\n      \
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
        head = nginx_head(dir, "proxy", 4096),
        temps = nginx_temp_paths(dir, "proxy"),
    )
}

/// nginx in front of the held-open SSE upstream, clients over h2c (prior
/// knowledge), unbuffered as streaming needs.
pub fn nginx_streams(dir: &Path, port: u16, upstream: u16) -> String {
    format!(
        "{head}worker_rlimit_nofile 19000;\nhttp {{\n  access_log off;\n{temps}  client_body_buffer_size 64k;\n  \
         server {{\n    listen 127.0.0.1:{port} http2 backlog=4096;\n    http2_max_concurrent_streams 128;\n    \
         location / {{\n      proxy_pass http://127.0.0.1:{upstream};\n      proxy_http_version 1.1;\n      \
         proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_read_timeout 3600s;\n    }}\n  }}\n}}\n",
        head = nginx_head(dir, "streams", 16384),
        temps = nginx_temp_paths(dir, "streams"),
    )
}

/// HAProxy: one thread, HTTP mode, connections to the upstream reused.
pub fn haproxy(port: u16, upstream: u16) -> String {
    format!(
        "global\n  nbthread 1\n  maxconn 4096\n\ndefaults\n  mode http\n  timeout connect 5s\n  \
         timeout client 3600s\n  timeout server 3600s\n  timeout http-keep-alive 3600s\n  http-reuse always\n\n\
         frontend fe\n  bind 127.0.0.1:{port}\n  default_backend be\n\n\
         backend be\n  server up 127.0.0.1:{upstream}\n"
    )
}

/// kvgate with one endpoint and one instance, `strategy` as given, a
/// threshold no request reaches; everything else at its defaults.
pub fn kvgate(port: u16, upstream: &str, strategy: &str) -> String {
    format!(
        "server:\n  listen: \"127.0.0.1:{port}\"\n  timeouts: {{ idle_ms: 3600000, client_idle_ms: 3600000, connect_ms: 10000 }}\n  \
         sse_keepalive_ms: 0\nendpoints:\n  - name: chat\n    models: [\"m\"]\n    instances:\n      \
         - url: \"{upstream}\"\n    routing: {{ strategy: {strategy}, concurrency_threshold: 1024 }}\n"
    )
}

/// The admin token of the path with a console viewer.
pub const CONSOLE_TOKEN: &str = "overhead-bench-console-token-0123456789";

/// [`kvgate`] with `admin.token` set, so that a viewer can open `/console`.
pub fn kvgate_console(port: u16, upstream: &str, strategy: &str) -> String {
    format!(
        "{}admin:\n  token: \"{CONSOLE_TOKEN}\"\n",
        kvgate(port, upstream, strategy)
    )
}
