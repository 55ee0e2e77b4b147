// Head view (bertviz's head_view): queries left, keys right, one line per (head, query, key)
// with opacity ∝ weight and one colour per head, on a canvas; the tokens are DOM elements.
const HV_ROW = 20; // CSS px per token (matches .hv-tok's height)
const HV_WIDTH = 300; // the canvas's CSS width
const HV_LEVELS = 64; // opacity steps: one path per (head, step) keeps the strokes few
// Weights below this would draw with under 1 % opacity, invisible on white: skipped.
const MIN_LINE_WEIGHT = 0.01;
const MIN_LINE_INT = Math.max(1, Math.round(MIN_LINE_WEIGHT * SCALE));

const hv = {
  canvas: null,
  queries: [],
  keys: [],
  focused: null,

  init: function () {
    const sel = $('hv-layer');
    fillLayerSelect(sel);
    sel.addEventListener('change', function () { setLayer(Number(sel.value)); });
    const heads = $('hv-heads');
    for (let h = 0; h < NH; h++) {
      const b = el('button', 'hv-head', String(h));
      b.type = 'button';
      b.dataset.head = String(h);
      b.title = 'head ' + h;
      b.style.background = D.head_colors[h];
      b.setAttribute('aria-pressed', 'true');
      b.addEventListener('click', function () {
        state.enabled[h] = !state.enabled[h];
        hv.draw();
      });
      heads.appendChild(b);
    }
    $('hv-all').addEventListener('click', function () { state.enabled.fill(true); hv.draw(); });
    $('hv-none').addEventListener('click', function () { state.enabled.fill(false); hv.draw(); });
    hv.queries = hv.tokens($('hv-queries'), D.query_labels, 'row', 'i');
    hv.keys = hv.tokens($('hv-keys'), D.key_labels, 'col', 'j');
    hv.canvas = $('hv-canvas');
    const dpr = window.devicePixelRatio || 1;
    const height = Math.max(NR, NC) * HV_ROW;
    hv.canvas.width = Math.round(HV_WIDTH * dpr);
    hv.canvas.height = Math.round(height * dpr);
    hv.canvas.style.width = HV_WIDTH + 'px';
    hv.canvas.style.height = height + 'px';
  },

  // One element per label; hovering one focuses its row (queries) or column (keys).
  tokens: function (column, labels, kind, attr) {
    const els = labels.map(function (label, k) {
      const t = el('div', 'hv-tok', label);
      t.dataset[attr] = String(k);
      t.title = label;
      column.appendChild(t);
      return t;
    });
    column.addEventListener('mouseover', function (e) {
      const t = e.target.closest('.hv-tok');
      if (t) hv.setFocus({ kind: kind, index: Number(t.dataset[attr]) });
    });
    column.addEventListener('mouseleave', function () { hv.setFocus(null); });
    return els;
  },

  setFocus: function (f) {
    const same = f && state.focus && f.kind === state.focus.kind && f.index === state.focus.index;
    if (same || (!f && !state.focus)) return;
    state.focus = f;
    hv.draw();
  },

  draw: function () {
    const l = state.layer;
    $('hv-layer').value = String(l);
    document.querySelectorAll('.hv-head').forEach(function (b) {
      b.setAttribute('aria-pressed', String(state.enabled[Number(b.dataset.head)]));
    });
    if (hv.focused) hv.focused.classList.remove('focus');
    const f = state.focus;
    hv.focused = f ? (f.kind === 'row' ? hv.queries : hv.keys)[f.index] : null;
    if (hv.focused) hv.focused.classList.add('focus');
    hv.shade(f);

    const c = hv.canvas, ctx = c.getContext('2d');
    const dpr = c.width / HV_WIDTH;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, HV_WIDTH, c.height / dpr);
    const i0 = f && f.kind === 'row' ? f.index : 0, i1 = f && f.kind === 'row' ? f.index + 1 : NR;
    const j0 = f && f.kind === 'col' ? f.index : 0, j1 = f && f.kind === 'col' ? f.index + 1 : NC;
    // 1 px lines take the rasteriser's hairline path, 10x faster than wider ones: thicker,
    // easier to see lines only when they are few (a focused token, a short input).
    const most = (i1 - i0) * (j1 - j0) * state.enabled.filter(Boolean).length;
    ctx.lineWidth = most <= 20000 ? 2 : 1;
    let lines = 0;
    for (let h = 0; h < NH; h++) {
      if (!state.enabled[h]) continue;
      const paths = new Array(HV_LEVELS + 1);
      const base = offset(l, h);
      for (let i = i0; i < i1; i++) {
        const row = base + i * NC, y0 = (i + 0.5) * HV_ROW;
        for (let j = j0; j < j1; j++) {
          const q = W[row + j];
          if (q < MIN_LINE_INT) continue;
          const level = Math.min(HV_LEVELS, Math.ceil((q / SCALE) * HV_LEVELS));
          const p = paths[level] || (paths[level] = new Path2D());
          p.moveTo(0, y0);
          p.lineTo(HV_WIDTH, (j + 0.5) * HV_ROW);
          lines++;
        }
      }
      ctx.strokeStyle = D.head_colors[h];
      for (let level = 1; level <= HV_LEVELS; level++) {
        if (!paths[level]) continue;
        ctx.globalAlpha = level / HV_LEVELS;
        ctx.stroke(paths[level]);
      }
    }
    ctx.globalAlpha = 1;
    state.lines = lines;
    c.dataset.lines = String(lines);
    c.dataset.focus = f ? f.kind + ' ' + f.index : '';
    c.dataset.layer = String(l);
    c.dataset.heads = state.enabled
      .map(function (on, h) { return on ? h : -1; })
      .filter(function (h) { return h >= 0; })
      .join(',');
  },

  // With a token focused, the other column's tokens are shaded by the strongest weight the
  // shown heads give them (as bertviz does), so small weights are still readable.
  shade: function (f) {
    hv.queries.concat(hv.keys).forEach(function (t) { t.style.backgroundColor = ''; });
    if (!f) return;
    const others = f.kind === 'row' ? hv.keys : hv.queries;
    others.forEach(function (t, k) {
      let best = 0;
      for (let h = 0; h < NH; h++) {
        if (!state.enabled[h]) continue;
        const i = f.kind === 'row' ? f.index : k, j = f.kind === 'row' ? k : f.index;
        best = Math.max(best, W[offset(state.layer, h) + i * NC + j] / SCALE);
      }
      if (best > 0) t.style.backgroundColor = 'rgba(255, 176, 0, ' + Math.min(1, best).toFixed(3) + ')';
    });
  },

  show: function () { hv.draw(); },
  layerChanged: function () { if (state.view === 'head') hv.draw(); },
};
views.head = hv;
