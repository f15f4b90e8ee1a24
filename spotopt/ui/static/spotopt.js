// Draws every <div class="chart" data-chart=ID> with uPlot from the JSON in <script id=ID>:
// {"x": [unix seconds], "series": [{"label", "y": [value or null]}], "range": [from, to] or absent}
// (spotopt.ui.views); data-paths="stepped" holds each value until the next point, otherwise points
// are joined. A chart is as wide as its box and follows it when the window is resized. Also colours
// the availability heatmap's cells from their data-share, and submits a form whose <select
// data-submit> changes: the page's content security policy allows no inline style or handler.
var charts = [];

function chartWidth(el) { return Math.max(el.clientWidth - 10, 100); }

function drawCharts(root) {
  root.querySelectorAll("div.chart[data-chart]").forEach(function (el) {
    if (el.dataset.drawn) return;
    var data = JSON.parse(document.getElementById(el.dataset.chart).textContent);
    if (!data || !data.x || data.x.length === 0) { el.textContent = "Nothing to chart yet."; return; }
    var unit = el.dataset.unit || "";
    var stepped = el.dataset.paths === "stepped";
    var palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
    var series = [{}].concat(data.series.map(function (s, i) {
      var line = { label: s.label, stroke: palette[i % palette.length], width: 1.5 };
      if (stepped) line.paths = uPlot.paths.stepped({ align: 1 });
      return line;
    }));
    var x = { time: true };
    if (data.range) x.range = data.range;  // the window the page names, whatever the points
    var opts = { width: chartWidth(el), height: 280, series: series,
      axes: [{}, { label: unit }], scales: { x: x },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); } };  // the page's times are UTC
    charts.push({ el: el, plot: new uPlot(opts, [data.x].concat(data.series.map(function (s) { return s.y; })), el) });
    el.dataset.drawn = "1";
  });
}

function colourHeatmap(root) {
  root.querySelectorAll(".heatmap .cell[data-share]").forEach(function (cell) {
    if (cell.dataset.share === "") return;  // not observed yet: the stylesheet's grey
    cell.style.background = "hsl(" + Math.round(Number(cell.dataset.share) * 120) + ", 65%, 45%)";
  });
}

window.addEventListener("resize", function () {
  charts.forEach(function (c) { c.plot.setSize({ width: chartWidth(c.el), height: 280 }); });
});

document.addEventListener("DOMContentLoaded", function () {
  drawCharts(document);
  colourHeatmap(document);
  document.querySelectorAll("select[data-submit]").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
});
