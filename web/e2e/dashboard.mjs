// Drives the dashboard in a real headless Chromium (the system's, through
// playwright-core) and checks what a person would look at:
//   the live page shows the running workload's cores, with values that change;
//   the live timeline receives events, has rows per engine and DMA queue, fills every
//   busy core's row and each of its engine and DMA queue rows within 2 s of opening,
//   labels its axis with round ticks, searches, pauses, and shows an event's fields on
//   a click;
//   a profile opens, paints its timeline, zooms (wheel and button), shows its summary
//   and sortable tables, and offers its Perfetto trace;
//   two profiles compare per HLO instruction.
// Usage: node dashboard.mjs BASE_URL PROFILE_A PROFILE_B SCREENSHOT_DIR
// Prints one JSON line of measurements; exits non-zero on the first failed check.

import { join } from 'node:path';
import { args, check, inBrowser, waitFor } from './harness.mjs';

const [base, profileA, profileB, shots] = args('node dashboard.mjs BASE_URL PROFILE_A PROFILE_B SCREENSHOT_DIR', 4);
const measured = {};

await inBrowser({ width: 1400, height: 1000 }, async (page) => {

  // The live page.
  await page.goto(`${base}/#/live`);
  await waitFor(page, () => document.querySelectorAll('.runtime tr[data-core] td.util').length > 0, null, 'a core row on the live page');
  const cells = () => page.$$eval('.runtime tr[data-core]', (rows) => rows.map((r) => [r.dataset.core, r.querySelector('td.util').textContent, r.querySelector('td.flops').textContent, r.querySelector('td.execs').textContent]));
  await waitFor(page, () => [...document.querySelectorAll('.runtime td.util')].some((c) => c.textContent !== 'N/A'), null, 'a measured utilisation');
  const before = await cells();
  await page.waitForTimeout(2500);
  const after = await cells();
  check(before.length >= 1, 'cores are listed');
  check(after.some((row) => row[1] !== 'N/A' && parseFloat(row[1]) > 0), `a core is busy: ${JSON.stringify(after)}`);
  check(JSON.stringify(before) !== JSON.stringify(after), `values change: ${JSON.stringify(before)} then ${JSON.stringify(after)}`);
  const updates = await page.$eval('#live-updates', (e) => Number(e.dataset.count));
  check(updates >= 5, `updates arrive (${updates})`);
  measured.live = { cores: after.length, updates, before, after };
  // The process's resident memory and the runtime's own allocations, each named.
  const cardSummary = await page.$eval('.runtime .summary', (e) => e.textContent);
  check(/resident memory [0-9.]+ [KMG]iB/.test(cardSummary) && /runtime host allocations /.test(cardSummary), `the card names its memory: ${cardSummary}`);
  // Per-model figures: the demo runs two models on each core, each with its own latency.
  await waitFor(page, () => [...document.querySelectorAll('.runtime tr.model td.p50')].filter((c) => c.textContent !== 'N/A').length >= 2, null, 'per-model latency');
  const perModel = await page.$$eval('.runtime tr.model', (rows) => rows.map((r) => [r.dataset.model, r.querySelector('td.execs').textContent, r.querySelector('td.p50').textContent]));
  check(new Set(perModel.filter((m) => m[2] !== 'N/A').map((m) => m[0])).size >= 2, `two models have their own latency: ${JSON.stringify(perModel)}`);
  measured.live.models = perModel;
  // Charts: round ticks (1, 2 or 5 steps, powers of two for bytes, decades on a log
  // scale), and a tooltip with the time and every series' value.
  const charts = await page.$$eval('.chart canvas', (cs) => cs.map((c) => ({ ticks: JSON.parse(c.dataset.ticks || '[]'), scale: c.dataset.scale })));
  check(charts.length >= 4, `charts are drawn: ${charts.length}`);
  const round = (v) => v === 0 || [1, 2, 5].some((m) => Math.abs(Math.log10(v / m) - Math.round(Math.log10(v / m))) < 1e-9) || Math.abs(Math.log2(v) - Math.round(Math.log2(v))) < 1e-9;
  for (const c of charts) {
    check(c.ticks.length >= 2, `a chart has ticks: ${JSON.stringify(c)}`);
    const step = c.scale === 'log' ? null : c.ticks[1] - c.ticks[0];
    check(c.scale === 'log' ? c.ticks.every((t, i) => i === 0 || Math.abs(t / c.ticks[i - 1] - 10) < 1e-6) : round(step) && c.ticks.every((t) => Math.abs(t / step - Math.round(t / step)) < 1e-6),
      `round ticks: ${JSON.stringify(c)}`);
  }
  const first = await (await page.$('.chart canvas')).boundingBox();
  await page.mouse.move(first.x + first.width * 0.9, first.y + first.height / 2);
  const tooltip = await page.$eval('.chart canvas', (c) => c.dataset.tooltip || '');
  check(/s ago/.test(tooltip) && tooltip.split('\n').length >= 2, `the tooltip has the time and the values: ${tooltip}`);
  measured.live.charts = charts.map((c) => c.scale);
  await page.screenshot({ path: join(shots, 'live.png'), fullPage: true });

  // The live timeline. The demo keeps two cores busy; within 2 s of opening (the page
  // that connects gets the last minute first), every core's row and each of its engine
  // and DMA queue rows that any core uses hold spans.
  const timelineOpened = Date.now();
  await page.goto(`${base}/#/timeline`);
  // Weights move at load only, which may be longer ago than the default 10 s window:
  // their row is checked over the last minute.
  const everyRowFilled = (skip) => {
    const rows = JSON.parse(document.querySelector('#tl-canvas')?.dataset.rows || '[]');
    const busy = rows.filter((r) => r.lane === 'runtime' && r.fraction > 0.5).map((r) => r.core);
    const lanes = new Set(rows.map((r) => r.lane).filter((l) => l !== skip));
    if (busy.length < 2 || !lanes.has('PE') || ![...lanes].some((l) => l.startsWith('DMA'))) return false;
    return busy.every((core) => [...lanes].every((lane) => rows.some((r) => r.core === core && r.lane === lane && r.spans > 0)));
  };
  await waitFor(page, () => Number(document.querySelector('#tl-counts')?.dataset.received || 0) > 20, null, 'events on the live timeline');
  for (const [window, skip, within] of [['10', 'DMA weights', 2000], ['60', null, 500]]) {
    const from = Date.now();
    await page.selectOption('#tl-window', window);
    try {
      await page.waitForFunction(everyRowFilled, skip, { timeout: Math.max(100, within - (Date.now() - (window === '10' ? timelineOpened : from))), polling: 50 });
    } catch (e) {
      const rows = await page.$eval('#tl-canvas', (c) => c.dataset.rows);
      throw new Error(`check failed: two busy cores, each with spans on every engine and DMA queue row (last ${window} s) within ${within} ms: ${rows}`);
    }
  }
  measured.timeline_filled_ms = Date.now() - timelineOpened;
  await page.selectOption('#tl-window', '10');
  await page.waitForTimeout(1500);
  const tlRows = JSON.parse(await page.$eval('#tl-canvas', (c) => c.dataset.rows));
  const lanes = new Set(tlRows.map((r) => r.lane));
  check(lanes.has('runtime') && lanes.has('PE') && [...lanes].some((l) => l.startsWith('DMA')), `rows per core, engine and DMA queue: ${[...lanes]}`);
  for (const core of tlRows.filter((r) => r.lane === 'runtime' && r.fraction > 0.5)) {
    for (const lane of [...lanes].filter((l) => l !== 'DMA weights')) {
      const row = tlRows.find((r) => r.core === core.core && r.lane === lane);
      check(row && row.spans > 0, `nc${core.core}'s ${lane} row holds spans: ${JSON.stringify(tlRows)}`);
    }
  }
  const ticks = JSON.parse(await page.$eval('#tl-canvas', (c) => c.dataset.ticks));
  const step = ticks[0];
  check(ticks.length >= 3 && [1, 2, 5].some((m) => Math.abs(Math.log10(step / m) - Math.round(Math.log10(step / m))) < 1e-9)
    && ticks.every((t, i) => Math.abs(t - step * (i + 1)) < 1e-6), `round ticks: ${ticks}`);
  await page.fill('#tl-search', 'nc_exec_running');
  await waitFor(page, () => Number(document.querySelector('#tl-canvas').dataset.matches) > 0, null, 'search matches');
  await page.fill('#tl-search', '');
  await page.click('#tl-pause');
  const received = await page.$eval('#tl-counts', (e) => Number(e.dataset.received));
  const canvas = await page.$('#tl-canvas');
  const box = await canvas.boundingBox();
  let found = null;
  // Rows start 20 px down; the labels take the first 190 px. Try across the first rows.
  for (let y = 26; y < 200 && !found; y += 9) {
    for (let x = box.width - 4; x > 200 && !found; x -= 4) {
      await page.mouse.click(box.x + x, box.y + y);
      found = await page.$eval('#tl-details', (d) => (d.querySelector('table.fields') ? d.textContent : null));
    }
  }
  check(found, 'a click on an event shows its details');
  const fields = await page.$$eval('#tl-details table.fields th', (ths) => ths.map((t) => t.textContent));
  check(['event', 'where', 'duration', 'started'].every((f) => fields.includes(f)), `the details are a table of fields: ${fields}`);
  measured.timeline = { received, details: found.slice(0, 120) };
  await page.screenshot({ path: join(shots, 'timeline.png'), fullPage: true });

  // A profile.
  const opened = Date.now();
  await page.goto(`${base}/#/profile/${encodeURIComponent(profileA)}`);
  await waitFor(page, () => Number(document.querySelector('#pf-canvas')?.dataset.views || 0) >= 1, null, 'the first paint of the profile');
  measured.profile = { first_paint_ms: Date.now() - opened };
  await waitFor(page, () => (document.querySelector('#pf-summary-text')?.textContent || '').includes('executions:'), null, 'the summary');
  const summaryText = await page.$eval('#pf-summary-text', (e) => e.textContent);
  check(/engines \(device time/.test(summaryText), 'the summary lists the engines');
  check(/per core, defined: /.test(summaryText), 'the summary states the defined peak');
  const engineRows = await page.$$eval('#pf-engines tbody tr', (rows) => rows.length);
  check(engineRows > 0, 'the engines table has rows');
  const bounds = await page.$$eval('#pf-bounds table.fields th', (ths) => ths.map((t) => t.textContent));
  check(['pipeline', 'compute', 'memory'].every((b) => bounds.includes(b)), `the bounds are shown: ${bounds}`);
  const findings = await page.$$eval('#pf-findings li', (lis) => lis.map((l) => l.textContent));
  check(findings.length >= 1 && findings.every((f) => f.includes('evidence:')), `findings with their evidence: ${JSON.stringify(findings)}`);
  measured.profile.findings = findings.map((f) => f.slice(0, 100));
  // The roofline places the instructions; its points lead to the timeline.
  await waitFor(page, () => Number(document.querySelector('#pf-roofline')?.dataset.points || 0) > 0, null, 'points on the roofline');
  const topHlo = await page.$eval('#pf-hlo tbody tr td', (td) => td.textContent);
  const located = await page.request.get(`${base}/api/profiles/${encodeURIComponent(profileA)}/hlo?name=${encodeURIComponent(topHlo)}`);
  check(located.ok(), `the roofline jump finds ${topHlo}: ${located.status()}`);
  const at = await located.json();
  check(at.end_ns >= at.start_ns && Number.isInteger(at.track), `a span to show: ${JSON.stringify(at)}`);
  const missing = await page.request.get(`${base}/api/profiles/${encodeURIComponent(profileA)}/hlo?name=no.such.instruction`);
  check(missing.status() === 404, `an unknown instruction is not found: ${missing.status()}`);
  const range0 = await page.$eval('#pf-range', (e) => e.textContent);
  const views0 = await page.$eval('#pf-canvas', (e) => Number(e.dataset.views));
  const pf = await (await page.$('#pf-canvas')).boundingBox();
  await page.mouse.move(pf.x + pf.width * 0.4, pf.y + 40);
  for (let k = 0; k < 4; k++) await page.mouse.wheel(0, -400);
  await waitFor(page, (v) => Number(document.querySelector('#pf-canvas').dataset.views) > v, views0, 'a view after zooming');
  const range1 = await page.$eval('#pf-range', (e) => e.textContent);
  check(range1 !== range0, `zooming changes the range (${range0} -> ${range1})`);
  const views1 = await page.$eval('#pf-canvas', (e) => Number(e.dataset.views));
  await page.click('#pf-zoom-in');
  await waitFor(page, (v) => Number(document.querySelector('#pf-canvas').dataset.views) > v, views1, 'a view after the zoom button');
  measured.profile.view_ms = await page.$eval('#pf-canvas', (e) => Number(e.dataset.lastViewMs));
  const pfTicks = JSON.parse(await page.$eval('#pf-canvas', (c) => c.dataset.ticks));
  const pfStep = pfTicks[1] - pfTicks[0];
  check(pfTicks.length >= 2 && [1, 2, 5].some((m) => Math.abs(Math.log10(pfStep / m) - Math.round(Math.log10(pfStep / m))) < 1e-6), `round ticks on the profile: ${pfTicks}`);
  // Zoomed in, a click on a span shows its fields as a table, with its execution.
  await page.click('#pf-zoom-in');
  await page.click('#pf-zoom-in');
  await page.waitForTimeout(500);
  let spanFields = null;
  const pfBox = await (await page.$('#pf-canvas')).boundingBox();
  for (let y = 26; y < Math.min(pfBox.height, 400) && !spanFields; y += 8) {
    for (let x = 160; x < pfBox.width - 4 && !spanFields; x += 6) {
      await page.mouse.click(pfBox.x + x, pfBox.y + y);
      spanFields = await page.$eval('#pf-details', (d) => (d.querySelector('table.fields') ? [...d.querySelectorAll('th')].map((t) => t.textContent) : null));
    }
  }
  check(spanFields && ['name', 'track', 'start', 'duration'].every((f) => spanFields.includes(f)), `a span's details are a table: ${spanFields}`);
  measured.profile.span_fields = spanFields;
  // Searching for the clicked span's name finds it (and its like) in the view.
  const clicked = await page.$eval('#pf-details table.fields td', (td) => td.textContent);
  await page.fill('#pf-search', clicked);
  await waitFor(page, () => Number(document.querySelector('#pf-canvas').dataset.matches) > 0, null, `search matches for ${clicked}`);
  await page.fill('#pf-search', 'no span has this name');
  await waitFor(page, () => Number(document.querySelector('#pf-canvas').dataset.matches) === 0, null, 'no match for a made-up name');
  await page.fill('#pf-search', '');
  measured.profile.ranges = [range0, range1, await page.$eval('#pf-range', (e) => e.textContent)];
  const opcodeRows = await page.$$eval('#pf-opcodes tbody tr', (rows) => rows.length);
  const hloRows = await page.$$eval('#pf-hlo tbody tr', (rows) => rows.length);
  check(opcodeRows > 0 && hloRows > 0, `tables have rows (${opcodeRows} opcodes, ${hloRows} HLO instructions)`);
  const firstHlo = () => page.$eval('#pf-hlo tbody tr td', (td) => td.textContent);
  const top = await firstHlo();
  await page.click('#pf-hlo th[data-key="hlo"]');
  const sorted = await page.$$eval('#pf-hlo tbody tr td:first-child', (tds) => tds.map((t) => t.textContent));
  check(JSON.stringify(sorted) === JSON.stringify([...sorted].sort((a, b) => a.localeCompare(b))), 'sorting by name orders the rows');
  measured.profile.tables = { opcodes: opcodeRows, hlo: hloRows, top_hlo: top };
  await page.screenshot({ path: join(shots, 'profile.png'), fullPage: true });
  const href = await page.$eval('#pf-perfetto', (a) => a.href);
  const download = await page.request.get(href);
  check(download.ok(), `the Perfetto link answers ${download.status()}`);
  const body = await download.body();
  check(body.length > 100, `the Perfetto trace has bytes (${body.length})`);
  measured.profile.perfetto_bytes = body.length;

  // Two profiles compared.
  await page.goto(`${base}/#/compare/${encodeURIComponent(profileA)}/${encodeURIComponent(profileB)}`);
  await waitFor(page, () => document.querySelectorAll('#cmp-table tbody tr').length > 0, null, 'the comparison table');
  measured.compare = { rows: await page.$$eval('#cmp-table tbody tr', (r) => r.length) };
  // Each side says how many executions it has, and what counts as noise.
  const noiseNote = await page.$eval('#cmp-noise', (e) => e.textContent);
  check(/noise/.test(noiseNote), `the comparison says what is noise: ${noiseNote}`);
  const figures = await page.$$eval('.figures', (fs) => fs.map((f) => f.textContent).join(' '));
  check(/executions recorded/.test(figures), `executions per side: ${figures}`);
  const boundRows = await page.$$eval('#cmp-bounds tbody tr', (rows) => rows.map((r) => [...r.querySelectorAll('td')].map((t) => t.textContent)));
  check(boundRows.length === 7 && boundRows.some((r) => r[0].startsWith('device') && r[3] !== 'N/A'), `bounds side by side: ${JSON.stringify(boundRows)}`);
  const changes = await page.$$eval('#cmp-findings li', (lis) => lis.map((l) => l.textContent));
  check(changes.length >= 1 && changes.every((c) => /^(went away|appeared|in both): /.test(c)), `findings compared: ${JSON.stringify(changes)}`);
  measured.compare.findings = changes.map((c) => c.slice(0, 80));
  await page.screenshot({ path: join(shots, 'compare.png'), fullPage: true });

  // The profiles list.
  await page.goto(`${base}/#/profiles`);
  await waitFor(page, () => document.querySelectorAll('a.profile-link').length >= 2, null, 'the list of profiles');

  return measured;
});
