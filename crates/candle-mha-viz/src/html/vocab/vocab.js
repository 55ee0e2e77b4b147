// The vocabulary × vocabulary matrix page: a sparse matrix (query token × key token) drawn on a
// canvas one window at a time, and a virtualised table of query tokens with their top keys.
// Data layout and DOM contract: see the module documentation in mod.rs.
(function () {
  'use strict';
  const t0 = performance.now();
  const D = JSON.parse(document.getElementById('mha-data').textContent);
  const VIRIDIS = JSON.parse(document.getElementById('mha-viridis').textContent);
  const tParsed = performance.now();

  const DEC = D.decimals;
  const SCALE = Math.pow(10, DEC);
  const V = D.vocab_size;
  const GRID = 560; // canvas side, CSS px = canvas px (cells are whole pixels: exact colours)
  const LW = 120, LH = 100; // row-label width, column-label height (CSS px)
  const CELLS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48];
  const ROW_H = 26; // table row height, px (matches the CSS)
  const $ = (id) => document.getElementById(id);

  // ---- Decode the sparse data (CSR by query token; key ids delta-coded within a row). ----
  const label = new Array(V);
  D.tokens.forEach((id, i) => { label[id] = D.labels[i]; });
  const R = D.rows.length;
  const rowStart = new Int32Array(R + 1);
  for (let r = 0; r < R; r++) rowStart[r + 1] = rowStart[r] + D.row_len[r];
  const NC = rowStart[R];
  const key = new Int32Array(NC);
  for (let r = 0, c = 0; r < R; r++) {
    let prev = 0;
    for (const end = rowStart[r + 1]; c < end; c++) { prev += D.key[c]; key[c] = prev; }
  }
  // Stored values: scaled integers (value · 10^decimals) except count, a plain integer.
  const stored = {
    share: Float64Array.from(D.share),
    mean: Float64Array.from(D.mean),
    sum: Float64Array.from(D.sum),
    count: Float64Array.from(D.count),
  };
  const rowOf = new Int32Array(V).fill(-1);
  const mass = new Float64Array(V); // scaled row totals; 0 for tokens never seen as queries
  const nq = new Float64Array(V);
  D.rows.forEach((q, r) => { rowOf[q] = r; mass[q] = D.row_total[r]; nq[q] = D.row_queries[r]; });
  const isKey = new Uint8Array(V);
  for (let c = 0; c < NC; c++) isKey[key[c]] = 1;

  // Colours: viridis entry min(floor(t·256), 255) as the PNG heatmaps pick it, packed as
  // little-endian RGBA words for an ImageData's Uint32 view.
  const LUT = new Uint32Array(256);
  VIRIDIS.forEach((hex, i) => {
    const n = parseInt(hex.slice(1), 16);
    LUT[i] = (255 << 24 | (n & 255) << 16 | (n >> 8 & 255) << 8 | n >> 16) >>> 0;
  });
  const BG = (255 << 24 | 0xf6 << 16 | 0xf6 << 8 | 0xf6) >>> 0; // outside the matrix
  // Linear: t = (v − lo) / (hi − lo) as the PNG heatmaps; sqrt: √t, which spreads the many
  // small values of a corpus matrix over more colours.
  const colourIndex = (v, lo, hi) => {
    let t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    if (!(t >= 0)) t = 0; // NaN and below
    if (t > 1) t = 1;
    if (st.scale === 'sqrt') t = Math.sqrt(t);
    return Math.min(Math.floor(t * 256), 255);
  };

  const timings = { parse: tParsed - t0 };

  // ---- State ----
  const st = {
    mode: 'share', sort: 'mass', scale: 'linear', queryFilter: '', keyFilter: '', k: D.top_k,
    cell: 1, row0: 0, col0: 0, selected: -1, lo: 0, hi: 0, shownRows: 0, shownCols: 0,
  };
  let order = [];   // every token seen (as query or key) in the sort order
  let rows = [];    // query tokens shown, in order
  let cols = [];    // key tokens shown, in order
  const rowPos = new Int32Array(V).fill(-1);
  const colPos = new Int32Array(V).fill(-1);

  // A value as the page stores it, shown exactly: scaled integer → fixed decimals.
  function fmtScaled(x) {
    const neg = x < 0;
    x = Math.abs(x);
    const frac = x % SCALE;
    const int = (x - frac) / SCALE;
    return (neg ? '-' : '') + int + '.' + String(frac).padStart(DEC, '0');
  }
  const fmtStored = (mode, x) => (mode === 'count' ? String(x) : fmtScaled(x));
  // A row's mass: a whole number (every query's weights sum to 1) without decimals.
  const fmtMass = (x) => (x % SCALE === 0 ? String(x / SCALE) : fmtScaled(x));
  // The value the colours use: the stored value in real units.
  const real = (mode, x) => (mode === 'count' ? x : x / SCALE);

  // Cell (q, k): its index in the stored arrays, or -1 when never seen.
  function cellIndex(q, k) {
    const r = rowOf[q];
    if (r < 0) return -1;
    let a = rowStart[r], b = rowStart[r + 1] - 1;
    while (a <= b) {
      const m = (a + b) >> 1;
      if (key[m] === k) return m;
      if (key[m] < k) a = m + 1; else b = m - 1;
    }
    return -1;
  }

  function compare(sort) {
    switch (sort) {
      case 'mass': return (a, b) => mass[b] - mass[a] || a - b;
      case 'count': return (a, b) => nq[b] - nq[a] || a - b;
      case 'label': return (a, b) => (label[a] < label[b] ? -1 : label[a] > label[b] ? 1 : a - b);
      default: return (a, b) => a - b;
    }
  }

  function applyOrder() {
    order = D.tokens.slice().sort(compare(st.sort));
    applyFilters();
  }

  function applyFilters() {
    const qf = st.queryFilter, kf = st.keyFilter;
    rows = order.filter((t) => rowOf[t] >= 0 && (qf === '' || label[t].includes(qf)));
    cols = order.filter((t) => isKey[t] === 1 && (kf === '' || label[t].includes(kf)));
    rowPos.fill(-1);
    colPos.fill(-1);
    rows.forEach((t, i) => { rowPos[t] = i; });
    cols.forEach((t, j) => { colPos[t] = j; });
  }

  // ---- The canvas matrix ----
  const canvas = $('vm-canvas');
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  // The canvas is as large as the window it shows (at most GRID × GRID): resized, with a new
  // pixel buffer, only when that changes.
  let image = null, pixels = null, cw = 0, ch = 0;
  function resize(w, h) {
    if (w === cw && h === ch) return;
    cw = w; ch = h;
    canvas.width = w; canvas.height = h;
    canvas.style.width = w + 'px'; canvas.style.height = h + 'px';
    image = ctx.createImageData(w, h);
    pixels = new Uint32Array(image.data.buffer);
    rowLabels.height = h * dpr; rowLabels.style.height = h + 'px';
    colLabels.width = w * dpr; colLabels.style.width = w + 'px';
  }
  const dpr = Math.max(1, Math.round(window.devicePixelRatio || 1));
  const rowLabels = $('vm-rowlabels');
  const colLabels = $('vm-collabels');
  rowLabels.width = LW * dpr;
  colLabels.height = LH * dpr;
  const perSide = () => Math.floor(GRID / st.cell);

  function fitCell() {
    const n = Math.max(rows.length, cols.length, 1);
    let best = CELLS[0];
    for (const c of CELLS) if (n * c <= GRID) best = c;
    st.cell = best;
  }

  function clampWindow() {
    const per = perSide();
    st.row0 = Math.max(0, Math.min(st.row0, rows.length - per));
    st.col0 = Math.max(0, Math.min(st.col0, cols.length - per));
  }

  function drawMatrix() {
    clampWindow();
    const cell = st.cell, per = perSide(), vals = stored[st.mode], mode = st.mode;
    const nr = Math.max(0, Math.min(per, rows.length - st.row0));
    const nc = Math.max(0, Math.min(per, cols.length - st.col0));
    const c0 = st.col0;
    // The colour range: min and max of the shown values, never-seen cells counting as 0.
    let lo = Infinity, hi = -Infinity, seen = 0;
    for (let i = 0; i < nr; i++) {
      const r = rowOf[rows[st.row0 + i]];
      for (let c = rowStart[r], end = rowStart[r + 1]; c < end; c++) {
        const j = colPos[key[c]] - c0;
        if (j >= 0 && j < nc) {
          const v = real(mode, vals[c]);
          if (v < lo) lo = v;
          if (v > hi) hi = v;
          seen++;
        }
      }
    }
    if (seen < nr * nc) { lo = Math.min(lo, 0); hi = Math.max(hi, 0); }
    if (nr * nc === 0) { lo = 0; hi = 0; }
    st.lo = lo; st.hi = hi; st.shownRows = nr; st.shownCols = nc;

    // An empty window still gets a small canvas to show where the matrix would be.
    resize(Math.max(nc * cell, 24), Math.max(nr * cell, 24));
    pixels.fill(BG);
    const zero = LUT[colourIndex(0, lo, hi)];
    const w = nc * cell;
    for (let y = 0, h = nr * cell; y < h; y++) pixels.fill(zero, y * cw, y * cw + w);
    for (let i = 0; i < nr; i++) {
      const r = rowOf[rows[st.row0 + i]];
      for (let c = rowStart[r], end = rowStart[r + 1]; c < end; c++) {
        const j = colPos[key[c]] - c0;
        if (j < 0 || j >= nc) continue;
        const colour = LUT[colourIndex(real(mode, vals[c]), lo, hi)];
        for (let y = i * cell, ye = y + cell; y < ye; y++) {
          pixels.fill(colour, y * cw + j * cell, y * cw + j * cell + cell);
        }
      }
    }
    ctx.putImageData(image, 0, 0);
    drawSelection(nr, nc);
    canvas.dataset.rows = nr;
    canvas.dataset.cols = nc;
    canvas.dataset.cell = cell;
    canvas.dataset.row0 = st.row0;
    canvas.dataset.col0 = st.col0;
    canvas.dataset.totalRows = rows.length;
    canvas.dataset.totalCols = cols.length;
    drawLabels(nr, nc);
    drawColourBar();
    const range = (a, n, total) => (n ? `${a + 1}–${a + n}` : 'none') + ` of ${total}`;
    $('vm-window').textContent = `rows ${range(st.row0, nr, rows.length)} · columns ${range(c0, nc, cols.length)} · ${cell} px cells`;
    $('vm-row0').value = st.row0 + 1;
    $('vm-col0').value = st.col0 + 1;
  }

  // The marked token's row and column: outlines only, so the cells keep their colours inside.
  function drawSelection(nr, nc) {
    const q = st.selected;
    if (q < 0) return;
    const cell = st.cell;
    ctx.lineWidth = 1;
    ctx.strokeStyle = '#ff2d55';
    const i = rowPos[q] - st.row0, j = colPos[q] - st.col0;
    if (i >= 0 && i < nr) ctx.strokeRect(0.5, i * cell + 0.5, nc * cell - 1, Math.max(cell - 1, 1));
    if (j >= 0 && j < nc) ctx.strokeRect(j * cell + 0.5, 0.5, Math.max(cell - 1, 1), nr * cell - 1);
  }

  // Row and column labels, when a cell is tall enough for text.
  function drawLabels(nr, nc) {
    const cell = st.cell;
    const rc = rowLabels.getContext('2d'), cc = colLabels.getContext('2d');
    rc.setTransform(dpr, 0, 0, dpr, 0, 0);
    cc.setTransform(dpr, 0, 0, dpr, 0, 0);
    rc.clearRect(0, 0, LW, ch);
    cc.clearRect(0, 0, cw, LH);
    $('vm-grid-wrap').classList.toggle('vm-unlabelled', cell < 10);
    if (cell < 10) return;
    const size = Math.min(cell - 2, 13);
    const font = `${size}px system-ui, sans-serif`;
    const fit = (g, text, max) => {
      if (g.measureText(text).width <= max) return text;
      let s = text;
      while (s.length > 1 && g.measureText(s + '…').width > max) s = s.slice(0, -1);
      return s + '…';
    };
    rc.font = font; rc.textAlign = 'right'; rc.textBaseline = 'middle';
    for (let i = 0; i < nr; i++) {
      const t = rows[st.row0 + i];
      rc.fillStyle = t === st.selected ? '#d0103a' : '#222';
      rc.fillText(fit(rc, label[t], LW - 8), LW - 4, i * cell + cell / 2);
    }
    cc.font = font; cc.textAlign = 'left'; cc.textBaseline = 'middle';
    for (let j = 0; j < nc; j++) {
      const t = cols[st.col0 + j];
      cc.save();
      cc.translate(j * cell + cell / 2, LH - 4);
      cc.rotate(-Math.PI / 2);
      cc.fillStyle = t === st.selected ? '#d0103a' : '#222';
      cc.fillText(fit(cc, label[t], LH - 8), 0, 0);
      cc.restore();
    }
  }

  const colourBar = $('vm-colorbar');
  colourBar.width = 256;
  colourBar.height = 1;
  function drawColourBar() {
    const g = colourBar.getContext('2d');
    // Linear in the value from lo to hi, so the bar shows the √ scale's mapping too.
    for (let i = 0; i < 256; i++) {
      g.fillStyle = VIRIDIS[colourIndex((i + 0.5) / 256, 0, 1)];
      g.fillRect(i, 0, 1, 1);
    }
    const show = (v) => (st.mode === 'count' ? String(v) : fmtScaled(Math.round(v * SCALE)));
    $('vm-cbar-lo').textContent = show(st.lo);
    $('vm-cbar-hi').textContent = show(st.hi);
  }

  // ---- Hover readout ----
  function cellAtEvent(e) {
    const rect = canvas.getBoundingClientRect();
    const x = (e.clientX - rect.left) * cw / rect.width;
    const y = (e.clientY - rect.top) * ch / rect.height;
    const i = Math.floor(y / st.cell), j = Math.floor(x / st.cell);
    if (i < 0 || j < 0 || i >= st.shownRows || j >= st.shownCols) return null;
    return { q: rows[st.row0 + i], k: cols[st.col0 + j] };
  }

  function showReadout(at) {
    const out = $('vm-readout');
    if (!at) {
      delete out.dataset.q; delete out.dataset.k;
      for (const id of ['query', 'arrow', 'key', 'value', 'all']) $('vm-readout-' + id).textContent = '';
      $('vm-readout-all').textContent = 'hover a cell for its query token, key token and values';
      return;
    }
    const c = cellIndex(at.q, at.k);
    const get = (m) => (c < 0 ? 0 : stored[m][c]);
    out.dataset.q = at.q;
    out.dataset.k = at.k;
    $('vm-readout-query').textContent = label[at.q];
    $('vm-readout-arrow').textContent = ' → ';
    $('vm-readout-key').textContent = label[at.k];
    $('vm-readout-value').textContent = `${st.mode} ${fmtStored(st.mode, get(st.mode))}`;
    $('vm-readout-value').dataset.value = fmtStored(st.mode, get(st.mode));
    $('vm-readout-all').textContent =
      `query id ${at.q}, key id ${at.k} · share ${fmtScaled(get('share'))} · mean ${fmtScaled(get('mean'))}` +
      ` · sum ${fmtScaled(get('sum'))} · count ${get('count')}`;
  }
  let hovered = null;
  canvas.addEventListener('mousemove', (e) => { hovered = cellAtEvent(e); showReadout(hovered); });
  canvas.addEventListener('mouseleave', () => { hovered = null; showReadout(null); });
  canvas.addEventListener('click', (e) => {
    const at = cellAtEvent(e);
    if (at) select(at.q === st.selected ? -1 : at.q, false);
  });
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const step = Math.max(1, Math.round(Math.abs(e.deltaY || e.deltaX) / Math.max(st.cell, 4)));
    const sign = Math.sign(e.deltaY || e.deltaX);
    if (e.shiftKey || (e.deltaX && !e.deltaY)) st.col0 += sign * step; else st.row0 += sign * step;
    drawMatrix();
    hovered = cellAtEvent(e);
    showReadout(hovered);
  }, { passive: false });

  // ---- The virtualised table ----
  const table = $('vm-table');
  const spacer = $('vm-table-spacer');
  const span = (cls, text) => {
    const s = document.createElement('span');
    s.className = cls;
    s.textContent = text;
    return s;
  };

  // Row q's top st.k keys by the current value (ties: smaller key id), keys limited to the
  // shown columns when a key filter is set.
  function topKeys(q) {
    const r = rowOf[q], vals = stored[st.mode], kf = st.keyFilter !== '';
    const idx = [];
    for (let c = rowStart[r], end = rowStart[r + 1]; c < end; c++) {
      if (!kf || colPos[key[c]] >= 0) idx.push(c);
    }
    idx.sort((a, b) => vals[b] - vals[a] || key[a] - key[b]);
    return idx.slice(0, st.k);
  }

  function drawTable() {
    // The sticky header (one row tall) comes first; row i sits at (i + 1)·ROW_H.
    spacer.style.height = rows.length * ROW_H + 'px';
    const first = Math.max(0, Math.floor(table.scrollTop / ROW_H) - 4);
    const last = Math.min(rows.length, Math.ceil((table.scrollTop + table.clientHeight) / ROW_H) + 4);
    for (const old of table.querySelectorAll('.vm-row')) old.remove();
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const q = rows[i], r = rowOf[q];
      const div = document.createElement('div');
      div.className = 'vm-row vm-row-grid' + (q === st.selected ? ' sel' : '');
      div.style.top = (i + 1) * ROW_H + 'px';
      div.dataset.q = q;
      div.dataset.index = i;
      div.append(span('vm-q', label[q]), span('vm-id', String(q)),
        span('vm-mass', fmtMass(D.row_total[r])), span('vm-nq', String(D.row_queries[r])));
      const keys = span('vm-keys', '');
      for (const c of topKeys(q)) {
        const chip = span('vm-key', '');
        chip.dataset.k = key[c];
        chip.append(span('vm-kl', label[key[c]]), span('vm-kv', fmtStored(st.mode, stored[st.mode][c])));
        keys.append(chip);
      }
      div.append(keys);
      frag.append(div);
    }
    table.append(frag);
    table.dataset.total = rows.length;
    $('vm-keys-head').textContent = `top ${st.k} keys by ${st.mode}`;
    $('vm-table-status').textContent = rows.length === R
      ? `${R} query tokens`
      : `${rows.length} of ${R} query tokens match`;
  }
  let tableFrame = 0;
  table.addEventListener('scroll', () => {
    if (!tableFrame) {
      tableFrame = requestAnimationFrame(() => {
        const a = performance.now();
        tableFrame = 0;
        drawTable();
        timings.tableScroll = performance.now() - a;
      });
    }
  });
  table.addEventListener('click', (e) => {
    const row = e.target.closest('.vm-row');
    if (row) select(Number(row.dataset.q) === st.selected ? -1 : Number(row.dataset.q), true);
  });

  // Marks token q (−1: none) and brings its row and column into the matrix window (from the
  // table) or its table row into view (from the matrix).
  function select(q, fromTable) {
    st.selected = q;
    if (q >= 0 && fromTable) {
      const per = perSide();
      if (rowPos[q] >= 0 && (rowPos[q] < st.row0 || rowPos[q] >= st.row0 + per)) st.row0 = rowPos[q] - (per >> 1);
      if (colPos[q] >= 0 && (colPos[q] < st.col0 || colPos[q] >= st.col0 + per)) st.col0 = colPos[q] - (per >> 1);
    }
    if (q >= 0 && !fromTable && rowPos[q] >= 0) {
      const top = rowPos[q] * ROW_H; // scrollTop that puts the row right under the header
      if (top < table.scrollTop || top + 2 * ROW_H > table.scrollTop + table.clientHeight) {
        table.scrollTop = top - (table.clientHeight >> 1);
      }
    }
    render();
  }

  // ---- Controls ----
  function markButtons() {
    for (const b of document.querySelectorAll('[data-mode]')) b.classList.toggle('active', b.dataset.mode === st.mode);
    for (const b of document.querySelectorAll('[data-sort]')) b.classList.toggle('active', b.dataset.sort === st.sort);
    for (const b of document.querySelectorAll('[data-scale]')) b.classList.toggle('active', b.dataset.scale === st.scale);
    $('vm-k').value = st.k;
  }

  function render() {
    markButtons();
    drawMatrix();
    drawTable();
    showReadout(hovered);
  }

  // Every action re-renders synchronously and records its duration (ms) for tests/benchmarks.
  function act(name, f) {
    const a = performance.now();
    f();
    // A new order or window puts another cell under the mouse: drop the stale readout (a new
    // value mode keeps it, to compare the modes on one cell).
    if (name !== 'mode' && name !== 'k') hovered = null;
    render();
    timings[name] = performance.now() - a;
  }

  for (const b of document.querySelectorAll('[data-mode]')) {
    b.addEventListener('click', () => act('mode', () => { st.mode = b.dataset.mode; }));
  }
  for (const b of document.querySelectorAll('[data-scale]')) {
    b.addEventListener('click', () => act('mode', () => { st.scale = b.dataset.scale; }));
  }
  for (const b of document.querySelectorAll('[data-sort]')) {
    b.addEventListener('click', () => act('sort', () => {
      st.sort = b.dataset.sort;
      applyOrder();
      st.row0 = 0; st.col0 = 0; table.scrollTop = 0;
    }));
  }
  $('vm-filter').addEventListener('input', (e) => act('filter', () => {
    st.queryFilter = e.target.value;
    applyFilters();
    st.row0 = 0; table.scrollTop = 0;
  }));
  $('vm-key-filter').addEventListener('input', (e) => act('filter', () => {
    st.keyFilter = e.target.value;
    applyFilters();
    st.col0 = 0;
  }));
  const setK = (k) => act('k', () => { if (Number.isFinite(k)) st.k = Math.max(1, Math.floor(k)); });
  $('vm-k').addEventListener('input', (e) => { if (e.target.value !== '') setK(Number(e.target.value)); });
  $('vm-k-dec').addEventListener('click', () => setK(st.k - 1));
  $('vm-k-inc').addEventListener('click', () => setK(st.k + 1));
  const zoom = (dir) => act('zoom', () => {
    const i = CELLS.indexOf(st.cell) + dir;
    if (i >= 0 && i < CELLS.length) st.cell = CELLS[i];
  });
  $('vm-zoom-in').addEventListener('click', () => zoom(1));
  $('vm-zoom-out').addEventListener('click', () => zoom(-1));
  $('vm-row0').addEventListener('change', (e) => act('scroll', () => { st.row0 = Number(e.target.value) - 1 || 0; }));
  $('vm-col0').addEventListener('change', (e) => act('scroll', () => { st.col0 = Number(e.target.value) - 1 || 0; }));

  // ---- Start ----
  applyOrder();
  fitCell();
  render();
  timings.firstRender = performance.now() - t0;

  // Read-only view of what the page shows, for tests and curious users.
  window.mhaVocab = Object.freeze({
    state: () => ({
      mode: st.mode, sort: st.sort, scale: st.scale, queryFilter: st.queryFilter, keyFilter: st.keyFilter,
      k: st.k, cell: st.cell, row0: st.row0, col0: st.col0, shownRows: st.shownRows,
      shownCols: st.shownCols, rows: rows.slice(), cols: cols.slice(), lo: st.lo, hi: st.hi,
      selected: st.selected, decimals: DEC, vocabSize: V, cells: NC,
    }),
    timings: () => Object.assign({}, timings),
  });
  document.body.dataset.ready = '1';
})();
