// heapdump report: draws the sections of each process from the JSON in #heapdump-data
// (written by collector/src/report/model.rs). Charts by uPlot, flame graphs by d3-flame-graph.
(function () {
  "use strict";
  var errorsEl = document.getElementById("report-errors");
  function showError(text) {
    errorsEl.hidden = false;
    errorsEl.textContent += text + "\n";
  }
  window.addEventListener("error", function (e) {
    showError("error: " + e.message + (e.lineno ? " (line " + e.lineno + ")" : ""));
  });
  var consoleError = console.error;
  console.error = function () {
    showError("console.error: " + Array.prototype.join.call(arguments, " "));
    consoleError.apply(console, arguments);
  };

  var data = JSON.parse(document.getElementById("heapdump-data").textContent);
  var COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f"];
  var OTHER_COLOR = "#bab0ac";

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "class") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (children || []).forEach(function (c) { e.appendChild(c); });
    return e;
  }

  // 1536 -> "1.5 KiB"; exact bytes in titles and tooltips.
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    var a = Math.abs(n), units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (a >= 1024 && i < units.length - 1) { a /= 1024; i++; }
    return (n < 0 ? "-" : "") + (i === 0 ? a.toFixed(0) : a.toFixed(a < 10 ? 2 : 1)) + " " + units[i];
  }
  function exact(n) { return Number(n).toLocaleString("en-US"); }
  function when(ns) { return new Date(ns / 1e6).toISOString().replace(".000Z", "Z"); }
  function clock(ns) { return new Date(ns / 1e6).toISOString().slice(11, 19); }
  function rate(v, unit) { return v === null || v === undefined ? "–" : unit(v) + "/s"; }

  function summary(p) {
    var s = p.summary;
    var rows = [
      ["Process", "pid " + s.pid + (s.command ? " — " + s.command : "")],
      ["Snapshots", s.snapshots + ", from " + when(s.first_ns) + " to " + when(s.last_ns) +
        " (" + s.span_s.toFixed(1) + " s)"],
      ["Peak live bytes (of the snapshots)", bytes(s.peak_bytes) + " (" + exact(s.peak_bytes) +
        " bytes) at " + when(s.peak_ns)],
      ["The process's own peak (shim counter)", s.shim_peak_bytes === null ? "–" :
        bytes(s.shim_peak_bytes) + " (" + exact(s.shim_peak_bytes) + " bytes)"],
      ["Live now (last snapshot)", bytes(s.last_bytes) + " in " + exact(s.last_blocks) + " blocks"],
      ["Allocation rate (alloc_*)", rate(s.alloc_bytes_per_s, bytes) + ", " +
        rate(s.alloc_blocks_per_s, function (v) { return exact(Math.round(v)) + " blocks"; })],
    ];
    if (s.sampling) rows.push(["Recording", s.sampling]);
    return el("table", { class: "summary" }, rows.map(function (r) {
      return el("tr", {}, [el("th", { text: r[0] }), el("td", { text: r[1] })]);
    }));
  }

  // The timeline: the total, and the top sites stacked (cumulative fills drawn from the top
  // down, each legend value the site's own bytes).
  function timeline(p, host, onPick) {
    var tl = p.timeline, n = tl.t.length;
    var layers = tl.series.concat([tl.other]);
    var names = tl.sites.concat(["other"]);
    var cum = [], acc = new Array(n).fill(0);
    layers.forEach(function (v) {
      acc = acc.map(function (a, i) { return a + v[i]; });
      cum.push(acc.slice());
    });
    var series = [{ label: "time" }, {
      label: "total", stroke: "#000", width: 2,
      value: function (u, v) { return v === null ? "–" : bytes(v); },
    }];
    var dataRows = [tl.t, tl.total];
    // Drawn top layer first, so each next (lower) fill covers the part below it.
    for (var k = layers.length - 1; k >= 0; k--) {
      (function (k) {
        var color = k === layers.length - 1 ? OTHER_COLOR : COLORS[k % COLORS.length];
        series.push({
          label: names[k], stroke: color, fill: color + "cc", width: 1,
          value: function (u, v, si, idx) {
            return idx === null || idx === undefined ? "–" : bytes(layers[k][idx]);
          },
        });
        dataRows.push(cum[k]);
      })(k);
    }
    var width = Math.max(600, host.clientWidth || 900);
    var u = new uPlot({
      width: width, height: 320, series: series,
      scales: { x: { time: true } },
      axes: [{}, { values: function (u, vals) { return vals.map(bytes); }, size: 80 }],
      cursor: { points: { size: 6 } },
      legend: { live: true },
    }, dataRows, host);
    u.over.addEventListener("click", function (e) {
      var i = u.cursor.idx;
      if (i !== null && i !== undefined) onPick(i, e.shiftKey);
    });
    return u;
  }

  function sparkline(values, host) {
    var xs = values.map(function (_, i) { return i; });
    return new uPlot({
      width: 160, height: 36, legend: { show: false }, cursor: { show: false },
      axes: [{ show: false }, { show: false }],
      scales: { x: { time: false } },
      series: [{}, { stroke: "#e15759", fill: "#e1575933", width: 1.5 }],
    }, [xs, values], host);
  }

  function growthTable(p) {
    var head = el("tr", {}, ["#", "allocation site", "median slope", "line slope", "R²", "grew",
      "first → last",
      "live bytes over time"].map(function (h) { return el("th", { text: h }); }));
    var rows = p.growth.map(function (g, i) {
      var spark = el("td", { class: "spark" });
      var tr = el("tr", { class: "growth-row" }, [
        el("td", { text: String(i + 1) }),
        el("td", { class: "site", text: g.site, title: g.site }),
        el("td", { class: "num", text: (g.median_slope >= 0 ? "+" : "") + bytes(g.median_slope) + "/s" +
          (g.since > 0 ? " since " + g.since.toFixed(0) + " s" : "") }),
        el("td", { class: "num", text: (g.slope >= 0 ? "+" : "") + bytes(g.slope) + "/s" }),
        el("td", { class: "num", text: g.r2.toFixed(2) }),
        el("td", { class: "num", text: Math.round(g.grew * 100) + "%" }),
        el("td", { class: "num", text: bytes(g.first) + " → " + bytes(g.last) }),
        spark,
      ]);
      tr.dataset.values = JSON.stringify(g.values);
      return tr;
    });
    return el("table", { class: "growth" }, [head].concat(rows));
  }

  // The flame graphs: live bytes per stack at snapshot i, replayed from the deltas.
  function Flame(p) {
    this.f = p.flame;
    this.vals = new Float64Array(this.f.parent.length);
    this.at = -1;
  }
  Flame.prototype.valuesAt = function (i) {
    if (i < this.at) { this.vals.fill(0); this.at = -1; }
    for (var k = this.at + 1; k <= i; k++) {
      var d = this.f.deltas[k], node = -1;
      for (var j = 0; j < d.length; j += 2) { node += d[j]; this.vals[node] += d[j + 1]; }
    }
    this.at = i;
    return this.vals.slice();
  };
  // The d3-flame-graph tree of per-stack values `v` (only stacks > 0): each frame's value is
  // its total, its own stacks' and its callees'.
  Flame.prototype.tree = function (v, label) {
    var f = this.f, objs = new Map(), root = { name: label, value: 0, children: [] };
    for (var node = 0; node < v.length; node++) {
      if (!(v[node] > 0)) continue;
      var chain = [], at = node;
      while (at !== -1 && !objs.has(at)) { chain.push(at); at = f.parent[at]; }
      var up = at === -1 ? root : objs.get(at);
      for (var c = chain.length - 1; c >= 0; c--) {
        var o = { name: f.names[f.name[chain[c]]], value: 0, children: [] };
        up.children.push(o);
        objs.set(chain[c], o);
        up = o;
      }
      for (at = node; at !== -1; at = f.parent[at]) objs.get(at).value += v[node];
      root.value += v[node];
    }
    return root;
  };

  function flameSection(p, host) {
    var fl = new Flame(p), n = p.timeline.t.length;
    var stamps = p.timeline.t.map(function (t, i) {
      return "#" + (i + 1) + " " + clock(t * 1e9) + " — " + bytes(p.timeline.total[i]);
    });
    function select(id, pick) {
      return el("select", { id: id }, stamps.map(function (s, i) {
        var o = el("option", { value: String(i), text: s });
        if (i === pick) o.selected = true;
        return o;
      }));
    }
    var pid = p.pid;
    var mode = el("select", { id: "mode-" + pid }, [
      el("option", { value: "at", text: "live at snapshot B" }),
      el("option", { value: "new", text: "new between A and B (growth per stack)" }),
    ]);
    var selA = select("a-" + pid, 0), selB = select("b-" + pid, n - 1);
    var search = el("input", { type: "search", placeholder: "search functions (regex)" });
    var reset = el("button", { type: "button", text: "reset zoom" });
    var details = el("div", { class: "details" });
    var chartEl = el("div", { class: "flame" });
    host.appendChild(el("div", { class: "controls" }, [
      el("label", { text: "show " }), mode, el("label", { text: " A " }), selA,
      el("label", { text: " B " }), selB, search, reset,
    ]));
    host.appendChild(el("p", { class: "hint", text: "Click the timeline to pick B (shift-click: A). " +
      "Click a frame to zoom; hover for its bytes." }));
    host.appendChild(chartEl);
    host.appendChild(details);
    var chart = null;
    // d3-flame-graph sets each frame's rect width through a d3 transition, run on a later
    // animation frame (and seen cut short under headless Chromium's virtual time): end them
    // now, with each rect as wide as its frame (the group's width, set at once).
    function settle() {
      d3.select(chartEl).selectAll("rect").interrupt();
      Array.prototype.forEach.call(chartEl.querySelectorAll("g.frame"), function (g) {
        var r = g.querySelector("rect");
        if (r && g.getAttribute("width") !== null) r.setAttribute("width", g.getAttribute("width"));
      });
    }
    function draw() {
      var a = +selA.value, b = +selB.value, v, label;
      if (mode.value === "new") {
        var va = fl.valuesAt(Math.min(a, b)), vb = fl.valuesAt(Math.max(a, b));
        v = vb.map(function (x, i) { return Math.max(0, x - va[i]); });
        label = "new between #" + (Math.min(a, b) + 1) + " and #" + (Math.max(a, b) + 1);
      } else {
        v = fl.valuesAt(b);
        label = "live at #" + (b + 1) + " " + clock(p.timeline.t[b] * 1e9);
      }
      var root = fl.tree(v, label);
      chartEl.textContent = "";
      if (root.children.length === 0) {
        chartEl.appendChild(el("p", { class: "empty", text: label + ": nothing" }));
        chart = null;
        return;
      }
      chart = flamegraph.default()
        .width(Math.max(600, chartEl.clientWidth || 900))
        .cellHeight(18)
        .selfValue(false)
        .transitionDuration(0)
        // No animation: whenever a transition ticks, its frames are at their end state.
        .transitionEase(function () { return 1; })
        .minFrameSize(1)
        .title("")
        .setDetailsElement(details)
        .setLabelHandler(function (d) { return d.data.name + " — " + bytes(d.value) + " (" + exact(d.value) + " bytes)"; });
      d3.select(chartEl).datum(root).call(chart);
      settle();
      if (search.value) chart.search(search.value);
    }
    // `report.html#new` opens on what is new between the first and the last snapshot.
    if (location.hash === "#new") mode.value = "new";
    [mode, selA, selB].forEach(function (s) { s.addEventListener("change", draw); });
    search.addEventListener("input", function () {
      if (!chart) return;
      if (search.value) chart.search(search.value); else chart.clear();
    });
    reset.addEventListener("click", function () { if (chart) chart.resetZoom(); });
    draw();
    return function pick(i, asA) {
      (asA ? selA : selB).value = String(i);
      draw();
    };
  }

  // The flame data: gzip-compressed JSON in base64 (see model.rs), inflated by the browser.
  function inflate(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }

  var main = document.getElementById("report"), toc = document.getElementById("toc");
  // A table of sites: head labels, and per row [site, numbers...] (numbers as bytes or counts).
  function siteTable(cls, head, rows) {
    var h = el("tr", {}, head.map(function (t) { return el("th", { text: t }); }));
    return el("table", { class: "growth " + cls }, [h].concat(rows.map(function (r) {
      return el("tr", {}, r.map(function (c, i) {
        return i === 0 ? el("td", { class: "site", text: c, title: c }) : el("td", { class: "num", text: c });
      }));
    })));
  }

  // The Leaks section: each `leaks -o` profile among the inputs.
  function leaksSection(p, sec) {
    if (!p.leaks || p.leaks.length === 0) return;
    sec.appendChild(el("h3", { text: "Leaks: blocks no chain of pointers from a root reaches" }));
    p.leaks.forEach(function (l) {
      var total = l.direct_bytes + l.indirect_bytes;
      sec.appendChild(el("p", { class: "leaks-summary", text: l.file + (l.t_ns ? ", taken " + when(l.t_ns) : "") +
        ": " + bytes(total) + " (" + exact(total) + " bytes) leaked in " +
        exact(l.direct_blocks + l.indirect_blocks) + " blocks — direct " + exact(l.direct_bytes) +
        " bytes in " + exact(l.direct_blocks) + " blocks, indirect " + exact(l.indirect_bytes) +
        " bytes in " + exact(l.indirect_blocks) + " blocks, of " + exact(l.live_blocks) + " live blocks" }));
      var rows = l.sites.map(function (s) { return [s.site, bytes(s.bytes) + " (" + exact(s.bytes) + ")", exact(s.blocks)]; });
      if (l.more_sites > 0) rows.push(["(" + l.more_sites + " more sites)", "", ""]);
      sec.appendChild(siteTable("leaks", ["leak site", "leaked bytes", "blocks"], rows));
    });
  }

  // The Reference graph section: each graph capture among the inputs.
  function graphSection(p, sec) {
    if (!p.graphs || p.graphs.length === 0) return;
    sec.appendChild(el("h3", { text: "Reference graph: what retains the most (dominator tree)" }));
    p.graphs.forEach(function (g) {
      sec.appendChild(el("p", { class: "graph-summary", text: g.file + ", taken " + when(g.t_ns) + ": " +
        exact(g.blocks) + " blocks, " + bytes(g.bytes) + " (" + exact(g.bytes) + " bytes), " +
        exact(g.roots) + " roots, " + exact(g.edges) + " references" }));
      sec.appendChild(siteTable("retained", ["allocation site", "retained bytes", "blocks"],
        g.sites.map(function (s) { return [s.site, bytes(s.retained) + " (" + exact(s.retained) + ")", exact(s.blocks)]; })));
    });
  }

  var pending = [];
  if (data.processes.length === 0) {
    main.appendChild(el("p", { text: "No snapshots." }));
  }
  data.processes.forEach(function (p) {
    var id = "pid-" + p.pid + "-" + p.start_ticks;
    var title = "pid " + p.pid + (p.command ? " — " + p.command : "");
    toc.appendChild(el("a", { href: "#" + id, text: title }));
    var sec = el("section", { class: "process", id: id });
    main.appendChild(sec);
    sec.appendChild(el("h2", { text: title }));
    if (!p.summary) {
      // Only a leaks profile or a graph capture of this process among the inputs.
      leaksSection(p, sec);
      graphSection(p, sec);
      return;
    }
    sec.appendChild(el("h3", { text: "Summary" }));
    sec.appendChild(summary(p));
    sec.appendChild(el("h3", { text: "Timeline: live bytes, stacked by allocation site" }));
    var tlHost = el("div", { class: "timeline" });
    sec.appendChild(tlHost);
    sec.appendChild(el("h3", { text: "Growth ranking: sites by sustained growth" }));
    sec.appendChild(el("p", { class: "hint", text: "median slope: the median of the slopes " +
      "between every two snapshots (Theil–Sen; a passing burst barely moves it); " +
      "line slope: least squares; R²: how straight a line it is (1 = steady); grew: the share " +
      "of intervals that grew. Ranked by median slope × R² × how evenly the growth is " +
      "spread over the intervals: a leak ranks high; a flat cache, a passing burst or a " +
      "one-off step low. A site that reached a new high recently is also scored over its " +
      "last half, quarter, … of the snapshots (at least 5): a leak that began late ranks by " +
      "its growth there (\"since N s\": the figures are that stretch's)." }));
    var gt = growthTable(p);
    sec.appendChild(gt);
    sec.appendChild(el("h3", { text: "Flame graph" }));
    var flHost = el("div", { class: "flame-section" });
    sec.appendChild(flHost);
    leaksSection(p, sec);
    graphSection(p, sec);
    var pick = null;
    timeline(p, tlHost, function (i, asA) { if (pick) pick(i, asA); });
    pending.push(inflate(p.flame_gz).then(function (flame) {
      p.flame = flame;
      pick = flameSection(p, flHost);
    }));
    Array.prototype.forEach.call(gt.querySelectorAll("tr.growth-row"), function (tr) {
      sparkline(JSON.parse(tr.dataset.values), tr.querySelector("td.spark"));
    });
  });
  Promise.all(pending).then(function () {
    document.body.setAttribute("data-ready", "1");
  }, function (e) {
    showError("error: the flame graph data: " + e);
  });
})();
