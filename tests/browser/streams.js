// What a browser dashboard does with the Kubernetes streaming endpoints, through kube-ws-proxy.
// A browser cannot set `Authorization` on a WebSocket, so the token travels as the
// `base64url.bearer.authorization.k8s.io.<token>` subprotocol entry (PROTOCOL.md §1.2).
//
// Query string: proxy=<host:port>, token=<bearer token>,
// scenario=<v5-exec|base64-exec|log|idle-exec|h2-sessions>, idle=<ms> (idle-exec),
// tls=1 (wss:// to a TLS proxy; h2-sessions needs it).
// The outcome is POSTed as JSON to /result: {scenario, ok: true, result} or {scenario, ok:
// false, error}.
'use strict';

const params = new URLSearchParams(location.search);
const proxy = params.get('proxy');
const token = params.get('token');
const scenario = params.get('scenario');
const TIMEOUT_MS = 30000;
const wsScheme = params.get('tls') === '1' ? 'wss' : 'ws';
const utf8 = new TextEncoder();
const text = new TextDecoder();

function log(line) {
  document.getElementById('log').textContent += line + '\n';
}

/** The bearer subprotocol entry: the token's UTF-8 bytes as base64url without padding. */
function bearerEntry(tok) {
  let binary = '';
  for (const b of utf8.encode(tok)) binary += String.fromCharCode(b);
  const b64url = btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  return 'base64url.bearer.authorization.k8s.io.' + b64url;
}

/** Standard (padded) base64 of bytes, as the base64 channel protocols carry them. */
function toBase64(bytes) {
  let binary = '';
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

function fromBase64(s) {
  const binary = atob(s);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

function execUrl(command) {
  const q = new URLSearchParams();
  for (const part of command) q.append('command', part);
  for (const s of ['stdin', 'stdout', 'stderr']) q.append(s, 'true');
  return `${wsScheme}://${proxy}/api/v1/namespaces/default/pods/web/exec?${q}`;
}

/**
 * Opens a WebSocket and records every message. `opened` resolves on open (rejects if it closes
 * first); `closed` resolves with the close event.
 */
function session(url, protocols) {
  const ws = new WebSocket(url, protocols);
  ws.binaryType = 'arraybuffer';
  const messages = [];
  ws.onmessage = (ev) => {
    messages.push(typeof ev.data === 'string' ? ev.data : new Uint8Array(ev.data));
  };
  const closed = new Promise((resolve) => {
    ws.onclose = (ev) => resolve({ code: ev.code, reason: ev.reason, wasClean: ev.wasClean });
  });
  const opened = new Promise((resolve, reject) => {
    ws.onopen = () => resolve();
    closed.then((c) => reject(new Error(`closed before open (code ${c.code})`)));
  });
  return { ws, messages, opened, closed };
}

/** kubectl's reading of a v4/v5 Status: Success is 0, NonZeroExitCode carries the code. */
function exitCodeOf(status) {
  if (status.status === 'Success') return 0;
  const cause = ((status.details || {}).causes || []).find((c) => c.reason === 'ExitCode');
  return status.reason === 'NonZeroExitCode' && cause ? Number(cause.message) : null;
}

/** Binary v5 exec: stdin, then the CLOSE signal for stdin; stdout, stderr and the Status. */
async function v5Exec() {
  const s = session(execUrl(['sh', '-c', 'cat; echo to-stderr >&2; exit 3']), [
    bearerEntry(token),
    'v5.channel.k8s.io',
  ]);
  await s.opened;
  s.ws.send(concat([Uint8Array.of(0), utf8.encode('hello from the browser\n')]));
  s.ws.send(Uint8Array.of(255, 0));
  const close = await s.closed;
  const byChannel = { 1: [], 2: [], 3: [] };
  for (const m of s.messages) {
    if (typeof m === 'string') throw new Error('text message on a v5 session');
    if (m.length > 0 && byChannel[m[0]]) byChannel[m[0]].push(m.subarray(1));
  }
  const status = JSON.parse(text.decode(concat(byChannel[3])));
  return {
    protocol: s.ws.protocol,
    firstMessage: Array.from(s.messages[0] || []),
    stdout: text.decode(concat(byChannel[1])),
    stderr: text.decode(concat(byChannel[2])),
    status,
    exitCode: exitCodeOf(status),
    close,
  };
}

/** Text exec with base64.channel.k8s.io: '0'..'4' then base64; the status is text on failure. */
async function base64Exec() {
  const s = session(
    execUrl(['sh', '-c', 'read l; echo got:$l; echo to-stderr >&2; exit 3']),
    [bearerEntry(token), 'base64.channel.k8s.io'],
  );
  await s.opened;
  s.ws.send('0' + toBase64(utf8.encode('hello from the browser\n')));
  const close = await s.closed;
  const byChannel = { 1: [], 2: [], 3: [] };
  for (const m of s.messages) {
    if (typeof m !== 'string') throw new Error('binary message on a base64 session');
    const channel = m.charCodeAt(0) - '0'.charCodeAt(0);
    if (byChannel[channel]) byChannel[channel].push(fromBase64(m.slice(1)));
  }
  return {
    protocol: s.ws.protocol,
    firstMessage: s.messages[0],
    stdout: text.decode(concat(byChannel[1])),
    stderr: text.decode(concat(byChannel[2])),
    status: text.decode(concat(byChannel[3])),
    close,
  };
}

/** A followed log over base64.binary.k8s.io: read until 12 lines are in, then close. */
async function followLog() {
  const want = 12;
  const url = `${wsScheme}://${proxy}/api/v1/namespaces/default/pods/web/log?follow=true`;
  const s = session(url, [bearerEntry(token), 'base64.binary.k8s.io']);
  await s.opened;
  let logText = '';
  let binaryMessages = 0;
  await new Promise((resolve, reject) => {
    const take = (m) => {
      if (typeof m !== 'string') {
        binaryMessages++;
        return;
      }
      logText += text.decode(fromBase64(m));
      if (logText.split('\n').length > want) resolve();
    };
    s.messages.splice(0).forEach(take);
    s.ws.onmessage = (ev) => take(ev.data);
    s.closed.then((c) => reject(new Error(`log ended early (code ${c.code}): ${logText}`)));
  });
  s.ws.close(1000, 'enough');
  const close = await s.closed;
  return {
    protocol: s.ws.protocol,
    lines: logText.split('\n').slice(0, want),
    binaryMessages,
    close,
  };
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `done` every 50 ms; false if it is still not true after `ms`. */
async function waitUntil(done, ms) {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
  return true;
}

/**
 * v5 exec of `cat` that sits idle (query `idle`, ms) between two lines of stdin: a line, its
 * echo, silence, another line, the CLOSE signal. Reports whether the session was still open
 * after the silence and what came back, rather than failing, so that the test can also show
 * a session that did not survive.
 */
async function idleExec() {
  const idleMs = Number(params.get('idle') || '10000');
  const s = session(execUrl(['cat']), [bearerEntry(token), 'v5.channel.k8s.io']);
  await s.opened;
  const start = Date.now();
  let closedAfterMs = null;
  s.closed.then(() => {
    closedAfterMs = Date.now() - start;
  });
  const channel = (n) =>
    concat(s.messages.filter((m) => typeof m !== 'string' && m[0] === n).map((m) => m.subarray(1)));
  s.ws.send(concat([Uint8Array.of(0), utf8.encode('before the silence\n')]));
  const echoed = await waitUntil(
    () => text.decode(channel(1)).includes('before the silence\n') || closedAfterMs !== null,
    10000,
  );
  if (!echoed) throw new Error('the first line never came back');
  await sleep(idleMs);
  const openAfterIdle = s.ws.readyState === WebSocket.OPEN;
  if (openAfterIdle) {
    s.ws.send(concat([Uint8Array.of(0), utf8.encode('after the silence\n')]));
    s.ws.send(Uint8Array.of(255, 0));
  }
  const close = await Promise.race([s.closed, sleep(10000).then(() => null)]);
  const statusBytes = channel(3);
  return {
    protocol: s.ws.protocol,
    openAfterIdle,
    closedAfterMs,
    stdout: text.decode(channel(1)),
    status: statusBytes.length > 0 ? JSON.parse(text.decode(statusBytes)) : null,
    close,
  };
}

/** One v5 exec of `sh -c 'cat; echo err<n> >&2; exit <n+2>'`: stdin, CLOSE, everything back. */
async function numberedExec(n) {
  const s = session(execUrl(['sh', '-c', `cat; echo err${n} >&2; exit ${n + 2}`]), [
    bearerEntry(token),
    'v5.channel.k8s.io',
  ]);
  await s.opened;
  s.ws.send(concat([Uint8Array.of(0), utf8.encode(`hello ${n}\n`)]));
  s.ws.send(Uint8Array.of(255, 0));
  const close = await s.closed;
  const byChannel = { 1: [], 2: [], 3: [] };
  for (const m of s.messages) {
    if (typeof m === 'string') throw new Error('text message on a v5 session');
    if (m.length > 0 && byChannel[m[0]]) byChannel[m[0]].push(m.subarray(1));
  }
  const status = JSON.parse(text.decode(concat(byChannel[3])));
  return {
    protocol: s.ws.protocol,
    stdout: text.decode(concat(byChannel[1])),
    stderr: text.decode(concat(byChannel[2])),
    exitCode: exitCodeOf(status),
    close,
  };
}

/**
 * Several v5 execs and a followed log at once. Chromium opens a WebSocket as a stream of an
 * HTTP/2 connection it already has to the origin (when that connection's SETTINGS allow
 * extended CONNECT), so a plain request goes first to open one.
 */
async function h2Sessions() {
  await fetch(`https://${proxy}/version`, { mode: 'no-cors', credentials: 'include' }).catch(
    () => {},
  );
  const [execs, logResult] = await Promise.all([
    Promise.all([0, 1, 2].map(numberedExec)),
    followLog(),
  ]);
  return { execs, log: logResult };
}

const scenarios = {
  'v5-exec': v5Exec,
  'base64-exec': base64Exec,
  log: followLog,
  'idle-exec': idleExec,
  'h2-sessions': h2Sessions,
};

async function report(body) {
  log(JSON.stringify(body));
  await fetch('/result', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
}

async function main() {
  const run = scenarios[scenario];
  if (!run) throw new Error(`unknown scenario ${scenario}`);
  const timeout = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`no result after ${TIMEOUT_MS} ms`)), TIMEOUT_MS),
  );
  return Promise.race([run(), timeout]);
}

main().then(
  (result) => report({ scenario, ok: true, result }),
  (err) => report({ scenario, ok: false, error: String((err && err.stack) || err) }),
);
