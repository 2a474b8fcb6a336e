// The genai chat page: streams replies from this server's /v1/chat/completions (the OpenAI
// API any client uses), renders them as Markdown, stops them on request, and sends the API key
// the user enters when the server has one. Written for genai (MIT like the package).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "genai-api-key"; // sessionStorage: forgotten when the tab closes
  const SETTINGS_STORE = "genai-chat-settings";
  const NUMBER_FIELDS = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed"];
  const DEFAULTS = {
    system: "", temperature: "0.7", top_p: "0.95", top_k: "40", min_p: "0",
    repetition_penalty: "1", max_tokens: "512", seed: "",
  };

  const state = {
    config: { api_key_required: false, accepts_images: false },
    key: sessionStorage.getItem(KEY_STORE) || "",
    model: null,
    history: [], // {role, content} as sent to the API
    images: [], // data URLs attached to the next message (vision models)
    controller: null,
    onKey: null, // what to retry once a key is entered
  };

  // --- settings ---------------------------------------------------------------------------------
  function loadSettings() {
    let saved = {};
    try {
      saved = JSON.parse(localStorage.getItem(SETTINGS_STORE) || "{}");
    } catch (e) {
      saved = {};
    }
    for (const [name, value] of Object.entries({ ...DEFAULTS, ...saved })) {
      if ($(name)) $(name).value = value;
    }
  }

  function saveSettings() {
    const values = {};
    for (const name of Object.keys(DEFAULTS)) values[name] = $(name).value;
    localStorage.setItem(SETTINGS_STORE, JSON.stringify(values));
  }

  function samplingOptions() {
    const options = {};
    for (const name of NUMBER_FIELDS) {
      const raw = $(name).value.trim();
      if (raw === "") continue;
      const value = Number(raw);
      if (!Number.isFinite(value)) continue;
      options[name] = ["top_k", "max_tokens", "seed"].includes(name) ? Math.round(value) : value;
    }
    return options;
  }

  // --- the API ----------------------------------------------------------------------------------
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (state.key) h.Authorization = "Bearer " + state.key;
    return h;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) {
      /* not JSON */
    }
    return `HTTP ${response.status}`;
  }

  function askForKey(message, retry) {
    state.onKey = retry;
    $("key-error").hidden = !message;
    $("key-error").textContent = message || "";
    $("key-input").value = "";
    if (!$("key-dialog").open) $("key-dialog").showModal();
    $("key-input").focus();
  }

  // The model's id (what requests name), then ``after``; a 401 asks for the key first.
  async function loadModel(after) {
    const response = await fetch("v1/models", { headers: headers() });
    if (response.status === 401) {
      askForKey(state.key ? await errorMessage(response) : "", () => loadModel(after));
      return;
    }
    if (!response.ok) {
      $("model").textContent = await errorMessage(response);
      return;
    }
    const body = await response.json();
    const model = body.data && body.data[0];
    state.model = model ? model.id : null;
    $("model").textContent = model ? model.id : "";
    $("forget-key").hidden = !state.key;
    if (after) after();
  }

  // --- messages ---------------------------------------------------------------------------------
  function scrollDown() {
    const chat = $("chat");
    chat.scrollTop = chat.scrollHeight;
  }

  function addMessage(role, text, images) {
    $("empty").hidden = true;
    const box = document.createElement("div");
    box.className = "message " + role;
    box.dataset.role = role;
    for (const url of images || []) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "attached image";
      box.appendChild(img);
    }
    const content = document.createElement("div");
    content.className = "content";
    if (role === "assistant") content.innerHTML = window.GenaiMarkdown.render(text);
    else content.textContent = text;
    box.appendChild(content);
    $("messages").appendChild(box);
    scrollDown();
    return box;
  }

  function setStats(box, text) {
    let stats = box.querySelector(".stats");
    if (!stats) {
      stats = document.createElement("div");
      stats.className = "stats";
      box.appendChild(stats);
    }
    stats.textContent = text;
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("prompt").disabled = false;
    document.body.dataset.busy = busy ? "1" : "";
  }

  function userContent(text, images) {
    if (!images.length) return text;
    // OpenAI's content parts: what vision-language serving reads.
    return [{ type: "text", text }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))];
  }

  // --- one reply --------------------------------------------------------------------------------
  async function send(text) {
    const images = state.images.splice(0);
    renderAttachments();
    state.history.push({ role: "user", content: userContent(text, images) });
    const userBox = addMessage("user", text, images);
    await reply(userBox);
  }

  async function reply(userBox) {
    const box = addMessage("assistant", "");
    const content = box.querySelector(".content");
    content.classList.add("cursor");
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...state.history);
    const body = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      ...samplingOptions(),
    };
    if (state.model) body.model = state.model;
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    let text = "";
    let chunks = 0;
    let usage = null;
    let first = null;
    const started = performance.now();
    let outcome = "done";
    try {
      const response = await fetch("v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (response.status === 401) {
        // Not sent: take the message back and retry it once a key is entered.
        box.remove();
        const message = await errorMessage(response);
        askForKey(state.key ? message : "", () => loadModel(() => reply(userBox)));
        outcome = "auth";
        return;
      }
      if (!response.ok) throw new Error(await errorMessage(response));
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const parsed = JSON.parse(data);
            if (parsed.error) throw new Error(parsed.error.message || "generation failed");
            if (parsed.usage) usage = parsed.usage;
            const choice = parsed.choices && parsed.choices[0];
            const delta = choice && choice.delta && choice.delta.content;
            if (delta) {
              if (first === null) first = performance.now();
              chunks += 1;
              text += delta;
              content.innerHTML = window.GenaiMarkdown.render(text);
              scrollDown();
            }
          }
        }
      }
    } catch (error) {
      if (error.name === "AbortError") {
        outcome = "stopped";
      } else {
        outcome = "error";
        box.classList.add("error");
        setStats(box, "error: " + error.message);
      }
    } finally {
      content.classList.remove("cursor");
      state.controller = null;
      setBusy(false);
    }
    if (outcome === "auth") return;
    if (text) state.history.push({ role: "assistant", content: text });
    box.dataset.outcome = outcome;
    if (outcome === "error") return;
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const decode = first !== null && tokens > 1 ? (tokens - 1) / ((end - first) / 1000) : null;
    const parts = [`${usage ? "" : "~"}${tokens} tokens`];
    if (decode !== null) parts.push(`${decode.toFixed(1)} tok/s`);
    if (first !== null) parts.push(`first token ${((first - started) / 1000).toFixed(2)} s`);
    if (outcome === "stopped") parts.push("stopped");
    box.dataset.tokens = String(tokens);
    setStats(box, parts.join(" · "));
  }

  // --- images (vision models) -------------------------------------------------------------------
  function renderAttachments() {
    const holder = $("attachments");
    holder.replaceChildren();
    for (const url of state.images) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "image to send";
      holder.appendChild(img);
    }
    holder.hidden = state.images.length === 0;
  }

  function readImage(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  // --- wiring -----------------------------------------------------------------------------------
  async function start() {
    loadSettings();
    try {
      const response = await fetch("webui/config.json");
      if (response.ok) state.config = await response.json();
    } catch (e) {
      /* an older server: no config, no key asked up front */
    }
    $("attach").hidden = !state.config.accepts_images;
    if (state.config.api_key_required && !state.key) askForKey("", () => loadModel());
    else await loadModel();
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    if (state.controller) return;
    const text = $("prompt").value.trim();
    if (!text && !state.images.length) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
  });
  $("new-chat").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    $("messages").replaceChildren();
    $("empty").hidden = false;
  });
  $("toggle-settings").addEventListener("click", () => {
    const panel = $("settings");
    panel.hidden = !panel.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!panel.hidden));
  });
  $("settings").addEventListener("input", saveSettings);
  $("reset-settings").addEventListener("click", () => {
    localStorage.removeItem(SETTINGS_STORE);
    loadSettings();
  });
  $("forget-key").addEventListener("click", () => {
    state.key = "";
    sessionStorage.removeItem(KEY_STORE);
    $("forget-key").hidden = true;
    if (state.config.api_key_required) askForKey("", () => loadModel());
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    state.key = key;
    sessionStorage.setItem(KEY_STORE, key);
    $("key-dialog").close();
    const retry = state.onKey;
    state.onKey = null;
    if (retry) retry();
  });
  $("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("image-input").addEventListener("change", async (event) => {
    for (const file of event.target.files) state.images.push(await readImage(file));
    event.target.value = "";
    renderAttachments();
  });

  start();
})();
