// The session inspector: reads the session's events (and polls for new ones while it
// lives) and its replays with the page's own token, and keeps the video and the
// timeline in step: clicking an event seeks the video to it; playing the video marks
// the events of the moment shown. Every text shown comes from the browser's pages, so
// it is set as text, never parsed as HTML.
"use strict";

const query = new URLSearchParams(location.search);
const grant = `session_id=${encodeURIComponent(query.get("session_id") || "")}&jwt=${encodeURIComponent(query.get("jwt") || "")}`;
const events = [];
const shownCategories = new Set();
let lastSeq = 0;
let replay = null; // {started_at (ms), ...}
let tab = "timeline";

const $ = (id) => document.getElementById(id);

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function clock(tsMicros) {
  const date = new Date(tsMicros / 1000);
  return date.toISOString().slice(11, 23);
}

function summary(event) {
  const data = event.data || {};
  switch (event.type) {
    case "console_log":
    case "console_error":
      return data.text || "";
    case "network_request":
      return `${data.method || ""} ${data.url || ""}`;
    case "network_response":
      return `${data.status} ${data.url || ""}`;
    case "network_loading_failed":
      return `${data.error_text || "failed"} ${data.url || ""}`;
    case "api_call":
    case "platform_api_call":
      return `${data.operation_id} → ${data.status} (${Math.round(data.duration_ms)} ms)`;
    default:
      return data.url || JSON.stringify(data);
  }
}

function isError(event) {
  const data = event.data || {};
  return event.type === "console_error" || event.type.endsWith("failed") || event.type.endsWith("crashed") ||
    event.type === "system_oom_kill" || (event.type === "network_response" && data.status >= 400);
}

function row(entry, columns) {
  const tr = document.createElement("tr");
  tr.dataset.seq = entry.seq;
  tr.dataset.ts = entry.event.ts;
  tr.dataset.type = entry.event.type;
  tr.dataset.category = entry.event.category;
  if (isError(entry.event)) tr.classList.add("error");
  columns.forEach(([text, className]) => cell(tr, text, className));
  tr.addEventListener("click", () => seek(entry));
  return tr;
}

function matches(entry) {
  const event = entry.event;
  if (!shownCategories.has(event.category)) return false;
  const type = $("type").value;
  if (type && event.type !== type) return false;
  const text = $("search").value.trim().toLowerCase();
  return !text || JSON.stringify(event).toLowerCase().includes(text);
}

function render() {
  const timeline = $("timeline").tBodies[0];
  const console_ = $("console").tBodies[0];
  const network = $("network").tBodies[0];
  [timeline, console_, network].forEach((body) => body.replaceChildren());
  let shown = 0;
  const responses = new Map();
  for (const entry of events) {
    // A response seen wins over a later failure (a body cut short by leaving the page).
    const id = entry.event.data?.request_id;
    if (entry.event.type === "network_response" ||
        (entry.event.type === "network_loading_failed" && !responses.has(id))) {
      responses.set(id, entry.event);
    }
  }
  for (const entry of events) {
    if (!matches(entry)) continue;
    shown += 1;
    const event = entry.event;
    timeline.appendChild(row(entry, [[clock(event.ts)], [event.category], [event.type], [summary(event), "details"]]));
    const data = event.data || {};
    if (event.category === "console") {
      const source = data.source_url ? `${data.source_url}:${data.line ?? ""}` : "";
      console_.appendChild(row(entry, [[clock(event.ts)], [data.level || event.type], [data.text, "details"], [source]]));
    }
    if (event.type === "network_request") {
      const answer = responses.get(data.request_id);
      const status = answer ? (answer.data.status ?? answer.data.error_text ?? "failed") : "…";
      const tr = row(entry, [[clock(event.ts)], [data.method], [data.url, "details"], [status], [data.resource_type]]);
      if (answer && (answer.type === "network_loading_failed" || answer.data.status >= 400)) tr.classList.add("error");
      network.appendChild(tr);
    }
  }
  $("count").textContent = `${shown} of ${events.length} events`;
  markNow();
}

function addFilters(entries) {
  const typeSelect = $("type");
  const known = new Set([...typeSelect.options].map((option) => option.value));
  for (const { event } of entries) {
    if (!known.has(event.type)) {
      known.add(event.type);
      typeSelect.appendChild(new Option(event.type, event.type));
    }
    if (!document.querySelector(`#categories input[value="${CSS.escape(event.category)}"]`)) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = true;
      box.value = event.category;
      box.addEventListener("change", () => {
        if (box.checked) shownCategories.add(box.value); else shownCategories.delete(box.value);
        render();
      });
      shownCategories.add(event.category);
      label.append(box, ` ${event.category}`);
      $("categories").appendChild(label);
    }
  }
}

// Clicking an event shows its moment in the video.
function seek(entry) {
  document.querySelectorAll("tr.selected").forEach((tr) => tr.classList.remove("selected"));
  document.querySelectorAll(`tr[data-seq="${entry.seq}"]`).forEach((tr) => tr.classList.add("selected"));
  if (!replay) return;
  const offset = entry.event.ts / 1000 - replay.startedMs;
  const video = $("video");
  video.currentTime = Math.max(0, offset / 1000);
}

// The events within half a second of the frame shown are marked.
function markNow() {
  if (!replay) return;
  const video = $("video");
  const nowMicros = (replay.startedMs + video.currentTime * 1000) * 1000;
  let first = null;
  document.querySelectorAll("tbody tr").forEach((tr) => {
    const near = Math.abs(Number(tr.dataset.ts) - nowMicros) <= 500000;
    tr.classList.toggle("now", near);
    if (near && !first && !tr.closest("table").hidden) first = tr;
  });
  if (first && !video.paused) first.scrollIntoView({ block: "nearest" });
}

async function poll() {
  try {
    const response = await fetch(`inspector/events?${grant}&after=${lastSeq}`);
    if (!response.ok) {
      $("status").textContent = response.status === 401 ? "This inspector link is invalid or has expired." : `Error ${response.status}`;
      return;
    }
    const body = await response.json();
    $("session").textContent = body.session.name ? `${body.session.name} (${body.session.id})` : body.session.id;
    if (body.events.length) {
      events.push(...body.events);
      lastSeq = body.events[body.events.length - 1].seq;
      addFilters(body.events);
      render();
    }
    $("status").textContent = body.ended ? "Session ended" : "Live";
    document.body.dataset.loaded = "true";
    if (!body.ended || body.events.length) setTimeout(poll, body.events.length ? 0 : 1000);
  } catch (error) {
    $("status").textContent = `Disconnected (${error}); retrying`;
    setTimeout(poll, 2000);
  }
}

async function loadReplays() {
  const response = await fetch(`inspector/replays?${grant}`);
  if (!response.ok) return;
  const replays = await response.json();
  const select = $("replays");
  if (!replays.length) {
    $("no-replay").hidden = false;
    $("video").hidden = true;
    select.hidden = true;
    return;
  }
  replays.forEach((item, index) => {
    select.appendChild(new Option(`Replay ${index + 1} (${item.started_at})`, String(index)));
  });
  const choose = () => {
    const item = replays[Number(select.value)];
    replay = { ...item, startedMs: Date.parse(item.started_at) };
    $("video").src = item.video_url;
    document.body.dataset.replay = item.replay_id;
  };
  select.addEventListener("change", choose);
  choose();
}

document.querySelectorAll("nav button").forEach((button) => {
  button.addEventListener("click", () => {
    tab = button.dataset.tab;
    document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b === button));
    document.querySelectorAll("table.tab").forEach((table) => { table.hidden = table.id !== tab; });
  });
});
$("search").addEventListener("input", render);
$("type").addEventListener("change", render);
$("video").addEventListener("timeupdate", markNow);
$("video").addEventListener("seeked", markNow);

loadReplays();
poll();
