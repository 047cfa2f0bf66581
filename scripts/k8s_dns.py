#!/usr/bin/env python3
"""The cluster DNS of scripts/k8s_node.sh's one-node cluster: what CoreDNS's `kubernetes` plugin answers, for
the names SIE's chart uses, with no image to pull (stdlib only; started by k8s_node.sh on the node address).

    query name                                  answer (A, TTL 5 s)
    <svc>.<ns>.svc.cluster.local                the Service's ClusterIP; a headless Service: its ready
                                                endpoints' addresses (EndpointSlices)
    <hostname>.<svc>.<ns>.svc.cluster.local     that endpoint (a StatefulSet pod under its governing Service)
    any other name under cluster.local          NXDOMAIN
    any name outside cluster.local              REFUSED: nothing is forwarded, no traffic leaves the node

Other query types for a known name: an empty NOERROR answer (what a client asking AAAA expects). The
Services and EndpointSlices are listed from the apiserver at most once a second, on a query that needs them.

    k8s_dns.py --listen IP --server URL --token-file FILE --ca FILE
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import threading
import time
import urllib.request

DOMAIN = ("cluster", "local")
NOERROR, NXDOMAIN, REFUSED, FORMERR = 0, 3, 5, 1
TYPE_A = 1


class Records:
    """name (lower-case labels) -> IPv4 addresses, from the apiserver, refreshed at most once a second."""

    def __init__(self, server: str, token: str, ca: str) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca)
        self.names: dict[tuple[str, ...], list[str]] = {}
        self.fetched = 0.0
        self.lock = threading.Lock()

    def _get(self, path: str) -> dict:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=5) as resp:
            return json.load(resp)

    def _refresh(self) -> None:
        names: dict[tuple[str, ...], list[str]] = {}
        headless: set[tuple[str, ...]] = set()
        for svc in self._get("/api/v1/services")["items"]:
            base = (svc["metadata"]["name"], svc["metadata"]["namespace"], "svc", *DOMAIN)
            ip = svc["spec"].get("clusterIP")
            names[base] = [ip] if ip and ip != "None" else []
            if not names[base]:
                headless.add(base)
        for eps in self._get("/apis/discovery.k8s.io/v1/endpointslices")["items"]:
            svc_name = eps["metadata"].get("labels", {}).get("kubernetes.io/service-name", "")
            base = (svc_name, eps["metadata"]["namespace"], "svc", *DOMAIN)
            if base not in headless or eps.get("addressType") != "IPv4":
                continue
            for ep in eps.get("endpoints") or []:
                addrs = list(ep.get("addresses") or [])
                if ep.get("hostname"):
                    names[(ep["hostname"], *base)] = addrs
                if (ep.get("conditions") or {}).get("ready", True):
                    names[base] = names[base] + addrs
        self.names = names

    def lookup(self, labels: tuple[str, ...]) -> list[str] | None:
        with self.lock:
            if labels not in self.names and time.monotonic() - self.fetched > 1.0:
                self.fetched = time.monotonic()
                self._refresh()
            return self.names.get(labels)


def parse_question(msg: bytes) -> tuple[int, int, tuple[str, ...], int, int]:
    """(id, flags, qname labels, qtype, end offset of the question)."""
    qid, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if qdcount != 1:
        raise ValueError("one question per query")
    pos, labels = 12, []
    while True:
        n = msg[pos]
        pos += 1
        if n == 0:
            break
        if n & 0xC0 or n > 63:
            raise ValueError("compressed or long label in a question")
        labels.append(msg[pos:pos + n].decode("ascii").lower())
        pos += n
    qtype, _qclass = struct.unpack("!HH", msg[pos:pos + 4])
    return qid, flags, tuple(labels), qtype, pos + 4


def answer(msg: bytes, records: Records) -> bytes:
    try:
        qid, flags, labels, qtype, end = parse_question(msg)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error):
        return struct.pack("!HHHHHH", struct.unpack("!H", msg[:2])[0] if len(msg) >= 2 else 0, 0x8000 | FORMERR,
                           0, 0, 0, 0)
    rd = flags & 0x0100
    if labels[-2:] != DOMAIN:
        rcode, addrs = REFUSED, []
    else:
        try:
            found = records.lookup(labels)
        except OSError:
            found = None
        rcode, addrs = (NXDOMAIN, []) if found is None else (NOERROR, found if qtype == TYPE_A else [])
    header = struct.pack("!HHHHHH", qid, 0x8000 | 0x0400 | rd | rcode, 1, len(addrs), 0, 0)
    body = msg[12:end]
    for ip in addrs:
        body += struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, 5, 4) + socket.inet_aton(ip)
    return header + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--port", type=int, default=53)
    ap.add_argument("--server", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--ca", required=True)
    args = ap.parse_args()
    with open(args.token_file) as f:
        records = Records(args.server, f.read().strip(), args.ca)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, args.port))
    while True:
        msg, peer = sock.recvfrom(4096)
        sock.sendto(answer(msg, records), peer)


if __name__ == "__main__":
    main()
