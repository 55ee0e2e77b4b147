// The data, the state every view shares, and small helpers. Token text is only ever set with
// textContent, never as HTML.
const D = JSON.parse(document.getElementById('mha-data').textContent);
const VIRIDIS = JSON.parse(document.getElementById('mha-viridis').textContent);
const VIRIDIS_RGB = VIRIDIS.map(function (c) {
  return [parseInt(c.slice(1, 3), 16), parseInt(c.slice(3, 5), 16), parseInt(c.slice(5, 7), 16)];
});
const SCALE = Math.pow(10, D.decimals);
const NL = D.layers, NH = D.heads, NR = D.rows, NC = D.cols;
// (layer, head, query, key) row-major, each round(w · SCALE).
const W = D.weights;

const state = {
  view: 'head',
  layer: 0,
  enabled: new Array(NH).fill(true),
  focus: null, // {kind: 'row' | 'col', index}
  lines: 0,
  matrix: '0', // the #mx-matrix choice
  mx: null, // what the matrix view shows: {title, digits, vmin, vmax, cell}
};

function $(id) { return document.getElementById(id); }

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function offset(l, h) { return (l * NH + h) * NR * NC; }

// The viridis entry of v on the scale vmin..vmax, as the PNG heatmaps pick it:
// min(floor(t·256), 255), t clamped to [0, 1], 0.5 when the scale is one value.
function colourIndex(v, vmin, vmax) {
  let t = vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5;
  t = t < 0 ? 0 : t > 1 ? 1 : t;
  return Math.min(Math.floor(t * 256), 255);
}

// Smallest and largest finite value.
function finiteRange(values) {
  let lo = Infinity, hi = -Infinity;
  for (let k = 0; k < values.length; k++) {
    const v = values[k];
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo <= hi ? [lo, hi] : [0, 1];
}

// Paints `values` (rows × cols, row-major) into a rows-tall, cols-wide canvas, one pixel per
// value, on the scale vmin..vmax.
function paintPixels(canvas, values, rows, cols, vmin, vmax) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext('2d');
  const img = ctx.createImageData(cols, rows);
  const px = img.data;
  for (let k = 0; k < rows * cols; k++) {
    const rgb = VIRIDIS_RGB[colourIndex(values[k], vmin, vmax)];
    px[4 * k] = rgb[0];
    px[4 * k + 1] = rgb[1];
    px[4 * k + 2] = rgb[2];
    px[4 * k + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

// Fills a layer <select> (shared layer: every view follows it).
function fillLayerSelect(select) {
  select.classList.add('layer-select');
  for (let l = 0; l < NL; l++) {
    const o = el('option', null, 'layer ' + l);
    o.value = String(l);
    select.appendChild(o);
  }
}

const views = {}; // name → {show(), layerChanged()}

function setLayer(l) {
  if (l === state.layer) return;
  state.layer = l;
  document.querySelectorAll('select.layer-select').forEach(function (s) { s.value = String(l); });
  for (const name in views) views[name].layerChanged();
}

function showView(name) {
  state.view = name;
  for (const v of ['head', 'model', 'matrix']) {
    $('view-' + v).hidden = v !== name;
    $('tab-' + v).setAttribute('aria-selected', String(v === name));
  }
  views[name].show();
}
