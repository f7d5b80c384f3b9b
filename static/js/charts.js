// Draws every figure embedded with json_script as <script id="X-figure">, into the element
// X: the CSP allows no inline script, and plotly.js is served from our own static files. Also
// in the parts a live page replaces (live-log.js: "infraops:replaced"), such as an experiment's
// feedback when it finishes.
//
// A figure is drawn in the page's own colours (the CSS variables of static/css/infraops.css),
// so it follows the dark scheme instead of staying a white block, and is drawn again when the
// scheme changes. On a narrow screen its legend goes under the plot: at its side, on a 390 px
// phone, it took half the width from the data.
const NARROW = 600; // px: below this a chart's legend is laid out under the plot
const drawn = new Map(); // element -> its figure as the server sent it

function pageColours() {
  const style = getComputedStyle(document.documentElement);
  const colour = (name) => style.getPropertyValue(name).trim();
  return { ink: colour("--fg"), muted: colour("--muted"), line: colour("--line"),
           surface: colour("--surface") };
}

// The server's layout with the page's colours and, on a narrow element, the legend beneath.
function fitted(layout, width) {
  const { ink, muted, line, surface } = pageColours();
  const result = { ...layout, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
                   font: { ...(layout.font || {}), color: ink },
                   hoverlabel: { ...(layout.hoverlabel || {}), bgcolor: surface, font: { color: ink } },
                   legend: { ...(layout.legend || {}), bgcolor: "rgba(0,0,0,0)", font: { color: ink } } };
  for (const key of Object.keys(layout).filter((k) => /^[xy]axis\d*$/.test(k))) {
    result[key] = { ...layout[key], color: muted, linecolor: muted, tickcolor: muted,
                    gridcolor: line, zerolinecolor: line };
  }
  if (width < NARROW) {
    result.legend = { ...result.legend, orientation: "h", x: 0, xanchor: "left", y: -0.2,
                      yanchor: "top" };
    const margin = layout.margin || {};
    result.margin = { ...margin, l: Math.min(margin.l ?? 60, 50), r: Math.min(margin.r ?? 20, 10),
                      b: Math.max(margin.b ?? 50, 90) };
  }
  return result;
}

function draw(target, figure) {
  // topojsonURL: plotly's default names its CDN (for geo traces, not in this bundle); ours
  // points at our own files, so nothing of the page could ever reach for a CDN.
  window.Plotly.react(target, figure.data, fitted(figure.layout, target.clientWidth),
    { displaylogo: false, responsive: true, topojsonURL: "/static/vendor/plotly/" });
  target.dataset.narrow = target.clientWidth < NARROW ? "1" : "";
}

function drawCharts(root) {
  if (!window.Plotly) return;
  for (const source of root.querySelectorAll('script[type="application/json"][id$="-figure"]')) {
    const target = document.getElementById(source.id.slice(0, -"-figure".length));
    if (!target || target.dataset.drawn) continue;
    const figure = JSON.parse(source.textContent);
    drawn.set(target, figure);
    draw(target, figure);
    target.dataset.drawn = "1";
  }
}

// Again in the other scheme's colours, or with the legend moved, for what is still on the page.
function redraw(onlyWhereWidthCrossed) {
  for (const [target, figure] of drawn) {
    if (!target.isConnected) { drawn.delete(target); continue; }
    const narrow = target.clientWidth < NARROW ? "1" : "";
    if (!onlyWhereWidthCrossed || narrow !== target.dataset.narrow) draw(target, figure);
  }
}

document.addEventListener("DOMContentLoaded", () => drawCharts(document));
document.addEventListener("infraops:replaced", (event) => drawCharts(event.detail.node));
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => redraw(false));
window.addEventListener("resize", () => redraw(true));
