// Draws every figure embedded with json_script as <script id="X-figure">, into the element
// X: the CSP allows no inline script, and plotly.js is served from our own static files. Also
// in the parts a live page replaces (live-log.js: "infraops:replaced"), such as an experiment's
// feedback when it finishes.
function drawCharts(root) {
  if (!window.Plotly) return;
  for (const source of root.querySelectorAll('script[type="application/json"][id$="-figure"]')) {
    const target = document.getElementById(source.id.slice(0, -"-figure".length));
    if (!target || target.dataset.drawn) continue;
    const figure = JSON.parse(source.textContent);
    // topojsonURL: plotly's default names its CDN (for geo traces, not in this bundle); ours
    // points at our own files, so nothing of the page could ever reach for a CDN.
    window.Plotly.newPlot(target, figure.data, figure.layout,
      { displaylogo: false, responsive: true, topojsonURL: "/static/vendor/plotly/" });
    target.dataset.drawn = "1";
  }
}

document.addEventListener("DOMContentLoaded", () => drawCharts(document));
document.addEventListener("infraops:replaced", (event) => drawCharts(event.detail.node));
