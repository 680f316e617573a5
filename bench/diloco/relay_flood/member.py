# bench/diloco/relay_flood/member.py — an authenticated member (test/relay_peers.py's framing)
# that heartbeats every 0.3 s for SECONDS and prints the longest gap between the hub's frames and
# whether the hub closed its session. Usage: member.py PORT SECRET_FILE SECONDS
import os
import select
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "test"))
import relay_peers as rp

port, secret_file, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
member = rp.Replica(port, open(secret_file, "rb").read().rstrip(), 0, streams=1)
c = member.ctl
print("member: connected", flush=True)
last = time.time()
longest, frames, end = 0.0, 0, time.time() + seconds
while time.time() < end and not c.closed:
    c.beat(0.3)
    if select.select([c.sock], [], [], 0.05)[0]:
        c.fill()
        while c.take():
            frames += 1
            longest, last = max(longest, time.time() - last), time.time()
longest = max(longest, time.time() - last)
print("member: %d frames from the hub, longest gap %.2f s, dropped by the hub: %s" % (frames, longest, c.closed))
