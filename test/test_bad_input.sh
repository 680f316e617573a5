# Bad input never crashes and never destroys anything: each case must exit non-zero with
# exactly one "train_gpt: error:" line that names the problem, no crash signature, and
# (where files are involved) leave every file as it was. Also the outlier guard: a NaN
# gradient skips one update; max_bad_steps NaNs in a row stop the run with only finite
# weights in its checkpoints.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$TOOL" shard "$tmp/train.bin" 64 0 20000 21
base=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 4 --log_every 100)

expect_error() {  # expect_error DESCRIPTION PATTERN COMMAND...
    local what=$1 pattern=$2; shift 2
    local rc=0
    "$@" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
    local errors
    errors=$(grep -c '^train_gpt: error:' "$tmp/err.txt" || true)
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$errors" -eq 1 ] && grep -q -- "$pattern" "$tmp/err.txt" &&
        ! grep -qiE 'segmentation|assert|core dumped|internal error' "$tmp/err.txt"; then
        say "  ok   $what: $(grep '^train_gpt: error:' "$tmp/err.txt")"
    else
        say "  FAIL $what (rc $rc, $errors error lines):"; sed 's/^/       /' "$tmp/err.txt"
        TESTS_FAILED=$((TESTS_FAILED + 1))
    fi
}

# --- configuration
printf 'vocab_size = 64\nfoo = 1\n' >"$tmp/unknown.conf"
expect_error "unknown key in a file (names file:line)" "unknown.conf:2: unknown key 'foo'" "$TRAIN_GPT" "$tmp/unknown.conf"
expect_error "unknown key on the command line" "\-\-nope: unknown key" "$TRAIN_GPT" "${base[@]}" --nope 3
expect_error "malformed number" "lr: expected a number, got 'fast'" "$TRAIN_GPT" "${base[@]}" --lr fast
expect_error "malformed integer" "n_layer: expected an integer, got '2x'" "$TRAIN_GPT" "${base[@]}" --n_layer 2x
expect_error "out-of-range value" "batch_size: expected an integer in" "$TRAIN_GPT" "${base[@]}" --batch_size 0
expect_error "bad choice" "decay_shape: expected one of linear|sqrt" "$TRAIN_GPT" "${base[@]}" --decay_shape cosine
expect_error "GQA divisibility" "n_kv_head: n_head (4) must be a multiple of n_kv_head (3)" "$TRAIN_GPT" "${base[@]}" --n_kv_head 3
expect_error "odd head_dim" "head_dim: must be even" "$TRAIN_GPT" "${base[@]}" --head_dim 7
expect_error "missing required key" "missing required key 'lr'" "$TRAIN_GPT" --vocab_size 64 --n_layer 1 --d_model 8 \
    --n_head 2 --d_ff 8 --seq_len 8 --batch_size 1 --max_steps 1 --train_data x
printf 'lr = 1\nlr = 2\n' >"$tmp/dup.conf"
expect_error "key set twice in a file" "dup.conf:2: lr is set twice (first at line 1)" "$TRAIN_GPT" "$tmp/dup.conf"
printf 'sample_prompt = "say "hi""\n' >"$tmp/quote.conf"
expect_error "a quote inside a quoted value (names the key)" "quote.conf:1: sample_prompt: text after the closing quote" "$TRAIN_GPT" "$tmp/quote.conf"
printf 'sample_prompt = "abc\n' >"$tmp/open.conf"
expect_error "an unterminated quoted value (names the key)" "open.conf:1: sample_prompt: unterminated quoted value" "$TRAIN_GPT" "$tmp/open.conf"
expect_error "adam_eps 0 (a 0/0 in AdamW)" "adam_eps: expected a number in \[1e-30, 1\]" "$TRAIN_GPT" "${base[@]}" --adam_eps 0
expect_error "a rule about a key left at its default" "error: head_dim (the default): d_model (63) is not divisible by n_head (4)" \
    "$TRAIN_GPT" plan "${base[@]}" --d_model 63
# The warm-up ends by the decay phase's start, max_steps - round(decay_frac x max_steps): one past
# it climbed to the peak inside the decay and dropped onto its line in one step (warmup 9 of 10
# at decay_frac 0.5: lr 3.0e-3 at step 8, 8.4e-4 at step 9), or never decayed (warmup_steps =
# max_steps). A --max_steps lowered for a short test is the key named, with the fix: a file's
# warmup_steps line alone said nothing of the override that broke it.
expect_error "warmup_steps running into the decay phase" \
    "\-\-warmup_steps: 9 runs into the decay phase, which starts at step 5 (max_steps 10 - round(decay_frac 0.5 x 10))" \
    "$TRAIN_GPT" plan "${base[@]}" --max_steps 10 --warmup_steps 9 --decay_frac 0.5
expect_error "warmup_steps = max_steps (the run never decays)" "\-\-warmup_steps: 20 runs into the decay phase, which starts at step 16" \
    "$TRAIN_GPT" plan "${base[@]}" --max_steps 20 --warmup_steps 20
sed 's/^warmup_steps = 3$/warmup_steps = 17/' test/configs/tiny_test.conf >"$tmp/warm.conf"
expect_error "a file's warmup_steps past its decay start (names file:line)" \
    "warm.conf:15: warmup_steps: 17 runs into the decay phase, which starts at step 16 .*at most 16" \
    "$TRAIN_GPT" plan "$tmp/warm.conf" --train_data x
expect_error "--max_steps below the file's warmup_steps: names --max_steps and says to lower warmup_steps" \
    "\-\-max_steps: 2 is less than warmup_steps 3 (test/configs/tiny_test.conf:15): lower warmup_steps too" \
    "$TRAIN_GPT" plan "${base[@]}" --max_steps 2
expect_error "--max_steps that moves the decay start before the file's warm-up ends: names --max_steps" \
    "\-\-max_steps: 3 puts the decay phase's start at step 2 .*before warmup_steps 3 (test/configs/tiny_test.conf:15) ends: lower warmup_steps too" \
    "$TRAIN_GPT" plan "${base[@]}" --max_steps 3
check "a warm-up that ends at the decay start, and one of max_steps without a decay phase, are accepted" sh -c \
    "'$TRAIN_GPT' plan ${base[*]} --max_steps 20 --warmup_steps 16 >/dev/null 2>&1 &&
     '$TRAIN_GPT' plan ${base[*]} --max_steps 20 --warmup_steps 20 --decay_frac 0 >/dev/null 2>&1"
expect_error "a line break in a command-line value (the config a checkpoint saves is one value per line)" \
    "\-\-sample_prompt: a value cannot hold a line break" "$TRAIN_GPT" plan "${base[@]}" --sample_prompt "$(printf 'say\nhi')"
expect_error "an integer with a '+'" "\-\-n_layer: expected an integer, got '+2'" "$TRAIN_GPT" plan "${base[@]}" --n_layer +2
expect_error "an integer after a blank" "\-\-n_layer: expected an integer, got ' 2'" "$TRAIN_GPT" plan "${base[@]}" --n_layer " 2"
# Numbers as integers are: decimal, no '+', no leading blank, no hex float (strtod took all
# three); a subnormal is a number (it was "expected a number, got '1e-310'").
expect_error "a number with a '+'" "\-\-lr: expected a number, got '+1e-3'" "$TRAIN_GPT" plan "${base[@]}" --lr +1e-3
expect_error "a number after a blank" "\-\-lr: expected a number, got ' 1e-3'" "$TRAIN_GPT" plan "${base[@]}" --lr " 1e-3"
expect_error "a hex float" "\-\-lr: expected a number, got '0x1p-10'" "$TRAIN_GPT" plan "${base[@]}" --lr 0x1p-10
"$TRAIN_GPT" plan "${base[@]}" --norm_eps 1e-310 --lr .5 >/dev/null 2>"$tmp/sub.err" || true
check "a subnormal norm_eps and lr .5 are numbers" sh -c "! grep -q error '$tmp/sub.err'"
check "leading zeros are decimal: n_layer 010 is 10 layers" sh -c \
    "'$TRAIN_GPT' plan test/configs/tiny_test.conf --train_data x --n_layer 010 2>/dev/null | grep -q 'model: 10 layers'"
{ printf '\357\273\277'; cat test/configs/tiny_test.conf; } >"$tmp/bom.conf"
check "a config file that starts with a UTF-8 byte order mark" sh -c \
    "'$TRAIN_GPT' plan '$tmp/bom.conf' --train_data x 2>/dev/null | grep -q 'model: 2 layers, d_model 64'"
printf 'just some words\n' >"$tmp/garbage.conf"
expect_error "line without '='" "garbage.conf:1: expected 'key = value'" "$TRAIN_GPT" "$tmp/garbage.conf"
expect_error "missing config file" "cannot read config file '$tmp/nothere.conf'" "$TRAIN_GPT" "$tmp/nothere.conf"
# A mistyped path given as the config: a shard, a checkpoint's weights, a huge file (read whole
# it cost its size in memory, 1.75 GB for a 1.5 GB shard; at 100 GB "out of memory" naming no
# file). Sparse files: nothing is written to disk.
expect_error "a token shard as the config" "train.bin: 40088 bytes: not a config file (a train_gpt token shard" \
    "$TRAIN_GPT" "$tmp/train.bin"
"$PYTHON" -c 'import sys; open(sys.argv[1], "wb").write((2).to_bytes(8, "little") + b"{}")' "$tmp/w.safetensors"
expect_error "a safetensors file as the config" "w.safetensors: 10 bytes: not a config file (a safetensors file)" \
    "$TRAIN_GPT" "$tmp/w.safetensors"
truncate -s 17M "$tmp/big.conf"
expect_error "a 17 MiB config" "big.conf: 17825792 bytes: not a config file (a config file has at most 16 MiB)" \
    "$TRAIN_GPT" "$tmp/big.conf"
truncate -s 100G "$tmp/huge.conf"
expect_error "a 100 GB config" "huge.conf: 107374182400 bytes: not a config file" "$TRAIN_GPT" "$tmp/huge.conf"
rm -f "$tmp/big.conf" "$tmp/huge.conf"
# The device on this machine, as train_gpt.cu's probe sees it. Without a usable GPU (CI: a
# CUDA build and no driver, or a CPU-only build) cuda is an error naming the cause and the
# fix, and auto trains on the CPU with a notice saying why; on a GPU machine both take it.
"$TRAIN_GPT" "${base[@]}" --device auto --max_steps 1 --warmup_steps 0 --out_dir "$tmp/auto" >"$tmp/auto.log" 2>&1
if grep -q "device = auto: GPU 0 is" "$tmp/auto.log"; then
    say "  ok   device = auto takes this machine's GPU: $(grep -o 'GPU 0 is.*' "$tmp/auto.log" | head -n 1)"
else
    reason="this build has no CUDA backend\|the CUDA runtime reports error\|no CUDA device\|compute capability\|no kernels for GPU 0"
    check "device = auto without a usable GPU: trains on the CPU, with the probe's reason" \
        grep -q "device = auto: no usable GPU (\($reason\).*training on the CPU" "$tmp/auto.log"
    expect_error "device = cuda without a usable GPU" "device: cuda was asked for, but \($reason\).*set device = cpu or auto" \
        "$TRAIN_GPT" "${base[@]}" --device cuda
fi
expect_error "init_from a missing file" "init_from: no such file" "$TRAIN_GPT" "${base[@]}" --init_from "$tmp/none.safetensors"

# Keys each in range whose products are not (the planner overflowed int64 and printed a
# negative size; a 10¹⁶-parameter model made it plan for minutes).
expect_error "a micro-batch beyond 2^48 activation values" "would hold 2.77e+19 activation values" \
    "$TRAIN_GPT" plan "${base[@]}" --batch_size 1048576 --seq_len 4194304 --d_model 1048576 --head_dim 2
expect_error "a model beyond 2^44 parameters" "the model would have 1.69e+16 parameters" \
    "$TRAIN_GPT" plan "${base[@]}" --n_layer 1024 --d_model 1048576 --d_ff 4194304
# Tokens per step wrapped int64 to "= 0 tokens/step"; a run's tokens passed tokens_seen's 2^53.
small=(--d_model 1 --head_dim 2 --n_head 1 --n_kv_head 1 --d_ff 1 --vocab_size 2 --doc_token 0 --n_layer 1)
expect_error "a step beyond 2^40 tokens" "batch_size: 1048576 x 4194304 tokens x 1048576 grad_accum = 4.61e+18 tokens per step" \
    "$TRAIN_GPT" plan "${base[@]}" "${small[@]}" --batch_size 1048576 --seq_len 4194304 --grad_accum 1048576 --world 4 \
    --max_steps 100
expect_error "... counting the processes" "1024 x 32 tokens x 1048576 grad_accum x 1048576 processes = 3.6e+16 tokens" \
    "$TRAIN_GPT" plan "${base[@]}" --batch_size 1024 --grad_accum 1048576 --world 1048576
expect_error "a run beyond 2^53 tokens" "max_steps: 1000000000000 steps of 3.36e+07 tokens = 3.36e+19 tokens: more than 2^53" \
    "$TRAIN_GPT" plan "${base[@]}" --batch_size 1024 --grad_accum 1024 --max_steps 1000000000000

# diloco_transport = local simulates the replicas in one process: sharding keys are refused (the
# run trained unsharded, saying nothing; plan planned an FSDP split).
expect_error "fsdp_size with diloco_transport = local" "fsdp_size: 4: diloco_transport = local simulates the replicas" \
    "$TRAIN_GPT" "${base[@]}" --fsdp_size 4 --diloco_replicas 3 --diloco_transport local --out_dir "$tmp/o_local"
expect_error "plan --world 4 with diloco_transport = local" "plan: --world 4: diloco_transport = local simulates" \
    "$TRAIN_GPT" plan "${base[@]}" --world 4 --diloco_replicas 3 --diloco_transport local

# --- subcommands' own flags: strict numbers, in range
expect_error "diloco-tune --replicas 4x" "diloco-tune: --replicas: expected an integer in \[2, 256\], got '4x'" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4x --inner_steps 10
expect_error "diloco-tune --inner_steps 1e9" "diloco-tune: --inner_steps: expected an integer in \[1, 1000000\], got '1e9'" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4 --inner_steps 1e9
expect_error "diloco-tune --proxy yes" "diloco-tune: --proxy: expected an integer in \[0, 1\], got 'yes'" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4 --inner_steps 10 --proxy yes
expect_error "diloco-tune --outer_lr 0.7,1,0.7 (two runs in one folder)" "diloco-tune: --outer_lr: 0.7 is listed twice in '0.7,1,0.7'" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4 --inner_steps 10 --outer_lr 0.7,1,0.7
expect_error "diloco-tune --rounds=1 (its flags take --flag=value too)" "diloco-tune: --rounds: expected an integer in \[2, 1000\], got '1'" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4 --inner_steps 10 --rounds=1
expect_error "diloco-tune ... --inner_steps (no value)" "diloco-tune: --inner_steps needs a value" \
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --replicas 4 --inner_steps
expect_error "prepare --threads 100000" "\-\-threads must be an integer in \[1, 4096\], not '100000'" \
    "$TRAIN_GPT" prepare --threads 100000 --input "$tmp/none.txt" --out_dir "$tmp/o_prep"

# A malformed hub address fails at once (it was retried for diloco_connect_timeout_s).
make_secret "$tmp/secret"
tcp=(--diloco_replicas 2 --diloco_replica_id 0 --diloco_transport tcp --diloco_secret_file "$tmp/secret"
    --diloco_connect_timeout_s 3600 --out_dir "$tmp/o_tcp")
expect_error "diloco_rendezvous with a bad port" "diloco_rendezvous: '127.0.0.1:99999': the port must be a number" \
    "$TRAIN_GPT" "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:99999
expect_error "diloco_rendezvous with a bad second hub" "diloco_rendezvous: 'nohost': expected host:port" \
    "$TRAIN_GPT" "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:1,nohost
# No hub at the address for diloco_connect_timeout_s (nothing listens on the port): a temporary
# failure, one line and status 75, which scripts/slurm/requeue.sh requeues. It was status 1: a
# relay down over a replica's requeue (a login node's reboot) ended that replica's job chain.
for rdv in "127.0.0.1:$(free_port)" "127.0.0.1:$(free_port),127.0.0.1:$(free_port)"; do
    rc=0
    "$TRAIN_GPT" "${base[@]}" "${tcp[@]}" --diloco_connect_timeout_s 1 --diloco_rendezvous "$rdv" >"$tmp/out.txt" \
        2>"$tmp/err.txt" || rc=$?
    check "no hub reachable at $rdv: status 75 (rc $rc), one line: $(grep '^train_gpt: error:' "$tmp/err.txt" | cut -c1-90)" \
        sh -c "[ $rc -eq 75 ] && [ \$(grep -c '^train_gpt: error: cannot reach' '$tmp/err.txt') -eq 1 ] &&
               [ \$(grep -c '^train_gpt: error:' '$tmp/err.txt') -eq 1 ]"
done
# Payload chunks the wire refuses: a sparse codec of few values per large block (int4, 5 of 4096
# kept: 960-byte chunks, under the least of 1024) was accepted, and the hub dropped the replica at
# every outer step; both replicas trained alone and exited 0. Refused before out_dir is touched;
# the least diloco_topk it names passes the check (the run then looks for its hub, status 75).
rm -rf "$tmp/o_tcp"   # the runs above made it
sparse=(--diloco_quant int4 --diloco_quant_block 4096 --diloco_error_feedback 1 --diloco_downlink bf16)
expect_error "sparse chunks under the tcp wire's least" \
    "\-\-diloco_topk: 0.001 with diloco_quant_block 4096 and diloco_quant int4 keeps 5 value(s) a block: chunks of 960 bytes, under the tcp wire's least of 1024 (the hub refuses them); raise diloco_topk to 0.00146484 or more" \
    "$TRAIN_GPT" "${base[@]}" "${tcp[@]}" --diloco_rendezvous "127.0.0.1:$(free_port)" "${sparse[@]}" --diloco_topk 0.001
check "... and out_dir is not created" test ! -e "$tmp/o_tcp"
rc=0
"$TRAIN_GPT" "${base[@]}" "${tcp[@]}" --diloco_connect_timeout_s 1 --diloco_rendezvous "127.0.0.1:$(free_port)" \
    "${sparse[@]}" --diloco_topk 0.00146484 >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
check "... the diloco_topk it names passes (the run goes on to look for its hub: rc $rc)" \
    sh -c "[ $rc -eq 75 ] && grep -q '^train_gpt: error: cannot reach' '$tmp/err.txt'"
rm -rf "$tmp/o_tcp"
# `train_gpt plan` refuses what the run refuses at its start (it passed them, and the job died on
# its first line after its wait in the queue): the hub list, the chunk sizes.
hubs9=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6,127.0.0.1:7,127.0.0.1:8,127.0.0.1:9
expect_error "plan: 9 hubs in diloco_rendezvous" "diloco_rendezvous '$hubs9': at most 8 hubs" \
    "$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous "$hubs9"
expect_error "plan: a hub listed twice" "the hub 127.0.0.1:1 is listed twice" \
    "$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:1,127.0.0.1:1
expect_error "plan: a hub that is not host:port" "diloco_rendezvous: 'nohost': expected host:port" \
    "$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous nohost
expect_error "plan: diloco_serve with several hubs" "diloco_serve: a replica can host one hub" \
    "$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:1,127.0.0.1:2 --diloco_serve 1
expect_error "plan: sparse chunks under the tcp wire's least" "\-\-diloco_topk: 0.001 with diloco_quant_block 4096" \
    "$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:1 "${sparse[@]}" --diloco_topk 0.001
rc=0
"$TRAIN_GPT" plan "${base[@]}" "${tcp[@]}" --diloco_rendezvous 127.0.0.1:1,127.0.0.1:2 >"$tmp/out.txt" 2>&1 || rc=$?
check "plan: two good hubs pass (rc $rc)" [ "$rc" -eq 0 ]
check "... and plan touches no out_dir" test ! -e "$tmp/o_tcp"
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    expect_error "256 replicas' fp32 chunks past MPI's int counts" \
        "\-\-diloco_quant_block: 1048576 with diloco_quant none and diloco_downlink same: the 256 replicas' chunks of a segment (8388608 bytes each) pass MPI's int counts" \
        "$TRAIN_GPT" "${base[@]}" --diloco_replicas 256 --diloco_transport mpi --diloco_quant none \
        --diloco_quant_block 1048576 --out_dir "$tmp/o_mpi"
    check "... and out_dir is not created" test ! -e "$tmp/o_mpi"
    # The mean's chunks too: int8 up, fp32 down (8 MiB a chunk at 2^21 values).
    expect_error "256 replicas' fp32 mean chunks past MPI's int counts" \
        "\-\-diloco_quant_block: 1048576 with diloco_quant int8 and diloco_downlink fp32: the 256 replicas' chunks of a segment (8388608 bytes each)" \
        "$TRAIN_GPT" "${base[@]}" --diloco_replicas 256 --diloco_transport mpi --diloco_quant int8 \
        --diloco_downlink fp32 --diloco_quant_block 1048576 --out_dir "$tmp/o_mpi"
fi
expect_error "relay --min_replicas above --replicas" "relay: --min_replicas 5 is more than --replicas 2" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --replicas 2 --min_replicas 5
expect_error "relay --catch_up other than 0 or 1" "relay: --catch_up 2: expected a whole number from 0 to 1" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --catch_up 2
# Whole numbers are whole (--replicas 2.5 was 2, --catch_up 0.5 turned it on), numbers decimal
# (--timeout_s 0x10 was 16 s).
expect_error "relay --replicas 2.5" "relay: --replicas 2.5: expected a whole number from 1 to 256" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --replicas 2.5
expect_error "relay --catch_up 0.5" "relay: --catch_up 0.5: expected a whole number from 0 to 1" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --catch_up 0.5
expect_error "relay --timeout_s 0x10" "relay: --timeout_s 0x10: expected a number from 0.1 to 1e+06" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --timeout_s 0x10
# The secret file: a regular file of 16 to 65536 bytes, blanks at either end not counted (a FIFO
# without a writer blocked the start for ever; /dev/zero was read until memory ran out; leading
# newlines counted toward the 16).
mkfifo "$tmp/secret_fifo"
expect_error "relay --secret_file a FIFO" "is not a regular file" \
    timeout 20 "$TRAIN_GPT" relay --listen 127.0.0.1:0 --secret_file "$tmp/secret_fifo"
expect_error "relay --secret_file /dev/zero" "'/dev/zero' is not a regular file" \
    timeout 20 "$TRAIN_GPT" relay --listen 127.0.0.1:0 --secret_file /dev/zero
head -c 70000 /dev/zero | tr '\0' 'x' >"$tmp/secret_big"
expect_error "relay --secret_file of 70000 bytes" "holds 70000 bytes; a secret is at most 65536" \
    "$TRAIN_GPT" relay --listen 127.0.0.1:0 --secret_file "$tmp/secret_big"
printf '\n\n\n\n\n\n\n\n\n\n\nshort\n' >"$tmp/secret_blank"
chmod 600 "$tmp/secret_big" "$tmp/secret_blank"
expect_error "diloco_secret_file of 5 bytes after 11 newlines" "holds 5 bytes; use at least 16" \
    "$TRAIN_GPT" "${base[@]}" --diloco_replicas 2 --diloco_replica_id 0 --diloco_transport tcp \
    --diloco_rendezvous 127.0.0.1:1 --diloco_secret_file "$tmp/secret_blank" --out_dir "$tmp/o_blank"

# --- data
expect_error "missing train_data file" "train_data: no such shard file '$tmp/absent.bin'" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/absent.bin" --out_dir "$tmp/o1"
# "-h" as a key's value is a value: it printed the usage and exited 0 (a requeue loop's "done").
expect_error "sample_prompt -h is a prompt, not --help" "max_steps: expected an integer" \
    "$TRAIN_GPT" "${base[@]}" --sample_prompt -h --max_steps 0 --out_dir "$tmp/o1"
"$TRAIN_GPT" "${base[@]}" --lr 0.1 -h >"$tmp/help.out" 2>&1 || true
check "... while -h where a key goes still prints the usage" grep -q "^usage: train_gpt CONFIG" "$tmp/help.out"
expect_error "glob with no match" "train_data: no file matches" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/none_*.bin" --out_dir "$tmp/o1"
# A path with '[' in it (prepare --out 'r[1]/x' writes such): the file of that name, not the glob's
# r1/x.bin beside it (taken until 2026-12, silently); escaped in a glob, the same file.
mkdir -p "$tmp/r[1]" "$tmp/r1"
cp "$tmp/train.bin" "$tmp/r[1]/x.bin"
"$TOOL" shard "$tmp/r1/x.bin" 64 0 5000 24
for spec in "$tmp/r[1]/x.bin" "$tmp/r\\[1\\]/x*.bin"; do
    rm -rf "$tmp/o_br"
    "$TRAIN_GPT" "${base[@]}" --train_data "$spec" --max_steps 1 --warmup_steps 0 --out_dir "$tmp/o_br" >"$tmp/br.out" 2>&1 || true
    check "train_data '$spec': the 20000 tokens of r[1]/x.bin ($(grep -o '[0-9]* train tokens' "$tmp/br.out"))" \
        grep -q "data: 20000 train tokens" "$tmp/br.out"
done
# A shard listed twice (its name and a glob that matches it) is read twice per epoch: one note
# says so (nothing did), and none for the glob alone.
"$TRAIN_GPT" "${base[@]}" --train_data "$tmp/r1/x.bin,$tmp/r1/*.bin" --max_steps 1 --warmup_steps 0 \
    --out_dir "$tmp/o_twice" >"$tmp/twice.out" 2>&1 || true
check "train_data listing r1/x.bin twice: 10000 train tokens, and one note naming it" \
    sh -c "grep -q 'data: 10000 train tokens' '$tmp/twice.out' &&
           [ \$(grep -c \"1 shard file(s) listed more than once are read that many times per epoch (e.g. shard 1 '$tmp/r1/x.bin' is shard 2\" '$tmp/twice.out') -eq 1 ]"
"$TRAIN_GPT" "${base[@]}" --train_data "$tmp/r1/*.bin" --max_steps 1 --warmup_steps 0 --out_dir "$tmp/o_once" \
    >"$tmp/once.out" 2>&1 || true
check "... the glob alone: no such note" sh -c "grep -q 'data: 5000 train tokens' '$tmp/once.out' && ! grep -q 'more than once' '$tmp/once.out'"
cp "$tmp/train.bin" "$tmp/trunc.bin"; "$TOOL" truncate "$tmp/trunc.bin" -3
expect_error "truncated shard" "truncated shard" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/trunc.bin" --out_dir "$tmp/o1"
# A forged header whose n_tokens · 2 wraps past 2⁶⁴ to the file's size (2⁶³ + 20000 tokens):
# it once passed the size check and the loader overflowed its row buffer.
cp "$tmp/train.bin" "$tmp/wrap.bin"; "$TOOL" forge_n_tokens "$tmp/wrap.bin" 9223372036854795808
expect_error "n_tokens that wraps the size check" "truncated shard: 40088 bytes, the header says 9223372036854795808 tokens" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/wrap.bin" --shuffle 0 --out_dir "$tmp/o1"
# A header's doc_token at or above its vocab_size (64 here, doc_token 100): document masking
# found no document in it, silently.
cp "$tmp/train.bin" "$tmp/doc100.bin"; "$TOOL" forge_doc_token "$tmp/doc100.bin" 100
expect_error "a header doc_token above its vocab_size" "doc_token 100 is not below the shard's vocab_size 64" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/doc100.bin" --vocab_size 128 --out_dir "$tmp/o1"
cp "$tmp/train.bin" "$tmp/magic.bin"; "$TOOL" flip "$tmp/magic.bin" 2
expect_error "wrong magic" "bad magic" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/magic.bin" --out_dir "$tmp/o1"
# A flipped byte in the first chunk (16 KiB), which the first micro-batch reads (test_data_verify:
# chunks the run reads and does not read).
cp "$tmp/train.bin" "$tmp/payload.bin"; "$TOOL" flip "$tmp/payload.bin" 1000
expect_error "corrupt payload" "payload checksum mismatch in chunk 0" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/payload.bin" --shuffle 0 \
    --out_dir "$tmp/o1"
expect_error "shard vocabulary above vocab_size" "vocab_size: the train shards hold token ids up to 63" \
    "$TRAIN_GPT" "${base[@]}" --vocab_size 32 --out_dir "$tmp/o1"
# A token beyond the header's vocab_size under valid checksums: refused when the chunk that
# holds it is first read, every token of the chunk checked (it was checked only when its own
# row was read: micro-batch 23 here, hours into a big run). With shuffle = 0 the first
# micro-batch reads tokens 0..128, in the first 16 KiB chunk with index 3000: before any step.
# A version 1 shard (no chunks) is checked whole at its first read, as before.
cp "$tmp/train.bin" "$tmp/token.bin"; "$TOOL" forge_token "$tmp/token.bin" 3000 100
expect_error "a token not below the shard's vocab_size, at start" \
    "train_data: shard '$tmp/token.bin': token 100 at index 3000 is not below its vocab_size 64" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/token.bin" --shuffle 0 --out_dir "$tmp/o_tok"
check "... before any step" sh -c "! test -e '$tmp/o_tok/metrics.jsonl' || ! grep -q '\"loss\"' '$tmp/o_tok/metrics.jsonl'"
cp "$tmp/train.bin" "$tmp/token1.bin"; "$TOOL" rechunk "$tmp/token1.bin" 0; "$TOOL" forge_token "$tmp/token1.bin" 15000 100
expect_error "a token not below the shard's vocab_size in a version 1 shard, at start" \
    "train_data: shard '$tmp/token1.bin': token 100 at index 15000 is not below its vocab_size 64" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/token1.bin" --shuffle 0 --out_dir "$tmp/o_tok1"
check "... before any step" sh -c "! test -e '$tmp/o_tok1/metrics.jsonl' || ! grep -q '\"loss\"' '$tmp/o_tok1/metrics.jsonl'"
# A bad validation set stops the run at its start, not at its first validation after training.
expect_error "corrupt val_data payload, at start" "val_data: shard '$tmp/payload.bin': payload checksum mismatch" \
    "$TRAIN_GPT" "${base[@]}" --val_data "$tmp/payload.bin" --out_dir "$tmp/o_val"
check "... before any step" sh -c "! grep -q '^step ' '$tmp/out.txt' && ! test -e '$tmp/o_val/metrics.jsonl' || ! grep -q '\"loss\"' '$tmp/o_val/metrics.jsonl'"
"$TOOL" shard "$tmp/val200.bin" 200 0 5000 24
expect_error "val_data of a larger vocabulary, at start" "val_data: the shards hold token ids up to 199, above vocab_size 64" \
    "$TRAIN_GPT" "${base[@]}" --val_data "$tmp/val200.bin" --out_dir "$tmp/o_val"
# Document tokens that disagree: val shards written with another doc_token than the train
# shards (val_loss cut their documents at the train's, silently), and a config's doc_token
# other than the shards' (a warning: it may be meant).
"$TOOL" shard "$tmp/val_doc1.bin" 64 1 5000 24
expect_error "val_data with another doc_token than train_data" \
    "val_data: the shards' doc_token is 1, the model's 0" \
    "$TRAIN_GPT" "${base[@]}" --val_data "$tmp/val_doc1.bin" --out_dir "$tmp/o_val"
# Train shards that disagree among themselves (0 and 1): refused with doc_masking (until 2026-12
# a warning, and the second shard's documents cut at token 0); a warning without it.
"$TOOL" shard "$tmp/train_doc1.bin" 64 1 20000 25
expect_error "train shards with two doc_tokens" "train_data: shards disagree on doc_token (0 in '$tmp/train.bin', 1 in" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/train.bin,$tmp/train_doc1.bin" --out_dir "$tmp/o_mixed"
"$TRAIN_GPT" "${base[@]}" --train_data "$tmp/train.bin,$tmp/train_doc1.bin" --doc_masking 0 --max_steps 1 \
    --warmup_steps 0 --out_dir "$tmp/o_mixed0" >/dev/null 2>"$tmp/mixed0.err"
check "... doc_masking 0: trains, with the warning" grep -q "warning: train_data: shards disagree on doc_token" "$tmp/mixed0.err"
# ... but not where doc_token plays no part (doc_masking = 0), nor where the model's doc_token
# (set in the config) is the val shards' though the train shards' header differs.
"$TRAIN_GPT" "${base[@]}" --val_data "$tmp/val_doc1.bin" --doc_masking 0 --max_steps 1 --warmup_steps 0 \
    --out_dir "$tmp/o_val_nomask" >/dev/null 2>"$tmp/val_nomask.err"
check "val_data of another doc_token with doc_masking = 0: no error, no warning" \
    sh -c "! grep -q '^train_gpt: error\\|doc_token' '$tmp/val_nomask.err'"
"$TRAIN_GPT" "${base[@]}" --val_data "$tmp/val_doc1.bin" --doc_token 1 --max_steps 1 --warmup_steps 0 \
    --out_dir "$tmp/o_val_doc1" >/dev/null 2>"$tmp/val_doc1.err"
check "val_data's doc_token 1 = the config's doc_token 1 (train header 0): no error, the warning about the train shards" \
    sh -c "! grep -q '^train_gpt: error' '$tmp/val_doc1.err' && grep -q 'warning: doc_token: 1 differs from the train shards' '$tmp/val_doc1.err'"
"$TRAIN_GPT" "${base[@]}" --doc_token 5 --max_steps 1 --warmup_steps 0 --out_dir "$tmp/o_doc" >/dev/null 2>"$tmp/doc.err"
check "a config doc_token other than the shards': one warning naming both" \
    grep -q "^train_gpt: warning: doc_token: 5 differs from the train shards' doc_token 0" "$tmp/doc.err"
"$TRAIN_GPT" "${base[@]}" --max_steps 1 --warmup_steps 0 --out_dir "$tmp/o_doc0" >/dev/null 2>"$tmp/doc.err"
check "... none when they agree" sh -c "! grep -q 'doc_token' '$tmp/doc.err'"
"$TOOL" shard "$tmp/nodoc.bin" 64 -1 20000 22
expect_error "no doc_token anywhere" "doc_token: not set" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/nodoc.bin" \
    --doc_token -1 --out_dir "$tmp/o1"
# An empty sample_prompt without a document token (doc_masking 0): the sampler ran the model
# on 0 tokens and read the activations before its buffer (garbage samples, exit 0).
bytes_tokenizer "$tmp/bytes.json"
expect_error "an empty sample_prompt and no doc_token" "sample_prompt: it is empty and the data has no doc_token" \
    "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/nodoc.bin" --doc_token -1 --doc_masking 0 --vocab_size 256 \
    --tokenizer "$tmp/bytes.json" --sample_every 1 --sample_prompt "" --out_dir "$tmp/o1"
"$TOOL" shard "$tmp/tiny.bin" 64 0 50 23
expect_error "too few tokens for a batch" "too few for one micro-batch" "$TRAIN_GPT" "${base[@]}" --train_data "$tmp/tiny.bin" --out_dir "$tmp/o1"

# --- checkpoints: a flipped byte is refused and nothing is deleted
"$TRAIN_GPT" "${base[@]}" --out_dir "$tmp/ck" >/dev/null 2>&1
"$TOOL" flip "$tmp/ck/step_00000004/model.safetensors" 200
before=$(tree_digest "$tmp/ck")
expect_error "resume = auto with one corrupt checkpoint" "none of the 1 checkpoints" "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/ck"
expect_error "resume = PATH with a corrupt checkpoint" "model.safetensors fails its checksum" \
    "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/ck2" --resume "$tmp/ck/step_00000004"
check "no checkpoint file was changed or deleted" test "$before" = "$(tree_digest "$tmp/ck")"
# A checkpoint whose checksums were made to match damaged moments (the last value of the
# file, exp_avg_sq of the final norm, made negative): refused, not trained on into NaN.
"$TRAIN_GPT" "${base[@]}" --out_dir "$tmp/mom" >/dev/null 2>&1
"$TOOL" flip "$tmp/mom/step_00000004/optimizer.safetensors" -1
sed -i "s/^[0-9a-f]*  optimizer.safetensors\$/$("$TOOL" xxh64 "$tmp/mom/step_00000004/optimizer.safetensors")  optimizer.safetensors/" \
    "$tmp/mom/step_00000004/checksums.xxh64"
expect_error "a negative AdamW second moment under matching checksums" "the AdamW second moment holds a negative value" \
    "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/mom2" --resume "$tmp/mom/step_00000004"
# state.json counters far beyond any run (data_epoch 2³², which the data position's arithmetic
# times the micro-batches per epoch could overflow), under matching checksums: refused.
resum() {  # resum STEP_DIR FILE: FILE's line in checksums.xxh64 made to match it
    sed -i "s/^[0-9a-f]*  $2\$/$("$TOOL" xxh64 "$1/$2")  $2/" "$1/checksums.xxh64"
}
cp -r "$tmp/mom" "$tmp/big"
"$TOOL" flip "$tmp/big/step_00000004/optimizer.safetensors" -1  # the moments as they were
resum "$tmp/big/step_00000004" optimizer.safetensors
sed -i 's/"data_epoch": [0-9]*/"data_epoch": 4294967296/' "$tmp/big/step_00000004/state.json"
resum "$tmp/big/step_00000004" state.json
expect_error "state.json's data_epoch 2^32 under matching checksums" "data_epoch 4294967296 / data_index [0-9]* out of range" \
    "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/big2" --resume "$tmp/big/step_00000004"
# A newer checkpoint that fails its checksum is skipped on resume, and pruning does not count
# it: ckpt_keep 1 once kept only the corrupt step 8 and deleted every checkpoint written since.
"$TRAIN_GPT" "${base[@]}" --max_steps 8 --ckpt_every 4 --out_dir "$tmp/kp" >/dev/null 2>&1
"$TOOL" flip "$tmp/kp/step_00000008/model.safetensors" 300
"$TRAIN_GPT" "${base[@]}" --max_steps 12 --ckpt_every 1 --ckpt_keep 1 --stop_at_step 6 --out_dir "$tmp/kp" >/dev/null 2>&1
check "ckpt_keep 1 beside a corrupt newer checkpoint: the new step 6 stays ($(ls "$tmp/kp" | grep step_ | tr '\n' ' '))" \
    test -d "$tmp/kp/step_00000006"
"$TRAIN_GPT" "${base[@]}" --max_steps 12 --ckpt_every 1 --ckpt_keep 1 --out_dir "$tmp/kp" >"$tmp/kp.log" 2>&1 || true
check "... and the next start resumes from it" grep -q "resuming from '$tmp/kp/step_00000006'" "$tmp/kp.log"
expect_error "resume = never over another run's checkpoints" "already holds checkpoints" \
    "$TRAIN_GPT" "${base[@]}" --out_dir "$tmp/ck" --resume never
"$TRAIN_GPT" "${base[@]}" --out_dir "$tmp/good" >/dev/null 2>&1
expect_error "resume with another architecture" "d_model = 64, the config says 32" \
    "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/ck3" --resume "$tmp/good/step_00000004" --d_model 32
# The spike guard's window in state.json, under matching checksums: a count of at most 2^53 and
# positive finite values, as the guard keeps them. A count near 2^63 overflowed at the next
# step (the slot went negative: a write outside the window, then checkpoints that could not be
# read back); zeros made every step a spike and stopped the run blaming training, not the file.
# (The window made 4, the steps the checkpoint holds, so that it is full: the guard is on.)
for bad in 's/"spike_count": 4,/"spike_count": 9223372036854775807,/' 's/"spike_loss": \[[0-9.e+-]*,/"spike_loss": [0,/'; do
    rm -rf "$tmp/spk" "$tmp/spk2" && cp -r "$tmp/good" "$tmp/spk"
    sed -i -e 's/"spike_window": 100,/"spike_window": 4,/' -e "$bad" "$tmp/spk/step_00000004/state.json"
    resum "$tmp/spk/step_00000004" state.json
    expect_error "state.json's spike window edited ($bad) under matching checksums" "state.json: bad spike_window" \
        "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/spk2" --resume "$tmp/spk/step_00000004" --spike_window 4
done
# state.json's optional fields (absent in older checkpoints), present but outside what a save
# writes, under matching checksums: refused naming the field. data_world 0 was read as "not
# recorded" and the run resumed on the position as the current world splits it.
for edit in 's/"data_world": 1,/"data_world": 0,/;data_world' 's/"outer_step": 0,/"outer_step": -3,/;outer_step' \
    's/"outer_step": 0,/"outer_step": 0, "rollbacks": 1.5,/;rollbacks' \
    's/"outer_step": 0,/"outer_step": 0, "outer_merge_fragment": 0,/;go together'; do
    rm -rf "$tmp/opt" "$tmp/opt2" && cp -r "$tmp/good" "$tmp/opt"
    grep -q '"data_world": 1,' "$tmp/opt/step_00000004/state.json" || die "the checkpoint has no data_world 1"
    sed -i -e "${edit%;*}" "$tmp/opt/step_00000004/state.json"
    resum "$tmp/opt/step_00000004" state.json
    expect_error "state.json edited (${edit%;*}) under matching checksums" "state.json: .*${edit#*;}" \
        "$TRAIN_GPT" "${base[@]}" --max_steps 8 --out_dir "$tmp/opt2" --resume "$tmp/opt/step_00000004"
done
# Only step_%08lld names are checkpoints: a directory step_0008 (made by hand, a typo) was step 8
# too, in no defined order, and ckpt_keep 1 deleted the step_00000008 just written and kept it.
mkdir -p "$tmp/dn/step_0008" && cp -r "$tmp/good/step_00000004" "$tmp/dn/"
"$TRAIN_GPT" "${base[@]}" --max_steps 8 --ckpt_every 4 --ckpt_keep 1 --out_dir "$tmp/dn" >/dev/null 2>&1
check "ckpt_keep 1 beside a directory step_0008: step_00000008 stays, step_0008 is left alone ($(ls "$tmp/dn" | grep step_ | tr '\n' ' '))" \
    sh -c "test -d '$tmp/dn/step_00000008' && test -d '$tmp/dn/step_0008' && ! test -e '$tmp/dn/step_00000004'"
# init_from checks what a resume checks of the weights: the architecture its model_config names,
# and no tensor the config does not use (an untied lm_head.weight went into a tied run unused).
"$TRAIN_GPT" "${base[@]}" --tie_embeddings 0 --out_dir "$tmp/untied" >/dev/null 2>&1
expect_error "init_from an untied checkpoint into a tied run" \
    "init_from: '$tmp/untied/step_00000004/model.safetensors': it was trained with tie_embeddings = 0, the config says 1" \
    "$TRAIN_GPT" "${base[@]}" --tie_embeddings 1 --out_dir "$tmp/tied" --init_from "$tmp/untied/step_00000004"
# The same weights without model_config (a file from elsewhere): lm_head.weight is left over.
"$PYTHON" - "$tmp/untied/step_00000004/model.safetensors" "$tmp/bare.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
del header["__metadata__"]
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
expect_error "init_from a file with a tensor the config does not use" "init_from: '$tmp/bare.safetensors': the file holds 25 tensors, the config needs 24" \
    "$TRAIN_GPT" "${base[@]}" --tie_embeddings 1 --out_dir "$tmp/tied" --init_from "$tmp/bare.safetensors"
# A model_config's values must be ones a config file could give, the rules between keys too
# (norm_eps 0 and a doc_token past the vocabulary were taken); 0 for head_dim means d_model /
# n_head, as in a config (it was read as 0: "trained with head_dim = 0").
model_config_edit() {  # model_config_edit OUT KEY=JSON...: the untied checkpoint's weights, model_config edited
    "$PYTHON" - "$tmp/untied/step_00000004/model.safetensors" "$@" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
mc = json.loads(header["__metadata__"]["model_config"])
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    mc[k] = json.loads(v)
header["__metadata__"]["model_config"] = json.dumps(mc)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
}
model_config_edit "$tmp/eps0.safetensors" norm_eps=0
expect_error "init_from a model_config with norm_eps 0" "init_from: '$tmp/eps0.safetensors': .*bad value for norm_eps" \
    "$TRAIN_GPT" "${base[@]}" --tie_embeddings 0 --out_dir "$tmp/eps0" --init_from "$tmp/eps0.safetensors"
model_config_edit "$tmp/doc999.safetensors" doc_token=999
expect_error "init_from a model_config with doc_token past vocab_size" "init_from: '$tmp/doc999.safetensors': .*bad value for doc_token" \
    "$TRAIN_GPT" "${base[@]}" --tie_embeddings 0 --out_dir "$tmp/doc999" --init_from "$tmp/doc999.safetensors"
model_config_edit "$tmp/hd0.safetensors" head_dim=0
check "init_from a model_config with head_dim 0 (= d_model / n_head, as in a config): taken" \
    "$TRAIN_GPT" "${base[@]}" --tie_embeddings 0 --out_dir "$tmp/hd0" --init_from "$tmp/hd0.safetensors" --max_steps 1 --warmup_steps 0

# An out_dir where no checkpoint can be written (read-only, its metrics.jsonl writable) stops
# the run at its start, not after training when the final checkpoint fails. Root ignores
# modes: as root the run is made as nobody (runuser), in a directory nobody can read.
ro=$(mktemp -d)
chmod 755 "$ro"
cp test/configs/tiny_test.conf "$tmp/train.bin" "$TRAIN_GPT" "$ro/"  # the binary too: the clone may be private
mkdir "$ro/out" && : >"$ro/out/metrics.jsonl" && chmod 666 "$ro/out/metrics.jsonl" "$ro/train.bin" && chmod 555 "$ro/out"
chmod 755 "$ro/train_gpt"
as=()
[ "$(id -u)" -eq 0 ] && command -v runuser >/dev/null && runuser -u nobody -- test -x "$ro/train_gpt" 2>/dev/null &&
    as=(runuser -u nobody --)
if [ "$(id -u)" -ne 0 ] || [ ${#as[@]} -gt 0 ]; then
    expect_error "an out_dir where checkpoints cannot be written, at start" "out_dir: cannot create a checkpoint directory in '$ro/out'" \
        "${as[@]}" "$ro/train_gpt" "$ro/tiny_test.conf" --train_data "$ro/train.bin" --max_steps 4 --out_dir "$ro/out"
    check "... before any step" sh -c "! grep -q '^step ' '$tmp/out.txt'"
    # One that can be written but not listed (w+x, no r): its checkpoints cannot be found, and
    # resume = auto once started over beside them without a word.
    mkdir "$ro/blind" && chmod 333 "$ro/blind"
    expect_error "an out_dir that cannot be listed" "out_dir: cannot list '$ro/blind': Permission denied" \
        "${as[@]}" "$ro/train_gpt" "$ro/tiny_test.conf" --train_data "$ro/train.bin" --max_steps 4 --out_dir "$ro/blind"
else
    say "  skip the read-only out_dir: root without runuser, or nobody cannot run $ro/train_gpt"
fi
chmod -R u+w "$ro" && rm -rf "$ro"

# A checkpoint file that cannot be written (here: past the file size limit): the warning names
# the file and the error (it once printed a stale errno and no file), the run goes on.
(ulimit -f 64 && trap '' XFSZ && exec "$TRAIN_GPT" "${base[@]}" --max_steps 4 --ckpt_every 1 --out_dir "$tmp/full") \
    >"$tmp/full.log" 2>&1 || true
check "a checkpoint file that cannot be written: a warning names it and the error" \
    grep -q "warning: cannot write checkpoint file '$tmp/full/.tmp-step_00000001/model.safetensors': File too large" "$tmp/full.log"
check "... and the summary points to it" grep -q "checkpoint at step 1 failed (see the line naming the file" "$tmp/full.log"

# --- outlier guard
TRAIN_GPT_FAULT=nan_grad:2 "$TRAIN_GPT" "${base[@]}" --out_dir "$tmp/nan1" >/dev/null 2>"$tmp/nan1.err"
check "one NaN gradient: step 3 skipped and logged" grep -q '"step":3,.*"skipped":true' "$tmp/nan1/metrics.jsonl"
check "one NaN gradient: training goes on and finishes" grep -q '"step":4,.*"skipped":false' "$tmp/nan1/metrics.jsonl"
export TRAIN_GPT_FAULT=nan_grad:4,nan_grad:5
expect_error "max_bad_steps NaN steps in a row stop the run" "stopping: 2 steps in a row" \
    "$TRAIN_GPT" "${base[@]}" --max_steps 8 --ckpt_every 2 --max_bad_steps 2 --out_dir "$tmp/nan2"
unset TRAIN_GPT_FAULT
check "the checkpoints before the NaNs are intact" test -d "$tmp/nan2/step_00000004"
check "no checkpoint was written after them" test ! -e "$tmp/nan2/step_00000006"
"$TRAIN_GPT" "${base[@]}" --max_steps 8 --ckpt_every 2 --out_dir "$tmp/nan2" >/dev/null 2>&1
check "the run resumes from them and finishes" test -d "$tmp/nan2/step_00000008"
# More threads than the CPUs the process may run on (a plain srun under Slurm 22.05-23.02 gives
# its task one CPU): one warning naming both, and the run trains; none with threads 1.
if command -v taskset >/dev/null; then
    rc=0
    taskset -c 0 "$TRAIN_GPT" "${base[@]}" --val_every 0 --threads 2 --out_dir "$tmp/threads" >"$tmp/threads.log" 2>&1 ||
        rc=$?
    check "threads 2 on one CPU (taskset): one warning naming 2 threads and 1 CPU, and it trains (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'warning: 2 threads, but this process may run on 1 CPU' '$tmp/threads.log') -eq 1 ]"
    taskset -c 0 "$TRAIN_GPT" "${base[@]}" --val_every 0 --threads 1 --out_dir "$tmp/threads1" >"$tmp/threads1.log" 2>&1 ||
        true
    check "threads 1 on one CPU: no such warning" sh -c "! grep -q 'threads, but this process may run on' '$tmp/threads1.log'"
fi
finish test_bad_input
