// Drives the dashboard's view of a job's rank profiles together (`#/job`, reached from
// the profiles list) in a real headless Chromium: every rank's tracks on one timeline,
// named after the rank, the collectives drawn as arrows across the ranks, the ranks'
// table with each one's clock, a collective's span naming its rank, and each
// rank's own profile one click away.
// Usage: node job.mjs BASE_URL RANKS [LATE_RANK] SCREENSHOT_DIR
// Prints one JSON line of measurements; exits non-zero on the first failed check.

import { join } from 'node:path';
import { args, check, inBrowser, waitFor as waitUpTo } from './harness.mjs';

const [base, rankCount, ...rest] = args('node job.mjs BASE_URL RANKS [LATE_RANK] SCREENSHOT_DIR', 3);
const [lateRank, shots] = rest.length > 1 ? rest : [undefined, rest[0]];
const ranks = Number(rankCount);
const measured = {};

// A job's rank profiles take longer to open than one profile.
const waitFor = (page, predicate, arg, what, timeout = 30000) => waitUpTo(page, predicate, arg, what, timeout);

await inBrowser({ width: 1400, height: 1000 }, async (page) => {

  // The list offers the ranks together.
  await page.goto(`${base}/#/profiles`);
  await waitFor(page, () => document.querySelector('#job-link'), null, 'the link to the ranks together');
  const link = await page.$eval('#job-link', (a) => a.textContent);
  check(link.includes(`The ${ranks} rank profiles`), `the link counts the ranks: ${link}`);
  const opened = Date.now();
  await page.click('#job-link');
  await waitFor(page, () => Number(document.querySelector('#pf-canvas')?.dataset.views || 0) >= 1, null, 'the first paint of the job');
  measured.first_paint_ms = Date.now() - opened;
  check(await page.$eval('nav a[data-page="profiles"]', (a) => a.classList.contains('active')), 'the Profiles link is active');

  // The ranks' table: each rank with its host, pid and clock.
  const rows = await page.$$eval('#pf-ranks tr[data-rank]', (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent)));
  check(rows.length === ranks, `a row per rank: ${JSON.stringify(rows)}`);
  check(rows.every((r, k) => r[0] === String(k) && /^\d+$/.test(r[2]) && /^(moved [−+]|its own)/.test(r[3]) && r[5] === `profile_rank_${k}.ntff`), `rank, pid, clock and file: ${JSON.stringify(rows)}`);
  // The straggler, by the live tools' rule, above the most skewed collectives.
  const straggler = await page.$eval('#pf-straggler', (d) => ({ rank: d.dataset.rank, text: d.textContent }));
  if (lateRank !== undefined) {
    check(straggler.rank === lateRank && straggler.text.startsWith(`Straggler: rank ${lateRank} (pid `), `rank ${lateRank} named: ${JSON.stringify(straggler)}`);
    const last = await page.$$eval('table[id^="pf-collectives-"] tbody tr', (trs) => trs.map((tr) => tr.children[5].textContent));
    check(last.length > 0 && last.filter((l) => l === `rank ${lateRank}`).length > last.length / 2, `rank ${lateRank} last in most: ${last}`);
  } else check(straggler.text.startsWith('Nobody is late') || straggler.text.startsWith('Straggler: '), `a diagnosis: ${straggler.text}`);
  measured.straggler = straggler.text.slice(0, 120);
  const head = await page.$eval('#pf-meta', (m) => m.textContent);
  check(head.startsWith(`${ranks} rank profiles on rank 0's clock`) && /[1-9][\d,]* collectives joined/.test(head), `the head: ${head}`);

  // Every rank's tracks, named after it, and arrows joining the collectives.
  const tracks = await page.evaluate(async () => (await (await fetch('/api/job')).json()).tracks.map((t) => t.name));
  for (let k = 0; k < ranks; k++) {
    check(tracks.some((t) => t.startsWith(`r${k} nc`)) && tracks.some((t) => t === `r${k} host`), `rank ${k}'s tracks: ${tracks}`);
  }
  // Zoomed in on the first collectives, each is an arrow across the ranks.
  const whole = await page.evaluate(async () => {
    const meta = await (await fetch('/api/job')).json();
    const view = await (await fetch(`/api/job/view?t0=0&t1=${meta.duration_ns}&columns=1000`)).json();
    return { flows: view.flows.length, left: view.flows_left_out, duration: meta.duration_ns };
  });
  check(whole.flows > 0 || whole.left > 0, `collectives in the whole job: ${JSON.stringify(whole)}`);
  const drawn = await page.$eval('#pf-canvas', (c) => Number(c.dataset.flows));
  // Too many to draw whole: the page says so, and a closer view has them.
  if (whole.left > 0) {
    const range = await page.$eval('#pf-range', (r) => r.textContent);
    check(drawn === 0 && range.includes(`collectives here: zoom in for their arrows`), `too many arrows to draw: ${range}`);
  } else check(drawn === whole.flows, `arrows drawn: ${drawn} of ${whole.flows}`);
  const first = await page.evaluate(async (duration) => {
    for (let t1 = duration; t1 > 1000; t1 = Math.floor(t1 / 8)) {
      const view = await (await fetch(`/api/job/view?t0=0&t1=${t1}&columns=1000`)).json();
      if (view.flows.length) return view.flows[0];
    }
    return null;
  }, whole.duration);
  check(first && first.length === ranks && new Set(first.map((p) => p[0])).size === ranks, `a collective reaches every rank: ${JSON.stringify(first)}`);
  measured.arrows = { whole: whole.flows, left_out: whole.left, drawn };
  await page.screenshot({ path: join(shots, 'job.png'), fullPage: true });

  // A collective's span, asked for as a click on it asks, names its rank.
  const [track, start] = first[0];
  const span = await page.evaluate(async ([track, start]) => {
    const view = await (await fetch(`/api/job/view?t0=${Math.max(0, start - 1000)}&t1=${start + 1000000}&columns=1000`)).json();
    const tv = view.tracks.find((t) => t.track === track && t.mode === 'raw');
    const hit = tv && tv.spans.find((s) => s[0] === start && view.labels[s[2]] === 'cc_running');
    if (!hit) return null;
    return (await fetch(`/api/job/span?track=${track}&index=${hit[4]}`)).json();
  }, [track, start]);
  check(span && span.name === 'cc_running' && Number.isInteger(span.rank) && /^\d+$/.test(String(span.pid)) && span.track.startsWith(`r${span.rank} `), `the collective's span names its rank: ${JSON.stringify(span)}`);
  measured.span = { name: span.name, rank: span.rank, track: span.track };

  // Each rank's own profile opens from the table.
  await page.click('#pf-ranks tr[data-rank="1"] a');
  await waitFor(page, () => Number(document.querySelector('#pf-canvas')?.dataset.views || 0) >= 1 && location.hash.includes('profile_rank_1.ntff'), null, 'rank 1\'s own profile');
  return measured;
});
