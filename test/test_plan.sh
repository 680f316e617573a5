# The memory plan per recompute mode and recompute = auto (issue #18 part 4), and the DiLoCo
# outer state's row (issue #14 part 6; llmc/plan.h, docs/fsdp.md "Memory per rank"):
#  1. `train_gpt plan configs/boom-14b.conf --world 40 --gpu h100-64gb`, at the config's micro-batch
#     (1 x 4096) and at BOOM's (8 x 4096): each mode's row — activations and total per rank on
#     the CPU backend and on a GPU, whether an H100 64GB holds a rank, the smallest group — against
#     hand arithmetic from the config and the two backends' buffer lists (written out below, not
#     taken from the code), to the 0.01 GiB the table prints. At 8 x 4096 only full fits. The
#     CPU columns in every build; the GPU columns where the build has the CUDA model (until
#     2026-12 a build without it, CI's, checked no column).
#  2. The DiLoCo row: int8 with error feedback over tcp, and int4 over mpi in 4 fragments with a
#     bf16 downlink, against the hand arithmetic of what diloco.c and the transports allocate;
#     the line on a joiner's state (its bytes, its time at 100 Mbit/s; the means the catch-up
#     takes after it, through one hub or two, in the inner phase and the decay phase's) against
#     hand arithmetic.
#  3. recompute = auto in runs (CPU, an 8-layer model): memory_budget_mb from the plan's own
#     totals picks none, selective, full on every 2nd layer, full, and refuses below full with
#     one line; each run prints what it chose and, after its first step, the measured
#     activations (the allocator's count) within 10 % of the plan — for every explicit mode too,
#     and at np 2.
#     A mode set by hand is held to the budget: past it, refused in one line.
#  4. Bad input: memory_budget_mb below 0, recompute_layers with auto, an unknown mode, a link of
#     1e-300 Mbit/s; the batch line at --world 40; a config through a pipe.
#  5. docs/diloco.md's recipes for the seeds' runs: each quoted `plan` command, run again,
#     prints every line the docs quote for it (the GPU lines only in a build with the CUDA
#     model), so the recipes' bytes, link times and memory cannot drift from the code.
. "$(dirname "$0")/lib.sh"
tmp_with_processes

# ---------------------------------------------------------------- 1. BOOM 14B per mode
# hand_rows BATCH WORLD: one line per mode, "label|cpu act|cpu total|gpu act|gpu total|fits|group"
hand_rows() {
    "$PYTHON" - "$1" "$2" <<'PY'
import math, sys
B, N = int(sys.argv[1]), int(sys.argv[2])
V, L, C, Hq, Hkv, D, F, T = 128256, 40, 5120, 40, 8, 128, 17408, 4096
QD, KD = Hq * D, Hkv * D
QKV = QD + 2 * KD
R = B * T                          # token rows
G = 2**30
def r256(b): return (b + 255) // 256 * 256
# The rank's pieces, gathered units and unit gradients (untied: embedding, layers, final norm + head).
layer_params = C + QD * C + 2 * KD * C + 2 * D + C * QD + C + 3 * F * C
def state(n, weight_bytes):
    units = [V * C] + [layer_params] * L + [C + V * C]
    pieces = [math.ceil(u / n) for u in units]
    whole = sorted((p * n for p in pieces), reverse=True)
    if n == 1:
        gathered, grads = (2 * sum(units) if weight_bytes == 2 else 0), 0
    elif weight_bytes == 2:  # the GPU: train_gpt.cu's FSDP buffers: the bf16 pieces, bf16 slots of the
        gains = L * (2 * C + 2 * D) + C  # largest unit and of two layers, the norm gains in fp32 (all,
        layer_whole = pieces[1] * n      # this rank's, the all-gather's n copies); grad slots of the
        gathered = 2 * sum(pieces) + 2 * (whole[0] + 2 * layer_whole) + 4 * gains * (n + 2)  # largest unit
        grads = 4 * (whole[0] + 2 * layer_whole + whole[0])  # and two layers, the receive buffer
    else:
        gathered = weight_bytes * (whole[0] + whole[1])        # the unit in use and the next
        grads = 4 * (whole[0] + whole[1] + whole[0] + math.ceil(whole[0] / n))
    return 16 * sum(pieces) + gathered + grads
# CPU backend (fp32; cpu/model.c): what a layer keeps per mode, and the scratch.
cpu_products = R * (C + QD + KD + KD + QD + Hq + 2 * F)  # resid_mid, q/k raw, v, att, lse, gate, up
cpu_redo = R * (C + 1 + Hq + Hkv + QD + KD + C + 1 + F)    # attn_in, 1/rms, q/k 1/rms, q, k, mlp_in, 1/rms, act
cpu_layer = {"none": cpu_products + cpu_redo, "selective": cpu_products, "full": 0}
cpu_scratch = {"none": 0, "selective": cpu_redo, "full": cpu_products + cpu_redo}
cpu_stream = (L + 1) * R * C + R * C + R                   # layer inputs + output, final norm, 1/rms
cpu_work = 4 * (T * D + 2 * R + 3 * R * C + 2 * R * QD + 2 * R * KD + 3 * R * F + (2**24 // V) * V)
# GPU (bf16; train_gpt.cu's device_buffers), each buffer rounded to 256 bytes.
gpu_products = r256(4*R*C) + r256(2*R*QKV) + r256(2*R*QD) + r256(4*R*Hq) + r256(2*R*2*F)
gpu_redo = 2 * (r256(2*R*C) + r256(4*R)) + r256(2*R*(QD+KD)) + r256(4*R*(Hq+Hkv)) + r256(2*R*F)
gpu_layer = {"none": gpu_products + gpu_redo, "selective": gpu_products, "full": 0}
gpu_scratch = {"none": 0, "selective": gpu_redo, "full": gpu_products + gpu_redo}
gpu_stream = (L + 1) * r256(4*R*C) + r256(2*R*C) + r256(4*R)
ld, rows = V, max(1, min(R, 3 * 2**29 // (V * 2)))         # V is a multiple of 64 already
gpu_work = (2 * r256(4*T*D//2) + 6 * r256(4*R) + r256(4*(R+1))          # RoPE, inputs and positions
            + r256(4*R*C) + r256(2*R*C) + 2 * r256(4*R*C)                # backward: d_resid (+bf16), d_norm, d_final
            + r256(2*R*QD) + r256(2*R*QKV) + r256(2*R*F) + r256(2*R*2*F) + r256(4*R*Hq)
            + r256(4 * max(math.ceil(R/32) * C, math.ceil(R*Hq/256) * D))   # gain scratch (rmsnorm: chunks of 32 rows)
            + r256(2*rows*ld) + 2 * r256(4*R)                            # logits chunk (bf16, its gradient in place), ce, lse
            + 256 + r256(8*1024) + 256 + (32 << 20))                     # step scalars, norm partials, eval, matmul
def mode_bytes(mode, every, table, scratch):
    return sum(table[mode if l % every == 0 else "none"] for l in range(L)) + scratch[mode]
modes = [("none", "none", 1), ("selective", "selective", 1), ("full on 1 layer in 2", "full", 2), ("full", "full", 1)]
for label, mode, every in modes:
    ca = 4 * (cpu_stream + mode_bytes(mode, every, cpu_layer, cpu_scratch))
    ga = gpu_stream + mode_bytes(mode, every, gpu_layer, gpu_scratch)
    ct, gt = state(N, 4) + ca + cpu_work, state(N, 2) + ga + gpu_work
    card = 64 * 81082 // 80 * 2**20  # H100 64GB as a driver reports it: 64 GiB at the H100 80GB's 81082/81920 (llmc/device.c)
    fits = "fits" if gt + 2 * G <= card else "does not fit"
    group = next((str(n) for n in range(1, 1025) if state(n, 2) + ga + gpu_work + 2 * G <= card), "none up to 1024")
    print("%s|%.2f|%.2f|%.2f|%.2f|%s|%s" % (label, ca / G, ct / G, ga / G, gt / G, fits, group))
PY
}
# printed_rows PLAN_FILE: the same from the plan's table (a build with the CUDA model)
printed_rows() {
    sed -n 's/^train_gpt |   \(none\|selective\|full on 1 layer in 2\|full\)  *\([0-9.]*\)  *\([0-9.]*\)  *\([0-9.]*\)  *\([0-9.]*\)   \(fits\|does not fit\); \(.*\)$/\1|\2|\3|\4|\5|\6|\7/p' "$1"
}
# printed_cpu_rows PLAN_FILE: "label|cpu act|cpu total" in every build ('-' in the GPU columns
# without the CUDA model)
printed_cpu_rows() {
    sed -n 's/^train_gpt |   \(none\|selective\|full on 1 layer in 2\|full\)  *\([0-9.]*\)  *\([0-9.]*\)  .*$/\1|\2|\3/p' "$1"
}
for batch in 1 8; do
    "$TRAIN_GPT" plan configs/boom-14b.conf --world 40 --gpu h100-64gb --batch_size $batch >"$tmp/plan$batch.txt" 2>&1 ||
        { cat "$tmp/plan$batch.txt"; die "plan failed"; }
    hand_rows $batch 40 >"$tmp/hand$batch.txt"
    cut -d'|' -f1-3 "$tmp/hand$batch.txt" >"$tmp/hand_cpu$batch.txt"
    printed_cpu_rows "$tmp/plan$batch.txt" >"$tmp/printed_cpu$batch.txt"
    check "boom-14b at $batch x 4096, 40 ranks: every mode's CPU columns are the hand arithmetic (4 rows)" \
        sh -c "[ \$(wc -l <'$tmp/hand_cpu$batch.txt') -eq 4 ] && cmp -s '$tmp/hand_cpu$batch.txt' '$tmp/printed_cpu$batch.txt'"
    cmp -s "$tmp/hand_cpu$batch.txt" "$tmp/printed_cpu$batch.txt" || diff "$tmp/hand_cpu$batch.txt" "$tmp/printed_cpu$batch.txt" || true
    if ! grep -q "gpu: activ." "$tmp/plan$batch.txt" || grep -q "gpu: this build has no CUDA model" "$tmp/plan$batch.txt"; then
        say "  skip the GPU columns at $batch x 4096 (this build has no CUDA model)"
        continue
    fi
    printed_rows "$tmp/plan$batch.txt" >"$tmp/printed$batch.txt"
    say "  $batch x 4096, 40 ranks, GiB (mode|cpu activations|cpu total|gpu activations|gpu total|H100 64GB|smallest group):"
    sed 's/^/    /' "$tmp/printed$batch.txt"
    check "boom-14b at $batch x 4096, 40 ranks: every mode's row is the hand arithmetic" \
        cmp -s "$tmp/hand$batch.txt" "$tmp/printed$batch.txt"
    cmp -s "$tmp/hand$batch.txt" "$tmp/printed$batch.txt" || diff "$tmp/hand$batch.txt" "$tmp/printed$batch.txt" || true
done
if [ -s "$tmp/printed8.txt" ]; then
    check "8 x 4096 on 40 x H100 64GB: only full fits" \
        sh -c "[ \"\$(grep -c '|fits|' '$tmp/printed8.txt')\" -eq 1 ] && grep -q '^full|.*|fits|' '$tmp/printed8.txt'"
    check "8 x 4096: auto on an H100 64GB picks full" \
        grep -q 'recompute = auto on H100 64GB: full (' "$tmp/plan8.txt"
    check "1 x 4096: every mode fits, auto on an H100 64GB runs none" \
        sh -c "[ \"\$(grep -c '|fits|' '$tmp/printed1.txt')\" -eq 4 ] &&
               grep -q 'recompute = auto on H100 64GB: none (' '$tmp/plan1.txt'"
fi

# An H100 80GB reports 79.2 GiB (81082 to 81090 MiB): a run's budget there is 77.18 GiB, and plan's
# must be the same (it took the nominal 80 GiB: 78.00, and said none fits BOOM's 14B at 7 ranks,
# 77.50 GiB, where the run picks selective and refuses none).
"$TRAIN_GPT" plan configs/boom-14b.conf --world 7 --gpu h100-80gb >"$tmp/plan_h100.txt" 2>&1 ||
    { cat "$tmp/plan_h100.txt"; die "plan failed"; }
if grep -q "gpu: activ." "$tmp/plan_h100.txt" && ! grep -q "gpu: this build has no CUDA model" "$tmp/plan_h100.txt"; then
    check "plan --gpu h100-80gb at 7 ranks: the run's budget (79.18 - 2 GiB = 77.18), none (77.50 GiB) does not fit, auto picks selective" \
        sh -c "grep -q 'recompute = auto on H100 80GB: selective ([0-9.]* GiB per rank; fits 77.18 GiB)' '$tmp/plan_h100.txt' &&
               grep -q '^train_gpt |   none  .* 77.50   does not fit; 8\$' '$tmp/plan_h100.txt'"
fi

# ---------------------------------------------------------------- 2. DiLoCo's row
hand_diloco() {  # hand_diloco QUANT EF TRANSPORT FRAGMENTS DOWNLINK REPLICAS: the line's figures
    "$PYTHON" - "$@" <<'PY'
import math, sys
quant, ef, transport, P, downlink, M = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
V, L, C, Hq, Hkv, D, F, N = 128256, 40, 5120, 40, 8, 128, 17408, 40
layer = C + Hq*D*C + 2*Hkv*D*C + 2*D + C*Hq*D + C + 3*F*C
units = [V*C] + [layer]*L + [C + V*C]
pieces = [math.ceil(u / N) for u in units]
n = sum(pieces)
# Fragments of whole layers: boundary p at the layer start nearest p·numel/P (whole-model layout).
glob = [0] + [V*C + l*layer for l in range(1, L)] + [sum(units)]
loc = [0] + [pieces[0] + l*pieces[1] for l in range(1, L)] + [n]
first = [0]
for p in range(1, P):
    target = sum(units) * p / P
    best = first[-1] + 1
    for l in range(best, L - (P - p) + 1):
        if abs(glob[l] - target) < abs(glob[best] - target): best = l
    first.append(best)
first.append(L)
largest = max(loc[first[p+1]] - loc[first[p]] for p in range(P))
block = 128
segment = block * 2 * (2**17 // block)
def enc(kind, m):
    if kind == "none": return 4*m
    if kind == "bf16": return 2*m
    return math.ceil(m / block) * 4 + (m if kind == "int8" else (m + 1) // 2)
def segmented(kind, m): return (m // segment) * enc(kind, segment) + (enc(kind, m % segment) if m % segment else 0)
down = "none" if quant == "none" or downlink == "fp32" else "bf16" if downlink == "bf16" else quant
payload, mean = segmented(quant, largest), segmented(down, largest)
theta = momentum = delta = 4*n
residual = 4*n if ef and quant != "none" else 0
join = 456 + 8*n if transport == "tcp" else 0   # received by a joiner (header + θ + m); mpi never joins
if transport == "tcp":
    payload *= 2                       # diloco.c's and the transport's copy; one hub: the mean once
else:                                  # mpi: each replica reduces: downlink feedback on the segments
    sizes = [loc[first[p+1]] - loc[first[p]] for p in range(P)]   # it reduces (0, M, 2M, ... of each
    share = sum(math.ceil(math.ceil(f / segment) / M) * segment for f in sizes)   # fragment), one each
    mean += (4*share if down != "none" else 0) + M * enc(quant, segment) + enc(down, segment) + 4*segment
total = theta + momentum + delta + residual + join + payload + mean
G = 2**30
print("%.2f GiB = %.2f θ + %.2f momentum + %.2f Δ + %.2f residual + %.2f join state + %.2f payload + %.2f mean"
      % tuple(x / G for x in (total, theta, momentum, delta, residual, join, payload, mean)))
PY
}
diloco_line() {  # diloco_line [--key value]...: the plan's DiLoCo row at 40 ranks
    "$TRAIN_GPT" plan configs/boom-14b.conf --world 40 --diloco_replicas 2 --diloco_replica_id 0 "$@" 2>&1 |
        sed -n 's/.*diloco outer state (host memory, this rank.s pieces; in the cpu totals): //p'
}
got=$(diloco_line --diloco_rendezvous 127.0.0.1:9 --diloco_secret_file unused --diloco_quant int8 --diloco_error_feedback 1)
want=$(hand_diloco int8 1 tcp 1 same 2)
say "  DiLoCo int8 + error feedback, tcp: $got"
check "DiLoCo row, int8 + error feedback over tcp, 40 ranks: the hand arithmetic" test "$got" = "$want"
[ "$got" = "$want" ] || say "    hand: $want"
got=$(diloco_line --diloco_transport mpi --diloco_quant int4 --diloco_fragments 4 --diloco_downlink bf16)
want=$(hand_diloco int4 0 mpi 4 bf16 2)
say "  DiLoCo int4, 4 fragments, bf16 downlink, mpi: $got"
check "DiLoCo row, int4 in 4 fragments over mpi: the hand arithmetic" test "$got" = "$want"
[ "$got" = "$want" ] || say "    hand: $want"
# Over mpi each of M replicas reduces 1/M of the segments and keeps the downlink residual of
# those only: at M = 8 the row's mean term holds 4/8 B per value of residual, not 4.
got=$(diloco_line --diloco_transport mpi --diloco_quant int8 --diloco_replicas 8)
want=$(hand_diloco int8 0 mpi 1 same 8)
say "  DiLoCo int8, 8 replicas, mpi: $got"
check "DiLoCo row, int8 over mpi at 8 replicas (a 1/8 share of the downlink residual): the hand arithmetic" \
    test "$got" = "$want"
[ "$got" = "$want" ] || say "    hand: $want"
check "DiLoCo row counted in the cpu total, beside the gpu's" sh -c "
    '$TRAIN_GPT' plan configs/boom-14b.conf --world 40 --diloco_replicas 2 --diloco_replica_id 0 --diloco_transport mpi \
        2>&1 | grep -q 'cpu backend (fp32), recompute .* + [0-9.]* DiLoCo\$'"
check "no DiLoCo row without DiLoCo" sh -c "! grep -q 'diloco outer state' '$tmp/plan1.txt'"
# A joiner's state over tcp: every rank's 456-byte header + θ and m (8 B per value of its pieces,
# ⌈unit/40⌉ of every unit), all ranks together; 4 B without outer momentum. On a 100 Mbit/s
# link 116.2 GB take 2h34m56s; an inner phase of 10 steps at 40 % of 989 TFLOP/s (2,097,152
# tokens x 93.279 GFLOP per step and GPU: 494.6 s a step) is 1h22m26s. Through one hub the
# relay's catch-up lets the rounds go on: a sync every 4946 s, each mean (the replica's
# downlink bytes, 1 B a value + 4 per 128 + 96 per segment) 1199 s on the link, so
# ⌈9296.5 / (4946 − 1199)⌉ = 3 rounds close meanwhile. Through two hubs the same (the joiner's
# primary relays the state and the whole means); with a decay phase of 5 steps (2473 s),
# ⌈9296.5 / (2473 − 1199)⌉ = 8 rounds there. At H 100 no transfer outlasts the phase.
join_want=$("$PYTHON" -c "
import math
V, L, C, Hq, Hkv, D, F = 128256, 40, 5120, 40, 8, 128, 17408
layer = C + Hq*D*C + 2*Hkv*D*C + 2*D + C*Hq*D + C + 3*F*C
n = sum(math.ceil(u / 40) for u in [V*C] + [layer]*L + [C + V*C])   # one rank's pieces
S, block = 262144, 128
enc = lambda m: math.ceil(m / block) * 4 + m
down = 40 * ((n // S) * enc(S) + (enc(n % S) if n % S else 0) + math.ceil(n / S) * 96)
state = 40 * (456 + 8 * n)
inner = 10 * 2097152 * 93.279e9 / (0.4 * 989e12)
rounds = math.ceil(state / 12.5e6 / (inner - down / 12.5e6))
s = int(rounds * down / 12.5e6 + 0.5)
decay = math.ceil(40 * (456 + 4 * n) / 12.5e6 / (inner / 2 - down / 12.5e6))   # θ alone: plain averaging
d = int(decay * down / 12.5e6 + 0.5)
held = math.ceil(state / 12.5e6 / inner)   # the donor's unsent means at the end of the first pass
print(state, 40 * (456 + 4 * n), rounds, '%.3f' % (rounds * down / 1e9), '%dm%02ds' % (s // 60, s % 60),
      decay, '%.3f' % (decay * down / 1e9), '%dh%02dm' % (d // 3600, d % 3600 // 60),
      held, '%.3f' % (held * down / 1e9), '%.3f' % (held * down / 1e9 / 40))")
read -r join_bytes join_bytes_no_m join_rounds join_gb join_more decay_rounds decay_gb decay_more \
    held_rounds held_gb held_rank <<<"$join_want"
join_line() {  # join_line H MOMENTUM H_D RENDEZVOUS [KEYS]: the plan's line on a joiner's state at 40 ranks
    "$TRAIN_GPT" plan configs/boom-14b.conf --world 40 --diloco_replicas 2 --diloco_replica_id 0 \
        --diloco_rendezvous "$4" --diloco_secret_file unused --diloco_inner_steps "$1" \
        --diloco_outer_lr 0.7 --diloco_outer_momentum "$2" --diloco_decay_inner_steps "$3" --peak_tflops 989 "${@:5}" 2>&1 |
        grep 'joins late or rejoins'
}
one=127.0.0.1:9 two=127.0.0.1:9,127.0.0.1:10
join_line 10 0.9 0 "$one" >"$tmp/join10.txt"
join_line 10 0.9 0 "$two" >"$tmp/join10h.txt"
join_line 10 0.9 5 "$two" >"$tmp/join10d.txt"
join_line 10 0.9 5 "$one" --diloco_plain_in_decay 0 >"$tmp/join10dm.txt"
join_line 100 0.9 0 "$one" >"$tmp/join100.txt"
join_line 10 0 0 "$one" >"$tmp/join_no_m.txt"
say "  joiner's state, H 10, one hub: $(sed 's/.*diloco: //' "$tmp/join10.txt")"
check "a joiner's state over tcp at 40 ranks: 40 x 456 + 8 B/param bytes, 2h34m at 100 Mbit/s" \
    grep -q "(${join_bytes} bytes, every rank its pieces over its own connection), 2h34m on the link" "$tmp/join10.txt"
check "one hub, a transfer longer than the inner phase: catch-up, the means of $join_rounds rounds ($join_gb GB, $join_more)" \
    grep -q "does not hold the rounds for it: the joiner then takes the means of about $join_rounds round(s) closed meanwhile ($join_gb GB, $join_more more)" \
    "$tmp/join10.txt"
check "the donor holds its unsent means: those of the $held_rounds round(s) closed while the state went ($held_gb GB, $held_rank GB per rank)" \
    grep -q "; the donor holds the means it has not sent yet, at most those of about $held_rounds round(s) ($held_gb GB, $held_rank GB per rank; the joiner applies each as it comes)" \
    "$tmp/join10.txt"
check "two hubs: the same catch-up, through the joiner's primary hub" \
    grep -q "catch-up (its default; through the joiner's primary hub) does not hold the rounds for it: the joiner then takes the means of about $join_rounds round(s) closed meanwhile ($join_gb GB, $join_more more)" \
    "$tmp/join10h.txt"
check "two hubs, diloco_decay_inner_steps 5: in the decay phase θ alone (plain averaging keeps m at zero), the means of $decay_rounds rounds ($decay_gb GB, $decay_more)" \
    grep -q "; in the decay phase (phases of 41m1[23]s; θ alone, plain averaging keeping m at zero: [0-9.]* GB, 1h17m) about $decay_rounds round(s) ($decay_gb GB, $decay_more more);" \
    "$tmp/join10d.txt"
check "without plain averaging in the decay phase its state keeps m: the whole state's time there" \
    sh -c "grep -q '; in the decay phase (phases of 41m1[23]s) about [0-9]* round(s)' '$tmp/join10dm.txt' &&
           ! grep -q 'θ alone' '$tmp/join10dm.txt'"
check "the hub's link carries the transfer too: one hub, and the joiner's primary of two" \
    sh -c "grep -q '; the hub relays it, a replica link.s rate more each way on the hub.s link while it lasts\$' '$tmp/join10.txt' &&
           grep -q '; the joiner.s primary hub relays it, a replica link.s rate more each way on that hub.s link while it lasts\$' '$tmp/join10d.txt' &&
           grep -q 'the group does not wait; the hub relays it' '$tmp/join100.txt'"
join_line 20 0 0 "$one" --diloco_fragments 4 --diloco_overlap_steps 1 >"$tmp/join20p4.txt"
check "4 fragments, a state shorter than the inner phase but longer than a sync interval: the means of the fragment rounds meanwhile, held by the donor" \
    sh -c "grep -q 'the group does not wait (the joiner then takes the means of about [0-9]* fragment round(s) closed meanwhile, [0-9.]* GB)' '$tmp/join20p4.txt' &&
           grep -q 'the donor holds the means it has not sent yet' '$tmp/join20p4.txt'"
check "a transfer shorter than the inner phase (H 100): the group does not wait" \
    grep -q "the group does not wait" "$tmp/join100.txt"
check "without outer momentum the state is θ alone: 40 x 456 + 4 B/param" \
    grep -q "θ (no outer momentum) in fp32: [0-9.]* GB (${join_bytes_no_m} bytes" "$tmp/join_no_m.txt"
check "no joiner's line over mpi (its replicas never join late)" sh -c "
    ! '$TRAIN_GPT' plan configs/boom-14b.conf --world 40 --diloco_replicas 2 --diloco_replica_id 0 \
        --diloco_transport mpi 2>&1 | grep -q 'joins late or rejoins'"
# A hub host's load: BOOM's 14B, int8, one hub, in replicas of 40 ranks at M = 10 and 72, and
# of one rank at M = 72. A replica sends per rank its pieces' segments (int8: 4 B of scale per
# 128 values + 1 B a value, 96 bytes of framing a segment, a 128-byte CONTRIBUTE); the hub host
# takes M of those at 0.2 GB per core-second, spread over one hub thread per rank (`relay
# --shards`); it holds 4 B of downlink residual per value and, per thread, M contributors' 16 + 1
# segments and 8 of the mean. A replica's exchange takes its upload's time at 100 Mbit/s; a
# thread slower than that sets the pace (one for a whole 14B model at M = 72: 5 hubs keep up).
hub_want=$("$PYTHON" - <<'PY'
import math
V, L, C, Hq, Hkv, D, F = 128256, 40, 5120, 40, 8, 128, 17408
layer = C + Hq*D*C + 2*Hkv*D*C + 2*D + C*Hq*D + C + 3*F*C
S, block = 262144, 128
enc = lambda m: math.ceil(m / block) * 4 + m
def dur(x):
    s = int(x + 0.5)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60) if s >= 3600 else "%dm%02ds" % (s // 60, s % 60) if s >= 60 else "%ds" % s
def gib(x): return "%.2f GiB" % (x / 2**30) if x >= 2**30 else "%.2f MiB" % (x / 2**20)
for W, M in ((40, 10), (40, 72), (1, 72)):
    n = sum(math.ceil(u / W) for u in [V*C] + [layer]*L + [C + V*C])   # one rank's pieces
    segmented = (n // S) * enc(S) + (enc(n % S) if n % S else 0)
    up = W * (segmented + math.ceil(n / S) * 96 + 128)                 # one replica, all its ranks
    link = up / 12.5e6
    cpu = M * up / 0.2e9
    resid, flight = 4 * W * n, W * (M * 17 * enc(S) + 8 * enc(S))
    verdict = ("the links (%s) set the exchange's pace" % dur(link) if cpu / W <= link else
               "a thread is slower than the links (%s): the exchange takes its time; %d hubs would keep up"
               % (dur(link), math.ceil(cpu / W / link)))
    print("about %s of CPU per outer step at the measured 0.2 GB of contributions per core-second (%s per thread); "
          "memory about %s (%s downlink residual + %s of segments on their way); %s"
          % (dur(cpu), dur(cpu / W), gib(resid + flight), gib(resid), gib(flight), verdict))
PY
)
hub_line() {  # hub_line RANKS M: the plan's hub line, BOOM's 14B, int8, one hub
    "$TRAIN_GPT" plan configs/boom-14b.conf --world "$1" --diloco_replicas "$2" --diloco_replica_id 0 \
        --diloco_rendezvous 127.0.0.1:9 --diloco_secret_file unused --diloco_quant int8 2>&1 |
        sed -n 's/.*diloco: each of 1 hub host(s) runs `relay\( --shards 40` (a thread per rank of a replica, ports p .. p + 39)\|` (one thread)\): //p'
}
i=0
for case in "40 10" "40 72" "1 72"; do
    i=$((i + 1))
    got=$(hub_line $case) want=$(echo "$hub_want" | sed -n ${i}p)
    say "  hub host, ranks and M = $case: $got"
    check "a hub host's CPU, memory and pace, ranks and M = $case: the hand arithmetic" test "$got" = "$want"
    [ "$got" = "$want" ] || say "    hand: $want"
done
# diloco_decay_inner_steps: gpt-1b's 20,000 steps at H 500 are 40 outer steps; with H_d 100 in
# its decay phase (decay_frac 0.2: from step 16,000), 32 + 40 = 72.
check "DiLoCo with H_d 100 in the decay: 72 outer steps instead of 40 (1.80x the bytes)" sh -c "
    '$TRAIN_GPT' plan configs/gpt-1b.conf --diloco_replicas 4 --diloco_transport local --diloco_decay_inner_steps 100 \
        2>&1 | grep -q 'every 100 inner steps from step 16000 (the decay phase): 72 outer steps in the run instead of 40 (1.80× the bytes)'"

# ---------------------------------------------------------------- 3. recompute = auto in runs
"$TOOL" shard "$tmp/train.bin" 64 0 200000 11
model=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --n_layer 8 --d_model 128 --d_ff 384 --seq_len 128
    --max_steps 2 --warmup_steps 1 --ckpt_every 0 --threads 1)
"$TRAIN_GPT" plan "${model[@]}" >"$tmp/small.txt" 2>&1 || { cat "$tmp/small.txt"; die "plan failed"; }
cpu_total() { sed -n "s/^train_gpt |   $1  *[0-9.]*  *\([0-9.]*\) .*/\1/p" "$tmp/small.txt"; }
none=$(cpu_total none) sel=$(cpu_total selective) every2=$(cpu_total "full on 1 layer in 2") full=$(cpu_total full)
say "  8-layer model, cpu totals (MiB): none $none, selective $sel, full on 1 layer in 2 $every2, full $full"
# Budgets between the modes' totals: each picks the first that fits in auto's order (none,
# selective, full on fewer layers first, full). The model is sized so that whole MiB fall between
# them and full on every 2nd layer needs less than selective (checked here first).
read -r b_none b_sel b_every2 b_full b_refuse < <("$PYTHON" -c "
import math
n, s, e, f = $none, $sel, $every2, $full
assert e < s < n and f < e and math.ceil(s) < n and e <= math.floor(s) < s and math.floor(f) < f, (n, s, e, f)
print(math.ceil(n), math.ceil(s), math.floor(s), math.ceil(f), math.floor(f))")
auto_run() {  # auto_run NAME NP [--key value]...: a run; its log in $tmp/NAME.log
    local name=$1 np=$2; shift 2
    local launch=("$TRAIN_GPT")
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" "$np" "$TRAIN_GPT")
    "${launch[@]}" "${model[@]}" --out_dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1
}
# within10 LOG: the first-step line's measured activations within 10 % of the plan
within10() {
    "$PYTHON" - "$1" <<'PY'
import re, sys
m = re.search(r"activations ([0-9.]+) at most \(planned ([0-9.]+), recompute ([^)]*)\)", open(sys.argv[1]).read())
if not m: sys.exit(1)
measured, planned = float(m.group(1)), float(m.group(2))
print("    %s: activations measured %.3f, planned %.3f (%+.2f %%)" % (m.group(3), measured, planned, 100 * (measured - planned) / planned))
sys.exit(0 if abs(measured - planned) <= 0.1 * planned else 1)
PY
}
chose() { grep -q "recompute = auto: $2, the least recomputation whose plan fits memory_budget_mb" "$tmp/$1.log"; }
detect_mpi
for case in "none $b_none" "selective $b_sel" "full on 1 layer in 2 $b_every2" "full $b_full"; do
    budget=${case##* } mode=${case% *}
    auto_run "auto$budget" 1 --memory_budget_mb "$budget" || cat "$tmp/auto$budget.log"
    check "auto, memory_budget_mb $budget: $mode" chose "auto$budget" "$mode"
    check "auto ($mode): measured activations within 10 % of the plan" within10 "$tmp/auto$budget.log"
done
rc=0; auto_run refuse 1 --memory_budget_mb "$b_refuse" || rc=$?
check "auto, memory_budget_mb $b_refuse (below full): refused in one line (rc $rc)" sh -c "[ $rc -eq 1 ] &&
    [ \$(grep -c 'error: recompute = auto: no mode fits memory_budget_mb = $b_refuse' '$tmp/refuse.log') -eq 1 ] &&
    [ \$(grep -c 'error:' '$tmp/refuse.log') -eq 1 ]"
auto_run default 1 || cat "$tmp/default.log"
check "auto without a budget: none, within this machine's memory" \
    grep -q "recompute = auto: none, the least recomputation whose plan fits this machine's memory\|the cgroup's memory limit" \
    "$tmp/default.log"
explicit_ok() { ! grep -q 'recompute = auto' "$1" && within10 "$1"; }
for mode in none selective full; do
    auto_run "explicit_$mode" 1 --recompute $mode || cat "$tmp/explicit_$mode.log"
    check "recompute $mode: no auto line; measured activations within 10 % of the plan" \
        explicit_ok "$tmp/explicit_$mode.log"
done
# A mode set by hand past the budget: refused in one line (it ran on; on a real model the CPU
# backend's allocation took the node's memory and the kernel killed the run without a word).
rc=0; auto_run explicit_over 1 --recompute none --memory_budget_mb "$b_sel" || rc=$?
check "recompute none, memory_budget_mb $b_sel (below none's plan): refused in one line (rc $rc)" sh -c "[ $rc -eq 1 ] &&
    [ \$(grep -c 'error: recompute = none: its plan needs .* per rank, more than memory_budget_mb = $b_sel' '$tmp/explicit_over.log') -eq 1 ] &&
    [ \$(grep -c 'error:' '$tmp/explicit_over.log') -eq 1 ]"
auto_run explicit_within 1 --recompute full --memory_budget_mb "$b_full" || cat "$tmp/explicit_within.log"
check "recompute full, memory_budget_mb $b_full (its plan fits): runs" explicit_ok "$tmp/explicit_within.log"
auto_run explicit_every2 1 --recompute full --recompute_layers 2 || cat "$tmp/explicit_every2.log"
check "recompute full on every 2nd layer: measured activations within 10 % of the plan" \
    explicit_ok "$tmp/explicit_every2.log"
if [ "$HAVE_MPI" = 1 ]; then
    chose_np2() {  # rank 0 says what it chose (the others print no notes; they plan the same)
        grep -q 'rank 0: recompute = auto: selective, ' "$1" && within10 "$1"
    }
    auto_run np2 2 --memory_budget_mb "$b_sel" || cat "$tmp/np2.log"
    check "np 2, auto, memory_budget_mb $b_sel: selective (pieces halve, gathered units come), measured within 10 %" \
        chose_np2 "$tmp/np2.log"
else
    say "  skip np 2 (no MPI in this build)"
fi

# diloco_transport = local: M replicas share the process; a run divides its budget by M and holds
# the outer state once (θ, m, Δ; M payloads and, with error feedback, M residuals; the reducer's
# mean, a segment of scratch and its downlink residual), 1/M of it in each replica's plan. plan
# must choose as the run does (it divided nothing and counted no outer state: none at 120 MiB,
# where the run chose selective).
local_keys=(--diloco_replicas 2 --diloco_transport local --diloco_inner_steps 1 --memory_budget_mb 120)
"$TRAIN_GPT" plan "${model[@]}" "${local_keys[@]}" >"$tmp/local_plan.txt" 2>&1 || cat "$tmp/local_plan.txt"
auto_run local 1 "${local_keys[@]}" || cat "$tmp/local.log"
plan_pick=$(sed -n 's/^train_gpt |   recompute = auto on the cpu backend: \(.*\) (\([0-9.]* MiB\) per rank; fits memory_budget_mb, \/ 2 replicas in this process = 60.00 MiB)$/\1, \2/p' "$tmp/local_plan.txt")
run_pick=$(sed -n 's/.*recompute = auto: \(.*\), the least recomputation whose plan fits memory_budget_mb, \/ 2 replicas in this process = 60.00 MiB: \([0-9.]* MiB\) per rank.*/\1, \2/p' "$tmp/local.log")
say "  diloco_transport = local, 2 replicas, memory_budget_mb 120: plan picks '$plan_pick', the run '$run_pick'"
check "diloco_transport = local, 2 replicas, 120 MiB: plan's auto choice and per-replica plan are the run's" \
    test -n "$plan_pick" -a "$plan_pick" = "$run_pick"
# The process's outer state by hand from θ (4 B a value, n values): with error feedback (int8)
# 2 residuals of 4n, 2 payloads of n·(1 + 4/128), the mean n·(1 + 4/128) + a segment of fp32
# (1 MiB) + the downlink residual 4n; each replica's cpu total holds half of it.
"$TRAIN_GPT" plan "${model[@]}" "${local_keys[@]}" --diloco_error_feedback 1 >"$tmp/local_ef.txt" 2>&1 || cat "$tmp/local_ef.txt"
check "diloco_transport = local: the process's outer state (12 + 4·M·ef + 4 + (M + 1)·b_up B/param + a segment), half in each replica's total" \
    "$PYTHON" - "$tmp/local_ef.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
row = re.search(r"diloco outer state \(host memory, this process's, shared by its 2 replicas; 1/2 in each replica's cpu "
                r"totals\): ([0-9.]+) MiB = ([0-9.]+) θ \+ ([0-9.]+) momentum \+ ([0-9.]+) Δ \+ ([0-9.]+) residual \+ "
                r"([0-9.]+) join state \+ ([0-9.]+) payload \+ ([0-9.]+) mean", text)
share = re.search(r"cpu backend \(fp32\), recompute .* \+ ([0-9.]+) DiLoCo$", text, re.M)
total, theta, m, delta, resid, join, payload, mean = map(float, row.groups())
b = theta / 4 * (1 + 4 / 128)          # n values in int8, MiB
want = (theta, theta, 2 * theta, 0.0, 2 * b, b + 1.0 + theta)
got = (m, delta, resid, join, payload, mean)
ok = all(abs(g - w) <= 0.02 for g, w in zip(got, want)) and abs(float(share.group(1)) - total / 2) <= 0.01
print("    outer state %.2f MiB: got %s, hand %s" % (total, got, tuple(round(w, 2) for w in want)))
sys.exit(0 if ok else 1)
PY

# ---------------------------------------------------------------- 4. bad input
fails_with() {  # fails_with PATTERN [--key value]...: exit 1, one line on stderr naming PATTERN
    local pattern=$1 rc=0; shift
    "$TRAIN_GPT" "${model[@]}" --out_dir "$tmp/bad" "$@" >"$tmp/bad.out" 2>"$tmp/bad.err" || rc=$?
    [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q "$pattern" "$tmp/bad.err"
}
check "memory_budget_mb -1: refused in one line" fails_with "memory_budget_mb" --memory_budget_mb -1
check "recompute_layers 2 with auto: refused in one line" fails_with "cannot be combined with recompute = auto" \
    --recompute_layers 2
check "recompute = some: refused naming the choices" fails_with "expected one of auto|none|selective|full" \
    --recompute some
plan_fails_with() {  # plan_fails_with PATTERN ARGS...: `plan ARGS` exits 1 with one line naming PATTERN
    local pattern=$1 rc=0; shift
    "$TRAIN_GPT" plan "$@" >"$tmp/bad.out" 2>"$tmp/bad.err" || rc=$?
    [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q -- "$pattern" "$tmp/bad.err"
}
check "plan --link_mbps 1e-300: refused in one line (it printed a 300-digit ratio)" \
    plan_fails_with "--link_mbps" configs/boom-14b.conf --link_mbps 1e-300
# The batch line counts the --world processes, as the DiLoCo line's tokens a step and a run do
# (it said 1 process).
"$TRAIN_GPT" plan configs/boom-14b.conf --world 40 --diloco_replicas 2 --diloco_transport mpi --peak_tflops 989 \
    >"$tmp/world.txt" 2>&1 || true
check "plan --world 40: the batch line's tokens per step = the DiLoCo line's (x 40 processes)" sh -c "
    grep -q 'x 40 process(es) = 83886080 tokens/step' '$tmp/world.txt' && grep -q '(83886080 tokens a step)' '$tmp/world.txt'"
# A config through a pipe (`<(...)`) reads as the file does (it was refused as a directory).
check "plan of a config through a pipe: read" bash -c "'$TRAIN_GPT' plan <(cat configs/tiny.conf) | grep -q 'model: 4 layers'"
# ---------------------------------------------------------------- 5. the recipes in docs/diloco.md
# recipe NAME: the `./train_gpt plan` command of the fenced block before the marker
# "<!-- recipe-output: NAME -->" (continuation lines joined) to $tmp/recipe_NAME.cmd, and
# the quoted lines of the fenced block after it to $tmp/recipe_NAME.quoted.
recipe() {
    "$PYTHON" - "$1" "$tmp" <<'PY'
import re, sys
name, tmp = sys.argv[1], sys.argv[2]
doc = open("docs/diloco.md").read()
at = doc.index("<!-- recipe-output: %s -->" % name)
before = doc[:at].rsplit("```", 2)[1]           # the block that ends just before the marker
after = doc[at:].split("```", 2)[1]             # the block that follows it
command = re.sub(r"\\\n\s*", " ", before.strip())
assert command.startswith("./train_gpt plan "), command
open("%s/recipe_%s.cmd" % (tmp, name), "w").write(command[len("./train_gpt plan "):] + "\n")
open("%s/recipe_%s.quoted" % (tmp, name), "w").write(after.strip() + "\n")
PY
}
for name in boom 72; do
    recipe "$name"
    read -ra args <"$tmp/recipe_$name.cmd"
    "$TRAIN_GPT" plan "${args[@]}" >"$tmp/recipe_$name.out" 2>&1 || true
    cuda_model=1
    grep -q "gpu: this build has no CUDA model" "$tmp/recipe_$name.out" && cuda_model=0
    missing=0 quoted=0
    while IFS= read -r line; do
        case "$line" in *"H100 64GB"*|*"GH200"*) [ $cuda_model = 1 ] || continue ;; esac
        quoted=$((quoted + 1))
        grep -qxF -- "$line" "$tmp/recipe_$name.out" || { missing=$((missing + 1)); say "  not printed: $line"; }
    done <"$tmp/recipe_$name.quoted"
    check "recipe $name in docs/diloco.md: plan prints all $quoted quoted lines ($missing differ)" \
        test "$quoted" -ge 5 -a "$missing" -eq 0
done

finish test_plan
