// Drives fulcrum's dashboard in headless Chromium against a running fulcrum.
//
//   node dashboard.test.mjs <admin-url> [token]
//
// Without a token: the full tour (three backends, traffic started from the page, packets,
// strategy switches, degrade/recover, kill/revive with health and traffic share, drain,
// spawn/remove, an API error shown). With a token: the page asks for it, refuses a wrong
// one, and works once given the right one. With DASHBOARD_TOUR=pools: a fulcrum with the
// pools web and api (routes → pools → backends, a strategy per pool, kill and spawn in
// one pool while the other carries on; two pools found from files, one of them gone; a TCP
// pool with its connections and bytes). With DASHBOARD_TOUR=fleet: an instance in fleet
// mode, DASHBOARD_FLEET_PEER the admin URL of another one on the same store (the etcd
// pill, the fleet list, a switch made on the page in force on the peer). With
// DASHBOARD_TOUR=lab: the strategy lab started from the page, its progress, its chart and
// table matching GET /admin/lab's report, a bad strategy refused, and Stop.
//
// Environment:
//   FULCRUM_CHROMIUM            browser executable (default /usr/bin/chromium)
//   DASHBOARD_SCREENSHOTS       folder for screenshots (default ../../target/dashboard-screenshots)
//   DASHBOARD_DOWN_WITHIN_MS    how soon a killed backend must show as down (default 6000)
//   DASHBOARD_TOUR              `pools`, `fleet`, `lab` or `certs` for those tours
//   DASHBOARD_FLEET_PEER        the fleet tour's second instance (its admin URL)
//
// Exit status 0 when every check passed.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const [adminArg, token] = process.argv.slice(2);
if (!adminArg) {
  console.error('usage: node dashboard.test.mjs <admin-url> [token]');
  process.exit(2);
}
const ADMIN = adminArg.replace(/\/+$/, '');
const CHROMIUM = process.env.FULCRUM_CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.resolve(process.env.DASHBOARD_SCREENSHOTS || path.join(here, '..', '..', 'target', 'dashboard-screenshots'));
const DOWN_WITHIN_MS = Number(process.env.DASHBOARD_DOWN_WITHIN_MS || 6000);
const HARD_LIMIT_MS = 100_000;

const started = Date.now();
const secs = () => ((Date.now() - started) / 1000).toFixed(1) + ' s';
let passed = 0;
let failed = 0;

if (!fs.existsSync(CHROMIUM)) {
  console.error(`no browser at ${CHROMIUM}: run .ci/browser-setup.sh (or set FULCRUM_CHROMIUM)`);
  process.exit(2);
}
fs.mkdirSync(SHOTS, { recursive: true });

// ------------------------------------------------------------------ helpers

async function api(method, p, body) {
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(ADMIN + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!res.ok) throw new Error(`${method} ${p} -> ${res.status}: ${text}`);
  return data;
}
const status = () => api('GET', '/admin/status');

async function waitFor(what, fn, timeoutMs = 10_000, everyMs = 100) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
    }
    await new Promise(r => setTimeout(r, everyMs));
  }
}

async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok ${passed + failed} - ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s, at ${secs()})`);
  } catch (e) {
    failed++;
    console.log(`not ok ${passed + failed} - ${name} (at ${secs()})`);
    throw e;
  }
}

const attr = (page, sel, name) => page.$eval(sel, (el, n) => el.getAttribute(n), name).catch(() => null);
const text = (page, sel) => page.$eval(sel, el => el.textContent).catch(() => null);

// Console errors, except the ones a step expects (the browser logs every 4xx answer).
const consoleErrors = [];
let allowedConsole = [];
function watchConsole(page) {
  page.on('console', m => {
    if (m.type() !== 'error') return;
    const t = m.text();
    if (allowedConsole.some(re => re.test(t))) return;
    consoleErrors.push(t);
  });
  page.on('pageerror', e => consoleErrors.push('uncaught: ' + e.message));
}
function assertNoConsoleErrors() {
  if (consoleErrors.length) throw new Error('console errors:\n  ' + consoleErrors.join('\n  '));
}

async function shot(page, name) {
  const file = path.join(SHOTS, name);
  await page.evaluate(() => { document.activeElement && document.activeElement.blur && document.activeElement.blur(); window.scrollTo(0, 0); });
  await page.screenshot({ path: file, fullPage: true });
  console.log(`# screenshot ${file}`);
}

/** Sums of `requests` per backend id. */
const counts = st => new Map(st.backends.map(b => [b.id, b.requests]));

// ------------------------------------------------------------------ the tour (no token)

async function tour(page) {
  let ids = [];

  await step('page loads, event stream live, no console error', async () => {
    const res = await page.goto(ADMIN + '/', { waitUntil: 'load' });
    if (!res || res.status() !== 200) throw new Error(`GET / answered ${res && res.status()}`);
    const ct = res.headers()['content-type'] || '';
    if (!ct.startsWith('text/html')) throw new Error(`GET / content-type ${ct}`);
    await waitFor('stream live', async () => (await attr(page, '[data-testid="stream-status"]', 'data-state')) === 'live');
    assertNoConsoleErrors();
  });

  await step('three backends appear as healthy nodes and cards', async () => {
    const st = await status();
    ids = st.backends.map(b => b.id);
    if (ids.length !== 3) throw new Error(`expected 3 backends in /admin/status, got ${ids.length}`);
    for (const id of ids) {
      await waitFor(`node ${id} up`, async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-health')) === 'up');
      await waitFor(`card ${id}`, () => page.$(`[data-testid="backend-card-${id}"]`));
    }
    const nodes = await page.$$('[data-testid^="backend-node-"]');
    if (nodes.length !== 3) throw new Error(`expected 3 nodes, found ${nodes.length}`);
    await waitFor(`select showing ${st.strategy}`, async () => (await attr(page, '[data-testid="strategy-select"]', 'data-current')) === st.strategy);
    if (st.strategy !== 'round_robin') {
      await api('POST', '/admin/strategy', { strategy: 'round_robin' });
      await waitFor('page follows a switch made elsewhere', async () => (await attr(page, '[data-testid="strategy-select"]', 'data-current')) === 'round_robin');
    }
  });

  await step('nodes can be dragged with the mouse or moved with the keyboard, and put back', async () => {
    const sel = `[data-testid="backend-node-${ids[0]}"]`;
    const edge = `[data-testid="edge-${ids[0]}"]`;
    const before = await attr(page, sel, 'transform');
    const edgeBefore = await attr(page, edge, 'd');
    const box = await (await page.$(sel)).boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width / 2 - 150, box.y + box.height / 2 + 30, { steps: 8 });
    await page.mouse.up();
    const dragged = await attr(page, sel, 'transform');
    if (dragged === before) throw new Error(`node did not move: ${before}`);
    if ((await attr(page, edge, 'd')) === edgeBefore) throw new Error('edge did not follow the node');
    await page.focus(sel);
    await page.keyboard.press('ArrowDown');
    if ((await attr(page, sel, 'transform')) === dragged) throw new Error('arrow key did not move the node');
    await page.click('[data-testid="reset-layout"]');
    await waitFor('node back in place', async () => (await attr(page, sel, 'transform')) === before, 3000);
  });

  await step('traffic started from the page moves packets to every backend', async () => {
    await page.fill('[data-testid="traffic-rps"]', '80');
    await page.fill('[data-testid="traffic-seconds"]', '90');
    await page.click('[data-testid="traffic-start"]');
    await waitFor('traffic running in the page', async () => (await attr(page, '[data-testid="traffic-state"]', 'data-running')) === 'true');
    const t = await api('GET', '/admin/traffic');
    if (!t.running || t.rps !== 80) throw new Error(`/admin/traffic: ${JSON.stringify(t)}`);
    await waitFor('a packet on screen', () => page.$('[data-testid="packet"]'));
    // the same packet element is somewhere else a few frames later
    const moved = await page.evaluate(async () => {
      const frames = n => new Promise(r => { const f = () => (--n ? requestAnimationFrame(f) : r()); requestAnimationFrame(f); });
      for (let tries = 0; tries < 20; tries++) {
        const p = document.querySelector('[data-testid="packet"]');
        if (!p) { await frames(2); continue; }
        const a = p.getAttribute('transform');
        await frames(4);
        if (p.isConnected && p.getAttribute('transform') !== a) return true;
      }
      return false;
    });
    if (!moved) throw new Error('packets do not move');
    for (const id of ids) {
      await waitFor(`packets to backend ${id}`, async () => {
        const n = await page.$$eval(`[data-testid="packet"][data-backend="${id}"]`, els => els.length);
        const total = Number((await text(page, `[data-testid="backend-card-${id}"] [data-f="packets"]`) || '0').replace(/,/g, ''));
        return n > 0 || total > 0;
      });
    }
    await waitFor('chart has points', async () => ((await text(page, '[data-testid="chart-now"]')) || '').includes('requests/s'));
  });

  await step('degrade from the page, then switch strategy from the page', async () => {
    const slow = ids[1];
    await page.fill(`[data-testid="backend-degrade-latency-${slow}"]`, '120');
    await page.click(`[data-testid="backend-degrade-${slow}"]`);
    await waitFor('degrade notice', async () => {
      const notes = await page.$$eval('[data-testid="notice"]', els => els.map(e => e.textContent));
      return notes.some(n => n.includes('degraded'));
    });
    await waitFor('slow backend latency visible', async () => {
      const st = await status();
      const b = st.backends.find(x => x.id === slow);
      return b.avg_latency_ms !== null && b.avg_latency_ms > 60;
    }, 10_000);
    await page.waitForTimeout(2500); // some round robin under a slow backend for the chart
    await page.selectOption('[data-testid="strategy-select"]', 'least_connections');
    await waitFor('/admin/status says least_connections', async () => (await status()).strategy === 'least_connections', 5000);
    await waitFor('page shows least_connections', async () => (await attr(page, '[data-testid="strategy-select"]', 'data-current')) === 'least_connections');
    await page.waitForTimeout(3500);
    await waitFor('chart marks the strategies', async () => {
      const labels = await page.$$eval('[data-testid="chart-strategy"]', els => els.map(e => e.dataset.strategy));
      return labels.includes('least_connections');
    }, 5000);
    await shot(page, 'dashboard-strategies.png');
    await page.click(`[data-testid="backend-recover-${slow}"]`);
    await waitFor('recover notice', async () => {
      const notes = await page.$$eval('[data-testid="notice"]', els => els.map(e => e.textContent));
      return notes.some(n => n.includes('recovered'));
    });
    await page.selectOption('[data-testid="strategy-select"]', 'round_robin');
    await waitFor('/admin/status says round_robin', async () => (await status()).strategy === 'round_robin', 5000);
    await page.waitForTimeout(1500);
    await shot(page, 'dashboard-overview.png');
    assertNoConsoleErrors();
  });

  const victim = () => ids[2];
  await step('kill from the page: node goes down in time, its traffic share goes to 0', async () => {
    const id = victim();
    const st = await status();
    const b = st.backends.find(x => x.id === id);
    if (!b.spawned || b.pid === null) throw new Error(`backend ${id} is not a running spawned backend: ${JSON.stringify(b)}`);
    const t0 = Date.now();
    await page.click(`[data-testid="backend-kill-${id}"]`);
    await waitFor(`node ${id} down`, async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-health')) === 'down', DOWN_WITHIN_MS, 50);
    console.log(`# killed backend shown down after ${Date.now() - t0} ms (limit ${DOWN_WITHIN_MS} ms)`);
    const after = (await status()).backends.find(x => x.id === id);
    if (after.pid !== null) throw new Error(`pid still ${after.pid} after kill`);
    // the page's share goes to 0 ...
    await waitFor('page share 0', async () => (await attr(page, `[data-testid="backend-card-${id}"]`, 'data-share')) === '0.0000', 10_000);
    // ... and so does the real one: no request sent to it while the others keep taking traffic
    const c1 = counts(await status());
    await page.waitForTimeout(1500);
    const c2 = counts(await status());
    const own = c2.get(id) - c1.get(id);
    const others = ids.filter(x => x !== id).reduce((a, x) => a + c2.get(x) - c1.get(x), 0);
    if (own !== 0 || others < 20) throw new Error(`in 1.5 s: killed backend got ${own} requests, the others ${others}`);
    const label = await page.$eval(`[data-testid="backend-node-${id}"] text.label`, el => el.textContent);
    if (!label.includes('DOWN')) throw new Error(`node label: ${label}`);
    await shot(page, 'dashboard-failover.png');
  });

  await step('revive from the page: node healthy again and taking traffic', async () => {
    const id = victim();
    await page.click(`[data-testid="backend-revive-${id}"]`);
    await waitFor(`node ${id} up`, async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-health')) === 'up', 10_000, 50);
    await waitFor('page share > 0', async () => Number(await attr(page, `[data-testid="backend-card-${id}"]`, 'data-share')) > 0.1, 10_000);
    const c1 = counts(await status());
    await page.waitForTimeout(1000);
    const c2 = counts(await status());
    if (c2.get(id) - c1.get(id) <= 0) throw new Error('revived backend gets no requests');
    assertNoConsoleErrors();
  });

  await step('drain and maintenance from the page', async () => {
    const id = ids[0];
    await page.click(`[data-testid="backend-state-draining-${id}"]`);
    await waitFor('draining in API', async () => (await api('GET', `/admin/backends/${id}`)).state === 'draining', 5000);
    await waitFor('draining on node', async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-state')) === 'draining');
    await page.click(`[data-testid="backend-state-maintenance-${id}"]`);
    await waitFor('maintenance on node', async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-state')) === 'maintenance');
    await page.click(`[data-testid="backend-state-active-${id}"]`);
    await waitFor('active in API', async () => (await api('GET', `/admin/backends/${id}`)).state === 'active', 5000);
    await waitFor('active on node', async () => (await attr(page, `[data-testid="backend-node-${id}"]`, 'data-state')) === 'active');
  });

  await step('weight edit from the page', async () => {
    const id = ids[0];
    await page.fill(`[data-testid="backend-weight-input-${id}"]`, '3');
    await page.click(`[data-testid="backend-weight-${id}"]`);
    await waitFor('weight 3 in API', async () => (await api('GET', `/admin/backends/${id}`)).weight === 3, 5000);
  });

  await step('stop traffic from the page', async () => {
    await page.click('[data-testid="traffic-stop"]');
    await waitFor('generator stopped', async () => (await api('GET', '/admin/traffic')).running === false, 5000);
    await waitFor('page shows it stopped', async () => (await attr(page, '[data-testid="traffic-state"]', 'data-running')) === 'false');
    assertNoConsoleErrors();
  });

  await step('explain from the page: every candidate, why not, and the choice the API names', async () => {
    const id = ids[1];
    await api('PATCH', `/admin/backends/${id}`, { state: 'draining' });
    const before = (await status()).backends.map(b => b.requests);
    await page.fill('[data-testid="explain-path"]', '/cart?x=1');
    await page.fill('[data-testid="explain-headers"]', 'x-user: ann\naccept: */*');
    await page.click('[data-testid="explain-submit"]');
    await waitFor('an explanation', async () => (await text(page, '[data-testid="explain-why"]')).length > 0, 5000);
    const want = await api('POST', '/admin/explain', { path: '/cart?x=1', headers: { 'x-user': 'ann' } });
    const rows = await page.$$eval('[data-testid="explain-candidate"]', trs => trs.map(tr => ({ chosen: tr.dataset.chosen, cells: [...tr.cells].map(td => td.textContent) })));
    if (rows.length !== want.candidates.length) throw new Error(`${rows.length} rows for ${want.candidates.length} candidates`);
    const drained = rows[want.candidates.findIndex(c => c.id === id)];
    if (drained.cells[1] !== 'no' || drained.cells[2] !== 'draining') throw new Error('the draining one: ' + JSON.stringify(drained));
    const chosen = rows.filter(r => r.chosen === 'true');
    const named = want.candidates.find(c => c.id === want.backend).name;
    if (chosen.length !== 1 || !chosen[0].cells[0].startsWith(named)) throw new Error(`chosen ${JSON.stringify(chosen)}, API ${named}`);
    if (!(await text(page, '[data-testid="explain-why"]')).includes(named)) throw new Error('the sentence does not name ' + named);
    const after = (await status()).backends.map(b => b.requests);
    if (JSON.stringify(before) !== JSON.stringify(after)) throw new Error(`requests moved: ${before} → ${after}`);
    await api('PATCH', `/admin/backends/${id}`, { state: 'active' });
    assertNoConsoleErrors();
  });

  await step('spawn and remove a backend from the page', async () => {
    await page.fill('[data-testid="spawn-name"]', 'from-the-page');
    await page.fill('[data-testid="spawn-latency"]', '5');
    await page.click('[data-testid="spawn-submit"]');
    const added = await waitFor('spawned backend in API', async () => (await status()).backends.find(b => b.name === 'from-the-page'), 10_000);
    await waitFor('its node', () => page.$(`[data-testid="backend-node-${added.id}"]`));
    const rm = `[data-testid="backend-remove-${added.id}"]`;
    await page.click(rm); // arms
    await page.click(rm); // confirms
    await waitFor('gone from API', async () => !(await status()).backends.some(b => b.id === added.id), 5000);
    await waitFor('gone from page', async () => !(await page.$(`[data-testid="backend-node-${added.id}"]`)) && !(await page.$(`[data-testid="backend-card-${added.id}"]`)));
    assertNoConsoleErrors();
  });

  await step('an API error is shown with its message', async () => {
    allowedConsole = [/status of 400/];
    const id = ids[0];
    await page.fill(`[data-testid="backend-weight-input-${id}"]`, '0');
    await page.click(`[data-testid="backend-weight-${id}"]`);
    await waitFor('error message', async () => {
      const errs = await page.$$eval('[data-testid="api-error"]', els => els.map(e => e.textContent));
      return errs.some(e => e.includes('400') && e.includes('invalid weight'));
    }, 5000);
    if ((await api('GET', `/admin/backends/${id}`)).weight !== 3) throw new Error('weight changed by a refused edit');
    assertNoConsoleErrors();
  });
}

// ------------------------------------------------------------------ with a token

async function tokenTour(page) {
  // The first calls are refused (401) until the page has the token: the browser logs them.
  allowedConsole = [/status of 401/];

  await step('the page asks for the token', async () => {
    await page.goto(ADMIN + '/', { waitUntil: 'load' });
    await waitFor('token dialog open', () => page.$('[data-testid="token-dialog"][open]'));
    const input = await page.$('[data-testid="token-input"]');
    if (!(await input.isVisible())) throw new Error('token input not visible');
    const nodes = await page.$$('[data-testid^="backend-node-"]');
    if (nodes.length) throw new Error('backends shown before the token was given');
    await shot(page, 'dashboard-token.png');
  });

  await step('a wrong token is refused and the page asks again', async () => {
    await page.fill('[data-testid="token-input"]', 'not-the-token');
    await page.click('[data-testid="token-submit"]');
    await waitFor('asked again', async () => {
      const open = await page.$('[data-testid="token-dialog"][open]');
      const msg = await text(page, '#token-message');
      return open && /refused/i.test(msg || '');
    }, 5000);
  });

  await step('with the right token the page works', async () => {
    await page.fill('[data-testid="token-input"]', token);
    await page.click('[data-testid="token-submit"]');
    await waitFor('dialog closed', async () => !(await page.$('[data-testid="token-dialog"][open]')));
    await waitFor('stream live', async () => (await attr(page, '[data-testid="stream-status"]', 'data-state')) === 'live');
    const st = await status();
    for (const b of st.backends) {
      await waitFor(`node ${b.id}`, async () => (await attr(page, `[data-testid="backend-node-${b.id}"]`, 'data-health')) === 'up');
    }
    await page.selectOption('[data-testid="strategy-select"]', 'least_connections');
    await waitFor('/admin/status says least_connections', async () => (await status()).strategy === 'least_connections', 5000);
    await page.fill('[data-testid="traffic-rps"]', '40');
    await page.fill('[data-testid="traffic-seconds"]', '3');
    await page.click('[data-testid="traffic-start"]');
    await waitFor('packets through the authenticated stream', () => page.$('[data-testid="packet"]'), 10_000);
    const stored = await page.evaluate(() => sessionStorage.getItem('fulcrum.admin_token'));
    if (stored !== token) throw new Error('token not kept in sessionStorage');
    const cookies = await page.context().cookies();
    if (cookies.length) throw new Error('cookies set: ' + JSON.stringify(cookies));
  });

  await step('a reload keeps the token for the tab and asks nothing', async () => {
    allowedConsole = [];
    await page.reload({ waitUntil: 'load' });
    await waitFor('stream live', async () => (await attr(page, '[data-testid="stream-status"]', 'data-state')) === 'live');
    if (await page.$('[data-testid="token-dialog"][open]')) throw new Error('asked again after reload');
    assertNoConsoleErrors();
  });
}

// ------------------------------------------------------------------ the pools tour

async function fleetTour(page) {
  const peer = (process.env.DASHBOARD_FLEET_PEER || '').replace(/\/+$/, '');
  if (!peer) throw new Error('DASHBOARD_FLEET_PEER is not set');
  const peerGet = async p => (await fetch(peer + p)).json();

  await step('the etcd pill and both instances, this one marked, in step', async () => {
    const res = await page.goto(ADMIN + '/', { waitUntil: 'load' });
    if (!res || res.status() !== 200) throw new Error(`GET / answered ${res && res.status()}`);
    await waitFor('etcd pill live', async () => (await attr(page, '[data-testid="store-status"]', 'data-state')) === 'live');
    const pill = await text(page, '[data-testid="store-status"]');
    if (!/etcd · revision \d+/.test(pill)) throw new Error('pill says ' + pill);
    await waitFor('two members listed', async () => (await page.$$('[data-testid="fleet-member"]')).length === 2);
    const members = await page.$$eval('[data-testid="fleet-member"]', ls => ls.map(l => ({ self: l.dataset.self, step: l.dataset.inStep, text: l.textContent })));
    if (members.filter(m => m.self === 'true').length !== 1) throw new Error('self marked ' + JSON.stringify(members));
    await waitFor('both in step', async () => (await page.$$eval('[data-testid="fleet-member"]', ls => ls.every(l => l.dataset.inStep === 'true'))));
    assertNoConsoleErrors();
  });

  await step('a strategy switched on the page is in force on the other instance', async () => {
    await page.selectOption('[data-testid="strategy-select"]', 'peak_ewma');
    await waitFor('peer switched', async () => (await peerGet('/admin/strategy')).strategy === 'peak_ewma', 5000);
    await waitFor('page shows it', async () => (await attr(page, '[data-testid="strategy-select"]', 'data-current')) === 'peak_ewma', 5000);
    const rev = (await api('GET', '/admin/status')).store.revision;
    await waitFor('pill follows the revision', async () => (await text(page, '[data-testid="store-status"]')).includes(String(rev)), 5000);
    await shot(page, 'dashboard-fleet.png');
    assertNoConsoleErrors();
  });
}

// The certificates tour: a file's certificate and one obtained from pebble (ACME).
async function certsTour(page) {
  await step('the certificates strip names each certificate, its source and expiry', async () => {
    const res = await page.goto(ADMIN + '/', { waitUntil: 'load' });
    if (!res || res.status() !== 200) throw new Error(`GET / answered ${res && res.status()}`);
    await waitFor('two certificates listed', async () => (await page.$$('[data-testid="certificate"]')).length === 2);
    const certs = await page.$$eval('[data-testid="certificate"]', ls => ls.map(l => ({ source: l.dataset.source, text: l.textContent })));
    const file = certs.find(c => c.source === 'file');
    const acme = certs.find(c => c.source === 'acme');
    if (!file || !/file\.test · file · expires \d{4}-\d\d-\d\d/.test(file.text)) throw new Error('file: ' + JSON.stringify(certs));
    if (!acme || !/a\.acme\.test · acme · expires \d{4}-.* · renews \d{4}-/.test(acme.text)) throw new Error('acme: ' + JSON.stringify(certs));
    const listed = await api('GET', '/admin/certificates');
    const shown = listed.find(c => c.source === 'acme').not_after.slice(0, 10);
    if (!acme.text.includes(shown)) throw new Error(`expiry ${shown} not in ${acme.text}`);
    // The protocol mix: one request over HTTP/1.1 and one over HTTP/3 came before the tour.
    await waitFor('the protocol mix shown', async () => (await page.$$('[data-testid="protocol"]')).length === 3);
    const mix = await page.$$eval('[data-testid="protocol"]', ls => Object.fromEntries(ls.map(l => [l.dataset.protocol, { n: Number(l.dataset.requests), text: l.textContent }])));
    if (!(mix.h1.n >= 1 && mix.h3.n >= 1)) throw new Error('protocol mix: ' + JSON.stringify(mix));
    if (!/^h3 · \d+ % · \d+ requests?$/.test(mix.h3.text)) throw new Error('h3 entry: ' + mix.h3.text);
    await shot(page, 'dashboard-certificates.png');
    assertNoConsoleErrors();
  });
}

async function labTour(page) {
  const labState = () => attr(page, '[data-testid="lab-state"]', 'data-state');
  await step('a lab run started on the page shows its progress, then its chart and table', async () => {
    const res = await page.goto(ADMIN + '/', { waitUntil: 'load' });
    if (!res || res.status() !== 200) throw new Error(`GET / answered ${res && res.status()}`);
    await waitFor('lab idle', async () => (await labState()) === 'idle');
    await page.selectOption('[data-testid="lab-scenario"]', 'slow-backend');
    await page.fill('[data-testid="lab-strategies"]', 'round_robin,peak_ewma');
    await page.fill('[data-testid="lab-seconds"]', '2');
    await page.click('[data-testid="lab-start"]');
    await waitFor('lab running', async () => (await labState()) === 'running', 5000);
    await waitFor('progress shown', async () => /^\[[12]\/2\] (round_robin|peak_ewma) · /.test(await text(page, '[data-testid="lab-progress-text"]')), 10_000);
    await waitFor('lab done', async () => (await labState()) === 'done', 60_000, 250);
    const rows = await page.$$eval('[data-testid="lab-row"]', gs => gs.map(g => g.dataset.strategy));
    if (JSON.stringify(rows) !== '["round_robin","peak_ewma"]') throw new Error('chart rows ' + JSON.stringify(rows));
    const drawn = await page.$eval('[data-testid="lab-chart"]', el => el.getBoundingClientRect().height);
    if (!(drawn > 50)) throw new Error(`the chart is ${drawn} px high`);
    const marks = (await page.$$('[data-testid="lab-mark"]')).length;
    if (marks !== 8) throw new Error(`${marks} percentile marks, not 8`);
    const shares = (await page.$$('[data-testid="lab-share"]')).length;
    if (shares !== 6) throw new Error(`${shares} share bars, not 6`);
    const report = (await api('GET', '/admin/lab')).report;
    const ewma = report.results.find(r => r.strategy === 'peak_ewma');
    const cell = await text(page, '[data-testid="lab-table"] tr[data-strategy="peak_ewma"] td[data-col="p99 ms"]');
    if (cell !== ewma.p99_ms.toFixed(2)) throw new Error(`table p99 ${cell}, report ${ewma.p99_ms}`);
    const best = await page.$$eval('[data-testid="lab-table"] td[data-best="true"]', tds => [...new Set(tds.map(td => td.dataset.col))]);
    if (best.length !== 5) throw new Error('columns with a best value: ' + JSON.stringify(best));
    await page.$eval('#lab-panel', el => el.scrollIntoView());
    await shot(page, 'dashboard-lab.png');
    assertNoConsoleErrors();
  });

  await step('a bad strategy is refused naming the valid ones, and Stop stops a run', async () => {
    allowedConsole = [/status of 400/];
    await page.fill('[data-testid="lab-strategies"]', 'fastest');
    await page.click('[data-testid="lab-start"]');
    await waitFor('error shown', async () => (await page.$$eval('[data-testid="api-error"]', els => els.map(e => e.textContent))).some(t => t.includes('valid: all, round_robin')), 5000);
    if ((await labState()) !== 'done') throw new Error('state changed by a refused run: ' + await labState());
    allowedConsole = [];
    await page.fill('[data-testid="lab-strategies"]', 'round_robin');
    await page.fill('[data-testid="lab-seconds"]', '60');
    await page.click('[data-testid="lab-start"]');
    await waitFor('lab running', async () => (await labState()) === 'running', 5000);
    await page.click('[data-testid="lab-stop"]');
    await waitFor('lab stopped', async () => (await labState()) === 'stopped', 10_000);
    if ((await api('GET', '/admin/lab')).state !== 'stopped') throw new Error('the API does not say stopped');
    assertNoConsoleErrors();
  });
}

async function poolsTour(page) {
  const pools = async () => new Map((await api('GET', '/admin/pools')).map(p => [p.name, p]));

  await step('routes, pools and backends in the topology; a row and a strategy per pool', async () => {
    const res = await page.goto(ADMIN + '/', { waitUntil: 'load' });
    if (!res || res.status() !== 200) throw new Error(`GET / answered ${res && res.status()}`);
    await waitFor('stream live', async () => (await attr(page, '[data-testid="stream-status"]', 'data-state')) === 'live');
    for (const name of ['web', 'api']) {
      await waitFor(`pool node ${name}`, () => page.$(`[data-testid="pool-node-${name}"]`));
      await waitFor(`route edge ${name}`, () => page.$(`[data-testid="route-edge-${name}"]`));
      await waitFor(`pool row ${name}`, () => page.$(`[data-testid="pool-row-${name}"]`));
    }
    await waitFor('api routes shown', async () => /\/api/.test((await text(page, '[data-testid="pool-routes-api"]')) || ''));
    const ps = await pools();
    for (const [name, p] of ps) {
      for (const b of p.backends) {
        await waitFor(`node ${b.id} up`, async () => (await attr(page, `[data-testid="backend-node-${b.id}"]`, 'data-health')) === 'up');
        const pool = await attr(page, `[data-testid="backend-card-${b.id}"]`, 'data-pool');
        if (pool !== name) throw new Error(`card ${b.id} says pool ${pool}, not ${name}`);
      }
    }
    assertNoConsoleErrors();
  });

  await step('each pool says where its backends come from; a discovery error is shown', async () => {
    await waitFor('disc from its file', async () => /^backends: file \S*disc\.json · updated /.test((await text(page, '[data-testid="pool-source-disc"]')) || ''), 5000);
    if ((await attr(page, '[data-testid="pool-source-disc"]', 'data-state')) !== 'ok') throw new Error('disc shows an error');
    await waitFor('lost shows its error', async () => (await attr(page, '[data-testid="pool-source-lost"]', 'data-state')) === 'error', 5000);
    const lost = await text(page, '[data-testid="pool-source-lost"]');
    if (!/error: cannot read .*gone\.json/.test(lost)) throw new Error('lost shows: ' + lost);
    const web = await text(page, '[data-testid="pool-source-web"]');
    if (web !== 'backends: listed') throw new Error('web shows: ' + web);
    // A TCP pool: its connections and bytes where an HTTP pool has its routes, and TCP on
    // its node (docs/tcp.md).
    const tcp = /^tcp: 2 connections · 0\.2 MiB in · 0\.2 MiB out$/;
    await waitFor('db connections and bytes', async () => tcp.test((await text(page, '[data-testid="pool-routes-db"]')) || ''), 5000);
    const db = await text(page, '[data-testid="pool-node-db"]');
    if (!/TCP · RR · 1 backends/.test(db)) throw new Error('db node shows: ' + db);
    // A route's policies beside it, with its rate limit's count (docs/policies.md).
    const routes = await text(page, '[data-testid="pool-routes-disc"]');
    if (!/\[rate 1000\/1s \+10 by client_ip · 0 limited; compress br, gzip\]/.test(routes)) throw new Error('disc routes: ' + routes);
    // Its access steps, with what they did: the key set's failed fetches (nothing listens
    // on port 9), the auth service's outcomes.
    const lostRoutes = await text(page, '[data-testid="pool-routes-lost"]');
    const access = /deny 1 range; jwt \(http:\/\/127\.0\.0\.1:9\/jwks\.json\) · 0 refused · 0 keys · [1-9]\d* fetches failed; forward auth \(http:\/\/127\.0\.0\.1:9\/check\) · 0 allowed, 0 refused, 0 unavailable/;
    if (!access.test(lostRoutes)) throw new Error('lost routes: ' + lostRoutes);
  });

  await step('a split route: a slider per side sets its weight live', async () => {
    await waitFor('split row', () => page.$('[data-testid="split-2"]'), 5000);
    await waitFor('api side', async () => /^api 10 · \d+ taken$/.test((await text(page, '[data-testid="split-side-2-api"]')) || ''), 5000);
    const routes = await text(page, '[data-testid="pool-routes-api"]');
    if (!/#2 \/split \[split web 90 · api 10; mirror api 100% compared\]/.test(routes)) throw new Error('api routes: ' + routes);
    await page.$eval('[data-testid="split-weight-2-api"]', el => { el.value = '500'; el.dispatchEvent(new Event('change')); });
    await waitFor('weight set', async () => (await api('GET', '/admin/routes'))[2].split[1].weight === 500, 5000);
    const r = await api('GET', '/admin/routes');
    if (r[2].split[0].weight !== 90) throw new Error('the web side changed: ' + JSON.stringify(r[2].split));
    await waitFor('its label follows', async () => /^api 500 · /.test((await text(page, '[data-testid="split-side-2-api"]')) || ''), 5000);
    assertNoConsoleErrors();
  });

  await step('a mirrored route: its verdict, what its copies came to, both latency distributions', async () => {
    await waitFor('mirror row', () => page.$('[data-testid="mirror-2"]'), 5000);
    if ((await attr(page, '[data-testid="mirror-verdict-2"]', 'data-verdict')) !== 'insufficient') throw new Error('a verdict before any traffic');
    await page.fill('[data-testid="traffic-rps"]', '60');
    await page.fill('[data-testid="traffic-seconds"]', '3');
    await page.fill('[data-testid="traffic-path"]', '/split/m');
    await page.click('[data-testid="traffic-start"]');
    const drawn = async side => Number((await attr(page, '[data-testid="mirror-chart-2"]', 'data-' + side)) || 0);
    await waitFor('100 answers compared and drawn', async () => (await drawn('primary')) >= 100 && (await drawn('mirror')) >= 100, 15_000);
    const figures = await api('GET', '/admin/routes/2/mirror');
    await waitFor('the verdict shown', async () => (await attr(page, '[data-testid="mirror-verdict-2"]', 'data-verdict')) !== 'insufficient', 5000);
    const verdict = await attr(page, '[data-testid="mirror-verdict-2"]', 'data-verdict');
    if (!['same', 'differs', 'slower'].includes(verdict)) throw new Error('verdict ' + verdict);
    if (figures.compared < 100) throw new Error('compared ' + figures.compared);
    const bars = await page.$$('[data-testid="mirror-chart-2"] rect[data-side="mirror"]');
    if (!bars.length) throw new Error('no bar for the mirror');
    if (!/\d+ mirrored · \d+ skipped · \d+ errors · \d+ compared/.test((await text(page, '[data-testid="mirror-counts-2"]')) || '')) throw new Error('counts');
    await shot(page, 'dashboard-mirror.png');
    assertNoConsoleErrors();
  });

  await step('a strategy switch in one pool leaves the other and the header alone', async () => {
    await page.selectOption('[data-testid="pool-strategy-api"]', 'least_connections');
    await waitFor('api switched', async () => (await pools()).get('api').strategy === 'least_connections', 5000);
    const ps = await pools();
    if (ps.get('web').strategy !== 'round_robin') throw new Error('web changed: ' + ps.get('web').strategy);
    await waitFor('pool node shows it', async () => (await attr(page, '[data-testid="pool-node-api"]', 'data-strategy')) === 'least_connections', 5000);
    const header = await attr(page, '[data-testid="strategy-select"]', 'data-current');
    if (header !== 'round_robin') throw new Error('the header (first pool) shows ' + header);
  });

  await step('traffic to /api travels through its pool to its backends', async () => {
    const api1 = (await pools()).get('api').backends[0].id;
    await page.fill('[data-testid="traffic-rps"]', '60');
    await page.fill('[data-testid="traffic-seconds"]', '20');
    await page.fill('[data-testid="traffic-path"]', '/api/items');
    await page.click('[data-testid="traffic-start"]');
    await waitFor('a packet to the api backend', () => page.$(`[data-testid="packet"][data-backend="${api1}"]`), 10_000, 20);
    await shot(page, 'dashboard-pools.png');
  });

  await step('killing a backend of api: it goes down, web stays up', async () => {
    const ps = await pools();
    const victim = ps.get('api').backends[0].id;
    await page.click(`[data-testid="backend-kill-${victim}"]`);
    await waitFor('victim down', async () => (await attr(page, `[data-testid="backend-node-${victim}"]`, 'data-health')) === 'down', DOWN_WITHIN_MS);
    for (const b of ps.get('web').backends) {
      const h = await attr(page, `[data-testid="backend-node-${b.id}"]`, 'data-health');
      if (h !== 'up') throw new Error(`web backend ${b.id} is ${h}`);
    }
    await page.click(`[data-testid="backend-revive-${victim}"]`);
    await waitFor('victim up again', async () => (await attr(page, `[data-testid="backend-node-${victim}"]`, 'data-health')) === 'up', 10_000);
    await page.click('[data-testid="traffic-stop"]');
  });

  await step('spawn into a chosen pool from the page', async () => {
    await page.fill('[data-testid="spawn-name"]', 'api-extra');
    await page.selectOption('[data-testid="spawn-pool"]', 'api');
    await page.click('[data-testid="spawn-submit"]');
    const b = await waitFor('api-extra in api', async () => (await pools()).get('api').backends.find(x => x.name === 'api-extra'), 10_000);
    await waitFor('its card', async () => (await attr(page, `[data-testid="backend-card-${b.id}"]`, 'data-pool')) === 'api');
    assertNoConsoleErrors();
  });

  await step('a pool at its limits queues, and the page shows the queue', async () => {
    const ids = (await pools()).get('api').backends.map(b => b.id);
    for (const id of ids) {
      await api('PATCH', `/admin/backends/${id}`, { max_conns: 1 });
      await api('POST', `/admin/backends/${id}/degrade`, { latency_ms: 400 });
    }
    await page.fill('[data-testid="traffic-rps"]', '40');
    await page.fill('[data-testid="traffic-seconds"]', '6');
    await page.fill('[data-testid="traffic-path"]', '/api/slow');
    await page.click('[data-testid="traffic-start"]');
    await waitFor('api row shows queued', async () => / queued/.test((await text(page, '[data-testid="pool-row-api"]')) || ''), 8000, 50);
    await waitFor('a card counts its queued requests', async () => {
      for (const id of ids) if (Number(await text(page, `[data-testid="backend-queued-${id}"]`)) > 0) return true;
      return false;
    }, 8000, 50);
    if (/ queued/.test((await text(page, '[data-testid="pool-row-web"]')) || '')) throw new Error('web shows a queue');
    await page.click('[data-testid="traffic-stop"]');
    for (const id of ids) {
      await api('POST', `/admin/backends/${id}/recover`);
      await api('PATCH', `/admin/backends/${id}`, { max_conns: 0 });
    }
    await waitFor('queue drained', async () => !/ queued/.test((await text(page, '[data-testid="pool-row-api"]')) || ''), 10_000);
    assertNoConsoleErrors();
  });
}

// ------------------------------------------------------------------ main

const hardLimit = setTimeout(() => {
  console.error(`browser test still running after ${HARD_LIMIT_MS / 1000} s: giving up`);
  process.exit(1);
}, HARD_LIMIT_MS);

let browser;
let page;
let code = 0;
try {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-renderer-backgrounding', '--disable-background-timer-throttling',
    ],
  });
  const context = await browser.newContext({ viewport: { width: 1440, height: 1000 }, colorScheme: 'dark' });
  page = await context.newPage();
  page.setDefaultTimeout(15_000);
  watchConsole(page);
  const named = ['pools', 'fleet', 'lab', 'certs'].includes(process.env.DASHBOARD_TOUR) ? process.env.DASHBOARD_TOUR : 'tour';
  const which = token ? 'token' : named;
  console.log(`# ${which} against ${ADMIN} with Chromium ${browser.version()}`);
  if (which === 'token') await tokenTour(page);
  else if (which === 'pools') await poolsTour(page);
  else if (which === 'fleet') await fleetTour(page);
  else if (which === 'lab') await labTour(page);
  else if (which === 'certs') await certsTour(page);
  else await tour(page);
} catch (e) {
  code = 1;
  console.error(`FAILED: ${e && e.stack ? e.stack : e}`);
  if (consoleErrors.length) console.error('console errors:\n  ' + consoleErrors.join('\n  '));
  if (page) await shot(page, `failure-${token ? 'token' : process.env.DASHBOARD_TOUR || 'tour'}.png`).catch(() => {});
} finally {
  if (browser) await browser.close().catch(() => {});
  clearTimeout(hardLimit);
}
console.log(`${passed} passed, ${failed} failed (${secs()})`);
process.exit(code);
