// The review page: a task's answers ranked by how much a label would help (/v1/review/{task}),
// each shown with its input and an editor of its answer; saving posts a correction to
// /v1/feedback, like and dislike post a rating. The API's own checks decide what is stored: a
// refused correction is shown at its field. window.tucano exposes the page's state for tests.
"use strict";

const TASKS = ["extraction", "sql", "push", "insights"];
const ENUMS = {
  sentiment: ["positive", "neutral", "negative"],
  complaint_category: ["delivery_delay", "product_defect", "wrong_item", "missing_item", "quality", "customer_service", "price",
    "packaging", "other", "none"],
  urgency: ["low", "medium", "high"],
};
const BOOLEANS = { delivery_issue: false, requires_response: false, would_recommend: true };  // true: null allowed
const state = { task: sessionStorage.getItem("tucano-review-task") || TASKS[0], items: [], index: 0, done: {} };
window.tucano = { state };


function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

function setStatus(text, error = false) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = error ? "error" : "";
}

async function load() {
  // a tab clicked while another task's queue is in flight: only the last task asked for is shown
  const task = state.task;
  state.items = [];
  state.loaded = null;
  setStatus("Loading…");
  let items = [];
  try {
    items = (await api(`/v1/review/${task}?limit=50`)).items;
    if (task !== state.task) return;
    setStatus(items.length ? `${items.length} answers to review, the most useful label first` : `No ${task} answers to review.`);
  } catch (error) {
    if (task !== state.task) return;
    setStatus(error.status === 401 ? "This gateway needs an API key: type the user or admin key above." : error.message, true);
  }
  state.items = items;
  state.index = 0;
  state.loaded = task;
  render();
}

function tabs() {
  document.getElementById("tasks").replaceChildren(...TASKS.map(task => {
    const button = el("button", { type: "button", "aria-pressed": String(task === state.task), text: task });
    button.addEventListener("click", () => { state.task = task; sessionStorage.setItem("tucano-review-task", task); load(); });
    return button;
  }));
}

function current() { return state.items[state.index]; }

function field(name, control) {
  return el("label", { "data-field": name }, `${name} `, control, el("span", { class: "field-error", "data-error-of": name }));
}

function editorFor(item) {
  const form = document.getElementById("editor");
  const output = item.output || {};
  if (state.task === "extraction") {
    const controls = [];
    for (const name of ["sentiment", "sentiment_score", "complaint_category", "product_mentioned", "delivery_issue",
      "would_recommend", "urgency", "key_phrases", "summary", "requires_response"]) {
      const value = output[name];
      let control;
      if (ENUMS[name]) {
        control = el("select", { name }, ...ENUMS[name].map(option => el("option", { value: option, text: option })));
        control.value = ENUMS[name].includes(value) ? value : ENUMS[name][0];
      } else if (name in BOOLEANS) {
        const options = ["true", "false", ...(BOOLEANS[name] ? ["null"] : [])];
        control = el("select", { name }, ...options.map(option => el("option", { value: option, text: option })));
        control.value = value === null || value === undefined ? (BOOLEANS[name] ? "null" : "false") : String(value);
      } else if (name === "sentiment_score") {
        control = el("input", { name, type: "number", min: "1", max: "5", step: "0.5" });
        control.value = value ?? 3;
      } else if (name === "key_phrases") {
        control = el("textarea", { name, placeholder: "one phrase of the review per line (at most 5)" });
        control.value = Array.isArray(value) ? value.join("\n") : "";
      } else if (name === "summary") {
        control = el("textarea", { name, maxlength: "200" });
        control.value = value ?? "";
      } else {
        control = el("input", { name, type: "text", placeholder: "empty: not mentioned" });
        control.value = value ?? "";
      }
      controls.push(field(name, control));
    }
    form.replaceChildren(...controls);
  } else if (state.task === "push") {
    const title = el("input", { name: "title", type: "text" });
    const body = el("textarea", { name: "body" });
    title.value = output.title ?? "";
    body.value = output.body ?? "";
    form.replaceChildren(field("title", title), field("body", body));
  } else if (state.task === "sql") {
    const sql = el("textarea", { name: "sql", spellcheck: "false" });
    sql.value = output.sql ?? item.raw;
    const executed = item.executed;
    const table = el("table", { class: "executed" });
    if (executed && !executed.error) {
      table.append(el("tr", {}, ...executed.columns.map(c => el("th", { text: c }))),
        ...executed.rows.map(row => el("tr", {}, ...row.map(v => el("td", { text: String(v) })))));
    }
    form.replaceChildren(field("sql", sql), el("p", { text: executed ? (executed.error ? `It fails: ${executed.error}` : "Its result:") : "" }), table);
  } else {
    const text = el("textarea", { name: "answer" });
    text.value = typeof output === "object" && output ? (output.answer ?? "") : String(output ?? "");
    form.replaceChildren(field("answer", text));
  }
}

function correction() {
  const form = document.getElementById("editor");
  const value = name => form.elements[name].value;
  if (state.task === "extraction") {
    const bool = name => ({ true: true, false: false, null: null })[value(name)];
    return {
      sentiment: value("sentiment"), sentiment_score: Number(value("sentiment_score")), complaint_category: value("complaint_category"),
      product_mentioned: value("product_mentioned").trim() || null, delivery_issue: bool("delivery_issue"),
      would_recommend: bool("would_recommend"), urgency: value("urgency"),
      key_phrases: value("key_phrases").split("\n").map(p => p.trim()).filter(Boolean), summary: value("summary").trim(),
      requires_response: bool("requires_response"),
    };
  }
  if (state.task === "push") return { title: value("title"), body: value("body") };
  if (state.task === "sql") return value("sql");
  return value("answer");
}

function showResult(text, error = false, fieldName = null) {
  const result = document.getElementById("item-result");
  result.textContent = text;
  result.className = error ? "error" : "";
  document.querySelectorAll("[data-error-of]").forEach(node => { node.textContent = ""; });
  if (fieldName) {
    const at = document.querySelector(`[data-error-of="${fieldName}"]`);
    if (at) at.textContent = text;
  }
}

function fieldOf(message) {
  const names = [...document.querySelectorAll("[data-field]")].map(node => node.getAttribute("data-field"));
  return names.find(name => message.includes(name)) || names[0] || null;
}

async function send(rating, withCorrection) {
  const item = current();
  if (!item) return;
  const body = { id: item.id, rating };
  if (withCorrection) body.correction = correction();
  try {
    await api("/v1/feedback", { method: "POST", body: JSON.stringify(body) });
    state.done[item.id] = withCorrection ? "corrected" : (rating > 0 ? "liked" : "disliked");
    showResult(withCorrection ? "Saved: the correction answers this input from now on." : `Saved: ${state.done[item.id]}.`);
    renderQueue();
  } catch (error) {
    const said = error.detail || error.message;
    showResult(`Refused: ${said}`, true, withCorrection ? fieldOf(said) : null);
  }
}

function renderQueue() {
  document.getElementById("queue").replaceChildren(...state.items.map((item, i) => {
    const summary = JSON.stringify(item.input).slice(0, 90);
    const li = el("li", { "aria-current": String(i === state.index), class: state.done[item.id] ? "done" : "", text: `${item.score.toFixed(2)} · ${summary}` });
    li.addEventListener("click", () => { state.index = i; render(); });
    return li;
  }));
}

function render() {
  tabs();
  renderQueue();
  const item = current();
  const editing = Boolean(item);
  for (const id of ["like", "dislike", "save"]) document.getElementById(id).disabled = !editing;
  document.getElementById("item-title").textContent = item ? `${state.task} · ${item.version} · ${new Date(item.time * 1000).toLocaleString()}` : "Nothing to review";
  document.getElementById("item-why").textContent = item ? item.why.join(" · ") : "";
  document.getElementById("item-input").textContent = item ? JSON.stringify(item.input, null, 2) : "";
  document.getElementById("item-score").textContent = item ? `served score ${item.score.toFixed(3)}` : "";
  document.getElementById("item-result").textContent = "";
  if (item) editorFor(item);
  else document.getElementById("editor").replaceChildren();
}

function move(step) {
  if (!state.items.length) return;
  state.index = Math.min(state.items.length - 1, Math.max(0, state.index + step));
  render();
}

document.addEventListener("keydown", event => {
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName);
  if (typing && event.key !== "Escape") return;
  if (event.key === "Escape") { document.activeElement.blur(); return; }
  const actions = { j: () => move(1), k: () => move(-1), l: () => send(1, false), d: () => send(-1, false), s: () => send(-1, true) };
  if (actions[event.key]) { event.preventDefault(); actions[event.key](); }
});
document.getElementById("like").addEventListener("click", () => send(1, false));
document.getElementById("dislike").addEventListener("click", () => send(-1, false));
document.getElementById("save").addEventListener("click", () => send(-1, true));
document.getElementById("key-form").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem("tucano-key", document.getElementById("api-key").value.trim());
  document.getElementById("api-key").value = "";
  load();
});
window.tucano.ready = load();
