// The atlas page: ask, show the answer and its evidence, edit the corpus and ask again.
// Plain DOM code, no build step; every request goes to the JSON API of the same server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, last: null, editing: null };

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const token = $("token").value || sessionStorage.getItem("atlas-token");
  if (token && method !== "GET") headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({ detail: response.statusText }));
  if (!response.ok) throw new Error(`${response.status}: ${data.detail || response.statusText}`);
  return data;
}

// `element` filled with `text` as text nodes, the cited `spans` ({start, end}: the server's citations of this field)
// each in a <mark>; no span, no mark. Never parsed as HTML. The offsets count code points, as Python does:
// Array.from splits the text by code point, where JavaScript's own indices count UTF-16 units.
function highlighted(element, text, spans) {
  const chars = Array.from(text);
  let at = 0;
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    if (span.start < at) continue;  // overlapping occurrences: the first marks them
    element.append(chars.slice(at, span.start).join(""));
    const mark = document.createElement("mark");
    mark.textContent = chars.slice(span.start, span.end).join("");
    mark.dataset.field = span.field;
    mark.dataset.start = span.start;
    mark.dataset.end = span.end;
    element.append(mark);
    at = span.end;
  }
  element.append(chars.slice(at).join(""));
  return element;
}

function passageCard(passage, result) {
  const card = document.createElement("article");
  card.className = "passage" + (passage.id === result.attended ? " attended" : "");
  card.dataset.id = passage.id;
  const header = document.createElement("header");
  const title = document.createElement("span");
  title.className = "title";
  const cited = (result.citations || []).filter((c) => c.passage_id === passage.id);
  if (passage.title) highlighted(title, passage.title, cited.filter((c) => c.field === "title"));
  else title.textContent = passage.id;
  const pid = document.createElement("span");
  pid.className = "pid";
  pid.textContent = passage.id;
  header.append(title, pid);
  if (passage.id === result.attended) {
    const badge = document.createElement("span");
    badge.className = "badge";
    badge.textContent = "answer read here";
    header.append(badge);
  }
  const scores = document.createElement("span");
  scores.className = "scores";
  const bar = document.createElement("span");
  bar.className = "bar";
  bar.style.width = Math.round(60 * (passage.attention || 0)) + "px";
  scores.append(`score ${passage.score.toFixed(3)} · attention ${Math.round(100 * (passage.attention || 0))}% `, bar);
  header.append(scores);
  card.append(header, highlighted(document.createElement("p"), passage.text, cited.filter((c) => c.field === "text")));
  if (state.info && state.info.serving.edits_allowed) {
    const actions = document.createElement("div");
    actions.className = "actions";
    const edit = document.createElement("button");
    edit.type = "button"; edit.className = "plain edit"; edit.textContent = "Edit";
    edit.onclick = () => openEditor(passage);
    const remove = document.createElement("button");
    remove.type = "button"; remove.className = "danger remove"; remove.textContent = "Remove";
    remove.onclick = () => removePassage(passage.id);
    actions.append(edit, remove);
    card.append(actions);
  }
  return card;
}

function show(result, previous) {
  $("answer-box").hidden = false;
  $("answer").textContent = result.answer || "(no answer)";
  const support = result.supported ? `cited in ${result.citations.length} place(s)` : "not in the passages read";
  $("answer-meta").textContent = `read ${result.evidence.length} passage(s) · ${support} · ` +
    `index generation ${result.generation} · ${Math.round(result.latency_ms)} ms`;
  const change = $("answer-change");
  if (previous && previous.question === result.question) {
    change.hidden = false;
    change.textContent = previous.answer === result.answer
      ? `The answer did not change (${result.answer}).`
      : `The answer changed: ${previous.answer} → ${result.answer}`;
  } else {
    change.hidden = true;
  }
  $("evidence-box").hidden = false;
  const list = $("evidence");
  list.replaceChildren(...result.evidence.map((p) => passageCard(p, result)));
}

async function ask(previous = null) {
  const question = $("question").value.trim();
  if (!question) { setStatus("Type a question first.", true); return; }
  $("ask").disabled = true;
  setStatus("Reading…");
  try {
    const result = await api("POST", "/api/ask", { question, k: Number($("k").value) });
    show(result, previous);
    state.last = result;
    setStatus("");
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    $("ask").disabled = false;
  }
}

function openEditor(passage) {
  state.editing = passage.id;
  $("edit-panel").hidden = false;
  $("edit-heading").textContent = "Edit passage";
  $("edit-id").value = passage.id;
  $("edit-title").value = passage.title || "";
  $("edit-text").value = passage.text;
  $("edit-text").focus();
}

async function saveEdit() {
  const id = $("edit-id").value;
  $("edit-save").disabled = true;
  setStatus("Re-embedding and indexing…");
  try {
    const done = await api("PUT", "/api/passages/" + encodeURIComponent(id),
                           { title: $("edit-title").value, text: $("edit-text").value });
    $("edit-panel").hidden = true;
    setStatus(`Saved ${id} (index generation ${done.generation}).`);
    if (state.last) await ask(state.last);
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    $("edit-save").disabled = false;
  }
}

async function removePassage(id) {
  if (!confirm(`Remove passage ${id} from the index?`)) return;
  try {
    const done = await api("DELETE", "/api/passages/" + encodeURIComponent(id));
    setStatus(`Removed ${id}; ${done.count} passages left.`);
    if (state.last) await ask(state.last);
  } catch (error) {
    setStatus(error.message, true);
  }
}

async function addPassage() {
  $("add-save").disabled = true;
  try {
    const passage = { id: $("add-id").value.trim(), title: $("add-title").value, text: $("add-text").value };
    const done = await api("POST", "/api/passages", { passages: [passage] });
    $("add-panel").hidden = true;
    setStatus(`Added ${passage.id}; ${done.count} passages.`);
    if (state.last) await ask(state.last);
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    $("add-save").disabled = false;
  }
}

// `atlas serve --allow-edits` prints the page's link as http://HOST:PORT/#token=TOKEN: the fragment never
// leaves the browser (it is not sent to the server, nor in a Referer); keep it for this tab, then drop it.
function tokenFromLink() {
  const found = /^#token=(.+)$/.exec(window.location.hash);
  if (!found) return;
  sessionStorage.setItem("atlas-token", decodeURIComponent(found[1]));
  history.replaceState(null, "", window.location.pathname + window.location.search);
}

async function start() {
  tokenFromLink();
  $("ask-form").addEventListener("submit", (event) => { event.preventDefault(); ask(); });
  $("edit-save").onclick = saveEdit;
  $("edit-cancel").onclick = () => { $("edit-panel").hidden = true; };
  $("add-open").onclick = () => { $("add-panel").hidden = false; $("add-id").focus(); };
  $("add-cancel").onclick = () => { $("add-panel").hidden = true; };
  $("add-save").onclick = addPassage;
  $("token").onchange = () => sessionStorage.setItem("atlas-token", $("token").value);
  try {
    state.info = await api("GET", "/api/info");
    const { reader, index, serving } = state.info;
    $("run").textContent = `${reader.class} (${(reader.parameters / 1e6).toFixed(0)}M parameters) · ` +
      `${index.spec} index of ${index.passages} passages · encoder ${index.encoder_fingerprint.slice(0, 12)}`;
    for (let k = 1; k <= 10; k++) $("k").append(new Option(`k=${k}`, k, false, k === serving.default_k));
    $("edit-tools").hidden = !serving.edits_allowed;
    $("token-box").hidden = !serving.token_required;
  } catch (error) {
    setStatus("Cannot reach the server: " + error.message, true);
  }
}

start();
