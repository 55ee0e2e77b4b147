// Matrix view: one labelled heatmap (one head, the layer's heads fused, or a model-wide
// matrix) with the PNG heatmaps' colours and scale, and the value under the mouse.
const mx = {
  values: null,
  cell: 12,
  hlRow: null,
  hlCol: null,

  init: function () {
    const ls = $('mx-layer');
    fillLayerSelect(ls);
    ls.addEventListener('change', function () { setLayer(Number(ls.value)); mx.draw(); });
    const ms = $('mx-matrix');
    const add = function (parent, value, text) {
      const o = el('option', null, text);
      o.value = value;
      parent.appendChild(o);
    };
    const layerGroup = el('optgroup');
    layerGroup.label = 'this layer';
    for (let h = 0; h < NH; h++) add(layerGroup, String(h), 'head ' + h);
    add(layerGroup, 'mean', 'mean of heads');
    add(layerGroup, 'max', 'max of heads');
    add(layerGroup, 'min', 'min of heads');
    ms.appendChild(layerGroup);
    if (D.matrices.length) {
      const g = el('optgroup');
      g.label = 'whole model';
      D.matrices.forEach(function (m, k) { add(g, 'm' + k, m.name); });
      ms.appendChild(g);
    }
    ms.addEventListener('change', function () { state.matrix = ms.value; mx.draw(); });

    // Cells of 12 to 40 px: big enough for a label beside each row and under each column.
    mx.cell = Math.max(12, Math.min(40, Math.floor(720 / Math.max(NR, NC))));
    const font = Math.min(13, mx.cell - 2) + 'px';
    const labels = function (box, list, attr, horizontal) {
      return list.map(function (label, k) {
        const e = el('div', 'mx-label', label);
        e.dataset[attr] = String(k);
        e.title = label;
        e.style.fontSize = font;
        e.style[horizontal ? 'width' : 'height'] = mx.cell + 'px';
        e.style.lineHeight = mx.cell + 'px';
        box.appendChild(e);
        return e;
      });
    };
    mx.rowLabels = labels($('mx-rows'), D.query_labels, 'i', false);
    mx.colLabels = labels($('mx-cols'), D.key_labels, 'j', true);
    const c = $('mx-canvas');
    c.width = NC * mx.cell;
    c.height = NR * mx.cell;
    c.dataset.cell = String(mx.cell);
    c.dataset.rows = String(NR);
    c.dataset.cols = String(NC);
    c.addEventListener('mousemove', function (e) {
      const r = c.getBoundingClientRect();
      const j = Math.floor((e.clientX - r.left) / mx.cell);
      const i = Math.floor((e.clientY - r.top) / mx.cell);
      mx.readout(i >= 0 && i < NR && j >= 0 && j < NC ? [i, j] : null);
    });
    c.addEventListener('mouseleave', function () { mx.readout(null); });
    // The colour bar, vmin at the left, vmax at the right (above the heatmap, so that a wide
    // one does not push it out of sight).
    const bar = $('mx-colorbar'), bctx = bar.getContext('2d');
    for (let x = 0; x < bar.width; x++) {
      bctx.fillStyle = VIRIDIS[Math.min(255, Math.floor((x / bar.width) * 256))];
      bctx.fillRect(x, 0, 1, bar.height);
    }
  },

  // The chosen matrix: {values, title, digits}.
  compute: function () {
    const m = state.matrix, l = state.layer, n = NR * NC;
    const values = new Float64Array(n);
    if (/^m[0-9]+$/.test(m)) {
      const src = D.matrices[Number(m.slice(1))];
      for (let k = 0; k < n; k++) values[k] = src.values[k] / SCALE;
      return { values: values, title: src.name, digits: D.decimals, layerWise: false };
    }
    if (/^[0-9]+$/.test(m)) {
      const base = offset(l, Number(m));
      for (let k = 0; k < n; k++) values[k] = W[base + k] / SCALE;
      return { values: values, title: 'layer ' + l + ', head ' + m, digits: D.decimals, layerWise: true };
    }
    // Fused heads, from the stored integers: the mean is their sum / (H · SCALE).
    for (let k = 0; k < n; k++) {
      let acc = W[offset(l, 0) + k];
      for (let h = 1; h < NH; h++) {
        const q = W[offset(l, h) + k];
        acc = m === 'mean' ? acc + q : m === 'max' ? Math.max(acc, q) : Math.min(acc, q);
      }
      values[k] = m === 'mean' ? acc / (NH * SCALE) : acc / SCALE;
    }
    return {
      values: values,
      title: 'layer ' + l + ', ' + m + ' of ' + NH + (NH === 1 ? ' head' : ' heads'),
      // A mean of stored values carries one more decimal than each of them.
      digits: m === 'mean' ? D.decimals + 1 : D.decimals,
      layerWise: true,
    };
  },

  draw: function () {
    $('mx-layer').value = String(state.layer);
    $('mx-matrix').value = state.matrix;
    const r = mx.compute();
    $('mx-layer').disabled = !r.layerWise;
    const range = finiteRange(r.values);
    mx.values = r.values;
    state.mx = { title: r.title, digits: r.digits, vmin: range[0], vmax: range[1], cell: mx.cell };
    $('mx-title').textContent = r.title;
    $('mx-vmin').textContent = range[0].toFixed(r.digits);
    $('mx-vmax').textContent = range[1].toFixed(r.digits);
    const off = el('canvas');
    paintPixels(off, r.values, NR, NC, range[0], range[1]);
    const ctx = $('mx-canvas').getContext('2d');
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, NC * mx.cell, NR * mx.cell);
    mx.readout(null);
    mv.mark();
  },

  // Shows cell [i, j] (or nothing) in #mx-readout and highlights its labels.
  readout: function (cell) {
    if (mx.hlRow) mx.hlRow.classList.remove('hl');
    if (mx.hlCol) mx.hlCol.classList.remove('hl');
    const box = $('mx-readout');
    box.classList.toggle('on', !!cell);
    if (!cell) {
      mx.hlRow = mx.hlCol = null;
      ['mx-r-pos', 'mx-r-query', 'mx-r-key', 'mx-r-value'].forEach(function (id) { $(id).textContent = ''; });
      return;
    }
    const i = cell[0], j = cell[1];
    mx.hlRow = mx.rowLabels[i];
    mx.hlCol = mx.colLabels[j];
    mx.hlRow.classList.add('hl');
    mx.hlCol.classList.add('hl');
    $('mx-r-pos').textContent = '(' + i + ', ' + j + ')';
    $('mx-r-query').textContent = D.query_labels[i];
    $('mx-r-key').textContent = D.key_labels[j];
    $('mx-r-value').textContent = mx.values[i * NC + j].toFixed(state.mx.digits);
  },

  show: function () { mx.draw(); },
  layerChanged: function () { if (state.view === 'matrix') mx.draw(); },
};
views.matrix = mx;
