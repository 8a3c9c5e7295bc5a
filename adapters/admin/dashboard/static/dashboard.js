// capvend dashboard: polls dashboard.json and swaps in each section the
// server rendered (no chart library: the chart is server-side SVG).
(function () {
  'use strict';
  var every = parseInt(document.body.getAttribute('data-refresh'), 10) || 5000;
  var live = document.getElementById('live');
  var refreshes = 0;
  function done(ok, text) {
    live.textContent = text;
    live.className = ok ? 'ok' : 'bad';
    setTimeout(refresh, every);
  }
  function refresh() {
    fetch('dashboard.json', { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        if (!r.ok) { throw new Error('HTTP ' + r.status); }
        return r.json();
      })
      .then(function (d) {
        Object.keys(d.sections).forEach(function (id) {
          var el = document.getElementById(id);
          if (el) { el.innerHTML = d.sections[id]; }
        });
        refreshes++;
        document.body.setAttribute('data-refreshes', String(refreshes));
        done(true, 'live · refreshed ' + new Date().toISOString().slice(11, 19) + 'Z');
      })
      .catch(function (e) { done(false, 'refresh failed: ' + e.message + ' (retrying)'); });
  }
  setTimeout(refresh, every);
}());
