// On every (re)connect, ask the server for every row after the last one on the page: the
// websocket only notifies, the database holds the log, so nothing is lost.
// It also says which state the page shows ([data-live-state]), so that a change it missed
// while the socket was down has it re-read the parts that depend on it.
document.addEventListener("htmx:wsOpen", (event) => {
  const list = event.target.querySelector("[data-seq-list]");
  if (!list) return;
  event.detail.socketWrapper.send(position(event.target, list));
});

function position(socketElt, list) {
  const state = socketElt.querySelector("[data-live-state]");
  const message = { after: lastSeq(list) };
  if (state) message.state = state.dataset.liveState;
  return JSON.stringify(message);
}

// A frame too big for the socket, or a change of the object's state, arrives as
// <template data-live-fetch data-url=...> (infraops/consumers.py): fetch the page over HTTP
// with ?after=<last row shown>, append its newer rows, replace the parts the frame names, then
// tell the socket where the page is.
document.addEventListener("htmx:wsBeforeMessage", (event) => {
  const message = event.detail.message;
  if (typeof message !== "string" || !message.startsWith("<template data-live-fetch")) return;
  event.preventDefault(); // not swapped: there is nothing to swap
  const holder = document.createElement("template");
  holder.innerHTML = message;
  const order = holder.content.firstElementChild;
  if (order) fetchRows(event.target, order, event.detail.socketWrapper);
});

function lastSeq(list) {
  const rows = list.querySelectorAll(":scope > [data-seq]");
  return rows.length ? Number(rows[rows.length - 1].dataset.seq) : 0;
}

async function fetchRows(socketElt, order, socket) {
  const list = socketElt.querySelector("[data-seq-list]");
  if (!list) return;
  const last = lastSeq(list);
  try {
    const url = new URL(order.dataset.url, window.location.href);
    url.searchParams.set("after", String(last));
    const response = await fetch(url, { credentials: "same-origin" });
    if (response.ok) {
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fetched = (list.id && page.getElementById(list.id)) || page.querySelector("[data-seq-list]");
      let top = last;
      for (const row of Array.from(fetched ? fetched.children : [])) {
        if (!row.hasAttribute("data-seq")) continue;
        const number = Number(row.dataset.seq);
        if (number > top) {
          list.appendChild(document.adoptNode(row)); // rendered and escaped by the server
          top = number;
        }
      }
      for (const id of (order.dataset.refresh || "").split(" ").filter(Boolean)) {
        const fresh = page.getElementById(id);
        const old = document.getElementById(id);
        if (!fresh || !old) continue;
        const node = document.adoptNode(fresh);
        old.replaceWith(node);
        if (window.htmx) window.htmx.process(node);
        document.dispatchEvent(new CustomEvent("infraops:replaced", { detail: { node } }));
      }
    }
  } catch (error) {
    console.warn("could not fetch the rows too big for the socket", error);
  } finally {
    socket.send(position(socketElt, list));
    syncSteps();
  }
}

// The socket's partial says how many steps the run has (#run-step-sync); when that is more
// than the page shows, fetch the rows of the steps after the last one and append them.
// One request at a time; a message that lands meanwhile asks again when it ends.
let stepsBusy = false;
let stepsAgain = false;

async function syncSteps() {
  const sync = document.getElementById("run-step-sync");
  const list = document.querySelector("[data-step-list]");
  if (!sync || !list) return;
  if (stepsBusy) {
    stepsAgain = true;
    return;
  }
  const rows = list.querySelectorAll(":scope > [data-step]");
  const last = rows.length ? Number(rows[rows.length - 1].dataset.step) : 0;
  if (!(Number(sync.dataset.steps) > last)) return;
  stepsBusy = true;
  try {
    const url = new URL(sync.dataset.url, window.location.href);
    url.searchParams.set("steps_after", String(last));
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) return;
    const holder = document.createElement("template");
    holder.innerHTML = await response.text(); // rendered and escaped by the server
    let top = last;
    // (not querySelectorAll(":scope > ..."): :scope matches nothing in a fragment)
    for (const row of Array.from(holder.content.children)) {
      if (!row.hasAttribute("data-step")) continue;
      const number = Number(row.dataset.step);
      if (number > top) {
        list.appendChild(row);
        top = number;
      }
    }
    if (top > last) list.querySelector(":scope > [data-empty]")?.remove();
  } catch (error) {
    console.warn("could not fetch the new steps", error);
  } finally {
    stepsBusy = false;
    if (stepsAgain) {
      stepsAgain = false;
      syncSteps();
    }
  }
}

document.addEventListener("htmx:wsAfterMessage", syncSteps);

// A step row shows its experiment's status as it was when the row was rendered, and rows are
// only ever appended; the experiments table (#run-experiments), re-sent with every frame and
// re-read after a fetch, has the current one: each step's badge follows it.
function syncExperimentBadges() {
  const table = document.getElementById("run-experiments");
  if (!table) return;
  const current = new Map();
  for (const badge of table.querySelectorAll("[data-experiment-status]")) {
    current.set(badge.dataset.experimentStatus, badge);
  }
  for (const badge of document.querySelectorAll("[data-step-list] [data-experiment-status]")) {
    const fresh = current.get(badge.dataset.experimentStatus);
    if (fresh && fresh.textContent !== badge.textContent) {
      badge.className = fresh.className;
      badge.textContent = fresh.textContent;
    }
  }
}

document.addEventListener("htmx:wsAfterMessage", syncExperimentBadges);
document.addEventListener("infraops:replaced", syncExperimentBadges);

// A live log follows new lines, unless its reader scrolled up to read: where the box was at
// its end before a message, it is at its end after.
const following = new WeakMap();

function atEnd(list) {
  return list.scrollHeight - list.scrollTop - list.clientHeight < 40;
}

function follow() {
  for (const list of document.querySelectorAll("[data-seq-list]")) {
    if (following.get(list) !== false) list.scrollTop = list.scrollHeight;
  }
}

document.addEventListener("DOMContentLoaded", follow);
document.addEventListener("htmx:wsBeforeMessage", () => {
  for (const list of document.querySelectorAll("[data-seq-list]")) following.set(list, atEnd(list));
});
document.addEventListener("htmx:wsAfterMessage", follow);
document.addEventListener("infraops:replaced", follow);
