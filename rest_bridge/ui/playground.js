// The playground: one prompt sent twice with the same seed, unsteered and
// steered by the profile "console-playground" (written here through the
// management API), each reading the chosen features' activations at every
// generated token; both texts, the applied λ, and a heat-map per token.
"use strict";

(() => {
  const C = window.Console;
  const { $, el, act } = C;
  const PROFILE = "console-playground";
  let last = null; // {features, sides: {unsteered, steered}} of the last run

  const featureList = () => $("#pg-features").value.split(",").map((f) => f.trim()).filter(Boolean).map(Number);

  // The steering profile this run uses: created, or its entries replaced.
  async function writeProfile(sae, feature, strength) {
    const entries = [{ layer: sae.layer, feature, strength, sae_id: sae.id }];
    const { profiles } = await C.get("/api/profiles");
    if (profiles.some((p) => p.name === PROFILE)) {
      await C.send("PATCH", `/api/profiles/${PROFILE}`, { entries });
    } else {
      await C.send("POST", "/api/profiles", { name: PROFILE, entries,
        description: "written by the console's playground" });
    }
  }

  async function complete(body) {
    const { data, headers } = await C.api("POST", "/v1/chat/completions", body);
    return { body: data, lambda: headers.get("X-miLLM-Steering-Intensity") };
  }

  // Whether the loaded model returns log-probabilities of generated text
  // (GGUF models do not): GetCapabilities' `logprobs` feature says.
  async function logprobsServed() {
    const caps = await C.get("/api/capabilities");
    return Boolean(caps.features && caps.features.logprobs);
  }

  // Token texts by absolute position (generated tokens only, from logprobs;
  // without them, the ids the readout names), and each position's
  // activation of every chosen feature.
  function sideOf(reply) {
    const choice = reply.body.choices[0];
    const start = reply.body.usage.prompt_tokens;
    const read = (reply.body.millm && reply.body.millm.sae_activations) || { positions: [] };
    const tokens = choice.logprobs && choice.logprobs.content
      ? choice.logprobs.content.map((t) => t.token)
      : read.positions.filter((p) => p.position >= start).map((p) => `⟨${p.token_id}⟩`);
    const values = {};
    for (const p of read.positions) values[p.position] = Object.fromEntries(p.features.map((f) => [f.index, f.value]));
    return { text: choice.message.content || "", start, tokens, values, lambda: reply.lambda,
      verdicts: (reply.body.millm && reply.body.millm.probe_verdicts) || [] };
  }

  function heat(side, feature, peak) {
    return side.tokens.map((token, i) => {
      const v = (side.values[side.start + i] || {})[feature];
      const alpha = v === undefined || peak <= 0 ? 0 : Math.max(0, v) / peak;
      return el("span", { title: v === undefined ? "not read (the last sampled token is never fed back)" : `feature ${feature}: ${v.toFixed(3)}`,
        style: `background: rgba(255, 140, 0, ${alpha.toFixed(3)})` }, token);
    });
  }

  function drawHeat() {
    if (!last) return;
    const feature = Number($("#pg-heat-feature").value);
    const sides = [last.sides.unsteered, last.sides.steered];
    const peak = Math.max(0, ...sides.flatMap((s) => Object.values(s.values).map((v) => v[feature] ?? 0)));
    for (const [id, side] of [["#pg-unsteered-heat", last.sides.unsteered], ["#pg-steered-heat", last.sides.steered]]) {
      $(id).dataset.label = `feature #${feature} at ${last.readPoint}, per generated token (darker: stronger; peak ${peak.toFixed(2)})`;
      $(id).replaceChildren(...heat(side, feature, peak));
    }
  }

  function verdictLine(side) {
    if (!side.verdicts.length) return null;
    return el("p", { class: "muted" }, "probes: ", side.verdicts.map((v) =>
      `${v.probe} ${v.fired ? `fired at ${v.first_position}` : "quiet"} (peak ${v.peak.toFixed(2)})`).join(" · "));
  }

  $("#pg-form").addEventListener("submit", act(async () => {
    const sae = C.saeById($("#pg-sae").value);
    const features = featureList();
    if (!sae || !features.length || features.some((f) => !Number.isInteger(f))) {
      C.showError("Choose an SAE and at least one feature index (comma-separated integers).");
      return;
    }
    if (!sae.attached) {
      C.showError(`${sae.id} is not attached: attach it on the SAEs tab first.`);
      return;
    }
    $("#pg-run").disabled = true;
    try {
      await writeProfile(sae, features[0], Number($("#pg-strength").value));
      const base = {
        model: C.model || "millm-tiny", messages: [{ role: "user", content: $("#pg-prompt").value }],
        max_tokens: Number($("#pg-tokens").value), temperature: Number($("#pg-temperature").value),
        seed: Number($("#pg-seed").value), logprobs: await logprobsServed(),
        return_sae_activations: { sae_id: sae.id, features, top_k: Math.min(features.length, 64), positions: "completion",
          read_point: $("#pg-read-point").value },
      };
      const [unsteered, steered] = await Promise.all([
        complete({ ...base, steering_intensity: "off" }),
        complete({ ...base, profile: PROFILE, steering_intensity: Number($("#pg-lambda").value) }),
      ]);
      last = { features, readPoint: $("#pg-read-point").value, sides: { unsteered: sideOf(unsteered), steered: sideOf(steered) } };
      $("#pg-unsteered-text").replaceChildren(last.sides.unsteered.text, verdictLine(last.sides.unsteered) || "");
      $("#pg-steered-text").replaceChildren(last.sides.steered.text, verdictLine(last.sides.steered) || "");
      $("#pg-lambda-applied").textContent = last.sides.steered.lambda === null
        ? "not steered (no SAE at that layer, or the dial changed nothing)"
        : `${last.sides.steered.lambda} (feature ${features[0]} at strength ${$("#pg-strength").value} × λ)`;
      const select = $("#pg-heat-feature");
      const kept = Number(select.value);
      select.replaceChildren(...features.map((f) => el("option", { value: f }, `#${f}`)));
      if (features.includes(kept)) select.value = kept;
      drawHeat();
    } finally {
      $("#pg-run").disabled = false;
    }
  }));
  $("#pg-heat-feature").addEventListener("change", drawHeat);
  C.featureTargets.playground = (sae, index) => {
    $("#pg-sae").value = sae.id;
    $("#pg-features").value = String(index);
  };
  C.onTab("playground", async () => { if (!C.saes.length) await C.loadSaes(); });
})();
