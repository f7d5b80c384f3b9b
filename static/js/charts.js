// Draws every figure embedded with json_script as <script id="X-figure">, into the element
// X: the CSP allows no inline script, and plotly.js is served from our own static files.
document.addEventListener("DOMContentLoaded", () => {
  for (const source of document.querySelectorAll('script[type="application/json"][id$="-figure"]')) {
    const target = document.getElementById(source.id.slice(0, -"-figure".length));
    if (!target || !window.Plotly) continue;
    const figure = JSON.parse(source.textContent);
    window.Plotly.newPlot(target, figure.data, figure.layout, { displaylogo: false, responsive: true });
  }
});
