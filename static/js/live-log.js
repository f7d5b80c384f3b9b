// On every (re)connect, ask the server for every row after the last one on the page: the
// websocket only notifies, the database holds the log, so nothing is lost.
document.addEventListener("htmx:wsOpen", (event) => {
  const list = event.target.querySelector("[data-seq-list]");
  if (!list) return;
  const rows = list.querySelectorAll(":scope > [data-seq]");
  const last = rows.length ? Number(rows[rows.length - 1].dataset.seq) : 0;
  event.detail.socketWrapper.send(JSON.stringify({ after: last }));
});
