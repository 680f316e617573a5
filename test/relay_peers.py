# test/relay_peers.py — hand-made peers of the DiLoCo hub (`train_gpt relay`), for
# test/test_relay_peers.sh: each scenario plays one or more replicas speaking the wire protocol
# of docs/protocol.md (HMAC handshake, frames, CONTRIBUTE, DATA) and misbehaving in one way,
# and checks what the hub does to the honest ones. Usage:
#     relay_peers.py SCENARIO PORT SECRET_FILE
# Exit 0 when the scenario went as the protocol says; otherwise one line saying what happened.
# Every wait has a deadline (a frame, a closed connection), never a fixed sleep.
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import threading
import time

VERSION = 10
HELLO, AUTH, WELCOME, REFUSE = 1, 2, 3, 4
HEARTBEAT, JOIN, JOINED, CONTRIBUTE, ROUND, EVICTED = 16, 17, 18, 19, 20, 21
DATA = 32
KIND_PAYLOAD, KIND_MEAN = 1, 3
INT8 = 1
HUB_FEEDBACK = 1
BLOCK = 128
HUBS = 1               # the hubs the peers' AUTH says their diloco_rendezvous lists (this one is hub 0)
FOLLOW, DONE = 25, 26


def mac(key, *parts):
    m = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        m.update(p)
    return m.digest()


def int8_bytes(values):
    return values + 4 * ((values + BLOCK - 1) // BLOCK)


class Closed(Exception):
    pass


class Conn:
    """One framed connection: tags and sequence numbers both ways."""

    def __init__(self, port, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.key_tx = self.key_rx = bytes(32)
        self.seq_tx = self.seq_rx = 0
        self.buf = b""
        self.closed = False
        self.next_beat = 0

    def frame(self, ftype, payload):
        head = b"TGPW" + struct.pack("<HBBQQ", VERSION, ftype, 0, self.seq_tx, len(payload))
        self.seq_tx += 1
        return head + payload + mac(self.key_tx, head, payload)

    def send(self, ftype, payload=b""):
        self.sock.sendall(self.frame(ftype, payload))

    def beat(self, every):
        """A HEARTBEAT when `every` seconds have passed since the last (a failed send: closed)."""
        now = time.time()
        if now >= self.next_beat and not self.closed:
            try:
                self.send(HEARTBEAT)
            except OSError:
                self.closed = True
            self.next_beat = now + every

    def take(self):
        """A whole frame from the buffer, or None."""
        if len(self.buf) < 24:
            return None
        assert self.buf[:4] == b"TGPW", self.buf[:24]
        _, ftype, _, seq, n = struct.unpack("<HBBQQ", self.buf[4:24])
        if len(self.buf) < 24 + n + 32:
            return None
        head, payload, tag = self.buf[:24], self.buf[24:24 + n], self.buf[24 + n:24 + n + 32]
        assert hmac.compare_digest(tag, mac(self.key_rx, head, payload)), "bad tag from the hub"
        assert seq == self.seq_rx, "sequence number %d, expected %d" % (seq, self.seq_rx)
        self.seq_rx += 1
        self.buf = self.buf[24 + n + 32:]
        return ftype, payload

    def fill(self):
        try:
            d = self.sock.recv(1 << 20)
        except ConnectionResetError:
            d = b""
        if not d:
            self.closed = True
        self.buf += d

    def read(self, deadline):
        while True:
            f = self.take()
            if f:
                return f
            if self.closed:
                raise Closed()
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("no frame from the hub in time")
            r, _, _ = select.select([self.sock], [], [], left)
            if r:
                self.fill()


def handshake(port, secret, rid, stream=0, streams=1, session=0, rcvbuf=None, min_replicas=1):
    c = Conn(port, rcvbuf)
    t, p = c.read(time.time() + 10)
    assert t == HELLO, t
    nonce_h, nonce_c = p[:32], os.urandom(32)
    fields = struct.pack("<IHHIIQQHHI", rid, stream, streams, 8, min_replicas, 0x5EED, session, 0, HUBS, 0) + nonce_c
    c.send(AUTH, fields + mac(secret, b"train_gpt auth v1\0", nonce_h, fields))
    t, p = c.read(time.time() + 10)
    if t == REFUSE:
        raise RuntimeError("refused: " + p[8:].decode(errors="replace"))
    assert t == WELCOME, t
    c.key_tx = mac(secret, b"train_gpt key client-to-hub v1\0", nonce_h, nonce_c)
    c.key_rx = mac(secret, b"train_gpt key hub-to-client v1\0", nonce_h, nonce_c)
    return c, struct.unpack("<Q", p[:8])[0]


class Replica:
    """A control connection and `streams` data connections; frames of interest are kept in
    self.got (type -> list of payloads; the mean's bytes counted in self.mean_bytes)."""

    def __init__(self, port, secret, rid, streams=1, rcvbuf=None):
        self.rid = rid
        self.ctl, sid = handshake(port, secret, rid, 0, streams)
        self.data = [handshake(port, secret, rid, s, streams, sid, rcvbuf)[0] for s in range(1, streams + 1)]
        self.got = {}
        self.mean_bytes = 0
        self.reading = True   # False: the data connections are not read (a receiver that stalls)

    def conns(self):
        return [self.ctl] + (self.data if self.reading else [])

    def pump(self, deadline):
        """Heartbeats, and every frame the hub has for us, until deadline (at least one look)."""
        while True:
            now = time.time()
            self.ctl.beat(0.3)
            live = [c for c in self.conns() if not c.closed]
            if live:
                r, _, _ = select.select([c.sock for c in live], [], [], max(0.0, min(0.1, deadline - now)))
                for c in live:
                    if c.sock in r:
                        c.fill()
            for c in self.conns():
                while True:
                    f = c.take()
                    if not f:
                        break
                    if f[0] == DATA:
                        self.mean_bytes += len(f[1]) - 40
                    elif f[0] != HEARTBEAT:
                        self.got.setdefault(f[0], []).append(f[1])
            if time.time() >= deadline or not live:
                return

    def wait(self, cond, seconds, others=()):
        deadline = time.time() + seconds
        while not cond():
            if time.time() >= deadline:
                return False
            for o in others:
                o.pump(time.time())
            self.pump(min(deadline, time.time() + 0.05))
        return True

    def join(self, step=0, param_hash=0xABC):
        self.ctl.send(JOIN, struct.pack("<qQ", step, param_hash))
        return self.wait(lambda: JOINED in self.got, 10)

    def contribute(self, step, values, segment, total=None, chunk=None, model=None):
        total = total if total is not None else segmented_bytes(values, segment)
        chunk = chunk if chunk is not None else int8_bytes(segment)
        self.ctl.send(CONTRIBUTE, struct.pack("<qQIIBBBBIIfQQQQ", step, total, chunk, 0, INT8, INT8, HUB_FEEDBACK, 0,
                                              BLOCK, segment, 0.0, values, 0, model or values, 1))

    def chunk_frame(self, stream, step, total, chunk, index, body):
        head = struct.pack("<IB3xqQQII", self.rid, KIND_PAYLOAD, step, total, index * chunk, chunk, 0)
        return self.data[stream].frame(DATA, head + body)

    def upload(self, step, values, segment, order=None, stream_of=lambda c: 0):
        total, chunk = segmented_bytes(values, segment), int8_bytes(segment)
        n = (values + segment - 1) // segment
        for c in order if order is not None else range(n):
            size = int8_bytes(min(segment, values - c * segment))
            self.data[stream_of(c)].sock.sendall(self.chunk_frame(stream_of(c), step, total, chunk, c, bytes(size)))


DROPPED, PROTOCOL = 8, 9   # REFUSE codes in a session: given up; broke the protocol


def told(rep, code, text, seconds=10, others=()):
    """The hub ended rep's session with a REFUSE of code saying text (docs/protocol.md), then closed."""
    if not rep.wait(lambda: rep.ctl.closed, seconds, others):
        return "the hub kept replica %d's session" % rep.rid
    got = rep.got.get(REFUSE, [])
    if not got:
        return "the hub closed replica %d's session without a REFUSE saying why" % rep.rid
    c, n = struct.unpack("<II", got[0][:8])
    said = got[0][8:8 + n].decode(errors="replace")
    if c != code or text not in said:
        return "replica %d was told REFUSE %d %r, expected %d with %r" % (rep.rid, c, said, code, text)
    return None


def segmented_bytes(values, segment):
    full, rest = divmod(values, segment)
    return full * int8_bytes(segment) + (int8_bytes(rest) if rest else 0)


def round_ids(payload):
    n = struct.unpack("<I", payload[12:16])[0]
    return [struct.unpack("<I", payload[16 + 16 * i:20 + 16 * i])[0] for i in range(n)]


def closes_with(rep, ids, seconds=15, others=()):
    """rep gets ROUND naming exactly ids and the whole mean."""
    ok = rep.wait(lambda: ROUND in rep.got, seconds, others)
    if not ok:
        return "replica %d got no ROUND within %d s (frames: %s)" % (rep.rid, seconds, sorted(rep.got))
    got = round_ids(rep.got[ROUND][0])
    if got != ids:
        return "replica %d's ROUND names %s, expected %s" % (rep.rid, got, ids)
    return None


SEG = 4096             # values per segment (int8, block 128: 4224 bytes)
VALUES = 4 * SEG       # a payload of 4 segments


def scenario_residual_claim(port, secret):
    # Replica 1 claims a model of 2^38 values (1 TiB of residual) with sizes that follow from its
    # encoding: the hub cannot hold that, refuses replica 1 and goes on with replica 0's round.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    big = 1 << 38
    b.contribute(0, big, 262144)
    if not b.wait(lambda: b.ctl.closed, 10, [a]):
        return "the hub kept replica 1 after its claim of %d values" % big
    a.contribute(0, VALUES, SEG)
    a.upload(0, VALUES, SEG)
    return closes_with(a, [0])


def scenario_poisoned_round(port, secret):
    # Replica 0's CONTRIBUTE has sizes that disagree with its encoding (one segment too many):
    # it is refused, and the round takes replica 1's honest contribution.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    a.contribute(0, VALUES, SEG, total=segmented_bytes(VALUES, SEG) + int8_bytes(SEG))
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept replica 0 after its inconsistent CONTRIBUTE"
    b.contribute(0, VALUES, SEG)
    b.upload(0, VALUES, SEG)
    return closes_with(b, [1])


def scenario_poisoned_by_chunk(port, secret):
    # Replica 0 sends a chunk claiming a payload of another size before any CONTRIBUTE (a chunk may
    # overtake its CONTRIBUTE): replica 1's CONTRIBUTE, whose sizes follow from its encoding, sizes
    # the round; replica 0 is evicted, replica 1's round closes.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    wrong_total = segmented_bytes(VALUES, SEG) * 2
    # Loopback delivers at the send: any poll of the hub that sees b's CONTRIBUTE sees a's chunk
    # too, and reads a's connections (opened first) first.
    a.data[0].sock.sendall(a.chunk_frame(0, 0, wrong_total, int8_bytes(SEG), 1, bytes(int8_bytes(SEG))))
    b.contribute(0, VALUES, SEG)
    b.upload(0, VALUES, SEG)
    err = closes_with(b, [1], others=[a])
    if err:
        return err
    if not a.wait(lambda: EVICTED in a.got, 10):
        return "replica 0 was not told it was evicted"
    return None


SMALL = 1024           # values per segment for the window's scenarios (1056 bytes)
MANY = 64 * SMALL      # 64 segments: 4 windows


def scenario_window_bypass(port, secret):
    # Replica 0 withholds segment 0 and sends segments 1 .. 63 (the window counted only the
    # segments in order, so the hub kept every one): once it is a window ahead of the reduction
    # on its one data stream it is dropped; replica 1's round closes.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    a.contribute(0, MANY, SMALL)
    b.contribute(0, MANY, SMALL)
    quietly(a.upload, 0, MANY, SMALL, range(1, 64))   # the hub closes it on the way
    b.upload(0, MANY, SMALL)
    err = closes_with(b, [1], others=[a])
    if err:
        return err
    if not a.wait(lambda: a.ctl.closed, 10):
        return "replica 0 is still connected"
    return None


def scenario_window_reorder(port, secret):
    # Two data streams, each in order, but stream 2 far ahead of stream 1 (all odd segments
    # first, then the even ones): a replica's segments may come in any order across its streams;
    # the hub stops reading the stream that is ahead and takes the rest. The round closes.
    a = Replica(port, secret, 0, streams=2)
    a.join()
    a.contribute(0, MANY, SMALL)
    a.upload(0, MANY, SMALL, order=list(range(1, 64, 2)) + list(range(0, 64, 2)), stream_of=lambda c: 1 - c % 2)
    return closes_with(a, [0])


def quietly(fn, *args):
    """fn(*args) in a thread whose connection the hub may close."""
    try:
        fn(*args)
    except OSError:
        pass


def scenario_nonreader(port, secret):
    # Replica 1 uploads, keeps its heartbeats going, and never reads its data connection (a small
    # receive buffer): the reduction waits on its backlog. It is dropped timeout_s later, and
    # replica 0 gets ROUND and the whole mean. The mean (17 MiB) is larger than what the sockets
    # between them can hold.
    seg, n = 262144, 64
    values = seg * n
    a, b = Replica(port, secret, 0), Replica(port, secret, 1, rcvbuf=4096)
    a.join(), b.join()
    b.reading = False
    for r in (a, b):
        r.contribute(0, values, seg)
    # Uploads from threads: the hub stops reading them (the window) while the reduction waits.
    ups = [threading.Thread(target=quietly, args=(r.upload, 0, values, seg), daemon=True) for r in (a, b)]
    for t in ups:
        t.start()
    ok = a.wait(lambda: ROUND in a.got, 20, [b])
    if not ok:
        return "replica 0 got no ROUND within 20 s (%d of %d bytes of the mean)" % (a.mean_bytes,
                                                                                 segmented_bytes(values, seg))
    if 0 not in round_ids(a.got[ROUND][0]):
        return "ROUND does not name replica 0"
    mean = segmented_bytes(values, seg)
    if not a.wait(lambda: a.mean_bytes == mean, 10):
        return "replica 0 has %d of the mean's %d bytes" % (a.mean_bytes, mean)
    b.reading = True   # its data streams close too: read them to the end
    return told(b, DROPPED, "its data streams took nothing of what the hub sends it for")


def cpu_seconds(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def scenario_emfile(port, secret):
    # The relay runs under a limit of 40 open files (test_relay_peers.sh) and 60 connections come
    # that never speak: accept fails with EMFILE. The relay says so in one line, does not spin
    # (the waiting connection kept the listener readable: 100 % CPU, silently), and a replica gets
    # in once the silent ones are cut off (timeout_s).
    pid, log = int(os.environ["RELAY_PID"]), os.environ["RELAY_LOG"]
    silent = []
    for _ in range(60):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        silent.append(s)
    deadline = time.time() + 10
    while "out of file descriptors" not in open(log).read():
        if time.time() > deadline:
            return "no line about the file descriptors within 10 s"
        time.sleep(0.05)
    c0, t0 = cpu_seconds(pid), time.time()
    deadline = t0 + 20
    while True:
        try:
            a = Replica(port, secret, 0)
            break
        except (Closed, OSError, TimeoutError, AssertionError, RuntimeError):
            if time.time() > deadline:
                return "no replica could connect within 20 s"
            time.sleep(0.1)   # backoff between tries, as a replica does
    used, spent = cpu_seconds(pid) - c0, time.time() - t0
    if used > 0.3 * spent + 0.3:
        return "the relay used %.1f s of CPU in %.1f s while out of descriptors (a busy loop)" % (used, spent)
    a.join()
    return None


def scenario_handshake_flood(port, secret):
    # 300 connections that never speak (no secret needed) fill the 128 places in the handshake
    # and are kept for timeout_s: a replica could not connect meanwhile ("too many connections"),
    # and opened again every timeout_s they kept replicas out for good. Each new connection now
    # takes the place of the oldest: the replica gets in at once.
    silent = []
    for _ in range(300):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        silent.append(s)
    # The hub has taken most of them once it has cut off 150 (its log says only the first 20
    # of a minute): those see their connection closed after the HELLO.
    deadline, cut, open_ = time.time() + 10, 0, list(silent)
    while cut < 150:
        if time.time() > deadline:
            return "the hub cut off %d of the silent connections within 10 s" % cut
        readable, _, _ = select.select(open_, [], [], 0.1)
        for s in readable:
            try:
                data = s.recv(4096)
            except BlockingIOError:
                data = None
            except OSError:   # reset
                data = b""
            if data == b"":
                cut += 1
                open_.remove(s)
    t0 = time.time()
    try:
        a = Replica(port, secret, 0)
    except (Closed, OSError, TimeoutError) as e:
        return "the replica could not connect while the silent connections were held: %r" % e
    if time.time() - t0 > 2.0:
        return "the replica took %.1f s to connect" % (time.time() - t0)
    a.join()
    return None


def scenario_unproven_flood(port, secret):
    # 200 connections, one after the other, that send something other than a train_gpt frame
    # (anyone can): each is refused, and the hub closing it is waited for. The relay logged a line
    # for each (98,654 lines in 8 s under bench/diloco/relay_flood); now the first 20 of a
    # minute and one line that counts the rest (test_relay_peers.sh reads the log). A replica with
    # the secret then still gets in, and its lines are written.
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
        try:
            while s.recv(4096):   # the HELLO, then the close
                pass
        except ConnectionResetError:
            pass
        s.close()
    a = Replica(port, secret, 0)
    a.join()
    if not wait_for_line(os.environ["RELAY_LOG"], "replica 0 joined", 10, [a]):
        return "the replica's join was not logged"
    return None


STATE, STATE_END, CAUGHT_UP = 22, 28, 29
KIND_STATE, KIND_CATCHUP = 2, 4


def data_head(owner, kind, step, total, offset, chunk):
    return struct.pack("<IB3xqQQII", owner, kind, step, total, offset, chunk, 0)


def scenario_chunk_claim(port, secret):
    # Replica 0's first chunk claims a payload of 1 TiB in chunks of 1 KiB (2^30 segments) before
    # any CONTRIBUTE: the hub must not size the round from it (it allocated a pointer per
    # segment, 8 GiB, and touched them all when the replica left). Refused; replica 1's round closes.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    a.data[0].sock.sendall(a.data[0].frame(DATA, data_head(0, KIND_PAYLOAD, 0, 1 << 40, 0, 1024) + bytes(1024)))
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept replica 0 after a chunk of a 2^30-chunk payload"
    b.contribute(0, VALUES, SEG)
    b.upload(0, VALUES, SEG)
    return closes_with(b, [1])


def catchup_donor(port, secret):
    """Replica 0 founds the group and closes round 0; replica 1 (another param_hash) waits for a
    state: replica 0 is its catch-up donor. Returns (a, b, error)."""
    a = Replica(port, secret, 0)
    a.join(0, 0xAAA)
    b = Replica(port, secret, 1)
    b.join(0, 0xBBB)
    a.contribute(0, VALUES, SEG)
    a.upload(0, VALUES, SEG)
    err = closes_with(a, [0], others=[b])
    if err:
        return a, b, err
    flags = struct.unpack("<I", a.got[ROUND][0][8:12])[0]
    if flags & 6 != 6:
        return a, b, "round 0's ROUND did not make replica 0 a catch-up donor (flags %d)" % flags
    return a, b, None


def give_state(a, b, total=2048, chunk=1024):
    """a sends a state of total bytes (catch-up) and b takes it whole."""
    a.ctl.send(STATE, struct.pack("<qQIIII", 0, total, chunk, 0, 1, 0))
    for off in range(chunk, total, chunk):   # the first chunk last, as a donor does
        a.data[0].sock.sendall(a.data[0].frame(DATA, data_head(0, KIND_STATE, 0, total, off, chunk) + bytes(chunk)))
    a.data[0].sock.sendall(a.data[0].frame(DATA, data_head(0, KIND_STATE, 0, total, 0, chunk) + bytes(chunk)))
    if not b.wait(lambda: b.mean_bytes >= total, 10, [a]):
        return "the joiner did not get the state (%d of %d bytes)" % (b.mean_bytes, total)
    return None


def send_state(a, b):
    """give_state, then b says CAUGHT_UP(0) and gets STATE_END."""
    err = give_state(a, b)
    if err:
        return err
    b.ctl.send(CAUGHT_UP, struct.pack("<q", 0))
    if not b.wait(lambda: STATE_END in b.got, 10, [a]):
        return "the joiner got no STATE_END"
    return None


def scenario_catchup_beyond(port, secret):
    # The donor sends catch-up means for rounds the group never closed (1, 2, ...: the last closed
    # is 0): the hub kept them all for joiners that never ask (16 MiB each, without bound).
    # The donor is dropped at the first.
    a, b, err = catchup_donor(port, secret)
    err = err or send_state(a, b)
    if err:
        return err
    big = 1 << 20
    for r in range(1, 9):
        try:
            a.data[0].sock.sendall(a.data[0].frame(DATA, data_head(0, KIND_CATCHUP, r, big, 0, big) + bytes(big)))
        except OSError:
            break
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept the donor after means of rounds it never closed"
    return None


def scenario_state_claim(port, secret):
    # The donor announces a state of 1 TiB in chunks of 1 KiB: the hub kept a bit per chunk for
    # each replica joining in flight (128 MiB, copied in its loop; out of memory: the relay
    # exited). Refused: the donor is dropped, the relay stays up.
    a, b, err = catchup_donor(port, secret)
    if err:
        return err
    a.ctl.send(STATE, struct.pack("<qQIIII", 0, 1 << 40, 1024, 0, 1, 0))
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept the donor after a state of 2^30 chunks"
    return None


def scenario_caughtup_far(port, secret):
    # The joiner says CAUGHT_UP for round 2^40 (no round near it closed; at 2^62 round + 1
    # overflowed in the hub, undefined; the frame's bound is now 2^53, test_wire): dropped with a
    # line, and replica 0's round 1 closes without it.
    a, b, err = catchup_donor(port, secret)
    err = err or give_state(a, b)
    if err:
        return err
    b.ctl.send(CAUGHT_UP, struct.pack("<q", 1 << 40))
    if not b.wait(lambda: b.ctl.closed, 10, [a]):
        return "the hub kept the joiner after CAUGHT_UP(2^40)"
    del a.got[ROUND]
    a.contribute(1, VALUES, SEG)
    a.upload(1, VALUES, SEG)
    return closes_with(a, [0])


def scenario_caughtup_silent(port, secret):
    # The joiner takes its state, says CAUGHT_UP and then never contributes (its trainer hung;
    # its heartbeats go on): the rounds waited for it for ever. It is due from round 1, as the
    # joiner of a whole transfer: evicted as late about timeout_s after the round began, and
    # replica 0's round 1 closes without it. With that eviction the transfer ends (no joiner
    # left): it stayed on, every later mean of the donor was kept for it at the hub without
    # bound, and a replica that then waited was never given a donor. Replica 2 comes after the
    # eviction and must be given one at the next close.
    a, b, err = catchup_donor(port, secret)
    err = err or send_state(a, b)
    if err:
        return err
    del a.got[ROUND]
    a.contribute(1, VALUES, SEG)
    a.upload(1, VALUES, SEG)
    if not a.wait(lambda: ROUND in a.got, 30, [b]):
        return "round 1 did not close within 30 s (timeout_s 3): the silent joiner held it"
    if not b.wait(lambda: EVICTED in b.got, 10):
        return "round 1 closed but the joiner was not told it was evicted"
    err = closes_with(a, [0])
    if err:
        return err
    log = os.environ.get("RELAY_LOG")
    if log and not wait_for_line(log, "aborted (no joiner left)", 10, [a, b]):
        return "the transfer went on after its one joiner was evicted"
    c = Replica(port, secret, 2)
    if not c.join(0, 0xCCC):   # another status: it waits for a state
        return "replica 2's JOIN was not answered"
    del a.got[ROUND]
    a.contribute(2, VALUES, SEG)
    a.upload(2, VALUES, SEG)
    if not a.wait(lambda: ROUND in a.got, 30, [b, c]):
        return "round 2 did not close"
    flags = struct.unpack("<I", a.got[ROUND][0][8:12])[0]
    if flags & 2 != 2:
        return "round 2's close gave replica 2 no donor (flags %d to replica 0)" % flags
    return None


def scenario_resized_short(port, secret):
    # Replica 0's chunk claims a payload of one segment before any CONTRIBUTE; replica 1's
    # CONTRIBUTE of 64 segments resizes the round and evicts replica 0, whose array of segments
    # (one) stayed: freeing each segment once reduced, the hub read entries 1 .. 63 of it, past
    # its end (a heap overflow; what it read was freed: the relay crashed).
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    one = int8_bytes(SMALL)
    a.data[0].sock.sendall(a.chunk_frame(0, 0, one, one, 0, bytes(one)))
    a.pump(time.time() + 0.3)   # (read by the hub before b's CONTRIBUTE: see poisoned_by_chunk)
    b.contribute(0, MANY, SMALL)
    quietly(b.upload, 0, MANY, SMALL)
    return closes_with(b, [1], others=[a])


def scenario_keep_claim(port, secret):
    # A CONTRIBUTE of block 2^23 keeping 2^22 values of each (sparse int8): the codecs take blocks
    # of at most 2^20, and the hub that asked them for this one exited (an internal check, on a
    # peer's word). Refused: that replica is dropped, replica 1's round closes.
    a, b = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), b.join()
    big = 1 << 23
    a.ctl.send(CONTRIBUTE, struct.pack("<qQIIBBBBIIfQQQQ", 0, int8_bytes(big), int8_bytes(big), 1 << 22, INT8, INT8,
                                       HUB_FEEDBACK, 0, big, big, 0.0, big, 0, big, 1))
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept replica 0 after a CONTRIBUTE of block 2^23"
    b.contribute(0, VALUES, SEG)
    b.upload(0, VALUES, SEG)
    return closes_with(b, [1])


def scenario_follow_catchup(port, secret):
    # Several hubs: a catch-up joiner that has its state but has not said CAUGHT_UP sends FOLLOW
    # (as to one of its other hubs). That ends its join here; it kept catching_up, was in the
    # transfer for ever, and the donor's next round never closed (it was never evicted as late).
    global HUBS
    HUBS = 2
    a, b, err = catchup_donor(port, secret)
    err = err or give_state(a, b)
    if err:
        return err
    b.ctl.send(FOLLOW, struct.pack("<qQqII", 0, 0xBBB, 0, 0, 0))   # from the next round
    if not b.wait(lambda: len(b.got.get(JOINED, [])) >= 2, 10, [a]):   # JOINED answers a FOLLOW
        return "the FOLLOW was not answered"
    del a.got[ROUND]
    a.contribute(64, VALUES, SEG)
    a.upload(64, VALUES, SEG)
    if not a.wait(lambda: ROUND in a.got, 30, [b]):
        return "round 64 (step 1) did not close within 30 s (timeout_s 3): the follower held it"
    return None


def scenario_follow_held_silent(port, secret):
    # Several hubs: replica 1 follows this hub after catching up through its primary (FOLLOW's
    # catch-up flag), having followed it from no round while its state came (1 s), and then never
    # contributes (its trainer hung; its heartbeats go on). Its first round waited until it began
    # a contribution, for ever; now timeout_s plus the time its state took: round 0 closes
    # without it, and it is told it was evicted.
    global HUBS
    HUBS = 2
    a = Replica(port, secret, 0)
    a.join(0, 0xAAA)
    b = Replica(port, secret, 1)
    b.ctl.send(FOLLOW, struct.pack("<qQqII", 0, 0xBBB, (1 << 63) - 1, 0, 0))   # from no round: waits for its state
    if not b.wait(lambda: len(b.got.get(JOINED, [])) >= 1, 10, [a]):
        return "the first FOLLOW was not answered"
    b.pump(time.time() + 1.0)   # its state takes 1 s through its primary
    b.ctl.send(FOLLOW, struct.pack("<qQqII", 0, 0xBBB, 0, 1, 0))   # caught up: from round 0, held
    if not b.wait(lambda: len(b.got.get(JOINED, [])) >= 2, 10, [a]):
        return "the catch-up FOLLOW was not answered"
    a.contribute(0, VALUES, SEG)
    a.upload(0, VALUES, SEG)
    if not a.wait(lambda: ROUND in a.got, 30, [b]):
        return "round 0 did not close within 30 s (timeout_s 3, its state 1 s): the silent follower held it"
    if not b.wait(lambda: EVICTED in b.got, 10, [a]):
        return "round 0 closed but the follower was not told it was evicted"
    err = closes_with(a, [0])
    if err:
        return err
    # A first join follows no hub before its state comes (no FOLLOW of no round): the time its
    # state took is not known here, and its first round waits until it begins (a healthy joiner
    # starting its phase late was evicted at every hub but its primary): replica 2 contributes
    # 7 s (over twice timeout_s) after the round's first contribution and is in it.
    c = Replica(port, secret, 2)
    c.ctl.send(FOLLOW, struct.pack("<qQqII", 1, 0xCCC, 64, 1, 0))   # caught up: from round 64 (step 1), held
    if not c.wait(lambda: len(c.got.get(JOINED, [])) >= 1, 10, [a, b]):
        return "replica 2's catch-up FOLLOW was not answered"
    del a.got[ROUND]
    a.contribute(64, VALUES, SEG)
    a.upload(64, VALUES, SEG)
    if a.wait(lambda: ROUND in a.got or EVICTED in c.got, 7, [c]):
        return "round 64 did not wait for the first-join follower (no waiting time known)"
    c.contribute(64, VALUES, SEG)
    c.upload(64, VALUES, SEG)
    return closes_with(a, [0, 2], others=[c])


def scenario_follow_one_hub(port, secret):
    # FOLLOW (a frame of runs with several hubs) to a hub its AUTH said is the only one: dropped,
    # as DONE and HOLD are (it was taken: a joiner of one hub could leave its transfer hanging).
    a, b, err = catchup_donor(port, secret)
    err = err or give_state(a, b)
    if err:
        return err
    b.ctl.send(FOLLOW, struct.pack("<qQqII", 0, 0xBBB, 0, 0, 0))
    if not b.wait(lambda: b.ctl.closed, 10, [a]):
        return "the hub kept replica 1 after a FOLLOW with one hub"
    return None


def scenario_done_far(port, secret):
    # Several hubs: replica 1 says DONE(completed) for outer step 2^40 (2^53 is the frame's bound).
    # Taken, every later contribution here was stale: replica 0's round 64 was refused, and no
    # round of this hub could close again. Dropped with a line; replica 0's round 64 closes.
    global HUBS
    HUBS = 2
    a, m = Replica(port, secret, 0), Replica(port, secret, 1)
    a.join(), m.join()
    for r in (a, m):
        r.contribute(0, VALUES, SEG)
        r.upload(0, VALUES, SEG)
    err = closes_with(a, [0, 1], others=[m])
    if err:
        return err
    m.ctl.send(DONE, struct.pack("<qII", 1 << 40, 1, 0))
    err = told(m, PROTOCOL, "said DONE for outer step 1099511627776, far past any step", others=[a])
    if err:
        return err
    del a.got[ROUND]
    a.contribute(64, VALUES, SEG)
    a.upload(64, VALUES, SEG)
    if EVICTED in a.got:
        return "replica 0's round 64 was refused: %r" % a.got[EVICTED][0][12:]
    return closes_with(a, [0])


def scenario_mean_from_donor(port, secret):
    # A donor sends a chunk of its state as DATA kind 3 (a mean: hub to replica only). It was
    # taken as a state chunk, counted into the joiner's state and relayed as kind 3, which a
    # replica ignores as a stale mean: the joiner's state never completed while the hub held it
    # whole. The donor is dropped with a line.
    a, b, err = catchup_donor(port, secret)
    if err:
        return err
    total, chunk = 2048, 1024
    a.ctl.send(STATE, struct.pack("<qQIIII", 0, total, chunk, 0, 1, 0))
    a.data[0].sock.sendall(a.data[0].frame(DATA, data_head(0, 3, 0, total, chunk, chunk) + bytes(chunk)))
    if not a.wait(lambda: a.ctl.closed, 10, [b]):
        return "the hub kept the donor after its DATA of kind 3"
    return None


def scenario_bad_quorum(port, secret):
    # An AUTH (of 8 replicas) asking for min_replicas 0, 9 (more than its 8) or 3 (more than the
    # relay's --replicas 2, run with it): refused in one line, code 4. Taken, the group's every
    # join waited for a quorum it could never reach, without a word.
    for q, why in ((0, "min_replicas not in 1 .. replicas"), (9, "min_replicas not in 1 .. replicas"),
                   (3, "asks for min_replicas 3, but the relay was started with --replicas 2")):
        try:
            handshake(port, secret, 0, min_replicas=q)
        except RuntimeError as e:
            if why not in str(e):
                return "min_replicas %d: refused, but for %s" % (q, e)
            continue
        return "an AUTH asking for min_replicas %d was welcomed" % q
    handshake(port, secret, 0, min_replicas=2)   # and a reachable one is welcomed
    return None


def wait_for_line(path, text, seconds, reps=()):
    """The relay's log at path holds text within seconds (the replicas kept pumping)."""
    deadline = time.time() + seconds
    while text not in open(path, errors="replace").read():
        if time.time() >= deadline:
            return False
        for r in reps:
            r.pump(time.time() + 0.05)
    return True


def main():
    name, port, secret_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    secret = open(secret_file, "rb").read().rstrip()
    err = globals()["scenario_" + name](port, secret)
    if err:
        print("%s: %s" % (name, err))
        sys.exit(1)
    print("%s: as expected" % name)


if __name__ == "__main__":
    main()
