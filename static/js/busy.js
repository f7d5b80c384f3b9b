// A form marked data-busy="Starting the run" says so while its request is on its way (the
// server may take seconds: a run's start fetches the target's upstream first): its buttons
// are disabled, so a second click sends nothing twice, and the text counts the seconds.
// Without JavaScript the form simply submits.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.dataset.busy || event.defaultPrevented) return;
  const status = form.querySelector("[data-busy-status]") || form.appendChild(
    Object.assign(document.createElement("span"), { className: "busy muted" }));
  status.setAttribute("role", "status");
  const started = Date.now();
  const show = () => {
    status.textContent = ` ${form.dataset.busy}… ${Math.round((Date.now() - started) / 1000)} s`;
  };
  show();
  setInterval(show, 1000);
  form.setAttribute("aria-busy", "true");
  // Disabled after this event: a disabled submitter would drop its name=value from the form.
  setTimeout(() => {
    for (const button of form.querySelectorAll("button, input[type=submit]")) button.disabled = true;
  });
});
