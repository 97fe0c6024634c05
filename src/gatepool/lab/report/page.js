// gatepool's report page: the verdict filter and the interactive figures (plain JavaScript, no library).
// Every number a dial shows is computed here the way gatepool/lab/report/dials.py computes it in Python;
// tests/browser holds the two to the same values.
"use strict";
(function () {
  const gp = {};
  window.gatepool = gp;

  // --------------------------------------------------------------------------- the τ dial
  gp.softGate = function (v, tau) {  // gates = softmax(v/τ), out = gates · v (max subtracted first)
    const m = Math.max(...v);
    const e = v.map((x) => Math.exp((x - m) / tau));
    const s = e.reduce((a, b) => a + b, 0);
    const gates = e.map((x) => x / s);
    const out = gates.reduce((a, g, j) => a + g * v[j], 0);
    return { gates: gates, out: out, max: m, mean: v.reduce((a, b) => a + b, 0) / v.length };
  };

  function tauWidget(el, cfg) {
    const slider = el.querySelector("#tau-slider");
    const bars = el.querySelector(".bars");
    const labels = el.querySelector(".barlabel");
    const outEl = el.querySelector("#tau-out");
    cfg.window.forEach((x, j) => {
      const b = document.createElement("div");
      b.className = "bar";
      b.appendChild(document.createElement("span"));
      bars.appendChild(b);
      const l = document.createElement("div");
      l.textContent = "v" + (j + 1) + " = " + x.toFixed(3);
      labels.appendChild(l);
    });
    function draw() {
      const tau = Math.pow(10, Number(slider.value));
      const r = gp.softGate(cfg.window, tau);
      el.querySelector("#tau-value").textContent = tau < 1 ? tau.toPrecision(2) : tau.toPrecision(3);
      r.gates.forEach((g, j) => {
        const b = bars.children[j];
        b.style.height = (130 * g).toFixed(1) + "px";
        b.firstChild.textContent = g.toFixed(3);
      });
      outEl.dataset.tau = String(tau);
      outEl.dataset.out = String(r.out);
      outEl.dataset.gates = JSON.stringify(r.gates);
      outEl.textContent = "out = softmax(v/τ) · v = " + r.out.toFixed(4) + "   (max " + r.max.toFixed(4) +
        ", mean " + r.mean.toFixed(4) + ")";
    }
    slider.addEventListener("input", draw);
    draw();
  }

  // --------------------------------------------------------------------------- the √d dial
  function lowbias32(x) {
    x = x >>> 0;
    x ^= x >>> 16; x = Math.imul(x, 0x7feb352d) >>> 0;
    x ^= x >>> 15; x = Math.imul(x, 0x846ca68b) >>> 0;
    x ^= x >>> 16;
    return x >>> 0;
  }
  gp.normals = function (seed, count) {  // see dials.py: counter-based, so Python draws the same numbers
    const key = lowbias32(seed);
    const z = new Float64Array(count);
    for (let n = 0; n < count; n++) {
      const u1 = (lowbias32((2 * n + key) % 4294967296) + 0.5) / 4294967296;
      const u2 = (lowbias32((2 * n + 1 + key) % 4294967296) + 0.5) / 4294967296;
      z[n] = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
    }
    return z;
  };
  gp.sqrtD = function (d, seed, queries, tokens) {
    const z = gp.normals(seed, queries * (tokens + 1) * d);
    const scores = new Float64Array(queries * tokens);
    for (let a = 0; a < queries; a++) {
      const q = a * (tokens + 1) * d;
      for (let m = 0; m < tokens; m++) {
        const k = (a * (tokens + 1) + 1 + m) * d;
        let s = 0;
        for (let j = 0; j < d; j++) s += z[q + j] * z[k + j];
        scores[a * tokens + m] = s;
      }
    }
    let mean = 0;
    for (const s of scores) mean += s;
    mean /= scores.length;
    let ss = 0;
    for (const s of scores) ss += (s - mean) * (s - mean);
    function largestGate(scale) {  // mean over queries of max softmax = 1 / Σ exp(s − max)
      let acc = 0;
      for (let a = 0; a < queries; a++) {
        let mx = -Infinity;
        for (let m = 0; m < tokens; m++) mx = Math.max(mx, scores[a * tokens + m] / scale);
        let sum = 0;
        for (let m = 0; m < tokens; m++) sum += Math.exp(scores[a * tokens + m] / scale - mx);
        acc += 1 / sum;
      }
      return acc / queries;
    }
    return { std: Math.sqrt(ss / (scores.length - 1)), max_gate: largestGate(1),
             max_gate_scaled: largestGate(Math.sqrt(d)), scores: scores };
  };

  function sqrtDWidget(el, cfg) {
    const dSel = el.querySelector("#sqrtd-d");
    const seedIn = el.querySelector("#sqrtd-seed");
    function draw() {
      const d = Number(dSel.value);
      const seed = Math.max(0, Math.floor(Number(seedIn.value) || 0));
      const r = gp.sqrtD(d, seed, cfg.queries, cfg.tokens);
      const lec = cfg.lecture[String(d)];
      const show = (id, x, l) => {
        const e = el.querySelector(id);
        e.dataset.value = String(x);
        e.textContent = x.toFixed(3) + (l === undefined ? "" : "  (lecture " + l + ")");
      };
      show("#sqrtd-std", r.std, lec ? lec[0] : undefined);
      el.querySelector("#sqrtd-theory").textContent = Math.sqrt(d).toFixed(3);
      show("#sqrtd-hard", r.max_gate, lec ? lec[1] : undefined);
      show("#sqrtd-soft", r.max_gate_scaled, lec ? lec[2] : undefined);
      const hist = el.querySelector(".hist");
      hist.textContent = "";
      const bins = new Array(40).fill(0), lim = 4 * Math.sqrt(d);
      for (const s of r.scores) {
        const b = Math.floor((s + lim) / (2 * lim) * 40);
        if (b >= 0 && b < 40) bins[b]++;
      }
      const top = Math.max(...bins);
      for (const c of bins) {
        const bar = document.createElement("div");
        bar.style.height = (88 * c / top).toFixed(1) + "px";
        hist.appendChild(bar);
      }
      el.querySelector("#sqrtd-range").textContent = "q·k from " + (-lim).toFixed(1) + " to " + lim.toFixed(1);
    }
    dSel.addEventListener("change", draw);
    seedIn.addEventListener("change", draw);
    draw();
  }

  // --------------------------------------------------------------------------- the padding map
  gp.paddingMap = function (size, k, p) {  // share of the k² taps that land on the map (separable)
    const nOut = size + 2 * p - k + 1;
    const taps = [];
    for (let o = 0; o < nOut; o++) {
      let c = 0;
      for (let t = 0; t < k; t++) { const i = o - p + t; if (i >= 0 && i < size) c++; }
      taps.push(c);
    }
    return taps.map((r) => taps.map((c) => (r * c) / (k * k)));
  };
  function colour(x) {  // 0 → dark blue, 1 → yellow
    const a = [40, 30, 110], b = [250, 220, 60];
    return "rgb(" + a.map((v, i) => Math.round(v + (b[i] - v) * Math.max(0, Math.min(1, x)))).join(",") + ")";
  }
  function paddingWidget(el, cfg) {
    const kSel = el.querySelector("#pad-k"), pSel = el.querySelector("#pad-p");
    function draw() {
      const k = Number(kSel.value), p = Number(pSel.value);
      const map = gp.paddingMap(cfg.size, k, p);
      const tbl = el.querySelector("table.pmap");
      tbl.textContent = "";
      for (const row of map) {
        const tr = document.createElement("tr");
        for (const v of row) {
          const td = document.createElement("td");
          td.dataset.v = String(v);
          td.textContent = v.toFixed(2);
          td.style.background = colour(v);
          td.style.color = v > 0.55 ? "#000" : "#fff";
          tr.appendChild(td);
        }
        tbl.appendChild(tr);
      }
      const n = map.length, mid = map[Math.floor(n / 2)][Math.floor(n / 2)];
      el.querySelector("#pad-readout").textContent = map.length + "×" + map.length + " outputs: corner " +
        map[0][0].toFixed(3) + ", edge " + map[0][Math.floor(n / 2)].toFixed(3) + ", middle " + mid.toFixed(3) +
        " of the middle's variance with no padding";
    }
    kSel.addEventListener("change", draw);
    pSel.addEventListener("change", draw);
    draw();
  }

  // --------------------------------------------------------------------------- the attention explorer
  gp.explorerReadout = function (ex, r, c, k) {
    const gw = ex.grid[1], row = ex.rows[r * gw + c];
    let top = 0;
    for (let j = 1; j < row.length; j++) if (row[j] > row[top]) top = j;
    const sorted = row.slice().sort((a, b) => b - a);
    let share = 0;
    for (let j = 0; j < k; j++) share += sorted[j];
    return { key: [Math.floor(top / gw), top % gw], gate: row[top], share: share };
  };
  function explorerWidget(el, cfg) {
    const ex = cfg.explorer, gh = ex.grid[0], gw = ex.grid[1], k = cfg.k;
    const img = el.querySelector("canvas.digit"), heat = el.querySelector("canvas.heat");
    const h = ex.image.length, w = ex.image[0].length;
    img.width = w; img.height = h;
    const ctx = img.getContext("2d"), data = ctx.createImageData(w, h);
    for (let i = 0; i < h; i++) for (let j = 0; j < w; j++) {
      const v = Math.round(255 * (1 - Math.max(0, Math.min(1, ex.image[i][j]))));
      const o = 4 * (i * w + j);
      data.data[o] = data.data[o + 1] = data.data[o + 2] = v; data.data[o + 3] = 255;
    }
    ctx.putImageData(data, 0, 0);
    heat.width = gw; heat.height = gh;
    const grid = el.querySelector(".tokens");
    grid.style.gridTemplateColumns = "repeat(" + gw + ", 1fr)";
    // tokens tile the image's centre, floor(H / grid) pixels each: for the conv stem (5×5 conv, 2×2 pool)
    // token (r, c) sits over pixels [2r + 2, 2r + 4), the centre of the 6×6 patch it sees
    const box = el.querySelector(".explorer").clientWidth, px = box / w;
    const cell = Math.floor(h / gh), off = (h - cell * gh) / 2;
    for (const layer of [heat, grid]) {
      Object.assign(layer.style, { left: off * px + "px", top: off * px + "px", width: cell * gw * px + "px",
                                   height: cell * gh * px + "px" });
    }
    const readout = el.querySelector("#explorer-readout");
    function show(r, c) {
      const row = ex.rows[r * gw + c], mx = Math.max(...row);
      const hc = heat.getContext("2d");
      hc.clearRect(0, 0, gw, gh);
      for (let t = 0; t < row.length; t++) {
        hc.fillStyle = "rgba(220, 30, 30, " + (0.85 * row[t] / mx).toFixed(3) + ")";
        hc.fillRect(t % gw, Math.floor(t / gw), 1, 1);
      }
      for (const cell of grid.children) cell.classList.toggle("q", cell.dataset.r == r && cell.dataset.c == c);
      const o = gp.explorerReadout(ex, r, c, k);
      readout.dataset.query = JSON.stringify([r, c]);
      readout.dataset.key = JSON.stringify(o.key);
      readout.dataset.gate = String(o.gate);
      readout.dataset.share = String(o.share);
      readout.textContent = "query token (" + r + ", " + c + "): largest gate " + o.gate.toFixed(4) +
        " on key (" + o.key[0] + ", " + o.key[1] + "); top " + k + " keys hold " + o.share.toFixed(3) +
        " of the gate (an even split: " + (k / row.length).toFixed(3) + ")";
    }
    for (let r = 0; r < gh; r++) for (let c = 0; c < gw; c++) {
      const cell = document.createElement("div");
      cell.dataset.r = r; cell.dataset.c = c;
      cell.addEventListener("mouseenter", () => show(r, c));
      grid.appendChild(cell);
    }
    show(cfg.start[0], cfg.start[1]);
  }

  // --------------------------------------------------------------------------- the verdict filter
  function applyFilter(mode) {
    const keep = (v) => mode === "all" || (mode === "bad" ? v !== "ok" : v === mode);
    for (const art of document.querySelectorAll("article.experiment")) {
      let shown = 0;
      for (const tr of art.querySelectorAll("tr.claim")) {
        const on = keep(tr.dataset.verdict);
        tr.classList.toggle("hidden", !on);
        shown += on ? 1 : 0;
      }
      const hide = mode !== "all" && shown === 0;
      art.classList.toggle("hidden", hide);
      const link = document.querySelector('nav a[href="#' + art.id + '"]');
      if (link) link.parentElement.classList.toggle("hidden", hide);
    }
    for (const sec of document.querySelectorAll("section.lecture-section")) {
      const hide = sec.querySelectorAll("article.experiment:not(.hidden)").length === 0;
      sec.classList.toggle("hidden", hide);
      const link = document.querySelector('nav a[href="#' + sec.id + '"]');
      if (link) link.parentElement.classList.toggle("hidden", hide);
    }
  }
  gp.applyFilter = applyFilter;

  const WIDGETS = { tau: tauWidget, sqrtd: sqrtDWidget, padding: paddingWidget, explorer: explorerWidget };
  function init() {
    for (const el of document.querySelectorAll("[data-widget]")) {
      WIDGETS[el.dataset.widget](el, JSON.parse(el.querySelector("script.config").textContent));
    }
    for (const radio of document.querySelectorAll("#filter input")) {
      radio.addEventListener("change", () => applyFilter(radio.value));
    }
    document.body.dataset.ready = "1";
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
