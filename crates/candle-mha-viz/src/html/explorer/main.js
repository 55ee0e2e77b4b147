// Wiring: tabs, the first render, and the read-only snapshot the tests (and curious users)
// can query.
hv.init();
mv.init();
mx.init();
document.querySelectorAll('#mha-tabs [role=tab]').forEach(function (t) {
  t.addEventListener('click', function () { showView(t.dataset.view); });
});
window.mhaExplorer = {
  state: function () {
    const f = state.focus;
    return {
      view: state.view,
      layer: state.layer,
      layers: NL,
      heads: NH,
      rows: NR,
      cols: NC,
      decimals: D.decimals,
      enabled: state.enabled.slice(),
      focus: f ? f.kind + ' ' + f.index : '',
      lines: state.lines,
      minLineWeight: MIN_LINE_WEIGHT,
      matrix: state.mx && {
        choice: state.matrix,
        title: state.mx.title,
        layer: state.layer,
        cell: state.mx.cell,
        vmin: state.mx.vmin,
        vmax: state.mx.vmax,
        digits: state.mx.digits,
      },
    };
  },
  readyMs: null,
};
showView('head');
// Ready once the first frame is painted (canvas strokes are rasterised then, not when drawn);
// the timer covers a hidden page, which gets no animation frames.
function markReady() {
  if (document.body.dataset.ready === '1') return;
  window.mhaExplorer.readyMs = performance.now();
  document.body.dataset.ready = '1';
}
requestAnimationFrame(function () { setTimeout(markReady, 0); });
setTimeout(markReady, 3000);
