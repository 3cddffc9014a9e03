// The console's core: calls to the bridge, the error banner, tabs, the
// status line, SAEs and the feature browser. panels.js and playground.js
// add the other tabs through the same helpers (window.Console).
"use strict";

const C = (window.Console = {});
let adminKey = ""; // typed by the operator; kept in memory only, never stored

document.documentElement.classList.add("js");

C.$ = (selector) => document.querySelector(selector);

// An element: el("td", {class: "x"}, "text", child, ...).
C.el = (tag, attrs, ...children) => {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
};

C.showError = (message) => {
  const box = C.$("#error");
  box.textContent = message;
  box.hidden = false;
};
C.clearError = () => { C.$("#error").hidden = true; };

// One API call: JSON in and out, the key sent when one was typed. A refusal
// shows the API's own error message (and field) in the banner and throws.
C.api = async (method, path, body, extraHeaders) => {
  const headers = { ...(extraHeaders || {}) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (adminKey) headers.Authorization = "Bearer " + adminKey;
  let reply;
  try {
    reply = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    C.showError(`${method} ${path}: the bridge did not answer (${err.message}).`);
    throw err;
  }
  const text = await reply.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!reply.ok) {
    const e = (data && data.error) || {};
    const where = e.param ? ` (field: ${e.param})` : "";
    const code = e.code ? ` [${e.code}]` : "";
    C.showError(`${method} ${path} → ${reply.status}${code}: ${e.message || text || reply.statusText}${where}`);
    const error = new Error(e.message || reply.statusText);
    error.status = reply.status;
    throw error;
  }
  C.clearError();
  return { data, headers: reply.headers };
};
C.get = async (path) => (await C.api("GET", path)).data;
C.send = async (method, path, body) => (await C.api(method, path, body)).data;

// Run an action from a button or form; an error is already in the banner.
C.act = (fn) => async (event) => {
  if (event) event.preventDefault();
  try { await fn(event); } catch (err) { if (!err.status) C.showError(String(err.message || err)); }
};

// -- tabs ------------------------------------------------------------------------------
const refreshers = {};
C.onTab = (name, refresh) => { refreshers[name] = refresh; };
C.currentTab = () => (C.$("#tabs button.current") || {}).dataset.tab;

function showTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("current", b.dataset.tab === name);
  for (const s of document.querySelectorAll("section.tab")) s.classList.toggle("current", s.id === name);
  if (refreshers[name]) refreshers[name]().catch(() => {});
}
for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));

// -- status and SAEs -----------------------------------------------------------------------
C.saes = [];

C.loadSaes = async () => {
  const data = await C.get("/api/saes");
  C.saes = data.saes;
  const body = C.$("#sae-table tbody");
  body.replaceChildren(...data.saes.map((s) => C.el("tr", { "data-sae": s.id },
    C.el("td", {}, s.id), C.el("td", {}, s.layer), C.el("td", {}, s.d_sae), C.el("td", {}, s.architecture),
    C.el("td", { class: s.attached ? "on" : "off" }, s.attached ? "attached" : "no"),
    C.el("td", {}, C.el("button", {
      "data-action": s.attached ? "detach" : "attach", "data-id": s.id,
      onclick: C.act(async () => { await C.send("POST", `/api/saes/${encodeURIComponent(s.id)}/${s.attached ? "detach" : "attach"}`); await C.loadSaes(); }),
    }, s.attached ? "Detach" : "Attach")))),
    ...data.broken.map((b) => C.el("tr", {}, C.el("td", {}, b.id), C.el("td", { colspan: 5, class: "muted" }, b.problem))));
  for (const id of ["#feature-sae", "#probe-sae", "#pg-sae", "#wb-sae"]) fillSaeSelect(C.$(id));
  await loadStatus();
};

function fillSaeSelect(select) {
  const kept = select.value;
  select.replaceChildren(...C.saes.map((s) => C.el("option", { value: s.id }, `${s.id} (layer ${s.layer})`)));
  if (C.saes.some((s) => s.id === kept)) select.value = kept;
}

async function loadStatus() {
  const [steering, models] = await Promise.all([C.get("/api/steering"), C.get("/api/models")]);
  const loaded = (models.data || models.models || []).find((m) => m.state === "loaded" || m.loaded);
  C.model = loaded ? loaded.id : "";
  const s = steering.steering;
  C.$("#status").textContent = `model ${C.model || "(none loaded)"} · steering ${s.enabled ? "enabled" : "disabled"}`
    + ` · attached: ${s.attached_sae_ids.join(", ") || "none"} · active profile: ${s.active_profile || "none"}`
    + ` · ${steering.liveness.live ? "the default steering is live" : "default steering: " + steering.liveness.reason}`
    + replicaCount(steering.liveness);
}

// "applied on 2 of 2 replicas" when several engines share the state (a lone engine says nothing).
function replicaCount(liveness) {
  const replicas = liveness.replicas || 1;
  return replicas > 1 ? ` (applied on ${liveness.replicas_applied || 0} of ${replicas} replicas)` : "";
}

// -- the feature browser -------------------------------------------------------------------
const PAGE = 12;
let featureOffset = 0;

C.saeById = (id) => C.saes.find((s) => s.id === id);

async function loadFeatures() {
  const sae = C.$("#feature-sae").value;
  if (!sae) return;
  const query = new URLSearchParams({ query: C.$("#feature-query").value, offset: featureOffset, limit: PAGE });
  const page = await C.get(`/api/saes/${encodeURIComponent(sae)}/features?${query}`);
  const list = C.$("#feature-list");
  if (!page.recorded) {
    C.$("#feature-count").textContent = "";
    list.replaceChildren(C.el("p", { class: "muted" }, `${sae} carries no record of what its features fire on (features.json).`));
    return;
  }
  const last = Math.min(featureOffset + PAGE, page.total);
  C.$("#feature-count").textContent = page.total ? `${featureOffset + 1}-${last} of ${page.total} (record of ${page.tokens_read} tokens)` : "no feature matches";
  list.replaceChildren(...page.features.map((f) => featureCard(page.sae, f)));
}

function featureCard(sae, f) {
  return C.el("div", { class: "feature", "data-feature": f.index },
    C.el("div", { class: "head" },
      C.el("b", {}, `#${f.index}`),
      C.el("span", { class: "muted" }, `active on ${(f.density * 100).toFixed(1)}% of tokens · max ${f.max_activation.toFixed(2)}`),
      C.el("span", {}, f.top_tokens.map((t) => C.el("span", { class: "chip", title: `${t.count} of its strongest positions, max ${t.max}` }, `${t.token} ×${t.count}`))),
      C.el("button", { onclick: () => C.useFeature(sae, f.index, "playground") }, "Steer in playground"),
      C.el("button", { onclick: () => C.useFeature(sae, f.index, "profile") }, "Add to new profile"),
      C.el("button", { onclick: () => C.useFeature(sae, f.index, "probe") }, "Probe it")),
    f.examples.slice(0, 3).map((e) => C.el("div", { class: "example" }, `${e.value.toFixed(2)}  …${oneLine(e.left).slice(-40)}`,
      C.el("b", {}, oneLine(e.token)), `${oneLine(e.right)}…`)));
}

function oneLine(text) {
  return text.replace(/\n/g, "⏎");
}

// Hand a feature to another tab's form (the handlers live in panels.js and playground.js).
C.featureTargets = {};
C.useFeature = (sae, index, where) => {
  const target = C.featureTargets[where];
  if (target) target(C.saeById(sae.id) || sae, index);
  showTab(where === "profile" ? "profiles" : where === "probe" ? "monitoring" : "playground");
};

C.$("#feature-form").addEventListener("submit", C.act(() => { featureOffset = 0; return loadFeatures(); }));
C.$("#feature-sae").addEventListener("change", C.act(() => { featureOffset = 0; return loadFeatures(); }));
C.$("#feature-prev").addEventListener("click", C.act(() => { featureOffset = Math.max(0, featureOffset - PAGE); return loadFeatures(); }));
C.$("#feature-next").addEventListener("click", C.act(() => { featureOffset += PAGE; return loadFeatures(); }));
C.$("#key-form").addEventListener("submit", C.act(async () => {
  adminKey = C.$("#key").value.trim();
  C.$("#key").value = "";
  C.$("#key").placeholder = adminKey ? "key in use (kept in this page only)" : "only when keys are configured";
  await C.start();
}));

C.onTab("saes", async () => { await C.loadSaes(); await loadFeatures(); });

C.start = async () => {
  try {
    await C.loadSaes();
    await loadFeatures();
  } catch (err) {
    if (!err.status) C.showError(String(err.message || err));
    C.$("#status").textContent = "Not connected: see the message above (an admin key may be needed).";
  }
};
window.addEventListener("DOMContentLoaded", () => { showTab(C.currentTab() || "saes"); C.start(); });
window.addEventListener("error", (e) => C.showError(`The console failed: ${e.message}`));
