// roll-view's page: plain JavaScript over the JSON API of roll_lite/viewer/server.py.
"use strict";
const $ = (id) => document.getElementById(id);
const FILTERS = ["step", "outcome", "domain", "reward_min", "reward_max", "staleness_min", "gap_min"];
let knownSteps = "";
let opened = null; // the trajectory shown: {step, sample, data}
let promptKey = "";

async function api(path) {
  let response;
  try {
    response = await fetch(path);
  } catch (error) {
    throw new Error("the roll-view server does not answer (stopped?): " + error.message);
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function say(text) {
  $("message").hidden = !text;
  $("message").textContent = text || "";
}

function list(element, lines) {
  element.replaceChildren(...lines.map((line) => Object.assign(document.createElement("li"), { textContent: line })));
}

function fillSelect(select, values, first) {
  const kept = select.value;
  select.replaceChildren(first, ...values.map((v) => new Option(v, v)));
  select.value = values.map(String).includes(kept) ? kept : first.value;
}

function number(x, digits = 3) {
  return x === null || x === undefined ? "" : Number(x).toFixed(digits).replace(/\.?0+$/, "") || "0";
}

async function refreshRun() {
  let run;
  try {
    run = await api("/api/run");
  } catch (error) {
    say(error.message);
    return;
  }
  $("run").textContent = run.path;
  say(run.message);
  list($("problems"), run.problems);
  const steps = run.steps.map((s) => s.step);
  fillSelect($("step"), steps, new Option("all steps", "all"));
  fillSelect($("outcome"), run.outcomes, new Option("any", ""));
  fillSelect($("domain"), run.domains, new Option("any", ""));
  const signature = JSON.stringify(run.steps);
  if (signature !== knownSteps) {  // new steps written (or a resume removed some): the list follows
    knownSteps = signature;
    await loadList();
  }
}

function query() {
  const params = new URLSearchParams();
  for (const name of FILTERS) params.set(name, $(name).value.trim());
  if (promptKey) params.set("prompt_key", promptKey);
  return params.toString();
}

async function loadList() {
  let answer;
  try {
    answer = await api("/api/samples?" + query());
  } catch (error) {
    $("count").textContent = error.message;
    $("rows").tBodies[0].replaceChildren();
    return;
  }
  const more = answer.passed > answer.rows.length ? ` (the first ${answer.rows.length} shown)` : "";
  $("count").textContent = `${answer.passed} of ${answer.total} samples pass the filters${more}`;
  $("rows").tBodies[0].replaceChildren(...answer.rows.map(rowLine));
}

function rowLine(s) {
  const tr = document.createElement("tr");
  tr.dataset.step = s.step;
  tr.dataset.sample = s.sample;
  const cells = [s.step, s.sample, number(s.reward), number(s.advantage), s.outcomes.join(" "), s.domains.join(" "),
    s.staleness ?? "", number(s.gap, 4), s.turns ?? "", s.response];
  for (const value of cells) tr.appendChild(Object.assign(document.createElement("td"), { textContent: value }));
  tr.lastChild.className = "text";
  tr.title = s.prompt;
  if (opened && opened.step === s.step && opened.sample === s.sample) tr.className = "open";
  tr.addEventListener("click", () => openSample(s.step, s.sample));
  return tr;
}

async function openSample(step, sample) {
  let data;
  try {
    data = await api(`/api/sample?step=${step}&sample=${sample}`);
  } catch (error) {
    say(error.message);
    return;
  }
  opened = { step, sample, data };
  for (const tr of $("rows").tBodies[0].rows) {
    tr.classList.toggle("open", tr.dataset.step == step && tr.dataset.sample == sample);
  }
  showSample();
}

function showSample() {
  const { step, sample, data } = opened;
  $("detail").hidden = false;
  $("title").textContent = `step ${step}, sample ${sample}`;
  const header = Object.entries(data.header).filter(([, v]) => v !== null && v !== undefined);
  $("header").replaceChildren(...header.map(([k, v]) => {
    const pair = document.createElement("div");
    pair.append(Object.assign(document.createElement("dt"), { textContent: k }),
      Object.assign(document.createElement("dd"), { textContent: typeof v === "number" ? number(v, 4) : v }));
    return pair;
  }));
  list($("notes"), data.notes);
  const sources = data.sources.map((s) => `<tr><td>${esc(s.source)}</td><td>${number(s.score)}</td><td>${esc(s.outcome)}</td><td>${esc(s.reason || "")}</td></tr>`);
  $("sources").innerHTML = sources.length ? "<tr><th>source</th><th>score</th><th>outcome</th><th>reason</th></tr>" + sources.join("") : "";
  $("prompt").textContent = data.prompt;
  const colour = $("colour").value;
  const values = data.parts.flatMap((p) => p.tokens).filter((t) => t.trained !== 0).map((t) => Math.abs(t[colour] || 0));
  const scale = Math.max(1e-9, ...values);
  $("parts").replaceChildren(...data.parts.map((part) => partBlock(part, colour, scale)));
  for (const [label, text] of Object.entries(data.pairs)) {
    $("parts").appendChild(Object.assign(document.createElement("h4"), { textContent: label }));
    $("parts").appendChild(Object.assign(document.createElement("pre"), { textContent: text }));
  }
}

function partBlock(part, colour, scale) {
  const block = document.createElement("div");
  block.className = "part " + part.kind;
  let title = part.kind === "environment" ? `turn ${part.turn}: environment reply` : part.turn ? `turn ${part.turn}: model` : part.kind;
  if (part.kind === "model" && part.turn) {
    title += ` · reward ${number(part.reward)} · weights v${part.version ?? "?"}`;
    if (part.metrics && part.metrics !== "{}") title += ` · ${part.metrics}`;
  }
  block.appendChild(Object.assign(document.createElement("h4"), { textContent: title }));
  const tokens = document.createElement("div");
  tokens.className = "tokens";
  for (const t of part.tokens) {
    const span = Object.assign(document.createElement("span"), { textContent: t.text, className: "tok" });
    span.title = `id ${t.id} · advantage ${number(t.advantage, 4)} · gap ${number(t.gap, 5)} · logp ${number(t.logp)} · weights v${t.version ?? "?"}`;
    if (t.trained === 0) span.classList.add("untrained");
    else if (t[colour] !== null && t[colour] !== undefined) span.style.background = shade(t[colour] / scale, colour);
    tokens.appendChild(span);
  }
  if (!part.tokens.length && part.text) tokens.textContent = part.text;
  block.appendChild(tokens);
  return block;
}

function shade(x, colour) {  // x in [-1, 1]: advantage green (+) / red (-); gap orange (+) / blue (-)
  const alpha = Math.min(1, Math.abs(x)) * 0.6;
  const rgb = colour === "gap" ? (x >= 0 ? "230,140,0" : "40,100,230") : (x >= 0 ? "30,170,60" : "220,40,40");
  return `rgba(${rgb},${alpha.toFixed(3)})`;
}

function esc(text) {
  return String(text ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

function follow(key) {
  promptKey = key;
  $("following").hidden = !key;
  $("prompt_key").textContent = key;
  if (key) $("step").value = "all";
  loadList();
}

$("filters").addEventListener("submit", (event) => { event.preventDefault(); loadList(); });
for (const name of ["step", "outcome", "domain"]) $(name).addEventListener("change", loadList);
$("colour").addEventListener("change", () => opened && showSample());
$("follow").addEventListener("click", () => opened && follow(opened.data.prompt_key));
$("unfollow").addEventListener("click", () => follow(""));
refreshRun();
setInterval(refreshRun, 3000);
