// The audit report's script: tooltips, owner highlight, and a timeline the reader can zoom,
// pan, filter and sort. It redraws from the compact data in #fc-data with the same rules as
// review/timeline.py (which draws the static SVG shown first and with scripts off).
// Offline by construction: the page's CSP allows only this script (by hash) and no fetches.
(function () {
  'use strict';
  var d = document, tip = d.getElementById('tip'), sel = null;
  var LW = 230, CW = 940, LH = 30, OH = 54, TOP = 26, W = LW + CW + 12;
  var OCC = 3, DENS = 4, MAXG = Math.floor(CW / 10);
  var D = JSON.parse(d.getElementById('fc-data').textContent);
  var chart = d.getElementById('chart'), defs = d.querySelector('#timeline defs').outerHTML;
  var lanes = D.tasks.map(function (t, i) {
    return {task: t, i: i, first: D.first[i], cont: D.contention[i], h: null, m: null};
  });
  var state = {a: D.t0, b: D.t1, q: '', sort: 'contention', limit: D.static};
  var minSpan = Math.max(1, (D.t1 - D.t0) / 2000);

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function iso(t) { return new Date(t * 1000).toISOString().replace('.000Z', 'Z'); }
  function dur(s) {
    s = Math.max(0, s);
    if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + 's';
    var m = Math.round(s / 60);
    if (m < 60) return m + 'm';
    var h = Math.floor(m / 60);
    return h < 48 ? h + 'h ' + (m % 60) + 'm' : Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  }
  function decode(L) {  // delta-encoded integers -> holdings and markers, once per lane
    if (L.h) return;
    var q = D.q, a = D.h[L.i], b = D.m[L.i], p = 0, k, s;
    L.h = []; L.m = [];
    for (k = 0; k < a.length; k += 5) {
      p += a[k]; s = D.t0 + p * q;
      L.h.push({s: s, e: s + a[k + 1] * q, v: s + a[k + 2] * q, o: a[k + 3], x: a[k + 4]});
    }
    for (p = 0, k = 0; k < b.length; k += 2) { p += b[k]; L.m.push({t: D.t0 + p * q, k: b[k + 1]}); }
  }
  function scale() {
    var a = state.a, b = state.b, k = CW / (b - a);
    var x = function (t) { return LW + (Math.min(Math.max(t, a), b) - a) * k; };
    x.a = a; x.b = b; x.k = k;
    x.bucket = function (t, px) {
      return Math.min(Math.floor(CW / px) - 1, Math.max(0, Math.floor((t - a) * k / px)));
    };
    return x;
  }
  function dominant(c) {
    var best = -1, n = -1;
    for (var i = 0; i < c.length; i++) if (c[i] > n) { n = c[i]; best = i; }
    return best;
  }
  function densityBars(counts, x, bottom, height, label) {
    var peak = 0, out = '', i, j, n;
    for (i = 0; i < counts.length; i++) if (counts[i]) peak = Math.max(peak, counts[i].n);
    for (i = 0; i < counts.length; i++) {
      var c = counts[i];
      if (!c) continue;
      n = c.n;
      var h = Math.max(2, height * Math.log1p(n) / Math.log1p(peak)), parts = [];
      for (j = 0; j < c.k.length; j++) if (c.k[j]) parts.push(c.k[j] + ' ' + D.kinds[j].replace('_', ' '));
      out += '<rect class="dens" x="' + (LW + i * DENS) + '" y="' + (bottom - h).toFixed(1) +
        '" width="' + (DENS - 0.5) + '" height="' + h.toFixed(1) + '" fill="' +
        D.kindColours[dominant(c.k)] + '"><title>' + esc(label + ': ' + n + ' events from ' +
        iso(x.a + i * DENS / x.k) + ' over ' + dur(DENS / x.k) + '\n' + parts.join(', ')) +
        '</title></rect>';
    }
    return out;
  }
  function count(counts, x, t, kind) {
    if (t < x.a || t > x.b) return;
    var i = x.bucket(t, DENS), c = counts[i];
    if (!c) { c = counts[i] = {n: 0, k: D.kinds.map(function () { return 0; })}; }
    c.n++; c.k[kind]++;
  }
  function bars(L, x, y) {
    var hs = L.h.filter(function (h) { return h.e >= x.a && h.s <= x.b; }), out = '', i;
    var few = hs.length <= CW / 6 && hs.every(function (h, i) { return !i || x(h.s) - x(hs[i - 1].s) >= 3; });
    if (few) {
      for (i = 0; i < hs.length; i++) {
        var h = hs[i], xs = x(h.s), xe = Math.max(x(h.e), xs + 2), xv = Math.min(Math.max(x(h.v), xs), xe);
        var owner = D.owners[h.o], t = L.task + ': ' + owner + '\nfrom ' + iso(h.s) + '\nto ' +
          iso(h.e) + ': ' + D.ends[h.x].replace(/_/g, ' ') + '\nlease valid for ' + dur(h.v - h.s);
        out += '<g class="bar' + (sel !== null && owner !== sel ? ' dim' : '') + '" tabindex="0" data-owner="' +
          esc(owner) + '" data-tip="' + esc(t) + '"><rect class="main" x="' + xs.toFixed(1) + '" y="' + y +
          '" width="' + (xe - xs).toFixed(1) + '" height="14" rx="3" fill="' + D.colours[h.o] + '"/>' +
          (xe - xv >= 1 ? '<rect x="' + xv.toFixed(1) + '" y="' + y + '" width="' + (xe - xv).toFixed(1) +
            '" height="14" fill="url(#stale)"/>' : '') + '</g>';
      }
      return out;
    }
    var n = Math.floor(CW / OCC), w = (x.b - x.a) / n, held = [], starts = [], k;
    hs.forEach(function (h) {
      var a = Math.max(h.s, x.a), b = Math.min(h.e, x.b), i0 = x.bucket(a, OCC), j = x.bucket(b, OCC);
      starts[i0] = (starts[i0] || 0) + 1;
      for (k = i0; k <= j; k++) {
        var lo = Math.max(a, x.a + k * w), hi = Math.min(b, x.a + (k + 1) * w), m = held[k] || (held[k] = {});
        m[h.o] = (m[h.o] || 0) + Math.max(hi - lo, w * 0.05);
      }
    });
    var run = null;
    for (k = 0; k <= n; k++) {
      var m2 = k < n ? held[k] : null, key = null;
      if (m2) {
        var best = null, tot = 0;
        for (var o in m2) { tot += m2[o]; if (best === null || m2[o] > m2[best]) best = o; }
        key = [+best, Math.min(4, Math.ceil(4 * Math.min(1, tot / w)))];
      }
      if (run && (!key || key[0] !== run[1] || key[1] !== run[2])) {
        out += '<rect class="occ" x="' + (LW + run[0] * OCC) + '" y="' + y + '" width="' + ((k - run[0]) * OCC) +
          '" height="14" fill="' + D.colours[run[1]] + '" opacity="' + (0.25 + 0.1875 * run[2]) + '"><title>' +
          esc(L.task + ': ' + run[3] + ' holdings from ' + iso(x.a + run[0] * w) + ' to ' + iso(x.a + k * w) +
            ', mostly ' + D.owners[run[1]]) + '</title></rect>';
        run = null;
      }
      if (key) { if (!run) run = [k, key[0], key[1], 0]; run[3] += starts[k] || 0; }
    }
    return out;
  }
  function marks(L, x, y) {
    var ms = L.m.filter(function (m) { return m.t >= x.a && m.t <= x.b; }), out = '', last = -1e9;
    if (ms.length > MAXG) {
      var counts = [];
      ms.forEach(function (m) { count(counts, x, m.t, m.k); });
      return densityBars(counts, x, y + LH - 1, 9, L.task);
    }
    ms.forEach(function (m) {
      var mx = x(m.t), kind = D.kinds[m.k];
      if (last + 9 - mx >= 0 && last + 9 - mx <= 27) mx = last + 9;
      last = mx;
      out += '<g class="marker" tabindex="0" data-kind="' + kind + '" data-tip="' +
        esc(kind.replace('_', ' ') + '\n' + iso(m.t) + '\ntask: ' + L.task) + '" transform="translate(' +
        mx.toFixed(1) + ',' + (y + 12) + ')"><use href="#m-' + kind + '"/></g>';
    });
    return out;
  }
  function ticks(a, b) {
    var steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, 604800];
    var step = (b - a) / 10, out = [];
    for (var i = 0; i < steps.length; i++) if ((b - a) / steps[i] <= 10) { step = steps[i]; break; }
    for (var t = (Math.floor(a / step) + 1) * step; t <= b; t += step) out.push(t);
    return out;
  }
  function label(t, span) {
    var s = new Date(t * 1000).toISOString();
    return span < 600 ? s.slice(11, 19) : span < 86400 ? s.slice(11, 16) : s.slice(5, 10) + ' ' + s.slice(11, 16);
  }
  function picked() {
    var q = state.q.toLowerCase(), out = lanes.filter(function (L) { return !q || L.task.toLowerCase().indexOf(q) >= 0; });
    if (state.sort === 'name') out.sort(function (p, r) { return p.task < r.task ? -1 : p.task > r.task ? 1 : 0; });
    else if (state.sort === 'first') out.sort(function (p, r) { return p.first - r.first || p.i - r.i; });
    else if (state.sort === 'group') {  // by prefix, most contended first within each
      out.sort(function (p, r) { var g = group(p.task), h = group(r.task); return g < h ? -1 : g > h ? 1 : p.i - r.i; });
    }
    return out;
  }
  function group(task) { var i = task.indexOf('/'); return i > 0 ? task.slice(0, i + 1) : '(no prefix)'; }
  function draw() {
    var x = scale(), all = picked(), y0 = TOP + OH;
    all.forEach(decode);
    if (x.a > D.t0 || x.b < D.t1) {  // zoomed in: the lanes with something in view
      all = all.filter(function (L) {
        return L.h.some(function (h) { return h.e >= x.a && h.s <= x.b; }) ||
          L.m.some(function (m) { return m.t >= x.a && m.t <= x.b; });
      });
    }
    var shown = all.slice(0, state.limit);
    var sizes = {}, heads = 0, prev = null;
    if (state.sort === 'group') {  // a heading row before each group: its prefix and size
      all.forEach(function (L) { var g = group(L.task); sizes[g] = (sizes[g] || 0) + 1; });
      shown.forEach(function (L) { var g = group(L.task); if (g !== prev) heads++; prev = g; });
    }
    var height = y0 + LH * Math.max(1, shown.length) + 20 * heads + 6, span = x.b - x.a, out = [], counts = [];
    out.push('<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="' + W + '" height="' + height +
      '" role="img" aria-label="timeline">' + defs + '<g class="axis"><text x="4" y="' + (TOP - 10) +
      '">task \\ time (UTC)</text>');
    ticks(x.a, x.b).forEach(function (t) {
      out.push('<line x1="' + x(t).toFixed(1) + '" x2="' + x(t).toFixed(1) + '" y1="' + (TOP - 6) + '" y2="' +
        height + '"/><text x="' + x(t).toFixed(1) + '" y="' + (TOP - 10) + '" text-anchor="middle">' + label(t, span) + '</text>');
    });
    all.forEach(function (L) {
      L.h.forEach(function (h) { count(counts, x, h.s, 0); });
      L.m.forEach(function (m) { count(counts, x, m.t, m.k); });
    });
    out.push('</g><g class="overview"><text x="6" y="' + (TOP + 22) + '">' + (x.a > D.t0 || x.b < D.t1 ? 'in view: ' : state.q ? 'matching ' : 'all ') +
      all.length + ' tasks</text><text x="6" y="' + (TOP + 38) + '" class="sub">events per ' + dur(DENS / x.k) +
      '</text>' + densityBars(counts, x, TOP + OH - 6, OH - 12, 'all tasks') + '</g><g class="lanes">');
    var y = y0;
    prev = null;
    shown.forEach(function (L) {
      var short = L.task.length <= 32 ? L.task : L.task.slice(0, 31) + '\u2026', g = group(L.task);
      if (state.sort === 'group' && g !== prev) {
        out.push('<g class="group"><rect y="' + y + '" width="' + W + '" height="20"/><text x="6" y="' + (y + 14) +
          '">' + esc(g) + ' \u00b7 ' + sizes[g] + ' tasks</text></g>');
        y += 20;
      }
      prev = g;
      out.push('<g class="lane" data-task="' + esc(L.task) + '"><rect class="bg" y="' + y + '" width="' + W +
        '" height="' + LH + '"/><text x="6" y="' + (y + 19) + '"><title>' + esc(L.task) + '</title>' + esc(short) +
        '</text>' + bars(L, x, y + 5) + marks(L, x, y) + '</g>');
      y += LH;
    });
    out.push('</g>');
    D.reg.forEach(function (r) {
      if (r[0] >= x.a && r[0] <= x.b) out.push('<line class="regline" x1="' + x(r[0]).toFixed(1) + '" x2="' +
        x(r[0]).toFixed(1) + '" y1="' + TOP + '" y2="' + height + '" data-tip="' + esc(r[1]) + '"/>');
    });
    chart.innerHTML = out.join('') + '</svg>';
    d.getElementById('shown').textContent = 'showing ' + shown.length + ' of ' + all.length + ' tasks, ' +
      iso(x.a) + ' to ' + iso(x.b) + ' (' + dur(span) + ')';
    d.getElementById('more').hidden = shown.length >= all.length;
    d.documentElement.setAttribute('data-view', x.a + ',' + x.b);
    d.documentElement.setAttribute('data-ready', String(chart.querySelectorAll('.bar').length));
    var h = 'from=' + iso(x.a) + '&to=' + iso(x.b) + (state.q ? '&q=' + encodeURIComponent(state.q) : '') +
      (state.sort !== 'contention' ? '&sort=' + state.sort : '');
    if (history.replaceState && location.protocol !== 'about:') history.replaceState(null, '', '#' + h);
  }
  function zoom(f, at) {
    var a = state.a, b = state.b, span = Math.min(D.t1 - D.t0, Math.max(minSpan, (b - a) * f));
    var c = at === undefined ? (a + b) / 2 : at, r = (c - a) / (b - a);
    a = c - span * r; b = a + span;
    if (a < D.t0) { a = D.t0; b = a + span; }
    if (b > D.t1) { b = D.t1; a = b - span; }
    state.a = a; state.b = b; draw();
  }
  function timeAt(clientX) {
    var r = chart.getBoundingClientRect(), px = clientX - r.left + chart.scrollLeft - LW;
    return state.a + Math.min(CW, Math.max(0, px)) / CW * (state.b - state.a);
  }
  function show(el, x, y) {
    var t = el.getAttribute('data-tip');
    if (!t) { var ti = el.querySelector('title'); t = ti ? ti.textContent : ''; }
    tip.textContent = t; tip.hidden = false;
    tip.style.left = Math.max(0, Math.min(x + 14, innerWidth - tip.offsetWidth - 4)) + 'px';
    tip.style.top = Math.max(0, Math.min(y + 14, innerHeight - tip.offsetHeight - 4)) + 'px';
  }
  function at(t) { return t && t.closest ? t.closest('[data-tip],.dens,.occ') : null; }
  d.addEventListener('mousemove', function (ev) {
    var el = at(ev.target);
    if (el) show(el, ev.clientX, ev.clientY); else tip.hidden = true;
  });
  d.addEventListener('focusin', function (ev) {
    var el = at(ev.target);
    if (el) { var r = el.getBoundingClientRect(); show(el, r.left, r.bottom); }
  });
  d.addEventListener('focusout', function () { tip.hidden = true; });
  var items = d.querySelectorAll('.legend [data-owner]');
  items.forEach(function (it) {
    it.addEventListener('click', function () {
      var o = it.getAttribute('data-owner');
      sel = (sel === o) ? null : o;
      items.forEach(function (i) { i.classList.toggle('sel', i.getAttribute('data-owner') === sel); });
      chart.querySelectorAll('.bar').forEach(function (b) {
        b.classList.toggle('dim', sel !== null && b.getAttribute('data-owner') !== sel);
      });
    });
  });
  chart.addEventListener('wheel', function (ev) {
    if (!ev.deltaY) return;
    ev.preventDefault();
    zoom(ev.deltaY > 0 ? 1.25 : 0.8, timeAt(ev.clientX));
  }, {passive: false});
  var drag = null;
  chart.addEventListener('mousedown', function (ev) { drag = {x: ev.clientX, a: state.a, b: state.b}; });
  d.addEventListener('mouseup', function () { drag = null; });
  d.addEventListener('mousemove', function (ev) {
    if (!drag) return;
    var dt = (ev.clientX - drag.x) / CW * (drag.b - drag.a), span = drag.b - drag.a;
    var a = Math.min(Math.max(D.t0, drag.a - dt), D.t1 - span);
    if (Math.abs(a - state.a) * CW / span >= 2) { state.a = a; state.b = a + span; draw(); }
  });
  d.addEventListener('keydown', function (ev) {  // + - 0 and the arrows, outside the filter box
    if (ev.target && ev.target.tagName === 'INPUT') return;
    var span = state.b - state.a, step = {ArrowLeft: -0.2, ArrowRight: 0.2}[ev.key];
    if (ev.key === '+' || ev.key === '=') zoom(0.5);
    else if (ev.key === '-') zoom(2);
    else if (ev.key === '0') { state.a = D.t0; state.b = D.t1; draw(); }
    else if (step) {
      state.a = Math.min(Math.max(D.t0, state.a + step * span), D.t1 - span);
      state.b = state.a + span; draw();
    }
  });
  chart.addEventListener('dblclick', function () { state.a = D.t0; state.b = D.t1; draw(); });
  d.getElementById('zin').addEventListener('click', function () { zoom(0.5); });
  d.getElementById('zout').addEventListener('click', function () { zoom(2); });
  d.getElementById('zreset').addEventListener('click', function () { state.a = D.t0; state.b = D.t1; draw(); });
  d.getElementById('more').addEventListener('click', function () { state.limit += D.static; draw(); });
  d.getElementById('filter').addEventListener('input', function (ev) { state.q = ev.target.value; state.limit = D.static; draw(); });
  d.getElementById('sort').addEventListener('change', function (ev) { state.sort = ev.target.value; draw(); });
  // A link to a view: #from=ISO&to=ISO&q=text&sort=name|first (also how the tests drive it).
  var hash = {};
  location.hash.slice(1).split('&').forEach(function (kv) {
    var i = kv.indexOf('=');
    if (i > 0) { try { hash[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1)); } catch (e) { /* a malformed link: that part ignored */ } }
  });
  var from = Date.parse(hash.from) / 1000, to = Date.parse(hash.to) / 1000;
  if (from < to) { state.a = Math.max(D.t0, from); state.b = Math.min(D.t1, Math.max(to, state.a + minSpan)); }
  if (hash.q) { state.q = hash.q; d.getElementById('filter').value = hash.q; }
  if (hash.sort) { state.sort = hash.sort; d.getElementById('sort').value = hash.sort; }
  d.getElementById('controls').hidden = false;
  if (from < to || hash.q || hash.sort) draw();
  else {
    d.documentElement.setAttribute('data-view', D.t0 + ',' + D.t1);
    d.documentElement.setAttribute('data-ready', String(chart.querySelectorAll('.bar').length));
  }
})();
