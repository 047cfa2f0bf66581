// SIE status page: reads the control API with the token the user typed in (kept in sessionStorage for
// this tab only, sent as a bearer header) and redraws itself every REFRESH_MS. Data is written into the
// page only as text (textContent), never as HTML. See sie/control/api/status_page.py for why.
"use strict";

// ?refresh_ms=N (250..60000) redraws faster or slower than every 2 s
const REFRESH_MS = (() => {
  const asked = Number(new URLSearchParams(location.search).get("refresh_ms"));
  return asked >= 250 && asked <= 60000 ? asked : 2000;
})();
// ?page=N (10..10000): rows per table. The models, nodes and replicas come a page at a time (the API's limit/after),
// so a refresh costs the same at 10,000 models as at 10: a page's rows, not the whole cluster's
const PAGE = (() => {
  const asked = Number(new URLSearchParams(location.search).get("page"));
  return asked >= 10 && asked <= 10000 ? asked : 100;
})();
const TOKEN_KEY = "sie.status.token";
let timer = null;
// per paged table: the `after` of each page the user went through; the last one is the page shown (null: the first)
const pages = { models: [null], nodes: [null], replicas: [null] };
// what the filter form asks for: a model (models and replicas), a replica state
const filter = { model: "", state: "" };

const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + token() }, cache: "no-store" });
  if (response.status === 401) { throw Object.assign(new Error("token refused"), { unauthorized: true }); }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));  // the API's one error shape names what is wrong
    throw new Error(path.split("?")[0] + ": " + (body.error || "HTTP " + response.status));
  }
  return response.json();
}

// the path of the page shown of a paged table, with the filters that apply to it
function listPath(table, filters) {
  const query = new URLSearchParams({ limit: String(PAGE) });
  const after = pages[table][pages[table].length - 1];
  if (after !== null) { query.set("after", after); }
  for (const [key, value] of Object.entries(filters)) { if (value) { query.set(key, value); } }
  return "/v1/" + table + "?" + query.toString();
}

// "models 101-200 of 10000" and the buttons to the pages before and after
function drawPager(table, answer) {
  const pager = document.querySelector(".pager[data-for=" + table + "]");
  const shown = answer[table].length, first = (pages[table].length - 1) * PAGE;
  pager.querySelector(".count").textContent = shown ? table + " " + (first + 1) + "\u2013" + (first + shown) + " of " +
    answer.total : answer.total ? "no more " + table : "no " + table + (filter.model || filter.state ? " match the filter" : "");
  pager.querySelector(".prev").hidden = pages[table].length === 1;
  pager.querySelector(".next").hidden = answer.next === null || answer.next === undefined;
  pager.dataset.next = answer.next ?? "";
}

function turn(table, forward) {
  if (forward) {
    pages[table].push(document.querySelector(".pager[data-for=" + table + "]").dataset.next);
  } else if (pages[table].length > 1) {
    pages[table].pop();
  }
  refresh();
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) { td.className = cls; }
  row.appendChild(td);
  return td;
}

// state: what decides the colour (default: the text itself, e.g. a rollout's label is coloured by its phase)
function stateCell(row, text, state) {
  const td = document.createElement("td");
  const span = document.createElement("span");
  span.textContent = text;
  const good = ["READY", "Ready", "online", "Complete"], bad = ["FAILED", "CRASHED", "UNKNOWN", "UNSCHEDULABLE",
    "Degraded", "Unschedulable", "Invalid", "offline", "Failed", "RollingBack", "RolledBack"];
  const key = state ?? text;
  span.className = "state " + (good.includes(key) ? "ok" : bad.includes(key) ? "bad" : "warn");
  td.appendChild(span);
  row.appendChild(td);
}

function fill(tableId, items, draw) {
  const body = $(tableId).querySelector("tbody");
  const rows = items.map((item) => { const tr = document.createElement("tr"); draw(tr, item); return tr; });
  body.replaceChildren(...rows);
}

function ago(ms) {
  if (!ms) { return "-"; }
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 120 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago";
}

function clock(ms) { return new Date(ms).toLocaleTimeString(); }

function drawModels(models) {
  fill("models", models, (tr, m) => {
    tr.dataset.model = m.name;
    const spec = m.spec || {}, live = m.live || {};
    cell(tr, m.name);
    cell(tr, m.version || spec.version);
    cell(tr, m.priority_level || spec.priority_level);
    stateCell(tr, m.phase);
    cell(tr, (m.ready_replicas ?? 0) + " / " + (m.desired_replicas ?? 0), "num");
    cell(tr, live.lag, "num");
    const p99 = live.p99_ms === null || live.p99_ms === undefined ? "-" : live.p99_ms.toFixed(1);
    const budget = spec.p99_latency_ms ?? "-";
    const over = live.p99_ms !== null && live.p99_ms !== undefined && spec.p99_latency_ms && live.p99_ms > spec.p99_latency_ms;
    cell(tr, p99 + " / " + budget, over ? "num over" : "num");
    cell(tr, m.reason);
  });
}

function drawNodes(nodes) {
  fill("nodes", nodes, (tr, n) => {
    tr.dataset.node = n.name;
    cell(tr, n.name);
    stateCell(tr, n.status);
    cell(tr, n.tier);
    cell(tr, n.cpu, "num");
    cell(tr, n.gpus.length ? n.gpus.map((g) => "#" + g.index + " " + g.product + (g.simulated ? "*" : "") + " " +
      g.memory_used_mb + " / " + g.memory_total_mb + " MiB, " + Math.round(g.utilization_pct) + "%" +
      (g.healthy ? "" : " UNHEALTHY")).join("; ") : "none");
    cell(tr, ago(n.last_heartbeat_ms));
  });
}

function drawReplicas(replicas) {
  fill("replicas", replicas, (tr, r) => {
    tr.dataset.replica = r.replica_id;
    tr.dataset.state = r.state;
    cell(tr, r.replica_id);
    cell(tr, r.model);
    cell(tr, r.version);
    cell(tr, r.node);
    cell(tr, r.gpu_indices.length ? r.gpu_indices.join(",") : "-");
    stateCell(tr, r.state);
    cell(tr, r.restarts, "num");
    cell(tr, r.reason);
  });
}

function utc(ms) { return ms ? new Date(ms).toISOString() : "-"; }

// which of its steps the rollout is at, as its label counts them (Canary(step 2/3, ...) is "2 / 3")
function rolloutStep(r) {
  const n = (r.steps || []).length;
  if (!n) { return "-"; }
  if (r.label.includes("Canary(")) { return (r.step + 1) + " / " + n; }
  if (["Pending", "Surging"].includes(r.phase)) { return "0 / " + n; }
  if (["Promoting", "Draining", "Complete"].includes(r.phase)) { return n + " / " + n; }
  return "-";
}

function drawRollouts(rollouts) {
  $("rollouts-none").hidden = rollouts.length > 0;
  fill("rollouts", rollouts, (tr, r) => {
    tr.dataset.model = r.model;
    tr.dataset.phase = r.phase;
    cell(tr, r.model);
    cell(tr, r.stable_version + " \u2192 " + r.canary_version);
    stateCell(tr, r.label, r.phase);
    cell(tr, rolloutStep(r), "num");
    cell(tr, (100 - r.weight_percent) + "% / " + r.weight_percent + "%", "num");
    cell(tr, r.epoch, "num");
    const last = r.events && r.events.length ? r.events[r.events.length - 1] : null;
    cell(tr, last ? utc(last.at_ms) + " (" + ago(last.at_ms) + "): " + last.from + " \u2192 " + last.to + ": " +
      last.reason : r.reason);
  });
}

function drawEvents(events) {
  fill("events", events.slice().reverse(), (tr, e) => {
    cell(tr, clock(e.ts_ms));
    cell(tr, e.kind);
    cell(tr, e.model);
    cell(tr, e.replica_id);
    cell(tr, e.detail + (e.count > 1 ? " (x" + e.count + ", first at " + clock(e.first_ts_ms) + ")" : ""));
  });
}

async function refresh() {
  try {
    const [health, nodes, models, replicas, events, rollouts] = await Promise.all([
      api("/healthz"), api(listPath("nodes", {})), api(listPath("models", { model: filter.model })),
      api(listPath("replicas", { model: filter.model, state: filter.state })), api("/v1/events?limit=30"),
      api("/v1/rollouts")]);
    $("cluster").textContent = health.instance + " (" + health.role + ", epoch " + health.epoch + ")" +
      (health.ok ? "" : " " + health.status);
    drawModels(models.models);
    drawNodes(nodes.nodes);
    drawReplicas(replicas.replicas);
    for (const [table, answer] of [["models", models], ["nodes", nodes], ["replicas", replicas]]) {
      drawPager(table, answer);
    }
    drawEvents(events.events);
    drawRollouts(rollouts.rollouts);
    $("error").textContent = "";
    $("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (err) {
    if (err.unauthorized) { signOut("The token was refused: sign in again."); return; }
    $("error").textContent = "Not updated: " + err.message + " (showing the last data)";
  }
}

function show(signedIn) {
  $("login").hidden = signedIn;
  $("dashboard").hidden = !signedIn;
  $("signout").hidden = !signedIn;
}

function start() {
  show(true);
  refresh();
  clearInterval(timer);
  timer = setInterval(refresh, REFRESH_MS);
}

function signOut(message) {
  clearInterval(timer);
  sessionStorage.removeItem(TOKEN_KEY);
  delete document.body.dataset.loaded;
  show(false);
  $("login-error").textContent = message || "";
}

async function signIn(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  $("token").value = "";
  if (!value) { $("login-error").textContent = "Paste a token first."; return; }
  const response = await fetch("/v1/nodes?limit=1", { headers: { Authorization: "Bearer " + value }, cache: "no-store" });
  if (!response.ok) {
    $("login-error").textContent = response.status === 401 ? "This token is not valid here." : "HTTP " + response.status;
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, value);
  $("login-error").textContent = "";
  start();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", () => signOut(""));
  $("filter-form").addEventListener("submit", (event) => {
    event.preventDefault();
    filter.model = $("filter-model").value.trim();
    filter.state = $("filter-state").value;
    pages.models = [null];
    pages.replicas = [null];
    refresh();
  });
  for (const pager of document.querySelectorAll(".pager")) {
    pager.querySelector(".prev").addEventListener("click", () => turn(pager.dataset.for, false));
    pager.querySelector(".next").addEventListener("click", () => turn(pager.dataset.for, true));
  }
  if (token()) { start(); } else { show(false); }
});
