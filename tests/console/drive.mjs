// Drives headless Chromium through the web console for tests/e2e_console.rs: reads one JSON
// command per line on stdin, answers each with one JSON line on stdout ({"ok": true, ...} or
// {"ok": false, "error": "..."}). The Rust test decides what to do and what to check; this
// script only acts and reports. Every request the page makes is kept, to show it reached
// nothing but the proxy.
import { chromium } from 'playwright-core';
import { createInterface } from 'node:readline';

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
// The proxy's serving certificate is from the test's own CA.
const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1400, height: 1000 } });
const page = await context.newPage();
const requests = [];
page.on('request', (r) => requests.push(r.url()));
const consoleErrors = [];
page.on('pageerror', (e) => consoleErrors.push(String(e)));
page.on('console', (m) => {
  if (m.type() === 'error') consoleErrors.push(m.text());
});

const TIMEOUT = 30000;

async function run(cmd) {
  switch (cmd.op) {
    case 'open':
      await page.goto(cmd.url);
      return {};
    case 'fill':
      await page.locator(cmd.selector).fill(cmd.value, { timeout: TIMEOUT });
      return {};
    case 'check':
      await page.locator(cmd.selector).check({ timeout: TIMEOUT });
      return {};
    case 'click':
      await page.locator(cmd.selector).first().click({ timeout: cmd.timeoutMs || TIMEOUT });
      return {};
    case 'waitText': {
      const deadline = Date.now() + (cmd.timeoutMs || TIMEOUT);
      let text = '';
      while (Date.now() < deadline) {
        text = await page.evaluate(
          (s) => [...document.querySelectorAll(s)].map((e) => e.textContent).join('\n'),
          cmd.selector,
        );
        if (text.includes(cmd.text)) return { text };
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error(`${cmd.selector} never showed ${JSON.stringify(cmd.text)}; it shows ${JSON.stringify(text)}`);
    }
    case 'waitGone': {
      await page.locator(cmd.selector).first().waitFor({ state: 'detached', timeout: cmd.timeoutMs || TIMEOUT });
      return {};
    }
    case 'text': {
      const text = await page.evaluate(
        (s) => [...document.querySelectorAll(s)].map((e) => e.textContent).join('\n'),
        cmd.selector,
      );
      return { text };
    }
    case 'screenshot':
      await page.screenshot({ path: cmd.path, fullPage: true });
      return {};
    case 'storage': {
      const stored = await page.evaluate(() => ({
        local: localStorage.length,
        session: sessionStorage.length,
        cookie: document.cookie,
      }));
      return { stored };
    }
    case 'requests':
      return { requests, consoleErrors };
    default:
      throw new Error('no such op ' + cmd.op);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line);
  if (cmd.op === 'close') break;
  let answer;
  try {
    answer = Object.assign({ ok: true }, await run(cmd));
  } catch (e) {
    answer = { ok: false, error: String(e && e.message || e) };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
}
await browser.close();
