// onceflow console: the overview's charts (uPlot). Everything else is server-rendered
// HTML that htmx swaps in; the charts take the "series" events of the same stream as
// JSON: [[at_ms, in_per_s, out_per_s, held], ...].
(function () {
  "use strict";
  var charts = null;

  function columns(points) {
    var cols = [[], [], [], []];
    points.forEach(function (p) {
      cols[0].push(p[0] / 1000); cols[1].push(p[1]); cols[2].push(p[2]); cols[3].push(p[3]);
    });
    return cols;
  }

  function width(el) { return Math.max(320, Math.min(620, el.parentElement.clientWidth || 600)); }

  function makeCharts(points) {
    var rates = document.getElementById("chart-rates");
    var held = document.getElementById("chart-held");
    if (!rates || !held || typeof uPlot === "undefined") return null;
    var c = columns(points);
    return {
      rates: new uPlot({
        width: width(rates), height: 220,
        series: [{}, {label: "in /s", stroke: "#2457c5", width: 2},
                 {label: "out /s", stroke: "#1f8a4c", width: 2}],
        axes: [{}, {size: 60}]
      }, [c[0], c[1], c[2]], rates),
      held: new uPlot({
        width: width(held), height: 220,
        series: [{}, {label: "HW - LSO", stroke: "#b7791f", fill: "rgba(231,166,58,0.25)", width: 2}],
        axes: [{}, {size: 60}]
      }, [c[0], c[3]], held)
    };
  }

  function update(points) {
    if (!charts) { charts = makeCharts(points); return; }
    var c = columns(points);
    charts.rates.setData([c[0], c[1], c[2]]);
    charts.held.setData([c[0], c[3]]);
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!document.getElementById("chart-rates")) return;
    fetch("/series.json", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(update, function () { update([]); });
  });

  document.body && document.body.addEventListener("htmx:sseBeforeMessage", function (e) {
    if (e.detail && e.detail.type === "series") {
      e.preventDefault();
      try { update(JSON.parse(e.detail.data)); } catch (err) { /* a partial event: next one */ }
    }
  });
})();
