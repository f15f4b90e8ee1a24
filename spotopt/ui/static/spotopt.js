// Draws every <div class="chart" data-chart=ID> with uPlot from the JSON in <script id=ID>:
// {"x": [unix seconds], "series": [{"label", "y": [value or null]}]} (spotopt.ui.views);
// data-paths="stepped" holds each value until the next point, otherwise points are joined.
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
    var opts = { width: Math.max(el.clientWidth - 10, 300), height: 280, series: series,
      axes: [{}, { label: unit }], scales: { x: { time: true } },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); } };  // the page's times are UTC
    new uPlot(opts, [data.x].concat(data.series.map(function (s) { return s.y; })), el);
    el.dataset.drawn = "1";
  });
}
document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
