// The work dashboard: reads and acts through the work API only, every value set as text.
// `?org=<tenant id>` names the tenant; `?as=<user id>` sends the user header itself, for
// local runs without a gateway (a gateway sets and overwrites that header).
"use strict";

const params = new URLSearchParams(window.location.search);
const org = params.get("org");
const user = params.get("as");
const base = `/v1/orgs/${encodeURIComponent(org || "")}/work`;
const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;
// Each read of the operator routes is audited (the system scope), so they are read less often.
const OPERATOR_REFRESH_MS = 15000;
// null until `/v1/work/lanes` answers: 403 says the user is no platform operator.
let operator = null;
let operatorView = null;
let operatorReadAt = 0;
// From the tenant's summary: whether this user may cancel, replay and discard (admin).
let canWrite = false;
// An action's refusal stays this long before a refresh's "Updated" replaces it.
const ERROR_HOLD_MS = 15000;
let errorShownAt = 0;

function headers(extra) {
  const all = { Accept: "application/json", ...extra };
  if (user) {
    all["x-acme-user"] = user;
  }
  return all;
}

async function call(method, path, body) {
  const init = {
    method,
    headers: headers(body ? { "Content-Type": "application/json" } : {}),
  };
  if (body) {
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    throw new Error(await refusal(response));
  }
  return response.json();
}

// One line for a refused call: the status and the API's `detail` when it is a sentence.
async function refusal(response) {
  const text = await response.text();
  let detail = text;
  try {
    const body = JSON.parse(text);
    if (typeof body.detail === "string") {
      detail = body.detail;
    }
  } catch {
    // not JSON: the text as it came
  }
  return `Refused (${response.status}): ${detail}`;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) {
    td.className = className;
  }
  row.appendChild(td);
  return td;
}

function preCell(row, text) {
  const td = document.createElement("td");
  const pre = document.createElement("pre");
  pre.textContent = text;
  td.appendChild(pre);
  row.appendChild(td);
}

function renderCounts(summary) {
  const body = document.querySelector("#counts tbody");
  body.replaceChildren();
  if (summary.lanes.length === 0) {
    noneRow(body, "No item in play.");
  }
  for (const group of summary.lanes) {
    const row = document.createElement("tr");
    row.dataset.lane = group.lane;
    row.dataset.kind = group.kind;
    row.dataset.status = group.status;
    cell(row, group.lane);
    cell(row, group.kind);
    cell(row, group.status);
    cell(row, group.count, "number count");
    const age = group.oldest_available_age;
    cell(row, age === null ? "" : age.toFixed(1), "number");
    body.appendChild(row);
  }
}

// `question`: asked before an action that cannot be taken back (discard, cancel, pause).
function button(label, action, question) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = label.toLowerCase();
  b.addEventListener("click", async () => {
    if (question && !window.confirm(question)) {
      return;
    }
    b.disabled = true;
    try {
      await action();
      await refresh(true);
    } catch (error) {
      showError(error);
      b.disabled = false;
    }
  });
  return b;
}

// A row saying the table is empty, so an empty table never reads as one still loading.
function noneRow(body, text) {
  const row = document.createElement("tr");
  row.className = "none";
  const td = cell(row, text);
  td.colSpan = body.parentElement.querySelectorAll("thead th").length;
  body.appendChild(row);
}

function renderDeadLetters(page) {
  const body = document.querySelector("#dead-letters tbody");
  body.replaceChildren();
  if (page.items.length === 0) {
    noneRow(body, "No dead letters.");
  }
  if (page.next_cursor) {
    noneRow(
      body,
      "The newest 20 shown: the API's dead-letters list pages on (next_cursor).",
    );
  }
  for (const item of page.items) {
    const row = document.createElement("tr");
    row.dataset.id = item.id;
    cell(row, item.id);
    cell(row, item.kind);
    preCell(row, JSON.stringify(item.payload, null, 1));
    preCell(row, item.last_error || "");
    const actions = cell(row, "");
    body.appendChild(row);
    if (!canWrite) {
      continue;
    }
    const path = `${base}/dead-letters/${encodeURIComponent(item.id)}`;
    actions.appendChild(button("Replay", () => call("POST", `${path}/replay`)));
    actions.appendChild(
      button(
        "Discard",
        () => call("POST", `${path}/discard`),
        `Discard dead letter ${item.id}? It is never run again.`,
      ),
    );
  }
}

function renderItems(pages) {
  const body = document.querySelector("#items tbody");
  body.replaceChildren();
  const items = pages.flatMap((page) => page.items);
  if (items.length === 0) {
    noneRow(body, "No item waiting or claimed.");
  }
  if (pages.some((page) => page.next_cursor)) {
    // The counts above are whole; this table is each status's newest 20.
    noneRow(
      body,
      "The newest 20 of each status shown: the API's items list pages on (next_cursor).",
    );
  }
  for (const item of items) {
    const row = document.createElement("tr");
    row.dataset.id = item.id;
    row.dataset.status = item.status;
    cell(row, item.id);
    cell(row, item.kind);
    cell(row, item.lane);
    cell(row, item.status);
    cell(row, `${item.attempts}/${item.max_attempts}`, "number");
    const actions = cell(row, "");
    body.appendChild(row);
    if (!canWrite) {
      continue;
    }
    const path = `${base}/items/${encodeURIComponent(item.id)}/cancel`;
    const question =
      `Cancel item ${item.id}? It never runs again; a running handler is ` +
      "stopped, and what it has already done stays done.";
    actions.appendChild(button("Cancel", () => call("POST", path), question));
  }
}

function laneRow(lane, pause) {
  const row = document.createElement("tr");
  row.dataset.lane = lane;
  row.dataset.state = pause ? "paused" : "claiming";
  cell(row, lane);
  cell(row, pause ? "paused" : "claiming");
  cell(row, pause ? pause.paused_at : "");
  cell(row, pause ? pause.paused_by : "");
  cell(row, pause ? pause.reason : "");
  return row;
}

function renderLanes(summary) {
  const body = document.querySelector("#lanes tbody");
  body.replaceChildren();
  if (!operatorView) {
    // A member sees the paused lanes (not who paused them) and no buttons.
    for (const pause of summary.paused) {
      const row = laneRow(pause.lane, pause);
      cell(row, "");
      body.appendChild(row);
    }
    if (summary.paused.length === 0) {
      noneRow(body, "No lane paused.");
    }
    return;
  }
  for (const lane of operatorView.lanes.lanes) {
    const row = laneRow(lane.lane, lane.pause);
    const actions = cell(row, "");
    const path = `/v1/work/lanes/${encodeURIComponent(lane.lane)}`;
    if (lane.pause) {
      actions.appendChild(
        button("Resume", () => call("POST", `${path}/resume`, {})),
      );
    } else if (lane.known) {
      const question =
        `Pause lane ${lane.lane}? No worker claims on it, for any tenant, ` +
        "until it is resumed.";
      actions.appendChild(
        button("Pause", () => call("POST", `${path}/pause`, {}), question),
      );
    }
    body.appendChild(row);
  }
}

function renderWorkers() {
  const section = document.getElementById("workers-section");
  section.hidden = !operatorView;
  const body = document.querySelector("#workers tbody");
  body.replaceChildren();
  if (!operatorView) {
    return;
  }
  const overview = operatorView.overview;
  if (
    overview.workers_alive.length === 0 &&
    overview.workers_holding.length === 0
  ) {
    noneRow(body, "No worker alive.");
  }
  const readAt = Date.parse(overview.read_at);
  for (const alive of overview.workers_alive) {
    const row = document.createElement("tr");
    row.dataset.worker = alive.worker;
    row.dataset.workerId = alive.worker_id;
    cell(row, alive.worker);
    cell(row, alive.worker_id);
    cell(row, alive.lane);
    cell(row, alive.kinds.join(" "));
    const beat = Math.max(0, (readAt - Date.parse(alive.beat_at)) / 1000);
    cell(row, `${beat.toFixed(0)} s ago`, "number");
    cell(row, alive.holding, "number");
    body.appendChild(row);
  }
  // Holders with no roster row: a worker of an earlier release, or one whose roster
  // writes fail while its leases hold.
  const listed = new Set(
    overview.workers_alive.map((alive) => alive.worker_id),
  );
  for (const holding of overview.workers_holding) {
    if (listed.has(holding.worker)) {
      continue;
    }
    const row = document.createElement("tr");
    row.dataset.workerId = holding.worker;
    cell(row, "not in the roster");
    cell(row, holding.worker);
    cell(row, "");
    cell(row, "");
    cell(row, "");
    cell(row, holding.items, "number");
    body.appendChild(row);
  }
}

function renderSchedules(listing) {
  const body = document.querySelector("#schedules tbody");
  body.replaceChildren();
  if (listing.schedules.length === 0) {
    noneRow(body, "No schedule declared.");
  }
  for (const schedule of listing.schedules) {
    const row = document.createElement("tr");
    row.dataset.schedule = schedule.schedule;
    cell(row, schedule.schedule);
    cell(row, schedule.latest_tick);
    cell(row, schedule.next_tick ?? "not recorded");
    body.appendChild(row);
  }
}

async function readOperatorView(force) {
  if (operator === false) {
    return;
  }
  if (!force && Date.now() - operatorReadAt < OPERATOR_REFRESH_MS) {
    return;
  }
  operatorReadAt = Date.now();
  const response = await fetch("/v1/work/lanes", { headers: headers({}) });
  if (response.status === 403) {
    operator = false;
    return;
  }
  if (!response.ok) {
    throw new Error(await refusal(response));
  }
  const lanes = await response.json();
  const overview = await call("GET", "/v1/work/summary");
  operator = true;
  operatorView = { lanes, overview };
}

function renderActivity(activity) {
  const svg = document.getElementById("activity");
  svg.replaceChildren();
  const buckets = activity.buckets;
  const highest = Math.max(
    1,
    ...buckets.map((b) => Math.max(b.completed, b.dead_lettered)),
  );
  const width = 600 / Math.max(1, buckets.length);
  buckets.forEach((bucket, i) => {
    const pairs = [
      ["done", bucket.completed, 0],
      ["dead", bucket.dead_lettered, width / 2],
    ];
    for (const [name, value, offset] of pairs) {
      const bar = document.createElementNS(SVG, "rect");
      const height = (value / highest) * 110;
      bar.setAttribute("class", name);
      bar.setAttribute("x", String(i * width + offset));
      bar.setAttribute("y", String(115 - height));
      bar.setAttribute("width", String(width / 2 - 1));
      bar.setAttribute("height", String(height));
      const title = document.createElementNS(SVG, "title");
      const what = name === "done" ? "completed" : "dead letters";
      title.textContent = `${Math.round(bucket.ago_s / 60)} min ago: ${value} ${what}`;
      bar.appendChild(title);
      svg.appendChild(bar);
    }
  });
}

function showError(error) {
  const status = document.getElementById("status");
  status.textContent = error.message;
  status.className = "error";
  errorShownAt = Date.now();
}

async function refresh(force) {
  if (!org) {
    showError(new Error("add ?org=<tenant id> to the address"));
    return;
  }
  try {
    const [summary, dead, activity, available, claimed, schedules] =
      await Promise.all([
        call("GET", `${base}/summary`),
        call("GET", `${base}/dead-letters?limit=20`),
        call("GET", `${base}/activity`),
        call("GET", `${base}/items?status=AVAILABLE&limit=20`),
        call("GET", `${base}/items?status=CLAIMED&limit=20`),
        call("GET", `${base}/schedules`),
        readOperatorView(force === true),
      ]);
    canWrite = summary.can_write;
    renderCounts(summary);
    renderDeadLetters(dead);
    renderItems([claimed, available]);
    renderLanes(summary);
    renderWorkers();
    renderSchedules(schedules);
    renderActivity(activity);
    if (Date.now() - errorShownAt > ERROR_HOLD_MS) {
      const status = document.getElementById("status");
      status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      status.className = "";
    }
  } catch (error) {
    showError(error);
  }
}

refresh(true);
window.setInterval(refresh, REFRESH_MS);
