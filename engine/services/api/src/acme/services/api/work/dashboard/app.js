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
    const text = await response.text();
    throw new Error(`${method} ${path}: ${response.status} ${text}`);
  }
  return response.json();
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

function button(label, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = label.toLowerCase();
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await action();
      await refresh();
    } catch (error) {
      showError(error);
      b.disabled = false;
    }
  });
  return b;
}

function renderDeadLetters(page) {
  const body = document.querySelector("#dead-letters tbody");
  body.replaceChildren();
  for (const item of page.items) {
    const row = document.createElement("tr");
    row.dataset.id = item.id;
    cell(row, item.id);
    cell(row, item.kind);
    preCell(row, JSON.stringify(item.payload, null, 1));
    preCell(row, item.last_error || "");
    const actions = cell(row, "");
    const path = `${base}/dead-letters/${encodeURIComponent(item.id)}`;
    actions.appendChild(button("Replay", () => call("POST", `${path}/replay`)));
    actions.appendChild(
      button("Discard", () => call("POST", `${path}/discard`)),
    );
    body.appendChild(row);
  }
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
}

async function refresh() {
  if (!org) {
    showError(new Error("add ?org=<tenant id> to the address"));
    return;
  }
  try {
    const [summary, dead, activity] = await Promise.all([
      call("GET", `${base}/summary`),
      call("GET", `${base}/dead-letters?limit=20`),
      call("GET", `${base}/activity`),
    ]);
    renderCounts(summary);
    renderDeadLetters(dead);
    renderActivity(activity);
    const status = document.getElementById("status");
    status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    status.className = "";
  } catch (error) {
    showError(error);
  }
}

refresh();
window.setInterval(refresh, REFRESH_MS);
