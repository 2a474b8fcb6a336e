// The genai chat page: streams replies from this server's /v1/chat/completions (the OpenAI
// API any client uses), renders them as Markdown, stops them on request, sends the API key
// the user enters when the server has one, and attaches images (file picker, paste, drop) for
// a model that takes them, refusing those the server would refuse before anything is sent.
// Written for genai (MIT like the package).
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
    // /webui/config.json; the limits are genai's defaults until it answers
    config: {
      api_key_required: false, accepts_images: false, max_body_bytes: 4 << 20,
      max_image_bytes: 20 << 20, max_images: 16, max_image_side: 16384,
      max_image_pixels: 100000000, image_types: ["image/png", "image/jpeg"],
    },
    key: sessionStorage.getItem(KEY_STORE) || "",
    model: null,
    history: [], // {role, content} as sent to the API
    images: [], // {url (a data: URL), name, bytes} attached to the next message
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
    return (await errorDetails(response)).message;
  }

  // The message and code of an API error (OpenAI's body), or the HTTP status.
  async function errorDetails(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) {
        return { message: body.error.message, code: body.error.code || null };
      }
    } catch (e) {
      /* not JSON */
    }
    return { message: `HTTP ${response.status}`, code: null };
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
    if (images && images.length) {
      const strip = document.createElement("div");
      strip.className = "images";
      for (const image of images) {
        const img = document.createElement("img");
        img.src = image.url;
        img.alt = image.name || "attached image";
        img.title = image.name || "";
        strip.appendChild(img);
      }
      box.appendChild(strip);
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

  // Send and Stop trade places: keyboard focus on the one hidden (or lost) moves to Stop while
  // a reply streams, and back to the message box after; focus elsewhere stays where it is.
  function setBusy(busy) {
    const active = document.activeElement;
    const lost = !active || active === document.body || active === $(busy ? "send" : "stop");
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("prompt").disabled = false;
    document.body.dataset.busy = busy ? "1" : "";
    if (lost) $(busy ? "stop" : "prompt").focus();
  }

  function userContent(text, images) {
    if (!images.length) return text;
    // OpenAI's content parts, the images first (each becomes the model's image tag, in order),
    // as data: URLs: what vision-language serving reads.
    const parts = images.map((image) => ({ type: "image_url", image_url: { url: image.url } }));
    if (text) parts.push({ type: "text", text });
    return parts;
  }

  function requestBody(history) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...history);
    const body = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      ...samplingOptions(),
    };
    if (state.model) body.model = state.model;
    return body;
  }

  // --- one reply --------------------------------------------------------------------------------
  // Sends ``text`` with the attached images; false (nothing sent, the message kept in the
  // composer) when the request would be larger than the server takes.
  function send(text) {
    const message = { role: "user", content: userContent(text, state.images) };
    const size = new Blob([JSON.stringify(requestBody([...state.history, message]))]).size;
    if (size > state.config.max_body_bytes) {
      // said for what the request holds: images, earlier turns, or this message alone
      let what = "This message makes";
      let fix = "Shorten the message.";
      if (imagesInConversation() + state.images.length > 0) {
        what = "This message and the conversation's images make";
        fix = "Remove an image or start a new chat.";
      } else if (state.history.length > 0) {
        what = "This message and the conversation make";
        fix = "Shorten the message or start a new chat.";
      }
      showImageError(
        `${what} a ${formatBytes(size)} request; the server takes at most ` +
          `${formatBytes(state.config.max_body_bytes)} (genai serve --max-body-bytes). ${fix}`
      );
      return false;
    }
    const images = state.images.splice(0);
    renderAttachments();
    showImageError("");
    state.history.push(message);
    const userBox = addMessage("user", text, images);
    userBox.message = message; // what the history holds for it
    reply(userBox);
    return true;
  }

  async function reply(userBox) {
    // The conversation this reply belongs to: New chat starts another one while it may still
    // stream, and what it ends with (its text, a refused message) stays in its own.
    const history = state.history;
    const box = addMessage("assistant", "");
    const content = box.querySelector(".content");
    content.classList.add("cursor");
    // #chat is a polite live region: a streaming reply is announced once, when it ends, not
    // again at each token (each re-renders the whole reply).
    box.setAttribute("aria-busy", "true");
    const body = requestBody(history);
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    let text = "";
    let chunks = 0;
    let usage = null;
    let first = null;
    const started = performance.now();
    let outcome = "done";
    let finish = null; // the server's finish_reason: "length" when a limit cut the reply
    let refused = false; // the server refused the request (4xx): nothing was generated
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
      if (!response.ok) {
        refused = response.status >= 400 && response.status < 500;
        const details = await errorDetails(response);
        const failure = new Error(details.message);
        if (details.code === "context_length_exceeded") {
          failure.hint = " New chat starts a fresh conversation.";
        }
        throw failure;
      }
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
            if (choice && choice.finish_reason) finish = choice.finish_reason;
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
        let note = "";
        if (refused && userBox && userBox.message) {
          // A refused message (a bad image, too long a prompt) leaves the conversation, so
          // that the next one, sent with the history, is not refused for it again.
          const at = history.indexOf(userBox.message);
          if (at >= 0) history.splice(at, 1);
          userBox.classList.add("refused");
          userBox.title = "not sent: the server refused it";
          note = " (this message is left out of the conversation)";
        }
        setStats(box, "error: " + error.message + note + (error.hint || ""));
      }
    } finally {
      content.classList.remove("cursor");
      box.setAttribute("aria-busy", "false");
      if (state.controller === controller) {
        state.controller = null;
        setBusy(false);
      }
    }
    if (outcome === "auth") return;
    if (text) history.push({ role: "assistant", content: text });
    box.dataset.outcome = outcome;
    if (outcome === "error") return;
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const decode = first !== null && tokens > 1 ? (tokens - 1) / ((end - first) / 1000) : null;
    const parts = [`${usage ? "" : "~"}${tokens} tokens`];
    if (decode !== null) parts.push(`${decode.toFixed(1)} tok/s`);
    if (first !== null) parts.push(`first token ${((first - started) / 1000).toFixed(2)} s`);
    if (outcome === "stopped") parts.push("stopped");
    if (outcome === "done" && finish === "length") {
      // cut by the max tokens setting, or by the model's context (the conversation is full)
      parts.push(body.max_tokens ? "cut at max tokens" : "cut: the conversation filled the " +
        "model's context; New chat starts a fresh one");
      box.dataset.finish = "length";
    }
    box.dataset.tokens = String(tokens);
    setStats(box, parts.join(" · "));
  }

  // --- images (models that take them) -----------------------------------------------------------
  function formatBytes(n) {
    if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
    if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
    return `${n} bytes`;
  }

  function showImageError(message) {
    $("image-error").textContent = message;
    $("image-error").hidden = !message;
  }

  function renderAttachments() {
    const holder = $("attachments");
    holder.replaceChildren();
    state.images.forEach((image, index) => {
      const item = document.createElement("span");
      item.className = "attachment";
      const img = document.createElement("img");
      img.src = image.url;
      img.alt = image.name;
      img.title = `${image.name} (${formatBytes(image.bytes)})`;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.title = "remove " + image.name;
      remove.setAttribute("aria-label", "remove " + image.name);
      remove.addEventListener("click", () => {
        state.images.splice(index, 1);
        renderAttachments();
      });
      item.append(img, remove);
      holder.appendChild(item);
    });
    holder.hidden = state.images.length === 0;
  }

  function readAs(file, how) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      if (how === "url") reader.readAsDataURL(file);
      else reader.readAsArrayBuffer(file);
    });
  }

  // The file's type from its first bytes, as the server's decoder tells PNG from JPEG.
  function sniffType(head) {
    const b = new Uint8Array(head);
    const png = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
    if (b.length >= 8 && png.every((v, i) => b[i] === v)) return "image/png";
    if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "image/jpeg";
    return null;
  }

  function imageSize(url) {
    return new Promise((resolve) => {
      const img = new Image();
      img.onload = () => resolve({ width: img.naturalWidth, height: img.naturalHeight });
      img.onerror = () => resolve(null);
      img.src = url;
    });
  }

  function imagesInConversation() {
    let count = 0;
    for (const message of state.history) {
      if (Array.isArray(message.content)) {
        count += message.content.filter((part) => part.type === "image_url").length;
      }
    }
    return count;
  }

  // Why the server would refuse ``file`` (a message for the user), or its attachment.
  async function checkImage(file) {
    const c = state.config;
    const name = file.name || "the pasted image";
    if (imagesInConversation() + state.images.length >= c.max_images) {
      return `"${name}" not attached: the server takes at most ${c.max_images} images per ` +
        "request, and every image of the conversation is sent again. Start a new chat.";
    }
    if (file.size > c.max_image_bytes) {
      return `"${name}" is ${formatBytes(file.size)}; the server takes images up to ` +
        `${formatBytes(c.max_image_bytes)}.`;
    }
    const type = sniffType(await readAs(file.slice(0, 8), "buffer"));
    if (!type || !c.image_types.includes(type)) {
      return `"${name}" is not a PNG or JPEG file (the images the server reads).`;
    }
    const url = await readAs(file, "url");
    const size = await imageSize(url);
    if (!size) return `"${name}" could not be read as an image.`;
    const { width, height } = size;
    if (width > c.max_image_side || height > c.max_image_side || width * height > c.max_image_pixels) {
      return `"${name}" is ${width}x${height} pixels; the server takes at most ` +
        `${c.max_image_side} pixels a side and ${c.max_image_pixels.toLocaleString("en")} in all.`;
    }
    // the type the data URL says is what the file is
    return { url: url.replace(/^data:[^;,]*/, "data:" + type), name, bytes: file.size };
  }

  async function attach(files) {
    const errors = [];
    for (const file of files) {
      const checked = await checkImage(file);
      if (typeof checked === "string") errors.push(checked);
      else state.images.push(checked);
    }
    showImageError(errors.join(" "));
    renderAttachments();
  }

  function imageFiles(transfer) {
    if (!transfer) return [];
    return Array.from(transfer.files || []).filter((file) => file.type.startsWith("image/"));
  }

  // --- wiring -----------------------------------------------------------------------------------
  async function start() {
    loadSettings();
    try {
      const response = await fetch("webui/config.json");
      if (response.ok) state.config = { ...state.config, ...(await response.json()) };
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
    if (send(text)) $("prompt").value = "";
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
    if (state.controller) {
      // the reply ends in the old conversation (its own history array) and leaves the page be
      state.controller.abort();
      state.controller = null;
      setBusy(false);
    }
    state.history = [];
    state.images = [];
    renderAttachments();
    showImageError("");
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
    const retry = state.onKey;
    state.onKey = null;
    $("key-dialog").close();
    $("prompt").focus();
    if (retry) retry();
  });
  // Escape cannot dismiss the dialog while a key is awaited: Chromium ignores preventDefault on
  // the cancel event before any user activation, so a close then opens it again.
  $("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("key-dialog").addEventListener("close", () => {
    if (!state.onKey) return;
    $("key-dialog").showModal();
    $("key-input").focus();
  });
  $("image-input").addEventListener("change", async (event) => {
    const files = Array.from(event.target.files);
    event.target.value = "";
    await attach(files);
  });
  // Pasted or dropped images (a pasted text stays the textarea's).
  $("prompt").addEventListener("paste", (event) => {
    const files = imageFiles(event.clipboardData);
    if (!state.config.accepts_images || !files.length) return;
    event.preventDefault();
    attach(files);
  });
  $("composer").addEventListener("dragover", (event) => {
    if (state.config.accepts_images) event.preventDefault();
  });
  $("composer").addEventListener("drop", (event) => {
    const files = imageFiles(event.dataTransfer);
    if (!state.config.accepts_images || !files.length) return;
    event.preventDefault();
    attach(files);
  });

  start();
})();
