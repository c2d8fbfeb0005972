// Runs one exec with the official Kubernetes JavaScript client and prints what the client
// observed as one JSON line: negotiated subprotocol, stdout, stderr, the Status and the exit
// code read from it. Driven by tests/e2e_node.rs.
//
// usage: node exec.mjs <kubeconfig> <v5|v4>
//   v5: the client's own protocol list (v5 first), stdin ended by the client (CLOSE signal).
//   v4: the client's WebSocketHandler with a socket factory that offers only v4.channel.k8s.io;
//       v4 has no stdin half-close, so the command reads one line instead of waiting for EOF.
import { PassThrough } from 'node:stream';
import WebSocket from 'isomorphic-ws';
import { Exec, KubeConfig } from '@kubernetes/client-node';
// Not re-exported by the package index; the package has no exports map, so the file is public.
import { WebSocketHandler } from '@kubernetes/client-node/dist/web-socket-handler.js';

const [kubeconfig, mode] = process.argv.slice(2);
if (!kubeconfig || !['v5', 'v4'].includes(mode)) {
  console.error('usage: node exec.mjs <kubeconfig> <v5|v4>');
  process.exit(2);
}

const kc = new KubeConfig();
kc.loadFromFile(kubeconfig);

/** Collects a writable stream's bytes as text. */
function sink() {
  const stream = new PassThrough();
  const chunks = [];
  stream.on('data', (c) => chunks.push(c));
  return { stream, text: () => Buffer.concat(chunks).toString('utf8') };
}

/** The exit code the Status carries (kubectl's rules: Success is 0, NonZeroExitCode has it). */
function exitCode(status) {
  if (!status) return null;
  if (status.status === 'Success') return 0;
  const cause = status.details?.causes?.find((c) => c.reason === 'ExitCode');
  return status.reason === 'NonZeroExitCode' && cause ? Number(cause.message) : null;
}

const stdout = sink();
const stderr = sink();
const stdin = new PassThrough();
let command;
let handler;
if (mode === 'v5') {
  command = ['sh', '-c', 'cat; echo to-stderr >&2; exit 3'];
  handler = undefined; // the client's default protocol list
} else {
  command = ['sh', '-c', 'read l; echo got:$l; echo to-stderr >&2; exit 4'];
  const onlyV4 = (uri, _protocols, opts) => new WebSocket(uri, ['v4.channel.k8s.io'], opts);
  handler = new WebSocketHandler(kc, onlyV4);
}

let status = null;
const exec = new Exec(kc, handler);
const timer = setTimeout(() => {
  console.error('timed out');
  process.exit(1);
}, 30_000);
const ws = await exec.exec('default', 'web', 'main', command, stdout.stream, stderr.stream, stdin, false, (s) => {
  status = s;
});
stdin.write('line from node\n');
if (mode === 'v5') {
  // The client answers the end of stdin with the v5 CLOSE signal (FF 00).
  stdin.end();
}
await new Promise((resolve) => {
  if (ws.readyState === WebSocket.CLOSED) resolve();
  else ws.on('close', resolve);
});
clearTimeout(timer);
console.log(
  JSON.stringify({
    protocol: ws.protocol,
    stdout: stdout.text(),
    stderr: stderr.text(),
    status,
    exitCode: exitCode(status),
  }),
);
