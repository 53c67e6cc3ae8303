// What the browser checks share: their arguments and screenshot directory, a check that
// fails with a message, waiting for the page with what it shows when the wait fails,
// and a headless Chromium (the system's, through playwright-core) on one page whose
// script errors fail the run. A script prints one JSON line of measurements and exits
// non-zero on the first failed check.

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';

// The script's arguments, `names` long at least (the last the screenshot directory,
// made if missing); else the usage, and exit 2.
export function args(usage, count) {
  const given = process.argv.slice(2);
  if (given.length < count || given.slice(0, count).some((a) => !a)) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  mkdirSync(given[given.length - 1], { recursive: true });
  return given;
}

export function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

// Waits for `predicate` in the page; on a timeout, fails naming `what`, with the text
// the page shows.
export async function waitFor(page, predicate, arg, what, timeout = 20000) {
  try {
    await page.waitForFunction(predicate, arg, { timeout, polling: 100 });
  } catch (e) {
    const text = await page.$eval('#main', (m) => m.innerText).catch(() => '');
    throw new Error(`${what} did not happen within ${timeout} ms; the page: ${text.slice(0, 1500)}`);
  }
}

// Runs `body(page)` on a fresh page of `viewport`, prints the measurements it returns,
// and fails on any script error the page logged.
export async function inBrowser(viewport, body) {
  const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
  try {
    const page = await (await browser.newContext({ viewport })).newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    const measured = await body(page);
    check(errors.length === 0, `no script errors: ${errors.join(' | ')}`);
    console.log(JSON.stringify(measured));
  } finally {
    await browser.close();
  }
}
