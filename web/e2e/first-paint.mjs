// Opens a profile in a fresh headless Chromium and reports, as one JSON line, how long
// the page took from the start of the navigation to its first drawn timeline (by the
// page's clock), and how long each of a few
// zoom steps took: in the page, from the wheel event to the view drawn for it (answer),
// the fetch alone, and as the driver saw it (wall, with its own round trips).
// Usage: node first-paint.mjs BASE_URL PROFILE
import { chromium } from 'playwright-core';

const [base, profile] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  const page = await (await browser.newContext({ viewport: { width: 1600, height: 1000 } })).newPage();
  const started = Date.now();
  await page.goto(`${base}/#/profile/${encodeURIComponent(profile)}`);
  // Waits on a DOM observer, not by polling, so that the driver takes no CPU meanwhile.
  await page.waitForSelector('#pf-canvas[data-first-paint-ms]', { state: 'attached', timeout: 60000 });
  const firstPaint = Date.now() - started;
  const box = await (await page.$('#pf-canvas')).boundingBox();
  const zooms = [];
  for (let k = 0; k < 10; k++) {
    const views = await page.$eval('#pf-canvas', (e) => Number(e.dataset.views));
    const t = Date.now();
    await page.mouse.move(box.x + 300 + k * 40, box.y + 50);
    await page.mouse.wheel(0, k < 7 ? -300 : 300);
    await page.waitForFunction((v) => Number(document.querySelector('#pf-canvas').dataset.views) > v, views, { timeout: 10000, polling: 5 });
    const answer = await page.$eval('#pf-canvas', (e) => [Number(e.dataset.lastAnswerMs), Number(e.dataset.lastViewMs)]);
    zooms.push({ wall_ms: Date.now() - t, answer_ms: answer[0], fetch_ms: answer[1] });
  }
  const since = await page.$eval('#pf-canvas', (e) => [Number(e.dataset.sinceNavigationMs), Number(e.dataset.firstPaintMs)]);
  // first_paint_ms: from the navigation's start to the drawn timeline, as the page's own
  // clock measures it; driver_ms: the same as the driver saw it, with its own delays.
  console.log(JSON.stringify({ first_paint_ms: since[0], script_to_paint_ms: since[1], driver_ms: firstPaint, zooms }));
} finally {
  await browser.close();
}
