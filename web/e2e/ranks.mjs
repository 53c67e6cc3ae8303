// Drives the dashboard's Ranks page in a real headless Chromium (the system's, through
// playwright-core) while a job of four ranks runs, rank 2 of them made late, and checks
// what a person would look at: the communicator with every rank, the straggler named on
// top, a heat map of ranks × collectives coloured by lateness whose cells give their
// figures on hover, and the ranks' table.
// Usage: node ranks.mjs BASE_URL SCREENSHOT_DIR
// Prints one JSON line of measurements; exits non-zero on the first failed check.

import { join } from 'node:path';
import { args, check, inBrowser } from './harness.mjs';

const [base, shots] = args('node ranks.mjs BASE_URL SCREENSHOT_DIR', 2);
const measured = {};

await inBrowser({ width: 1400, height: 900 }, async (page) => {

  await page.goto(`${base}/#/ranks`);
  check(await page.$eval('nav a[data-page="ranks"]', (a) => a.classList.contains('active')), 'the Ranks link is active');
  try {
    await page.waitForFunction(() => document.querySelector('.diagnosis[data-kind="straggler"]'), null, { timeout: 30000, polling: 100 });
  } catch (e) {
    const text = await page.$eval('#main', (m) => m.innerText);
    throw new Error(`no straggler named within 30 s; the page: ${text.slice(0, 2000)}`);
  }
  const straggler = await page.$eval('.diagnosis[data-kind="straggler"]', (d) => ({ rank: d.dataset.rank, text: d.textContent }));
  check(straggler.rank === '2' && /^Straggler: rank 2 \(pid \d+ on host .+\) arrived last in \d+ of \d+ steps/.test(straggler.text), `rank 2 named: ${straggler.text}`);
  // Names the tools quote in backticks show as code, not as backticks.
  const shown = await page.$eval('.communicator', (c) => c.innerText);
  check(!shown.includes('`'), `no raw backticks on the page: ${shown.slice(0, 600)}`);
  const rows = await page.$$eval('.communicator table.heat-map tr[data-rank]', (trs) => trs.map((tr) => ({
    rank: tr.dataset.rank,
    cells: tr.querySelectorAll('td.heat').length,
    last: tr.querySelectorAll('td.heat.last').length,
    // The collectives every rank reached (the latest may still wait for rank 2).
    complete: [...tr.querySelectorAll('td.heat')].filter((td) => td.dataset.complete === 'true').length,
    coloured: [...tr.querySelectorAll('td.heat')].filter((td) => td.dataset.complete === 'true' && td.style.background).length,
  })));
  check(rows.length === 4, `a heat-map row per rank: ${JSON.stringify(rows)}`);
  check(rows.every((r) => r.cells >= 5 && r.cells === rows[0].cells), `a cell per collective: ${JSON.stringify(rows)}`);
  check(rows.every((r) => r.complete >= r.cells - 2 && r.coloured === r.complete), `every cell of a complete collective coloured: ${JSON.stringify(rows)}`);
  const last = Object.fromEntries(rows.map((r) => [r.rank, r.last]));
  check(last['2'] > last['0'] + last['1'] + last['3'], `rank 2 framed last most: ${JSON.stringify(last)}`);
  // Rank 2's cell is the darkest of its column in most complete collectives (one
  // collective may see another rank held up by a loaded host).
  const shade = await page.$$eval('.communicator table.heat-map tr[data-rank]', (trs) => trs.map((tr) =>
    [...tr.querySelectorAll('td.heat')].filter((td) => td.dataset.complete === 'true').map((td) => Number(td.dataset.lateness || 0))));
  const columns = Math.min(...shade.map((r) => r.length));
  const darkest = [...Array(columns).keys()].filter((c) => shade[2][c] > 0 && shade[2][c] === Math.max(...shade.map((r) => r[c]))).length;
  check(columns > 0 && darkest > columns / 2, `rank 2 the latest in most complete collectives: ${darkest} of ${columns}: ${JSON.stringify(shade)}`);

  // Hovering a cell gives its figures.
  // (The page is redrawn at each update; the figures stay under the mouse. The map
  // moves on as collectives complete, so on a loaded host the cell under the mouse may
  // by then be the latest collective, which rank 2 has not reached: hover again, a
  // bounded number of times.)
  let tip = '';
  for (let attempt = 0; attempt < 5 && !/arrived .+ after the first/.test(tip); attempt++) {
    await page.mouse.move(5, 5);
    await page.hover('.communicator table.heat-map tr[data-rank="2"] td.heat[data-complete="true"]');
    await page.waitForTimeout(600);
    await page.waitForFunction(() => !document.querySelector('.heat-tip').hidden, null, { timeout: 5000 });
    tip = await page.$eval('.heat-tip', (t) => t.innerText);
  }
  check(/^rank 2 \(pid \d+/.test(tip) && /all-reduce #\d+/.test(tip) && /arrived .+ after the first/.test(tip) && /skew/.test(tip), `the hover says the figures: ${tip}`);
  await page.screenshot({ path: join(shots, 'ranks-hover.png') });
  await page.mouse.move(5, 5);

  const members = await page.$$eval('.communicator table.members tr[data-rank]', (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent)));
  check(members.length === 4 && members.every((m) => /^\d+$/.test(m[2]) && /^#\d+/.test(m[7])), `every rank's pid and last completed: ${JSON.stringify(members)}`);
  check(await page.$eval('.communicator table.members tr[data-rank="2"]', (tr) => tr.classList.contains('warn')), 'the straggler\'s row stands out');
  await page.screenshot({ path: join(shots, 'ranks.png'), fullPage: true });
  measured.ranks = { straggler: straggler.text, rows, tip };
  return measured;
});
