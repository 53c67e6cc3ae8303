// Drives the dashboard in a real headless Chromium (the system's, through
// playwright-core) where a metric's exemplar leads: #/execution/ID opens the live
// timeline paused on that execution, with its fields shown; an id the rings no longer
// hold is said gone, with how far back they reach.
// Usage: node execution.mjs BASE_URL PID EXEC_ID SCREENSHOT_DIR
// Prints one JSON line of measurements; exits non-zero on the first failed check.

import { join } from 'node:path';
import { args, check, inBrowser } from './harness.mjs';

const [base, pid, execId, shots] = args('node execution.mjs BASE_URL PID EXEC_ID SCREENSHOT_DIR', 4);
const measured = {};

await inBrowser({ width: 1400, height: 900 }, async (page) => {

  // An execution the rings hold, named as an exemplar's link names it (PID:ID).
  await page.goto(`${base}/#/execution/${pid}:${execId}`);
  await page.waitForFunction(() => ['found', 'gone', 'error'].includes(document.querySelector('#tl-focus')?.dataset.state), null, { timeout: 20000 });
  const banner = await page.$eval('#tl-focus', (e) => ({ state: e.dataset.state, text: e.textContent }));
  check(banner.state === 'found', `execution ${execId} is found: ${banner.text}`);
  check(banner.text.includes(`Execution ${execId}: mlp on neuron-bench (pid ${pid})`) && banner.text.includes('Paused on it'), banner.text);
  check(await page.$eval('#tl-pause', (b) => b.textContent) === 'Resume', 'the timeline is paused on it');
  const fields = await page.$$eval('#tl-details table.fields tr', (rows) => Object.fromEntries(rows.map((r) => [r.querySelector('th').textContent, r.querySelector('td').textContent])));
  check(fields.execution === execId && fields.event === 'nrt_execute', `its fields are shown: ${JSON.stringify(fields)}`);
  check(await page.$eval('nav a.active', (a) => a.dataset.page) === 'timeline', 'the timeline tab is active');
  await page.waitForTimeout(500);
  const rows = JSON.parse(await page.$eval('#tl-canvas', (c) => c.dataset.rows || '[]'));
  check(rows.some((r) => r.lane === 'runtime' && r.spans > 0), `its spans are drawn: ${JSON.stringify(rows)}`);
  measured.found = { banner: banner.text, fields };
  await page.screenshot({ path: join(shots, 'execution.png'), fullPage: true });

  // An id the rings do not hold.
  await page.goto(`${base}/#/execution/1000000000000`);
  await page.waitForFunction(() => ['found', 'gone', 'error'].includes(document.querySelector('#tl-focus')?.dataset.state), null, { timeout: 20000 });
  const gone = await page.$eval('#tl-focus', (e) => ({ state: e.dataset.state, text: e.textContent }));
  check(gone.state === 'gone' && gone.text.includes('is no longer in the rings') && /holds events from [0-9.]+ s ago on/.test(gone.text), `said gone: ${gone.text}`);
  measured.gone = gone.text;
  await page.screenshot({ path: join(shots, 'execution-gone.png'), fullPage: true });
  return measured;
});
