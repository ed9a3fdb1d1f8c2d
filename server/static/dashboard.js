// The dashboard is a view of three API routes: /v1/stats (traffic and served reward over time),
// /v1/rounds (the learning curve, the last round) and /v1/adapters (lineage, routes). It holds no
// data of its own; the API key typed above is kept for this tab only (sessionStorage) and sent as
// a bearer token, so the page follows the API's access rules. window.tucano exposes what each chart
// was drawn from, for the browser test and for anyone checking a figure.
"use strict";

const TASKS = ["extraction", "sql", "push", "insights"];
const COLORS = ["#166534", "#1d4ed8", "#b45309", "#7c3aed", "#be123c", "#0f766e", "#4b5563"];
const state = { task: sessionStorage.getItem("tucano-task") || TASKS[0], stats: null, rounds: null, adapters: null, errors: {} };
const charts = {};
window.tucano = { state, charts };


function when(epoch) {
  if (!epoch) return "-";
  const d = new Date(epoch * 1000);
  return d.toLocaleString(undefined, { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit" });
}

function fmt(value, digits = 3) { return value === null || value === undefined ? "-" : Number(value).toFixed(digits); }
function signed(value) { return (value >= 0 ? "+" : "") + Number(value).toFixed(3); }

function setStatus(text, error = false) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = error ? "error" : "";
}

function explain(error) {
  if (error.status === 401) return "This gateway needs an API key: type the user or admin key above.";
  if (error.status === 503) return `The gateway cannot read its store (Redis) right now: ${error.message}. Figures return when it does.`;
  if (error.status === 429) return `Too many requests from this key: ${error.message}`;
  return error.message;
}

async function load() {
  setStatus("Loading…");
  const windowS = document.getElementById("window").value;
  const [stats, rounds, adapters] = await Promise.allSettled([
    api(`/v1/stats?window_s=${windowS}&buckets=48`), api("/v1/rounds?limit=100"), api("/v1/adapters")]);
  state.errors = {};
  for (const [name, result] of Object.entries({ stats, rounds, adapters })) {
    if (result.status === "fulfilled") state[name] = result.value;
    else { state[name] = null; state.errors[name] = explain(result.reason); }
  }
  const problems = [...new Set(Object.values(state.errors))];
  if (problems.length) setStatus(problems.join(" "), true);
  else setStatus(`Updated ${new Date().toLocaleTimeString()}` + (state.stats.truncated ? " · the window holds more records than were read: the oldest are left out" : ""));
  render();
}

function tabs() {
  const nav = document.getElementById("tasks");
  nav.replaceChildren(...TASKS.map(task => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = task;
    button.setAttribute("aria-pressed", String(task === state.task));
    button.addEventListener("click", () => { state.task = task; sessionStorage.setItem("tucano-task", task); render(); });
    return button;
  }));
}

function chart(id, config) {
  drop(id);
  charts[id] = new Chart(document.getElementById(id), config);
  return charts[id];
}

function drop(id) {
  if (charts[id]) { charts[id].destroy(); delete charts[id]; }
}

function empty(id, text) {
  const el = document.getElementById(`${id}-empty`);
  el.hidden = !text;
  el.textContent = text || "";
  document.getElementById(`${id}-chart`).parentElement.hidden = Boolean(text);
}

function tick(epoch) {
  return new Date(epoch * 1000).toLocaleString(undefined, { month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit" });
}

// a time axis over [min, max] (epoch seconds); a single moment gets an hour either side
function timeAxis(min, max) {
  if (max - min < 60) { min -= 3600; max += 3600; }
  return { type: "linear", min, max, ticks: { maxTicksLimit: 6, callback: value => tick(value) } };
}

function renderTraffic() {
  const stats = state.stats && state.stats.tasks[state.task];
  if (!stats) { empty("traffic", state.errors.stats || "No figures."); empty("reward", state.errors.stats || "No figures."); return; }
  if (!stats.requests) {
    const text = `No ${state.task} traffic in this window.`;
    empty("traffic", text); empty("reward", text);
    drop("traffic-chart"); drop("reward-chart");
    return;
  }
  empty("traffic", ""); empty("reward", "");
  const half = state.stats.bucket_s / 2;
  chart("traffic-chart", {
    type: "bar",
    data: { datasets: stats.versions.map((v, i) => ({
      label: `${v.version} (${v.requests})`, version: v.version, backgroundColor: COLORS[i % COLORS.length],
      data: v.points.map(p => ({ x: p.start + half, y: p.requests })) })) },
    options: { maintainAspectRatio: false, animation: false, scales: { x: { ...timeAxis(state.stats.start, state.stats.end), stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: "requests" } } } },
  });
  chart("reward-chart", {
    type: "line",
    data: { datasets: stats.versions.map((v, i) => ({
      label: `${v.version} (mean ${fmt(v.mean_reward)})`, version: v.version, borderColor: COLORS[i % COLORS.length], spanGaps: false,
      data: v.points.map(p => ({ x: p.start + half, y: p.mean_reward })) })) },
    options: { maintainAspectRatio: false, animation: false, scales: { x: timeAxis(state.stats.start, state.stats.end), y: { min: 0, max: 1, title: { display: true, text: "mean served reward" } } } },
  });
}

function judged(decision) {
  // the comparison that decided: without the examples where the gate chose to serve the version alone
  return decision && decision.served_alone && decision.alone ? decision.alone : decision;
}

function learningPoints() {
  // oldest round first; one point per round that judged a candidate of this task
  const rounds = (state.rounds ? state.rounds.rounds : []).slice().reverse();
  return rounds.flatMap(summary => {
    const entry = (summary.tasks || {})[state.task];
    const decision = judged(entry && entry.gate && entry.gate.decision);
    if (!decision || decision.n === undefined || !decision.n) return [];
    return [{ round: summary.round, time: summary.started, version: entry.version, promoted: Boolean(decision.promote),
      candidate: decision.candidate_mean, incumbent: decision.incumbent_mean, difference: decision.difference,
      low: decision.incumbent_mean + decision.interval[0], high: decision.incumbent_mean + decision.interval[1], n: decision.n }];
  });
}

function rollbacks() {
  const metas = state.adapters ? state.adapters.adapters.filter(m => m.task === state.task) : [];
  return metas.flatMap(m => (m.history || []).filter(h => h.reason === "rolled back").map(h => ({ version: m.version, time: h.at })));
}

function renderLearning() {
  if (state.errors.rounds) { empty("learning", state.errors.rounds); return; }
  const points = learningPoints();
  if (!points.length) {
    empty("learning", `No round has judged a ${state.task} candidate yet: rounds run every TUCANO_TRAIN_INTERVAL_MINUTES once the task has new labels or records (or run \`tucano train --once\`).`);
    drop("learning-chart");
    return;
  }
  empty("learning", "");
  const back = rollbacks();
  const moments = [...points.map(p => p.time), ...back.map(r => r.time)];
  chart("learning-chart", {
    type: "line",
    data: { datasets: [
      { label: "interval low", data: points.map(p => ({ x: p.time, y: p.low })), borderColor: "#86efac", pointRadius: 0, fill: false },
      { label: "95% interval", data: points.map(p => ({ x: p.time, y: p.high })), borderColor: "#86efac", backgroundColor: "#bbf7d066", pointRadius: 0, fill: "-1" },
      { label: "candidate", data: points.map(p => ({ x: p.time, y: p.candidate, round: p.round, version: p.version })), showLine: false,
        pointRadius: 6, pointBackgroundColor: points.map(p => p.promoted ? "#166534" : "#9ca3af"), borderColor: "#166534" },
      { label: "incumbent", data: points.map(p => ({ x: p.time, y: p.incumbent })), borderColor: "#1d4ed8", borderDash: [4, 3] },
      { label: "promoted", data: points.filter(p => p.promoted).map(p => ({ x: p.time, y: p.candidate, version: p.version })), showLine: false,
        pointStyle: "triangle", pointRadius: 9, borderColor: "#166534", backgroundColor: "#16653455" },
      { label: "rollback", data: back.map(r => ({ x: r.time, y: 0, version: r.version })), showLine: false,
        pointStyle: "crossRot", pointRadius: 9, borderColor: "#b91c1c", borderWidth: 2 },
    ] },
    options: { maintainAspectRatio: false, animation: false, scales: { x: timeAxis(Math.min(...moments), Math.max(...moments)), y: { min: 0, max: 1, title: { display: true, text: "gate eval score" } } },
      plugins: { legend: { labels: { filter: item => item.text !== "interval low" } },
        tooltip: { callbacks: { afterLabel: ctx => ctx.raw.version ? `${ctx.raw.version}${ctx.raw.round ? " · " + ctx.raw.round : ""}` : "" } } } },
  });
  window.tucano.learning = points;
}

function definitions(id, pairs) {
  document.getElementById(id).replaceChildren(...pairs.flatMap(([term, value]) => {
    const dt = document.createElement("dt"); dt.textContent = term;
    const dd = document.createElement("dd"); dd.textContent = value;
    return [dt, dd];
  }));
}

function renderRoute() {
  if (!state.adapters) { definitions("route", [["state", state.errors.adapters || "unknown"]]); return; }
  const route = state.adapters.routes[state.task] || {};
  definitions("route", [["active", route.active || "base model"], ["previous", route.previous || "-"],
    ["canary", route.canary ? `${route.canary} at ${Math.round(route.canary_share * 100)}% since ${when(route.canary_started)}` : "none"]]);
}

function renderCalibration() {
  // beside the served-reward curve: how far that reward agrees with the team's labels
  const el = document.getElementById("calibration");
  const stats = state.stats && state.stats.tasks[state.task];
  const c = stats && stats.calibration;
  el.classList.toggle("weak", Boolean(c && c.weak));
  if (!c) { el.textContent = ""; return; }
  const measures = `rank correlation with the labels ${fmt(c.rank_correlation)} (${c.n} answers), ` +
    `liked above corrected ${fmt(c.separation)} (${c.liked} liked, ${c.corrected} corrected)`;
  if (c.weak === null) el.textContent = `Calibration: too few labels to say (${measures}).`;
  else if (c.weak) el.textContent = `Weak calibration: this served reward does not follow the team's labels here; read it with care (${measures}).`;
  else el.textContent = `Calibrated against the team's labels: ${measures}.`;
}

function renderFeedback() {
  const stats = state.stats && state.stats.tasks[state.task];
  if (!stats) { definitions("feedback", [["state", state.errors.stats || "unknown"]]); return; }
  const f = stats.feedback;
  definitions("feedback", [["labels", f.labels], ["references sent", f.references], ["corrections", f.corrections],
    ["ratings", `${f.ratings} (${f.positive} up, ${f.negative} down)`]]);
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

function renderLineage() {
  const body = document.querySelector("#lineage tbody");
  if (!state.adapters) { body.replaceChildren(); const row = body.insertRow(); cell(row, state.errors.adapters || "unknown").colSpan = 7; return; }
  const metas = state.adapters.adapters.filter(m => m.task === state.task).sort((a, b) => b.created - a.created);
  if (!metas.length) { body.replaceChildren(); const row = body.insertRow(); cell(row, `No ${state.task} adapter yet: the base model serves it.`).colSpan = 7; return; }
  body.replaceChildren(...metas.map(m => {
    const row = document.createElement("tr");
    const decision = judged((m.gate || {}).decision);
    cell(row, m.version); cell(row, m.parent || "base"); cell(row, m.method || "-");
    cell(row, m.status, m.status === "active" ? "ok" : m.status === "rejected" || m.status === "rolled_back" ? "bad" : "");
    cell(row, decision ? `${signed(decision.difference)} [${signed(decision.interval[0])}, ${signed(decision.interval[1])}] n=${decision.n}`
      + (m.gate.decision.served_alone ? ", served alone" : "") : "-");
    cell(row, when(m.created));
    const actions = cell(row, "");
    if (m.status !== "active") {
      const button = document.createElement("button");
      button.type = "button"; button.className = "admin"; button.textContent = "Promote";
      button.addEventListener("click", () => act("promote", `?version=${encodeURIComponent(m.version)}`, `Promote ${m.version} to serve all ${state.task} traffic?`));
      actions.append(button);
    }
    return row;
  }));
}

function renderLastRound() {
  const el = document.getElementById("last-round");
  if (!state.rounds) { el.textContent = state.errors.rounds || "unknown"; return; }
  const last = state.rounds.rounds.find(r => (r.tasks || {})[state.task]);
  if (!last) { el.textContent = `No round has looked at ${state.task} yet.`; return; }
  const entry = last.tasks[state.task];
  const flags = Object.entries(entry.stop_conditions || {}).filter(([, f]) => f.flagged).map(([name]) => name);
  const decision = (entry.gate || {}).decision || {};
  const worse = Object.entries(decision.components || {}).filter(([, c]) => c.worse).map(([name]) => name);
  const dl = document.createElement("dl");
  el.replaceChildren(dl);
  dl.id = "last-round-facts";
  definitions("last-round-facts", [["round", `${last.round} · ${when(last.started)} · ${last.seconds ?? "-"} s`],
    ["outcome", entry.outcome || "-"], ["why", entry.reason || decision.reason || "-"],
    ["methods", (entry.plan || []).map(step => step.method).join(", ") || entry.method || "-"],
    ["stop conditions flagged", flags.join(", ") || "none"], ["components significantly worse", worse.join(", ") || "none"],
    ["GRPO", grpoFacts((entry.training || []).find(run => run.grpo))]]);
}

function grpoFacts(run) {
  // the watch list of the round's GRPO run (common/rounds.py, GrpoReport), in one line
  if (!run) return "not run";
  const g = run.grpo, fixed = (x, digits) => (x === null || x === undefined ? "-" : Number(x).toFixed(digits));
  const clipped = g.importance_tokens ? ` · importance-capped ${fixed(100 * g.importance_clipped / g.importance_tokens, 1)}% of tokens` : "";
  const generation = g.generation_tokens_per_s ? ` · generation ${fixed(g.generation_tokens_per_s, 0)} tok/s` : "";
  const size = g.group_size ? ` of ${g.group_size}` : "";  // 0 in rounds before it was recorded
  return `${g.rollouts} · ${g.groups - g.groups_dropped} groups${size} used, ${g.groups_dropped} dropped · ${g.steps} steps · ` +
    `reward ${fixed(g.reward_mean, 3)} ± ${fixed(g.reward_std, 3)} · clip ${fixed(g.clip_ratio, 3)}${clipped} · ` +
    `KL to parent ${fixed(g.kl_to_parent, 4)}${g.beta ? ` · KL to base ${fixed(g.kl_to_base, 4)} (penalty ${g.beta})` : ""} · entropy ${fixed(g.entropy, 3)} · length ${fixed(g.completion_length, 0)} · ` +
    `grad norm ${fixed(g.grad_norm, 3)} · optimisation ${fixed(g.optimisation_tokens_per_s, 0)} tok/s${generation}`;
}

function renderJobs() {
  // a running training round or the demo model's fine-tuning, where it stands (each writes it as it goes)
  const el = document.getElementById("jobs");
  const jobs = (state.stats && state.stats.jobs) || [];
  el.hidden = !jobs.length;
  el.textContent = jobs.map(job => {
    const done = `${Math.round(job.share * 100)}%${job.of_whole ? "" : " of this stage"}`;
    const left = job.seconds_left === null ? "" : `, about ${Math.max(1, Math.round(job.seconds_left / 60))} min left`;
    const what = { round: "Training round", bootstrap: "Fine-tuning the demo model (the pretrained model answers meanwhile)" }[job.job] || job.job;
    return `${what}: ${job.stage}, ${done}${left}`;
  }).join(" · ");
}

function render() {
  tabs();
  renderJobs();
  renderTraffic(); renderCalibration(); renderLearning(); renderRoute(); renderFeedback(); renderLineage(); renderLastRound();
}

async function act(action, query, question) {
  if (!window.confirm(question)) return;
  try {
    await api(`/v1/adapters/${state.task}/${action}${query}`, { method: "POST" });
    setStatus(`${action} done for ${state.task}.`);
  } catch (error) {
    const why = error.status === 403 || error.status === 401 ? `This needs the admin key (${error.message}).` : explain(error);
    setStatus(`${action} refused: ${why}`, true);
    return;
  }
  await load();
}

document.querySelectorAll("[data-action]").forEach(button => button.addEventListener("click", () => {
  const action = button.dataset.action;
  act(action, "", action === "rollback" ? `Roll ${state.task} back to its previous version?` : `Abort the ${state.task} canary?`);
}));
document.getElementById("key-form").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem("tucano-key", document.getElementById("api-key").value.trim());
  document.getElementById("api-key").value = "";
  load();
});
document.getElementById("window").addEventListener("change", load);
document.getElementById("refresh").addEventListener("click", load);
tabs();
window.tucano.ready = load().catch(error => setStatus(explain(error), true));
setInterval(() => load().catch(() => {}), 30000);
