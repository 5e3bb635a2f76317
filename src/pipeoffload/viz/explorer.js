/* pipeoffload schedule explorer: inlined into every page by pipeoffload.viz.html.
 * Reads the JSON in #po-data (layout: pipeoffload.viz.html.timeline_data), builds the page
 * in #po-app and draws every timeline on a canvas: per rank its op lanes, its memory curve,
 * its peak and bubble. No network, no library: everything it needs is in this file. */
(function () {
  "use strict";
  var loadStart = performance.now();
  var DATA = JSON.parse(document.getElementById("po-data").textContent);
  var LANES = DATA.lanes;
  var PAL = DATA.palette;
  var COMPUTE_KINDS = { F: 1, B: 1, W: 1, BW: 1 };
  var COMM_NAMES = { SEND_F: "send activation", RECV_F: "receive activation", SEND_B: "send gradient",
    RECV_B: "receive gradient" };
  var MEM_COLOR = "#333f4f", BASE_COLOR = "#b03030", GRID = "#e8ebef";
  var G = { ruler: 24, compute: 20, xfer: 8, err: 6, mem: 30, gap: 10, left: 78, right: 168, bottom: 6 };
  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif';

  // --- small helpers ---------------------------------------------------------------------
  function h(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "html") e.innerHTML = attrs[k];
      else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), attrs[k]);
      else e.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return e;
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function clamp(x, a, b) { return x < a ? a : x > b ? b : x; }
  function hexRgb(hex) {
    var c = hex.replace("#", "");
    return [parseInt(c.slice(0, 2), 16), parseInt(c.slice(2, 4), 16), parseInt(c.slice(4, 6), 16)];
  }
  function rgbCss(rgb) { return "rgb(" + rgb.map(function (x) { return Math.round(x); }).join(",") + ")"; }
  function lum(rgb) { return (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]) / 255; }
  var colourCache = {};
  /* The PNG's colours: the kind's colour, later chunks of compute kinds mixed towards white. */
  function opColour(kind, chunk, chunks) {
    var key = kind + "|" + chunk + "|" + chunks;
    var c = colourCache[key];
    if (!c) {
      var base = hexRgb(PAL.kinds[kind] || PAL.comm);
      var mix = 0;
      if (chunks > 1 && chunk > 0 && COMPUTE_KINDS[kind]) mix = PAL.chunk_mix * Math.min(chunk, chunks - 1) / (chunks - 1);
      var rgb = base.map(function (x) { return x + (255 - x) * mix; });
      c = colourCache[key] = { css: rgbCss(rgb), text: lum(rgb) > 0.55 ? "#111" : "#fff" };
    }
    return c;
  }
  /* Measured vs predicted duration: blue faster, red slower, white equal; ±50% and beyond saturate. */
  var ERR_STEPS = 10;
  function errColour(e) {
    var q = Math.round(clamp(e / 0.5, -1, 1) * ERR_STEPS) / ERR_STEPS;
    var base = q < 0 ? [37, 99, 176] : [197, 48, 48], f = Math.abs(q);
    return rgbCss(base.map(function (x) { return 255 + (x - 255) * f; }));
  }
  function fmt(x) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    if (Number.isInteger(x)) return String(x);
    return String(parseFloat(x.toPrecision(5)));
  }
  function fmtMem(x, unit) {
    if (x === null || x === undefined) return "–";
    if (unit === "bytes") {
      var scales = [[1073741824, "GiB"], [1048576, "MiB"], [1024, "KiB"]];
      for (var i = 0; i < scales.length; i++) {
        if (Math.abs(x) >= scales[i][0]) return parseFloat((x / scales[i][0]).toPrecision(3)) + " " + scales[i][1];
      }
      return Math.round(x) + " B";
    }
    return String(parseFloat(Number(x).toPrecision(4)));
  }
  function memUnitName(unit) { return unit === "bytes" ? "" : " " + unit; }
  function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%"; }
  function signed(x, f) { return (x > 0 ? "+" : x < 0 ? "−" : "±") + f(Math.abs(x)); }
  function lowerBound(arr, idx, value) { // first j with arr[idx[j]] >= value
    var lo = 0, hi = idx.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (arr[idx[mid]] < value) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function upperBoundPlain(arr, value) { // first j with arr[j] > value
    var lo = 0, hi = arr.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (arr[mid] <= value) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function niceStep(span, px, minPx) {
    var raw = span / Math.max(1, px / minPx), p = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / p;
    return p * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
  }
  function stepDecimals(step) { return Math.max(0, -Math.floor(Math.log10(step) + 1e-9)); }

  // --- datasets --------------------------------------------------------------------------
  /* Per rank and lane the op indices by start, the longest op of each list (to cull by
   * binary search), ops by microbatch (to highlight one) and the time range. */
  function prepare(d) {
    if (d._prep) return d._prep;
    var o = d.ops, n = o.start.length, lanes = [], maxDur = [], byMb = {}, t0 = 0, t1 = 0, i, r;
    for (r = 0; r < d.p; r++) { lanes.push(LANES.map(function () { return []; })); maxDur.push(LANES.map(function () { return 0; })); }
    for (i = 0; i < n; i++) {
      r = o.rank[i];
      lanes[r][o.lane[i]].push(i);
      maxDur[r][o.lane[i]] = Math.max(maxDur[r][o.lane[i]], o.end[i] - o.start[i]);
      (byMb[o.mb[i]] = byMb[o.mb[i]] || []).push(i);
      t0 = Math.min(t0, o.start[i]);
      t1 = Math.max(t1, o.end[i]);
    }
    lanes.forEach(function (perLane) {
      perLane.forEach(function (idx) { idx.sort(function (a, b) { return o.start[a] - o.start[b] || o.end[a] - o.end[b]; }); });
    });
    var memTop = 0;
    d.memory.concat(d.baseline || []).forEach(function (c) {
      if (!c) return;
      c[1].forEach(function (v) { memTop = Math.max(memTop, v); });
      if (c[0].length) t1 = Math.max(t1, c[0][c[0].length - 1]);
    });
    d._prep = { lanes: lanes, maxDur: maxDur, byMb: byMb, n: n, t0: t0, t1: t1 > t0 ? t1 : t0 + 1, memTop: memTop,
      xfer: d.lanes.filter(function (l) { return l !== "compute"; }).map(function (l) { return LANES.indexOf(l); }) };
    return d._prep;
  }
  function fmtT(d, x) { return fmt(x) + (d.time.unit ? " " + d.time.unit : ""); }
  function kindName(kind) {
    var n = PAL.names[kind] || COMM_NAMES[kind] || kind;
    return n.indexOf(kind + " ") === 0 ? n.slice(kind.length + 1) : n;
  }

  // --- explorer state --------------------------------------------------------------------
  var X = {
    panels: [], hidden: {}, view: [0, 1], full: [0, 1], hover: null, cursorT: null, brush: null, drag: null,
    memTop: {}, numRanks: 0, pending: false, waiters: [], rankBoxes: [], viewText: null,
    stats: { draws: 0, lastDrawMs: 0, maxDrawMs: 0, totalDrawMs: 0, firstDrawMs: null, loadMs: null }
  };
  var tooltip = h("div", { id: "po-tooltip", role: "tooltip" });

  function Panel(ds, host, role) {
    this.ds = ds;
    this.prep = prepare(ds);
    this.role = role || "";
    this.drawn = 0;
    var d = ds;
    var figs = h("span", { class: "po-figs", html: panelFigures(d) });
    this.el = h("section", { class: "po-panel", "data-key": d.key }, [
      h("header", null, [h("h2", { text: d.title }), figs]),
    ]);
    this.canvas = h("canvas", { class: "po-base", role: "img", "aria-label": d.title + ": " + figs.textContent });
    this.overlay = h("canvas", { class: "po-overlay" });
    this.wrap = h("div", { class: "po-canvas" }, [this.canvas, this.overlay]);
    this.el.appendChild(this.wrap);
    host.appendChild(this.el);
    this.ctx = this.canvas.getContext("2d");
    this.octx = this.overlay.getContext("2d");
    bindPointer(this);
  }
  function panelFigures(d) {
    var peak = Math.max.apply(null, d.peaks.concat([0]));
    var s = "bubble <b>" + pct(d.bubble) + "</b> · makespan <b>" + esc(fmtT(d, d.makespan)) + "</b> · peak memory <b>" +
      esc(fmtMem(peak, d.memory_unit)) + "</b>" + esc(memUnitName(d.memory_unit));
    if (d.baseline_peaks) s += " (without offload " + esc(fmtMem(Math.max.apply(null, d.baseline_peaks), d.memory_unit)) + ")";
    return s + " · " + d.ops.start.length + " ops";
  }

  Panel.prototype.layout = function (width) {
    var d = this.ds, prep = this.prep, y = G.ruler + 4, rows = [], self = this;
    for (var r = 0; r < d.p; r++) {
      if (X.hidden[r]) continue;
      var row = { rank: r, top: y, lanes: {} };
      row.lanes[0] = { y: y, h: G.compute };
      y += G.compute;
      prep.xfer.forEach(function (li) { y += 1; row.lanes[li] = { y: y, h: G.xfer }; y += G.xfer; });
      if (d.ops.error) { y += 2; row.err = { y: y, h: G.err }; y += G.err; }
      y += 3;
      row.mem = { y: y, h: G.mem };
      y += G.mem;
      row.bottom = y;
      y += G.gap;
      rows.push(row);
    }
    this.rows = rows;
    this.rowOfRank = {};
    rows.forEach(function (row) { self.rowOfRank[row.rank] = row; });
    this.width = Math.max(320, Math.floor(width));
    this.height = rows.length ? y - G.gap + G.bottom : G.ruler + 40;
    this.plotL = G.left;
    this.plotR = this.width - G.right;
    this.plotW = Math.max(10, this.plotR - this.plotL);
    var dpr = window.devicePixelRatio || 1;
    [this.canvas, this.overlay].forEach(function (c) {
      c.width = Math.round(self.width * dpr);
      c.height = Math.round(self.height * dpr);
      c.style.width = self.width + "px";
      c.style.height = self.height + "px";
    });
    this.wrap.style.height = this.height + "px";
    this.dpr = dpr;
  };
  Panel.prototype.tx = function (t) { return this.plotL + (t - X.view[0]) * this.plotW / (X.view[1] - X.view[0]); };
  Panel.prototype.tAt = function (x) { return X.view[0] + (x - this.plotL) * (X.view[1] - X.view[0]) / this.plotW; };

  Panel.prototype.draw = function () {
    var ctx = this.ctx, d = this.ds, o = d.ops, prep = this.prep, self = this;
    var v0 = X.view[0], v1 = X.view[1], L = this.plotL, k = this.plotW / (v1 - v0);
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.clearRect(0, 0, this.width, this.height);
    this.drawRuler(ctx, v0, v1);
    ctx.save();
    ctx.beginPath();
    ctx.rect(L, 0, this.plotW, this.height);
    ctx.clip();
    // Ops: one Path2D per colour, culled to the view by binary search on each lane.
    var paths = {}, order = [], labels = [], drawn = 0, errPaths = {};
    function pathOf(store, css) { var p = store[css]; if (!p) { p = store[css] = new Path2D(); if (store === paths) order.push(css); } return p; }
    this.rows.forEach(function (row) {
      Object.keys(row.lanes).forEach(function (liKey) {
        var li = +liKey, idx = prep.lanes[row.rank][li], lane = row.lanes[li];
        if (!idx.length) return;
        for (var j = lowerBound(o.start, idx, v0 - prep.maxDur[row.rank][li]); j < idx.length; j++) {
          var i = idx[j], s = o.start[i];
          if (s > v1) break;
          var e = o.end[i];
          if (e < v0) continue;
          // Whole pixels: crisp edges, and a 1 px gap between neighbours wider than 3 px.
          var x0 = Math.round(L + (s - v0) * k), w = Math.round(L + (e - v0) * k) - x0;
          if (w > 3) w -= 1; else if (w < 1) w = 1;
          var col = opColour(d.kinds[o.kind[i]], o.chunk[i], d.v);
          pathOf(paths, col.css).rect(x0, lane.y, w, lane.h);
          drawn++;
          if (li === 0 && w >= 9) labels.push(i, x0 + w / 2, lane.y + lane.h / 2, w, col.text);
          if (li === 0 && row.err && o.error && o.error[i] !== null) pathOf(errPaths, errColour(o.error[i])).rect(x0, row.err.y, w, row.err.h);
        }
      });
    });
    order.forEach(function (css) { ctx.fillStyle = css; ctx.fill(paths[css]); });
    Object.keys(errPaths).forEach(function (css) { ctx.fillStyle = css; ctx.fill(errPaths[css]); });
    if (labels.length) {
      ctx.font = "10px " + FONT;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      var digit = ctx.measureText("0").width;
      for (var q = 0; q < labels.length; q += 5) {
        var text = String(o.mb[labels[q]]);
        if (labels[q + 3] < text.length * digit + 3) continue;
        ctx.fillStyle = labels[q + 4];
        ctx.fillText(text, labels[q + 1], labels[q + 2] + 0.5);
      }
    }
    // Memory: the step curve filled, the curve without offload dashed; one y scale per unit.
    var top = X.memTop[d.memory_unit] || 1;
    this.rows.forEach(function (row) {
      var m = row.mem, Y = function (v) { return m.y + m.h - (v / top) * m.h; };
      self.drawCurve(ctx, d.memory[row.rank], Y, m, v0, v1, k, false);
      if (d.baseline && d.baseline[row.rank]) self.drawCurve(ctx, d.baseline[row.rank], Y, m, v0, v1, k, true);
    });
    ctx.restore();
    this.drawGutters(ctx);
    this.drawn = drawn;
    this.canvas.setAttribute("data-drawn", String(drawn));
  };

  Panel.prototype.drawCurve = function (ctx, curve, Y, m, v0, v1, k, dashed) {
    var ts = curve[0], ls = curve[1], L = this.plotL;
    if (!ts.length) return;
    var tEnd = Math.max(this.prep.t1, X.full[1]);
    var j = Math.max(0, upperBoundPlain(ts, v0) - 1);
    var pts = [];
    var x = function (t) { return L + (t - v0) * k; };
    pts.push(x(Math.max(ts[j], v0 - (v1 - v0))), Y(ls[j]));
    for (j = j + 1; j < ts.length; j++) {
      pts.push(x(ts[j]), Y(ls[j - 1]), x(ts[j]), Y(ls[j]));
      if (ts[j] > v1) break;
    }
    if (j >= ts.length) pts.push(x(Math.min(tEnd, v1 + (v1 - v0))), Y(ls[ls.length - 1]));
    else pts.push(x(ts[j]), Y(ls[j]));
    var line = new Path2D();
    line.moveTo(pts[0], pts[1]);
    for (var q = 2; q < pts.length; q += 2) line.lineTo(pts[q], pts[q + 1]);
    if (dashed) {
      ctx.setLineDash([4, 3]);
      ctx.strokeStyle = BASE_COLOR;
      ctx.lineWidth = 1;
      ctx.stroke(line);
      ctx.setLineDash([]);
      return;
    }
    var area = new Path2D(line);
    area.lineTo(pts[pts.length - 2], m.y + m.h);
    area.lineTo(pts[0], m.y + m.h);
    area.closePath();
    ctx.fillStyle = "rgba(51,63,79,0.16)";
    ctx.fill(area);
    ctx.strokeStyle = MEM_COLOR;
    ctx.lineWidth = 1.1;
    ctx.stroke(line);
  };

  Panel.prototype.drawRuler = function (ctx, v0, v1) {
    var L = this.plotL, W = this.plotW, d = this.ds;
    ctx.fillStyle = "#f3f5f8";
    ctx.fillRect(L, 0, W, G.ruler);
    var step = niceStep(v1 - v0, W, 90), dec = stepDecimals(step);
    ctx.font = "11px " + FONT;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (var t = Math.ceil(v0 / step) * step; t <= v1 + 1e-9 * step; t += step) {
      var x = Math.round(this.tx(t)) + 0.5;
      ctx.fillStyle = GRID;
      ctx.fillRect(x - 0.5, G.ruler, 1, this.height - G.ruler);
      ctx.fillStyle = "#8993a0";
      ctx.fillRect(x - 0.5, G.ruler - 5, 1, 5);
      ctx.fillStyle = "#3d4752";
      if (x > L + 12 && x < L + W - 12) ctx.fillText(t.toFixed(dec), x, 10);
    }
    ctx.textAlign = "right";
    ctx.fillStyle = "#6b7682";
    ctx.fillText(d.time.unit || "time", L - 8, 10);
  };

  Panel.prototype.drawGutters = function (ctx) {
    var d = this.ds, W = this.width, top = X.memTop[d.memory_unit] || 1;
    ctx.textBaseline = "middle";
    this.rows.forEach(function (row) {
      var r = row.rank;
      ctx.textAlign = "right";
      ctx.fillStyle = "#1f2933";
      ctx.font = "600 12px " + FONT;
      ctx.fillText("rank " + r, G.left - 8, row.lanes[0].y + row.lanes[0].h / 2);
      ctx.font = "9px " + FONT;
      ctx.fillStyle = "#6b7682";
      Object.keys(row.lanes).forEach(function (li) {
        if (+li !== 0) ctx.fillText(LANES[+li], G.left - 8, row.lanes[li].y + row.lanes[li].h / 2);
      });
      if (row.err) ctx.fillText("Δ time", G.left - 8, row.err.y + row.err.h / 2);
      var m = row.mem, peak = d.peaks[r];
      ctx.fillText("memory", G.left - 8, m.y + m.h - 6);
      if (peak > 0) {
        var yp = m.y + m.h - (peak / top) * m.h;
        ctx.fillStyle = "#333f4f";
        ctx.fillText(fmtMem(peak, d.memory_unit), G.left - 8, Math.min(yp + 4, m.y + m.h - 17));
      }
      // The rank's figures, right of the plot.
      var lines = ["peak " + fmtMem(peak, d.memory_unit) + memUnitName(d.memory_unit)];
      if (d.peaks_in_op && Math.abs(d.peaks_in_op[r] - peak) > 0.005 * Math.max(peak, 1e-12)) lines.push("in-op peak " + fmtMem(d.peaks_in_op[r], d.memory_unit));
      if (d.baseline_peaks) lines.push("no offload " + fmtMem(d.baseline_peaks[r], d.memory_unit));
      lines.push("bubble " + pct(d.bubbles[r]));
      if (d.error_median) lines.push("|Δ| median " + pct(d.error_median[r]));
      var room = Math.max(1, Math.floor((row.bottom - row.top) / 13));
      ctx.textAlign = "left";
      ctx.font = "11.5px " + FONT;
      lines.slice(0, room).forEach(function (line, q) {
        ctx.fillStyle = q === 0 ? "#1f2933" : "#4b5563";
        ctx.fillText(line, W - G.right + 10, row.top + 7 + 13 * q);
      });
    });
    if (!this.rows.length) {
      ctx.fillStyle = "#6b7682";
      ctx.font = "12px " + FONT;
      ctx.textAlign = "left";
      ctx.fillText("every rank is hidden", this.plotL + 8, G.ruler + 20);
    }
  };

  Panel.prototype.opRect = function (i) {
    var o = this.ds.ops, row = this.rowOfRank[o.rank[i]];
    if (!row) return null;
    var lane = row.lanes[o.lane[i]];
    var x0 = Math.round(this.tx(o.start[i])), x1 = Math.round(this.tx(o.end[i])); // as drawn
    x1 = x1 - x0 > 3 ? x1 - 1 : Math.max(x1, x0 + 1);
    if (x1 < this.plotL || x0 > this.plotR) return null;
    x0 = Math.max(x0, this.plotL);
    x1 = Math.min(x1, this.plotR);
    return { x: x0, y: lane.y, w: Math.max(x1 - x0, 1), h: lane.h };
  };

  /* What is under (x, y): an op, a memory strip, the ruler, or nothing. */
  Panel.prototype.hit = function (x, y) {
    if (y < G.ruler) return { type: "ruler" };
    if (x < this.plotL || x > this.plotR) return null;
    var t = this.tAt(x), o = this.ds.ops, prep = this.prep, tol = 3 * (X.view[1] - X.view[0]) / this.plotW;
    for (var q = 0; q < this.rows.length; q++) {
      var row = this.rows[q];
      if (y < row.top - 2 || y > row.bottom + 2) continue;
      var keys = Object.keys(row.lanes);
      for (var a = 0; a < keys.length; a++) {
        var li = +keys[a], lane = row.lanes[li];
        var inErr = li === 0 && row.err && y >= row.err.y - 1 && y <= row.err.y + row.err.h + 1;
        if (!inErr && (y < lane.y - 1 || y > lane.y + lane.h + 1)) continue;
        var idx = prep.lanes[row.rank][li], best = -1, bestDist = Infinity;
        for (var j = lowerBound(o.start, idx, t - prep.maxDur[row.rank][li] - tol); j < idx.length; j++) {
          var i = idx[j];
          if (o.start[i] > t + tol) break;
          var dist = t < o.start[i] ? o.start[i] - t : t > o.end[i] ? t - o.end[i] : 0;
          if (dist < bestDist || (dist === 0 && bestDist === 0 && o.end[i] - o.start[i] < o.end[best] - o.start[best])) {
            best = i; bestDist = dist;
          }
        }
        if (best >= 0 && bestDist <= tol) return { type: "op", op: best, t: t };
      }
      if (y >= row.mem.y - 1 && y <= row.mem.y + row.mem.h + 1) return { type: "mem", rank: row.rank, t: t };
      return { type: "none", t: t };
    }
    return { type: "none", t: t };
  };

  Panel.prototype.drawOverlay = function () {
    var c = this.octx, self = this, o = this.ds.ops;
    c.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    c.clearRect(0, 0, this.width, this.height);
    if (X.brush && X.brush.panel === this) {
      var a = this.tx(Math.min(X.brush.a, X.brush.b)), b = this.tx(Math.max(X.brush.a, X.brush.b));
      c.fillStyle = "rgba(37,99,176,0.15)";
      c.fillRect(a, 0, b - a, this.height);
      c.fillStyle = "rgba(37,99,176,0.5)";
      c.fillRect(a, 0, b - a, G.ruler);
    }
    if (X.cursorT !== null && X.cursorT >= X.view[0] && X.cursorT <= X.view[1]) {
      var x = Math.round(this.tx(X.cursorT)) + 0.5;
      c.strokeStyle = "rgba(31,41,51,0.45)";
      c.lineWidth = 1;
      c.beginPath();
      c.moveTo(x, G.ruler);
      c.lineTo(x, this.height);
      c.stroke();
    }
    var hv = X.hover;
    if (!hv) return;
    var mine = hv.panel === this ? hv.op : -1;
    if (mine < 0 && o.pair && hv.panel.ds.ops.pair) mine = hv.panel.ds.ops.pair[hv.op];
    if (mine < 0) return;
    (this.prep.byMb[o.mb[mine]] || []).forEach(function (i) {
      if (o.lane[i] !== 0 || i === mine) return;
      var r = self.opRect(i);
      if (!r) return;
      c.strokeStyle = "rgba(17,17,17,0.55)";
      c.lineWidth = 1;
      c.strokeRect(r.x + 0.5, r.y + 0.5, Math.max(r.w - 1, 1), r.h - 1);
    });
    var r = this.opRect(mine);
    if (r) {
      c.strokeStyle = "#111";
      c.lineWidth = 2;
      c.strokeRect(r.x, r.y - 1, Math.max(r.w, 2), r.h + 2);
    }
  };

  // --- view: zoom and pan ----------------------------------------------------------------
  function setView(a, b) {
    var f0 = X.full[0], f1 = X.full[1], span = f1 - f0 || 1;
    var w = clamp(b - a, span / 20000, span * 1.2), c = (a + b) / 2;
    a = c - w / 2;
    var lo = f0 - 0.1 * span, hi = f1 + 0.1 * span;
    if (a < lo) a = Math.min(lo, f0 + (span - w) / 2);
    if (a + w > hi) a = Math.max(hi - w, Math.min(lo, f0 + (span - w) / 2));
    X.view = [a, a + w];
    requestDraw();
  }
  function zoomAt(t, factor) {
    var v0 = X.view[0], v1 = X.view[1];
    if (t === undefined || t === null) t = (v0 + v1) / 2;
    setView(t - (t - v0) * factor, t + (v1 - t) * factor);
  }
  function pan(fraction) {
    var w = X.view[1] - X.view[0];
    setView(X.view[0] + fraction * w, X.view[1] + fraction * w);
  }
  function resetView() {
    var span = X.full[1] - X.full[0] || 1;
    X.view = [X.full[0] - 0.005 * span, X.full[1] + 0.005 * span];
    requestDraw();
  }

  function requestDraw() {
    if (X.pending) return;
    X.pending = true;
    requestAnimationFrame(drawAll);
  }
  function drawAll() {
    X.pending = false;
    var t0 = performance.now();
    X.panels.forEach(function (p) { p.draw(); p.drawOverlay(); });
    var ms = performance.now() - t0, s = X.stats;
    s.draws++;
    s.lastDrawMs = ms;
    s.maxDrawMs = Math.max(s.maxDrawMs, ms);
    s.totalDrawMs += ms;
    if (s.firstDrawMs === null) s.firstDrawMs = ms;
    if (X.viewText) {
      var d = X.panels.length ? X.panels[0].ds : null, zoom = (X.full[1] - X.full[0]) / (X.view[1] - X.view[0]);
      X.viewText.textContent = "view " + fmt(+X.view[0].toPrecision(4)) + " – " + fmt(+X.view[1].toPrecision(4)) +
        (d && d.time.unit ? " " + d.time.unit : "") + " (" + (zoom >= 10 ? zoom.toFixed(0) : zoom.toFixed(1)) + "×)";
    }
    var w = X.waiters;
    X.waiters = [];
    w.forEach(function (f) { f(); });
  }
  function drawOverlays() { X.panels.forEach(function (p) { p.drawOverlay(); }); }
  function relayout() {
    X.panels.forEach(function (p) { p.layout(p.el.clientWidth || document.documentElement.clientWidth - 36); });
    drawAll();
  }

  // --- pointer, wheel, keys ----------------------------------------------------------------
  function localXY(panel, e) {
    var r = panel.overlay.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }
  function bindPointer(panel) {
    var ov = panel.overlay;
    ov.addEventListener("pointermove", function (e) {
      var xy = localXY(panel, e);
      if (X.drag && X.drag.panel === panel) {
        var dt = (xy[0] - X.drag.x) * (X.drag.view[1] - X.drag.view[0]) / panel.plotW;
        if (Math.abs(xy[0] - X.drag.x) > 2) X.drag.moved = true;
        if (X.drag.moved) setView(X.drag.view[0] - dt, X.drag.view[1] - dt);
        return;
      }
      if (X.brush && X.brush.panel === panel) {
        X.brush.b = panel.tAt(clamp(xy[0], panel.plotL, panel.plotR));
        drawOverlays();
        return;
      }
      onHover(panel, xy, e);
    });
    ov.addEventListener("pointerleave", function () {
      if (X.drag || X.brush) return;
      X.hover = null;
      X.cursorT = null;
      tooltip.style.display = "none";
      drawOverlays();
    });
    ov.addEventListener("pointerdown", function (e) {
      if (e.button !== 0) return;
      var xy = localXY(panel, e);
      if (xy[0] < panel.plotL || xy[0] > panel.plotR) return;
      try { ov.setPointerCapture(e.pointerId); } catch (err) { /* synthetic pointer */ }
      if (xy[1] < G.ruler) X.brush = { panel: panel, a: panel.tAt(xy[0]), b: panel.tAt(xy[0]), x: xy[0] };
      else X.drag = { panel: panel, x: xy[0], view: X.view.slice(), moved: false };
      ov.classList.add("po-dragging");
      tooltip.style.display = "none";
    });
    function end() {
      ov.classList.remove("po-dragging");
      if (X.brush && X.brush.panel === panel) {
        var b = X.brush;
        X.brush = null;
        if (Math.abs(panel.tx(b.b) - panel.tx(b.a)) > 4) setView(Math.min(b.a, b.b), Math.max(b.a, b.b));
        else drawOverlays();
      }
      X.drag = null;
    }
    ov.addEventListener("pointerup", end);
    ov.addEventListener("pointercancel", end);
    ov.addEventListener("dblclick", function (e) {
      var xy = localXY(panel, e);
      if (xy[0] >= panel.plotL && xy[0] <= panel.plotR) zoomAt(panel.tAt(xy[0]), e.shiftKey ? 2 : 0.5);
    });
    ov.addEventListener("wheel", function (e) {
      var xy = localXY(panel, e);
      var dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY, dx = e.deltaMode === 1 ? e.deltaX * 16 : e.deltaX;
      if (e.ctrlKey || e.metaKey || e.altKey) {
        e.preventDefault();
        var t = xy[0] >= panel.plotL && xy[0] <= panel.plotR ? panel.tAt(xy[0]) : undefined;
        zoomAt(t, Math.exp(clamp(dy, -600, 600) * 0.002));
      } else if (e.shiftKey || Math.abs(dx) > Math.abs(dy)) {
        e.preventDefault();
        var px = e.shiftKey && !dx ? dy : dx;
        pan(px / panel.plotW);
      }
    }, { passive: false });
  }

  function onHover(panel, xy, e) {
    var hit = panel.hit(xy[0], xy[1]);
    X.cursorT = hit && hit.t !== undefined ? hit.t : null;
    if (hit && hit.type === "op") {
      X.hover = { panel: panel, op: hit.op };
      showTooltip(opTooltip(panel, hit.op), e.clientX, e.clientY);
    } else if (hit && hit.type === "mem") {
      X.hover = null;
      showTooltip(memTooltip(panel, hit.rank, hit.t), e.clientX, e.clientY);
    } else {
      X.hover = null;
      tooltip.style.display = "none";
    }
    drawOverlays();
  }
  function showTooltip(html, cx, cy) {
    tooltip.innerHTML = html;
    tooltip.style.display = "block";
    var w = tooltip.offsetWidth, hgt = tooltip.offsetHeight;
    var x = cx + 14, y = cy + 14;
    if (x + w > window.innerWidth - 4) x = Math.max(4, cx - w - 14);
    if (y + hgt > window.innerHeight - 4) y = Math.max(4, cy - hgt - 14);
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
  }
  function opTooltip(panel, i) {
    var d = panel.ds, o = d.ops, kind = d.kinds[o.kind[i]], unit = d.memory_unit;
    var rows = [
      "<span class=\"po-k\">kind " + esc(kind) + "</span> <span class=\"po-dim\">" + esc(kindName(kind)) + "</span>",
      "microbatch " + o.mb[i] + " · rank " + o.rank[i] + " · stage " + o.stage[i] + " · chunk " + o.chunk[i] +
        (o.peer[i] >= 0 ? " · peer " + o.peer[i] : ""),
      "start " + esc(fmtT(d, o.start[i])) + " · end " + esc(fmtT(d, o.end[i])) + " <span class=\"po-dim\">(" +
        esc(fmtT(d, o.end[i] - o.start[i])) + ")</span>",
      "memory after " + esc(fmtMem(o.after[i], unit) + memUnitName(unit)) + " <span class=\"po-dim\">(" +
        esc(signed(o.mem[i], function (x) { return fmtMem(x, unit); })) + ")</span>",
    ];
    var other = X.panels.filter(function (p) { return p !== panel && p.ds.ops.pair; })[0];
    if (o.pair && other && o.pair[i] >= 0) {
      var j = o.pair[i], od = other.ds, oo = od.ops, label = d.key === "measured" ? "predicted" : "measured";
      rows.push("<span class=\"po-dim\">" + label + "</span> " + esc(fmtT(od, oo.start[j])) + " – " + esc(fmtT(od, oo.end[j])) +
        " <span class=\"po-dim\">(" + esc(fmtT(od, oo.end[j] - oo.start[j])) + ")</span>");
      var m = d.key === "measured" ? i : j, p = d.key === "measured" ? j : i;
      var md = d.key === "measured" ? d : od, mo = md.ops, po = (d.key === "measured" ? od : d).ops;
      var err = mo.error ? mo.error[m] : null;
      rows.push("error: duration " + (err === null || err === undefined ? "–" : signed(err, function (x) { return (100 * x).toFixed(1) + "%"; })) +
        " · start " + esc(signed(mo.start[m] - po.start[p], function (x) { return fmtT(md, x); })));
    } else if (o.pair) {
      rows.push("<span class=\"po-dim\">no counterpart in the other timeline</span>");
    }
    return rows.join("<br>");
  }
  function levelAt(curve, t) {
    var j = upperBoundPlain(curve[0], t) - 1;
    return j < 0 ? 0 : curve[1][j];
  }
  function memTooltip(panel, r, t) {
    var d = panel.ds, unit = d.memory_unit;
    var s = "<span class=\"po-k\">rank " + r + " memory</span><br>at " + esc(fmtT(d, t)) + ": " +
      esc(fmtMem(levelAt(d.memory[r], t), unit) + memUnitName(unit)) + " · peak " + esc(fmtMem(d.peaks[r], unit));
    if (d.baseline && d.baseline[r]) s += "<br>without offload: " + esc(fmtMem(levelAt(d.baseline[r], t), unit));
    return s;
  }

  document.addEventListener("keydown", function (e) {
    var tag = (e.target && e.target.tagName) || "";
    if (/^(INPUT|SELECT|TEXTAREA)$/.test(tag) || e.ctrlKey || e.metaKey || e.altKey || !X.panels.length) return;
    var t = X.cursorT;
    var act = { "+": function () { zoomAt(t, 0.5); }, "=": function () { zoomAt(t, 0.5); }, w: function () { zoomAt(t, 0.8); },
      "-": function () { zoomAt(t, 2); }, s: function () { zoomAt(t, 1.25); }, a: function () { pan(-0.15); },
      d: function () { pan(0.15); }, ArrowLeft: function () { pan(-0.15); }, ArrowRight: function () { pan(0.15); },
      "0": resetView }[e.key.length === 1 ? e.key.toLowerCase() : e.key];
    if (act) { e.preventDefault(); act(); }
  });
  window.addEventListener("resize", function () {
    clearTimeout(X.resizeTimer);
    X.resizeTimer = setTimeout(relayout, 80);
  });

  // --- page parts ----------------------------------------------------------------------------
  function controls(extra) {
    var bar = h("div", { class: "po-controls" });
    X.viewText = h("span", { class: "po-view" });
    bar.appendChild(h("div", { class: "po-group" }, [
      h("span", { class: "po-label", text: "time" }),
      h("button", { type: "button", title: "zoom out (−)", "data-action": "zoom-out", text: "−", onclick: function () { zoomAt(null, 2); } }),
      h("button", { type: "button", title: "zoom in (+)", "data-action": "zoom-in", text: "+", onclick: function () { zoomAt(null, 0.5); } }),
      h("button", { type: "button", title: "whole timeline (0)", "data-action": "reset", text: "reset", onclick: resetView }),
      X.viewText,
    ]));
    (extra || []).forEach(function (e) { bar.appendChild(e); });
    var ranks = h("div", { class: "po-group po-ranks" }, [h("span", { class: "po-label", text: "ranks" })]);
    ranks.appendChild(h("button", { type: "button", text: "all", "data-action": "ranks-all", onclick: function () { setHidden(function () { return false; }); } }));
    ranks.appendChild(h("button", { type: "button", text: "none", "data-action": "ranks-none", onclick: function () { setHidden(function () { return true; }); } }));
    X.rankBoxes = [];
    for (var r = 0; r < X.numRanks; r++) {
      var box = h("input", { type: "checkbox", "data-rank": String(r) });
      box.checked = !X.hidden[r];
      box.addEventListener("change", (function (rr) { return function (e) { hideRank(rr, !e.target.checked); }; })(r));
      X.rankBoxes.push(box);
      ranks.appendChild(h("label", { title: "show rank " + r }, [box, String(r)]));
    }
    bar.appendChild(ranks);
    bar.appendChild(h("div", { class: "po-hint", text: "Zoom: ctrl + wheel, + / −, W / S, double-click, or drag " +
      "across the ruler. Pan: drag, shift + wheel, A / D or ← / →. 0 shows everything. Hover an op for its details." }));
    return bar;
  }
  function setHidden(pred) {
    for (var r = 0; r < X.numRanks; r++) {
      X.hidden[r] = pred(r);
      if (X.rankBoxes[r]) X.rankBoxes[r].checked = !X.hidden[r];
    }
    X.hover = null;
    tooltip.style.display = "none";
    relayout();
  }
  function hideRank(r, hidden) { setHidden(function (q) { return q === r ? !!hidden : !!X.hidden[q]; }); }

  /* One entry per colour drawn: each kind, per chunk where a timeline has 2 to 4 chunks (as the PNG). */
  function legend(datasets) {
    var box = h("div", { class: "po-legend" }), seen = {}, chunkedKinds = {};
    datasets.forEach(function (d) {
      var o = d.ops;
      for (var i = 0; i < o.kind.length; i++) {
        var kind = PAL.kinds[d.kinds[o.kind[i]]] ? d.kinds[o.kind[i]] : "comm";
        var chunked = !!COMPUTE_KINDS[kind] && d.v > 1 && d.v <= 4, chunk = chunked ? o.chunk[i] : 0;
        var css = kind === "comm" ? PAL.comm : opColour(kind, chunk, d.v).css;
        if (chunked) chunkedKinds[kind] = true;
        if (!seen[css]) seen[css] = { kind: kind, chunk: chunk, css: css };
      }
    });
    var order = Object.keys(PAL.kinds).concat(["comm"]);
    Object.keys(seen).map(function (k) { return seen[k]; }).sort(function (a, b) {
      return order.indexOf(a.kind) - order.indexOf(b.kind) || a.chunk - b.chunk;
    }).forEach(function (s) {
      var name = s.kind === "comm" ? "send / recv (comm)" : PAL.names[s.kind] || s.kind;
      box.appendChild(h("span", null, [h("span", { class: "po-swatch", style: "background:" + s.css }),
        name + (chunkedKinds[s.kind] ? ", chunk " + s.chunk : "")]));
    });
    var unit = datasets.length ? datasets[0].memory_unit : "units";
    box.appendChild(h("span", null, [h("span", { class: "po-line" }), "activation memory (" + unit + ")"]));
    if (datasets.some(function (d) { return d.baseline; })) box.appendChild(h("span", null, [h("span", { class: "po-line dashed" }), "memory without offload"]));
    if (datasets.some(function (d) { return d.ops.error; })) {
      box.appendChild(h("span", null, ["Δ time, measured vs predicted duration: −50%", h("span", { class: "po-errscale" }), "+50%"]));
    }
    return box;
  }

  function showDatasets(host, datasets, roles) {
    X.panels.forEach(function (p) { p.el.remove(); });
    X.hover = null;
    tooltip.style.display = "none";
    X.panels = datasets.map(function (d, i) { return new Panel(d, host, roles ? roles[i] : ""); });
    var t0 = 0, t1 = 0;
    X.memTop = {};
    X.panels.forEach(function (p) {
      t0 = Math.min(t0, p.prep.t0);
      t1 = Math.max(t1, p.prep.t1);
      var u = p.ds.memory_unit, peaks = p.ds.peaks.concat(p.ds.baseline_peaks || [], [p.prep.memTop]);
      X.memTop[u] = Math.max(X.memTop[u] || 0, Math.max.apply(null, peaks) * 1.12);
    });
    Object.keys(X.memTop).forEach(function (u) { if (!(X.memTop[u] > 0)) X.memTop[u] = 1; });
    X.full = [t0, t1 > t0 ? t1 : t0 + 1];
    X.view = [X.full[0] - 0.005 * (X.full[1] - X.full[0]), X.full[1] + 0.005 * (X.full[1] - X.full[0])];
    relayout();
  }

  function header(title, sub) {
    return [h("h1", { text: title }), sub ? h("p", { class: "po-sub", text: sub }) : null];
  }

  // --- the three pages ---------------------------------------------------------------------
  var app = document.getElementById("po-app");
  var legendHost, panelHost;

  function timelinePage() {
    var d = DATA.timelines[0];
    X.numRanks = d.p;
    header(DATA.title, "p=" + d.p + ", m=" + d.m + ", v=" + d.v + (d.g !== null && d.g !== undefined ? ", g=" + d.g : "") +
      "; " + d.time.label + ", memory in " + d.memory_unit).forEach(function (e) { if (e) app.appendChild(e); });
    app.appendChild(controls());
    app.appendChild(legend([d]));
    panelHost = h("div", { class: "po-panels" });
    app.appendChild(panelHost);
    showDatasets(panelHost, [d]);
  }

  function measuredPage() {
    var dm = DATA.timelines[0], dp = DATA.timelines[1], s = DATA.summary;
    X.numRanks = Math.max(dm.p, dp.p);
    header(DATA.title, "The last step as it ran (measured) above the simulator fed the measured per-op costs " +
      "(predicted), both from their first compute op. " + s.matched + " ops matched (" + s.measured_ops + " measured, " +
      s.predicted_ops + " predicted" + (s.unmatched ? "; " + s.unmatched : "") +
      "); median |duration error| of compute ops " + pct(s.error_median) + ".")
      .forEach(function (e) { if (e) app.appendChild(e); });
    var tbl = h("table", { class: "po-table po-summary" });
    tbl.appendChild(h("tr", null, ["rank", "step time", "bubble measured", "bubble predicted", "peak measured",
      "peak predicted", "median |Δ duration|"].map(function (t) { return h("th", { text: t }); })));
    for (var r = 0; r < X.numRanks; r++) {
      var mpk = dm.peaks_in_op ? dm.peaks_in_op[r] : dm.peaks[r], ppk = dp.peaks_in_op ? dp.peaks_in_op[r] : dp.peaks[r];
      tbl.appendChild(h("tr", null, [String(r), s.step_time ? fmt(s.step_time[r]) + " ms" : fmtT(dm, dm.makespan),
        pct(dm.bubbles[r]), pct(dp.bubbles[r]), fmtMem(mpk, dm.memory_unit), fmtMem(ppk, dp.memory_unit),
        pct(dm.error_median ? dm.error_median[r] : null)].map(function (t) { return h("td", { text: t }); })));
    }
    app.appendChild(tbl);
    app.appendChild(controls());
    app.appendChild(legend([dm, dp]));
    panelHost = h("div", { class: "po-panels" });
    app.appendChild(panelHost);
    showDatasets(panelHost, [dm, dp], ["measured", "predicted"]);
  }

  // Compare: the Pareto plot and table link to "#schedule=LABEL" (and "&against=LABEL").
  var byLabel = {}, selA = null, selB = null, selectA = null, selectB = null, paretoHost = null, tableHost = null;
  function hashFor(a, b) { return "#schedule=" + encodeURIComponent(a) + (b ? "&against=" + encodeURIComponent(b) : ""); }
  function parseHash() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var q = part.indexOf("=");
      if (q > 0) { try { out[part.slice(0, q)] = decodeURIComponent(part.slice(q + 1)); } catch (err) { /* ignore */ } }
    });
    return out;
  }
  function defaultSelection() {
    var rows = DATA.rows.filter(function (r) { return r.timeline; });
    var front = rows.filter(function (r) { return r.frontier; });
    return (front[0] || rows[0] || {}).label || null;
  }
  function applySelection(scroll) {
    var q = parseHash();
    var a = byLabel[q.schedule] ? q.schedule : selA || defaultSelection();
    var b = byLabel[q.against] && q.against !== a ? q.against : null;
    if (!a) return;
    var changed = a !== selA || b !== selB;
    selA = a;
    selB = b;
    selectA.value = a;
    selectB.value = b || "";
    if (changed) {
      var ds = [byLabel[a]].concat(b ? [byLabel[b]] : []);
      legendHost.replaceWith(legendHost = legend(ds));
      showDatasets(panelHost, ds);
    }
    drawPareto();
    drawTable();
    if (scroll && X.panels.length) X.panels[0].el.scrollIntoView({ block: "start" });
  }
  function comparePage() {
    DATA.timelines.forEach(function (d) { byLabel[d.key] = d; X.numRanks = Math.max(X.numRanks, d.p); });
    header(DATA.title, DATA.subtitle).forEach(function (e) { if (e) app.appendChild(e); });
    paretoHost = h("div", { class: "po-pareto" });
    tableHost = h("div", { class: "po-tablewrap" });
    app.appendChild(h("div", { class: "po-compare" }, [paretoHost, tableHost]));
    selectA = h("select", { id: "po-select", "aria-label": "schedule shown" });
    selectB = h("select", { id: "po-select-b", "aria-label": "schedule shown below, on the same axes" });
    selectB.appendChild(h("option", { value: "", text: "(none)" }));
    DATA.rows.forEach(function (r) {
      var label = r.label + (r.ok ? "" : " — refused");
      selectA.appendChild(h("option", r.timeline ? { value: r.label, text: label } : { value: r.label, text: label, disabled: "" }));
      selectB.appendChild(h("option", r.timeline ? { value: r.label, text: label } : { value: r.label, text: label, disabled: "" }));
    });
    selectA.addEventListener("change", function () { location.hash = hashFor(selectA.value, selB); });
    selectB.addEventListener("change", function () { location.hash = hashFor(selA, selectB.value || null); });
    app.appendChild(controls([
      h("div", { class: "po-group" }, [h("span", { class: "po-label", text: "schedule" }), selectA]),
      h("div", { class: "po-group" }, [h("span", { class: "po-label", text: "against" }), selectB]),
    ]));
    legendHost = h("div");
    app.appendChild(legendHost);
    panelHost = h("div", { class: "po-panels" });
    app.appendChild(panelHost);
    window.addEventListener("hashchange", function () { applySelection(true); });
    applySelection(false);
  }

  function drawTable() {
    var unit = DATA.memory_unit || "units";
    var rows = ['<table class="po-table"><tr><th>schedule</th><th>bubble</th><th>peak (' + esc(unit) +
      ')</th><th>P2P ×1F1B</th></tr>'];
    DATA.rows.forEach(function (r) {
      var cls = (r.frontier ? "po-front " : "") + (r.ok ? "" : "po-refused ") + (r.label === selA || r.label === selB ? "po-selected" : "");
      var name = r.timeline ? '<a href="' + esc(hashFor(r.label, selB !== r.label ? selB : null)) + '">' + esc(r.label) + "</a>" : esc(r.label);
      if (!r.ok) {
        rows.push('<tr class="' + cls + '"><td>' + name + '</td><td colspan="3" style="text-align:left">' + esc(r.error || "") + "</td></tr>");
        return;
      }
      rows.push('<tr class="' + cls + '"><td>' + (r.frontier ? "★ " : "") + name + "</td><td>" + pct(r.bubble) + "</td><td>" +
        esc(fmtMem(r.peak, unit)) + "</td><td>" + (r.p2p === null ? "–" : r.p2p.toFixed(2)) + "</td></tr>");
    });
    rows.push("</table>");
    rows.push('<p class="po-note">★ Pareto frontier: no other schedule has both less peak memory and less bubble. ' +
      "Click a point or a name to show its timeline; choose a second schedule under “against” to draw it below on the same axes.</p>");
    tableHost.innerHTML = rows.join("");
  }

  var measureCtx = null;
  function textWidth(text, bold) {
    measureCtx = measureCtx || document.createElement("canvas").getContext("2d");
    measureCtx.font = (bold ? "600 " : "") + "11px " + FONT;
    return measureCtx.measureText(text).width;
  }
  /* The bubble-vs-memory plot as inline SVG (built as markup: no namespace URL needed). */
  function drawPareto() {
    var W = 600, H = 390, m = { l: 58, r: 16, t: 16, b: 46 }, pw = W - m.l - m.r, ph = H - m.t - m.b;
    var unit = DATA.memory_unit || "units";
    var groups = {}, keys = [];
    DATA.rows.forEach(function (r) {
      if (!r.ok) return;
      var key = r.peak + "|" + r.bubble;
      if (!groups[key]) { groups[key] = { x: r.peak, y: 100 * r.bubble, rows: [] }; keys.push(key); }
      groups[key].rows.push(r);
    });
    var gs = keys.map(function (k) { return groups[k]; }).sort(function (a, b) { return a.x - b.x || a.y - b.y; });
    if (!gs.length) { paretoHost.innerHTML = '<p class="po-note">No schedule produced numbers.</p>'; return; }
    var xs = gs.map(function (g) { return g.x; }), ys = gs.map(function (g) { return g.y; });
    var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs), yhi = Math.max.apply(null, ys);
    var padx = Math.max(0.06 * (xhi - xlo), 0.5);
    var x0 = xlo > 0 ? Math.max(0, xlo - padx) : -padx, x1 = xhi + 3 * padx;
    var y0 = -Math.max(0.06 * yhi, 0.5), y1 = Math.max(yhi * 1.12, 1);
    var X_ = function (x) { return m.l + (x - x0) / (x1 - x0) * pw; }, Y_ = function (y) { return m.t + ph - (y - y0) / (y1 - y0) * ph; };
    var s = ['<svg width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '" role="img" aria-label="peak memory vs bubble rate">'];
    s.push('<g font-size="11" fill="#5f6b7a">');
    var sx = niceStep(x1 - x0, pw, 70), sy = niceStep(y1 - y0, ph, 45);
    for (var t = Math.ceil(x0 / sx) * sx; t <= x1; t += sx) {
      s.push('<line x1="' + X_(t) + '" x2="' + X_(t) + '" y1="' + m.t + '" y2="' + (m.t + ph) + '" stroke="#eceff3"/>');
      s.push('<text x="' + X_(t) + '" y="' + (m.t + ph + 15) + '" text-anchor="middle">' + esc(fmtMem(+t.toFixed(stepDecimals(sx)), unit)) + "</text>");
    }
    for (t = Math.ceil(y0 / sy) * sy; t <= y1; t += sy) {
      s.push('<line x1="' + m.l + '" x2="' + (m.l + pw) + '" y1="' + Y_(t) + '" y2="' + Y_(t) + '" stroke="#eceff3"/>');
      s.push('<text x="' + (m.l - 6) + '" y="' + (Y_(t) + 4) + '" text-anchor="end">' + t.toFixed(stepDecimals(sy)) + "%</text>");
    }
    s.push('<text x="' + (m.l + pw / 2) + '" y="' + (H - 8) + '" text-anchor="middle" fill="#1f2933">peak activation memory, max over ranks (' + esc(unit) + ")</text>");
    s.push('<text transform="translate(14 ' + (m.t + ph / 2) + ') rotate(-90)" text-anchor="middle" fill="#1f2933">bubble rate</text></g>');
    s.push('<rect x="' + m.l + '" y="' + m.t + '" width="' + pw + '" height="' + ph + '" fill="none" stroke="#c9d1da"/>');
    var front = gs.filter(function (g) { return g.rows.some(function (r) { return r.frontier; }); });
    if (front.length) {
      var path = "M" + X_(front[0].x) + " " + Y_(front[0].y);
      for (var q = 1; q < front.length; q++) path += " H" + X_(front[q].x) + " V" + Y_(front[q].y);
      path += " H" + (m.l + pw);
      s.push('<path d="' + path + '" fill="none" stroke="#c9474b" stroke-width="1.5" stroke-opacity="0.55"/>');
    }
    // Labels: first offset that stays inside and hits the fewest labels and points.
    var placed = gs.map(function (g) { var px = X_(g.x), py = Y_(g.y); return [px - 6, py - 6, px + 6, py + 6]; });
    var offsets = [[9, -4], [9, 12], [-9, -4], [-9, 12], [9, -16], [9, 24], [-9, -16], [-9, 24], [9, -28], [-9, 36]];
    gs.forEach(function (g) {
      var on = g.rows.some(function (r) { return r.frontier; }), px = X_(g.x), py = Y_(g.y);
      var sel = g.rows.some(function (r) { return r.label === selA; }), selb = g.rows.some(function (r) { return r.label === selB; });
      var first = g.rows.filter(function (r) { return r.timeline; })[0];
      var tip = g.rows.map(function (r) { return r.label; }).join(", ") + ": bubble " + g.y.toFixed(2) + "%, peak " + fmtMem(g.x, unit);
      var circle = '<circle cx="' + px + '" cy="' + py + '" r="' + (on ? 6 : 4.5) + '" fill="' + (on ? "#c9474b" : "#5b6f8a") +
        '" stroke="#fff" stroke-width="1"><title>' + esc(tip) + "</title></circle>";
      if (sel || selb) s.push('<circle cx="' + px + '" cy="' + py + '" r="10" fill="none" stroke="' + (sel ? "#1f2933" : "#8a949e") + '" stroke-width="2"/>');
      s.push(first ? '<a class="po-point" href="' + esc(hashFor(first.label)) + '" data-label="' + esc(first.label) + '">' + circle + "</a>" : circle);
      var text = g.rows.map(function (r) { return r.label; }).join(", "), w = textWidth(text, on), best = null;
      offsets.forEach(function (off, n) {
        var bx0 = off[0] > 0 ? px + off[0] : px + off[0] - w, box = [bx0, py + off[1] - 10, bx0 + w, py + off[1] + 3];
        var out = box[0] < m.l || box[2] > m.l + pw || box[1] < m.t || box[3] > m.t + ph ? 1 : 0;
        var hits = placed.filter(function (b) { return !(box[2] <= b[0] || b[2] <= box[0] || box[3] <= b[1] || b[3] <= box[1]); }).length;
        var score = [out, hits, n];
        if (!best || score[0] < best.score[0] || (score[0] === best.score[0] && score[1] < best.score[1])) best = { score: score, off: off, box: box };
      });
      placed.push(best.box);
      var parts = g.rows.map(function (r) {
        var span = '<tspan' + (r.label === selA ? ' font-weight="700"' : "") + ">" + esc(r.label) + "</tspan>";
        return r.timeline ? '<a href="' + esc(hashFor(r.label)) + '">' + span + "</a>" : span;
      }).join(", ");
      s.push('<text x="' + (px + best.off[0]) + '" y="' + (py + best.off[1]) + '" font-size="11" font-family=\'' + FONT + '\' text-anchor="' + (best.off[0] > 0 ? "start" : "end") +
        '" fill="' + (on ? "#a3333a" : "#333") + '"' + (on ? ' font-weight="600"' : "") + ">" + parts + "</text>");
    });
    s.push("</svg>");
    paretoHost.innerHTML = s.join("");
  }

  // --- start -----------------------------------------------------------------------------------
  document.body.appendChild(tooltip);
  ({ timeline: timelinePage, measured: measuredPage, compare: comparePage })[DATA.kind]();
  app.appendChild(h("footer", { text: "pipeoffload " + DATA.version + " schedule explorer · one file, no network · " +
    "data from pipeoffload.viz.html" }));
  relayout();
  X.stats.loadMs = performance.now() - loadStart;

  /* For tests and scripts: the explorer's state and a few actions (coordinates are client pixels). */
  window.poExplorer = {
    kind: DATA.kind,
    ready: true,
    stats: X.stats,
    panels: function () {
      return X.panels.map(function (p) {
        return { key: p.ds.key, title: p.ds.title, drawn: p.drawn, ops: p.prep.n, height: p.height, width: p.width };
      });
    },
    view: function () { return X.view.slice(); },
    full: function () { return X.full.slice(); },
    setView: setView,
    zoom: function (factor, t) { zoomAt(t, factor); },
    reset: resetView,
    hideRank: hideRank,
    hidden: function () { return Object.keys(X.hidden).filter(function (r) { return X.hidden[r]; }).map(Number); },
    findOp: function (panel, q) {
      var d = X.panels[panel].ds, o = d.ops;
      for (var i = 0; i < o.start.length; i++) {
        if ((q.kind === undefined || d.kinds[o.kind[i]] === q.kind) && (q.rank === undefined || o.rank[i] === q.rank) &&
          (q.mb === undefined || o.mb[i] === q.mb) && (q.stage === undefined || o.stage[i] === q.stage) &&
          (q.chunk === undefined || o.chunk[i] === q.chunk)) return i;
      }
      return -1;
    },
    op: function (panel, i) {
      var d = X.panels[panel].ds, o = d.ops;
      return { kind: d.kinds[o.kind[i]], rank: o.rank[i], stage: o.stage[i], chunk: o.chunk[i], mb: o.mb[i],
        start: o.start[i], end: o.end[i], after: o.after[i], lane: LANES[o.lane[i]] };
    },
    opCenter: function (panel, i) {
      var p = X.panels[panel], r = p.opRect(i);
      if (!r) return null;
      var c = p.overlay.getBoundingClientRect();
      return { x: c.left + r.x + r.w / 2, y: c.top + r.y + r.h / 2, left: c.left + r.x, top: c.top + r.y, w: r.w, h: r.h };
    },
    pixel: function (panel, x, y) { // a pixel of the drawn canvas at client (x, y), as [r, g, b, a]
      var p = X.panels[panel], c = p.canvas.getBoundingClientRect();
      return Array.prototype.slice.call(p.ctx.getImageData(Math.round((x - c.left) * p.dpr), Math.round((y - c.top) * p.dpr), 1, 1).data);
    },
    select: function (a, b) { location.hash = hashFor(a, b); },
    frame: function () { return new Promise(function (res) { X.waiters.push(res); requestDraw(); }); },
    /* n full redraws while zooming in and out, each flushed to pixels: [ms, ...]. */
    benchmark: function (n) {
      var out = [], full = X.full.slice(), span = full[1] - full[0];
      for (var i = 0; i < n; i++) {
        var f = 0.05 + 0.95 * Math.abs(Math.cos(i / 3));
        var c = full[0] + span * (0.5 + 0.4 * Math.sin(i / 2));
        X.view = [c - f * span / 2, c + f * span / 2];
        var t0 = performance.now();
        drawAll();
        X.panels.forEach(function (p) { p.ctx.getImageData(0, 0, 1, 1); });
        out.push(performance.now() - t0);
      }
      resetView();
      return out;
    },
  };
})();
