// The console's management tabs: profiles, clusters and circuits with their
// dials, and monitoring (probes and live counters). Every rule is the
// engine's: a refusal shows its message in the banner (console.js).
"use strict";

(() => {
  const C = window.Console;
  const { $, el, act, get, send } = C;
  const whenText = (w) => (w.after_text !== undefined ? `after "${w.after_text}"`
    : w.from_position !== undefined ? `from position ${w.from_position}`
      : w.probe !== undefined ? `while probe ${w.probe} fires`
        : `while L${w.layer} #${w.feature} > ${w.above}`);
  const amountText = (e, amount) => (e.mode === "clamp" ? ` = ${e.value}`
    : e.mode === "ablate" ? " ablated" : ` × ${amount}`);
  const entryText = (e) => (e.abort_when ? `end the row ${whenText(e.abort_when)}`
    : (e.control_vector ? `${e.control_vector}${amountText(e, e.scale)}`
      : `L${e.layer} #${e.feature}${amountText(e, e.strength)}`)
      + (e.when ? ` ${whenText(e.when)}` : ""));

  // -- profiles ---------------------------------------------------------------------------
  async function loadProfiles() {
    const { profiles } = await get("/api/profiles");
    $("#profile-table tbody").replaceChildren(...profiles.map((p) => el("tr", { "data-profile": p.name },
      el("td", {}, p.name, p.description ? el("div", { class: "muted" }, p.description) : null),
      el("td", {}, p.kind, p.target ? ` (${p.target})` : ""),
      el("td", {}, p.entries.map(entryText).join(", ") || "–"),
      el("td", { class: p.active ? "on" : "off" }, p.active ? "active" : "no"),
      el("td", {},
        el("button", { onclick: act(async () => { await send("POST", `/api/profiles/${encodeURIComponent(p.name)}/activate`); await loadProfiles(); }) }, "Activate"),
        p.kind === "features" ? el("button", { onclick: act(async () => { await send("DELETE", `/api/profiles/${encodeURIComponent(p.name)}`); await loadProfiles(); }) }, "Delete") : null))));
  }

  const options = (values) => values.map((v) => el("option", { value: v }, v || "always"));

  function entryRow(layer, feature, strength) {
    const row = el("tr", {},
      el("td", {}, el("input", { type: "number", class: "e-layer", value: layer ?? 0 })),
      el("td", {}, el("input", { type: "number", class: "e-feature", value: feature ?? 0 })),
      el("td", {}, el("select", { class: "e-mode" }, ...options(["add", "clamp", "ablate", "abort_when"]))),
      el("td", {}, el("input", { type: "number", step: "any", class: "e-strength", value: strength ?? 3,
        title: "add: strength; clamp: value" })),
      el("td", {}, el("select", { class: "e-when" }, ...options(["", "after_text", "from_position", "feature", "probe"]))),
      el("td", {}, el("input", { class: "e-when-arg", size: 12, title: "the text, position, feature index or probe name" })),
      el("td", {}, el("input", { type: "number", step: "any", class: "e-when-above", size: 5, title: "feature: the activation it must exceed" })),
      el("td", {}));
    row.lastChild.append(el("button", { type: "button", onclick: () => row.remove() }, "Remove"));
    $("#entry-table tbody").append(row);
  }

  // A row as the API takes it; the engine checks every field and names the bad one.
  function entryOf(r) {
    const value = (cls) => r.querySelector(cls).value;
    const kind = value(".e-when"), arg = value(".e-when-arg");
    let when = null;
    if (kind === "after_text" || kind === "probe") when = { [kind]: arg };
    else if (kind === "from_position") when = { from_position: Number(arg) };
    else if (kind === "feature") {
      when = { feature: Number(arg), above: Number(value(".e-when-above")), layer: Number(value(".e-layer")) };
    }
    const mode = value(".e-mode");
    if (mode === "abort_when") return { abort_when: when };
    const entry = { layer: Number(value(".e-layer")), feature: Number(value(".e-feature")) };
    if (mode === "add") entry.strength = Number(value(".e-strength"));
    else entry.mode = mode;
    if (mode === "clamp") entry.value = Number(value(".e-strength"));
    if (when) entry.when = when;
    return entry;
  }

  $("#add-entry").addEventListener("click", () => entryRow());
  $("#deactivate-profile").addEventListener("click", act(async () => { await send("DELETE", "/api/profiles/active"); await loadProfiles(); }));
  $("#profile-form").addEventListener("submit", act(async () => {
    const entries = [...document.querySelectorAll("#entry-table tbody tr")].map(entryOf);
    const name = $("#profile-name").value.trim();
    await send("POST", "/api/profiles", { name, description: $("#profile-description").value, entries });
    if ($("#activate-new").checked) await send("POST", `/api/profiles/${encodeURIComponent(name)}/activate`);
    $("#entry-table tbody").replaceChildren();
    $("#profile-name").value = "";
    await loadProfiles();
  }));
  C.featureTargets.profile = (sae, index) => entryRow(sae.layer, index, 3);
  C.onTab("profiles", loadProfiles);

  // -- clusters and circuits ------------------------------------------------------------------
  function dial(kind, item, max) {
    const value = el("span", {}, item.intensity.toFixed(2));
    const slider = el("input", { type: "range", min: 0, max, step: 0.05, value: item.intensity, "data-dial": item.name,
      oninput: (e) => { value.textContent = Number(e.target.value).toFixed(2); },
      onchange: act(async (e) => {
        const reply = await send("PUT", `/api/${kind}/${encodeURIComponent(item.name)}/intensity`, { intensity: Number(e.target.value) });
        value.textContent = `${reply[kind.slice(0, -1)].intensity.toFixed(2)} (${reply.liveness.live ? "live" : reply.liveness.reason})`;
      }) });
    return el("span", {}, slider, " ", value);
  }
  const rangeText = (r) => (r ? `[${r.min}, ${r.max}]` : "none");

  async function loadClusters() {
    const [{ clusters }, { circuits }, active] = await Promise.all([get("/api/clusters"), get("/api/circuits"), get("/api/circuits/active")]);
    $("#cluster-table tbody").replaceChildren(...clusters.map((c) => el("tr", {},
      el("td", {}, c.name), el("td", {}, c.members.map(entryText).join(", ")),
      el("td", {}, rangeText(c.intensity_range)), el("td", {}, dial("clusters", c, c.intensity_range ? Math.min(c.intensity_range.max, 2) : 2)))));
    $("#circuit-table tbody").replaceChildren(...circuits.map((c) => el("tr", {},
      el("td", {}, c.name), el("td", {}, `${c.rung}: ${c.rung_language}`), el("td", {}, c.mode),
      el("td", {}, c.members.map(entryText).join(", ")),
      el("td", {}, dial("circuits", c, c.intensity_range ? Math.min(c.intensity_range.max, 2) : 2)),
      el("td", {}, el("button", { onclick: act(async () => { await send("POST", `/api/circuits/${encodeURIComponent(c.name)}/activate`); await loadClusters(); }) }, "Activate")))));
    const s = active.steering;
    $("#active-circuit").textContent = active.circuit
      ? `Active circuit: ${active.circuit.name}: ${s.steering ? `steering at λ ${s.intensity}, rung ${s.rung} (${s.language})` : `not steering: ${s.reason}`}`
      : "No circuit is active.";
  }

  function importDocument(kind) {
    return act(async () => {
      let doc;
      try { doc = JSON.parse($("#document").value); } catch (err) { C.showError(`The document is not JSON: ${err.message}`); return; }
      await send("POST", `/api/${kind}`, doc);
      await loadClusters();
    });
  }
  $("#import-cluster").addEventListener("click", importDocument("clusters"));
  $("#import-circuit").addEventListener("click", importDocument("circuits"));
  C.onTab("clusters", loadClusters);

  // -- monitoring -----------------------------------------------------------------------------
  async function loadMonitoring() {
    const { monitoring: m } = await get("/api/monitoring");
    $("#monitor-model").textContent = m.model;
    $("#monitor-switch").checked = m.enabled;
    $("#monitor-state").textContent = m.active ? "Reading every generation of this model." : `Not reading: ${m.reason}.`;
    $("#monitor-total").textContent = m.total_requests;
    $("#monitor-window").textContent = m.window_requests;
    const stats = Object.fromEntries(m.probe_stats.map((s) => [s.probe, s]));
    $("#probe-table tbody").replaceChildren(...m.probes.map((p) => {
      const s = stats[p.name] || { requests: 0, fired: 0, hit_rate: 0, total_requests: 0, total_fired: 0 };
      return el("tr", { "data-probe": p.name },
        el("td", {}, p.name), el("td", {}, `${p.sae_id} (L${p.layer})`),
        el("td", {}, p.features.map((f) => `#${f.index} (${f.weight})`).join(", ")), el("td", {}, p.threshold),
        el("td", { class: p.reading ? "on" : "off" }, p.reading ? "yes" : p.reason),
        el("td", { class: "window" }, `${s.fired} / ${s.requests}`), el("td", {}, `${(s.hit_rate * 100).toFixed(0)}%`),
        el("td", { class: "total" }, `${s.total_fired} / ${s.total_requests}`),
        el("td", {}, el("button", { onclick: act(async () => { await send("DELETE", `/api/probes/${encodeURIComponent(p.name)}`); await loadMonitoring(); }) }, "Delete")));
    }));
    $("#frequency-table tbody").replaceChildren(...m.feature_frequencies.map((f) => el("tr", {},
      el("td", {}, f.sae_id), el("td", {}, `#${f.index}`), el("td", {}, f.tokens), el("td", {}, `${(f.frequency * 100).toFixed(1)}%`))));
  }

  // "35" or "31:1, 23:0.5" -> the probe's feature fields.
  function probeFeatures(text) {
    const parts = text.split(",").map((p) => p.trim()).filter(Boolean);
    if (parts.length === 1 && !parts[0].includes(":")) return { feature: Number(parts[0]) };
    return { features: parts.map((p) => { const [index, weight] = p.split(":"); return { index: Number(index), weight: Number(weight ?? 1) }; }) };
  }

  $("#monitor-switch").addEventListener("change", act(async (e) => {
    await send("PUT", "/api/monitoring", { enabled: e.target.checked });
    await loadMonitoring();
  }));
  $("#probe-form").addEventListener("submit", act(async () => {
    const threshold = $("#probe-threshold").value;
    await send("POST", "/api/probes", { name: $("#probe-name").value.trim(), sae_id: $("#probe-sae").value,
      ...probeFeatures($("#probe-features").value), threshold: threshold === "" ? null : Number(threshold) });
    $("#probe-name").value = "";
    await loadMonitoring();
  }));
  C.featureTargets.probe = (sae, index) => {
    $("#probe-sae").value = sae.id;
    $("#probe-features").value = String(index);
    $("#probe-name").value = `feature-${index}`;
  };
  C.onTab("monitoring", loadMonitoring);
  // Live counters while the tab is shown (a failed refresh is in the banner).
  setInterval(() => { if (C.currentTab() === "monitoring" && !document.hidden) loadMonitoring().catch(() => {}); }, 2000);
})();
