// Browser Back/Forward inside the timeline: the URL holds the window (t0, t1); a history entry
// that differs from the current view only in its window becomes a zoom of the plot (the
// timeline callbacks then fetch that window), any other change reloads the page at that URL.
(function () {
  function params(search) {
    const q = new URLSearchParams(search);
    const rest = {};
    for (const [k, v] of q.entries()) { if (k !== 't0' && k !== 't1') rest[k] = v; }
    return {t0: q.get('t0'), t1: q.get('t1'), rest: JSON.stringify(rest)};
  }
  window.addEventListener('popstate', function (e) {
    if (window.location.pathname !== '/timeline' || typeof window.__tracelab_tl_query !== 'string') return;
    const host = document.getElementById('timeline-graph');
    const gd = host && (host.classList.contains('js-plotly-plot') ? host : host.querySelector('.js-plotly-plot'));
    if (!gd || !window.Plotly) return;
    const now = params('?' + window.__tracelab_tl_query);
    const want = params(window.location.search);
    e.stopImmediatePropagation();
    if (now.rest !== want.rest) { window.location.reload(); return; }
    window.__tracelab_tl_popping = true;
    if (want.t0 !== null && want.t1 !== null) {
      window.Plotly.relayout(gd, {'xaxis.range[0]': Number(want.t0), 'xaxis.range[1]': Number(want.t1)});
    } else {
      window.Plotly.relayout(gd, {'xaxis.autorange': true});
    }
  }, true);
})();
