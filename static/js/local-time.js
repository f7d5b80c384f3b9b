// Times arrive in UTC with the zone named (infraops/templatetags/local_time.py); here each is
// rewritten in the viewer's own zone, named too, with the UTC moment kept as its title. Also
// in rows a live page appends or swaps in.
const formats = {
  time: { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "short" },
  datetime: {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    hour12: false, timeZoneName: "short",
  },
};

function localizeTimes(root) {
  for (const element of root.querySelectorAll("time[data-local]:not([data-localized])")) {
    const moment = new Date(element.getAttribute("datetime"));
    const format = formats[element.dataset.local];
    if (Number.isNaN(moment.getTime()) || !format) continue;
    element.title = element.textContent;
    element.textContent = new Intl.DateTimeFormat(undefined, format).format(moment);
    element.dataset.localized = "1";
  }
}

document.addEventListener("DOMContentLoaded", () => localizeTimes(document));
for (const name of ["htmx:afterSettle", "htmx:oobAfterSwap", "htmx:wsAfterMessage", "infraops:replaced"]) {
  document.addEventListener(name, () => localizeTimes(document));
}
