// Model view (bertviz's model_view, as heatmaps): every layer × head as a thumbnail, each on
// its own min..max scale; clicking one opens it in the matrix view.
const mv = {
  thumbs: [],
  drawn: false,

  init: function () {
    const grid = $('mv-grid');
    // Thumbnails about 1200 px across in all, between 40 and 120 px, in the matrix's aspect.
    const side = Math.max(40, Math.min(120, Math.floor(1200 / NH) - 8));
    const w = NC >= NR ? side : Math.max(8, Math.round((side * NC) / NR));
    const h = NR >= NC ? side : Math.max(8, Math.round((side * NR) / NC));
    grid.style.gridTemplateColumns = 'auto repeat(' + NH + ', ' + (w + 4) + 'px)';
    grid.appendChild(el('div', 'mv-label', ''));
    for (let hd = 0; hd < NH; hd++) grid.appendChild(el('div', 'mv-label', 'head ' + hd));
    for (let l = 0; l < NL; l++) {
      grid.appendChild(el('div', 'mv-label', 'layer ' + l));
      for (let hd = 0; hd < NH; hd++) {
        const c = el('canvas', 'mv-thumb');
        c.dataset.layer = String(l);
        c.dataset.head = String(hd);
        c.title = 'layer ' + l + ', head ' + hd;
        c.style.width = w + 'px';
        c.style.height = h + 'px';
        // Nearest-neighbour only when enlarging: shrinking it would drop whole rows.
        if (w < NC || h < NR) c.style.imageRendering = 'auto';
        c.addEventListener('click', function () { mv.open(l, hd); });
        grid.appendChild(c);
        mv.thumbs.push(c);
      }
    }
  },

  open: function (l, h) {
    state.matrix = String(h);
    setLayer(l);
    showView('matrix');
  },

  draw: function () {
    const n = NR * NC;
    const values = new Float64Array(n);
    mv.thumbs.forEach(function (c) {
      const base = offset(Number(c.dataset.layer), Number(c.dataset.head));
      for (let k = 0; k < n; k++) values[k] = W[base + k] / SCALE;
      const r = finiteRange(values);
      paintPixels(c, values, NR, NC, r[0], r[1]);
    });
    mv.drawn = true;
  },

  // The thumbnail the matrix view shows is outlined.
  mark: function () {
    const head = /^[0-9]+$/.test(state.matrix) ? state.matrix : null;
    mv.thumbs.forEach(function (c) {
      const on = head !== null && c.dataset.head === head && Number(c.dataset.layer) === state.layer;
      c.classList.toggle('sel', on);
    });
  },

  show: function () {
    if (!mv.drawn) mv.draw();
    mv.mark();
  },
  layerChanged: function () { mv.mark(); },
};
views.model = mv;
