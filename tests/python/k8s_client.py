"""Drives the official Kubernetes Python client against a server URL and prints one JSON
object with what it saw. Used by tests/e2e_python.rs; the Rust test makes the assertions.

    k8s_client.py SERVER [OPTIONS] exec-v5
    k8s_client.py SERVER [OPTIONS] exec-v4
    k8s_client.py SERVER [OPTIONS] portforward POD_PORT BYTES
    k8s_client.py SERVER [OPTIONS] exec-v4-until-ended

OPTIONS, each set in the client's configuration as a user sets it:
    --proxy URL   reach SERVER through that HTTP proxy (`proxy`): the WebSocket is a tunnel
                  made with CONNECT to SERVER's host and port, so the name needs no resolver
    --ca FILE     trust only the CA in FILE for an https SERVER (`ssl_ca_cert`)
    --token T     authenticate with the bearer token T (`api_key`)
"""
import hashlib
import json
import os
import select
import sys
import time

from kubernetes import client
from kubernetes.stream import portforward, stream


# The client configuration's settings given as OPTIONS (see above), by attribute.
SETTINGS = {}
# The bearer token (--token), if any.
TOKEN = None
OPTIONS = {"--proxy": "proxy", "--ca": "ssl_ca_cert"}


def api(server):
    cfg = client.Configuration()
    cfg.host = server
    for name, value in SETTINGS.items():
        setattr(cfg, name, value)
    if TOKEN:
        cfg.api_key = {"authorization": TOKEN}
        cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.CoreV1Api(client.ApiClient(cfg))


def drain(resp, timeout=60):
    """Reads stdout/stderr until the server closes the session."""
    out, err = "", ""
    deadline = time.time() + timeout
    while resp.is_open() and time.time() < deadline:
        resp.update(timeout=1)
        out += resp.read_stdout() if resp.peek_stdout() else ""
        err += resp.read_stderr() if resp.peek_stderr() else ""
    out += resp.read_stdout() if resp.peek_stdout() else ""
    err += resp.read_stderr() if resp.peek_stderr() else ""
    return out, err


def exec_v5(server):
    # stdin is ended with the v5 CLOSE signal; the command only finishes once it sees EOF.
    resp = stream(
        api(server).connect_get_namespaced_pod_exec,
        "web",
        "default",
        command=["sh", "-c", "cat; echo done; exit 3"],
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    resp.write_stdin("hello from python\n")
    resp.close_channel(0)
    out, err = drain(resp)
    return {
        "subprotocol": resp.subprotocol,
        "stdout": out,
        "stderr": err,
        "returncode": resp.returncode,
    }


def exec_v4(server):
    # Only v4 offered: the proxy relays it to the upstream unchanged.
    resp = stream(
        api(server).connect_get_namespaced_pod_exec,
        "web",
        "default",
        command=["sh", "-c", "echo out; echo err >&2; exit 4"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
    )
    out, err = drain(resp)
    return {
        "subprotocol": resp.subprotocol,
        "stdout": out,
        "stderr": err,
        "returncode": resp.returncode,
    }


def exec_v4_until_ended(server):
    # A v4 session (relayed) that runs until something else ends it: prints `started` (its
    # first output) on a line of its own, then, once the session is over, what the error
    # channel said. The channel is read as is: a Status without an exit code is no returncode.
    resp = stream(
        api(server).connect_get_namespaced_pod_exec,
        "web",
        "default",
        command=["sh", "-c", "echo started; sleep 50"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
    )
    out = ""
    while resp.is_open() and "started" not in out:
        resp.update(timeout=1)
        out += resp.read_stdout() if resp.peek_stdout() else ""
    print("started", flush=True)
    more, err = drain(resp)
    return {
        "subprotocol": resp.subprotocol,
        "stdout": out + more,
        "stderr": err,
        "error": resp.read_channel(3),
    }


def port_forward(server, port, size):
    """Sends `size` pseudo-random bytes to an echo server in the pod and reads them back."""
    pf = portforward(
        api(server).connect_get_namespaced_pod_portforward,
        "web",
        "default",
        ports=str(port),
    )
    sock = pf.socket(port)
    sock.setblocking(True)
    data = os.urandom(size)
    sent_digest = hashlib.sha256(data).hexdigest()
    received = hashlib.sha256()
    got = 0
    view = memoryview(data)
    sent = 0
    deadline = time.time() + 120
    # Interleave sending and receiving so neither direction's buffers fill up.
    while got < size and time.time() < deadline:
        want_write = [sock] if sent < size else []
        readable, writable, _ = select.select([sock], want_write, [], 1)
        if writable:
            sent += sock.send(view[sent : sent + 65536])
        if readable:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received.update(chunk)
            got += len(chunk)
    sock.close()
    error = pf.error(port)
    pf.close()
    return {
        "sent": sent,
        "received": got,
        "sent_sha256": sent_digest,
        "received_sha256": received.hexdigest(),
        "error": error,
    }


def main():
    global TOKEN
    args = sys.argv[1:]
    if "--token" in args:
        at = args.index("--token")
        TOKEN = args[at + 1]
        del args[at : at + 2]
    for option, setting in OPTIONS.items():
        if option in args:
            at = args.index(option)
            SETTINGS[setting] = args[at + 1]
            del args[at : at + 2]
    server, mode = args[0], args[1]
    if mode == "exec-v5":
        result = exec_v5(server)
    elif mode == "exec-v4":
        result = exec_v4(server)
    elif mode == "exec-v4-until-ended":
        result = exec_v4_until_ended(server)
    elif mode == "portforward":
        result = port_forward(server, int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
