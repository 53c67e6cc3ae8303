"""A client that is not of the job: speaks the job's handshake with the key it is given
(a guess, or the public key a job without a secret uses on the control connection),
then asks for what a member would get and reports what came back, as JSON on stdout.

Usage: stranger.py HOST PORT KEY_HEX CLAIM CONTEXT [join|listen]
"""

import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

GREETING = b"NVRANKS8"


def proof(key, context, side, sender, receiver):
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (
        GREETING,
        side,
        struct.pack("<Q", len(context)),
        context,
        struct.pack("<I", sender[0]),
        struct.pack("<I", receiver[0]),
        sender[1],
        receiver[1],
    ):
        mac.update(part)
    return mac.digest()


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def join_frame():
    """`Control::Join` of rank 1 of the communicator `nccom-test` would have without a
    secret (its id predicted from its name), as postcard frames it."""
    comm = int.from_bytes(hashlib.sha256(b"nccom-test #0").digest()[:8], "little")
    name = b"nccom-test"
    body = varint(2) + varint(comm) + varint(len(name)) + name + varint(2) + varint(1)
    return struct.pack("<I", len(body)) + body


def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main():
    host, port, key_hex, claim, context = sys.argv[1:6]
    join = sys.argv[6:7] != ["listen"]
    key, claim, context = bytes.fromhex(key_hex), int(claim), context.encode()
    report = {"uid": os.geteuid(), "their_hello": 0, "their_proof_valid": False, "after": 0, "closed": False}
    sock = socket.create_connection((host, int(port)), timeout=10)
    nonce = os.urandom(32)
    sock.sendall(GREETING + nonce + struct.pack("<I", claim))
    hello = read_exactly(sock, 44)
    report["their_hello"] = len(hello)
    if len(hello) == 44 and hello[:8] == GREETING:
        their_nonce, their_claim = hello[8:40], struct.unpack("<I", hello[40:44])[0]
        try:
            mine = proof(key, context, b"opener", (claim, nonce), (their_claim, their_nonce))
            sock.sendall(mine + (join_frame() if join else b""))
        except OSError:
            pass
        theirs = read_exactly(sock, 32)
        expected = proof(key, context, b"acceptor", (their_claim, their_nonce), (claim, nonce))
        report["their_proof_valid"] = len(theirs) == 32 and hmac.compare_digest(theirs, expected)
    # Whatever the other side says within 3 s of the handshake: a member's welcome
    # (and the job's heartbeats), or nothing.
    until = time.monotonic() + 3
    try:
        while time.monotonic() < until:
            sock.settimeout(max(until - time.monotonic(), 0.01))
            chunk = sock.recv(65536)
            if not chunk:
                report["closed"] = True
                break
            report["after"] += len(chunk)
    except socket.timeout:
        pass
    except OSError:
        report["closed"] = True
    print(json.dumps(report))


main()
