// The page's router: #/live, #/timeline, #/execution/ID (the timeline, paused on that
// execution: where Grafana's exemplars link), #/ranks, #/profiles, #/profile/NAME, #/job
// (the directory's rank profiles together), #/compare/A/B.

import { livePage } from './live.js';
import { timelinePage } from './timeline.js';
import { ranksPage } from './ranks.js';
import { profilesPage, profilePage, comparePage } from './profile.js';

let current = null;

function route() {
  if (current && current.stop) current.stop();
  const main = document.getElementById('main');
  main.replaceChildren();
  document.getElementById('status').textContent = '';
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'live';
  for (const a of document.querySelectorAll('nav a')) {
    const active = a.dataset.page === page || (a.dataset.page === 'profiles' && (page === 'profile' || page === 'job' || page === 'compare'))
      || (a.dataset.page === 'timeline' && page === 'execution');
    a.classList.toggle('active', active);
  }
  if (page === 'timeline') current = timelinePage(main);
  else if (page === 'execution' && parts[1]) current = timelinePage(main, parts[1]);
  else if (page === 'ranks') current = ranksPage(main);
  else if (page === 'profiles') current = profilesPage(main);
  else if (page === 'profile' && parts[1]) current = profilePage(main, parts[1]);
  else if (page === 'job') current = profilePage(main, 'job', '/api/job');
  else if (page === 'compare' && parts[1] && parts[2]) current = comparePage(main, parts[1], parts[2]);
  else current = livePage(main);
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', () => {
  // A token given in the address is kept by the server in a cookie: take it out of
  // the address bar.
  if (new URLSearchParams(location.search).has('token')) history.replaceState(null, '', `/${location.hash}`);
  route();
});
