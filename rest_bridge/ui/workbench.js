// The workbench: from an idea to a steering vector without leaving the
// server. Feature search (words, an example, decoder neighbours), a
// feature's card with its explanation, a control vector built from
// contrasting prompts (with its progress and a cancel), and one
// steering_compare call showing the steered and unsteered texts with the
// KL divergence of each steered token.
"use strict";

(() => {
  const C = window.Console;
  const { $, el, act } = C;
  const enc = encodeURIComponent;

  const sae = () => C.saeById($("#wb-sae").value);

  // -- search ----------------------------------------------------------------------------
  $("#wb-search-form").addEventListener("submit", act(async () => {
    const s = sae();
    if (!s) { C.showError("Choose an SAE first."); return; }
    const mode = $("#wb-mode").value;
    const raw = $("#wb-query").value;
    const body = { limit: 20 };
    body[mode] = mode === "neighbours_of" ? Number(raw) : raw;
    const found = await C.send("POST", `/api/saes/${enc(s.id)}/search`, body);
    $("#wb-count").textContent = `${found.total} feature${found.total === 1 ? "" : "s"}`;
    $("#wb-results").replaceChildren(...found.data.map((m) => el("div", { class: "feature", "data-match": m.index },
      el("div", { class: "head" }, el("b", {}, `#${m.index}`), el("span", { class: "muted" }, `score ${m.score.toFixed(3)}`),
        el("button", { "data-card": m.index, onclick: act(() => openCard(s, m.index)) }, "Card"),
        el("button", { onclick: () => C.useFeature(s, m.index, "profile") }, "Add to new profile")))));
    // By example: each token with its strongest features.
    $("#wb-tokens").replaceChildren(...(found.tokens || []).map((t) => el("span", {
      title: t.features.map((f) => `#${f.index} ${f.score.toFixed(2)}`).join(", ") || "nothing fires",
      style: `background: rgba(47, 91, 211, ${t.features.length ? 0.15 : 0})`,
    }, t.token)));
  }));

  // -- card ------------------------------------------------------------------------------
  // Vocabulary strings: a byte-level BPE's leading space (Ġ) shown as ␣.
  const chips = (tokens) => tokens.map((t) => el("span", { class: "chip", title: `${t.value.toFixed(3)}` },
    t.token.replace(/^Ġ/, "␣")));

  async function openCard(s, index) {
    const card = await C.get(`/api/saes/${enc(s.id)}/features/${index}`);
    const explanation = card.explanation ? card.explanation.text : "";
    const box = el("input", { id: "wb-explanation", size: 60, value: explanation, placeholder: "what this feature means" });
    $("#wb-card").className = "feature";
    $("#wb-card").dataset.feature = index;
    $("#wb-card").replaceChildren(
      el("div", { class: "head" }, el("b", {}, `${s.id} #${index}`),
        el("span", { class: "muted" }, card.recorded
          ? `active on ${(card.density * 100).toFixed(1)}% of tokens · max ${card.max_activation.toFixed(2)}`
          : "no record of what it fires on")),
      el("p", {}, "Promotes ", el("span", { id: "wb-promoted" }, chips(card.promoted_tokens))),
      el("p", {}, "Suppresses ", el("span", {}, chips(card.suppressed_tokens))),
      ...card.top_contexts.slice(0, 5).map((e) => el("div", { class: "example" }, `${e.value.toFixed(2)}  …${e.left.slice(-40)}`,
        el("b", {}, e.token), `${e.right}…`)),
      el("div", { class: "row" }, el("label", { class: "wide" }, "Explanation", box),
        el("button", { id: "wb-save-explanation", onclick: act(async () => {
          await C.send("PUT", `/api/saes/${enc(s.id)}/features/${index}/explanation`, { text: box.value });
          await openCard(s, index);
        }) }, "Save")));
  }

  // -- vector from examples -------------------------------------------------------------------
  function pairs() {
    return $("#wb-pairs").value.split("\n").map((line) => line.trim()).filter(Boolean).map((line, i) => {
      const cut = line.indexOf("|");
      if (cut < 0) throw new Error(`Line ${i + 1} needs "positive | negative".`);
      return { positive: line.slice(0, cut).trim(), negative: line.slice(cut + 1).trim() };
    });
  }

  let watching = null;
  async function showProgress() {
    const { build } = await C.get("/api/control_vectors/build");
    $("#wb-progress").textContent = build
      ? `building ${build.name}: ${build.prompts_done} of ${build.prompts_total} prompts, ${build.elapsed_s.toFixed(1)} s${build.cancelling ? " (cancelling)" : ""}`
      : "";
  }

  $("#wb-vector-form").addEventListener("submit", act(async () => {
    const body = { name: $("#wb-vector-name").value, model: C.model || undefined, layer: Number($("#wb-vector-layer").value),
      method: $("#wb-vector-method").value, pairs: pairs() };
    $("#wb-build").disabled = true;
    watching = setInterval(() => showProgress().catch(() => {}), 500);
    try {
      const built = await C.send("POST", "/api/control_vectors", body);
      const v = built.control_vector;
      $("#wb-vector").replaceChildren(el("div", { class: "feature", "data-vector": v.id },
        el("div", { class: "head" }, el("b", {}, v.id), el("span", { class: "muted" },
          `layer ${built.layer} · ${built.method} · ${built.prompts} prompts · norm ${built.norm.toFixed(3)} · separation ${built.separation.toFixed(3)} · agreement ${(built.agreement * 100).toFixed(0)}%`)),
        el("p", {}, "Nearest SAE features: ", built.nearest_features.length
          ? built.nearest_features.map((n) => el("span", { class: "chip" }, `${n.sae_id} #${n.index} (${n.cosine.toFixed(2)})`))
          : el("span", { class: "muted" }, "none (no SAE attached at this layer)")),
        el("p", { class: "muted" }, `Use it in a profile: {"control_vector": "${v.id}", "scale": 1}`)));
      await loadProfiles();
    } finally {
      clearInterval(watching);
      $("#wb-build").disabled = false;
      $("#wb-progress").textContent = "";
    }
  }));
  $("#wb-cancel").addEventListener("click", act(async () => {
    const { cancelled } = await C.send("DELETE", "/api/control_vectors/build");
    $("#wb-progress").textContent = cancelled ? "cancelling…" : "no build is running";
  }));

  // -- side by side ---------------------------------------------------------------------------
  async function loadProfiles() {
    const { profiles } = await C.get("/api/profiles");
    const select = $("#wb-compare-profile");
    const kept = select.value;
    select.replaceChildren(el("option", { value: "" }, "(default steering)"),
      ...profiles.map((p) => el("option", { value: p.name }, p.name)));
    if (profiles.some((p) => p.name === kept)) select.value = kept;
  }

  $("#wb-compare-form").addEventListener("submit", act(async () => {
    const body = { model: C.model || "millm-tiny", messages: [{ role: "user", content: $("#wb-compare-prompt").value }],
      max_tokens: Number($("#wb-compare-tokens").value), temperature: Number($("#wb-compare-temperature").value),
      seed: Number($("#wb-compare-seed").value), steering_compare: true,
      steering_intensity: Number($("#wb-compare-lambda").value) };
    if ($("#wb-compare-profile").value) body.profile = $("#wb-compare-profile").value;
    $("#wb-compare").disabled = true;
    try {
      const reply = await C.send("POST", "/v1/chat/completions", body);
      $("#wb-steered").textContent = reply.choices[0].message.content || "";
      $("#wb-unsteered").textContent = reply.millm.unsteered.choices[0].message.content || "";
      const tokens = reply.millm.divergence[0].tokens;
      const peak = Math.max(1e-9, ...tokens.map((t) => t.kl));
      $("#wb-divergence").dataset.label = `KL(steered ‖ unsteered) per steered token (darker: more; peak ${peak.toFixed(3)} nats)`;
      $("#wb-divergence").replaceChildren(...tokens.map((t) => el("span", {
        title: `KL ${t.kl.toFixed(4)} · log-prob ${t.logprob.toFixed(3)} steered, ${t.unsteered_logprob.toFixed(3)} unsteered`,
        style: `background: rgba(180, 35, 24, ${(t.kl / peak).toFixed(3)})` }, t.token)));
    } finally {
      $("#wb-compare").disabled = false;
    }
  }));

  C.onTab("workbench", async () => {
    if (!C.saes.length) await C.loadSaes();
    await loadProfiles();
  });
})();
