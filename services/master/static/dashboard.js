// The Offerbus dashboard: follows the master's /state/events?decisions=1 (Server-Sent
// Events: the /state document each time it changed) and redraws; without events it polls
// /state?decisions=1 (If-None-Match: a 304 when nothing changed). Every value from the
// cluster goes in as text (textContent, never markup), so a task named
// "<img src=x onerror=...>" shows as those characters.
"use strict";

const POLL_MS = Number(document.body.dataset.pollMs) || 1000;
const MAX_TASK_ROWS = 500;
const SCALARS = ["cpus", "mem", "disk", "gpus"];
const QUERY = "decisions=1";
let etag = "";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "title") node.title = value;
    else node.dataset[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows, empty) {
  if (!rows.length) return el("p", {class: "muted"}, empty);
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))),
            el("tbody", {}, ...rows.map(cells => el("tr", {}, ...cells.map(
              c => c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))))));
}

function num(value) { return el("td", {class: "num"}, value); }

// Resources (a list of {name, scalar | ranges | set}) summed by name.
function amounts(resources) {
  const out = {};
  for (const r of resources || []) {
    let n = 0;
    if (r.scalar !== undefined) n = Number(r.scalar);
    else if (r.ranges) for (const g of r.ranges.ranges || []) n += Number(g.end) - Number(g.begin) + 1;
    else if (r.set) n = (r.set.items || []).length;
    out[r.name] = (out[r.name] || 0) + n;
  }
  return out;
}

function fmt(x) { return Number.isInteger(x) ? String(x) : x.toFixed(2); }

function describe(resources) {
  const a = amounts(resources);
  const parts = Object.keys(a).sort().map(k => `${k}:${fmt(a[k])}`);
  return parts.length ? parts.join(" ") : "-";
}

function bar(used, total) {
  const frac = total > 0 ? Math.min(1, used / total) : 0;
  const fill = el("span");
  fill.style.width = `${(frac * 100).toFixed(1)}%`;
  return el("td", {title: `${fmt(used)} of ${fmt(total)} used`},
            el("span", {class: frac > 0.9 ? "bar hot" : "bar"}, fill),
            `${fmt(used)} / ${fmt(total)}`);
}

function ago(us) {
  if (!us || us === "0") return "-";
  const s = Math.max(0, Date.now() / 1000 - Number(us) / 1e6);
  return s < 120 ? `${Math.round(s)} s ago` : s < 7200 ? `${Math.round(s / 60)} min ago`
    : `${Math.round(s / 3600)} h ago`;
}

function pct(x) { return x === undefined ? "-" : `${(100 * Number(x)).toFixed(1)}%`; }

function renderHeader(doc) {
  const leaders = doc.leaders || {};
  const who = name => leaders[name] ? `${leaders[name].id} (epoch ${leaders[name].epoch})`
    : "none seen";
  const counts = Object.entries(doc.task_counts || {}).map(
    ([state, n]) => `${n} ${state.replace("TASK_", "").toLowerCase()}`).join(", ") || "no tasks";
  document.getElementById("summary").replaceChildren(el("span", {},
    `cluster ${doc.cluster_id} · master ${doc.master_id} leading, epoch ${doc.epoch}`,
    doc.paused ? el("span", {class: "paused"}, " (paused: its ZooKeeper session is in doubt)") : null,
    ` · allocator ${who("allocator")} · broker ${who("broker")} · `,
    `${(doc.agents || []).length} agents, ${(doc.frameworks || []).length} frameworks, ${counts}`));
}

function renderAgents(doc) {
  const tasksOn = {};
  for (const t of doc.tasks || []) tasksOn[t.agent_id] = (tasksOn[t.agent_id] || 0) + 1;
  const present = new Set();
  for (const a of doc.agents || []) for (const r of a.agent_info.resources || []) present.add(r.name);
  const names = SCALARS.filter(n => present.has(n));
  if (present.has("ports")) names.push("ports");
  const rows = (doc.agents || []).map(a => {
    const total = amounts(a.agent_info.resources), used = amounts(a.used_resources);
    const status = a.status || "AGENT_STATUS_UNSPECIFIED";
    return [a.agent_info.agent_id, a.agent_info.hostname || "",
            el("td", {class: `status-${status}`}, status.replace("AGENT_STATUS_", "").toLowerCase()),
            ...names.map(n => bar(used[n] || 0, total[n] || 0)),
            num(tasksOn[a.agent_info.agent_id] || 0), ago(a.last_seen_us)];
  });
  document.getElementById("agents").replaceChildren(table(
    ["agent", "hostname", "status", ...names.map(n => `${n} used / total`), "tasks", "last seen"],
    rows, "No agents."));
}

function renderRoles(doc) {
  const byRole = {};
  for (const f of doc.frameworks || []) {
    const role = f.framework_info.role || "*";
    byRole[role] = byRole[role] || {frameworks: 0, shares: null};
    byRole[role].frameworks += 1;
  }
  for (const d of doc.decisions || []) {
    const role = d.role || "*";
    byRole[role] = byRole[role] || {frameworks: 0, shares: null};
    if (d.shares) byRole[role].shares = d.shares;
  }
  const records = {};
  for (const r of doc.roles || []) records[r.role] = r;
  const roles = [...new Set([...Object.keys(byRole), ...Object.keys(records)])].sort();
  const rows = roles.map(role => {
    const r = records[role] || {}, seen = byRole[role] || {frameworks: 0, shares: null};
    const shares = seen.shares ? Object.keys(seen.shares).sort().map(
      k => `${k} ${pct(seen.shares[k])}`).join(", ") : "-";
    return [role, num(r.weight === undefined ? 1 : r.weight), num(seen.frameworks), shares,
            describe(r.quota_guarantee), describe(r.quota_limit)];
  });
  document.getElementById("roles").replaceChildren(table(
    ["role", "weight", "frameworks", "share of the cluster (allocator)", "quota guarantee",
     "quota limit"], rows, "No roles."));
}

function renderFrameworks(doc) {
  const decisions = {};
  for (const d of doc.decisions || []) decisions[d.framework_id] = d;
  const rows = (doc.frameworks || []).map(f => {
    const info = f.framework_info, d = decisions[info.framework_id];
    const outcome = d ? (d.outcome || "OUTCOME_UNSPECIFIED").replace("OUTCOME_", "").toLowerCase() : "-";
    return [info.framework_id, info.name || "", info.role || "*",
            f.connected ? "yes" : el("td", {class: "error"}, "no"),
            describe(f.used_resources), describe(f.offered_resources),
            d ? `${pct(d.dominant_share || 0)} ${d.dominant_resource || ""}` : "-",
            outcome, d ? (d.reason || "") : "no decision seen", d ? ago(d.decided_at_us) : "-"];
  });
  document.getElementById("frameworks").replaceChildren(table(
    ["framework", "name", "role", "connected", "used", "offered", "dominant share",
     "allocator", "why", "decided"], rows, "No frameworks."));
}

function renderJobs(doc) {
  const running = {}, framework = {};
  for (const f of doc.frameworks || []) {
    const job = (f.framework_info.labels || {})["offerbus.job"];
    if (job) framework[f.framework_info.framework_id] = job;
  }
  for (const t of doc.tasks || []) {
    const job = framework[t.framework_id];
    if (job && t.status && t.status.state === "TASK_RUNNING") running[job] = (running[job] || 0) + 1;
  }
  const rows = (doc.jobs || []).map(j => {
    const spec = j.spec || {};
    return [j.name, j.role || "*", num(Number(j.version || 0)), j.principal || "-",
            spec.image || "", num(spec.instances || 0), num(running[j.name] || 0),
            ago(j.updated_at_us)];
  });
  document.getElementById("jobs").replaceChildren(table(
    ["job", "role", "version", "principal", "image", "instances", "running", "updated"],
    rows, "No jobs."));
}

function renderTasks(doc) {
  const names = {}, hosts = {};
  for (const f of doc.frameworks || []) names[f.framework_info.framework_id] = f.framework_info.name;
  for (const a of doc.agents || []) hosts[a.agent_info.agent_id] = a.agent_info.hostname;
  const all = doc.tasks || [];
  const rows = all.slice(0, MAX_TASK_ROWS).map(t => {
    const state = (t.status && t.status.state) || "TASK_STAGING";
    return [t.task_info.task_id, t.task_info.name || "", names[t.framework_id] || t.framework_id,
            hosts[t.agent_id] || t.agent_id || "-",
            el("td", {class: `state-${state}`}, state.replace("TASK_", "").toLowerCase()),
            describe(t.task_info.resources), (t.status && t.status.message) || "",
            ago(t.launched_at_us)];
  });
  const shown = all.length > MAX_TASK_ROWS
    ? el("p", {class: "muted"}, `Showing ${MAX_TASK_ROWS} of ${all.length} tasks.`) : null;
  document.getElementById("tasks").replaceChildren(table(
    ["task", "name", "framework", "agent", "state", "resources", "message", "launched"],
    rows, "No tasks."), ...(shown ? [shown] : []));
}

function render(doc) {
  renderHeader(doc);
  renderAgents(doc);
  renderRoles(doc);
  renderFrameworks(doc);
  renderJobs(doc);
  renderTasks(doc);
}

function status(text, cls) {
  document.getElementById("status").replaceChildren(el("span", {class: cls || ""}, text));
}

async function poll() {
  try {
    const resp = await fetch(`/state?${QUERY}`, {
      cache: "no-store", headers: etag ? {"If-None-Match": etag} : {}});
    if (resp.status === 200) {
      etag = resp.headers.get("ETag") || "";
      render(await resp.json());
    } else if (resp.status === 503) {
      etag = "";
      notLeading(await resp.json().catch(() => ({})));
    } else if (resp.status !== 304) {
      throw new Error(`HTTP ${resp.status}`);
    }
    status(`updated ${new Date().toLocaleTimeString()} (every ${POLL_MS / 1000} s)`);
  } catch (err) {
    status(`cannot read /state: ${err.message}`, "error");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function notLeading(body) {
  document.getElementById("summary").replaceChildren(
    el("span", {class: "error"}, `master ${body.id || ""} is not leading: ask the leader`));
}

// Server-Sent Events when the browser has them; polling when it has not, or when the
// stream never opened (three errors before a first event).
function follow() {
  if (!window.EventSource || new URLSearchParams(location.search).has("poll")) {
    poll();
    return;
  }
  const source = new EventSource(`/state/events?${QUERY}`);
  let opened = false, errors = 0;
  source.addEventListener("state", event => {
    opened = true;
    render(JSON.parse(event.data));
    status(`live · changed ${new Date().toLocaleTimeString()}`);
  });
  source.addEventListener("idle", event => { opened = true; notLeading(JSON.parse(event.data)); });
  source.onerror = () => {
    status("event stream interrupted; reconnecting", "error");
    if (!opened && ++errors >= 3) { source.close(); poll(); }
  };
}

follow();
