// The kube-ws-proxy web console. Every call goes to the proxy's sessions API with the
// signed-in person's own credentials (a bearer token held in this script's memory only, or the
// browser's client certificate), so the cluster's RBAC decides what they see and do. Text from
// sessions is only ever set as text (never as HTML): a command line is the user's to choose.
'use strict';

(() => {
  const CONSOLE_PATH = '/kube-ws-proxy/console/';
  // Under a fleet's /clusters/NAME prefix, the console is that cluster's.
  const at = location.pathname.indexOf(CONSOLE_PATH);
  const API = (at > 0 ? location.pathname.slice(0, at) : '') + '/apis/kube-ws-proxy.io/v1';
  const POLL_MS = 2000;
  const RETRY_MS = 5000;

  const $ = (id) => document.getElementById(id);

  // What the page holds, in memory only.
  let token = null; // null: the browser's client certificate
  let namespace = '';
  let liveAbort = null;
  let pollTimer = null;
  let viewerAbort = null;
  let terminal = null;
  let player = null;
  let toTerminate = null;
  const live = new Map(); // "namespace/name" -> Session
  const ended = new Map(); // recorded sessions that ended while the page listed them

  // ---- Calls ----

  async function call(path, options = {}) {
    const headers = Object.assign({}, options.headers);
    if (token !== null) headers.Authorization = 'Bearer ' + token;
    const resp = await fetch(API + path, {
      method: options.method || 'GET',
      headers,
      body: options.body,
      signal: options.signal,
      credentials: 'same-origin',
      cache: 'no-store',
    });
    if (!resp.ok) throw await failure(resp);
    return resp;
  }

  // The error a refused call reports: its Kubernetes Status message where it has one.
  async function failure(resp) {
    let message = resp.status + ' ' + resp.statusText;
    try {
      const status = JSON.parse(await resp.text());
      if (status && status.message) message = status.message + ' (' + resp.status + ')';
    } catch (_) {
      // Not a Status: the code says enough.
    }
    return new Error(message);
  }

  const sessionsPath = (ns) =>
    ns ? '/namespaces/' + encodeURIComponent(ns) + '/sessions' : '/sessions';
  const sessionPath = (ns, name) =>
    '/namespaces/' + encodeURIComponent(ns) + '/sessions/' + encodeURIComponent(name);
  const keyOf = (s) => s.metadata.namespace + '/' + s.metadata.name;
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // Calls onLine with each line of a streamed body (a watch's events, a recording's events).
  async function eachLine(resp, onLine) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let pending = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl);
        pending = pending.slice(nl + 1);
        if (line.trim()) onLine(line);
      }
    }
    pending += decoder.decode();
    if (pending.trim()) onLine(pending);
  }

  // ---- Messages ----

  function showError(err) {
    if (err && err.name === 'AbortError') return;
    $('error').textContent = String((err && err.message) || err);
    $('error').hidden = false;
  }

  function clearError() {
    $('error').hidden = true;
    $('error').textContent = '';
  }

  const setState = (id, text) => {
    $(id).textContent = text;
  };

  // ---- Signing in ----

  async function signIn(withToken) {
    clearError();
    const given = $('token').value.trim();
    if (withToken && !given) {
      showError('Enter a token, or sign in with your client certificate.');
      return;
    }
    token = withToken ? given : null;
    namespace = $('namespace').value.trim();
    $('token').value = '';
    try {
      // Proves the credentials and the right to list before anything is shown.
      await call(sessionsPath(namespace));
    } catch (err) {
      token = null;
      showError(err);
      return;
    }
    $('sign-in').hidden = true;
    $('signed-in').hidden = false;
    $('sign-out').hidden = false;
    $('who').textContent =
      'Signed in with ' + (withToken ? 'a token' : 'your client certificate') +
      (namespace ? ', namespace ' + namespace : ', all namespaces');
    $('replay-namespace').value = namespace;
    startLive();
  }

  function signOut() {
    stopLive();
    closeViewer();
    closeReplay();
    token = null;
    live.clear();
    ended.clear();
    render();
    clearError();
    $('who').textContent = '';
    $('sign-out').hidden = true;
    $('signed-in').hidden = true;
    $('sign-in').hidden = false;
  }

  // ---- The live sessions ----

  function startLive() {
    stopLive();
    if ($('all-replicas').checked) poll();
    else watchLive();
  }

  function stopLive() {
    if (liveAbort) liveAbort.abort();
    liveAbort = null;
    clearTimeout(pollTimer);
    pollTimer = null;
  }

  // This replica's sessions, by watch: it starts with every live one as ADDED, then changes.
  async function watchLive() {
    const abort = new AbortController();
    liveAbort = abort;
    while (!abort.signal.aborted) {
      try {
        const resp = await call(sessionsPath(namespace) + '?watch=true', { signal: abort.signal });
        live.clear();
        render();
        setState('live-state', 'watching');
        await eachLine(resp, (line) => onEvent(JSON.parse(line)));
        setState('live-state', 'reconnecting');
      } catch (err) {
        if (abort.signal.aborted) return;
        showError(err);
        setState('live-state', 'retrying');
        await sleep(RETRY_MS);
      }
    }
  }

  function onEvent(event) {
    const s = event.object;
    if (event.type === 'ERROR') {
      showError((s && s.message) || 'the watch failed');
      return;
    }
    if (!s || !s.metadata) return;
    if (event.type === 'DELETED') {
      live.delete(keyOf(s));
      if (s.status && s.status.recorded) ended.set(keyOf(s), s);
    } else {
      live.set(keyOf(s), s);
    }
    render();
  }

  // Every replica's sessions (the proxy asks its peers), listed every POLL_MS.
  async function poll() {
    const abort = new AbortController();
    liveAbort = abort;
    try {
      const resp = await call(sessionsPath(namespace) + '?allReplicas=true', { signal: abort.signal });
      const warning = resp.headers.get('Warning');
      const list = await resp.json();
      const now = new Map(list.items.map((s) => [keyOf(s), s]));
      for (const [key, s] of live) {
        if (!now.has(key) && s.status.recorded) ended.set(key, s);
      }
      live.clear();
      for (const [key, s] of now) live.set(key, s);
      render();
      setState('live-state', warning ? 'every replica, but: ' + warning : 'every replica');
    } catch (err) {
      if (abort.signal.aborted) return;
      showError(err);
    }
    if (!abort.signal.aborted) pollTimer = setTimeout(poll, POLL_MS);
  }

  // ---- Rendering ----

  function render() {
    const sessions = [...live.values()].sort((a, b) => a.status.started.localeCompare(b.status.started));
    $('live-rows').replaceChildren(...sessions.map(row));
    $('live-empty').hidden = sessions.length > 0;
    $('ended-rows').replaceChildren(...[...ended.values()].map(endedRow));
  }

  function row(s) {
    const spec = s.spec;
    const status = s.status;
    const tr = document.createElement('tr');
    tr.dataset.session = s.metadata.name;
    tr.dataset.namespace = s.metadata.namespace;
    if (status.terminatedBy) tr.className = 'ending';
    const cells = [
      s.metadata.name,
      s.metadata.namespace,
      spec.pod + (spec.container ? '/' + spec.container : ''),
      spec.user || '(not known)',
      describe(spec),
      spec.protocolPath + (spec.protocol ? ' (' + spec.protocol + ')' : ''),
      new Date(status.started).toLocaleTimeString(),
      traffic(status),
      status.idleSeconds === undefined ? '' : status.idleSeconds + ' s',
      status.replica,
    ];
    for (const [i, text] of cells.entries()) {
      const td = document.createElement('td');
      td.textContent = text;
      if (i === 4) td.className = 'command';
      tr.appendChild(td);
    }
    const actions = document.createElement('td');
    if (status.recorded) actions.appendChild(button('Watch', 'watch', () => follow(s)));
    if (status.terminatedBy) {
      actions.appendChild(document.createTextNode('terminated by ' + status.terminatedBy));
    } else {
      actions.appendChild(button('Terminate', 'terminate danger', () => askTerminate(s)));
    }
    tr.appendChild(actions);
    return tr;
  }

  function endedRow(s) {
    const li = document.createElement('li');
    li.dataset.session = s.metadata.name;
    li.dataset.namespace = s.metadata.namespace;
    li.appendChild(document.createTextNode(
      keyOf(s) + ' — ' + (s.spec.user || '(not known)') + ': ' + describe(s.spec) + ' '));
    li.appendChild(button('Replay', 'replay', () => replay(s.metadata.namespace, s.metadata.name)));
    return li;
  }

  function describe(spec) {
    if (spec.ports && spec.ports.length) return spec.verb + ' ' + spec.ports.join(',');
    return spec.verb + ' ' + (spec.command || []).join(' ');
  }

  function traffic(status) {
    if (status.bytesFromClient === undefined) return '';
    return '↑ ' + bytes(status.bytesFromClient) + ' ↓ ' + bytes(status.bytesToClient);
  }

  function bytes(n) {
    if (n < 1024) return n + ' B';
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + ' KiB';
    return (n / 1024 / 1024).toFixed(1) + ' MiB';
  }

  function button(label, className, onClick) {
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = label;
    b.className = className;
    b.addEventListener('click', onClick);
    return b;
  }

  // ---- Watching a session's terminal as it happens (its followed recording) ----

  async function follow(s) {
    closeViewer();
    const abort = new AbortController();
    viewerAbort = abort;
    $('viewer').hidden = false;
    $('viewer-title').textContent = keyOf(s);
    setState('viewer-state', 'connecting');
    try {
      const resp = await call(sessionPath(s.metadata.namespace, s.metadata.name) + '/recording?follow=true', {
        signal: abort.signal,
      });
      setState('viewer-state', 'live');
      let header = true;
      await eachLine(resp, (line) => {
        const value = JSON.parse(line);
        if (header) {
          header = false;
          openTerminal(value.width || 80, value.height || 24);
        } else {
          play(value);
        }
      });
      setState('viewer-state', 'ended');
    } catch (err) {
      if (abort.signal.aborted) return;
      setState('viewer-state', '');
      showError(err);
    }
  }

  function openTerminal(cols, rows) {
    terminal = new Terminal({ cols, rows, disableStdin: true, convertEol: false, scrollback: 1000 });
    terminal.open($('terminal'));
  }

  // One asciicast event: output is written, a resize resizes.
  function play(event) {
    if (!Array.isArray(event) || !terminal) return;
    const [, code, data] = event;
    if (code === 'o' && typeof data === 'string') terminal.write(data);
    if (code === 'r' && typeof data === 'string') {
      const size = /^(\d+)x(\d+)$/.exec(data);
      if (size) terminal.resize(Number(size[1]), Number(size[2]));
    }
  }

  function closeViewer() {
    if (viewerAbort) viewerAbort.abort();
    viewerAbort = null;
    if (terminal) terminal.dispose();
    terminal = null;
    $('terminal').replaceChildren();
    $('viewer').hidden = true;
  }

  // ---- Replaying a finished session ----

  async function replay(ns, name) {
    closeReplay();
    clearError();
    try {
      const resp = await call(sessionPath(ns, name) + '/recording');
      const cast = await resp.text();
      $('replay').hidden = false;
      $('replay-title').textContent = ns + '/' + name;
      player = AsciinemaPlayer.create({ data: cast }, $('player'), {
        controls: true,
        autoPlay: true,
        idleTimeLimit: 1,
        fit: 'width',
      });
    } catch (err) {
      showError(err);
    }
  }

  function closeReplay() {
    if (player) player.dispose();
    player = null;
    $('player').replaceChildren();
    $('replay').hidden = true;
  }

  // ---- Terminating ----

  function askTerminate(s) {
    toTerminate = s;
    $('terminate-name').textContent = keyOf(s);
    $('terminate-reason').value = '';
    $('terminate-dialog').showModal();
  }

  async function terminate() {
    const s = toTerminate;
    toTerminate = null;
    $('terminate-dialog').close();
    if (!s) return;
    clearError();
    try {
      await call(sessionPath(s.metadata.namespace, s.metadata.name), {
        method: 'DELETE',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ kind: 'DeleteOptions', apiVersion: 'v1', reason: $('terminate-reason').value }),
      });
    } catch (err) {
      showError(err);
    }
  }

  // ---- Wiring ----

  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    signIn(true);
  });
  $('sign-in-cert').addEventListener('click', () => signIn(false));
  $('sign-out').addEventListener('click', signOut);
  $('all-replicas').addEventListener('change', startLive);
  $('viewer-close').addEventListener('click', closeViewer);
  $('replay-close').addEventListener('click', closeReplay);
  $('replay-form').addEventListener('submit', (e) => {
    e.preventDefault();
    replay($('replay-namespace').value.trim(), $('replay-id').value.trim());
  });
  $('terminate-form').addEventListener('submit', (e) => {
    e.preventDefault();
    terminate();
  });
  $('terminate-cancel').addEventListener('click', () => {
    toTerminate = null;
    $('terminate-dialog').close();
  });
})();
