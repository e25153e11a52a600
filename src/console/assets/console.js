// kvgate console: renders what /console/api/events sends. Plain DOM, no
// framework, no innerHTML for data (text nodes only), no inline script
// (the page's Content-Security-Policy forbids it). It holds no state the
// gateway does not: a refresh starts again from the `hello` event.
"use strict";

const MAX_DECISIONS = 300;
const SVG = "http://www.w3.org/2000/svg";
let decisions = [];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n !== "number") return String(n);
  if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n * 10) / 10);
}

function ms(v) {
  return v === null || v === undefined ? "–" : fmt(v) + " ms";
}

function limit(value, max) {
  return max === null || max === undefined ? fmt(value) : fmt(value) + " / " + fmt(max);
}

// TTFT P50 (solid) and P90 (faint) over 15 minutes, one point a minute.
function sparkline(series) {
  const w = 120, h = 28;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("class", "spark");
  const top = Math.max(1, ...series.map((q) => (q ? q.p90_ms : 0)));
  for (const [key, cls] of [["p90_ms", "p90"], ["p50_ms", "p50"]]) {
    let pts = [];
    const flush = () => {
      if (pts.length === 1) {
        const dot = document.createElementNS(SVG, "circle");
        dot.setAttribute("cx", pts[0][0]);
        dot.setAttribute("cy", pts[0][1]);
        dot.setAttribute("r", "2");
        dot.setAttribute("class", cls);
        svg.append(dot);
      }
      if (pts.length > 1) {
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("points", pts.map((p) => p.join(",")).join(" "));
        line.setAttribute("class", cls);
        svg.append(line);
      }
      pts = [];
    };
    series.forEach((q, i) => {
      if (!q) return flush();
      const x = (i * (w - 2)) / Math.max(1, series.length - 1) + 1;
      const y = h - 2 - ((h - 4) * q[key]) / top;
      pts.push([x.toFixed(1), y.toFixed(1)]);
    });
    flush();
  }
  return svg;
}

function cacheCell(c) {
  const cap = c.capacity_tokens;
  if (c.held_tokens === null || c.held_tokens === undefined) {
    return el("td", { class: "cache" }, "– / " + fmt(cap), el("div", { class: "small" }, c.capacity_source));
  }
  const pct = cap ? Math.min(100, (100 * c.held_tokens) / cap) : 0;
  const bar = el("div", { class: "bar" }, el("div", { class: "fill" }));
  bar.firstChild.style.width = pct.toFixed(1) + "%";
  return el("td", { class: "cache" },
    fmt(c.held_tokens) + " / " + fmt(cap) + " tokens", bar,
    el("div", { class: "small" }, c.capacity_source + " capacity, held from " + c.held_source.replace("_", " ")));
}

function kvCell(k) {
  if (k.state === "not_configured") return el("td", { class: "kv small" }, "no feed");
  return el("td", { class: "kv small" },
    el("span", { class: "pill " + (k.state === "events" ? "ok" : "bad") }, k.connected ? k.state : "disconnected"),
    " seq " + (k.last_seq === null ? "–" : k.last_seq),
    el("br"),
    "gaps " + k.gaps + ", replays " + k.replays + ", resets " + k.resets);
}

function renderFleet(state) {
  const box = document.getElementById("endpoints");
  const parts = [];
  for (const ep of state.endpoints) {
    const rows = ep.instances.map((i) => {
      const hr = i.hit_rate_1m;
      const health = el("td", { class: "health" }, el("span", { class: "pill " + (i.health === "healthy" ? "ok" : "bad") }, i.health));
      return el("tr", { class: "instance", "data-id": i.id, "data-health": i.health },
        el("td", { class: "id" }, i.id),
        health,
        el("td", {}, fmt(i.in_flight), el("div", { class: "small" }, fmt(i.queued_prefill_tokens) + " prefill tokens queued")),
        cacheCell(i.cache),
        el("td", { class: "hit" }, hr.ratio === null ? "–" : (100 * hr.ratio).toFixed(1) + "%",
          el("div", { class: "small" }, fmt(hr.cached_tokens) + " of " + fmt(hr.prompt_tokens) + " tokens")),
        el("td", { class: "ttft" }, sparkline(i.ttft_by_minute),
          el("div", { class: "small" }, i.ttft_15m ? "P50 " + ms(i.ttft_15m.p50_ms) + " · P90 " + ms(i.ttft_15m.p90_ms) : "no streams yet")),
        kvCell(i.kv_events));
    });
    parts.push(el("div", { class: "endpoint", "data-name": ep.name },
      el("h3", {}, ep.name, " ", el("span", { class: "small" },
        ep.strategy + " · models " + ep.models.join(", ") + " · fair queue waiting " + ep.queue_waiting +
        (ep.health_check_ms ? " · health every " + ep.health_check_ms + " ms" : ""))),
      el("div", { class: "scroll" }, el("table", { class: "instances" },
        el("thead", {}, el("tr", {}, ...["instance", "health", "in flight", "KV held / capacity", "hit rate (1 min)", "TTFT (15 min)", "KV events"].map((t) => el("th", {}, t)))),
        el("tbody", {}, ...rows)))));
  }
  box.replaceChildren(...parts);
}

function renderTenants(state) {
  const body = document.querySelector("#tenant-table tbody");
  body.replaceChildren(...state.tenants.map((t) => {
    const refused = Object.entries(t.refusals).filter(([, n]) => n > 0);
    return el("tr", { class: "tenant", "data-id": t.id },
      el("td", {}, t.id),
      el("td", {}, limit(t.requests_1m, t.requests_per_minute)),
      el("td", {}, limit(t.tokens_1m, t.tokens_per_minute)),
      el("td", {}, limit(t.in_flight, t.max_concurrency)),
      el("td", {}, fmt(t.queue_service)),
      el("td", {}, fmt(t.queue_waiting)),
      el("td", { class: "refusals" + (refused.length ? " bad" : "") },
        refused.length ? refused.map(([k, n]) => k + " " + n).join(", ") : "none"));
  }));
}

function decisionRow(d) {
  const time = new Date(d.at_ms).toLocaleTimeString();
  const row = el("tr", { class: "decision", "data-seq": d.seq },
    el("td", {}, time),
    el("td", { class: "tenant" }, d.tenant),
    el("td", {}, d.api + (d.stream ? " (stream)" : "")),
    el("td", {}, d.strategy),
    el("td", { class: "instance" }, d.instance || "none"),
    el("td", { class: "reason" }, d.reason + (d.attempts > 1 ? " ×" + d.attempts : "")),
    el("td", {}, d.matched_tokens === null ? fmt(d.matched_blocks) + " blocks" : fmt(d.matched_tokens)),
    el("td", {}, fmt(d.cached_tokens)),
    el("td", {}, ms(d.ttft_ms)),
    el("td", {}, fmt(d.prompt_tokens_estimate) + " tok · " + fmt(d.body_bytes) + " B"),
    el("td", { class: "mono" }, d.key));
  row.addEventListener("click", () => explain(d.seq));
  return row;
}

function renderDecisions() {
  const body = document.querySelector("#decision-table tbody");
  body.replaceChildren(...decisions.map(decisionRow));
}

function addDecisions(lines) {
  const seen = new Set(decisions.map((d) => d.seq));
  const fresh = lines.filter((d) => !seen.has(d.seq)).reverse();
  decisions = fresh.concat(decisions).slice(0, MAX_DECISIONS);
  renderDecisions();
}

async function explain(seq) {
  const dialog = document.getElementById("explain");
  const body = document.getElementById("explain-body");
  body.replaceChildren(el("p", {}, "loading…"));
  if (!dialog.open) dialog.showModal();
  const r = await fetch("/console/api/decisions/" + seq, { credentials: "same-origin" });
  if (!r.ok) {
    body.replaceChildren(el("p", { class: "error" }, "decision " + seq + ": " + r.status));
    return;
  }
  const d = await r.json();
  const x = d.explain || {};
  const rows = (x.instances || []).map((i) => el("tr", { class: i.winner ? "winner" : "" },
    el("td", {}, i.id + (i.winner ? " ★" : "")),
    el("td", {}, i.available ? "yes" : "no"),
    el("td", {}, fmt(i.in_flight)),
    el("td", {}, fmt(i.matched_blocks)),
    el("td", {}, fmt(i.cached_tokens_estimate)),
    el("td", {}, fmt(i.uncached_tokens)),
    el("td", {}, fmt(i.queued_tokens)),
    el("td", {}, fmt(i.displaced_tokens)),
    el("td", {}, fmt(i.delayed_tokens)),
    el("td", {}, fmt(i.cost))));
  body.replaceChildren(
    el("h2", {}, "Decision " + d.seq),
    el("p", {}, "Winner: ", el("strong", { id: "explain-winner", "data-winner": d.instance || "" }, d.instance || "none"),
      " · reason ", el("strong", { id: "explain-reason" }, d.reason)),
    el("p", { class: "why" }, x.why || x.note || ""),
    el("p", { class: "small" }, d.tenant + " · " + d.api + " · " + d.strategy + " on " + d.endpoint +
      " · key " + d.key + " · " + fmt(d.prompt_tokens_estimate) + " prompt tokens (estimated), " + fmt(d.body_bytes) +
      " bytes · engine reported " + fmt(d.cached_tokens) + " cached of " + fmt(d.prompt_tokens) + " · TTFT " + ms(d.ttft_ms) +
      " · status " + fmt(d.status)),
    el("p", { class: "small" }, "Replayed on the loads it saw: " + (x.replayed_choice || "–") + " (" + (x.replayed_reason || "–") +
      "); preference on an idle fleet: " + (x.preference_order || []).join(" → ")),
    el("div", { class: "scroll" }, el("table", {},
      el("thead", {}, el("tr", {}, ...["instance", "available", "in flight", "matched blocks", "cached (est.)", "uncached", "queued", "displaced", "delayed", "cost"].map((t) => el("th", {}, t)))),
      el("tbody", {}, ...rows))));
}

function renderReload(r, version, started) {
  document.getElementById("reload").textContent =
    "Config last (re)built " + new Date(r.at_ms).toLocaleString() + " by " + r.by + " (" + r.count + " reloads since start).";
  document.getElementById("meta").textContent = "v" + version + " · up since " + new Date(started).toLocaleString();
}

async function loadConfig() {
  const r = await fetch("/console/api/config", { credentials: "same-origin" });
  if (r.ok) document.getElementById("config-text").textContent = (await r.json()).text;
}

function connect() {
  const link = document.getElementById("link");
  const es = new EventSource("/console/api/events");
  es.addEventListener("hello", (e) => {
    const h = JSON.parse(e.data);
    link.textContent = "live";
    link.className = "pill ok";
    renderFleet(h.state);
    renderTenants(h.state);
    decisions = [];
    addDecisions(h.decisions);
    renderReload(h.reload, h.version, h.started_ms);
    loadConfig();
  });
  es.addEventListener("state", (e) => {
    const s = JSON.parse(e.data);
    if (!s.endpoints) return;
    renderFleet(s);
    renderTenants(s);
  });
  es.addEventListener("decisions", (e) => addDecisions(JSON.parse(e.data)));
  es.onerror = () => {
    link.textContent = "reconnecting…";
    link.className = "pill bad";
  };
}

document.addEventListener("DOMContentLoaded", connect);
